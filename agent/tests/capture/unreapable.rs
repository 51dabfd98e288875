//! Root-only: a helper that cannot be reaped. The first helper is put in a
//! FROZEN cgroup-v1 freezer cgroup as soon as it is spawned, so it never
//! answers and SIGKILL does not take until it is thawed.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pstack_capture::process::{JournalEntry, Target};
use pstack_envelope::SurfaceStatus;

use crate::fixtures::{Freezer, Proc, budget, config, request, wait_state};

/// Freeze the first helper spawned; returns the freezer holding it.
pub(crate) fn freeze_first_helper(
    cfg: &mut pstack_capture::process::SupervisorConfig,
    freezer: Arc<Freezer>,
) -> Arc<Mutex<Vec<u32>>> {
    let spawned = Arc::new(Mutex::new(Vec::new()));
    let seen = spawned.clone();
    cfg.on_helper_spawned = Some(Arc::new(move |h| {
        let mut s = seen.lock().unwrap();
        if s.is_empty() {
            freezer.add(h.pid);
            freezer.freeze();
        }
        s.push(h.pid);
    }));
    spawned
}

#[test]
fn root_frozen_helper_is_timeout_unreaped_journaled_budgeted_and_restored_after_thaw() {
    pstack_testkit::require!(
        pstack_testkit::freezer_mounted(),
        "cgroup-v1 freezer not mounted at /sys/fs/cgroup/freezer (scripts/setup.d/10-kernel.sh mounts it)"
    );
    let freezer = Freezer::new("helper").expect("a freezer cgroup under the mounted hierarchy");
    let freezer = Arc::new(freezer);
    let subject = Proc::spawn("sleep", &["1000"]);
    assert!(wait_state(subject.pid(), 'S'));
    let dir = tempfile::tempdir().unwrap();
    let budget = budget(dir.path(), 2);
    let mut cfg = config();
    let spawned = freeze_first_helper(&mut cfg, freezer.clone());

    let bundle_ms = 5000;
    let started = Instant::now();
    let env = crate::fixtures::sealed_capture(
        &request(Target::Process { pid: subject.pid() }, 300, bundle_ms),
        &cfg,
        &budget,
    )
    .unwrap();
    let took = started.elapsed();
    assert!(
        took < Duration::from_millis(bundle_ms + 1000),
        "capture took {took:?}"
    );

    let pid = subject.pid();
    let first = env
        .surfaces
        .iter()
        .find(|s| s.id == format!("task/{pid}/wchan"))
        .unwrap();
    assert_eq!(
        first.status,
        SurfaceStatus::TimeoutUnreapedHelper,
        "{first:?}"
    );
    assert_eq!(first.deadline_ms, 300);
    let helpers = spawned.lock().unwrap().clone();
    assert!(
        helpers.len() >= 2,
        "capture must continue with a fresh helper: {helpers:?}"
    );
    let frozen_helper = helpers[0];
    assert!(
        first
            .cause
            .as_ref()
            .unwrap()
            .message
            .contains(&format!("helper pid {frozen_helper}"))
    );
    // The remaining surfaces were read by the fresh helper.
    for name in ["syscall", "stack"] {
        let s = env
            .surfaces
            .iter()
            .find(|s| s.id == format!("task/{pid}/{name}"))
            .unwrap();
        assert_eq!(s.status, SurfaceStatus::Ok, "{s:?}");
    }
    assert!(
        env.unknowns
            .iter()
            .any(|u| u.surface.as_deref() == Some(&format!("task/{pid}/wchan")))
    );
    assert_eq!(env.completeness, pstack_envelope::Completeness::Partial);

    // Journal has the helper's identity; one unit of budget is consumed.
    let entries = budget.journal().entries();
    let leaked = entries.iter().find_map(|e| match e {
        JournalEntry::Leaked {
            helper,
            surface,
            subject,
            ..
        } => Some((helper.clone(), surface.clone(), subject.clone())),
        _ => None,
    });
    let (helper, surface, subj) = leaked.expect("a leaked entry");
    assert_eq!(helper.pid, frozen_helper);
    assert!(helper.start_ticks > 0);
    assert_eq!(surface, format!("task/{pid}/wchan"));
    assert!(subj.contains(&format!("pid {pid}")));
    assert_eq!((budget.in_use(), budget.available()), (1, 1));

    // Thaw: the pending SIGKILL takes, the reaper reaps it and returns the unit.
    freezer.thaw();
    assert!(
        budget.wait_until_whole(Duration::from_secs(10)),
        "budget not restored"
    );
    assert_eq!(budget.available(), 2);
    assert!(
        matches!(budget.journal().entries().last(), Some(JournalEntry::Reaped { helper: h, .. }) if *h == helper)
    );
}

#[test]
fn root_spent_leak_budget_skips_remaining_risky_surfaces_with_the_reason() {
    pstack_testkit::require!(
        pstack_testkit::freezer_mounted(),
        "cgroup-v1 freezer not mounted at /sys/fs/cgroup/freezer (scripts/setup.d/10-kernel.sh mounts it)"
    );
    let freezer = Freezer::new("budget").expect("a freezer cgroup under the mounted hierarchy");
    let freezer = Arc::new(freezer);
    let subject = Proc::spawn("sleep", &["1000"]);
    let dir = tempfile::tempdir().unwrap();
    let budget = budget(dir.path(), 1);
    let mut cfg = config();
    let spawned = freeze_first_helper(&mut cfg, freezer.clone());
    let env = crate::fixtures::sealed_capture(
        &request(Target::Process { pid: subject.pid() }, 200, 5000),
        &cfg,
        &budget,
    )
    .unwrap();
    assert_eq!(
        spawned.lock().unwrap().len(),
        1,
        "no helper may be spawned with the budget spent"
    );
    let pid = subject.pid();
    for name in ["syscall", "stack"] {
        let s = env
            .surfaces
            .iter()
            .find(|s| s.id == format!("task/{pid}/{name}"))
            .unwrap();
        assert_eq!(s.status, SurfaceStatus::Skipped, "{s:?}");
        assert!(
            s.cause
                .as_ref()
                .unwrap()
                .message
                .contains("leak budget spent"),
            "{s:?}"
        );
    }
    // Safe surfaces are still read in this process.
    let stat = env
        .surfaces
        .iter()
        .find(|s| s.id == format!("task/{pid}/stat"))
        .unwrap();
    assert_eq!(stat.status, SurfaceStatus::Ok);
    freezer.thaw();
    assert!(budget.wait_until_whole(Duration::from_secs(10)));
}
