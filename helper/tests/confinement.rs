//! Root-only: the real `pstack-helper` binary confines itself before serving.
//! Its `/proc/<pid>/status` shows `NoNewPrivs: 1`, `Seccomp: 2` and exactly the
//! kept capabilities, and a forbidden syscall kills it with SIGSYS.
#![allow(
    clippy::unwrap_in_result,
    reason = "test helpers panic on setup failure by design"
)]

use std::io::Write;
use std::os::unix::process::ExitStatusExt;
use std::process::{Child, Command, Stdio};

use pstack_helper::confine::kept_caps_mask;
use pstack_helper::protocol::{
    ForbiddenSyscall, MAX_FRAME, Outcome, PROTOCOL_VERSION, Request, Response, SurfaceKind,
    SurfaceRequest, encode, read_frame,
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
