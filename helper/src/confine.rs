//! Confinement of the helper process. [`confine`] (the procfs profile) or
//! [`confine_net`] (the net profile, `pstack-helper --net`) runs first thing
//! in the helper's `main`, before any request is read:
//!
//! 1. `PR_SET_PDEATHSIG(SIGKILL)`: the helper dies with the thread that
//!    spawned it; if that parent is already gone, the helper exits.
//! 2. Capabilities: the bounding, inheritable and ambient sets are emptied and
//!    the effective/permitted sets reduced to [`KEPT_CAPS`] (intersected with
//!    what the helper was given): `CAP_SYS_ADMIN` (the kernel requires it to
//!    read `/proc/<pid>/stack`), `CAP_SYS_PTRACE` (ptrace-mode access to other
//!    users' `wchan`, `syscall`, `environ`, fd links), `CAP_DAC_READ_SEARCH`
//!    (search other users' `/proc/<pid>/fd` and fd-target paths). The seccomp
//!    filter below bounds what those can be used for.
//! 3. `RLIMIT_CORE = 0`: a SIGSYS kill leaves no core with process memory.
//! 4. `PR_SET_NO_NEW_PRIVS`.
//! 5. A seccomp allow-list ([`ALLOWED_SYSCALLS`]) whose mismatch action kills
//!    the process: no `socket`, no `execve`, no `mount`, no `ptrace`.
//!
//! # The net profile ([`Profile::Net`])
//!
//! A net helper has already entered the target network namespace
//! (`setns`, which needs `CAP_SYS_ADMIN`, done while it is single-threaded
//! and before this runs). It then keeps only [`KEPT_NET_CAPS`]:
//! `CAP_NET_ADMIN`, because `RTM_GETLINK` with `IFLA_TARGET_NETNSID` (the
//! stats of a veth's peer, which lives in another netns) requires it over that
//! netns's user namespace. Nothing else its reads do needs a capability:
//! sock_diag TCP dumps and `RTM_GETROUTE` are open to anyone in the netns,
//! and `/proc/thread-self/net/{snmp,netstat,stat/nf_conntrack}`,
//! `/proc/sys/net/netfilter/nf_conntrack_{count,max}`, `/proc/loadavg`,
//! `/proc/stat` and `/proc/pressure/cpu` are world-readable. So
//! `CAP_SYS_ADMIN` (no more `setns`), `CAP_SYS_PTRACE` and
//! `CAP_DAC_READ_SEARCH` are dropped from every set, the bounding set too.
//! Its seccomp allow-list ([`net_seccomp_program`]) is the procfs list plus
//! what netlink needs (`setsockopt`, `sendto`, `recvfrom`,
//! `sched_getaffinity` for the CPU count), and `socket(2)` **only** when the
//! domain is `AF_NETLINK` and the protocol `NETLINK_ROUTE` or
//! `NETLINK_SOCK_DIAG`: an `AF_INET`/`AF_INET6` (or any other) socket kills
//! the helper with SIGSYS, as do `execve`, `ptrace`, `mount` and `setns`.

use std::collections::BTreeMap;

use caps::{CapSet, Capability, CapsHashSet};
use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule,
};

/// Which confinement a helper runs under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Profile {
    /// Risky procfs reads: [`KEPT_CAPS`], [`ALLOWED_SYSCALLS`], no sockets.
    Procfs,
    /// Net reads in an entered netns: [`KEPT_NET_CAPS`], [`ALLOWED_SYSCALLS`]
    /// plus [`NET_EXTRA_SYSCALLS`], and `socket` for netlink only.
    Net,
}

/// Capabilities the helper keeps (when it has them).
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

/// Syscalls a net helper may make beyond [`ALLOWED_SYSCALLS`] (besides
/// `socket`, which is argument-filtered): netlink I/O and the CPU count.
pub const NET_EXTRA_SYSCALLS: &[i64] = &[
    libc::SYS_setsockopt,
    libc::SYS_sendto,
    libc::SYS_recvfrom,
    libc::SYS_sched_getaffinity,
];

/// Netlink protocols a net helper may open.
pub const NET_NETLINK_PROTOCOLS: [i32; 2] = [libc::NETLINK_ROUTE, libc::NETLINK_SOCK_DIAG];

/// Syscalls the helper may make after confinement: what Rust's std, the
/// allocator and the procfs reads use, nothing else.
pub const ALLOWED_SYSCALLS: &[i64] = &[
    libc::SYS_read,
    libc::SYS_write,
    libc::SYS_writev,
    libc::SYS_openat,
    libc::SYS_close,
    libc::SYS_fstat,
    libc::SYS_newfstatat,
    libc::SYS_statx,
    libc::SYS_lseek,
    libc::SYS_readlinkat,
    libc::SYS_getdents64,
    libc::SYS_fcntl,
    libc::SYS_mmap,
    libc::SYS_munmap,
    libc::SYS_mremap,
    libc::SYS_mprotect,
    libc::SYS_madvise,
    libc::SYS_brk,
    libc::SYS_futex,
    libc::SYS_rt_sigreturn,
    libc::SYS_rt_sigprocmask,
    libc::SYS_rt_sigaction,
    libc::SYS_sigaltstack,
    libc::SYS_clock_gettime,
    libc::SYS_clock_nanosleep,
    libc::SYS_sched_yield,
    libc::SYS_getrandom,
    libc::SYS_getpid,
    libc::SYS_gettid,
    libc::SYS_getppid,
    libc::SYS_tgkill,
    libc::SYS_exit,
    libc::SYS_exit_group,
    libc::SYS_restart_syscall,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_readlink,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_open,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_stat,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_lstat,
];

/// A confinement step failed; the helper must not serve.
#[derive(Debug, thiserror::Error)]
pub enum ConfineError {
    /// A prctl/setrlimit call failed.
    #[error("{call} failed: {source}")]
    Syscall {
        /// The call.
        call: &'static str,
        /// The OS error.
        source: std::io::Error,
    },
    /// The parent exited before the death signal was armed.
    #[error("parent {expected} is gone (parent is now {actual})")]
    ParentGone {
        /// The agent's pid.
        expected: i32,
        /// The current parent.
        actual: i32,
    },
    /// Changing capability sets failed.
    #[error("capabilities: {0}")]
    Caps(String),
    /// Building or installing the seccomp filter failed.
    #[error("seccomp: {0}")]
    Seccomp(String),
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

fn build_program(rules: BTreeMap<i64, Vec<SeccompRule>>) -> Result<BpfProgram, ConfineError> {
    let arch = std::env::consts::ARCH
        .try_into()
        .map_err(|e| ConfineError::Seccomp(format!("{e:?}")))?;
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::KillProcess,
        SeccompAction::Allow,
        arch,
    )
    .map_err(|e| ConfineError::Seccomp(e.to_string()))?;
    filter
        .try_into()
        .map_err(|e: seccompiler::BackendError| ConfineError::Seccomp(e.to_string()))
}

/// Build the seccomp program (allow-list; everything else kills the process).
pub fn seccomp_program() -> Result<BpfProgram, ConfineError> {
    build_program(
        ALLOWED_SYSCALLS
            .iter()
            .map(|nr| (*nr, Vec::new()))
            .collect(),
    )
}

/// Build the net profile's seccomp program: [`ALLOWED_SYSCALLS`] and
/// [`NET_EXTRA_SYSCALLS`] unconditionally, `socket(AF_NETLINK, *, p)` for
/// `p` in [`NET_NETLINK_PROTOCOLS`]; everything else kills the process.
pub fn net_seccomp_program() -> Result<BpfProgram, ConfineError> {
    let seccomp = |e: seccompiler::BackendError| ConfineError::Seccomp(e.to_string());
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = ALLOWED_SYSCALLS
        .iter()
        .chain(NET_EXTRA_SYSCALLS)
        .map(|nr| (*nr, Vec::new()))
        .collect();
    let mut socket_rules = Vec::new();
    for protocol in NET_NETLINK_PROTOCOLS {
        // socket(int domain, int type, int protocol): compare the 32-bit ints.
        let domain = SeccompCondition::new(
            0,
            SeccompCmpArgLen::Dword,
            SeccompCmpOp::Eq,
            libc::AF_NETLINK as u64,
        )
        .map_err(seccomp)?;
        let proto = SeccompCondition::new(
            2,
            SeccompCmpArgLen::Dword,
            SeccompCmpOp::Eq,
            protocol as u64,
        )
        .map_err(seccomp)?;
        socket_rules.push(SeccompRule::new(vec![domain, proto]).map_err(seccomp)?);
    }
    rules.insert(libc::SYS_socket, socket_rules);
    build_program(rules)
}

/// Confine the calling (single-threaded) process with the procfs profile.
/// `expected_parent`, when known, is the agent's pid: if the parent already
/// changed, it is gone.
pub fn confine(expected_parent: Option<i32>) -> Result<(), ConfineError> {
    confine_as(Profile::Procfs, expected_parent)
}

/// Confine the calling (single-threaded) process with the net profile; call
/// it after entering the target netns.
pub fn confine_net(expected_parent: Option<i32>) -> Result<(), ConfineError> {
    confine_as(Profile::Net, expected_parent)
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
    };
    let permitted =
        caps::read(None, CapSet::Permitted).map_err(|e| ConfineError::Caps(e.to_string()))?;
    let keep: CapsHashSet = permitted.intersection(&kept).copied().collect();
    if permitted.contains(&Capability::CAP_SETPCAP) {
        for cap in caps::all() {
            if !kept.contains(&cap) {
                // Capabilities this kernel does not know fail with EINVAL: skip them.
                let _ = caps::drop(None, CapSet::Bounding, cap);
            }
        }
    }
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

    let program = match profile {
        Profile::Procfs => seccomp_program()?,
        Profile::Net => net_seccomp_program()?,
    };
    seccompiler::apply_filter(&program).map_err(|e| ConfineError::Seccomp(e.to_string()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn program_builds_and_mask_is_three_caps() {
        assert!(!seccomp_program().unwrap().is_empty());
        assert_eq!(kept_caps_mask(), (1 << 2) | (1 << 19) | (1 << 21));
        assert!(!ALLOWED_SYSCALLS.contains(&libc::SYS_socket));
        assert!(!ALLOWED_SYSCALLS.contains(&libc::SYS_execve));
        assert!(!ALLOWED_SYSCALLS.contains(&libc::SYS_execveat));
    }

    #[test]
    fn net_program_builds_and_keeps_only_net_admin() {
        assert!(!net_seccomp_program().unwrap().is_empty());
        assert_eq!(kept_net_caps_mask(), 1 << 12);
        for forbidden in [
            libc::SYS_socket,
            libc::SYS_execve,
            libc::SYS_execveat,
            libc::SYS_ptrace,
            libc::SYS_mount,
            libc::SYS_setns,
            libc::SYS_connect,
            libc::SYS_bind,
        ] {
            assert!(
                !ALLOWED_SYSCALLS.contains(&forbidden) && !NET_EXTRA_SYSCALLS.contains(&forbidden),
                "{forbidden}"
            );
        }
    }
}
