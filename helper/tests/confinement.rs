//! Root-only: the real `pstack-helper` binary confines itself before serving.
//! Its `/proc/<pid>/status` shows `NoNewPrivs: 1`, `Seccomp: 2` and exactly the
//! kept capabilities, and a forbidden syscall kills it with SIGSYS. The same
//! for the net profile (`pstack-helper --net`): netlink sockets work, an
//! `AF_INET` socket kills it, and it reads the netns whose fd it was given.
#![allow(
    clippy::unwrap_in_result,
    reason = "test helpers panic on setup failure by design"
)]

use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::ExitStatusExt;
use std::process::{Child, Command, Stdio};

use pstack_collectors::net::FlowFilter;
use pstack_helper::protocol::{
    ForbiddenSyscall, MAX_FRAME, NetOutcome, NetRequest, NetRequestKind, NetResponse, Outcome,
    PROTOCOL_VERSION, Request, Response, SurfaceKind, SurfaceRequest, encode, read_frame,
};

fn is_root() -> bool {
    // SAFETY: geteuid has no arguments and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

fn spawn() -> Child {
    Command::new(env!("CARGO_BIN_EXE_pstack-helper"))
        .env("PSTACK_HELPER_PARENT", std::process::id().to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn pstack-helper")
}

fn ask(child: &mut Child, kind: SurfaceKind) -> Option<Response> {
    let req = Request {
        version: PROTOCOL_VERSION,
        digest_key: pstack_envelope::DigestKey::from_bytes([5; 32]),
        surfaces: vec![SurfaceRequest {
            seq: 1,
            pid: std::process::id(),
            kind,
            deadline_ms: 1000,
            max_bytes: 4096,
        }],
    };
    let stdin = child.stdin.as_mut().unwrap();
    stdin.write_all(&encode(&req, MAX_FRAME).unwrap()).unwrap();
    stdin.flush().unwrap();
    read_frame(child.stdout.as_mut().unwrap(), MAX_FRAME).unwrap()
}

fn status_field(pid: u32, key: &str) -> String {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{key}:")))
        .unwrap_or_default()
        .trim()
        .to_string()
}

/// The confinement lines of a live helper's `/proc/PID/status`.
fn confinement(pid: u32) -> Vec<(String, String)> {
    [
        "CapInh",
        "CapPrm",
        "CapEff",
        "CapBnd",
        "CapAmb",
        "NoNewPrivs",
        "Seccomp",
    ]
    .iter()
    .map(|k| (k.to_string(), status_field(pid, k)))
    .collect()
}

fn expect(lines: &[(&str, &str)]) -> Vec<(String, String)> {
    lines
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

const PROCFS_HELPER_STATUS: &[(&str, &str)] = &[
    ("CapInh", "0000000000000000"),
    ("CapPrm", "0000000000280004"),
    ("CapEff", "0000000000280004"),
    ("CapBnd", "0000000000000000"),
    ("CapAmb", "0000000000000000"),
    ("NoNewPrivs", "1"),
    ("Seccomp", "2"),
];

const NET_HELPER_STATUS: &[(&str, &str)] = &[
    ("CapInh", "0000000000000000"),
    ("CapPrm", "0000000000001000"),
    ("CapEff", "0000000000001000"),
    ("CapBnd", "0000000000000000"),
    ("CapAmb", "0000000000000000"),
    ("NoNewPrivs", "1"),
    ("Seccomp", "2"),
];

#[test]
fn root_helper_status_shows_no_new_privs_seccomp_and_reduced_caps() {
    pstack_testkit::require!(
        is_root(),
        "needs root (capability sets are only reduced from a privileged start)"
    );
    let mut child = spawn();
    let me = std::process::id();
    let first = ask(&mut child, SurfaceKind::Wchan { tid: me }).expect("a response");
    assert!(matches!(first.outcome, Outcome::Ok { .. }), "{first:?}");
    let pid = child.id();
    // Literal values, not the library's own masks: CAP_DAC_READ_SEARCH (2),
    // CAP_SYS_PTRACE (19), CAP_SYS_ADMIN (21); nothing in the bounding set.
    assert_eq!(confinement(pid), expect(PROCFS_HELPER_STATUS));
    drop(child.stdin.take());
    assert!(child.wait().unwrap().success());
}

#[test]
fn root_forbidden_socket_and_execve_kill_the_helper_with_sigsys() {
    pstack_testkit::require!(is_root(), "needs root");
    for syscall in [ForbiddenSyscall::Socket, ForbiddenSyscall::Execve] {
        let mut child = spawn();
        let resp = ask(&mut child, SurfaceKind::ForbiddenSyscall { syscall });
        assert!(
            resp.is_none(),
            "{syscall:?}: the helper answered instead of dying: {resp:?}"
        );
        let status = child.wait().unwrap();
        assert_eq!(
            status.signal(),
            Some(libc::SIGSYS),
            "{syscall:?}: {status:?}"
        );
    }
}

#[test]
fn helper_serves_every_risky_surface_of_a_real_process_under_seccomp() {
    // Regression: a syscall missing from the allow-list kills the helper with
    // SIGSYS on the first read that needs it; exercise every surface kind.
    let mut sleeper = Command::new("sleep").arg("30").spawn().unwrap();
    let pid = sleeper.id();
    let mut child = spawn();
    let kinds = [
        SurfaceKind::Wchan { tid: pid },
        SurfaceKind::Stack { tid: pid },
        SurfaceKind::Syscall { tid: pid },
        SurfaceKind::Cmdline,
        SurfaceKind::Environ,
        SurfaceKind::FdTargets { max_fds: 64 },
        SurfaceKind::ThreadWchans { tids: vec![pid] },
    ];
    let req = Request {
        version: PROTOCOL_VERSION,
        digest_key: pstack_envelope::DigestKey::from_bytes([5; 32]),
        surfaces: kinds
            .iter()
            .enumerate()
            .map(|(i, k)| SurfaceRequest {
                seq: i as u32,
                pid,
                kind: k.clone(),
                deadline_ms: 1000,
                max_bytes: 65536,
            })
            .collect(),
    };
    child
        .stdin
        .as_mut()
        .unwrap()
        .write_all(&encode(&req, MAX_FRAME).unwrap())
        .unwrap();
    for (i, kind) in kinds.iter().enumerate() {
        let r: Response = read_frame(child.stdout.as_mut().unwrap(), MAX_FRAME)
            .unwrap()
            .unwrap_or_else(|| panic!("helper died at surface {i} ({kind:?}): {:?}", child.wait()));
        assert_eq!(r.seq, i as u32);
        if is_root() {
            assert!(matches!(r.outcome, Outcome::Ok { .. }), "{kind:?}: {r:?}");
        }
    }
    drop(child.stdin.take());
    assert!(child.wait().unwrap().success());
    let _ = sleeper.kill();
    let _ = sleeper.wait();
}

/// Spawn `pstack-helper --net`, handing it `netns` as descriptor 3 when given.
fn spawn_net(netns: Option<&std::fs::File>) -> Child {
    let mut cmd = pstack_helper::launch::net_command(
        std::path::Path::new(env!("CARGO_BIN_EXE_pstack-helper")),
        netns,
    );
    cmd.env("PSTACK_HELPER_PARENT", std::process::id().to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped());
    cmd.spawn().expect("spawn pstack-helper --net")
}

fn ask_net(child: &mut Child, kind: NetRequestKind) -> Option<NetResponse> {
    let req = NetRequest {
        version: PROTOCOL_VERSION,
        seq: 1,
        kind,
        deadline_ms: 2000,
    };
    let stdin = child.stdin.as_mut().unwrap();
    stdin.write_all(&encode(&req, MAX_FRAME).unwrap()).unwrap();
    stdin.flush().unwrap();
    read_frame(child.stdout.as_mut().unwrap(), MAX_FRAME).unwrap()
}

fn loopback_sample() -> NetRequestKind {
    NetRequestKind::Sample {
        filter: FlowFilter {
            peer: "127.0.0.1".parse().unwrap(),
            peer_port: None,
            local: None,
            local_port: None,
            either_port_in: None,
        },
    }
}

fn ns_inode(path: &str) -> u64 {
    std::fs::metadata(path).unwrap().ino()
}

#[test]
fn root_net_helper_is_confined_to_net_admin_and_netlink_works_under_seccomp() {
    pstack_testkit::require!(
        is_root(),
        "needs root (capability sets are only reduced from a privileged start)"
    );
    let mut child = spawn_net(None);
    let resp = ask_net(&mut child, loopback_sample()).expect("a response");
    let pid = child.id();
    match resp.outcome {
        NetOutcome::Sample { net_ns, sample } => {
            assert_eq!(net_ns, ns_inode("/proc/self/ns/net"));
            // Every read of a sample ran under the net seccomp filter: the
            // AF_NETLINK sock_diag dump and route/link lookups worked, and so
            // did the procfs reads.
            assert!(sample.tcp.value.is_ok(), "{:?}", sample.tcp);
            assert!(sample.route.value.is_ok(), "{:?}", sample.route);
            assert!(sample.counters.value.is_ok(), "{:?}", sample.counters);
            assert!(sample.load.value.is_ok(), "{:?}", sample.load);
        }
        other => panic!("{other:?}"),
    }
    // Literal: CAP_NET_ADMIN (12) only; nothing in the bounding set.
    assert_eq!(confinement(pid), expect(NET_HELPER_STATUS));
    drop(child.stdin.take());
    assert!(child.wait().unwrap().success());
}

#[test]
fn root_net_helper_af_inet_socket_and_execve_kill_it_with_sigsys() {
    pstack_testkit::require!(is_root(), "needs root");
    // socket(AF_INET, SOCK_STREAM, 0) is not AF_NETLINK: the argument filter
    // does not match, and the mismatch action kills the process (SIGSYS), it
    // does not return EPERM.
    for syscall in [ForbiddenSyscall::Socket, ForbiddenSyscall::Execve] {
        let mut child = spawn_net(None);
        let resp = ask_net(&mut child, NetRequestKind::ForbiddenSyscall { syscall });
        assert!(
            resp.is_none(),
            "{syscall:?}: the net helper answered instead of dying: {resp:?}"
        );
        let status = child.wait().unwrap();
        assert_eq!(
            status.signal(),
            Some(libc::SIGSYS),
            "{syscall:?}: {status:?}"
        );
    }
}

/// A named netns for the test, deleted on drop.
struct TestNetns(String);

impl TestNetns {
    fn new() -> TestNetns {
        let name = format!("pstack-conf-{}", std::process::id());
        let _ = Command::new("ip").args(["netns", "del", &name]).status();
        let ok = Command::new("ip")
            .args(["netns", "add", &name])
            .status()
            .expect("run ip netns add");
        assert!(ok.success(), "ip netns add {name}");
        TestNetns(name)
    }
}

impl Drop for TestNetns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

#[test]
fn root_net_helper_reads_the_netns_whose_fd_it_was_given() {
    pstack_testkit::require!(is_root(), "needs root (setns into another netns)");
    let ns = TestNetns::new();
    let path = format!("/run/netns/{}", ns.0);
    let file = std::fs::File::open(&path).unwrap();
    let want = file.metadata().unwrap().ino();
    let mine = ns_inode("/proc/self/ns/net");
    assert_ne!(want, mine);
    let mut child = spawn_net(Some(&file));
    let resp = ask_net(&mut child, loopback_sample()).expect("a response");
    // The helper's own namespace link, read from outside, is the target's.
    let helper_ns = ns_inode(&format!("/proc/{}/ns/net", child.id()));
    assert_eq!(helper_ns, want);
    match resp.outcome {
        NetOutcome::Sample { net_ns, sample } => {
            assert_eq!(net_ns, want, "the helper read its own (target) netns");
            // A fresh netns has no TCP sockets at all (the host has some).
            let dump = sample.tcp.value.expect("sock_diag works in the new netns");
            assert!(dump.sockets.is_empty(), "{:?}", dump.sockets);
        }
        other => panic!("{other:?}"),
    }
    drop(child.stdin.take());
    assert!(child.wait().unwrap().success());
}

#[test]
fn net_helper_with_a_descriptor_that_is_not_a_netns_exits_before_serving() {
    let file = std::fs::File::open("/proc/self/status").unwrap();
    let mut child = spawn_net(Some(&file));
    drop(child.stdin.take());
    let status = child.wait().unwrap();
    // setns(2) on a non-namespace fd is EINVAL as root (6); unprivileged,
    // the kernel may refuse first (EPERM: 5). Either way it never serves.
    let want = if is_root() {
        pstack_helper::protocol::EXIT_NETNS_FAILED
    } else {
        pstack_helper::protocol::EXIT_NETNS_DENIED
    };
    assert_eq!(status.code(), Some(want), "{status:?}");
}

/// The seccomp allow-lists compared with literal, reviewed lists written here (not the
/// code's constants compared with themselves): a syscall added to or removed from
/// either profile must be reviewed here too.
#[test]
fn seccomp_allow_lists_are_exactly_the_reviewed_lists() {
    use std::collections::BTreeSet;
    let procfs: BTreeSet<i64> = [
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
    ]
    .into_iter()
    .collect();
    let net_extra: BTreeSet<i64> = [
        libc::SYS_setsockopt,
        libc::SYS_sendto,
        libc::SYS_recvfrom,
        libc::SYS_sched_getaffinity,
    ]
    .into_iter()
    .collect();
    // Of those, the ones allowed only with argument filters (read-only open
    // flags, writes to the response fd, no executable mappings, signals to
    // itself only): reviewed here too.
    let filtered: BTreeSet<i64> = [
        libc::SYS_openat,
        libc::SYS_write,
        libc::SYS_writev,
        libc::SYS_mmap,
        libc::SYS_mprotect,
        libc::SYS_fcntl,
        libc::SYS_tgkill,
        #[cfg(target_arch = "x86_64")]
        libc::SYS_open,
    ]
    .into_iter()
    .collect();
    let code_filtered: BTreeSet<i64> = pstack_helper::filter::FILTERED_SYSCALLS
        .iter()
        .copied()
        .collect();
    assert_eq!(
        code_filtered, filtered,
        "argument-filtered syscalls changed: review them here"
    );
    let code_unfiltered: BTreeSet<i64> = pstack_helper::filter::UNFILTERED_SYSCALLS
        .iter()
        .copied()
        .collect();
    let unfiltered: BTreeSet<i64> = procfs.difference(&filtered).copied().collect();
    assert_eq!(
        code_unfiltered, unfiltered,
        "procfs helper allow-list changed: review it here"
    );
    let code_net: BTreeSet<i64> = pstack_helper::filter::NET_EXTRA_SYSCALLS
        .iter()
        .copied()
        .collect();
    assert_eq!(
        code_net, net_extra,
        "net helper allow-list changed: review it here"
    );
    assert_eq!(
        pstack_helper::filter::NET_NETLINK_PROTOCOLS,
        [libc::NETLINK_ROUTE, libc::NETLINK_SOCK_DIAG]
    );
}

const SOCKOPT_HELPER_STATUS: &[(&str, &str)] = &[
    ("CapInh", "0000000000000000"),
    ("CapPrm", "0000000000080000"),
    ("CapEff", "0000000000080000"),
    ("CapBnd", "0000000000000000"),
    ("CapAmb", "0000000000000000"),
    ("NoNewPrivs", "1"),
    ("Seccomp", "2"),
];

fn spawn_sockopt() -> Child {
    pstack_helper::launch::sockopt_command(std::path::Path::new(env!(
        "CARGO_BIN_EXE_pstack-helper"
    )))
    .env("PSTACK_HELPER_PARENT", std::process::id().to_string())
    .stdin(Stdio::piped())
    .stdout(Stdio::piped())
    .spawn()
    .expect("spawn pstack-helper --sockopt")
}

/// `pstack-helper --sockopt` reads the options of a socket this (root) test
/// owns — a TCP_USER_TIMEOUT and keepalive set here — through pidfd_getfd
/// under its seccomp filter, and its live `/proc/PID/status` shows
/// `CAP_SYS_PTRACE` (19) alone, an empty bounding set, no_new_privs and
/// seccomp.
#[test]
fn root_sockopt_helper_is_confined_to_sys_ptrace_and_reads_another_processs_socket() {
    use pstack_helper::sockopt::{SockoptAnswer, SockoptOutcome, SockoptRequest, SockoptTarget};
    use std::os::fd::AsRawFd;
    pstack_testkit::require!(
        is_root(),
        "needs root (capability sets are only reduced from a privileged start)"
    );
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let set = |level, name, v: libc::c_int| {
        // SAFETY: a valid socket and a correctly sized int option.
        let rc = unsafe {
            libc::setsockopt(
                c.as_raw_fd(),
                level,
                name,
                (&v as *const libc::c_int).cast(),
                4,
            )
        };
        assert_eq!(rc, 0);
    };
    set(libc::IPPROTO_TCP, libc::TCP_USER_TIMEOUT, 23_456);
    set(libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1);
    set(libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, 77);
    let inode = std::fs::metadata(format!("/proc/self/fd/{}", c.as_raw_fd()))
        .unwrap()
        .ino();
    let mut child = spawn_sockopt();
    let req = SockoptRequest {
        version: PROTOCOL_VERSION,
        deadline_ms: 2000,
        targets: vec![SockoptTarget {
            inode,
            pid: std::process::id(),
            fd: c.as_raw_fd(),
        }],
    };
    let stdin = child.stdin.as_mut().unwrap();
    stdin.write_all(&encode(&req, MAX_FRAME).unwrap()).unwrap();
    stdin.flush().unwrap();
    let a: SockoptAnswer = read_frame(child.stdout.as_mut().unwrap(), MAX_FRAME)
        .unwrap()
        .expect("an answer");
    assert_eq!(a.inode, inode);
    assert_eq!(
        a.outcome,
        SockoptOutcome::Ok {
            user_timeout_ms: 23_456,
            keepalive: true,
            keepidle_s: 77,
            keepintvl_s: 75,
            keepcnt: 9,
        }
    );
    assert_eq!(confinement(child.id()), expect(SOCKOPT_HELPER_STATUS));
    drop(child.stdin.take());
    assert!(child.wait().unwrap().success());
}

#[test]
fn sockopt_allow_list_is_the_reviewed_list() {
    use std::collections::BTreeSet;
    let dropped: BTreeSet<i64> = [
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
    ]
    .into_iter()
    .collect();
    let code: BTreeSet<i64> = pstack_helper::filter::SOCKOPT_DROPPED_SYSCALLS
        .iter()
        .copied()
        .collect();
    assert_eq!(
        code, dropped,
        "sockopt helper allow-list changed: review it here"
    );
    assert_eq!(
        pstack_helper::filter::SOCKOPT_OPTIONS,
        [
            (libc::IPPROTO_TCP, libc::TCP_USER_TIMEOUT),
            (libc::SOL_SOCKET, libc::SO_KEEPALIVE),
            (libc::IPPROTO_TCP, libc::TCP_KEEPIDLE),
            (libc::IPPROTO_TCP, libc::TCP_KEEPINTVL),
            (libc::IPPROTO_TCP, libc::TCP_KEEPCNT),
        ]
    );
}
