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
    pstack_testkit::require!(
        pstack_testkit::freezer_mounted(),
        "cgroup-v1 freezer not mounted at /sys/fs/cgroup/freezer (scripts/setup.d/10-kernel.sh mounts it)"
    );
    let freezer = Freezer::new("state-d").expect("a freezer cgroup under the mounted hierarchy");
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
    // A zombie has no memory: its environ cannot be opened (ESRCH), yet the process
    // is still there. That is a complete, empty answer, not `vanished`, and the
    // capture stays complete.
    let environ = surface(&env, "proc/environ");
    assert_eq!(environ.status, SurfaceStatus::Ok, "{environ:?}");
    assert_eq!(environ.facts["names"], serde_json::json!([]));
    assert!(
        environ.facts["memory"]
            .as_str()
            .is_some_and(|m| m.contains("state Z")),
        "{environ:?}"
    );
    if is_root() {
        assert_eq!(
            env.completeness,
            Completeness::Complete,
            "{:?}",
            env.surfaces
                .iter()
                .filter(|s| s.status != SurfaceStatus::Ok)
                .collect::<Vec<_>>()
        );
    }
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

fn plant(state: char) -> Planted {
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
            let freezer = Freezer::new("table").expect("freezer mounted (checked by the caller)");
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
    planted
}

#[test]
fn root_every_distinguished_state_has_a_fixture_classified_correctly() {
    // Table test: each state the classifier distinguishes has a planted
    // fixture, and each is classified as itself. A classifier that maps every
    // state to R fails on four of the five rows. Every row is required: the D row
    // needs the freezer, so a missing freezer is a precondition failure, not a dropped row.
    pstack_testkit::require!(
        pstack_testkit::freezer_mounted(),
        "the D row needs the cgroup-v1 freezer at /sys/fs/cgroup/freezer (scripts/setup.d/10-kernel.sh)"
    );
    let mut seen = BTreeSet::new();
    for state in DISTINGUISHED {
        let planted = plant(state);
        let (got, _) = classified(planted.pid);
        assert_eq!(got, state.to_string(), "fixture for {state}");
        seen.insert(got);
    }
    let all: BTreeSet<String> = DISTINGUISHED.iter().map(|c| c.to_string()).collect();
    assert_eq!(
        seen, all,
        "the classifier must tell every planted state apart"
    );
}

#[test]
fn root_thread_capture_of_one_thread() {
    let p = Proc::spawn("sleep", &["1000"]);
    assert!(wait_state(p.pid(), 'S'));
    let dir = tempfile::tempdir().unwrap();
    let env = crate::fixtures::sealed_capture(
        &crate::fixtures::request(
            pstack_capture::process::Target::Thread { tid: p.pid() },
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

/// `ps` (procps, written by others) as an oracle: for every planted state, the state
/// letter, the wait channel and the start time the envelope reports agree with what `ps`
/// prints for the same task.
#[test]
fn root_ps_agrees_with_the_envelope_on_state_wchan_and_start_time() {
    pstack_testkit::require!(is_root(), "reading another task's wchan needs root");
    pstack_testkit::require!(
        pstack_testkit::freezer_mounted(),
        "the D row needs the cgroup-v1 freezer (scripts/setup.d/10-kernel.sh)"
    );
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as u64;
    let btime: u64 = std::fs::read_to_string("/proc/stat")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("btime "))
        .expect("btime in /proc/stat")
        .trim()
        .parse()
        .unwrap();
    for state in DISTINGUISHED {
        let planted = plant(state);
        if state == 'S' {
            // Past exec and dynamic loading: the sleep itself has begun.
            let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
            while std::time::Instant::now() < until
                && std::fs::read_to_string(format!("/proc/{}/wchan", planted.pid))
                    .unwrap_or_default()
                    != "hrtimer_nanosleep"
            {
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
        }
        let (got, env) = classified(planted.pid);
        let ps = std::process::Command::new("ps")
            .args(["-o", "stat=,wchan:64=,lstart=", "-p"])
            .arg(planted.pid.to_string())
            .env("LC_ALL", "C")
            .env("TZ", "UTC")
            .output()
            .expect("ps (procps) is installed");
        let line = String::from_utf8_lossy(&ps.stdout).trim().to_string();
        let mut cols = line.split_whitespace();
        let (ps_stat, ps_wchan) = (cols.next().unwrap_or(""), cols.next().unwrap_or(""));
        let ps_lstart = cols.collect::<Vec<_>>().join(" ");
        assert_eq!(
            ps_stat.chars().next(),
            got.chars().next(),
            "row {state}: ps says {line:?}, the envelope {got}"
        );
        // A running or exiting task has no stable wait channel; compare where one exists.
        if matches!(state, 'S' | 'D' | 'T') {
            let wchan = surface(&env, &format!("task/{}/wchan", planted.pid));
            assert_eq!(wchan.status, SurfaceStatus::Ok, "row {state}: {wchan:?}");
            assert_eq!(
                wchan.facts["wchan"].as_str(),
                Some(ps_wchan),
                "row {state}: ps says {line:?}"
            );
        }
        let pstack_envelope::Subject::Process(identity) = &env.subject else {
            panic!(
                "row {state}: a process capture names a process: {:?}",
                env.subject
            )
        };
        let start_ticks = identity.start_ticks;
        let ours = btime + start_ticks / hz;
        let date = std::process::Command::new("date")
            .args(["-u", "+%s", "-d", &ps_lstart])
            .output()
            .expect("date");
        let theirs: u64 = String::from_utf8_lossy(&date.stdout)
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("row {state}: ps lstart {ps_lstart:?} is not a date"));
        assert!(
            ours.abs_diff(theirs) <= 1,
            "row {state}: start time {ours} (btime + start_ticks/HZ) vs ps {theirs} ({ps_lstart})"
        );
    }
}
