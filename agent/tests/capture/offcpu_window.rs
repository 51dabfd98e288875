//! `pstackctl capture --window`: the `ebpf:offcpu` surface observed between
//! the identity reads, on the real kernel (root: eBPF needs CAP_BPF +
//! CAP_PERFMON; the freezer needs the cgroup-v1 freezer hierarchy).
//!
//! Hostile cases first: an unprivileged caller, a kernel without BTF (a BTF
//! path that does not exist, through the real loader), nonsense windows; then
//! a frozen process (a D episode bound to `ebpf:offcpu`) and a sleeping one
//! (S time, no D episode).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use pstack_capture::process::{OffCpuSource, Target};
use pstack_capture::request::RequestError;
use pstack_envelope::{ClaimKind, Completeness, Envelope, Scope, Surface, SurfaceStatus};
use serde_json::Value;

use crate::bad_input::{as_nobody, no_panic, pstackctl};
use crate::fixtures::{Freezer, Proc, budget, config, is_root, surface, wait_state, windowed};

const OFFCPU: &str = "ebpf:offcpu";

fn ok(s: &Surface) -> bool {
    matches!(s.status, SurfaceStatus::Ok | SurfaceStatus::Truncated)
}

/// Every claim citing `ebpf:offcpu` cites it only while it is ok/truncated.
fn claims_respect_status(env: &Envelope) {
    let s = surface(env, OFFCPU);
    for c in env
        .claims
        .iter()
        .filter(|c| c.surfaces.iter().any(|x| x == OFFCPU))
    {
        assert!(ok(s), "claim {c:?} cites a {} surface", s.status.as_str());
    }
}

/// `pstackctl capture <args> -o <dir>/out.json`, exit 0, verified envelope.
fn capture_cli(args: &[&str], dir: &Path) -> Envelope {
    let out = dir.join("out.json");
    let mut all: Vec<&str> = args.to_vec();
    let out_s = out.to_str().unwrap().to_string();
    all.extend(["-o", &out_s]);
    let o = pstackctl(&all, dir);
    no_panic(&o);
    assert_eq!(
        o.status.code(),
        Some(0),
        "stdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    pstack_testkit::verify(&std::fs::read(&out).unwrap()).expect("the envelope verifies")
}

fn arr<'a>(s: &'a Surface, key: &str) -> &'a [Value] {
    s.facts
        .get(key)
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
}

#[test]
fn root_window_as_nobody_gives_a_typed_permission_denied_offcpu_surface() {
    pstack_testkit::require!(is_root(), "needs root to drop to another user");
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .unwrap();
    // nobody's own process: the capture runs (like any unprivileged capture),
    // the eBPF surface is denied, typed, with a probe; nothing is claimed from it.
    let mut cmd = std::process::Command::new("sleep");
    std::os::unix::process::CommandExt::uid(&mut cmd, 65534);
    std::os::unix::process::CommandExt::gid(&mut cmd, 65534);
    let own = Proc(cmd.arg("1000").spawn().unwrap());
    assert!(wait_state(own.pid(), 'S'));
    let out = dir.path().join("n.json");
    let pid = own.pid().to_string();
    let o = as_nobody(
        &[
            "--pid",
            &pid,
            "--window",
            "300ms",
            "-o",
            out.to_str().unwrap(),
        ],
        dir.path(),
    );
    no_panic(&o);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let summary = String::from_utf8_lossy(&o.stdout);
    assert!(
        summary.contains("off-cpu:") && summary.contains("permission_denied"),
        "{summary}"
    );
    let env = pstack_testkit::verify(&std::fs::read(&out).unwrap()).unwrap();
    let s = surface(&env, OFFCPU);
    assert_eq!(s.status, SurfaceStatus::PermissionDenied, "{s:?}");
    assert!(s.facts.is_empty());
    assert!(s.cause.as_ref().is_some_and(|c| !c.message.is_empty()));
    assert_ne!(env.completeness, Completeness::Complete);
    claims_respect_status(&env);
    let u = env
        .unknowns
        .iter()
        .find(|u| u.surface.as_deref() == Some(OFFCPU))
        .expect("an unknown for the denied eBPF surface");
    assert!(
        u.probe.starts_with("sudo pstackctl capture --pid") && u.probe.contains("--window"),
        "{u:?}"
    );
}

/// A real `capture_blocking` against a BTF path that does not exist: the
/// loader's own `unsupported` path, not a stand-in.
struct NoBtf;

impl OffCpuSource for NoBtf {
    fn observe(&self, pid: u32, window: Duration) -> Vec<Surface> {
        let mut cfg = pstack_ebpf::EbpfConfig::offcpu(vec![pid]);
        cfg.btf_path = "/nonexistent/pstack-test/vmlinux".into();
        pstack_ebpf::capture_blocking(cfg, window)
    }
}

#[test]
fn window_without_kernel_btf_is_unsupported_with_an_unknown_and_no_facts() {
    let p = Proc::spawn("sleep", &["1000"]);
    assert!(wait_state(p.pid(), 'S'));
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config();
    cfg.offcpu = Some(Arc::new(NoBtf));
    let req = windowed(Target::Process { pid: p.pid() }, 2000, 10_000, 200).unwrap();
    let env = crate::fixtures::sealed_capture(&req, &cfg, &budget(dir.path(), 4)).unwrap();
    let env = pstack_testkit::verify(&serde_json::to_vec(&env).unwrap()).unwrap();
    let s = surface(&env, OFFCPU);
    assert_eq!(s.status, SurfaceStatus::Unsupported, "{s:?}");
    assert_eq!(env.completeness, Completeness::Partial);
    claims_respect_status(&env);
    assert!(
        !env.claims.iter().any(|c| c.code == "no_thread_in_d_state"),
        "no universal claim in a partial envelope"
    );
    let u = env
        .unknowns
        .iter()
        .find(|u| u.surface.as_deref() == Some(OFFCPU))
        .expect("an unknown for the unsupported eBPF surface");
    assert!(u.probe.contains("/sys/kernel/btf/vmlinux"), "{u:?}");
}

#[test]
fn nonsense_windows_are_refused_with_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let p = Proc::spawn("sleep", &["1000"]);
    let pid = p.pid().to_string();
    for (args, needle) in [
        (vec!["--host", "--window", "1s"], "cannot be used with"),
        (vec!["--pid", pid.as_str(), "--window", "0s"], "outside"),
        // Issue 19: `--window 5` was silently five seconds.
        (vec!["--pid", pid.as_str(), "--window", "5"], "has no unit"),
        (
            vec!["--pid", pid.as_str(), "--window", "5parsecs"],
            "unknown unit",
        ),
        (
            vec!["--pid", pid.as_str(), "--window", "abc"],
            "not a duration",
        ),
    ] {
        let o = pstackctl(&args, dir.path());
        no_panic(&o);
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(needle), "{args:?}: {err}");
    }
    // The library's validator refuses a window that does not fit in the
    // bundle deadline (at it, and just below it passes), and a window on a
    // host capture: the engine cannot be handed either.
    let pid = Target::Process { pid: p.pid() };
    match windowed(pid, 500, 1_000, 1_000) {
        Err(RequestError::OutOfRange {
            param: "window_ms",
            reason,
        }) => assert!(reason.contains("bundle deadline"), "{reason}"),
        other => panic!("{other:?}"),
    }
    windowed(pid, 500, 1_000, 999).expect("a window just inside the bundle deadline");
    match windowed(Target::Host, 500, 10_000, 100) {
        Err(RequestError::OutOfRange {
            param: "window_ms",
            reason,
        }) => assert!(reason.contains("not --host"), "{reason}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn root_window_on_a_frozen_process_shows_a_d_episode_bound_to_ebpf_offcpu() {
    pstack_testkit::require!(is_root(), "eBPF and the cgroup freezer need root");
    pstack_testkit::require!(
        pstack_testkit::freezer_mounted(),
        "cgroup-v1 freezer not mounted at /sys/fs/cgroup/freezer (scripts/setup.d/10-kernel.sh mounts it)"
    );
    let freezer = Freezer::new("offcpu-d").expect("a freezer cgroup under the mounted hierarchy");
    let p = Proc::spawn("sleep", &["1000"]);
    assert!(wait_state(p.pid(), 'S'));
    freezer.add(p.pid());
    freezer.freeze();
    assert!(wait_state(p.pid(), 'D'));
    let dir = tempfile::tempdir().unwrap();
    let pid = p.pid().to_string();
    let env = capture_cli(&["--pid", &pid, "--window", "2s"], dir.path());
    freezer.thaw();

    let s = surface(&env, OFFCPU);
    assert!(ok(s), "{s:?}");
    assert_eq!(s.facts["window_ms"], 2000);
    assert!(s.digest.is_some());
    let episodes: Vec<&Value> = arr(s, "d_episodes")
        .iter()
        .filter(|e| e["tid"] == p.pid())
        .collect();
    assert_eq!(episodes.len(), 1, "{:#?}", s.facts);
    let e = episodes[0];
    let dur = e["duration_ns"].as_u64().unwrap();
    // Frozen for the whole window: about 2 s (a lower bound: frozen before it).
    assert!(
        (1_800_000_000..=4_000_000_000).contains(&dur),
        "episode of {dur} ns"
    );
    assert_eq!(e["ongoing"], true, "{e}");
    // A fact bound to the eBPF surface, about this thread.
    let c = env
        .claims
        .iter()
        .find(|c| c.code == "d_state_episode")
        .expect("a D-episode claim");
    assert_eq!(c.kind, ClaimKind::Fact);
    assert_eq!(c.surfaces, vec![OFFCPU.to_string()]);
    assert!(
        c.statement.contains(&format!("thread {}", p.pid())),
        "{c:?}"
    );
    assert!(
        !env.claims
            .iter()
            .any(|c| c.code == "no_d_state_episode_in_window"),
        "{:#?}",
        env.claims
    );
    claims_respect_status(&env);
    // The window lies between the identity reads: inside the envelope's clock.
    let start: u64 = env.clock.monotonic_start_ns.parse().unwrap();
    let end: u64 = env.clock.monotonic_end_ns.parse().unwrap();
    let ep_start: u64 = e["start_monotonic_ns"].as_str().unwrap().parse().unwrap();
    assert!(
        end - start >= 2_000_000_000,
        "capture took {} ns",
        end - start
    );
    assert!(ep_start <= end);
}

#[test]
fn root_window_on_a_sleeping_thread_shows_s_time_and_no_d_episode() {
    pstack_testkit::require!(is_root(), "eBPF needs root");
    // Sleeps in 20 ms naps: every nap is a switch-out in S.
    let p = Proc::spawn("perl", &["-e", "select(undef, undef, undef, 0.02) while 1"]);
    assert!(wait_state(p.pid(), 'S'));
    let dir = tempfile::tempdir().unwrap();
    let tid = p.pid().to_string();
    let env = capture_cli(&["--tid", &tid, "--window", "1s"], dir.path());

    let s = surface(&env, OFFCPU);
    assert_eq!(s.status, SurfaceStatus::Ok, "{s:?}");
    let task = arr(s, "tasks")
        .iter()
        .find(|t| t["tid"] == p.pid())
        .unwrap_or_else(|| panic!("thread {} not among {:#?}", p.pid(), s.facts["tasks"]));
    let s_ns = task["off_cpu_ns"]["S"].as_u64().unwrap();
    let d_ns = task["off_cpu_ns"]["D"].as_u64().unwrap();
    assert!(s_ns >= 500_000_000, "S time {s_ns} ns in a 1 s window");
    assert_eq!(d_ns, 0);
    assert!(task["intervals"]["S"].as_u64().unwrap() >= 10, "{task}");
    assert!(
        !arr(s, "d_episodes").iter().any(|e| e["tid"] == p.pid()),
        "{:#?}",
        s.facts["d_episodes"]
    );
    assert!(!env.claims.iter().any(|c| c.code == "d_state_episode"));
    let t = env
        .claims
        .iter()
        .find(|c| c.code == "offcpu_time_in_window")
        .expect("an off-CPU time claim");
    assert_eq!(t.surfaces, vec![OFFCPU.to_string()]);
    assert!(t.statement.contains("S "), "{t:?}");
    if env.completeness == Completeness::Complete {
        let n = env
            .claims
            .iter()
            .find(|c| c.code == "no_d_state_episode_in_window")
            .expect("complete envelope: the universal no-D-episode claim");
        assert_eq!(n.scope, Scope::Universal);
        assert_eq!(n.surfaces, vec![OFFCPU.to_string()]);
    }
    claims_respect_status(&env);
}

#[test]
fn without_a_window_there_is_no_ebpf_surface() {
    let p = Proc::spawn("sleep", &["1000"]);
    let dir = tempfile::tempdir().unwrap();
    let env = capture_cli(&["--pid", &p.pid().to_string()], dir.path());
    assert!(
        !env.surfaces.iter().any(|s| s.id.starts_with("ebpf:")),
        "{:?}",
        env.surfaces.iter().map(|s| &s.id).collect::<Vec<_>>()
    );
    assert!(!env.claims.iter().any(|c| c.code.contains("offcpu")));
}

#[test]
fn root_window_on_one_thread_claims_only_that_thread() {
    pstack_testkit::require!(is_root(), "eBPF needs root");
    // A thread of this (multi-threaded) test process naps; the window watches
    // the whole process, the claims speak for the subject thread only.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (tx, rx) = std::sync::mpsc::channel();
    let napper = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            // SAFETY: gettid has no arguments and cannot fail.
            tx.send(unsafe { libc::gettid() } as u32).unwrap();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };
    let tid = rx.recv().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let req = windowed(Target::Thread { tid }, 2000, 10_000, 800).unwrap();
    let env = crate::fixtures::sealed_capture(&req, &config(), &budget(dir.path(), 4)).unwrap();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    napper.join().unwrap();
    let env = pstack_testkit::verify(&serde_json::to_vec(&env).unwrap()).unwrap();
    let s = surface(&env, OFFCPU);
    assert!(ok(s), "{s:?}");
    assert!(
        arr(s, "tasks").iter().any(|t| t["tid"] == tid),
        "{:#}",
        s.facts["tasks"]
    );
    let t = env
        .claims
        .iter()
        .find(|c| c.code == "offcpu_time_in_window")
        .expect("an off-CPU time claim");
    assert!(
        t.statement.contains(" 1 thread(s) of the subject"),
        "{}",
        t.statement
    );
    claims_respect_status(&env);
}
