//! The transport capture's netns samples run in `pstack-helper --net`, not in
//! pstackctl: the helper stands in the target netns (pstackctl does not), is
//! confined to the net profile, and a helper that stops answering makes the
//! capture finish within its deadline with `timeout` surfaces.

use std::os::unix::fs::MetadataExt;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pstack_capture::process::{LeakBudget, LeakJournal, SupervisorConfig};
use pstack_capture::transport::{self, CaptureResult, FlowSelection, Plan, SURFACE_DEADLINE_MS};
use pstack_envelope::{Completeness, Subject, SurfaceStatus};

use crate::testbed::*;

fn config() -> SupervisorConfig {
    let mut c = SupervisorConfig::locate("pstack-test").unwrap_or_else(|e| {
        panic!("{e}\nbuild the helper first: cargo build -p pstack-helper (cargo test --workspace does)")
    });
    c.reap_deadline = Duration::from_millis(200);
    c
}

fn budget(dir: &std::path::Path) -> LeakBudget {
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
    LeakBudget::new(4, LeakJournal::new(dir.join("leaks.jsonl")), boot.trim())
}

fn plan(ns: &Netns, window: &str) -> Plan {
    let window = pstack_cli::parse_duration(window).unwrap();
    Plan::from_selection(
        &FlowSelection {
            peer: B_V4.into(),
            local: None,
            netns_pid: None,
            netns: Some(ns.name.clone()),
            window_ms: window.as_millis() as u64,
            ports: Some("10000-30000".into()),
            max_flows: 64,
            wait: false,
        },
        false,
    )
    .unwrap()
}

fn ns_inode(path: &str) -> u64 {
    std::fs::metadata(path).unwrap().ino()
}

fn status_field(pid: u32, key: &str) -> String {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{key}:")))
        .unwrap_or_default()
        .trim()
        .to_string()
}

/// Whether `pid` is a net helper (`pstack-helper --net`), not the
/// socket-option helper a capture also spawns (`--sockopt`) once it has found
/// socket owners. That one can be done and reaped before its cmdline is read
/// (an empty cmdline): only a helper seen with `--net` counts.
fn is_net_helper(pid: u32) -> bool {
    let until = Instant::now() + Duration::from_millis(100);
    loop {
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        if !cmdline.is_empty() || Instant::now() > until {
            return cmdline.split(|b| *b == 0).any(|a| a == b"--net");
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// The flow envelope whose remote port is the data port.
/// Start a capture of `ns` over `window` on its own thread; return it, the
/// pid of the first net helper it spawned, and the channel that reports any
/// later helper.
fn capture_in_thread(
    ns: &Netns,
    window: &str,
) -> (
    std::thread::JoinHandle<Result<CaptureResult, transport::TransportError>>,
    u32,
    mpsc::Receiver<u32>,
) {
    let (tx, rx) = mpsc::channel();
    let tx = Mutex::new(tx);
    let mut cfg = config();
    cfg.on_helper_spawned = Some(Arc::new(move |h| {
        if is_net_helper(h.pid) {
            let _ = tx.lock().unwrap().send(h.pid);
        }
    }));
    let dir = tempfile::tempdir().unwrap();
    let p = plan(ns, window);
    let capture = std::thread::spawn(move || {
        let b = budget(dir.path());
        transport::capture_with(&p, &cfg, &b, &pstack_capture::no_progress)
    });
    let helper = rx
        .recv_timeout(Duration::from_secs(5))
        .expect("a net helper");
    (capture, helper, rx)
}

fn data_flow(r: &CaptureResult) -> &pstack_envelope::Envelope {
    flow_to(&r.flows, DATA_PORT)
}

#[test]
fn root_net_helper_stands_in_the_target_netns_and_pstackctl_does_not() {
    if !root_or_skip("root_net_helper_stands_in_the_target_netns_and_pstackctl_does_not") {
        return;
    }
    let _s = serial();
    let bed = Testbed::new("nh");
    let _t = Transfer::start(&bed, false, None);
    let target = ns_inode(&format!("/run/netns/{}", bed.a.name));
    let mine = ns_inode("/proc/thread-self/ns/net");
    assert_ne!(target, mine, "the test runs outside the testbed");

    let (capture, helper, rx) = capture_in_thread(&bed.a, "1500ms");
    // The helper enters the netns before it confines itself and answers; it
    // then idles (same process) through the window: watch it from outside.
    let until = Instant::now() + Duration::from_millis(1200);
    let mut seen = None;
    while Instant::now() < until {
        let ns = std::fs::metadata(format!("/proc/{helper}/ns/net")).map(|m| m.ino());
        if ns.as_ref().is_ok_and(|i| *i == target) && status_field(helper, "Seccomp") == "2" {
            seen = ns.ok();
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(
        seen,
        Some(target),
        "helper {helper} never stood in the target netns"
    );
    assert_eq!(status_field(helper, "NoNewPrivs"), "1");
    assert_eq!(
        u64::from_str_radix(&status_field(helper, "CapEff"), 16).unwrap(),
        pstack_helper::confine::kept_net_caps_mask()
    );
    // pstackctl's side (this process) never changed namespace.
    assert_eq!(ns_inode("/proc/self/ns/net"), mine);
    let result = capture.join().unwrap().expect("capture");
    assert_eq!(result.net_ns, target);
    if let Ok(other) = rx.try_recv() {
        panic!(
            "one helper served both ends of the window: another helper {other} ({:?})",
            std::fs::read_to_string(format!("/proc/{other}/cmdline")).unwrap_or_default()
        );
    }
    // The flow exists only inside the testbed netns: the helper's sock_diag
    // dump saw it, at both ends, with the veth peer read through CAP_NET_ADMIN.
    let env = data_flow(&result);
    for id in [
        "tcp/start",
        "tcp/end",
        "netstat",
        "route",
        "link",
        "link/peer",
    ] {
        assert_eq!(
            surface(env, id).status,
            SurfaceStatus::Ok,
            "{id}: {:?}",
            surface(env, id)
        );
    }
    assert!(
        surface(env, "tcp/start")
            .authority
            .contains(&target.to_string()),
        "{:?}",
        surface(env, "tcp/start").authority
    );
}

/// SIGSTOP each helper the hook sees while `stop(n)` says so (n counts from 0).
fn stopping_config(
    stop: impl Fn(usize) -> bool + Send + Sync + 'static,
) -> (SupervisorConfig, Arc<Mutex<Vec<u32>>>) {
    let spawned = Arc::new(Mutex::new(Vec::new()));
    let seen = spawned.clone();
    let mut cfg = config();
    cfg.on_helper_spawned = Some(Arc::new(move |h| {
        if !is_net_helper(h.pid) {
            return;
        }
        let mut s = seen.lock().unwrap();
        if stop(s.len()) {
            // SAFETY: kill(2) with integer arguments on a child we just spawned.
            unsafe { libc::kill(h.pid as i32, libc::SIGSTOP) };
        }
        s.push(h.pid);
    }));
    (cfg, spawned)
}

#[test]
fn root_stopped_net_helper_makes_its_end_of_the_window_timeout_not_a_hang() {
    if !root_or_skip("root_stopped_net_helper_makes_its_end_of_the_window_timeout_not_a_hang") {
        return;
    }
    let _s = serial();
    let bed = Testbed::new("nst");
    let _t = Transfer::start(&bed, false, None);
    let (cfg, spawned) = stopping_config(|n| n == 0);
    let dir = tempfile::tempdir().unwrap();
    let b = budget(dir.path());
    let window = Duration::from_millis(300);
    let started = Instant::now();
    let result = transport::capture_with(
        &plan(&bed.a, "300ms"),
        &cfg,
        &b,
        &pstack_capture::no_progress,
    )
    .expect("capture");
    let took = started.elapsed();
    // start: one missed deadline + reap; window; end: a fresh helper answers.
    let bound = window + Duration::from_millis(SURFACE_DEADLINE_MS) + Duration::from_secs(3);
    assert!(took < bound, "capture took {took:?} (bound {bound:?})");
    let helpers = spawned.lock().unwrap().clone();
    assert_eq!(
        helpers.len(),
        2,
        "a fresh helper for the end sample: {helpers:?}"
    );
    let stopped = helpers[0];
    assert!(
        !std::path::Path::new(&format!("/proc/{stopped}")).exists(),
        "the stopped helper {stopped} was killed and reaped"
    );
    let env = data_flow(&result);
    let start = surface(env, "tcp/start");
    assert_eq!(start.status, SurfaceStatus::Timeout, "{start:?}");
    assert_eq!(start.deadline_ms, SURFACE_DEADLINE_MS);
    let cause = start.cause.as_ref().unwrap().message.clone();
    assert!(
        cause.contains(&format!("net helper pid {stopped} killed and reaped")),
        "{cause}"
    );
    assert!(start.facts.is_empty(), "no value is made up: {start:?}");
    assert_eq!(surface(env, "tcp/end").status, SurfaceStatus::Ok);
    // The netns-wide surfaces need both ends: missing the start, they time out.
    for id in ["netstat", "route", "link", "conntrack", "host/cpu"] {
        assert_eq!(surface(env, id).status, SurfaceStatus::Timeout, "{id}");
    }
    assert_eq!(env.completeness, Completeness::Partial);
    assert!(
        b.journal().entries().is_empty(),
        "a reaped helper is no leak"
    );
}

#[test]
fn root_every_net_helper_stopped_is_a_partial_no_match_with_timeouts() {
    if !root_or_skip("root_every_net_helper_stopped_is_a_partial_no_match_with_timeouts") {
        return;
    }
    let _s = serial();
    let bed = Testbed::new("nsa");
    let _t = Transfer::start(&bed, false, None);
    let (cfg, spawned) = stopping_config(|_| true);
    let dir = tempfile::tempdir().unwrap();
    let b = budget(dir.path());
    let started = Instant::now();
    let result = transport::capture_with(
        &plan(&bed.a, "200ms"),
        &cfg,
        &b,
        &pstack_capture::no_progress,
    )
    .expect("capture");
    let took = started.elapsed();
    let bound = Duration::from_millis(200 + 2 * SURFACE_DEADLINE_MS) + Duration::from_secs(3);
    assert!(took < bound, "capture took {took:?} (bound {bound:?})");
    assert_eq!(spawned.lock().unwrap().len(), 2);
    assert!(result.flows.is_empty(), "no flow is invented");
    let env = result
        .no_match
        .expect("the no-match envelope says what happened");
    assert!(matches!(env.subject, Subject::Host(_)));
    for id in ["tcp/start", "tcp/end"] {
        assert_eq!(surface(&env, id).status, SurfaceStatus::Timeout, "{id}");
    }
    assert_eq!(env.completeness, Completeness::Partial);
    assert!(
        !codes(&env).contains(&"no_matching_flow".to_string()),
        "no universal claim from timed-out reads"
    );
}

/// A cgroup-v1 freezer cgroup, thawed and removed on drop.
struct Freezer(std::path::PathBuf);

impl Freezer {
    fn new() -> Option<Freezer> {
        let root = std::path::Path::new("/sys/fs/cgroup/freezer");
        if !root.join("cgroup.procs").exists() {
            return None;
        }
        let dir = root.join(format!("pstack-test-nethelper-{}", std::process::id()));
        let _ = std::fs::remove_dir(&dir);
        std::fs::create_dir(&dir).unwrap();
        Some(Freezer(dir))
    }

    fn freeze(&self, pid: u32) {
        std::fs::write(self.0.join("cgroup.procs"), pid.to_string()).unwrap();
        std::fs::write(self.0.join("freezer.state"), "FROZEN").unwrap();
        let until = Instant::now() + Duration::from_secs(5);
        while Instant::now() < until {
            let s = std::fs::read_to_string(self.0.join("freezer.state")).unwrap_or_default();
            if s.trim() == "FROZEN" {
                return;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        panic!("freezer {} did not freeze", self.0.display());
    }

    fn thaw(&self) {
        let _ = std::fs::write(self.0.join("freezer.state"), "THAWED");
    }
}

impl Drop for Freezer {
    fn drop(&mut self) {
        self.thaw();
        let until = Instant::now() + Duration::from_secs(5);
        while std::fs::remove_dir(&self.0).is_err() && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

#[test]
fn root_frozen_net_helper_is_timeout_unreaped_journaled_and_spends_the_budget() {
    if !root_or_skip("root_frozen_net_helper_is_timeout_unreaped_journaled_and_spends_the_budget") {
        return;
    }
    pstack_testkit::require!(
        pstack_testkit::freezer_mounted(),
        "cgroup-v1 freezer not mounted at /sys/fs/cgroup/freezer (scripts/setup.d/10-kernel.sh mounts it)"
    );
    let freezer = Freezer::new().expect("a freezer cgroup under the mounted hierarchy");
    let _s = serial();
    let bed = Testbed::new("nfz");
    let _t = Transfer::start(&bed, false, None);
    let freezer = Arc::new(freezer);
    let spawned = Arc::new(Mutex::new(Vec::new()));
    let (seen, fz) = (spawned.clone(), freezer.clone());
    let mut cfg = config();
    cfg.on_helper_spawned = Some(Arc::new(move |h| {
        if !is_net_helper(h.pid) {
            return;
        }
        let mut s = seen.lock().unwrap();
        if s.is_empty() {
            fz.freeze(h.pid);
        }
        s.push(h.pid);
    }));
    let dir = tempfile::tempdir().unwrap();
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
    let b = LeakBudget::new(
        1,
        LeakJournal::new(dir.path().join("leaks.jsonl")),
        boot.trim(),
    );
    let started = Instant::now();
    let result = transport::capture_with(
        &plan(&bed.a, "200ms"),
        &cfg,
        &b,
        &pstack_capture::no_progress,
    )
    .expect("capture");
    let took = started.elapsed();
    assert!(took < Duration::from_secs(6), "capture took {took:?}");
    let helpers = spawned.lock().unwrap().clone();
    assert_eq!(
        helpers.len(),
        1,
        "no helper is spawned with the budget spent"
    );
    let env = result.no_match.expect("no flow was read at either end");
    let start = surface(&env, "tcp/start");
    assert_eq!(
        start.status,
        SurfaceStatus::TimeoutUnreapedHelper,
        "{start:?}"
    );
    assert!(
        start
            .cause
            .as_ref()
            .unwrap()
            .message
            .contains(&format!("net helper pid {}", helpers[0])),
        "{start:?}"
    );
    let end = surface(&env, "tcp/end");
    assert_eq!(end.status, SurfaceStatus::Skipped, "{end:?}");
    assert!(
        end.cause
            .as_ref()
            .unwrap()
            .message
            .contains("leak budget spent")
    );
    assert_eq!(env.completeness, Completeness::Partial);
    let leaked = b.journal().entries().into_iter().find_map(|e| match e {
        pstack_capture::process::JournalEntry::Leaked {
            helper, surface, ..
        } => Some((helper, surface)),
        _ => None,
    });
    let (helper, what) = leaked.expect("the frozen helper is journaled");
    assert_eq!((helper.pid, what.as_str()), (helpers[0], "net/sample"));
    assert_eq!(b.available(), 0);
    // Thawed, the pending SIGKILL takes and the reaper returns the unit.
    freezer.thaw();
    assert!(
        b.wait_until_whole(Duration::from_secs(10)),
        "budget not restored"
    );
}

#[test]
fn root_netns_name_that_is_not_a_namespace_is_a_typed_usage_error() {
    // Regression guard for the move into the helper: `setns` now fails in
    // pstack-helper, and that must still be exit 2 with the namespace named,
    // not envelopes of `error` surfaces.
    if !root_or_skip("root_netns_name_that_is_not_a_namespace_is_a_typed_usage_error") {
        return;
    }
    let name = format!("pstack-notns-{}", std::process::id());
    let path = format!("/run/netns/{name}");
    std::fs::create_dir_all("/run/netns").unwrap();
    std::fs::write(&path, b"not a namespace").unwrap();
    let (code, out, err) = pstackctl(&[
        "capture",
        "transport",
        "--netns",
        &name,
        "--peer",
        B_V4,
        "--window",
        "100ms",
        "--no-ebpf",
        "--json",
    ]);
    let _ = std::fs::remove_file(&path);
    assert_eq!(code, 2, "stdout {out} stderr {err}");
    assert!(out.trim().is_empty(), "no envelope: {out}");
    assert!(err.contains(&path) && err.contains("setns"), "{err}");
}

#[test]
fn root_net_helper_stopped_during_the_window_times_out_the_end_and_claims_no_release() {
    // Regression: with the end sample missing, a flow ESTABLISHED at start was
    // claimed "released before window end" (flow_left_established) — a fact
    // drawn from a read that never happened.
    if !root_or_skip(
        "root_net_helper_stopped_during_the_window_times_out_the_end_and_claims_no_release",
    ) {
        return;
    }
    let _s = serial();
    let bed = Testbed::new("nse");
    let _t = Transfer::start(&bed, false, None);
    let started = Instant::now();
    let (capture, helper, rx) = capture_in_thread(&bed.a, "3s");
    // Mid-window: the start sample is long answered, the end not yet asked.
    std::thread::sleep(Duration::from_millis(1500));
    // SAFETY: kill(2) with integer arguments on the helper the hook reported.
    unsafe { libc::kill(helper as i32, libc::SIGSTOP) };
    let result = capture.join().unwrap().expect("capture");
    let took = started.elapsed();
    let bound = Duration::from_millis(3000 + SURFACE_DEADLINE_MS) + Duration::from_secs(3);
    assert!(took < bound, "capture took {took:?} (bound {bound:?})");
    assert!(
        rx.try_recv().is_err(),
        "no fresh helper after the end sample"
    );
    let env = data_flow(&result);
    assert_eq!(surface(env, "tcp/start").status, SurfaceStatus::Ok);
    let end = surface(env, "tcp/end");
    assert_eq!(end.status, SurfaceStatus::Timeout, "{end:?}");
    assert!(
        end.cause
            .as_ref()
            .unwrap()
            .message
            .contains(&format!("net helper pid {helper} killed and reaped")),
        "{end:?}"
    );
    assert!(
        !codes(env).contains(&"flow_left_established".to_string()),
        "{:?}",
        codes(env)
    );
    assert_eq!(env.completeness, Completeness::Partial);
}
