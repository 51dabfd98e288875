//! One sample of a network namespace: everything the transport capture reads
//! at one end of its window, typed, with each read's own timing.
//!
//! Invariants:
//! - **Reads the calling thread's netns.** [`sample`] opens its netlink
//!   sockets and procfs files where the caller stands; `pstack-helper --net`
//!   calls it after entering the target netns (see [`super::netns::enter`]).
//! - **Each read fails on its own.** A refused route lookup does not hide the
//!   socket dump: every field is its own `Result`, with the collector's typed
//!   error.
//! - **Serializable both ways, closed world.** A [`NetSample`] crosses the
//!   helper's pipe as JSON and is decoded with `deny_unknown_fields` at every
//!   level; wide counters (`i128`, `u64`) stay exact (serde_json writes and
//!   reads them as integers, never floats).
//! - **Only netlink sockets.** The reads open `AF_NETLINK` sockets
//!   (`NETLINK_SOCK_DIAG`, `NETLINK_ROUTE`) and procfs files — never an
//!   `AF_INET`/`AF_INET6` socket — so the helper's seccomp filter can forbid
//!   those.

use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::conntrack::{ConntrackError, ConntrackFacts, read_conntrack};
use super::load::{LoadFacts, read_load};
use super::netlink::NetlinkError;
use super::rtnl::{self, Answer, LinkFacts, RouteFacts};
use super::sockdiag::{self, FlowFilter, TcpDump};
use super::{Counters, CountersError, read_counters};

/// A read with the time it took inside the reading process.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Timed<T> {
    /// What the read produced.
    pub value: T,
    /// How long it took, µs.
    pub elapsed_us: u64,
}

/// Run `f` and time it.
pub fn timed<T>(f: impl FnOnce() -> T) -> Timed<T> {
    let t = Instant::now();
    let value = f();
    Timed {
        value,
        elapsed_us: u64::try_from(t.elapsed().as_micros()).unwrap_or(u64::MAX),
    }
}

/// Everything read at one end of a transport window, in one netns.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetSample {
    /// sock_diag dump of every TCP socket, filtered to the flows asked for.
    pub tcp: Timed<Result<TcpDump, NetlinkError>>,
    /// Every Tcp/TcpExt/… counter of the netns, and the raw bytes.
    pub counters: Timed<Result<(Counters, Vec<u8>), CountersError>>,
    /// Conntrack occupancy and statistics, and the raw bytes.
    pub conntrack: Timed<Result<(ConntrackFacts, Vec<u8>), ConntrackError>>,
    /// The route to the peer.
    pub route: Timed<Result<Answer<RouteFacts>, NetlinkError>>,
    /// The route's egress link, when the route names one.
    pub link: Option<Timed<Result<Answer<LinkFacts>, NetlinkError>>>,
    /// For a veth egress link: its peer (possibly in another netns).
    pub peer_link: Option<Timed<Result<Answer<LinkFacts>, NetlinkError>>>,
    /// CPU load (hypothesis-only evidence), and the raw bytes.
    pub load: Timed<Result<(LoadFacts, Vec<u8>), String>>,
}

/// Read one [`NetSample`] in the calling thread's network namespace; only
/// sockets matching `filter` are kept (every dumped byte is digested).
pub fn sample(filter: &FlowFilter) -> NetSample {
    let tcp = timed(|| sockdiag::dump_tcp(&|s| filter.matches(s)));
    let counters = timed(read_counters);
    let conntrack = timed(read_conntrack);
    let route = timed(|| rtnl::route_get(filter.peer));
    let link = route
        .value
        .as_ref()
        .ok()
        .and_then(|r| r.value.oif)
        .map(|oif| timed(|| rtnl::link_get(oif as i32, None)));
    let peer_link = link.as_ref().and_then(|l| {
        let l = l.value.as_ref().ok()?;
        if l.value.kind.as_deref() != Some("veth") {
            return None;
        }
        let peer = l.value.link?;
        Some(timed(|| rtnl::link_get(peer, l.value.link_netnsid)))
    });
    let load = timed(read_load);
    NetSample {
        tcp,
        counters,
        conntrack,
        route,
        link,
        peer_link,
        load,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::procfs::RawMeta;

    #[test]
    fn a_sample_round_trips_through_json_exactly() {
        let filter = FlowFilter {
            peer: "127.0.0.1".parse().unwrap(),
            peer_port: None,
            local: None,
            local_port: None,
            either_port_in: None,
        };
        let mut s = sample(&filter);
        // Wide values must survive: an i128 counter beyond u64 and a u64 beyond 2^53.
        if let Ok((c, _)) = &mut s.counters.value {
            c.insert("Test.Wide".into(), i128::from(u64::MAX) + 7);
            c.insert("Test.Negative".into(), -5);
        }
        let json = serde_json::to_vec(&s).unwrap();
        let back: NetSample = serde_json::from_slice(&json).unwrap();
        assert_eq!(back, s);
        let failed: Timed<Result<TcpDump, NetlinkError>> = Timed {
            value: Err(NetlinkError::Syscall {
                syscall: "socket".into(),
                errno: 1,
                message: "denied".into(),
            }),
            elapsed_us: 3,
        };
        let j = serde_json::to_string(&failed).unwrap();
        assert_eq!(serde_json::from_str::<Timed<_>>(&j).unwrap(), failed);
        let ok: Timed<Result<TcpDump, NetlinkError>> = Timed {
            value: Ok(TcpDump {
                sockets: Vec::new(),
                raw: RawMeta::of(b"x", false),
            }),
            elapsed_us: 1,
        };
        let mut v = serde_json::to_value(&ok).unwrap();
        v["value"]["Ok"]["extra"] = serde_json::json!(1);
        assert!(
            serde_json::from_value::<Timed<Result<TcpDump, NetlinkError>>>(v).is_err(),
            "unknown fields are refused"
        );
    }
}
