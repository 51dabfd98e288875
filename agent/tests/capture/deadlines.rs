//! Missing deadline: every risky surface is issued with a deadline. A plan
//! always has both (the validator fills the caller's defaults and refuses a
//! zero or inverted pair, so the engine cannot be handed a plan without);
//! a risky read without one is refused before any helper is spawned.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use pstack_capture::process::{CaptureError, Deadlines, RiskyRead, Target, run_risky};
use pstack_capture::request::{RequestError, RequestedCaps, RequestedDeadlines, process_plan};
use pstack_helper::protocol::SurfaceKind;

use crate::fixtures::{Proc, budget, config, request};

#[test]
fn a_plan_always_has_positive_deadlines() {
    let me = Target::Process {
        pid: std::process::id(),
    };
    let refused = |surface_ms, bundle_ms| match crate::fixtures::plan(
        me,
        surface_ms,
        bundle_ms,
        crate::fixtures::Ask::default(),
    ) {
        Err(RequestError::OutOfRange { param, .. }) => param,
        other => panic!("({surface_ms}, {bundle_ms}): expected a refusal, got {other:?}"),
    };
    assert_eq!(refused(0, 1000), "deadlines.surface_ms");
    assert_eq!(refused(1, 0), "deadlines.bundle_ms");
    // The surface deadline may equal the bundle's, not exceed it.
    assert_eq!(refused(1001, 1000), "deadlines.surface_ms");
    let at = crate::fixtures::plan(me, 1000, 1000, crate::fixtures::Ask::default()).unwrap();
    assert_eq!(
        at.deadlines(),
        Deadlines {
            surface: Duration::from_millis(1000),
            bundle: Duration::from_millis(1000),
        }
    );
    // No deadline asked: the caller's defaults, never none.
    let defaults = process_plan(
        me,
        &RequestedDeadlines::default(),
        &RequestedCaps::default(),
        None,
        &None,
        &crate::fixtures::LIMITS,
    )
    .unwrap();
    assert_eq!(
        defaults.deadlines(),
        Deadlines {
            surface: Duration::from_millis(crate::fixtures::LIMITS.surface_deadline_ms),
            bundle: Duration::from_millis(crate::fixtures::LIMITS.bundle_deadline_ms),
        }
    );
    let dir = tempfile::tempdir().unwrap();
    crate::fixtures::sealed_capture(&at, &config(), &budget(dir.path(), 1))
        .expect("a plan the validator built runs");
}

#[test]
fn risky_read_without_deadline_is_refused_and_nothing_is_spawned() {
    let dir = tempfile::tempdir().unwrap();
    let spawned = Arc::new(AtomicU32::new(0));
    let counter = spawned.clone();
    let mut cfg = config();
    cfg.on_helper_spawned = Some(Arc::new(move |_| {
        counter.fetch_add(1, Ordering::SeqCst);
    }));
    let me = std::process::id();
    let reads = vec![
        RiskyRead {
            id: "a".into(),
            pid: me,
            kind: SurfaceKind::Wchan { tid: me },
            deadline: Some(Duration::from_secs(1)),
            max_bytes: 4096,
        },
        RiskyRead {
            id: "b".into(),
            pid: me,
            kind: SurfaceKind::Stack { tid: me },
            deadline: None,
            max_bytes: 4096,
        },
    ];
    let err = run_risky(
        reads,
        Instant::now() + Duration::from_secs(5),
        "test",
        &cfg,
        &budget(dir.path(), 1),
    )
    .unwrap_err();
    match err {
        CaptureError::MissingDeadline { surface } => assert_eq!(surface, "b"),
        other => panic!("{other}"),
    }
    assert_eq!(spawned.load(Ordering::SeqCst), 0);
}

#[test]
fn every_surface_of_a_capture_carries_the_deadline_it_ran_under() {
    let p = Proc::spawn("sleep", &["1000"]);
    let dir = tempfile::tempdir().unwrap();
    let env = crate::fixtures::sealed_capture(
        &request(Target::Process { pid: p.pid() }, 1234, 10_000),
        &config(),
        &budget(dir.path(), 1),
    )
    .unwrap();
    assert!(!env.surfaces.is_empty());
    for s in &env.surfaces {
        assert_eq!(s.deadline_ms, 1234, "{s:?}");
    }
    assert_eq!(
        (
            env.bounds.surface_deadline_ms,
            env.bounds.bundle_deadline_ms
        ),
        (1234, 10_000)
    );
}
