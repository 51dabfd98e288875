//! Planted fixtures in every state the classifier distinguishes — R, S, D
//! (cgroup-v1 freezer), Z, T — each classified correctly from a real capture.
//! A classifier that maps every state to R fails this table.

use std::collections::BTreeSet;

use pstack_envelope::{ClaimKind, Completeness, SurfaceStatus};

use crate::fixtures::{Freezer, Proc, capture_pid, is_root, state_of, surface, wait_state};

/// Capture `pid` and return the state the envelope reports for its main thread.
fn classified(pid: u32) -> (String, pstack_envelope::Envelope) {
    let env = capture_pid(pid);
    let stat = surface(&env, &format!("task/{pid}/stat"));
    assert_eq!(stat.status, SurfaceStatus::Ok, "{stat:?}");
    let state = stat.facts["state"].as_str().unwrap().to_string();
    (state, env)
}

fn claim_codes(env: &pstack_envelope::Envelope) -> Vec<String> {
    env.claims.iter().map(|c| c.code.clone()).collect()
}

#[test]
fn root_running_busy_loop_is_r() {
    let p = Proc::spawn("sh", &["-c", "while :; do :; done"]);
    assert!(wait_state(p.pid(), 'R'));
    let (state, env) = classified(p.pid());
    assert_eq!(state, "R");
    assert!(claim_codes(&env).contains(&"threads_in_state_running".to_string()));
}

#[test]
fn root_sleeping_process_is_s_with_wchan_and_universal_no_d_claim() {
    let p = Proc::spawn("sleep", &["1000"]);
    assert!(wait_state(p.pid(), 'S'));
    // `S` is also shown during exec and dynamic loading: wait until the
    // sleep itself has begun (reads wchan as root; harmless otherwise).
    let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while std::time::Instant::now() < until
        && std::fs::read_to_string(format!("/proc/{}/wchan", p.pid())).unwrap_or_default()
            != "hrtimer_nanosleep"
    {
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    let (state, env) = classified(p.pid());
    assert_eq!(state, "S");
    if is_root() {
        let wchan = surface(&env, &format!("task/{}/wchan", p.pid()));
        assert_eq!(wchan.status, SurfaceStatus::Ok);
        assert_eq!(wchan.facts["wchan"], "hrtimer_nanosleep", "{wchan:?}");
        assert_eq!(
            env.completeness,
            Completeness::Complete,
            "{:?}",
            env.surfaces
                .iter()
                .filter(|s| s.status != SurfaceStatus::Ok)
                .collect::<Vec<_>>()
        );
        let universal = env
            .claims
            .iter()
            .find(|c| c.code == "no_thread_in_d_state")
            .expect("universal claim in a complete envelope");
        assert_eq!(universal.scope, pstack_envelope::Scope::Universal);
    }
}

#[test]
fn root_frozen_task_is_d_with_a_bound_d_claim() {
    let Some(freezer) = Freezer::new("state-d") else {
        eprintln!("skipped: cgroup-v1 freezer not mounted at /sys/fs/cgroup/freezer");
        return;
    };
    let p = Proc::spawn("sleep", &["1000"]);
    assert!(wait_state(p.pid(), 'S'));
    freezer.add(p.pid());
    freezer.freeze();
    assert!(
        wait_state(p.pid(), 'D'),
        "frozen task shows {:?}",
        state_of(p.pid())
    );
    let (state, env) = classified(p.pid());
    assert_eq!(state, "D");
    let d = env
        .claims
        .iter()
        .find(|c| c.code == "thread_in_d_state")
        .expect("a D claim");
    assert_eq!(d.kind, ClaimKind::Fact);
    assert!(d.surfaces.contains(&format!("task/{}/stat", p.pid())));
    assert!(
        d.surfaces.contains(&format!("task/{}/wchan", p.pid())),
        "{d:?}"
    );
    assert!(!claim_codes(&env).contains(&"no_thread_in_d_state".to_string()));
    // The freezer surface tells this D from a real uninterruptible wait.
    let freezer_surface = surface(&env, "proc/freezer");
    assert_eq!(
        freezer_surface.facts["state"], "frozen",
        "{freezer_surface:?}"
    );
    let why = env
        .claims
        .iter()
        .find(|c| c.code == "d_state_from_cgroup_freezer")
        .expect("an inference naming the freezer");
    assert_eq!(why.kind, ClaimKind::Inference);
    assert!(why.surfaces.contains(&"proc/freezer".to_string()));
    assert_eq!(env.next_transition.action, "INSPECT_FREEZER_OWNER");
    drop(freezer); // thaws before the process is killed
}

#[test]
fn root_unreaped_child_is_z() {
    // sh forks a short sleep, then execs a long one that never reaps it.
    let parent = Proc::spawn("sh", &["-c", "sleep 0.05 & exec sleep 1000"]);
    let child = loop {
        let text = std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", parent.pid()))
            .unwrap_or_default();
        if let Some(c) = text.split_whitespace().next() {
            break c.parse::<u32>().unwrap();
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    };
    assert!(wait_state(child, 'Z'));
    let (state, env) = classified(child);
    assert_eq!(state, "Z");
    assert!(claim_codes(&env).contains(&"threads_in_state_zombie".to_string()));
}

#[test]
fn root_sigstopped_process_is_t() {
    let p = Proc::spawn("sleep", &["1000"]);
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(p.pid() as i32, libc::SIGSTOP) };
    assert!(wait_state(p.pid(), 'T'));
    let (state, env) = classified(p.pid());
    assert_eq!(state, "T");
    assert!(claim_codes(&env).contains(&"threads_in_state_stopped".to_string()));
}

/// The states the classifier distinguishes (and the claims it makes for them).
const DISTINGUISHED: [char; 5] = ['R', 'S', 'D', 'Z', 'T'];

/// A planted process in `state`, kept alive (and its freezer) until dropped.
/// Fields drop in order: the freezer thaws before the processes are killed
/// and reaped (a frozen process cannot be reaped).
struct Planted {
    pid: u32,
    _freezer: Option<Freezer>,
    _procs: Vec<Proc>,
}

fn plant(state: char) -> Option<Planted> {
    let planted = match state {
        'R' => {
            let p = Proc::spawn("sh", &["-c", "while :; do :; done"]);
            Planted {
                pid: p.pid(),
                _procs: vec![p],
                _freezer: None,
            }
        }
        'S' => {
            let p = Proc::spawn("sleep", &["1000"]);
            Planted {
                pid: p.pid(),
                _procs: vec![p],
                _freezer: None,
            }
        }
        'D' => {
            let freezer = Freezer::new("table")?;
            let p = Proc::spawn("sleep", &["1000"]);
            assert!(wait_state(p.pid(), 'S'));
            freezer.add(p.pid());
            freezer.freeze();
            Planted {
                pid: p.pid(),
                _procs: vec![p],
                _freezer: Some(freezer),
            }
        }
        'Z' => {
            let parent = Proc::spawn("sh", &["-c", "sleep 0.05 & exec sleep 1000"]);
            let child = loop {
                let text =
                    std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", parent.pid()))
                        .unwrap_or_default();
                if let Some(c) = text.split_whitespace().next() {
                    break c.parse::<u32>().unwrap();
                }
                std::thread::sleep(std::time::Duration::from_millis(2));
            };
            Planted {
                pid: child,
                _procs: vec![parent],
                _freezer: None,
            }
        }
        'T' => {
            let p = Proc::spawn("sleep", &["1000"]);
            // SAFETY: kill(2) on our own child.
            unsafe { libc::kill(p.pid() as i32, libc::SIGSTOP) };
            Planted {
                pid: p.pid(),
                _procs: vec![p],
                _freezer: None,
            }
        }
        other => panic!("no fixture plants state {other}"),
    };
    assert!(
        wait_state(planted.pid, state),
        "fixture for {state} shows {:?}",
        state_of(planted.pid)
    );
    Some(planted)
}

#[test]
fn root_every_distinguished_state_has_a_fixture_classified_correctly() {
    // Table test: each state the classifier distinguishes has a planted
    // fixture, and each is classified as itself. A classifier that maps every
    // state to R fails on four of the five rows.
    let mut seen = BTreeSet::new();
    for state in DISTINGUISHED {
        let Some(planted) = plant(state) else {
            eprintln!(
                "skipped row {state}: cgroup-v1 freezer not mounted at /sys/fs/cgroup/freezer"
            );
            continue;
        };
        let (got, _) = classified(planted.pid);
        assert_eq!(got, state.to_string(), "fixture for {state}");
        seen.insert(got);
    }
    assert!(
        seen.len() >= 4,
        "the classifier must tell the planted states apart: {seen:?}"
    );
}

#[test]
fn root_thread_capture_of_one_thread() {
    let p = Proc::spawn("sleep", &["1000"]);
    assert!(wait_state(p.pid(), 'S'));
    let dir = tempfile::tempdir().unwrap();
    let env = pstack_agent::supervisor::capture(
        &crate::fixtures::request(
            pstack_agent::supervisor::Target::Thread { tid: p.pid() },
            2000,
            10_000,
        ),
        &crate::fixtures::config(),
        &crate::fixtures::budget(dir.path(), 2),
    )
    .unwrap();
    assert_eq!(env.subject.kind(), "thread");
    assert_eq!(
        env.universe.selector,
        format!("/proc/{0}/task/{0}", p.pid())
    );
    assert_eq!(
        surface(&env, &format!("task/{}/stat", p.pid())).facts["state"],
        "S"
    );
}
