//! Missing deadline: every risky surface is issued with a deadline; a request
//! or a risky read without one is refused before any helper is spawned.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use pstack_capture::process::{CaptureError, CaptureRequest, RiskyRead, Target, run_risky};
use pstack_helper::protocol::SurfaceKind;

use crate::fixtures::{Proc, budget, config, request};

#[test]
fn capture_request_without_deadlines_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let req = CaptureRequest {
        target: Target::Process {
            pid: std::process::id(),
        },
        deadlines: None,
        ..CaptureRequest::default()
    };
    let err = crate::fixtures::sealed_capture(&req, &config(), &budget(dir.path(), 1)).unwrap_err();
    assert!(matches!(err, CaptureError::MissingDeadline { .. }), "{err}");
    let mut zero = request(Target::Host, 0, 1000);
    let err =
        crate::fixtures::sealed_capture(&zero, &config(), &budget(dir.path(), 1)).unwrap_err();
    assert!(matches!(err, CaptureError::MissingDeadline { .. }), "{err}");
    zero.deadlines = None;
    assert!(crate::fixtures::sealed_capture(&zero, &config(), &budget(dir.path(), 1)).is_err());
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
