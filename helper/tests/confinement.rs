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
use pstack_helper::confine::{kept_caps_mask, kept_net_caps_mask};
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

#[test]
fn root_helper_status_shows_no_new_privs_seccomp_and_reduced_caps() {
    if !is_root() {
        eprintln!("skipped: needs root (capability sets are only reduced from a privileged start)");
        return;
    }
    let mut child = spawn();
    let me = std::process::id();
    let first = ask(&mut child, SurfaceKind::Wchan { tid: me }).expect("a response");
    assert!(matches!(first.outcome, Outcome::Ok { .. }), "{first:?}");
    let pid = child.id();
    assert_eq!(status_field(pid, "NoNewPrivs"), "1");
    assert_eq!(status_field(pid, "Seccomp"), "2");
    let eff = u64::from_str_radix(&status_field(pid, "CapEff"), 16).unwrap();
    let bnd = u64::from_str_radix(&status_field(pid, "CapBnd"), 16).unwrap();
    assert_eq!(eff, kept_caps_mask(), "CapEff {eff:x}");
    assert_eq!(bnd, kept_caps_mask(), "CapBnd {bnd:x}");
    assert_eq!(status_field(pid, "CapInh"), "0000000000000000");
    drop(child.stdin.take());
    assert!(child.wait().unwrap().success());
}

#[test]
fn root_forbidden_socket_and_execve_kill_the_helper_with_sigsys() {
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
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
    if !is_root() {
        eprintln!("skipped: needs root (capability sets are only reduced from a privileged start)");
        return;
    }
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
    assert_eq!(status_field(pid, "NoNewPrivs"), "1");
    assert_eq!(status_field(pid, "Seccomp"), "2");
    let eff = u64::from_str_radix(&status_field(pid, "CapEff"), 16).unwrap();
    let bnd = u64::from_str_radix(&status_field(pid, "CapBnd"), 16).unwrap();
    assert_eq!(eff, kept_net_caps_mask(), "CapEff {eff:x}");
    assert_eq!(bnd, kept_net_caps_mask(), "CapBnd {bnd:x}");
    assert_eq!(status_field(pid, "CapInh"), "0000000000000000");
    drop(child.stdin.take());
    assert!(child.wait().unwrap().success());
}

#[test]
fn root_net_helper_af_inet_socket_and_execve_kill_it_with_sigsys() {
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
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
    if !is_root() {
        eprintln!("skipped: needs root (setns into another netns)");
        return;
    }
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
