//! Issue 17, Deliver 6: `trace tcp` through pstackd. A long capture gets an
//! id (`Prefer: respond-async` → 202 + Location), reports its phases at
//! `GET /v1/captures/{id}`, streams its live lines at `/events`, and its
//! envelope is spooled like any other; `pstackctl trace tcp` prints the same
//! lines whether pstackd ran the window or pstackctl did. Root only (eBPF).

use std::collections::HashMap;
use std::io::{BufRead, Read};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use pstack_capture::request::{CaptureRequest, TcpTraceRequest};
use pstack_capture::tcp_trace::TraceLine;
use pstackctl::client::{self, CaptureEvent};

use crate::daemon_common::{Daemon, Settings};
use crate::testbed::root_or_skip;

/// Close `s` with SO_LINGER 0: the kernel sends a RST instead of a FIN.
fn reset_close(s: TcpStream) {
    use std::os::fd::AsRawFd;
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: a valid socket fd and a correctly sized linger struct.
    let rc = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            std::ptr::addr_of!(linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        )
    };
    assert_eq!(rc, 0);
    drop(s);
}

/// Three loopback connections to `l`, each reset by the server side.
fn three_resets(l: &TcpListener) {
    let port = l.local_addr().unwrap().port();
    for _ in 0..3 {
        let c = TcpStream::connect(("127.0.0.1", port)).unwrap();
        let (s, _) = l.accept().unwrap();
        reset_close(s);
        let mut buf = [0u8; 1];
        let _ = (&c).read(&mut buf);
    }
}

/// Run `pstackctl trace tcp` (text output) with `via`, make three resets
/// once it says it is watching, and return (exit code, stdout, stderr, the
/// sealed envelope).
fn trace_once(
    l: &TcpListener,
    via: &[&str],
    seal: &Path,
) -> (i32, String, String, pstack_envelope::Envelope) {
    let port = l.local_addr().unwrap().port().to_string();
    let mut child = Command::new(env!("CARGO_BIN_EXE_pstackctl"))
        .args(["trace", "tcp", "--window", "3s", "--port", &port, "--seal"])
        .arg(seal)
        .args(via)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = mpsc::channel();
    let reader = std::thread::spawn(move || {
        let mut all = String::new();
        for line in std::io::BufReader::new(stderr).lines() {
            let line = line.unwrap_or_default();
            let _ = tx.send(line.clone());
            all.push_str(&line);
            all.push('\n');
        }
        all
    });
    // The banner is printed once the programs are attached (here or in pstackd).
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match rx.recv_timeout(left) {
            Ok(l) if l.starts_with("tracing TCP for 3s") => break,
            Ok(_) => continue,
            Err(e) => {
                let _ = child.kill();
                panic!("no banner ({e}): {}", reader.join().unwrap());
            }
        }
    }
    three_resets(l);
    let mut stdout = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut stdout)
        .unwrap();
    let status = child.wait().unwrap();
    let stderr = reader.join().unwrap();
    let env = pstack_testkit::verify(&std::fs::read(seal).expect("sealed")).expect("verifies");
    (status.code().unwrap_or(-1), stdout, stderr, env)
}

/// The printed lines with what differs between two windows of the same
/// traffic taken out: event times, the summary's duration, the task on CPU
/// (softirq work may run in ksoftirqd on a loaded host) and the clients'
/// ephemeral ports (numbered in order of appearance).
fn normalized(stdout: &str, server_port: u16) -> Vec<String> {
    let mut ports: HashMap<String, String> = HashMap::new();
    stdout
        .lines()
        .map(|line| {
            let mut out = Vec::new();
            for word in line.split_whitespace() {
                let time = word.trim_start_matches('+');
                let w = if time
                    .strip_suffix('s')
                    .is_some_and(|t| t.parse::<f64>().is_ok())
                {
                    "T".to_string()
                } else if let Some((addr, p)) = word.rsplit_once(':')
                    && addr == "127.0.0.1"
                    && p != server_port.to_string()
                {
                    let n = ports.len();
                    let id = ports.entry(p.to_string()).or_insert(format!("EPH{n}"));
                    format!("{addr}:{id}")
                } else {
                    word.to_string()
                };
                out.push(w);
            }
            let mut s = out.join(" ");
            if let Some(i) = s.find("(on cpu:") {
                s.truncate(i);
                s.push_str("(on cpu: …)");
            }
            if let Some(i) = s.find(" state changes in ") {
                s.truncate(i);
            }
            s
        })
        .collect()
}

/// The envelope's meaning without its timing: surfaces (id, status),
/// claims (code, statement with ephemeral ports numbered), completeness
/// and the universe's counts.
fn meaning(env: &pstack_envelope::Envelope, server_port: u16) -> Vec<String> {
    let mut out = vec![
        format!("completeness {}", env.completeness.as_str()),
        format!(
            "universe {} {} {}",
            env.universe.selector, env.universe.expected_count, env.universe.observed_count
        ),
    ];
    for s in &env.surfaces {
        out.push(format!("surface {} {}", s.id, s.status));
    }
    let statements: Vec<String> = env
        .claims
        .iter()
        .map(|c| format!("{} {}", c.code, c.statement))
        .collect();
    out.extend(normalized(&statements.join("\n"), server_port));
    out
}

#[test]
fn root_trace_tcp_prints_the_same_through_pstackd_as_one_shot_and_pstackd_spools_it() {
    if !root_or_skip(
        "root_trace_tcp_prints_the_same_through_pstackd_as_one_shot_and_pstackd_spools_it",
    ) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(dir.path(), &Settings::default());
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let socket = d.socket.to_str().unwrap().to_string();

    let (code_d, out_d, err_d, env_d) =
        trace_once(&l, &["--socket", &socket], &dir.path().join("daemon.json"));
    assert_eq!(code_d, 0, "{err_d}");
    assert!(err_d.contains("captured by pstackd"), "{err_d}");
    let (code_o, out_o, err_o, env_o) =
        trace_once(&l, &["--one-shot"], &dir.path().join("oneshot.json"));
    assert_eq!(code_o, 0, "{err_o}");
    assert!(!err_o.contains("captured by pstackd"), "{err_o}");

    let (a, b) = (normalized(&out_d, port), normalized(&out_o, port));
    assert!(
        a.iter().filter(|l| l.contains("reset sent")).count() == 3,
        "three resets sent, seen live through pstackd: {out_d}"
    );
    assert_eq!(a, b, "through pstackd:\n{out_d}\none-shot:\n{out_o}");
    assert_eq!(meaning(&env_d, port), meaning(&env_o, port));
    assert!(
        env_d
            .claims
            .iter()
            .any(|c| c.code == "tcp_reset_sender" && c.statement.contains("(this host) sent")),
        "{:#?}",
        env_d.claims
    );

    // pstackd's window was spooled (and only it: the one-shot window was not).
    let s = d.status();
    assert_eq!(s["spool"]["files"], 1, "{s:#}");
    assert_eq!(s["captures"]["ok_total"], 1, "{s:#}");
    let resp = client::request(
        &d.socket,
        "GET",
        &format!("/v1/envelopes/{}", env_d.digest),
        None,
        Duration::from_secs(10),
    )
    .unwrap();
    assert_eq!(resp.status, 200);
    assert_eq!(
        pstack_testkit::verify(&resp.body).unwrap().digest,
        env_d.digest
    );
}

#[test]
fn root_an_async_tcp_trace_holds_a_slot_reports_its_phases_and_streams_its_lines() {
    if !root_or_skip(
        "root_an_async_tcp_trace_holds_a_slot_reports_its_phases_and_streams_its_lines",
    ) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(
        dir.path(),
        &Settings {
            max_concurrent: 1,
            ..Settings::default()
        },
    );
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let request = CaptureRequest::TcpTrace(TcpTraceRequest {
        window_ms: 3000,
        port: Some(port),
        addr: None,
        ring_bytes: None,
    });
    let body = serde_json::to_vec(&request).unwrap();
    let resp = client::request_with(
        &d.socket,
        "POST",
        "/v1/captures",
        Some(&body),
        &[("Prefer", "respond-async")],
        Duration::from_secs(10),
    )
    .unwrap();
    assert_eq!(resp.status, 202, "{}", String::from_utf8_lossy(&resp.body));
    let v: serde_json::Value = serde_json::from_slice(&resp.body).unwrap();
    let id = v["id"].as_str().unwrap().to_string();
    assert_eq!(id.len(), 32, "{v}");
    let location = format!("/v1/captures/{id}");
    assert_eq!(resp.header("location"), Some(location.as_str()));

    // It holds the only slot: a second capture, async or not, gets 429.
    for prefer in [&[("Prefer", "respond-async")][..], &[]] {
        let r = client::request_with(
            &d.socket,
            "POST",
            "/v1/captures",
            Some(&body),
            prefer,
            Duration::from_secs(10),
        )
        .unwrap();
        assert_eq!(r.status, 429, "{}", String::from_utf8_lossy(&r.body));
        assert_eq!(r.header("retry-after"), Some("1"));
    }

    // Follow the events; the traffic starts once the session watches.
    let mut events = Vec::new();
    let mut traffic = None;
    let last = client::follow_capture(&d.socket, &id, Duration::from_secs(30), &mut |e| {
        if matches!(
            e,
            CaptureEvent::Trace {
                line: TraceLine::Watching { .. }
            }
        ) {
            let l = l.try_clone().unwrap();
            traffic = Some(std::thread::spawn(move || three_resets(&l)));
            // The status while it runs: the phase, not yet done.
            let r = client::request(&d.socket, "GET", &location, None, Duration::from_secs(10))
                .unwrap();
            let s: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
            assert_eq!(s["state"], "running", "{s}");
            assert_eq!(s["kind"], "tcp_trace", "{s}");
        }
        events.push(e.clone());
    })
    .unwrap();
    traffic.expect("the session started").join().unwrap();
    let CaptureEvent::Done { digests, .. } = &last else {
        panic!("{last:?}");
    };
    assert_eq!(digests.len(), 1);
    let resets = events
        .iter()
        .filter(|e| matches!(e, CaptureEvent::Trace { line: TraceLine::Event { text, .. } } if text.contains("reset sent")))
        .count();
    assert_eq!(resets, 3, "{events:#?}");
    assert!(
        events
            .iter()
            .any(|e| matches!(e, CaptureEvent::Phase { what, .. } if what == "watching TCP")),
        "{events:#?}"
    );
    assert!(
        events
            .iter()
            .any(|e| matches!(e, CaptureEvent::Envelope { digest, .. } if digest == &digests[0]))
    );

    // Finished: its status, and a second reader gets the whole log again.
    let r = client::request(&d.socket, "GET", &location, None, Duration::from_secs(10)).unwrap();
    // Read as the wire type pstackd-api declares (unknown members refused).
    let s: pstackd_api::CaptureStatus = serde_json::from_slice(&r.body)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&r.body)));
    assert_eq!(s.state, pstackd_api::CaptureState::Succeeded, "{s:?}");
    let Some(pstackd_api::CaptureOutcome::Succeeded { digests: got, .. }) = &s.outcome else {
        panic!("{s:?}");
    };
    assert_eq!(got, digests, "{s:?}");
    assert_eq!(s.phases[0].what, "watching TCP", "{s:?}");
    assert!(s.phases[0].done, "{s:?}");
    let mut again = 0;
    client::follow_capture(&d.socket, &id, Duration::from_secs(10), &mut |_| again += 1).unwrap();
    assert_eq!(again, events.len());
    let st = d.status();
    assert_eq!(st["spool"]["files"], 1, "{st:#}");
    assert_eq!(st["captures"]["busy_total"], 2, "{st:#}");
    assert_eq!(st["captures"]["in_flight"], 0, "{st:#}");

    // An unknown id: 404 JSON, for the status and the events alike.
    for path in [
        "/v1/captures/00000000000000000000000000000000".to_string(),
        "/v1/captures/00000000000000000000000000000000/events".to_string(),
        "/v1/captures/nonsense".to_string(),
    ] {
        let r = client::request(&d.socket, "GET", &path, None, Duration::from_secs(10)).unwrap();
        assert_eq!(r.status, 404, "{path}");
        let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(v["error"]["code"], "no_such_capture", "{path}: {v}");
    }
}

/// A bad async request is refused like a synchronous one (400 naming the
/// field), with no id and nothing run.
#[test]
fn root_a_bad_async_request_is_refused_before_an_id_is_given() {
    if !root_or_skip("root_a_bad_async_request_is_refused_before_an_id_is_given") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(dir.path(), &Settings::default());
    for (body, field) in [
        (r#"{"kind":"tcp_trace","window_ms":30001}"#, "window_ms"),
        (r#"{"kind":"tcp_trace","addr":"here"}"#, "addr"),
        (r#"{"kind":"tcp_trac"}"#, "kind"),
    ] {
        let r = client::request_with(
            &d.socket,
            "POST",
            "/v1/captures",
            Some(body.as_bytes()),
            &[("Prefer", "respond-async")],
            Duration::from_secs(10),
        )
        .unwrap();
        assert_eq!(r.status, 400, "{body}");
        assert_eq!(r.header("location"), None);
        let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(v["error"]["field"], field, "{body}: {v}");
    }
    let s = d.status();
    assert_eq!(s["captures"]["ok_total"], 0, "{s:#}");
    assert_eq!(s["spool"]["files"], 0, "{s:#}");
}

/// `--json` output shape: per event kind, the same members, and the same
/// surfaces array last, through pstackd and one-shot. The traffic resets a
/// connection every 100 ms through each whole window (JSON mode prints no
/// banner to wait for).
#[test]
fn root_trace_tcp_json_lines_have_the_same_shape_through_pstackd_and_one_shot() {
    if !root_or_skip("root_trace_tcp_json_lines_have_the_same_shape_through_pstackd_and_one_shot") {
        return;
    }
    use std::collections::{BTreeMap, BTreeSet};
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(dir.path(), &Settings::default());
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port().to_string();
    let socket = d.socket.to_str().unwrap().to_string();
    let shape = |via: &[&str]| -> (BTreeMap<String, BTreeSet<String>>, Vec<String>) {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let l2 = l.try_clone().unwrap();
        let s2 = stop.clone();
        let traffic = std::thread::spawn(move || {
            while !s2.load(std::sync::atomic::Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(100));
                let port = l2.local_addr().unwrap().port();
                let c = TcpStream::connect(("127.0.0.1", port)).unwrap();
                let (s, _) = l2.accept().unwrap();
                reset_close(s);
                let mut buf = [0u8; 1];
                let _ = (&c).read(&mut buf);
            }
        });
        let out = Command::new(env!("CARGO_BIN_EXE_pstackctl"))
            .args([
                "trace", "tcp", "--window", "2500ms", "--port", &port, "--json",
            ])
            .args(via)
            .output()
            .unwrap();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        traffic.join().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8(out.stdout).unwrap();
        let mut lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}")))
            .collect();
        let surfaces = lines.pop().expect("the surfaces line");
        let ids = surfaces
            .as_array()
            .expect("surfaces last")
            .iter()
            .map(|s| s["id"].as_str().unwrap().to_string())
            .collect();
        let mut kinds: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for e in lines {
            let kind = e["event"].as_str().expect("an event line").to_string();
            let keys = e.as_object().unwrap().keys().cloned();
            kinds.entry(kind).or_default().extend(keys);
        }
        (kinds, ids)
    };
    let (kinds_d, ids_d) = shape(&["--socket", &socket]);
    let (kinds_o, ids_o) = shape(&["--one-shot"]);
    assert!(kinds_d.contains_key("reset_sent"), "{kinds_d:?}");
    assert_eq!(kinds_d, kinds_o);
    assert_eq!(ids_d, ids_o);
    assert_eq!(d.status()["spool"]["files"], 1);
}
