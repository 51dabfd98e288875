//! Network readers for transport investigations: TCP sockets (sock_diag with
//! `tcp_info`), the namespace's Tcp/TcpExt counters, route and interface facts
//! (rtnetlink), conntrack pressure, and CPU load as a hypothesis-only surface.
//!
//! Invariants:
//! - **Pure parsers, thin readers.** Every decoder takes captured bytes or
//!   text ([`sockdiag::parse_dump`], [`snmp::parse_into`], [`rtnl::parse_route`],
//!   [`rtnl::parse_link`], [`conntrack::parse_stat`], [`load`]) and is tested
//!   on them; the readers only open, read and call the decoder.
//! - **Readers read the calling thread's network namespace.** To read another
//!   namespace (a PID's or a named one), the transport capture runs
//!   [`sample::sample`] in `pstack-helper --net`, which [`netns::enter`]s the
//!   target before it confines itself; [`netns::run_in`] does the same in a
//!   throwaway thread of the caller.
//!   Procfs network files are read through `/proc/thread-self/net/`, never
//!   `/proc/net/` (which follows the thread-group leader), and interface facts
//!   come from rtnetlink, never `/sys/class/net` (bound to sysfs's mount netns).
//! - **Every reading carries its raw evidence** as a [`RawMeta`] (digest and
//!   byte count of the exact bytes decoded).
//! - **Wide values stay exact.** Socket cookies, byte counters and snmp
//!   counters are `u64`/`i128` here; turning them into JSON (numbers only
//!   within ±2^53, decimal strings otherwise) is the envelope layer's job.

pub mod conntrack;
pub mod load;
pub mod netlink;
pub mod netns;
pub mod rtnl;
pub mod sample;
pub mod snmp;
pub mod sockdiag;
pub mod sockopt;
pub mod tcpinfo;

pub use crate::procfs::RawMeta;
pub use netns::{NetnsError, NetnsTarget, run_in};
pub use sample::{NetSample, Timed};
pub use snmp::Counters;
pub use sockdiag::{FlowFilter, PortRange, TcpDump, TcpSocket, dump_tcp};
pub use tcpinfo::TcpInfo;

/// Why the namespace's counters could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub enum CountersError {
    /// Reading a file failed.
    #[error("{path}: {message} (errno {errno})")]
    Io {
        /// File.
        path: String,
        /// errno.
        errno: i32,
        /// The OS's description.
        message: String,
    },
    /// A file had an unexpected shape.
    #[error("{path}: {source}")]
    Parse {
        /// File.
        path: String,
        /// What was wrong.
        source: snmp::SnmpError,
    },
}

/// Files the counters come from, relative to the reading thread's netns.
pub const COUNTER_FILES: [&str; 2] = [
    "/proc/thread-self/net/snmp",
    "/proc/thread-self/net/netstat",
];

/// Every counter of `/proc/net/snmp` and `/proc/net/netstat` of the calling
/// thread's netns, and the raw bytes (both files, concatenated).
pub fn read_counters() -> Result<(Counters, Vec<u8>), CountersError> {
    let mut all = Counters::new();
    let mut raw = Vec::new();
    for path in COUNTER_FILES {
        let text = std::fs::read_to_string(path).map_err(|e| CountersError::Io {
            path: path.into(),
            errno: e.raw_os_error().unwrap_or(0),
            message: e.to_string(),
        })?;
        snmp::parse_into(&text, &mut all).map_err(|source| CountersError::Parse {
            path: path.into(),
            source,
        })?;
        raw.extend_from_slice(text.as_bytes());
    }
    Ok((all, raw))
}
