//! The helper's seccomp programs: allow-lists with argument filters whose
//! mismatch action kills the process (SIGSYS).
//!
//! Invariants (both profiles):
//! - `openat` (and x86_64 `open`) only with read-only flags: any of
//!   `O_WRONLY`, `O_RDWR`, `O_CREAT`, `O_TRUNC`, `O_APPEND`, `O_TMPFILE`, …
//!   kills the helper. So no descriptor in the helper but its inherited pipes
//!   can be written, whatever path it names (`/etc/passwd`, `/proc/PID/mem`,
//!   `/proc/sys/kernel/core_pattern`, a new file in `/etc/cron.d`).
//! - `write`/`writev` only to descriptor 1, the response pipe.
//! - `tgkill` only to the helper's own thread group (what `abort` uses);
//!   `kill` and `tkill` are not allowed at all.
//! - `mmap`/`mprotect` never with `PROT_EXEC`: no new code after confinement.
//! - `fcntl` only to get/set descriptor and status flags (no `F_DUPFD`).
//! - Not allowed (not in the list), among others: `ptrace`,
//!   `process_vm_readv`/`process_vm_writev`, `pwrite64`, `mount`, `umount2`,
//!   `pivot_root`, `unshare`, `setns`, `bpf`, `perf_event_open`,
//!   `init_module`/`finit_module`, `kexec_load`, `keyctl`,
//!   `open_by_handle_at`, `execve`/`execveat`, `socket` (procfs profile),
//!   `connect`/`bind`, `io_uring_setup`.
//!
//! The net profile adds what netlink needs and `socket` for `AF_NETLINK`
//! with `NETLINK_ROUTE` or `NETLINK_SOCK_DIAG` only.
//!
//! The sockopt profile ([`sockopt_program`]) drops every filesystem call
//! (`openat`, `readlinkat`, `getdents64`, …) and adds only `pidfd_open`,
//! `pidfd_getfd` (flags 0) and `getsockopt` of five named options.

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule,
};

use crate::confine_error::ConfineError;

/// Syscalls allowed with any arguments in both profiles: what Rust's std,
/// the allocator and the procfs reads use.
pub const UNFILTERED_SYSCALLS: &[i64] = &[
    libc::SYS_read,
    libc::SYS_close,
    libc::SYS_fstat,
    libc::SYS_newfstatat,
    libc::SYS_statx,
    libc::SYS_lseek,
    libc::SYS_readlinkat,
    libc::SYS_getdents64,
    libc::SYS_munmap,
    libc::SYS_mremap,
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
    libc::SYS_exit,
    libc::SYS_exit_group,
    libc::SYS_restart_syscall,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_readlink,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_stat,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_lstat,
];

/// Syscalls allowed only with the argument filters described in the module
/// docs (both profiles).
pub const FILTERED_SYSCALLS: &[i64] = &[
    libc::SYS_openat,
    libc::SYS_write,
    libc::SYS_writev,
    libc::SYS_mmap,
    libc::SYS_mprotect,
    libc::SYS_fcntl,
    libc::SYS_tgkill,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_open,
];

/// Open flags a helper may pass: read-only access plus flags that change
/// how, not whether, a path is opened.
pub const READ_ONLY_OPEN_FLAGS: i32 = libc::O_RDONLY
    | libc::O_CLOEXEC
    | libc::O_NONBLOCK
    | libc::O_DIRECTORY
    | libc::O_NOFOLLOW
    | libc::O_LARGEFILE
    | libc::O_NOCTTY
    | libc::O_NOATIME;

/// The only descriptor a helper may `write`/`writev` to: its response pipe.
pub const RESPONSE_FD: i32 = 1;

/// `fcntl` commands a helper may use.
pub const FCNTL_COMMANDS: [i32; 4] = [libc::F_GETFD, libc::F_SETFD, libc::F_GETFL, libc::F_SETFL];

/// Syscalls a net helper may make beyond the common list (besides `socket`,
/// which is argument-filtered): netlink I/O and the CPU count.
pub const NET_EXTRA_SYSCALLS: &[i64] = &[
    libc::SYS_setsockopt,
    libc::SYS_sendto,
    libc::SYS_recvfrom,
    libc::SYS_sched_getaffinity,
];

/// Netlink protocols a net helper may open.
pub const NET_NETLINK_PROTOCOLS: [i32; 2] = [libc::NETLINK_ROUTE, libc::NETLINK_SOCK_DIAG];

fn seccomp_err(e: seccompiler::BackendError) -> ConfineError {
    ConfineError::Seccomp(e.to_string())
}

/// `arg[index]` (a 32-bit int) equals `value`.
fn dword_eq(index: u8, value: u64) -> Result<SeccompCondition, ConfineError> {
    SeccompCondition::new(index, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, value)
        .map_err(seccomp_err)
}

/// `arg[index] & mask == 0`.
fn none_of(index: u8, len: SeccompCmpArgLen, mask: u64) -> Result<SeccompCondition, ConfineError> {
    SeccompCondition::new(index, len, SeccompCmpOp::MaskedEq(mask), 0).map_err(seccomp_err)
}

fn rule(conditions: Vec<SeccompCondition>) -> Result<SeccompRule, ConfineError> {
    SeccompRule::new(conditions).map_err(seccomp_err)
}

/// The rules both profiles share. `own_pid` is the helper's pid (the only
/// `tgkill` target).
fn common_rules(own_pid: u32) -> Result<BTreeMap<i64, Vec<SeccompRule>>, ConfineError> {
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = UNFILTERED_SYSCALLS
        .iter()
        .map(|nr| (*nr, Vec::new()))
        .collect();
    // Any flag bit outside READ_ONLY_OPEN_FLAGS (O_WRONLY, O_RDWR, O_CREAT, …).
    let not_read_only = u64::from(!(READ_ONLY_OPEN_FLAGS as u32));
    // openat(dirfd, path, flags, mode)
    rules.insert(
        libc::SYS_openat,
        vec![rule(vec![none_of(
            2,
            SeccompCmpArgLen::Dword,
            not_read_only,
        )?])?],
    );
    // open(path, flags, mode)
    #[cfg(target_arch = "x86_64")]
    rules.insert(
        libc::SYS_open,
        vec![rule(vec![none_of(
            1,
            SeccompCmpArgLen::Dword,
            not_read_only,
        )?])?],
    );
    for nr in [libc::SYS_write, libc::SYS_writev] {
        rules.insert(nr, vec![rule(vec![dword_eq(0, RESPONSE_FD as u64)?])?]);
    }
    // mmap(addr, len, prot, …), mprotect(addr, len, prot)
    for nr in [libc::SYS_mmap, libc::SYS_mprotect] {
        rules.insert(
            nr,
            vec![rule(vec![none_of(
                2,
                SeccompCmpArgLen::Dword,
                libc::PROT_EXEC as u64,
            )?])?],
        );
    }
    let mut fcntl = Vec::new();
    for cmd in FCNTL_COMMANDS {
        fcntl.push(rule(vec![dword_eq(1, cmd as u64)?])?);
    }
    rules.insert(libc::SYS_fcntl, fcntl);
    // tgkill(tgid, tid, sig): only our own thread group.
    rules.insert(
        libc::SYS_tgkill,
        vec![rule(vec![dword_eq(0, u64::from(own_pid))?])?],
    );
    Ok(rules)
}

fn build(rules: BTreeMap<i64, Vec<SeccompRule>>) -> Result<BpfProgram, ConfineError> {
    let arch = std::env::consts::ARCH
        .try_into()
        .map_err(|e| ConfineError::Seccomp(format!("{e:?}")))?;
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::KillProcess,
        SeccompAction::Allow,
        arch,
    )
    .map_err(seccomp_err)?;
    filter.try_into().map_err(seccomp_err)
}

/// The procfs profile's program for a helper whose pid is `own_pid`.
pub fn procfs_program(own_pid: u32) -> Result<BpfProgram, ConfineError> {
    build(common_rules(own_pid)?)
}

/// The net profile's program: the common rules, [`NET_EXTRA_SYSCALLS`], and
/// `socket(AF_NETLINK, *, p)` for `p` in [`NET_NETLINK_PROTOCOLS`].
pub fn net_program(own_pid: u32) -> Result<BpfProgram, ConfineError> {
    let mut rules = common_rules(own_pid)?;
    for nr in NET_EXTRA_SYSCALLS {
        rules.insert(*nr, Vec::new());
    }
    let mut socket_rules = Vec::new();
    for protocol in NET_NETLINK_PROTOCOLS {
        // socket(int domain, int type, int protocol)
        socket_rules.push(rule(vec![
            dword_eq(0, libc::AF_NETLINK as u64)?,
            dword_eq(2, protocol as u64)?,
        ])?);
    }
    rules.insert(libc::SYS_socket, socket_rules);
    build(rules)
}

/// Filesystem calls of the common list that the sockopt profile drops: it
/// opens, lists and resolves nothing.
pub const SOCKOPT_DROPPED_SYSCALLS: &[i64] = &[
    libc::SYS_openat,
    libc::SYS_readlinkat,
    libc::SYS_getdents64,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_open,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_readlink,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_stat,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_lstat,
];

/// The `getsockopt(level, name)` pairs a sockopt helper may read.
pub const SOCKOPT_OPTIONS: [(i32, i32); 5] = [
    (libc::IPPROTO_TCP, libc::TCP_USER_TIMEOUT),
    (libc::SOL_SOCKET, libc::SO_KEEPALIVE),
    (libc::IPPROTO_TCP, libc::TCP_KEEPIDLE),
    (libc::IPPROTO_TCP, libc::TCP_KEEPINTVL),
    (libc::IPPROTO_TCP, libc::TCP_KEEPCNT),
];

/// The sockopt profile's program: the common rules without
/// [`SOCKOPT_DROPPED_SYSCALLS`], plus `pidfd_open(pid, 0)`,
/// `pidfd_getfd(pidfd, fd, 0)` and `getsockopt` of [`SOCKOPT_OPTIONS`]
/// only. No `sendto`/`sendmsg`/`setsockopt`/`socket`: a duplicated socket
/// can be read from (its options) and closed, nothing else.
pub fn sockopt_program(own_pid: u32) -> Result<BpfProgram, ConfineError> {
    let mut rules = common_rules(own_pid)?;
    for nr in SOCKOPT_DROPPED_SYSCALLS {
        rules.remove(nr);
    }
    // pidfd_open(pid_t pid, unsigned int flags)
    rules.insert(libc::SYS_pidfd_open, vec![rule(vec![dword_eq(1, 0)?])?]);
    // pidfd_getfd(int pidfd, int targetfd, unsigned int flags)
    rules.insert(libc::SYS_pidfd_getfd, vec![rule(vec![dword_eq(2, 0)?])?]);
    // getsockopt(int fd, int level, int optname, void *optval, socklen_t *optlen)
    let mut getsockopt = Vec::new();
    for (level, name) in SOCKOPT_OPTIONS {
        getsockopt.push(rule(vec![
            dword_eq(1, level as u64)?,
            dword_eq(2, name as u64)?,
        ])?);
    }
    rules.insert(libc::SYS_getsockopt, getsockopt);
    build(rules)
}

#[cfg(test)]
mod tests {
    use super::*;

    const NEVER: [i64; 22] = [
        libc::SYS_socket,
        libc::SYS_execve,
        libc::SYS_execveat,
        libc::SYS_ptrace,
        libc::SYS_process_vm_writev,
        libc::SYS_process_vm_readv,
        libc::SYS_pwrite64,
        libc::SYS_mount,
        libc::SYS_umount2,
        libc::SYS_pivot_root,
        libc::SYS_unshare,
        libc::SYS_setns,
        libc::SYS_bpf,
        libc::SYS_init_module,
        libc::SYS_finit_module,
        libc::SYS_kill,
        libc::SYS_tkill,
        libc::SYS_open_by_handle_at,
        libc::SYS_connect,
        libc::SYS_bind,
        libc::SYS_keyctl,
        libc::SYS_io_uring_setup,
    ];

    #[test]
    fn programs_build_and_never_allow_the_dangerous_calls() {
        assert!(!procfs_program(1).unwrap().is_empty());
        assert!(!net_program(1).unwrap().is_empty());
        assert!(!sockopt_program(1).unwrap().is_empty());
        for nr in NEVER {
            assert!(!UNFILTERED_SYSCALLS.contains(&nr), "{nr}");
            assert!(!FILTERED_SYSCALLS.contains(&nr), "{nr}");
            if nr != libc::SYS_socket {
                assert!(!NET_EXTRA_SYSCALLS.contains(&nr), "{nr}");
            }
        }
    }

    #[test]
    fn read_only_flags_exclude_every_write_or_create_flag() {
        for flag in [
            libc::O_WRONLY,
            libc::O_RDWR,
            libc::O_CREAT,
            libc::O_TRUNC,
            libc::O_APPEND,
            libc::O_EXCL,
            libc::O_TMPFILE,
            libc::O_PATH,
            libc::O_DSYNC,
        ] {
            // O_TMPFILE includes O_DIRECTORY: the filter must still see a
            // bit outside the allowed set.
            assert_ne!(flag & !READ_ONLY_OPEN_FLAGS, 0, "{flag:#o}");
        }
    }
}
