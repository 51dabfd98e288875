//! Concurrency limits and hostile requests on the socket.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use pstackctl::client::{self, ClientError};

use super::common::*;

#[test]
fn fifty_concurrent_captures_are_all_answered_envelope_or_429_none_hung_rss_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(
        dir.path(),
        &Settings {
            max_concurrent: 4,
            ..Settings::default()
        },
    );
    let target = Sleeper::spawn();
    let bundle_ms = 2_000;
    let rss_before = d.rss_kib();
    let socket = d.socket.clone();
    let pid = target.pid();
    let handles: Vec<_> = (0..50)
        .map(|_| {
            let socket = socket.clone();
            std::thread::spawn(move || {
                let start = Instant::now();
                let r = capture(&socket, pid, bundle_ms);
                (r, start.elapsed())
            })
        })
        .collect();
    let (mut ok, mut busy) = (0, 0);
    for h in handles {
        let (r, took) = h.join().unwrap();
        assert!(
            took < Duration::from_millis(bundle_ms) + Duration::from_secs(2),
            "a request hung past its deadline: {took:?}"
        );
        match r {
            Ok(env) => {
                ok += 1;
                assert!(env.digest.starts_with("sha256:"));
            }
            Err(ClientError::Api {
                status: 429,
                retry_after,
                ..
            }) => {
                busy += 1;
                assert_eq!(retry_after, Some(1), "429 carries Retry-After");
            }
            Err(e) => panic!("unexpected answer: {e}"),
        }
    }
    assert_eq!(ok + busy, 50);
    assert!(
        ok >= 4,
        "at least the admitted captures succeed ({ok} ok, {busy} busy)"
    );
    let rss_after = d.rss_kib();
    eprintln!(
        "50 concurrent: {ok} envelopes, {busy} x 429; RSS {rss_before} KiB -> {rss_after} KiB"
    );
    assert!(rss_after < 96 * 1024, "RSS {rss_after} KiB is not bounded");
    let s = d.status();
    assert_eq!(s["captures"]["in_flight"], 0);
    assert_eq!(s["captures"]["busy_total"], busy);
    assert_eq!(s["spool"]["files"], ok);
}

/// `POST /v1/captures` with this body.
fn post_capture(d: &Daemon, body: &str) -> client::HttpResponse {
    client::request(
        &d.socket,
        "POST",
        "/v1/captures",
        Some(body.as_bytes()),
        Duration::from_secs(10),
    )
    .unwrap()
}

fn raw(socket: &std::path::Path, bytes: &[u8]) -> String {
    let mut s = UnixStream::connect(socket).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let _ = s.write_all(bytes);
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

fn status_of(resp: &str) -> u16 {
    resp.split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

#[test]
fn malformed_http_oversized_bodies_unknown_fields_and_bad_selectors_get_clear_4xx() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(dir.path(), &Settings::default());
    let post = |body: &str| post_capture(&d, body);
    let json = |r: &client::HttpResponse| -> serde_json::Value {
        serde_json::from_slice(&r.body).unwrap()
    };

    // Malformed HTTP: garbage request line, bad header, a lying content-length.
    assert_eq!(status_of(&raw(&d.socket, b"GARBAGE\r\n\r\n")), 400);
    assert_eq!(
        status_of(&raw(
            &d.socket,
            b"GET /v1/status HTTP/1.1\r\nbad header\r\n\r\n"
        )),
        400
    );
    let huge_header = format!(
        "GET /v1/status HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n",
        "a".repeat(64 << 10)
    );
    let r = raw(&d.socket, huge_header.as_bytes());
    assert!(matches!(status_of(&r), 431 | 400), "oversized headers: {r}");

    // Oversized body (the limit is 64 KiB).
    let big = format!(
        r#"{{"subject":{{"pid":1}},"pad":"{}"}}"#,
        "x".repeat(100 << 10)
    );
    let r = post(&big);
    assert_eq!(r.status, 413);
    assert_eq!(json(&r)["error"]["code"], "body_too_large");

    // Unknown fields, wrong types, not JSON.
    let r = post(r#"{"subject":{"pid":1},"surfaces":["stack"],"bogus":1}"#);
    assert_eq!(r.status, 400);
    let v = json(&r);
    assert_eq!(v["error"]["code"], "malformed_request");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("unknown field"),
        "{v}"
    );
    assert_eq!(post(r#"{"subject":{"pid":"abc"}}"#).status, 400);
    assert_eq!(post("{").status, 400);

    // Bad selectors.
    for bad in [
        r#"{"subject":{}}"#,
        r#"{"subject":{"pid":0}}"#,
        r#"{"subject":{"pid":1,"tid":1}}"#,
        r#"{"subject":{"host":false}}"#,
    ] {
        let r = post(bad);
        assert_eq!(r.status, 400, "{bad}");
        assert_eq!(json(&r)["error"]["code"], "bad_selector", "{bad}");
    }
    let r = post(r#"{"subject":{"pid":1},"deadlines":{"bundle_ms":0}}"#);
    assert_eq!(
        (r.status, json(&r)["error"]["code"].as_str()),
        (400, Some("out_of_range"))
    );
    // A pid that does not exist is a clean 404.
    let r = post(r#"{"subject":{"pid":4194303}}"#);
    assert_eq!(
        (r.status, json(&r)["error"]["code"].as_str()),
        (404, Some("no_such_subject"))
    );

    // Routes and methods.
    let r = client::request(&d.socket, "GET", "/v1/nope", None, Duration::from_secs(5)).unwrap();
    assert_eq!(r.status, 404);
    let r = client::request(
        &d.socket,
        "DELETE",
        "/v1/captures",
        None,
        Duration::from_secs(5),
    )
    .unwrap();
    assert_eq!(r.status, 405);
    let r = client::request(
        &d.socket,
        "GET",
        "/v1/envelopes/sha256:zz",
        None,
        Duration::from_secs(5),
    )
    .unwrap();
    assert_eq!(
        (r.status, json(&r)["error"]["code"].as_str()),
        (400, Some("invalid_digest"))
    );
    let absent = format!("/v1/envelopes/sha256:{}", "0".repeat(64));
    let r = client::request(&d.socket, "GET", &absent, None, Duration::from_secs(5)).unwrap();
    assert_eq!(r.status, 404);

    // A client that connects and sends nothing does not hold anything hostage.
    let idle = UnixStream::connect(&d.socket).unwrap();

    // The daemon is unaffected: it still captures, and serves the envelope back.
    let target = Sleeper::spawn();
    let env = d.capture_pid(target.pid()).expect("capture after abuse");
    let r = client::request(
        &d.socket,
        "GET",
        &format!("/v1/envelopes/{}", env.digest),
        None,
        Duration::from_secs(5),
    )
    .unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(pstack_testkit::verify(&r.body).unwrap().digest, env.digest);
    drop(idle);
}

#[test]
fn idle_and_slow_clients_cannot_exhaust_connections() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(
        dir.path(),
        &Settings {
            extra: "max_connections = 4\nheader_timeout_ms = 20000".into(),
            ..Settings::default()
        },
    );
    // Four idle connections fill the table; a fifth is closed at accept.
    // The connection `Daemon::start` polled with may still be counted for a
    // moment (its task ends asynchronously, later on a loaded host): an idle
    // connection refused at accept for that reason is replaced until four are held.
    let still_open = |s: &UnixStream| {
        let mut b = [0u8; 1];
        // SAFETY: a live socket fd and a 1-byte buffer we own; MSG_PEEK leaves the data.
        let n = unsafe {
            libc::recv(
                std::os::fd::AsRawFd::as_raw_fd(s),
                b.as_mut_ptr().cast(),
                1,
                libc::MSG_PEEK | libc::MSG_DONTWAIT,
            )
        };
        n < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::WouldBlock
    };
    let mut idle: Vec<UnixStream> = Vec::new();
    for _ in 0..50 {
        while idle.len() < 4 {
            idle.push(UnixStream::connect(&d.socket).unwrap());
        }
        std::thread::sleep(Duration::from_millis(100));
        idle.retain(|s| still_open(s));
        if idle.len() == 4 {
            break;
        }
    }
    assert_eq!(idle.len(), 4, "four idle connections could not be held");
    let mut fifth = UnixStream::connect(&d.socket).unwrap();
    fifth
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let _ = fifth.write_all(b"GET /v1/status HTTP/1.1\r\nHost: x\r\n\r\n");
    let mut buf = Vec::new();
    let _ = fifth.read_to_end(&mut buf);
    assert!(
        buf.is_empty(),
        "over-limit connection was served: {}",
        String::from_utf8_lossy(&buf)
    );
    drop(idle);
    wait_until(Duration::from_secs(5), "slots freed", || {
        client::status(&d.socket, Duration::from_secs(1)).is_ok()
    });
    assert!(d.metric("pstackd_connections_refused_total") >= 1);

    // A slow client (half a header, then nothing) is cut at the header timeout.
    let dir2 = tempfile::tempdir().unwrap();
    let d2 = Daemon::start(
        dir2.path(),
        &Settings {
            extra: "header_timeout_ms = 300".into(),
            ..Settings::default()
        },
    );
    let mut slow = UnixStream::connect(&d2.socket).unwrap();
    slow.write_all(b"GET /v1/sta").unwrap();
    slow.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let start = std::time::Instant::now();
    let mut b = Vec::new();
    let _ = slow.read_to_end(&mut b);
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "slow client held for {:?}",
        start.elapsed()
    );
}

#[test]
fn a_surface_list_selects_what_is_read_and_a_bad_list_gets_a_clear_400() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(dir.path(), &Settings::default());
    let target = Sleeper::spawn();
    let post = |body: String| post_capture(&d, &body);
    let pid = target.pid();
    let r = post(format!(
        r#"{{"subject":{{"pid":{pid}}},"surfaces":["task/*/syscall","proc/status"]}}"#
    ));
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let env = pstack_testkit::verify(&r.body).unwrap();
    let mut ids: Vec<String> = env
        .surfaces
        .iter()
        .map(|s| {
            s.id.split('/')
                .enumerate()
                .map(|(i, p)| {
                    if i == 1 && s.id.starts_with("task/") {
                        "*"
                    } else {
                        p
                    }
                })
                .collect::<Vec<_>>()
                .join("/")
        })
        .collect();
    ids.dedup();
    assert_eq!(
        ids,
        ["proc/status", "task/*/stat", "task/*/syscall"],
        "{ids:?}"
    );
    assert!(env.universe.selector.contains(" surfaces="));

    let code = |r: &client::HttpResponse| {
        let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        (r.status, v["error"]["code"].as_str().map(str::to_owned), v)
    };
    for (body, needle) in [
        (
            format!(r#"{{"subject":{{"pid":{pid}}},"surfaces":["stack"]}}"#),
            "unknown surface",
        ),
        (
            format!(r#"{{"subject":{{"pid":{pid}}},"surfaces":["proc/*/wchan"]}}"#),
            "does not apply",
        ),
        (
            r#"{"subject":{"host":true},"surfaces":["task/*/stack"]}"#.to_string(),
            "does not apply",
        ),
        (
            format!(r#"{{"subject":{{"pid":{pid}}},"surfaces":[]}}"#),
            "empty",
        ),
        (
            format!(r#"{{"subject":{{"pid":{pid}}},"surfaces":["ebpf:offcpu"]}}"#),
            "window",
        ),
    ] {
        let (status, c, v) = code(&post(body.clone()));
        assert_eq!(
            (status, c.as_deref()),
            (400, Some("bad_surfaces")),
            "{body}: {v}"
        );
        assert!(
            v["error"]["message"].as_str().unwrap().contains(needle),
            "{body}: {v}"
        );
    }
    // Wrong type is a malformed request, with its path.
    let (status, c, v) = code(&post(format!(
        r#"{{"subject":{{"pid":{pid}}},"surfaces":"task/*/stack"}}"#
    )));
    assert_eq!(
        (status, c.as_deref()),
        (400, Some("malformed_request")),
        "{v}"
    );
    // Still serving.
    assert!(d.capture_pid(pid).is_ok());
}
