//! Root-only: a read that blocks. The subject holds an fd into a FUSE mount
//! whose server has accepted a request and never answers, so an lsof-style
//! `stat` of that fd target hangs (uninterruptibly, once the server has read
//! the request). The capture returns within its deadline plus a margin, that
//! surface is typed, and the other surfaces are intact.

use std::process::{Command, Stdio};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use pstack_capture::process::Target;
use pstack_envelope::SurfaceStatus;

use crate::fixtures::{HangingFuse, Proc, budget, config, is_root, request, wait_state};

#[test]
fn root_fd_target_on_a_hung_fuse_mount_times_out_and_the_rest_is_intact() {
    pstack_testkit::require!(is_root(), "mounting FUSE needs root");
    let fuse = HangingFuse::mount();
    pstack_testkit::require!(
        fuse.is_ok(),
        "{} (scripts/setup.d/10-kernel.sh loads fuse)",
        fuse.as_ref()
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default()
    );
    let mut fuse = fuse.expect("checked above");
    // The subject holds the mount root open as its stdin.
    let dir = std::fs::File::open(fuse.mountpoint.path()).unwrap();
    let subject = Proc(
        Command::new("sleep")
            .arg("1000")
            .stdin(Stdio::from(dir))
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    assert!(wait_state(subject.pid(), 'S'));
    fuse.hang.store(true, Ordering::SeqCst);

    let dir = tempfile::tempdir().unwrap();
    let budget = budget(dir.path(), 4);
    let bundle_ms = 4000;
    let started = Instant::now();
    let env = crate::fixtures::sealed_capture(
        &request(Target::Process { pid: subject.pid() }, 500, bundle_ms),
        &config(),
        &budget,
    )
    .unwrap();
    let took = started.elapsed();
    assert!(
        took < Duration::from_millis(bundle_ms + 1000),
        "capture took {took:?}"
    );
    assert!(
        fuse.unanswered.load(Ordering::SeqCst) >= 1,
        "the server never saw the stat"
    );

    let fd = env.surfaces.iter().find(|s| s.id == "proc/fd").unwrap();
    assert!(
        matches!(
            fd.status,
            SurfaceStatus::Timeout | SurfaceStatus::TimeoutUnreapedHelper
        ),
        "{fd:?}"
    );
    assert!(fd.elapsed_us >= 500_000, "{fd:?}");
    eprintln!(
        "proc/fd: {} ({})",
        fd.status,
        fd.cause.as_ref().map(|c| c.message.as_str()).unwrap_or("")
    );
    let pid = subject.pid();
    for id in [
        format!("task/{pid}/wchan"),
        format!("task/{pid}/stack"),
        format!("task/{pid}/stat"),
        "proc/cmdline".into(),
        "proc/environ".into(),
    ] {
        let s = env.surfaces.iter().find(|s| s.id == id).unwrap();
        assert_eq!(s.status, SurfaceStatus::Ok, "{s:?}");
    }
    assert!(
        env.unknowns
            .iter()
            .any(|u| u.surface.as_deref() == Some("proc/fd"))
    );
    // Abort the connection: a leaked helper can now die, and the budget returns.
    fuse.abort();
    assert!(budget.wait_until_whole(Duration::from_secs(10)));
}
