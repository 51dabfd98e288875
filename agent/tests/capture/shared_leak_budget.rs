//! Issue 17: one leak journal and one leak budget per host. A helper leaked
//! by a one-shot capture (the supervisor path `pstackctl capture --one-shot`
//! runs, here in this process so the first helper can be frozen) is counted
//! by a running pstackd that shares the journal, and by the next one-shot
//! run; when the helper finally exits, both give the unit back. Root only
//! (cgroup-v1 freezer).

use std::sync::Arc;
use std::time::Duration;

use pstack_agent::supervisor::{LeakBudget, LeakJournal, Target};
use pstack_envelope::SurfaceStatus;

use crate::daemon_common::{Daemon, Settings};
use crate::fixtures::{Freezer, Proc, config, request, wait_state};
use crate::unreapable::freeze_first_helper;

#[test]
fn root_a_helper_leaked_one_shot_is_counted_by_pstackd_until_it_exits() {
    pstack_testkit::require!(
        pstack_testkit::freezer_mounted(),
        "cgroup-v1 freezer not mounted at /sys/fs/cgroup/freezer (scripts/setup.d/10-kernel.sh mounts it)"
    );
    let dir = tempfile::tempdir().unwrap();
    let ddir = dir.path().join("d");
    let d = Daemon::start(&ddir, &Settings::default());
    // The harness configures pstackd's journal here; the one-shot side uses it too.
    let journal = ddir.join("leaks.jsonl");
    assert_eq!(d.status()["helpers"]["leaked"], 0);

    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
    let one_shot = LeakBudget::new(2, LeakJournal::new(&journal), boot.trim());
    let freezer = Arc::new(Freezer::new("shared").expect("a freezer cgroup"));
    let mut cfg = config();
    freeze_first_helper(&mut cfg, freezer.clone());
    let subject = Proc::spawn("sleep", &["1000"]);
    assert!(wait_state(subject.pid(), 'S'));
    let env = crate::fixtures::sealed_capture(
        &request(Target::Process { pid: subject.pid() }, 300, 5000),
        &cfg,
        &one_shot,
    )
    .unwrap();
    assert!(
        env.surfaces
            .iter()
            .any(|s| s.status == SurfaceStatus::TimeoutUnreapedHelper),
        "the frozen helper was leaked"
    );
    assert_eq!(one_shot.in_use(), 1);

    let s = d.wait_status(
        Duration::from_secs(5),
        "pstackd to count the one-shot leak",
        |s| s["helpers"]["leaked"] == 1,
    );
    assert_eq!(s["helpers"]["leak_budget_available"], 3, "{s:#}");
    // The next one-shot run counts it as well.
    let next = LeakBudget::new(2, LeakJournal::new(&journal), boot.trim());
    assert_eq!(next.in_use(), 1);

    freezer.thaw();
    assert!(one_shot.wait_until_whole(Duration::from_secs(10)));
    assert!(next.wait_until_whole(Duration::from_secs(10)));
    d.wait_status(Duration::from_secs(10), "pstackd to return the unit", |s| {
        s["helpers"]["leaked"] == 0
    });
}
