//! systemd integration and signals: sd_notify, watchdog, SIGHUP reload,
//! SIGTERM drain, socket activation.

use std::os::unix::net::{UnixDatagram, UnixListener};
use std::time::{Duration, Instant};

use pstackctl::client;

use super::common::*;

fn recv_until(sock: &UnixDatagram, within: Duration, want: &str) -> Vec<(Instant, String)> {
    let deadline = Instant::now() + within;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while Instant::now() < deadline {
        sock.set_read_timeout(Some(
            (deadline - Instant::now()).max(Duration::from_millis(1)),
        ))
        .unwrap();
        match sock.recv(&mut buf) {
            Ok(n) => {
                let msg = String::from_utf8_lossy(&buf[..n]).to_string();
                let done = msg.lines().any(|l| l == want);
                got.push((Instant::now(), msg));
                if done {
                    break;
                }
            }
            Err(_) => break,
        }
    }
    got
}

fn collect_for(sock: &UnixDatagram, dur: Duration) -> Vec<(Instant, String)> {
    recv_until(sock, dur, "\u{0}never")
}

#[test]
fn sd_notify_ready_after_serving_watchdog_at_half_interval_stops_when_sigstopped() {
    let dir = tempfile::tempdir().unwrap();
    let notify_path = dir.path().join("notify.sock");
    let notify = UnixDatagram::bind(&notify_path).unwrap();
    let watchdog_usec = 400_000u64; // pings expected every ~200 ms
    let mut d = Daemon::start_with(dir.path(), &Settings::default(), |cmd| {
        cmd.env("NOTIFY_SOCKET", &notify_path)
            .env("WATCHDOG_USEC", watchdog_usec.to_string());
    });
    let first = recv_until(&notify, Duration::from_secs(10), "READY=1");
    let ready = first
        .iter()
        .find(|(_, m)| m.lines().any(|l| l == "READY=1"))
        .expect("READY=1");
    assert!(ready.1.contains("STATUS=serving on"), "{}", ready.1);
    // Ready means serving: a request right now is answered.
    client::status(&d.socket, Duration::from_secs(2)).expect("serving at READY");

    let pings: Vec<Instant> = collect_for(&notify, Duration::from_millis(1_300))
        .into_iter()
        .filter(|(_, m)| m == "WATCHDOG=1")
        .map(|(t, _)| t)
        .collect();
    assert!(
        (4..=9).contains(&pings.len()),
        "{} pings in 1.3 s at a 200 ms period",
        pings.len()
    );
    let gaps: Vec<Duration> = pings.windows(2).map(|w| w[1] - w[0]).collect();
    let mean = gaps.iter().sum::<Duration>() / gaps.len() as u32;
    assert!(
        mean > Duration::from_millis(150) && mean < Duration::from_millis(260),
        "mean watchdog period {mean:?}, expected ~200 ms (half of WATCHDOG_USEC)"
    );

    // Wedged (stopped): no pings.
    d.signal(libc::SIGSTOP);
    std::thread::sleep(Duration::from_millis(50));
    let _ = collect_for(&notify, Duration::from_millis(10)); // drain anything in flight
    let during = collect_for(&notify, Duration::from_millis(700));
    assert!(
        during.iter().all(|(_, m)| m != "WATCHDOG=1"),
        "watchdog pinged while the daemon was stopped: {during:?}"
    );
    d.signal(libc::SIGCONT);
    let after = collect_for(&notify, Duration::from_millis(600));
    assert!(
        after.iter().any(|(_, m)| m == "WATCHDOG=1"),
        "pings resume after SIGCONT"
    );

    let (st, _) = d.terminate(Duration::from_secs(10));
    assert_eq!(st.code(), Some(0));
    let stopping = collect_for(&notify, Duration::from_millis(200));
    assert!(
        stopping
            .iter()
            .any(|(_, m)| m.lines().any(|l| l == "STOPPING=1")),
        "STOPPING=1 sent: {stopping:?}"
    );
}

#[test]
fn sighup_with_a_broken_config_keeps_the_old_one_and_a_good_one_applies() {
    let dir = tempfile::tempdir().unwrap();
    let settings = Settings {
        max_concurrent: 4,
        ..Settings::default()
    };
    let d = Daemon::start(dir.path(), &settings);
    let cfg = dir.path().join("pstackd.toml");
    for broken in [
        "this is = not [ toml".to_string(),
        settings
            .toml(dir.path())
            .replace("max_concurrent_captures = 4", "max_concurrent_captures = 0"),
        settings.toml(dir.path()) + "\nunknown_knob = 1\n",
    ] {
        std::fs::write(&cfg, broken).unwrap();
        let before = d.metric("pstackd_reloads_total{result=\"rejected\"}");
        d.signal(libc::SIGHUP);
        wait_until(Duration::from_secs(5), "reload rejected", || {
            d.metric("pstackd_reloads_total{result=\"rejected\"}") == before + 1
        });
        assert_eq!(
            d.status()["captures"]["max_concurrent"],
            4,
            "old config kept"
        );
    }
    assert!(
        d.log_text()
            .contains("reload rejected; keeping the running configuration")
    );
    // A good config applies.
    let good = Settings {
        max_concurrent: 2,
        ..settings.clone()
    };
    std::fs::write(&cfg, good.toml(dir.path())).unwrap();
    d.signal(libc::SIGHUP);
    d.wait_status(Duration::from_secs(5), "reload applied", |s| {
        s["captures"]["max_concurrent"] == 2
    });
    // Still serving captures.
    let target = Sleeper::spawn();
    d.capture_pid(target.pid()).expect("capture after reloads");
}

#[test]
fn sigterm_with_captures_in_flight_exits_zero_within_the_drain_bound() {
    let dir = tempfile::tempdir().unwrap();
    let drain_ms = 3_000;
    let mut d = Daemon::start(
        dir.path(),
        &Settings {
            drain_timeout_ms: drain_ms,
            max_concurrent: 4,
            ..Settings::default()
        },
    );
    let target = Sleeper::spawn();
    let socket = d.socket.clone();
    let pid = target.pid();
    // Each client records every answered capture as (sent, answered, digest): the
    // drain is proven by a capture that was in flight when SIGTERM was sent and was
    // still answered, its envelope written to the spool.
    let clients: Vec<_> = (0..4)
        .map(|_| {
            let socket = socket.clone();
            std::thread::spawn(move || {
                let start = Instant::now();
                let mut answered = Vec::new();
                while start.elapsed() < Duration::from_secs(3) {
                    let sent = Instant::now();
                    match capture(&socket, pid, 2_000) {
                        Ok(env) => answered.push((sent, Instant::now(), env.digest)),
                        Err(client::ClientError::NoDaemon { .. }) => break,
                        Err(client::ClientError::Api {
                            status: 503 | 429, ..
                        }) => {}
                        Err(client::ClientError::Io(_)) | Err(client::ClientError::Protocol(_)) => {
                            break;
                        }
                        Err(e) => panic!("unexpected during drain: {e}"),
                    }
                }
                answered
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(150));
    d.wait_status(Duration::from_secs(5), "a capture in flight", |s| {
        s["captures"]["in_flight"].as_u64().unwrap_or(0) > 0
    });
    let sigterm_at = Instant::now();
    let (st, took) = d.terminate(Duration::from_millis(drain_ms + 2_000));
    assert_eq!(st.code(), Some(0), "log:\n{}", d.log_text());
    assert!(
        took < Duration::from_millis(drain_ms + 1_000),
        "drain took {took:?}"
    );
    let answered: Vec<(Instant, Instant, String)> = clients
        .into_iter()
        .flat_map(|c| c.join().unwrap())
        .collect();
    let drained: Vec<&String> = answered
        .iter()
        .filter(|(sent, done, _)| *sent < sigterm_at && *done > sigterm_at)
        .map(|(_, _, digest)| digest)
        .collect();
    assert!(
        !drained.is_empty(),
        "no capture was in flight at SIGTERM and answered after it ({} answered in all)",
        answered.len()
    );
    for digest in &drained {
        let hex = digest.strip_prefix("sha256:").unwrap();
        let spooled = dir.path().join("spool").join(format!("{hex}.json"));
        assert!(
            spooled.exists(),
            "the capture drained at SIGTERM was acknowledged but not spooled: {}",
            spooled.display()
        );
    }
    assert!(!d.socket.exists(), "socket file removed at exit");
    assert!(d.log_text().contains("draining"));
}

#[test]
fn socket_activation_serves_the_listen_fds_socket() {
    use std::os::fd::AsRawFd;
    use std::os::unix::process::CommandExt;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("activated.sock");
    let listener = UnixListener::bind(&path).unwrap();
    let fd = listener.as_raw_fd();
    // Start through `sh` so LISTEN_PID can be the exec'd daemon's own pid.
    let settings = Settings::default();
    std::fs::create_dir_all(dir.path()).unwrap();
    std::fs::write(dir.path().join("pstackd.toml"), settings.toml(dir.path())).unwrap();
    let log = dir.path().join("activated.log");
    let mut cmd = std::process::Command::new("sh");
    cmd.arg("-c")
        .arg(format!(
            "LISTEN_PID=$$ LISTEN_FDS=1 exec {} --config {}",
            pstackd_bin().display(),
            dir.path().join("pstackd.toml").display()
        ))
        .stderr(std::fs::File::create(&log).unwrap());
    // SAFETY: dup2 and fcntl are async-signal-safe; it places the listener on fd 3 in
    // the child between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            // dup2(3, 3) would keep FD_CLOEXEC: clear it explicitly then.
            if fd == 3 {
                if libc::fcntl(3, libc::F_SETFD, 0) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            } else if libc::dup2(fd, 3) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().unwrap();
    drop(listener);
    let mut status = None;
    let deadline = Instant::now() + Duration::from_secs(10);
    while status.is_none() {
        status = client::status(&path, Duration::from_secs(1)).ok();
        assert!(
            Instant::now() < deadline,
            "activated daemon not serving (fd {fd}); log:\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // It did not bind its configured path: the activated socket is the one.
    assert!(!dir.path().join("pstackd.sock").exists());
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let st = child.wait().unwrap();
    assert_eq!(
        st.code(),
        Some(0),
        "{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
}

#[test]
fn pstackctl_status_reports_the_running_daemon_and_fails_clearly_without_one() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(dir.path(), &Settings::default());
    let out = std::process::Command::new(pstackctl_bin())
        .args(["status", "--socket"])
        .arg(&d.socket)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(
        text.contains("spool") && text.contains("helpers") && text.contains("shipping"),
        "{text}"
    );
    let out = std::process::Command::new(pstackctl_bin())
        .args(["status", "--json", "--socket"])
        .arg(&d.socket)
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["spool"]["files"], 0);
    let out = std::process::Command::new(pstackctl_bin())
        .args(["status", "--socket"])
        .arg(dir.path().join("absent.sock"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not running"));
}

#[test]
fn pstackctl_capture_goes_through_the_socket_when_pstackd_runs_and_one_shot_otherwise() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(dir.path(), &Settings::default());
    let target = Sleeper::spawn();
    let run = |socket: &std::path::Path, out: &std::path::Path| {
        let o = std::process::Command::new(pstackctl_bin())
            .args([
                "capture",
                "--pid",
                &target.pid().to_string(),
                "--json",
                "--socket",
            ])
            .arg(socket)
            .arg("-o")
            .arg(out)
            .env("PSTACK_HELPER", helper_bin())
            .env("PSTACK_LEAK_JOURNAL", dir.path().join("cli-leaks.jsonl"))
            .output()
            .unwrap();
        assert_eq!(
            o.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&o.stderr)
        );
        pstack_testkit::verify(&std::fs::read(out).unwrap()).unwrap()
    };
    let via_daemon = run(&d.socket, &dir.path().join("a.json"));
    assert_eq!(via_daemon.collector.name, "pstackd");
    assert_eq!(d.status()["spool"]["files"], 1, "the daemon spooled it");
    // The file holds the bytes pstackd sealed and spooled, not pstackctl's
    // own serialization of them.
    let spooled = std::fs::read(dir.path().join("spool").join(format!(
        "{}.json",
        via_daemon.digest.strip_prefix("sha256:").unwrap()
    )))
    .unwrap();
    let written = std::fs::read(dir.path().join("a.json")).unwrap();
    assert_eq!(
        written.trim_ascii_end(),
        spooled.trim_ascii_end(),
        "pstackctl -o writes the daemon's bytes"
    );
    let one_shot = run(&dir.path().join("absent.sock"), &dir.path().join("b.json"));
    assert_eq!(one_shot.collector.name, "pstackctl");
    assert_eq!(d.status()["spool"]["files"], 1);
}

/// `pstackctl capture --pid/--tid/--host` sends pstackd the `kind`-tagged
/// request every other capture kind sends, not the legacy `{"subject": …}`
/// body. A socket that records the request and refuses it stands in for
/// pstackd: what is asserted is the bytes pstackctl wrote.
#[test]
fn pstackctl_capture_sends_the_tagged_request_for_process_thread_and_host() {
    use std::io::{Read, Write};
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("recorder.sock");
    let listener = UnixListener::bind(&socket).unwrap();
    let pid = std::process::id().to_string();
    let cases: [(&[&str], serde_json::Value); 3] = [
        (
            &["--pid", &pid, "--window", "50ms"],
            serde_json::json!({"kind": "process", "pid": std::process::id(), "window_ms": 50}),
        ),
        (
            &["--tid", &pid],
            serde_json::json!({"kind": "thread", "tid": std::process::id()}),
        ),
        (&["--host"], serde_json::json!({"kind": "host"})),
    ];
    for (args, want) in cases {
        let child = std::process::Command::new(pstackctl_bin())
            .arg("capture")
            .args(args)
            .arg("--socket")
            .arg(&socket)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let (mut s, _) = listener.accept().unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut raw = Vec::new();
        let mut b = [0u8; 1];
        while !raw.ends_with(b"\r\n\r\n") {
            assert_eq!(s.read(&mut b).unwrap(), 1, "request head cut short");
            raw.push(b[0]);
        }
        let head = String::from_utf8(raw).unwrap().to_ascii_lowercase();
        let len: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .expect("a content-length")
            .trim()
            .parse()
            .unwrap();
        let mut body = vec![0u8; len];
        s.read_exact(&mut body).unwrap();
        let refusal = br#"{"error":{"code":"busy","message":"recorded"}}"#;
        write!(
            s,
            "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
            refusal.len()
        )
        .unwrap();
        s.write_all(refusal).unwrap();
        drop(s);
        let out = child.wait_with_output().unwrap();
        assert_eq!(out.status.code(), Some(2), "pstackctl reports the refusal");
        let sent: serde_json::Value = serde_json::from_slice(&body).unwrap();
        for (k, v) in want.as_object().unwrap() {
            assert_eq!(&sent[k], v, "{k} in {sent}");
        }
        assert!(sent.get("subject").is_none(), "legacy body sent: {sent}");
        assert!(sent["deadlines"]["bundle_ms"].as_u64().is_some(), "{sent}");
    }
}
