//! Least privilege for `pstackd`: the capability set it keeps, and
//! `no_new_privs`.
//!
//! Kept (and why):
//! - `CAP_SYS_PTRACE`: `/proc/<pid>/{stack,syscall,environ}`, fd targets and
//!   `mem`-adjacent files of other users' tasks are ptrace-access checked.
//! - `CAP_DAC_READ_SEARCH`: read procfs files and traverse `/proc/<pid>/fd` of
//!   tasks owned by other uids.
//! - `CAP_SYS_ADMIN`: `/proc/<pid>/stack` (read by the procfs helper), and
//!   `setns(2)` into a subject's network namespace — done only by the net
//!   helper (`pstack-helper --net`), which inherits the capability from us,
//!   enters the netns, then drops it before reading anything; the agent's own
//!   threads never change namespace (and BPF on kernels without `CAP_BPF`).
//! - `CAP_BPF`, `CAP_PERFMON`: load the eBPF programs and attach tracepoints.
//! - `CAP_NET_ADMIN`: passed on to the net helper, the one capability it
//!   keeps: `RTM_GETLINK` with `IFLA_TARGET_NETNSID` (a veth peer's stats in
//!   another network namespace) requires it. sock_diag dumps, route lookups
//!   and the procfs counters/conntrack files need none.
//! - Not `CAP_KILL`: helpers run as our uid (0) and never change it, so the
//!   kernel's same-uid rule already lets us SIGKILL them.
//! - `CAP_SETPCAP`: passed on to every helper (procfs and net), which uses
//!   it for one thing: emptying its own bounding set before it drops
//!   `CAP_SETPCAP` with everything else it does not keep. Without it a
//!   helper would run with our bounding set (`KILL`, `NET_ADMIN`, `BPF`,
//!   `PERFMON`, …) and refuses to serve. pstackd itself uses it only to
//!   narrow its own bounding set at start (below).
//!
//! Everything else is dropped from the effective, permitted, inheritable and
//! ambient sets and from the bounding set (so nothing we exec can regain it),
//! then `PR_SET_NO_NEW_PRIVS` is set. The socket is bound and chowned *before*
//! this runs (binding a path and `chown` need `CAP_CHOWN`, which we drop).
//! The helpers narrow further on their own (see `pstack-helper`'s `confine`:
//! a procfs profile and a net profile).
//! A non-root daemon (tests, development) has nothing to drop and only sets
//! `no_new_privs`.

use caps::{CapSet, Capability, CapsHashSet};

/// The capabilities `pstackd` keeps.
pub const KEPT: [Capability; 7] = [
    Capability::CAP_SYS_PTRACE,
    Capability::CAP_DAC_READ_SEARCH,
    Capability::CAP_SYS_ADMIN,
    Capability::CAP_BPF,
    Capability::CAP_PERFMON,
    Capability::CAP_NET_ADMIN,
    Capability::CAP_SETPCAP,
];

/// Why dropping privileges failed.
#[derive(Debug, thiserror::Error)]
pub enum PrivilegeError {
    /// A capability call failed.
    #[error("cannot {op}: {message}")]
    Caps {
        /// The operation.
        op: &'static str,
        /// The library's diagnostic.
        message: String,
    },
    /// `prctl(PR_SET_NO_NEW_PRIVS)` failed.
    #[error("prctl(PR_SET_NO_NEW_PRIVS): {0}")]
    NoNewPrivs(std::io::Error),
}

/// What the drop left in force, for the startup log.
#[derive(Debug, Clone)]
pub struct PrivilegeReport {
    /// Effective capabilities after the drop, sorted.
    pub effective: Vec<String>,
    /// Bounding-set entries removed.
    pub bounding_dropped: usize,
}

/// Drop every capability not in [`KEPT`] and set `no_new_privs`.
pub fn drop_privileges() -> Result<PrivilegeReport, PrivilegeError> {
    let kept: CapsHashSet = KEPT.into_iter().collect();
    let err = |op: &'static str| {
        move |e: caps::errors::CapsError| PrivilegeError::Caps {
            op,
            message: e.to_string(),
        }
    };
    let permitted = caps::read(None, CapSet::Permitted).map_err(err("read permitted set"))?;
    let mut bounding_dropped = 0;
    // The bounding set needs CAP_SETPCAP, which we still hold at this point
    // when running as root; without it (unprivileged) skip quietly.
    if permitted.contains(&Capability::CAP_SETPCAP) {
        for cap in caps::all() {
            if !kept.contains(&cap) && caps::has_cap(None, CapSet::Bounding, cap).unwrap_or(false) {
                caps::drop(None, CapSet::Bounding, cap).map_err(err("drop from bounding set"))?;
                bounding_dropped += 1;
            }
        }
    }
    caps::clear(None, CapSet::Ambient).map_err(err("clear ambient set"))?;
    let keep: CapsHashSet = permitted.intersection(&kept).copied().collect();
    caps::set(None, CapSet::Inheritable, &CapsHashSet::new())
        .map_err(err("clear inheritable set"))?;
    caps::set(None, CapSet::Effective, &keep).map_err(err("set effective set"))?;
    caps::set(None, CapSet::Permitted, &keep).map_err(err("set permitted set"))?;
    // SAFETY: prctl with PR_SET_NO_NEW_PRIVS takes plain integer arguments and
    // touches no memory of ours.
    let rc = unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) };
    if rc != 0 {
        return Err(PrivilegeError::NoNewPrivs(std::io::Error::last_os_error()));
    }
    let mut effective: Vec<String> = keep.iter().map(|c| c.to_string()).collect();
    effective.sort();
    Ok(PrivilegeReport {
        effective,
        bounding_dropped,
    })
}
