//! A host snapshot through pstackd is complete on a busy host (issue 31
//! item 2): with a process of 5,000 threads on the host, the daemon's host
//! capture reads every thread (its universe cap and its per-surface bound are
//! the host ones, `capture.host_max_*`), and the process's thread count in the
//! envelope is what `/proc/PID/task` holds. Just below the need (a host cap
//! smaller than the host) the same capture says `bounded`.

use std::time::Duration;

use pstack_capture::request::{CaptureRequest, HostRequest, RequestedDeadlines};
use pstack_envelope::{Envelope, Termination};
use pstackctl::client;

use super::common::*;

/// A process holding `n` parked threads until dropped: a child of this
/// test (its own process, so its thread count is exact whatever else the
/// test binary runs), made by python3 with 64 KiB stacks.
struct Crowd {
    child: std::process::Child,
}

impl Crowd {
    fn spawn(n: usize) -> Crowd {
        let script = format!(
            "import threading, sys\n\
             threading.stack_size(65536)\n\
             ev = threading.Event()\n\
             ts = [threading.Thread(target=ev.wait, daemon=True) for _ in range({n})]\n\
             [t.start() for t in ts]\n\
             print('ready', flush=True)\n\
             sys.stdin.read()\n"
        );
        let mut child = std::process::Command::new("python3")
            .args(["-c", &script])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("python3 runs");
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(child.stdout.as_mut().unwrap()),
            &mut line,
        )
        .unwrap();
        assert_eq!(line.trim(), "ready", "the crowd started");
        Crowd { child }
    }

    fn threads(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/task", self.child.id()))
            .unwrap()
            .count()
    }
}

impl Drop for Crowd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn host_capture(d: &Daemon) -> Envelope {
    let request = CaptureRequest::Host(HostRequest {
        deadlines: RequestedDeadlines {
            surface_ms: Some(5_000),
            bundle_ms: Some(20_000),
        },
        ..HostRequest::default()
    });
    let mut envs =
        client::try_capture_kind_via_daemon(&d.socket, &request, Duration::from_secs(40))
            .expect("pstackd answers")
            .expect("pstackd listens");
    assert_eq!(envs.len(), 1);
    envs.remove(0)
}

/// Threads of `pid` in the snapshot: the `threads` of its `proc/PID/tasks` surface.
fn threads_in_envelope(env: &Envelope, pid: u32) -> usize {
    let id = format!("proc/{pid}/tasks");
    let surface = env
        .surfaces
        .iter()
        .find(|s| s.id == id)
        .unwrap_or_else(|| panic!("no {id} surface"));
    surface.facts["threads"]
        .as_array()
        .expect("threads is a list")
        .len()
}

/// Surfaces of `env` that are not `ok`, as (id, status).
fn not_ok(env: &Envelope) -> Vec<(String, String)> {
    env.surfaces
        .iter()
        .filter(|s| s.status.as_str() != "ok")
        .map(|s| (s.id.clone(), s.status.as_str().to_string()))
        .collect()
}

/// The surfaces of `env` that are not `ok`, after asserting each is a
/// `vanished` surface of a process other than `crowd_pid` (another test's
/// process that exited mid-read).
fn vanished_elsewhere(env: &Envelope, crowd_pid: u32) -> Vec<(String, String)> {
    let not_ok = not_ok(env);
    let crowd_prefix = format!("proc/{crowd_pid}/");
    assert!(
        not_ok
            .iter()
            .all(|(id, status)| status == "vanished" && !id.starts_with(&crowd_prefix)),
        "bounds {:?}; surfaces not ok: {not_ok:?}",
        env.bounds
    );
    not_ok
}

#[test]
fn a_5000_thread_host_snapshot_through_pstackd_reads_complete() {
    let crowd = Crowd::spawn(5_000);
    let threads = crowd.threads();
    assert!(threads > 5_000, "{threads} threads");
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(dir.path(), &Settings::default());
    let env = host_capture(&d);
    // Nothing was cut: no cap reached, no surface truncated, the universe
    // read to its end. The snapshot is `complete` unless a process of the
    // host exited while it was read (other tests run beside this one), and
    // then only `vanished` surfaces of other processes may make it `partial`.
    let not_ok = vanished_elsewhere(&env, crowd.child.id());
    let want = if not_ok.is_empty() {
        "complete"
    } else {
        "partial"
    };
    assert_eq!(env.completeness.as_str(), want, "{not_ok:?}");
    assert!(
        env.surfaces.iter().all(|s| !s.truncated),
        "a surface was cut at {} bytes",
        env.bounds.max_bytes_per_surface
    );
    assert_eq!(
        format!("{:?}", env.universe.termination),
        "Exhausted",
        "{:?}",
        env.universe
    );
    assert_eq!(
        threads_in_envelope(&env, crowd.child.id()),
        threads,
        "every thread of the crowd is in the snapshot"
    );
}

#[test]
fn a_host_snapshot_with_a_cap_below_the_host_is_bounded() {
    let crowd = Crowd::spawn(1_500);
    let dir = tempfile::tempdir().unwrap();
    // Just below what the host holds: the crowd alone has 1,501 threads.
    let d = Daemon::start(
        dir.path(),
        &Settings {
            extra_capture: "max_threads = 1000\nhost_max_threads = 1000\n".into(),
            ..Settings::default()
        },
    );
    let env = host_capture(&d);
    // The cap cut the snapshot: `bounded`, unless a process of the host
    // exited while it was read (other tests run beside this one) — then its
    // `vanished` surfaces make the envelope `partial`, which outranks
    // `bounded`, and the cut is still the universe's termination.
    let not_ok = vanished_elsewhere(&env, crowd.child.id());
    let want = if not_ok.is_empty() {
        "bounded"
    } else {
        "partial"
    };
    assert_eq!(
        env.completeness.as_str(),
        want,
        "{:?} {not_ok:?}",
        env.bounds
    );
    assert_eq!(
        env.universe.termination,
        Termination::Cap,
        "{:?}",
        env.universe
    );
    let universe = &env.universe;
    assert!(
        universe.observed_count <= 1_000 && universe.expected_count > crowd.threads() as u64,
        "the cap cut the universe: {universe:?}"
    );
}
