//! Watch rules end to end: the real pstackd samples real kernel state
//! (tasks frozen by a cgroup-v1 freezer show `D`), captures on its own, and
//! the sealed envelope reaches a real `pstack-store` carrying the rule in
//! `collector.trigger`. Limits, suppression counters, reload refusal and an
//! unavailable source are checked through `/v1/status`, `/metrics`
//! (promtool) and `pstackctl watch`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::common::*;

static SEQ: AtomicU32 = AtomicU32::new(0);

/// Processes in a FROZEN cgroup-v1 freezer cgroup (state `D`); thawed,
/// killed and removed on drop.
struct Frozen {
    dir: PathBuf,
    sleepers: Vec<Sleeper>,
}

impl Frozen {
    fn new(n: usize) -> Option<Frozen> {
        let root = Path::new(pstack_testkit::FREEZER);
        if !pstack_testkit::precondition(
            pstack_testkit::is_root() && pstack_testkit::freezer_mounted(),
            "needs root and the cgroup-v1 freezer at /sys/fs/cgroup/freezer (scripts/setup.d mounts it)",
        ) {
            return None;
        }
        let dir = root.join(format!(
            "pstack-watch-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::SeqCst)
        ));
        std::fs::create_dir(&dir).unwrap();
        let sleepers: Vec<Sleeper> = (0..n).map(|_| Sleeper::spawn()).collect();
        for s in &sleepers {
            std::fs::write(dir.join("cgroup.procs"), s.pid().to_string()).unwrap();
        }
        Some(Frozen { dir, sleepers })
    }

    fn pids(&self) -> Vec<u32> {
        self.sleepers.iter().map(Sleeper::pid).collect()
    }

    fn set(&self, state: &str) {
        std::fs::write(self.dir.join("freezer.state"), state).unwrap();
        wait_until(Duration::from_secs(5), state, || {
            std::fs::read_to_string(self.dir.join("freezer.state")).is_ok_and(|s| s.trim() == state)
        });
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        let _ = std::fs::write(self.dir.join("freezer.state"), "THAWED");
        for s in &mut self.sleepers {
            let _ = s.0.kill();
            let _ = s.0.wait();
        }
        let _ = std::fs::remove_dir(&self.dir);
    }
}

fn d_state_rule(name: &str, min_seconds: u64, extra: &str) -> String {
    format!(
        "[[watch]]\nname = \"{name}\"\nkind = \"d_state\"\nmin_seconds = {min_seconds}\nwindow = \"0\"\n{extra}\n"
    )
}

#[test]
fn a_task_in_d_longer_than_t_is_captured_and_reaches_the_store_shorter_is_not() {
    let Some(short) = Frozen::new(1) else { return };
    let Some(long) = Frozen::new(1) else { return };
    let dir = tempfile::tempdir().unwrap();
    let store = StoreProc::start(dir.path());
    let settings = Settings {
        collector_url: Some(format!("http://{}", store.addr)),
        api_key: Some(store.key.clone()),
        extra_capture: String::new(),
        ..Settings::default()
    };
    let mut text = settings.toml(dir.path());
    text.push_str(&d_state_rule("stuck-io", 3, ""));
    let d = start_with_text(dir.path(), &settings, &text);
    wait_until(Duration::from_secs(10), "the rule is armed", || {
        d.watch_rule("stuck-io")["state"] == "armed"
    });

    // Shorter than T: in D for about 1.5 s, then thawed.
    let short_pid = short.pids()[0];
    short.set("FROZEN");
    std::thread::sleep(Duration::from_millis(1500));
    short.set("THAWED");
    // Longer than T.
    let long_pid = long.pids()[0];
    let frozen_at = Instant::now();
    long.set("FROZEN");
    let captured = d.wait_captured(Duration::from_secs(30), "the long D task", |e| {
        e["subject"]
            .as_str()
            .is_some_and(|s| s.starts_with(&format!("process:{long_pid}:")))
    });
    let digest = captured["envelopes"][0].as_str().unwrap().to_string();
    let took = frozen_at.elapsed();
    assert!(took >= Duration::from_secs(3), "fired before T: {took:?}");
    // Nothing ever fired for the short episode.
    let all = d.watch_events();
    assert!(
        !all.iter().any(|e| e["subject"]
            .as_str()
            .is_some_and(|s| s.starts_with(&format!("process:{short_pid}:")))),
        "a D state shorter than T fired: {all:#?}"
    );
    // The envelope reaches the store with no operator action.
    let env = store.envelope(&digest);
    let t = env
        .collector
        .trigger
        .as_ref()
        .expect("a triggered capture says so");
    assert_eq!((t.rule.as_str(), t.kind.as_str()), ("stuck-io", "d_state"));
    assert_eq!(t.condition["pid"], long_pid.to_string());
    let d_ms: u64 = t.condition["d_state_ms"].parse().unwrap();
    assert!(d_ms >= 3000, "{:?}", t.condition);
    match &env.subject {
        pstack_envelope::Subject::Process(p) => assert_eq!(p.pid, long_pid),
        other => panic!("not a process envelope: {other:?}"),
    }
    // Kernel stacks of the frozen task are among its surfaces.
    assert!(
        env.surfaces.iter().any(|s| s.id.contains("stack")),
        "{:?}",
        env.surfaces.iter().map(|s| &s.id).collect::<Vec<_>>()
    );
    let r = d.watch_rule("stuck-io");
    assert!(r["captured_total"].as_u64().unwrap() >= 1, "{r:#}");
    assert!(r["last_fired"].is_string(), "{r:#}");
    // pstackctl watch lists it.
    let out = Command::new(pstackctl_bin())
        .args(["watch", "--socket"])
        .arg(&d.socket)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("stuck-io") && text.contains("d_state armed"),
        "{text}"
    );
}

/// pstackd started with the config `text` (a [`Settings`] rendering plus rules).
fn start_with_text(dir: &Path, settings: &Settings, text: &str) -> Daemon {
    // Daemon::start writes settings.toml(dir); put the rules in after it by
    // starting with a tweak that rewrites the file first.
    let text = text.to_string();
    let path = dir.join("pstackd.toml");
    Daemon::start_with(dir, settings, move |_| {
        std::fs::write(&path, &text).unwrap();
    })
}

#[test]
fn a_storm_is_bounded_by_the_limits_and_the_rest_counted() {
    let Some(storm) = Frozen::new(12) else { return };
    let dir = tempfile::tempdir().unwrap();
    let settings = Settings::default();
    let mut text = settings.toml(dir.path());
    text.push_str(&d_state_rule(
        "storm",
        2,
        "max_per_hour = 3\nmax_per_subject_per_hour = 1",
    ));
    let d = start_with_text(dir.path(), &settings, &text);
    storm.set("FROZEN");
    let pids = storm.pids();
    let ours = |e: &Value| {
        e["subject"]
            .as_str()
            .and_then(|s| s.split(':').nth(1))
            .and_then(|p| p.parse::<u32>().ok())
            .is_some_and(|p| pids.contains(&p))
    };
    wait_until(
        Duration::from_secs(30),
        "every frozen process fired",
        || {
            d.watch_events()
                .iter()
                .filter(|e| e["event"] == "fired" && ours(e))
                .count()
                >= pids.len()
        },
    );
    wait_until(Duration::from_secs(30), "captures finish", || {
        d.watch_rule("storm")["captures_running"].is_null()
            && d.status()["watch"]["captures_running"] == 0
    });
    let r = d.watch_rule("storm");
    let (captured, failed) = (
        r["captured_total"].as_u64().unwrap(),
        r["failed_total"].as_u64().unwrap(),
    );
    assert!(
        captured + failed <= 3,
        "more captures than max_per_hour: {r:#}"
    );
    let fired = r["fired_total"].as_u64().unwrap();
    let suppressed = r["suppressed_total"].as_u64().unwrap();
    assert_eq!(
        fired,
        captured + failed + suppressed,
        "every firing accounted for: {r:#}"
    );
    assert!(suppressed >= pids.len() as u64 - 3, "{r:#}");
    let metrics = d.metric_text();
    pstack_testkit::promtool_check_metrics(&metrics).expect("promtool accepts /metrics");
    let limited = d.metric("pstackd_watch_suppressed_total{rule=\"storm\",kind=\"d_state\",reason=\"rate_limit_rule\"}");
    assert!(limited >= 1, "{metrics}");
    // The counter agrees with the status (it can only have grown since).
    assert!(d.metric("pstackd_watch_fired_total{rule=\"storm\",kind=\"d_state\"}") >= fired);
}

#[test]
fn a_bad_rule_on_reload_is_refused_naming_it_and_the_running_set_stays() {
    let dir = tempfile::tempdir().unwrap();
    let settings = Settings::default();
    let base = settings.toml(dir.path());
    let good = format!("{base}{}", d_state_rule("first", 5, ""));
    let d = start_with_text(dir.path(), &settings, &good);
    wait_until(Duration::from_secs(10), "first is listed", || {
        d.status()["watch"]["rules"]
            .as_array()
            .is_some_and(|r| r.len() == 1)
    });
    let rejected = d.metric("pstackd_reloads_total{result=\"rejected\"}");
    let bad = format!(
        "{good}[[watch]]\nname = \"broken-rule\"\nkind = \"d_state\"\nports = \"10000-20000\"\n"
    );
    std::fs::write(dir.path().join("pstackd.toml"), bad).unwrap();
    d.signal(libc::SIGHUP);
    wait_until(Duration::from_secs(10), "the reload is rejected", || {
        d.metric("pstackd_reloads_total{result=\"rejected\"}") > rejected
    });
    let log = d.log_text();
    assert!(
        log.contains("broken-rule") && log.contains("ports"),
        "{log}"
    );
    std::thread::sleep(Duration::from_millis(1500)); // a tick or more
    let names: Vec<Value> = d.status()["watch"]["rules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].clone())
        .collect();
    assert_eq!(names, vec![Value::from("first")]);
    // A good change applies.
    let two = format!("{good}{}", d_state_rule("second", 7, ""));
    std::fs::write(dir.path().join("pstackd.toml"), two).unwrap();
    d.signal(libc::SIGHUP);
    wait_until(Duration::from_secs(10), "second is listed", || {
        d.status()["watch"]["rules"]
            .as_array()
            .is_some_and(|r| r.len() == 2)
    });
}

#[test]
fn tcp_rules_without_btf_are_unavailable_with_the_reason_and_d_state_still_fires() {
    let Some(frozen) = Frozen::new(1) else { return };
    let dir = tempfile::tempdir().unwrap();
    let settings = Settings::default();
    let mut text = settings.toml(dir.path());
    text.push_str(&d_state_rule("stuck", 2, ""));
    text.push_str("[[watch]]\nname = \"resets\"\nkind = \"tcp_reset\"\n");
    text.push_str("[[watch]]\nname = \"rtos\"\nkind = \"tcp_rto\"\nports = \"9500-9510\"\n");
    // No BTF: the TOML gets an [ebpf] table pointing at a file that is not there.
    text.push_str(&format!(
        "\n[ebpf]\nbtf_path = \"{}\"\n",
        dir.path().join("no-btf").display()
    ));
    let d = start_with_text(dir.path(), &settings, &text);
    wait_until(Duration::from_secs(15), "the tcp rules settle", || {
        d.watch_rule("resets")["state"] == "unavailable"
            && d.watch_rule("resets")["reason"] != "starting"
    });
    for name in ["resets", "rtos"] {
        let r = d.watch_rule(name);
        assert_eq!(r["state"], "unavailable", "{r:#}");
        assert!(r["reason"].as_str().unwrap().contains("BTF"), "{r:#}");
    }
    assert_eq!(
        d.metric("pstackd_watch_rule_armed{rule=\"resets\",kind=\"tcp_reset\"}"),
        0
    );
    assert_eq!(
        d.metric("pstackd_watch_rule_armed{rule=\"stuck\",kind=\"d_state\"}"),
        1
    );
    let out = Command::new(pstackctl_bin())
        .args(["status", "--socket"])
        .arg(&d.socket)
        .output()
        .unwrap();
    let status = String::from_utf8_lossy(&out.stdout);
    assert!(
        status.contains("UNAVAILABLE") && status.contains("BTF"),
        "{status}"
    );
    frozen.set("FROZEN");
    let pid = frozen.pids()[0];
    wait_until(
        Duration::from_secs(20),
        "the d_state rule still captures",
        || {
            d.watch_events().iter().any(|e| {
                e["event"] == "captured"
                    && e["subject"]
                        .as_str()
                        .is_some_and(|s| s.starts_with(&format!("process:{pid}:")))
            })
        },
    );
}

/// A listener on loopback whose accept queue holds one connection and is
/// never accepted from: every connection past it overflows
/// (`TcpExt.ListenOverflows`).
fn overflowing_listener() -> (std::os::fd::OwnedFd, SocketAddr) {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    // SAFETY: socket(2) with constant arguments; checked below, then owned.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    assert!(fd >= 0);
    // SAFETY: fd is a fresh socket nobody else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let addr = libc::sockaddr_in {
        sin_family: libc::AF_INET as u16,
        sin_port: 0,
        sin_addr: libc::in_addr {
            s_addr: u32::from_ne_bytes([127, 0, 0, 1]),
        },
        sin_zero: [0; 8],
    };
    // SAFETY: valid fd, address pointer and length.
    let rc = unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (&addr as *const libc::sockaddr_in).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as u32,
        )
    };
    assert_eq!(rc, 0);
    // SAFETY: valid fd.
    assert_eq!(unsafe { libc::listen(fd.as_raw_fd(), 0) }, 0);
    let mut bound: libc::sockaddr_in = addr;
    let mut len = std::mem::size_of::<libc::sockaddr_in>() as u32;
    // SAFETY: valid fd, out pointer and length.
    let rc = unsafe {
        libc::getsockname(
            fd.as_raw_fd(),
            (&mut bound as *mut libc::sockaddr_in).cast(),
            &mut len,
        )
    };
    assert_eq!(rc, 0);
    let port = u16::from_be(bound.sin_port);
    (fd, SocketAddr::from(([127, 0, 0, 1], port)))
}

#[test]
fn a_listen_queue_overflow_faster_than_the_threshold_captures_the_host() {
    if !pstack_testkit::precondition(pstack_testkit::is_root(), "needs root (host capture)") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let settings = Settings::default();
    let mut text = settings.toml(dir.path());
    text.push_str(
        "[[watch]]\nname = \"backlog\"\nkind = \"listen_overflow\"\nthreshold_per_second = 5\n",
    );
    let d = start_with_text(dir.path(), &settings, &text);
    wait_until(Duration::from_secs(10), "the rule is armed", || {
        d.watch_rule("backlog")["state"] == "armed"
    });
    std::thread::sleep(Duration::from_millis(1500)); // a first sample as the base
    let before = listen_overflows();
    let (_listener, addr) = overflowing_listener();
    // Connections the full queue cannot take: each completed handshake the
    // kernel drops counts one overflow (and the client retries its ACK).
    let clients: Vec<_> = (0..60)
        .map(|_| {
            std::thread::spawn(move || {
                std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(3))
            })
        })
        .collect();
    wait_until(
        Duration::from_secs(20),
        "the rule captures the host",
        || {
            d.watch_events()
                .iter()
                .any(|e| e["event"] == "captured" && e["rule"] == "backlog")
        },
    );
    for c in clients {
        let _ = c.join();
    }
    let e = d
        .watch_events()
        .into_iter()
        .find(|e| e["event"] == "fired" && e["rule"] == "backlog")
        .unwrap();
    assert_eq!(e["condition"]["counter"], "TcpExt.ListenOverflows", "{e:#}");
    let per_s: f64 = e["condition"]["per_second"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(per_s >= 5.0, "{e:#}");
    // The reading is the kernel's ListenOverflows (read here independently).
    let value: u64 = e["condition"]["value"].as_str().unwrap().parse().unwrap();
    let after = listen_overflows();
    assert!(
        (before..=after).contains(&value),
        "{before} <= {value} <= {after}: {e:#}"
    );
    let digest = d.watch_rule("backlog")["last_envelope"]
        .as_str()
        .unwrap()
        .to_string();
    let env = client_envelope(&d, &digest);
    assert!(matches!(env.subject, pstack_envelope::Subject::Host(_)));
    assert_eq!(env.collector.trigger.unwrap().kind, "listen_overflow");
}

/// An envelope pstackd spooled, by digest.
fn client_envelope(d: &Daemon, digest: &str) -> pstack_envelope::Envelope {
    let resp = pstackctl::client::request(
        &d.socket,
        "GET",
        &format!("/v1/envelopes/{digest}"),
        None,
        Duration::from_secs(5),
    )
    .unwrap();
    assert_eq!(resp.status, 200);
    pstack_testkit::verify(&resp.body).expect("spooled envelope verifies")
}

/// `TcpExt.ListenOverflows` of this netns, parsed here from /proc/net/netstat.
fn listen_overflows() -> u64 {
    let text = std::fs::read_to_string("/proc/net/netstat").unwrap();
    let lines: Vec<&str> = text.lines().filter(|l| l.starts_with("TcpExt:")).collect();
    let names: Vec<&str> = lines[0].split_whitespace().collect();
    let values: Vec<&str> = lines[1].split_whitespace().collect();
    let i = names.iter().position(|n| *n == "ListenOverflows").unwrap();
    values[i].parse().unwrap()
}

#[test]
fn an_open_watch_follower_does_not_hold_the_drain() {
    let dir = tempfile::tempdir().unwrap();
    let settings = Settings {
        drain_timeout_ms: 10_000,
        ..Settings::default()
    };
    let mut text = settings.toml(dir.path());
    text.push_str(&d_state_rule("quiet", 30, ""));
    let mut d = start_with_text(dir.path(), &settings, &text);
    let mut follower = Command::new(pstackctl_bin())
        .args(["watch", "--follow", "--socket"])
        .arg(&d.socket)
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500)); // the stream is open
    let (status, took) = d.terminate(Duration::from_secs(15));
    assert_eq!(status.code(), Some(0), "{}", d.log_text());
    assert!(
        took < Duration::from_secs(3),
        "the drain waited {took:?} for the event stream\n{}",
        d.log_text()
    );
    assert!(
        !d.log_text().contains("drain bound reached"),
        "{}",
        d.log_text()
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    let st = loop {
        if let Some(st) = follower.try_wait().unwrap() {
            break st;
        }
        assert!(
            Instant::now() < deadline,
            "pstackctl watch --follow did not end with the daemon"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(st.code(), Some(0), "the stream ended cleanly");
}

/// A loopback server answering every request with `body` (shared, so the
/// test can turn it into a real answer), `Connection: close`.
fn canned_server(body: std::sync::Arc<std::sync::Mutex<(String, String)>>) -> SocketAddr {
    use std::io::{Read, Write};
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { continue };
            let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf);
            let (ctype, b) = body.lock().unwrap().clone();
            let _ = write!(
                s,
                "HTTP/1.1 200 OK\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{b}",
                b.len()
            );
        }
    });
    addr
}

/// A Longhorn manager that is down, or answers an HTML page, makes the
/// `longhorn_rebuild` rule `degraded` with the reason: nothing fires and
/// no envelope is made. A manager that answers the list again re-arms it.
#[test]
fn a_longhorn_manager_that_is_down_or_answers_garbage_degrades_the_rule_without_an_event() {
    let dir = tempfile::tempdir().unwrap();
    // A loopback port nothing listens on (bound, then released).
    let down = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let html = std::sync::Arc::new(std::sync::Mutex::new((
        "text/html".to_string(),
        "<!DOCTYPE html><html><body>Longhorn UI</body></html>".to_string(),
    )));
    let ui = canned_server(html.clone());
    let settings = Settings::default();
    let mut text = settings.toml(dir.path());
    for (name, addr) in [("lh-down", down), ("lh-ui", ui)] {
        text.push_str(&format!(
            "[[watch]]\nname = \"{name}\"\nkind = \"longhorn_rebuild\"\nmanager_url = \"http://{addr}\"\npoll_seconds = 1\nnode = \"node-t\"\n"
        ));
    }
    let d = start_with_text(dir.path(), &settings, &text);
    // The rules appear in the status at pstackd's first watch tick, which
    // may come after the socket answers: absent counts as not yet.
    wait_until(Duration::from_secs(15), "both rules degraded", || {
        let s = d.status();
        let state = |name: &str| {
            s["watch"]["rules"]
                .as_array()
                .and_then(|rs| rs.iter().find(|r| r["name"] == name))
                .map(|r| r["state"].clone())
        };
        state("lh-down").is_some_and(|v| v == "degraded")
            && state("lh-ui").is_some_and(|v| v == "degraded")
    });
    let r = d.watch_rule("lh-down");
    let reason = r["reason"].as_str().unwrap();
    assert!(
        reason.contains("did not answer the volume list") && reason.contains(&down.to_string()),
        "{reason}"
    );
    assert_eq!(r["longhorn"]["manager"]["state"], "degraded", "{r:#}");
    let r = d.watch_rule("lh-ui");
    let reason = r["reason"].as_str().unwrap();
    assert!(
        reason.contains("garbage") && reason.contains("HTML page"),
        "{reason}"
    );
    // Still degraded after more polls, and never an event or an envelope.
    wait_until(Duration::from_secs(30), "three polls of each rule", || {
        ["lh-down", "lh-ui"]
            .iter()
            .all(|n| d.watch_rule(n)["longhorn"]["manager"]["polls"].as_u64() >= Some(3))
    });
    for name in ["lh-down", "lh-ui"] {
        let r = d.watch_rule(name);
        assert_eq!(r["state"], "degraded", "{r:#}");
        assert!(
            r["longhorn"]["manager"]["polls"].as_u64().unwrap() >= 2,
            "{r:#}"
        );
        assert_eq!(r["fired_total"], 0, "{r:#}");
        assert_eq!(r["captured_total"], 0, "{r:#}");
    }
    let events = d.watch_events();
    assert!(
        !events.iter().any(|e| [
            "fired",
            "started",
            "captured",
            "rebuild_started",
            "rebuild_ended"
        ]
        .contains(&e["event"].as_str().unwrap_or(""))),
        "{events:#?}"
    );
    assert_eq!(
        events.iter().filter(|e| e["event"] == "degraded").count(),
        2,
        "degraded is said once per rule, not every poll: {events:#?}"
    );
    let spooled = std::fs::read_dir(dir.path().join("spool"))
        .map(|r| {
            r.filter_map(Result::ok)
                .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
                .count()
        })
        .unwrap_or(0);
    assert_eq!(spooled, 0, "no envelope from a bad manager");
    // The manager answers the list again: armed.
    *html.lock().unwrap() = (
        "application/json".into(),
        r#"{"type":"collection","resourceType":"volume","data":[]}"#.into(),
    );
    wait_until(Duration::from_secs(10), "lh-ui re-armed", || {
        d.watch_rule("lh-ui")["state"] == "armed"
    });
}
