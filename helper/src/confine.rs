//! Confinement of the helper process. [`confine`] runs first thing in the
//! helper's `main`, before any request is read:
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

use std::collections::BTreeMap;

use caps::{CapSet, Capability, CapsHashSet};
use seccompiler::{BpfProgram, SeccompAction, SeccompFilter};

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

/// Build the seccomp program (allow-list; everything else kills the process).
pub fn seccomp_program() -> Result<BpfProgram, ConfineError> {
    let rules: BTreeMap<i64, Vec<seccompiler::SeccompRule>> = ALLOWED_SYSCALLS
        .iter()
        .map(|nr| (*nr, Vec::new()))
        .collect();
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

/// Confine the calling (single-threaded) process. `expected_parent`, when
/// known, is the agent's pid: if the parent already changed, it is gone.
pub fn confine(expected_parent: Option<i32>) -> Result<(), ConfineError> {
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

    let kept: CapsHashSet = KEPT_CAPS.into_iter().collect();
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

    let program = seccomp_program()?;
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
}
