//! Confinement of the helper process. [`confine`] (the procfs profile) or
//! [`confine_net`] (the net profile, `pstack-helper --net`) runs first thing
//! in the helper's `main`, before any request is read. In order:
//!
//! 1. `PR_SET_PDEATHSIG(SIGKILL)`: the helper dies with the thread that
//!    spawned it; if that parent is already gone, the helper exits.
//! 2. A privileged helper (any capability permitted) enters its read-only
//!    view of `/proc` ([`crate::view::enter_proc_view`]: own mount namespace,
//!    nothing of the host but a read-only `/proc`). That needs
//!    `CAP_SYS_ADMIN`; a privileged helper that cannot build the view
//!    refuses to serve.
//! 3. Capabilities: the **bounding set is emptied** (every capability; this
//!    needs `CAP_SETPCAP`, which `pstackd` keeps for exactly this and a
//!    root `pstackctl` has), the inheritable and ambient sets are cleared and
//!    the effective/permitted sets reduced to the profile's kept set
//!    intersected with what the helper was given — `CAP_SETPCAP` is never
//!    kept. A privileged helper without `CAP_SETPCAP` refuses to serve
//!    rather than run with a non-empty bounding set.
//! 4. `RLIMIT_CORE = 0`: a SIGSYS kill leaves no core with process memory.
//! 5. `PR_SET_NO_NEW_PRIVS`.
//! 6. Net profile: the Landlock ruleset of
//!    [`crate::view::restrict_net_helper`] (best effort on kernels without
//!    Landlock; the reason is written to stderr). Not the sockopt profile:
//!    a Landlock domain may not ptrace — so not `pidfd_getfd` — a process
//!    outside it; its filesystem is closed by the view and a seccomp list
//!    without any `open`.
//! 7. The seccomp program of [`crate::filter`] (argument-filtered allow-list,
//!    mismatch kills the process).
//!
//! # Kept capabilities, each with the surface that needs it
//!
//! Procfs profile ([`KEPT_CAPS`], `CapEff`/`CapPrm` `0000000000280004`):
//! - `CAP_SYS_ADMIN`: `stack` — `proc_pid_stack` requires it outright.
//! - `CAP_SYS_PTRACE`: `stack`, `syscall` (`PTRACE_MODE_ATTACH`), `environ`,
//!   `wchan`, fd links (`PTRACE_MODE_READ`) of tasks of other users or with
//!   capabilities the helper lacks.
//! - `CAP_DAC_READ_SEARCH`: `fd_targets` — search `/proc/PID/fd` (mode 0500,
//!   owned by the task's uid) of tasks of other users.
//!
//! What keeps these from being root in disguise: the view (no host path but
//! a read-only `/proc`, so `CAP_DAC_READ_SEARCH` reads nothing else; no
//! `open_by_handle_at`), the open-flag filter (no writable descriptor, so
//! `CAP_SYS_PTRACE` cannot write `/proc/PID/mem`), no `ptrace`,
//! `process_vm_writev`, `kill`, `mount`, `setns`, `bpf`, module loading or
//! any other `CAP_SYS_ADMIN` operation in the seccomp list, and an empty
//! bounding set.
//!
//! Net profile ([`KEPT_NET_CAPS`], `0000000000001000`): `CAP_NET_ADMIN`
//! alone, because `RTM_GETLINK` with `IFLA_TARGET_NETNSID` (the stats of a
//! veth's peer, which lives in another netns) requires it over that netns's
//! user namespace. A net helper has already entered the target network
//! namespace (`setns`, which needs `CAP_SYS_ADMIN`) before this runs.
//! Nothing else its reads do needs a capability: sock_diag TCP dumps and
//! `RTM_GETROUTE` are open to anyone in the netns, and
//! `/proc/thread-self/net/{snmp,netstat,stat/nf_conntrack}`,
//! `/proc/sys/net/netfilter/nf_conntrack_{count,max}`, `/proc/loadavg`,
//! `/proc/stat` and `/proc/pressure/cpu` are world-readable.
//!
//! Sockopt profile ([`KEPT_SOCKOPT_CAPS`], `0000000000080000`):
//! `CAP_SYS_PTRACE` alone, for `pidfd_getfd` (see the constant).

use caps::{CapSet, Capability, CapsHashSet};

pub use crate::confine_error::ConfineError;

pub use crate::filter::{NET_EXTRA_SYSCALLS, NET_NETLINK_PROTOCOLS};

/// Which confinement a helper runs under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Profile {
    /// Risky procfs reads: [`KEPT_CAPS`], [`crate::filter::procfs_program`],
    /// no sockets.
    Procfs,
    /// Net reads in an entered netns: [`KEPT_NET_CAPS`],
    /// [`crate::filter::net_program`] (`socket` for netlink only), Landlock.
    Net,
    /// Socket options of other processes' sockets (`pstack-helper
    /// --sockopt`): [`KEPT_SOCKOPT_CAPS`], [`crate::filter::sockopt_program`]
    /// (`pidfd_open`, `pidfd_getfd`, five `getsockopt` options; no file
    /// opened at all). No Landlock: its ptrace scoping refuses
    /// `pidfd_getfd` on any process outside the helper's domain.
    Sockopt,
}

/// Capabilities a procfs helper keeps (when it has them); see the module docs.
pub const KEPT_CAPS: [Capability; 3] = [
    Capability::CAP_DAC_READ_SEARCH,
    Capability::CAP_SYS_PTRACE,
    Capability::CAP_SYS_ADMIN,
];

/// The effective-set bitmask of [`KEPT_CAPS`] (`CapEff` in `/proc/self/status`).
pub fn kept_caps_mask() -> u64 {
    KEPT_CAPS
        .iter()
        .map(Capability::bitmask)
        .fold(0, |a, b| a | b)
}

/// Capabilities a net helper keeps (when it has them); see the module docs.
pub const KEPT_NET_CAPS: [Capability; 1] = [Capability::CAP_NET_ADMIN];

/// The effective-set bitmask of [`KEPT_NET_CAPS`].
pub fn kept_net_caps_mask() -> u64 {
    KEPT_NET_CAPS
        .iter()
        .map(Capability::bitmask)
        .fold(0, |a, b| a | b)
}

/// Capabilities a sockopt helper keeps (when it has them).
///
/// `CAP_SYS_PTRACE` alone: `pidfd_getfd` requires
/// `PTRACE_MODE_ATTACH_REALCREDS` over the socket's owner, which for an
/// owner of another uid, or one holding capabilities the helper lacks, only
/// `CAP_SYS_PTRACE` grants. It is kept in this profile only: the procfs and
/// net profiles of issue 10 do not get it back. What keeps it from being
/// more: the seccomp list has no `ptrace`, `process_vm_*`, `kill`, no
/// `openat` at all (so no `/proc/PID/mem`), `write` only to the response
/// pipe, no `sendto`/`sendmsg`/`setsockopt` on a duplicated socket; its view
/// holds nothing but a read-only `/proc`; the bounding set is empty.
pub const KEPT_SOCKOPT_CAPS: [Capability; 1] = [Capability::CAP_SYS_PTRACE];

/// The effective-set bitmask of [`KEPT_SOCKOPT_CAPS`] (`0000000000080000`).
pub fn kept_sockopt_caps_mask() -> u64 {
    KEPT_SOCKOPT_CAPS
        .iter()
        .map(Capability::bitmask)
        .fold(0, |a, b| a | b)
}

fn check(call: &'static str, rc: libc::c_int) -> Result<(), ConfineError> {
    if rc == 0 {
        Ok(())
    } else {
        Err(ConfineError::Syscall {
            call,
            source: std::io::Error::last_os_error(),
        })
    }
}

/// Confine the calling (single-threaded) process with the procfs profile.
/// `expected_parent`, when known, is the agent's pid: if the parent already
/// changed, it is gone.
pub fn confine(expected_parent: Option<i32>) -> Result<(), ConfineError> {
    confine_as(Profile::Procfs, expected_parent)
}

/// Confine the calling (single-threaded) process with the sockopt profile.
pub fn confine_sockopt(expected_parent: Option<i32>) -> Result<(), ConfineError> {
    confine_as(Profile::Sockopt, expected_parent)
}

/// Confine the calling (single-threaded) process with the net profile; call
/// it after entering the target netns.
pub fn confine_net(expected_parent: Option<i32>) -> Result<(), ConfineError> {
    confine_as(Profile::Net, expected_parent)
}

/// Empty the bounding set (needs `CAP_SETPCAP` in the effective set) and
/// check that it is empty.
fn empty_bounding_set() -> Result<(), ConfineError> {
    for cap in caps::all() {
        // Capabilities this kernel does not know fail with EINVAL: skip them.
        if caps::has_cap(None, CapSet::Bounding, cap).unwrap_or(false) {
            caps::drop(None, CapSet::Bounding, cap)
                .map_err(|e| ConfineError::Bounding(format!("{cap}: {e}")))?;
        }
    }
    let left =
        caps::read(None, CapSet::Bounding).map_err(|e| ConfineError::Bounding(e.to_string()))?;
    if left.is_empty() {
        Ok(())
    } else {
        Err(ConfineError::Bounding(format!("{left:?} still in it")))
    }
}

/// Confine the calling (single-threaded) process with `profile`.
pub fn confine_as(profile: Profile, expected_parent: Option<i32>) -> Result<(), ConfineError> {
    // SAFETY: prctl(PR_SET_PDEATHSIG) takes integer arguments only.
    check("prctl(PR_SET_PDEATHSIG)", unsafe {
        libc::prctl(
            libc::PR_SET_PDEATHSIG,
            libc::SIGKILL as libc::c_ulong,
            0,
            0,
            0,
        )
    })?;
    // SAFETY: getppid has no arguments and cannot fail.
    let actual = unsafe { libc::getppid() };
    if let Some(expected) = expected_parent
        && expected != actual
    {
        return Err(ConfineError::ParentGone { expected, actual });
    }

    let kept: CapsHashSet = match profile {
        Profile::Procfs => KEPT_CAPS.into_iter().collect(),
        Profile::Net => KEPT_NET_CAPS.into_iter().collect(),
        Profile::Sockopt => KEPT_SOCKOPT_CAPS.into_iter().collect(),
    };
    let permitted =
        caps::read(None, CapSet::Permitted).map_err(|e| ConfineError::Caps(e.to_string()))?;
    let privileged = !permitted.is_empty();
    if privileged {
        // Make sure the capabilities the next two steps use are effective.
        caps::set(None, CapSet::Effective, &permitted)
            .map_err(|e| ConfineError::Caps(e.to_string()))?;
        if !permitted.contains(&Capability::CAP_SYS_ADMIN) {
            return Err(ConfineError::NoViewPrivilege);
        }
        crate::view::enter_proc_view()?;
        if !permitted.contains(&Capability::CAP_SETPCAP) {
            return Err(ConfineError::Bounding(
                "CAP_SETPCAP was not inherited".into(),
            ));
        }
        empty_bounding_set()?;
    }
    let keep: CapsHashSet = permitted.intersection(&kept).copied().collect();
    caps::clear(None, CapSet::Ambient).map_err(|e| ConfineError::Caps(e.to_string()))?;
    caps::clear(None, CapSet::Inheritable).map_err(|e| ConfineError::Caps(e.to_string()))?;
    caps::set(None, CapSet::Effective, &keep).map_err(|e| ConfineError::Caps(e.to_string()))?;
    caps::set(None, CapSet::Permitted, &keep).map_err(|e| ConfineError::Caps(e.to_string()))?;

    let no_core = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: the pointer is to a live, initialised rlimit.
    check("setrlimit(RLIMIT_CORE)", unsafe {
        libc::setrlimit(libc::RLIMIT_CORE, &no_core)
    })?;
    // SAFETY: prctl(PR_SET_NO_NEW_PRIVS) takes integer arguments only.
    check("prctl(PR_SET_NO_NEW_PRIVS)", unsafe {
        libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    })?;

    let landlocked = match profile {
        Profile::Procfs => None,
        Profile::Net => Some(crate::view::restrict_net_helper()?),
        // No Landlock here: a Landlock domain may not ptrace (hence not
        // `pidfd_getfd`) a process outside it, which is every socket owner.
        // The filesystem is closed by the view and by seccomp instead: the
        // sockopt program has no `openat`/`open` at all.
        Profile::Sockopt => None,
    };
    if let Some(status) = landlocked {
        match status {
            landlock::RulesetStatus::FullyEnforced => {}
            other => {
                // Before seccomp: stderr is still writable here.
                eprintln!(
                    "pstack-helper: landlock ruleset {other:?} on this kernel; relying on seccomp, capabilities and the /proc view"
                );
            }
        }
    }

    let own_pid = std::process::id();
    let program = match profile {
        Profile::Procfs => crate::filter::procfs_program(own_pid)?,
        Profile::Net => crate::filter::net_program(own_pid)?,
        Profile::Sockopt => crate::filter::sockopt_program(own_pid)?,
    };
    seccompiler::apply_filter(&program).map_err(|e| ConfineError::Seccomp(e.to_string()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kept_masks_are_the_documented_literals() {
        assert_eq!(kept_caps_mask(), 0x0000_0000_0028_0004);
        assert_eq!(kept_net_caps_mask(), 0x0000_0000_0000_1000);
        assert_eq!(kept_sockopt_caps_mask(), 0x0000_0000_0008_0000);
        assert!(!KEPT_NET_CAPS.contains(&Capability::CAP_SYS_PTRACE));
        assert!(!KEPT_CAPS.contains(&Capability::CAP_SETPCAP));
        assert!(!KEPT_NET_CAPS.contains(&Capability::CAP_SETPCAP));
    }
}
