//! pstackd's eBPF programs: loaded at start and kept attached, state and
//! counters in `/v1/status` and `/metrics`, lent to windowed captures (a
//! one-shot session when busy or disabled), and a failure to load is
//! reported, never fatal. Real kernel; loading needs root (CAP_BPF +
//! CAP_PERFMON), so tests that expect `running` say `root_` and skip without it.

use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use pstack_capture::request::{CaptureRequest, ProcessRequest, RequestedDeadlines};
use pstack_envelope::{Envelope, SurfaceStatus};
use pstackctl::client;

use crate::common::{Daemon, Settings, is_root, wait_until};

/// The status once the background load has finished (running or failed).
fn settled(d: &Daemon) -> serde_json::Value {
    d.wait_status(Duration::from_secs(20), "the eBPF load to finish", |s| {
        s["ebpf"]["state"] != "loading"
    })
}

/// A process napping 20 ms at a time (each nap a switch-out in S); killed on drop.
struct Napper(Child);

impl Napper {
    fn spawn() -> Napper {
        Napper(
            Command::new("perl")
                .args(["-e", "select(undef, undef, undef, 0.02) while 1"])
                .stdin(Stdio::null())
                .spawn()
                .expect("spawn perl"),
        )
    }
    fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Napper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn windowed(d: &Daemon, pid: u32, window_ms: u64) -> Envelope {
    let body = CaptureRequest::Process(ProcessRequest {
        pid,
        deadlines: RequestedDeadlines {
            surface_ms: Some(1_000),
            bundle_ms: Some(window_ms + 3_000),
        },
        window_ms: Some(window_ms),
        ..Default::default()
    });
    let env =
        client::capture_via_socket(&d.socket, &body, Duration::from_millis(window_ms + 10_000))
            .unwrap_or_else(|e| panic!("windowed capture: {e}\nlog:\n{}", d.log_text()));
    pstack_testkit::check_envelope(&env);
    env
}

fn offcpu(env: &Envelope) -> &pstack_envelope::Surface {
    env.surfaces
        .iter()
        .find(|s| s.id == "ebpf:offcpu")
        .expect("an ebpf:offcpu surface")
}

/// Some loopback TCP connections (state changes for the TCP programs).
fn tcp_traffic() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    for _ in 0..3 {
        let c = TcpStream::connect(addr).unwrap();
        let (s, _) = l.accept().unwrap();
        drop(c);
        drop(s);
    }
}

#[test]
fn root_status_and_metrics_show_attached_programs_and_live_counters() {
    pstack_testkit::require!(is_root(), "loading eBPF programs needs root");
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(dir.path(), &Settings::default());
    let s = settled(&d);
    let e = &s["ebpf"];
    assert_eq!(e["state"], "running", "{e:#}\nlog:\n{}", d.log_text());
    let programs = e["programs"].as_array().unwrap();
    assert_eq!(programs.len(), 6, "{e:#}");
    assert!(programs.iter().all(|p| p["attached"] == true));
    for tp in [
        "sched/sched_switch",
        "tcp/tcp_retransmit_skb",
        "sock/inet_sock_set_state",
    ] {
        assert!(programs.iter().any(|p| p["tracepoint"] == tp), "{tp}");
    }
    assert!(e["offcpu"]["lost_ring"].is_u64());
    tcp_traffic();
    let s = d.wait_status(Duration::from_secs(5), "TCP state events counted", |s| {
        s["ebpf"]["tcp_events"]["state"].as_u64().unwrap_or(0) >= 6
    });
    // Drained every second: nothing is lost at this rate.
    assert_eq!(s["ebpf"]["tcp_lost"]["state"], 0, "{:#}", s["ebpf"]);
    assert_eq!(d.metric("pstackd_ebpf_up{state=\"running\"}"), 1);
    assert!(d.metric("pstackd_ebpf_tcp_events_total{kind=\"state\"}") >= 6);
    assert_eq!(
        d.metric("pstackd_ebpf_tcp_lost_events_total{kind=\"state\"}"),
        0
    );
    assert_eq!(
        d.metric(
            "pstackd_ebpf_program_attached{program=\"pstack_sched_switch\",tracepoint=\"sched/sched_switch\"}"
        ),
        1
    );
    assert_eq!(d.metric("pstackd_ebpf_offcpu_watched_processes"), 0);
    assert!(d.log_text().contains("eBPF programs attached"));
}

#[test]
fn root_windowed_captures_borrow_the_running_session_and_fall_back_when_busy() {
    pstack_testkit::require!(is_root(), "loading eBPF programs needs root");
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(dir.path(), &Settings::default());
    assert_eq!(settled(&d)["ebpf"]["state"], "running");
    let p = Napper::spawn();
    let env = windowed(&d, p.pid(), 1_000);
    let s = offcpu(&env);
    assert_eq!(s.status, SurfaceStatus::Ok, "{s:?}");
    let task = s.facts["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["tid"] == p.pid())
        .unwrap_or_else(|| panic!("{:#}", s.facts["tasks"]));
    assert!(
        task["off_cpu_ns"]["S"].as_u64().unwrap() >= 500_000_000,
        "{task}"
    );
    assert!(
        env.claims
            .iter()
            .any(|c| c.code == "offcpu_time_in_window" && c.surfaces == ["ebpf:offcpu"])
    );
    assert_eq!(
        d.metric("pstackd_ebpf_windows_total{session=\"shared\"}"),
        1
    );
    assert_eq!(
        d.metric("pstackd_ebpf_windows_total{session=\"one_shot\"}"),
        0
    );
    // The subject is unwatched again; its switches were counted.
    let st = d.status();
    assert_eq!(st["ebpf"]["offcpu"]["watched"], 0, "{:#}", st["ebpf"]);
    assert!(st["ebpf"]["offcpu"]["switches"].as_u64().unwrap() >= 10);

    // Two at once: one borrows the session, the other loads its own; both ok.
    let q = Napper::spawn();
    let (a, b) = std::thread::scope(|sc| {
        let a = sc.spawn(|| windowed(&d, p.pid(), 1_500));
        let b = sc.spawn(|| windowed(&d, q.pid(), 1_500));
        (a.join().unwrap(), b.join().unwrap())
    });
    assert_eq!(offcpu(&a).status, SurfaceStatus::Ok);
    assert_eq!(offcpu(&b).status, SurfaceStatus::Ok);
    assert_eq!(
        d.metric("pstackd_ebpf_windows_total{session=\"shared\"}"),
        2
    );
    assert_eq!(
        d.metric("pstackd_ebpf_windows_total{session=\"one_shot\"}"),
        1
    );
}

#[test]
fn ebpf_disabled_by_config_is_reported_and_windows_load_their_own_session() {
    let dir = tempfile::tempdir().unwrap();
    let settings = Settings {
        extra: "[ebpf]\nenabled = false\n".into(),
        ..Settings::default()
    };
    let d = Daemon::start(dir.path(), &settings);
    let s = d.status();
    assert_eq!(s["ebpf"]["state"], "disabled", "{:#}", s["ebpf"]);
    assert!(s["ebpf"]["programs"].as_array().unwrap().is_empty());
    assert_eq!(d.metric("pstackd_ebpf_up{state=\"disabled\"}"), 0);
    let p = Napper::spawn();
    let env = windowed(&d, p.pid(), 300);
    let s = offcpu(&env);
    if is_root() {
        assert_eq!(s.status, SurfaceStatus::Ok, "{s:?}");
    } else {
        assert_eq!(s.status, SurfaceStatus::PermissionDenied, "{s:?}");
    }
    assert_eq!(
        d.metric("pstackd_ebpf_windows_total{session=\"one_shot\"}"),
        1
    );
    assert_eq!(
        d.metric("pstackd_ebpf_windows_total{session=\"shared\"}"),
        0
    );
}

#[test]
fn root_daemon_as_nobody_reports_ebpf_permission_denied_and_keeps_serving() {
    pstack_testkit::require!(is_root(), "needs root to start pstackd as another user");
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .unwrap();
    let d = Daemon::start_with(dir.path(), &Settings::default(), |cmd| {
        std::os::unix::process::CommandExt::uid(cmd, 65534);
        std::os::unix::process::CommandExt::gid(cmd, 65534);
    });
    let s = settled(&d);
    assert_eq!(
        s["ebpf"]["state"],
        "permission_denied",
        "{:#}\nlog:\n{}",
        s["ebpf"],
        d.log_text()
    );
    assert!(
        s["ebpf"]["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{:#}",
        s["ebpf"]
    );
    assert_eq!(d.metric("pstackd_ebpf_up{state=\"permission_denied\"}"), 0);
    assert!(d.log_text().contains("eBPF programs not loaded"));
    // Still serving captures: nobody's own process, the eBPF surface typed.
    let mut cmd = Command::new("perl");
    cmd.args(["-e", "select(undef, undef, undef, 0.02) while 1"]);
    std::os::unix::process::CommandExt::uid(&mut cmd, 65534);
    std::os::unix::process::CommandExt::gid(&mut cmd, 65534);
    let p = Napper(cmd.stdin(Stdio::null()).spawn().unwrap());
    wait_until(Duration::from_secs(5), "the napper runs", || {
        std::fs::read_to_string(format!("/proc/{}/comm", p.pid())).is_ok_and(|c| c.trim() == "perl")
    });
    let env = windowed(&d, p.pid(), 300);
    let s = offcpu(&env);
    assert_eq!(s.status, SurfaceStatus::PermissionDenied, "{s:?}");
    assert!(
        env.unknowns
            .iter()
            .any(|u| u.surface.as_deref() == Some("ebpf:offcpu"))
    );
    assert!(
        !env.claims
            .iter()
            .any(|c| c.surfaces.iter().any(|x| x == "ebpf:offcpu"))
    );
}

/// `promtool check metrics` (Prometheus's own linter, Debian `prometheus`) as the oracle
/// for the live `/metrics` of a daemon with every family present (eBPF running, off-CPU
/// counters, spool, shipping): it must parse and lint clean, with the exposition's
/// content type.
#[test]
fn root_live_metrics_pass_promtool_check_metrics() {
    pstack_testkit::require!(
        is_root(),
        "every eBPF family is present only when loading eBPF works (root)"
    );
    pstack_testkit::require!(
        pstack_testkit::have_tool("promtool"),
        "promtool is not installed (scripts/setup.d/60-oracles.sh installs Debian's prometheus)"
    );
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(dir.path(), &Settings::default());
    let s = settled(&d);
    assert_eq!(s["ebpf"]["state"], "running", "{:#}", s["ebpf"]);
    tcp_traffic();
    let resp = client::request(&d.socket, "GET", "/metrics", None, Duration::from_secs(5))
        .expect("GET /metrics");
    assert_eq!(resp.status, 200);
    let ctype = resp
        .headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("content-type"))
        .map(|(_, v)| v.as_str());
    assert_eq!(ctype, Some("text/plain; version=0.0.4; charset=utf-8"));
    let text = String::from_utf8(resp.body).expect("utf-8 exposition");
    for family in [
        "pstackd_ebpf_up",
        "pstackd_ebpf_offcpu_lost_total",
        "pstackd_captures_total",
    ] {
        assert!(
            text.contains(&format!("# HELP {family} ")),
            "{family} in:\n{text}"
        );
    }
    let verdict = pstack_testkit::promtool_check_metrics(&text);
    assert!(
        verdict.is_ok(),
        "promtool check metrics:\n{}\n--- /metrics:\n{text}",
        verdict.unwrap_err()
    );
}
