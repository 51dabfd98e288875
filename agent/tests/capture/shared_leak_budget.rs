//! Issue 17: one leak journal and one leak budget per host. A helper leaked
//! by a one-shot capture (the supervisor path `pstackctl capture --one-shot`
//! runs, here in this process so the first helper can be frozen) is counted
//! by a running pstackd that shares the journal, and by the next one-shot
//! run; when the helper finally exits, both give the unit back. Root only
//! (cgroup-v1 freezer).

use std::sync::Arc;
use std::time::Duration;

use pstack_capture::process::{LeakBudget, LeakJournal, Target};
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

/// The other direction: a helper leaked by pstackd is counted by the next
/// one-shot capture (which reads the same journal) until it exits. pstackd's
/// helper path is a wrapper that puts the first helper it starts into a
/// FROZEN cgroup-v1 freezer, then `exec`s the real helper: pstackd's SIGKILL
/// cannot take, so pstackd journals it. Root only (cgroup-v1 freezer).
#[test]
fn root_a_helper_leaked_by_pstackd_is_counted_by_one_shot_until_it_exits() {
    use std::os::unix::fs::PermissionsExt;
    use std::process::{Command, Stdio};

    pstack_testkit::require!(
        pstack_testkit::freezer_mounted(),
        "cgroup-v1 freezer not mounted at /sys/fs/cgroup/freezer (scripts/setup.d/10-kernel.sh mounts it)"
    );
    let dir = tempfile::tempdir().unwrap();
    let ddir = dir.path().join("d");
    std::fs::create_dir_all(&ddir).unwrap();
    let freezer = Freezer::new("daemon-leak").expect("a freezer cgroup");
    freezer.freeze();
    // The first helper pstackd starts freezes itself (mkdir is the once-only
    // latch); every later one runs normally.
    let wrapper = dir.path().join("frozen-first-helper.sh");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\nif mkdir {latch} 2>/dev/null; then echo $$ > {procs}; fi\nexec {helper} \"$@\"\n",
            latch = dir.path().join("latch").display(),
            procs = freezer.dir.join("cgroup.procs").display(),
            helper = crate::daemon_common::helper_bin().display(),
        ),
    )
    .unwrap();
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    let settings = Settings::default();
    let toml = settings.toml(&ddir).replace(
        &format!(
            "helper_path = \"{}\"",
            crate::daemon_common::helper_bin().display()
        ),
        &format!("helper_path = \"{}\"", wrapper.display()),
    );
    assert!(toml.contains(&wrapper.display().to_string()), "{toml}");
    std::fs::write(
        ddir.join("api-key"),
        format!("{}\n", crate::daemon_common::API_KEY),
    )
    .unwrap();
    std::fs::write(ddir.join("pstackd.toml"), toml).unwrap();
    let log = ddir.join("pstackd.log");
    let child = Command::new(crate::daemon_common::pstackd_bin())
        .arg("--config")
        .arg(ddir.join("pstackd.toml"))
        .env("PSTACKD_LOG", "info")
        .env_remove("NOTIFY_SOCKET")
        .env_remove("WATCHDOG_USEC")
        .env_remove("LISTEN_FDS")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("spawn pstackd");
    let d = Daemon {
        child: Some(child),
        socket: ddir.join("pstackd.sock"),
        log,
    };
    d.wait_serving(Duration::from_secs(10));
    let journal = ddir.join("leaks.jsonl");
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
    // Before pstackd leaks anything, a one-shot run has its whole budget.
    assert_eq!(
        LeakBudget::new(2, LeakJournal::new(&journal), boot.trim()).in_use(),
        0
    );

    let subject = Proc::spawn("sleep", &["1000"]);
    assert!(wait_state(subject.pid(), 'S'));
    let env = d.capture_pid(subject.pid()).expect("pstackd captures");
    assert!(
        env.surfaces
            .iter()
            .any(|s| s.status == SurfaceStatus::TimeoutUnreapedHelper),
        "pstackd leaked the frozen helper: {:?}",
        env.surfaces
            .iter()
            .map(|s| (&s.id, s.status))
            .collect::<Vec<_>>()
    );
    d.wait_status(Duration::from_secs(5), "pstackd to count its leak", |s| {
        s["helpers"]["leaked"] == 1
    });

    // A one-shot capture started now counts pstackd's leak against its own
    // budget: one unit of two is gone.
    let one_shot = LeakBudget::new(2, LeakJournal::new(&journal), boot.trim());
    assert_eq!(
        one_shot.in_use(),
        1,
        "the one-shot budget did not count pstackd's leak"
    );
    assert_eq!(one_shot.available(), 1);

    freezer.thaw();
    assert!(one_shot.wait_until_whole(Duration::from_secs(10)));
    d.wait_status(Duration::from_secs(10), "pstackd to return the unit", |s| {
        s["helpers"]["leaked"] == 0
    });
}
