//! Stale PID: the subject exits and its PID is reused between the two
//! identity reads → `identity_race`, nothing attributed.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use pstack_capture::process::Target;
use pstack_envelope::{Completeness, SurfaceStatus};

use crate::fixtures::{Proc, budget, config, is_root, request, spawn_with_pid, wait_state};

#[test]
fn root_pid_reused_between_identity_reads_is_identity_race() {
    pstack_testkit::require!(
        is_root(),
        "steering pid reuse through ns_last_pid needs root"
    );
    // Reusing the pid races every other fork on the host (ns_last_pid is global to the
    // namespace), so try a few times; the test is about *reuse*, so a run in which the
    // pid was never reused fails instead of quietly testing the vanished-subject race
    // (that one has its own test below).
    let mut reused = None;
    for _attempt in 0..5 {
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
        let env = crate::fixtures::sealed_capture(
            &request(Target::Process { pid }, 2000, 10_000),
            &cfg,
            &budget(dir.path(), 2),
        )
        .unwrap();
        let impostor = slot.lock().unwrap().1.take();
        if let Some(impostor) = impostor {
            assert_eq!(impostor.pid(), pid, "the impostor holds the subject's pid");
            reused = Some((env, impostor));
            break;
        }
    }
    let Some((env, _impostor)) = reused else {
        panic!("the subject's pid was not reused in 5 attempts (other forks took it every time)");
    };
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
    // Reuse (not exit) is told apart by the start time that changed under the same pid.
    assert!(u.question.contains("start_ticks"), "{}", u.question);
    pstack_testkit::verify(&env.to_json_pretty()).unwrap();
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
    let env = crate::fixtures::sealed_capture(
        &request(Target::Process { pid }, 2000, 10_000),
        &cfg,
        &budget(dir.path(), 2),
    )
    .unwrap();
    assert_eq!(env.completeness, Completeness::IdentityRace);
    assert!(env.claims.is_empty());
}
