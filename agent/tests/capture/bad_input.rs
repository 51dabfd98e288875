//! Bad input through the real `pstackctl` binary: nonexistent PID, PID 0, a
//! kernel thread, a process of another user, `--pid abc`, a TID passed as a
//! PID — each a clear error or a typed surface status, never a panic.

use std::os::unix::process::CommandExt;
use std::process::{Command, Output};

use pstack_envelope::SurfaceStatus;

use crate::fixtures::{Proc, is_root};

pub(crate) fn pstackctl(args: &[&str], dir: &std::path::Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_pstackctl"))
        .arg("capture")
        .args(args)
        .current_dir(dir)
        .env("PSTACK_LEAK_JOURNAL", dir.join("leaks.jsonl"))
        // One-shot, whatever daemon may run on this machine.
        .env("PSTACKD_SOCKET", dir.join("no-daemon.sock"))
        .output()
        .unwrap()
}

pub(crate) fn no_panic(o: &Output) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!err.contains("panicked"), "{err}");
}

fn free_pid() -> u32 {
    let max: u32 = std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    (2..max)
        .rev()
        .find(|p| !std::path::Path::new(&format!("/proc/{p}")).exists())
        .unwrap()
}

#[test]
fn nonexistent_pid_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let pid = free_pid().to_string();
    let o = pstackctl(&["--pid", &pid], dir.path());
    no_panic(&o);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&o.stderr)
            .contains(&format!("no such process: pid {pid} does not exist"))
    );
}

#[test]
fn pid_zero_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let o = pstackctl(&["--pid", "0"], dir.path());
    no_panic(&o);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("0 is not a process"));
}

#[test]
fn non_numeric_pid_is_a_usage_error() {
    let dir = tempfile::tempdir().unwrap();
    let o = pstackctl(&["--pid", "abc"], dir.path());
    no_panic(&o);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("invalid value 'abc'"));
    let o = pstackctl(&[], dir.path());
    assert_eq!(o.status.code(), Some(2), "a target is required");
}

#[test]
fn a_tid_passed_as_pid_names_the_right_flags() {
    // This test binary is multi-threaded: find one of its non-main threads.
    let me = std::process::id();
    let t = std::thread::spawn(|| std::thread::sleep(std::time::Duration::from_secs(3)));
    let tid = std::fs::read_dir(format!("/proc/{me}/task"))
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .find(|t| *t != me)
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let o = pstackctl(&["--pid", &tid.to_string()], dir.path());
    no_panic(&o);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains(&format!("use --tid {tid} or --pid {me}")));
    t.join().unwrap();
}

#[test]
fn root_kernel_thread_gets_unsupported_user_memory_surfaces() {
    pstack_testkit::require!(is_root(), "kernel-thread stacks need root");
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("k.json");
    let o = pstackctl(&["--pid", "2", "-o", out.to_str().unwrap()], dir.path());
    no_panic(&o);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let env = pstack_testkit::verify(&std::fs::read(&out).unwrap()).unwrap();
    for id in ["proc/cmdline", "proc/environ", "proc/fd"] {
        let s = env.surfaces.iter().find(|s| s.id == id).unwrap();
        assert_eq!(s.status, SurfaceStatus::Unsupported, "{s:?}");
    }
    let stat = env.surfaces.iter().find(|s| s.id == "task/2/stat").unwrap();
    assert_eq!(stat.status, SurfaceStatus::Ok);
}

#[test]
fn root_process_of_another_user_is_read_by_the_reduced_helper() {
    pstack_testkit::require!(is_root(), "spawning as another user needs root");
    let mut cmd = Command::new("sleep");
    cmd.arg("1000").uid(65534).gid(65534);
    let p = Proc(cmd.spawn().unwrap());
    assert!(crate::fixtures::wait_state(p.pid(), 'S'));
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("u.json");
    let o = pstackctl(
        &["--pid", &p.pid().to_string(), "-o", out.to_str().unwrap()],
        dir.path(),
    );
    no_panic(&o);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let env = pstack_testkit::verify(&std::fs::read(&out).unwrap()).unwrap();
    match &env.subject {
        pstack_envelope::Subject::Process(id) => assert_eq!(id.uid, 65534),
        other => panic!("{other:?}"),
    }
    let bad: Vec<_> = env
        .surfaces
        .iter()
        .filter(|s| s.status != SurfaceStatus::Ok)
        .collect();
    assert!(bad.is_empty(), "{bad:?}");
}

pub(crate) fn as_nobody(args: &[&str], dir: &std::path::Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_pstackctl"))
        .arg("capture")
        .args(args)
        .env("PSTACK_LEAK_JOURNAL", dir.join("leaks.jsonl"))
        // One-shot, whatever daemon may run on this machine.
        .env("PSTACKD_SOCKET", dir.join("no-daemon.sock"))
        .current_dir(dir)
        .uid(65534)
        .gid(65534)
        .output()
        .unwrap()
}

#[test]
fn root_unprivileged_caller_gets_permission_denied_surfaces_not_a_crash() {
    pstack_testkit::require!(is_root(), "needs root to drop to another user");
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .unwrap();
    // Its own process: identity readable, the kernel stack is not (CAP_SYS_ADMIN).
    let mut cmd = Command::new("sleep");
    cmd.arg("1000").uid(65534).gid(65534);
    let own = Proc(cmd.spawn().unwrap());
    assert!(crate::fixtures::wait_state(own.pid(), 'S'));
    let out = dir.path().join("n.json");
    let o = as_nobody(
        &["--pid", &own.pid().to_string(), "-o", out.to_str().unwrap()],
        dir.path(),
    );
    no_panic(&o);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let env = pstack_testkit::verify(&std::fs::read(&out).unwrap()).unwrap();
    let stack = env
        .surfaces
        .iter()
        .find(|s| s.id == format!("task/{}/stack", own.pid()))
        .unwrap();
    assert_eq!(stack.status, SurfaceStatus::PermissionDenied, "{stack:?}");
    assert!(
        env.unknowns.iter().any(
            |u| u.surface.as_deref() == Some(stack.id.as_str()) && u.probe.starts_with("sudo ")
        )
    );
    assert_eq!(env.completeness, pstack_envelope::Completeness::Partial);
    // Root's process: its identity cannot be bound, so nothing is captured.
    let root_owned = Proc::spawn("sleep", &["1000"]);
    let o = as_nobody(&["--pid", &root_owned.pid().to_string()], dir.path());
    no_panic(&o);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("cannot read the identity")
            && err.contains("permission denied")
            && err.contains("run as root"),
        "{err}"
    );
}

#[test]
fn cli_summary_and_json_and_default_file_name() {
    let p = Proc::spawn("sleep", &["1000"]);
    let dir = tempfile::tempdir().unwrap();
    // The default name is used in a configured directory (never the cwd by surprise).
    let o = pstackctl(
        &["--pid", &p.pid().to_string(), "--out-dir", "."],
        dir.path(),
    );
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains("TID") && text.contains("completeness:") && text.contains("digest:"),
        "{text}"
    );
    let written: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("sha256-"))
        .collect();
    assert_eq!(written.len(), 1, "{written:?}");
    let env =
        pstack_testkit::verify(&std::fs::read(dir.path().join(&written[0])).unwrap()).unwrap();
    assert_eq!(written[0], format!("{}.json", env.digest.replace(':', "-")));
    let o = pstackctl(
        &["--pid", &p.pid().to_string(), "--json", "-o", "j.json"],
        dir.path(),
    );
    let printed = pstack_testkit::verify(&o.stdout).unwrap();
    assert_eq!(printed.subject, env.subject);
}
