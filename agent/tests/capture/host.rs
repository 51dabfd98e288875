//! Host-wide captures: every process's threads with state and wchan, sealed;
//! the universe cap is reported, never silent.

use pstack_capture::process::Target;
use pstack_envelope::{Completeness, SurfaceStatus, Termination};

use crate::fixtures::{Ask, Proc, budget, config, plan, request};

#[test]
fn host_capture_covers_this_process_and_verifies() {
    let p = Proc::spawn("sleep", &["1000"]);
    let dir = tempfile::tempdir().unwrap();
    let env = crate::fixtures::sealed_capture(
        &request(Target::Host, 2000, 20_000),
        &config(),
        &budget(dir.path(), 2),
    )
    .unwrap();
    assert_eq!(env.subject.kind(), "host");
    pstack_testkit::verify(&env.to_json_pretty()).unwrap();
    let tasks = env
        .surfaces
        .iter()
        .find(|s| s.id == format!("proc/{}/tasks", p.pid()))
        .expect("the sleep is in the host capture");
    assert_eq!(tasks.facts["threads"][0]["state"], "S");
    assert!(env.universe.observed_count > 0);
    assert!(env.universe.observed_count <= env.universe.expected_count);
    assert!(env.claims.iter().any(|c| c.code == "thread_state_counts"));
}

#[test]
fn host_capture_universe_cap_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let req = plan(
        Target::Host,
        2000,
        20_000,
        Ask {
            max_threads: Some(3),
            ..Ask::default()
        },
    )
    .unwrap();
    let env = crate::fixtures::sealed_capture(&req, &config(), &budget(dir.path(), 2)).unwrap();
    assert_eq!(env.universe.termination, Termination::Cap);
    assert!(env.universe.expected_count > 3);
    assert!(env.universe.observed_count <= 3);
    assert_ne!(env.completeness, Completeness::Complete);
    assert!(
        env.claims
            .iter()
            .all(|c| c.scope == pstack_envelope::Scope::Existential)
    );
    assert!(
        env.surfaces
            .iter()
            .all(|s| s.status != SurfaceStatus::Error),
        "{:?}",
        env.surfaces
    );
}
