//! A caller's surface selection: only the selected families are read and
//! appear, thread states are always read, the universe selector records the
//! selection, and a misfit selection is refused by the validator (which
//! reads nothing), so the engine never sees one.

use std::collections::BTreeSet;
use std::path::PathBuf;

use pstack_capture::process::{SurfaceSelection, Target};
use pstack_capture::request::RequestError;
use pstack_envelope::Envelope;

use crate::fixtures::{Ask, Proc, budget, config, names, plan, request};

/// A process plan reading only `surfaces`.
fn selecting(
    target: Target,
    bundle_ms: u64,
    surfaces: &[&str],
) -> pstack_capture::process::ProcessPlan {
    plan(
        target,
        2000,
        bundle_ms,
        Ask {
            surfaces: names(surfaces),
            ..Ask::default()
        },
    )
    .unwrap()
}

/// The families present: ids with the thread or process id replaced by `*`.
fn families(env: &Envelope) -> BTreeSet<String> {
    env.surfaces
        .iter()
        .map(|s| {
            let mut parts: Vec<&str> = s.id.split('/').collect();
            if parts.len() == 3 {
                parts[1] = "*";
            }
            parts.join("/")
        })
        .collect()
}

#[test]
fn a_process_capture_reads_only_the_selected_surfaces_plus_thread_states() {
    // Two threads: bash with a background job is one thread; python gives us two.
    let p = Proc::spawn(
        "python3",
        &[
            "-c",
            "import threading,time\nthreading.Thread(target=time.sleep,args=(1000,)).start()\ntime.sleep(1000)",
        ],
    );
    let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while std::fs::read_dir(format!("/proc/{}/task", p.pid()))
        .map(|d| d.count())
        .unwrap_or(0)
        < 2
    {
        assert!(
            std::time::Instant::now() < until,
            "second thread never started"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let dir = tempfile::tempdir().unwrap();
    let req = selecting(
        Target::Process { pid: p.pid() },
        10_000,
        &["task/*/stack", "proc/fd"],
    );
    let env = crate::fixtures::sealed_capture(&req, &config(), &budget(dir.path(), 2)).unwrap();
    pstack_testkit::verify(&env.to_json_pretty()).unwrap();
    assert_eq!(
        families(&env),
        ["proc/fd", "task/*/stack", "task/*/stat"]
            .map(String::from)
            .into(),
        "{:?}",
        env.surfaces.iter().map(|s| &s.id).collect::<Vec<_>>()
    );
    // Every thread got each selected per-thread surface.
    let stacks = env
        .surfaces
        .iter()
        .filter(|s| s.id.ends_with("/stack"))
        .count();
    assert_eq!(stacks, 2);
    assert_eq!(env.universe.observed_count, 2);
    assert!(
        env.universe
            .selector
            .ends_with(" surfaces=proc/fd,task/*/stat,task/*/stack"),
        "{}",
        env.universe.selector
    );
    // The same subject captured whole has a different selector (and digest).
    let whole = crate::fixtures::sealed_capture(
        &request(Target::Process { pid: p.pid() }, 2000, 10_000),
        &config(),
        &budget(dir.path(), 2),
    )
    .unwrap();
    assert!(families(&whole).contains("proc/environ") && families(&whole).len() > 3);
    assert_ne!(whole.universe.selector, env.universe.selector);
}

#[test]
fn a_selection_without_risky_surfaces_spawns_no_helper() {
    let p = Proc::spawn("sleep", &["1000"]);
    let dir = tempfile::tempdir().unwrap();
    // A helper path that cannot be executed: any risky read would fail.
    let mut cfg = config();
    cfg.helper_path = PathBuf::from("/nonexistent/pstack-helper");
    let req = selecting(
        Target::Process { pid: p.pid() },
        10_000,
        &["proc/status", "task/*/schedstat"],
    );
    let env = crate::fixtures::sealed_capture(&req, &cfg, &budget(dir.path(), 2)).unwrap();
    assert_eq!(
        families(&env),
        ["proc/status", "task/*/schedstat", "task/*/stat"]
            .map(String::from)
            .into()
    );
    assert!(
        env.surfaces
            .iter()
            .all(|s| s.status == pstack_envelope::SurfaceStatus::Ok),
        "{:#?}",
        env.surfaces
    );
    assert_eq!(env.completeness, pstack_envelope::Completeness::Complete);
    assert!(env.claims.iter().any(|c| c.code == "no_thread_in_d_state"));

    // The same with a risky family selected does need the helper.
    let req = selecting(Target::Process { pid: p.pid() }, 10_000, &["task/*/wchan"]);
    let env = crate::fixtures::sealed_capture(&req, &cfg, &budget(dir.path(), 2)).unwrap();
    assert_ne!(env.completeness, pstack_envelope::Completeness::Complete);
}

#[test]
fn a_host_capture_without_wchan_reads_thread_states_only() {
    let dir = tempfile::tempdir().unwrap();
    let req = selecting(Target::Host, 20_000, &["proc/*/tasks"]);
    let env = crate::fixtures::sealed_capture(&req, &config(), &budget(dir.path(), 2)).unwrap();
    pstack_testkit::verify(&env.to_json_pretty()).unwrap();
    assert_eq!(families(&env), ["proc/*/tasks".to_string()].into());
    assert!(env.universe.observed_count > 0);
    assert!(env.universe.selector.ends_with(" surfaces=proc/*/tasks"));
}

#[test]
fn misfit_selections_are_refused_before_any_read() {
    let refused = |target: Target, surfaces: &[&str], window: bool| {
        let ask = Ask {
            surfaces: names(surfaces),
            window_ms: window.then_some(100),
            ..Ask::default()
        };
        match plan(target, 2000, 10_000, ask) {
            Err(e @ RequestError::BadSurfaces(_)) => {
                assert_eq!(e.field().as_deref(), Some("surfaces"), "{e}");
                e.to_string()
            }
            other => panic!("{surfaces:?}: expected a refusal, got {other:?}"),
        }
    };
    let me = Target::Process {
        pid: std::process::id(),
    };
    assert!(refused(me, &["proc/*/wchan"], false).contains("does not apply"));
    assert!(refused(Target::Host, &["task/*/stack"], false).contains("does not apply"));
    assert!(refused(me, &["ebpf:offcpu"], false).contains("window"));
    assert!(refused(me, &[], false).contains("empty"));
    assert!(
        SurfaceSelection::parse(&["task/*/stak"])
            .unwrap_err()
            .to_string()
            .contains("task/*/stack")
    );
}

#[test]
fn pstackctl_surface_flag_selects_and_a_typo_is_a_clear_usage_error() {
    let p = Proc::spawn("sleep", &["1000"]);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("e.json");
    let pid = p.pid().to_string();
    let o = crate::bad_input::pstackctl(
        &[
            "--pid",
            &pid,
            "--surface",
            "task/*/wchan,proc/io",
            "-o",
            out.to_str().unwrap(),
        ],
        dir.path(),
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let env = pstack_testkit::verify(&std::fs::read(&out).unwrap()).unwrap();
    assert_eq!(
        families(&env),
        ["proc/io", "task/*/stat", "task/*/wchan"]
            .map(String::from)
            .into()
    );

    let o = crate::bad_input::pstackctl(&["--pid", &pid, "--surface", "task/*/stak"], dir.path());
    crate::bad_input::no_panic(&o);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("unknown surface \"task/*/stak\"") && err.contains("task/*/stack"),
        "{err}"
    );
}
