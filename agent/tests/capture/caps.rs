//! Caps are reported, never silent: a byte cap cuts a surface to `truncated`
//! (digest over the kept bytes), a thread cap cuts the universe to `cap`, and
//! neither envelope may carry a universal claim.

use pstack_capture::process::Target;
use pstack_envelope::{Completeness, Scope, SurfaceStatus, Termination};

use crate::fixtures::{Ask, Proc, budget, config, plan, surface, wait_state};

#[test]
fn byte_cap_truncates_surfaces_and_says_so() {
    let p = Proc::spawn("sleep", &["1000"]);
    assert!(wait_state(p.pid(), 'S'));
    let dir = tempfile::tempdir().unwrap();
    let req = plan(
        Target::Process { pid: p.pid() },
        2000,
        10_000,
        Ask {
            max_bytes_per_surface: Some(64),
            ..Ask::default()
        },
    )
    .unwrap();
    let env = crate::fixtures::sealed_capture(&req, &config(), &budget(dir.path(), 1)).unwrap();
    let status = surface(&env, "proc/status");
    assert_eq!(status.status, SurfaceStatus::Truncated, "{status:?}");
    assert!(status.truncated);
    assert_eq!(status.bytes, 64);
    assert!(status.cause.as_ref().unwrap().message.contains("byte cap"));
    assert_eq!(env.bounds.max_bytes_per_surface, 64);
    assert_ne!(env.completeness, Completeness::Complete);
    assert!(env.claims.iter().all(|c| c.scope == Scope::Existential));
    pstack_testkit::verify(&env.to_json_pretty()).unwrap();
}

#[test]
fn thread_cap_cuts_the_universe_and_says_so() {
    // This test binary has several threads; keep one more alive to be sure.
    let t = std::thread::spawn(|| std::thread::sleep(std::time::Duration::from_secs(3)));
    let me = std::process::id();
    let dir = tempfile::tempdir().unwrap();
    let req = plan(
        Target::Process { pid: me },
        2000,
        10_000,
        Ask {
            max_threads: Some(1),
            ..Ask::default()
        },
    )
    .unwrap();
    let env = crate::fixtures::sealed_capture(&req, &config(), &budget(dir.path(), 1)).unwrap();
    assert_eq!(env.universe.termination, Termination::Cap);
    assert!(env.universe.expected_count >= 2, "{:?}", env.universe);
    assert_eq!(env.universe.observed_count, 1);
    assert_ne!(env.completeness, Completeness::Complete);
    assert!(!env.claims.iter().any(|c| c.code == "no_thread_in_d_state"));
    t.join().unwrap();
}
