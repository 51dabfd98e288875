//! Stale PID: the subject exits and its PID is reused between the two
//! identity reads → `identity_race`, nothing attributed.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use pstack_agent::supervisor::{self, Target};
use pstack_envelope::{Completeness, SurfaceStatus};

use crate::fixtures::{Proc, budget, config, is_root, request, spawn_with_pid, wait_state};

#[test]
fn root_pid_reused_between_identity_reads_is_identity_race() {
    if !is_root() {
        eprintln!("skipped: steering pid reuse through ns_last_pid needs root");
        return;
    }
    let subject = Proc::spawn("sleep", &["1000"]);
    let pid = subject.pid();
    assert!(wait_state(pid, 'S'));
    std::thread::sleep(Duration::from_millis(50)); // a later start tick for the impostor
    let slot = Arc::new(Mutex::new((Some(subject), None::<Proc>)));
    let hook_slot = slot.clone();
    let mut cfg = config();
    cfg.on_helper_spawned = Some(Arc::new(move |_| {
        let mut s = hook_slot.lock().unwrap();
        if let Some(old) = s.0.take() {
            drop(old); // killed and reaped: the pid is free
            s.1 = spawn_with_pid(pid);
        }
    }));
    let dir = tempfile::tempdir().unwrap();
    let env = supervisor::capture(
        &request(Target::Process { pid }, 2000, 10_000),
        &cfg,
        &budget(dir.path(), 2),
    )
    .unwrap();
    if slot.lock().unwrap().1.is_none() {
        // The pid could not be reused; the subject still vanished, which is
        // also a change of identity.
        eprintln!(
            "note: pid {pid} was taken by another process; checking the vanished-subject race instead"
        );
    }
    assert_eq!(env.completeness, Completeness::IdentityRace);
    assert!(
        env.claims.is_empty(),
        "nothing may be attributed: {:?}",
        env.claims
    );
    assert!(
        env.surfaces.iter().all(|s| s.facts.is_empty()),
        "facts must be withheld"
    );
    assert!(
        env.surfaces
            .iter()
            .any(|s| s.status == SurfaceStatus::IdentityRace)
    );
    assert_eq!(env.next_transition.action, "CAPTURE_AGAIN");
    let u = env.unknowns.iter().find(|u| u.id == "u-identity").unwrap();
    if slot.lock().unwrap().1.is_some() {
        assert!(u.question.contains("start_ticks"), "{}", u.question);
    }
    pstack_envelope::verify(&env.to_json_pretty()).unwrap();
}

#[test]
fn subject_exiting_between_identity_reads_is_identity_race() {
    let subject = Proc::spawn("sleep", &["1000"]);
    let pid = subject.pid();
    let slot = Arc::new(Mutex::new(Some(subject)));
    let hook_slot = slot.clone();
    let mut cfg = config();
    cfg.on_helper_spawned = Some(Arc::new(move |_| {
        hook_slot.lock().unwrap().take();
    }));
    let dir = tempfile::tempdir().unwrap();
    let env = supervisor::capture(
        &request(Target::Process { pid }, 2000, 10_000),
        &cfg,
        &budget(dir.path(), 2),
    )
    .unwrap();
    assert_eq!(env.completeness, Completeness::IdentityRace);
    assert!(env.claims.is_empty());
}
