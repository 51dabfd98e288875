//! One duration parser everywhere (issue 19, item 3): a duration carries its
//! unit; `--window 5` is refused by every command that takes a window, and
//! the millisecond flags accept durations too.

use std::process::Command;

use crate::bad_input::{no_panic, pstackctl};
use crate::fixtures::Proc;

fn run(args: &[&str], dir: &std::path::Path) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_pstackctl"))
        .args(args)
        .current_dir(dir)
        .env("PSTACK_LEAK_JOURNAL", dir.join("leaks.jsonl"))
        .env("PSTACKD_SOCKET", dir.join("no-daemon.sock"))
        .output()
        .unwrap()
}

#[test]
fn a_bare_number_is_refused_by_every_window_and_duration_flag() {
    let dir = tempfile::tempdir().unwrap();
    let pid = std::process::id().to_string();
    for args in [
        vec!["capture", "--pid", pid.as_str(), "--window", "5"],
        vec!["trace", "tcp", "--window", "5"],
        vec![
            "capture",
            "transport",
            "--peer",
            "127.0.0.1",
            "--window",
            "30",
        ],
        vec![
            "capture",
            "--pid",
            pid.as_str(),
            "--surface-deadline",
            "2000",
        ],
        vec!["capture", "--pid", pid.as_str(), "--bundle-deadline", "10"],
        vec!["status", "--timeout", "5"],
    ] {
        let o = run(&args, dir.path());
        no_panic(&o);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains("has no unit"), "{args:?}: {err}");
    }
}

#[test]
fn millisecond_flags_take_numbers_and_durations_alike() {
    let p = Proc::spawn("sleep", &["1000"]);
    let pid = p.pid().to_string();
    let dir = tempfile::tempdir().unwrap();
    for (flag, value) in [
        ("--surface-deadline-ms", "1500"),
        ("--surface-deadline-ms", "1500ms"),
        ("--surface-deadline", "1500ms"),
    ] {
        let o = pstackctl(&["--pid", &pid, flag, value, "--json"], dir.path());
        no_panic(&o);
        assert_eq!(o.status.code(), Some(0), "{flag} {value}");
        let env = pstack_envelope::verify(&o.stdout).unwrap();
        assert_eq!(env.bounds.surface_deadline_ms, 1500, "{flag} {value}");
    }
    let o = pstackctl(
        &["--pid", &pid, "--bundle-deadline", "3s", "--json"],
        dir.path(),
    );
    assert_eq!(o.status.code(), Some(0));
    let env = pstack_envelope::verify(&o.stdout).unwrap();
    assert_eq!(env.bounds.bundle_deadline_ms, 3000);
    let o = pstackctl(
        &[
            "--pid",
            &pid,
            "--surface-deadline",
            "1s",
            "--surface-deadline-ms",
            "200",
        ],
        dir.path(),
    );
    assert_eq!(o.status.code(), Some(2), "one of the two spellings");
}
