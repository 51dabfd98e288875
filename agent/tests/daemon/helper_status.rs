//! A live helper's confinement as the kernel reports it, for both spawn
//! paths: spawned by a root `pstackd` (which has dropped to its kept set and
//! `no_new_privs`) and by a one-shot root `pstackctl capture`. The expected
//! values are literals, not computed from the code under test: issue 10 found
//! a daemon-spawned helper with `CapBnd 0000000c000281024` while the one-shot
//! path had emptied it, and neither empty.

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::common::*;

/// `/proc/PID/status` lines of a confined procfs helper: CAP_DAC_READ_SEARCH
/// (2), CAP_SYS_PTRACE (19), CAP_SYS_ADMIN (21); empty bounding set.
const PROCFS_HELPER: &[(&str, &str)] = &[
    ("CapInh", "0000000000000000"),
    ("CapPrm", "0000000000280004"),
    ("CapEff", "0000000000280004"),
    ("CapBnd", "0000000000000000"),
    ("CapAmb", "0000000000000000"),
    ("NoNewPrivs", "1"),
    ("Seccomp", "2"),
];

fn status_lines(pid: i32) -> Option<Vec<(String, String)>> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let name = text
        .lines()
        .next()?
        .strip_prefix("Name:")?
        .trim()
        .to_string();
    if name != "pstack-helper" {
        return None;
    }
    Some(
        PROCFS_HELPER
            .iter()
            .map(|(k, _)| {
                let v = text
                    .lines()
                    .find_map(|l| l.strip_prefix(&format!("{k}:")))
                    .unwrap_or_default()
                    .trim()
                    .to_string();
                (k.to_string(), v)
            })
            .collect(),
    )
}

/// Children of every thread of `parent`.
fn children(parent: i32) -> Vec<i32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{parent}/task")) else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
        .flat_map(|s| {
            s.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect::<Vec<i32>>()
        })
        .collect()
}

/// Poll the children of the process whose pid `parent()` gives until a
/// confined (`Seccomp: 2`) helper is seen; its status lines.
fn catch_confined_helper(
    parent: impl Fn() -> Option<i32>,
    within: Duration,
) -> Vec<(String, String)> {
    let deadline = Instant::now() + within;
    let mut seen_unconfined = 0;
    while Instant::now() < deadline {
        if let Some(p) = parent() {
            for child in children(p) {
                if let Some(lines) = status_lines(child) {
                    if lines.iter().any(|(k, v)| k == "Seccomp" && v == "2") {
                        return lines;
                    }
                    seen_unconfined += 1;
                }
            }
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    panic!(
        "no confined pstack-helper caught within {within:?} ({seen_unconfined} sightings before confinement)"
    );
}

fn expected() -> Vec<(String, String)> {
    PROCFS_HELPER
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn require_root() -> bool {
    pstack_testkit::precondition(
        is_root(),
        "needs root: only a root daemon has capabilities for its helper to drop",
    )
}

#[test]
fn root_daemon_spawned_helper_has_literal_caps_empty_bounding_set_and_seccomp() {
    if !require_root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(dir.path(), &Settings::default());
    let target = Sleeper::spawn();
    let stop = Arc::new(AtomicBool::new(false));
    let socket = d.socket.clone();
    let pid = target.pid();
    let loop_stop = stop.clone();
    let captures = std::thread::spawn(move || {
        let mut n = 0;
        while !loop_stop.load(Ordering::Relaxed) {
            capture(&socket, pid, 3_000).expect("capture while watching its helper");
            n += 1;
        }
        n
    });
    let daemon = d.pid();
    let lines = catch_confined_helper(|| Some(daemon), Duration::from_secs(60));
    stop.store(true, Ordering::Relaxed);
    let n = captures.join().unwrap();
    assert_eq!(lines, expected(), "after {n} captures");
}

#[test]
fn root_one_shot_pstackctl_helper_has_literal_caps_empty_bounding_set_and_seccomp() {
    if !require_root() {
        return;
    }
    let out = tempfile::tempdir().unwrap();
    let helper = helper_bin();
    let target = Sleeper::spawn();
    let current = Arc::new(std::sync::Mutex::new(None::<i32>));
    let stop = Arc::new(AtomicBool::new(false));
    let (loop_current, loop_stop) = (current.clone(), stop.clone());
    let out_dir = out.path().to_path_buf();
    let pid = target.pid();
    let runs = std::thread::spawn(move || {
        let mut n = 0;
        while !loop_stop.load(Ordering::Relaxed) {
            let mut child = Command::new(pstackctl_bin())
                .env("PSTACK_HELPER", &helper)
                .args(["capture", "--pid", &pid.to_string(), "-o"])
                .arg(Path::new(&out_dir).join(format!("{n}.json")))
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            *loop_current.lock().unwrap() = Some(child.id() as i32);
            assert!(child.wait().unwrap().success(), "pstackctl capture");
            n += 1;
        }
        n
    });
    let lines = catch_confined_helper(|| *current.lock().unwrap(), Duration::from_secs(60));
    stop.store(true, Ordering::Relaxed);
    let n = runs.join().unwrap();
    assert_eq!(lines, expected(), "after {n} one-shot captures");
}
