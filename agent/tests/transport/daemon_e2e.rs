//! Issue 17: pstackd runs the transport and Longhorn engines. Through the
//! daemon's socket, on the netns/veth testbed, with a real `pstack-store`
//! as the collector: what `pstackctl` prints is what the store serves back,
//! byte for byte; bad input on the new kinds is a 400 naming the field and
//! nothing is captured. Root only (namespaces, nftables, eBPF).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use pstack_envelope::{Subject, SurfaceStatus};
use pstackctl::client;

use crate::daemon_common::{Daemon, Settings};
use crate::testbed::*;

/// The real store, as the daemon tests start it.
pub use crate::daemon_common::StoreProc as Store;

fn daemon_shipping_to(dir: &Path, store: &Store) -> Daemon {
    daemon_shipping_with(dir, store, String::new())
}

/// As [`daemon_shipping_to`], with `capture` appended to its `[capture]` table.
fn daemon_shipping_with(dir: &Path, store: &Store, capture: String) -> Daemon {
    let settings = Settings {
        collector_url: Some(format!("http://{}", store.addr)),
        api_key: Some(store.key.clone()),
        backoff_initial_ms: 50,
        backoff_max_ms: 300,
        extra_capture: capture,
        ..Settings::default()
    };
    Daemon::start(&dir.join("d"), &settings)
}

/// `pstackctl` through the daemon at `socket`; (exit code, stdout, stderr).
fn pstackctl_via(socket: &Path, args: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_pstackctl"))
        .args(args)
        .arg("--socket")
        .arg(socket)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn pstackctl")
}

/// Every line the CLI printed is served back by the store byte for byte,
/// once the daemon has shipped them all.
fn store_serves_what_was_printed(d: &Daemon, store: &Store, stdout: &str) {
    let lines: Vec<&str> = stdout.lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(!lines.is_empty());
    let n = lines.len() as u64;
    d.wait_status(
        Duration::from_secs(30),
        "every envelope shipped to the store",
        |s| s["spool"]["files"] == 0 && s["shipping"]["accepted_total"].as_u64() >= Some(n),
    );
    for line in lines {
        let env = pstack_testkit::verify(line.as_bytes()).expect("printed envelope verifies");
        let (code, body) = store
            .get(&format!("/v1/envelopes/{}", env.digest))
            .expect("store answers");
        assert_eq!(code, 200, "{} not in the store", env.digest);
        assert_eq!(
            String::from_utf8_lossy(&body),
            line,
            "the store serves what the CLI printed"
        );
    }
}

#[test]
fn root_transport_through_pstackd_of_a_stream_reset_mid_window_reaches_the_store_as_printed() {
    if !root_or_skip(
        "root_transport_through_pstackd_of_a_stream_reset_mid_window_reaches_the_store_as_printed",
    ) {
        return;
    }
    let _s = serial();
    let dir = tempfile::tempdir().unwrap();
    let store = Store::start(dir.path());
    let d = daemon_shipping_to(dir.path(), &store);
    let bed = Testbed::new("drst");
    let t = Transfer::start(&bed, false, None);
    let cli = pstackctl_via(
        &d.socket,
        &[
            "capture",
            "transport",
            "--netns",
            &bed.a.name,
            "--peer",
            B_V4,
            "--window",
            "4s",
            "--json",
        ],
    );
    // Loading the eBPF programs takes a moment on a busy machine.
    std::thread::sleep(Duration::from_millis(2000));
    bed.b.nft(&format!(
        "table inet pstest {{ chain input {{ type filter hook input priority 0; policy accept; \
         tcp dport {DATA_PORT} reject with tcp reset; }} }}"
    ));
    let out = cli.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "pstackctl failed: {stderr}");
    assert!(
        stderr.contains("captured by pstackd"),
        "the capture went through the daemon: {stderr}"
    );
    assert!(
        t.knobs.send_error.lock().unwrap().is_some(),
        "the sender saw the reset"
    );
    let envs = envelopes(&stdout);
    let data = flow_to(&envs, DATA_PORT);
    let ebpf = surface(data, "ebpf/tcp");
    assert!(
        matches!(ebpf.status, SurfaceStatus::Ok | SurfaceStatus::Truncated),
        "pstackd's eBPF window ran: {ebpf:#?}\nlog:\n{}",
        d.log_text()
    );
    let c = codes(data);
    assert!(
        c.contains(&"rst_received_from_peer".to_string()),
        "{:#?}",
        data.claims
    );
    assert!(!c.contains(&"rst_sent_by_local".to_string()));
    store_serves_what_was_printed(&d, &store, &stdout);
}

/// A stand-in Longhorn manager on loopback answering `GET
/// /v1/volumes/{volume}` once with the manager's volume shape (the same
/// document `longhorn.rs` serves).
fn fake_manager() -> (String, std::thread::JoinHandle<String>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let server = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let mut req = vec![0u8; 4096];
        let n = s.read(&mut req).unwrap();
        let req = String::from_utf8_lossy(&req[..n]).into_owned();
        let body = r#"{"name":"pvc-7","state":"attached","robustness":"degraded","controllers":[{"name":"pvc-7-e-0"}],"rebuildStatus":[{"replica":"pvc-7-r-1","fromReplicaAddress":"tcp://10.77.0.2:10001","state":"in_progress","progress":37,"isRebuilding":true,"error":""}]}"#;
        write!(
            s,
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        req
    });
    (format!("http://127.0.0.1:{port}"), server)
}

#[test]
fn root_longhorn_through_pstackd_is_shipped_and_read_back_from_the_store() {
    if !root_or_skip("root_longhorn_through_pstackd_is_shipped_and_read_back_from_the_store") {
        return;
    }
    let _s = serial();
    let dir = tempfile::tempdir().unwrap();
    let store = Store::start(dir.path());
    let (api, manager) = fake_manager();
    // The daemon contacts only the manager its configuration lists.
    let d = daemon_shipping_with(dir.path(), &store, format!("longhorn_apis = [{api:?}]"));
    let bed = Testbed::new("dlh");
    let _t = Transfer::start(&bed, false, None);
    let cli = pstackctl_via(
        &d.socket,
        &[
            "capture",
            "longhorn",
            "--volume",
            "pvc-7",
            "--engine",
            "pvc-7-e-0",
            "--source-node",
            "node-a",
            "--target-node",
            "node-b",
            "--netns",
            &bed.a.name,
            "--peer",
            B_V4,
            "--window",
            "1s",
            "--json",
            "--no-ebpf",
            "--longhorn-api",
            &api,
        ],
    );
    let out = cli.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "pstackctl failed: {stderr}");
    assert!(stderr.contains("captured by pstackd"), "{stderr}");
    assert!(
        manager
            .join()
            .unwrap()
            .starts_with("GET /v1/volumes/pvc-7 HTTP/1.1")
    );
    let envs = envelopes(&stdout);
    let transfer = envs.last().unwrap();
    assert!(
        matches!(transfer.subject, Subject::StorageTransfer(_)),
        "the transfer is last"
    );
    assert!(
        fact_codes(transfer)
            .iter()
            .any(|c| c.starts_with("longhorn_manager_reports")),
        "{:#?}",
        transfer.claims
    );
    store_serves_what_was_printed(&d, &store, &stdout);
}

/// POST `body` to pstackd's `/v1/captures`; asserts the answer is `status`
/// naming `field`, and returns its JSON.
fn refused_capture(d: &Daemon, body: &str, status: u16, field: &str) -> serde_json::Value {
    let resp = client::request(
        &d.socket,
        "POST",
        "/v1/captures",
        Some(body.as_bytes()),
        Duration::from_secs(10),
    )
    .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&resp.body).unwrap();
    assert_eq!(resp.status, status, "{body}: {v}");
    assert_eq!(v["error"]["field"], field, "{body}: {v}");
    v
}

/// pstackd is root and its caller only a member of the socket's group: a
/// Longhorn request naming a manager API or a Hubble server that the daemon's
/// configuration does not list is refused with 403 before anything is opened,
/// and the named address is never contacted.
#[test]
fn root_longhorn_endpoints_not_listed_in_the_config_are_refused_and_never_contacted() {
    if !root_or_skip(
        "root_longhorn_endpoints_not_listed_in_the_config_are_refused_and_never_contacted",
    ) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let unlisted = TcpListener::bind("127.0.0.1:0").unwrap();
    unlisted.set_nonblocking(true).unwrap();
    let unlisted_url = format!("http://{}", unlisted.local_addr().unwrap());
    let settings = Settings {
        extra_capture:
            "longhorn_apis = [\"http://127.0.0.1:1\"]\nhubble_servers = [\"relay:4245\"]".into(),
        ..Settings::default()
    };
    let d = Daemon::start(dir.path(), &settings);
    let base = r#""kind":"longhorn","peer":"10.77.0.2","volume":"v","engine":"e","source_node":"a","target_node":"b","window_ms":200"#;
    for (extra, field) in [
        (
            format!(r#""longhorn_api":"{unlisted_url}""#),
            "longhorn_api",
        ),
        (
            r#""hubble_server":"elsewhere:4245""#.to_string(),
            "hubble_server",
        ),
        (
            r#""longhorn_api":"http://127.0.0.1:1","hubble_server":"relay:4246""#.to_string(),
            "hubble_server",
        ),
    ] {
        let body = format!("{{{base},{extra}}}");
        let v = refused_capture(&d, &body, 403, field);
        assert_eq!(v["error"]["code"], "endpoint_not_allowed", "{body}: {v}");
    }
    assert!(
        unlisted.accept().is_err(),
        "the unlisted manager address was contacted"
    );
    let s = d.status();
    assert_eq!(s["captures"]["ok_total"], 0, "{s:#}");
    assert_eq!(s["spool"]["files"], 0, "nothing was spooled: {s:#}");
}

#[test]
fn root_bad_input_on_the_new_kinds_is_a_400_naming_the_field_and_nothing_is_captured() {
    if !root_or_skip(
        "root_bad_input_on_the_new_kinds_is_a_400_naming_the_field_and_nothing_is_captured",
    ) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(dir.path(), &Settings::default());
    let gone = {
        let mut c = Command::new("true").spawn().unwrap();
        let pid = c.id();
        c.wait().unwrap();
        pid
    };
    for (body, field) in [
        (r#"{"kind":"tcpdump","peer":"10.77.0.2"}"#.to_string(), "kind"),
        (r#"{"kind":"transport","peer":"node-b"}"#.to_string(), "peer"),
        (
            r#"{"kind":"transport","peer":"10.77.0.2","window_ms":3600001}"#.to_string(),
            "window_ms",
        ),
        (
            r#"{"kind":"longhorn","peer":"10.77.0.2","volume":"v","engine":"e","source_node":"a","target_node":"b","window_ms":1}"#.to_string(),
            "window_ms",
        ),
        (r#"{"kind":"tcp_trace","addr":"somewhere"}"#.to_string(), "addr"),
        (
            format!(r#"{{"kind":"transport","peer":"10.77.0.2","netns_pid":{gone},"window_ms":200}}"#),
            "netns_pid",
        ),
    ] {
        refused_capture(&d, &body, 400, field);
    }
    // Within the engines' own window bounds but past pstackd's
    // max_bundle_deadline_ms (30 s by default): every network kind, the
    // limit named.
    for body in [
        r#"{"kind":"transport","peer":"10.77.0.2","window_ms":30001}"#,
        r#"{"kind":"longhorn","peer":"10.77.0.2","volume":"v","engine":"e","source_node":"a","target_node":"b","window_ms":30001}"#,
        r#"{"kind":"tcp_trace","window_ms":30001}"#,
    ] {
        let v = refused_capture(&d, body, 400, "window_ms");
        assert_eq!(v["error"]["code"], "out_of_range", "{body}: {v}");
        assert!(
            v["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("max_bundle_deadline_ms")),
            "{body}: {v}"
        );
    }
    let s = d.status();
    assert_eq!(s["captures"]["ok_total"], 0, "{s:#}");
    assert_eq!(s["spool"]["files"], 0, "nothing was spooled: {s:#}");
    assert_eq!(s["helpers"]["leaked"], 0);
}

#[test]
fn root_a_running_transport_capture_holds_a_slot_and_the_next_capture_gets_429() {
    if !root_or_skip("root_a_running_transport_capture_holds_a_slot_and_the_next_capture_gets_429")
    {
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
    // Watches its whole window (wait) although nothing matches.
    let long = r#"{"kind":"transport","peer":"127.0.0.1","ports":"1-2","window_ms":3000,"wait":true,"ebpf":false}"#;
    let socket = d.socket.clone();
    let first = std::thread::spawn(move || {
        client::request(
            &socket,
            "POST",
            "/v1/captures",
            Some(long.as_bytes()),
            Duration::from_secs(30),
        )
        .unwrap()
    });
    crate::daemon_common::wait_until(Duration::from_secs(5), "the first capture admitted", || {
        d.status()["captures"]["in_flight"] == 1
    });
    for body in [
        r#"{"kind":"tcp_trace","window_ms":100}"#.to_string(),
        format!(r#"{{"kind":"process","pid":{}}}"#, std::process::id()),
    ] {
        let resp = client::request(
            &d.socket,
            "POST",
            "/v1/captures",
            Some(body.as_bytes()),
            Duration::from_secs(10),
        )
        .unwrap();
        assert_eq!(
            resp.status,
            429,
            "{body}: {}",
            String::from_utf8_lossy(&resp.body)
        );
        assert_eq!(resp.header("retry-after"), Some("1"));
    }
    let resp = first.join().unwrap();
    assert_eq!(resp.status, 200, "{}", String::from_utf8_lossy(&resp.body));
    assert_eq!(resp.header("x-pstack-capture-kind"), Some("transport"));
    let envs: Vec<_> = String::from_utf8(resp.body)
        .unwrap()
        .lines()
        .map(|l| pstack_testkit::verify(l.as_bytes()).unwrap())
        .collect();
    assert_eq!(envs.len(), 1, "one no-match envelope");
    assert!(
        envs[0].claims.iter().any(|c| c.code == "no_matching_flow"),
        "{:#?}",
        envs[0].claims
    );
    let s = d.status();
    assert_eq!(s["captures"]["busy_total"], 2, "{s:#}");
    assert_eq!(s["spool"]["files"], 1, "the envelope was spooled: {s:#}");
}

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

#[test]
fn root_tcp_trace_through_pstackd_names_the_reset_sender_and_is_spooled() {
    if !root_or_skip("root_tcp_trace_through_pstackd_names_the_reset_sender_and_is_spooled") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(dir.path(), &Settings::default());
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    // Loopback only: connections whose server side resets them, during the window.
    let traffic = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(1500));
        for _ in 0..3 {
            let c = TcpStream::connect(("127.0.0.1", port)).unwrap();
            let (s, _) = l.accept().unwrap();
            reset_close(s);
            let mut buf = [0u8; 1];
            let _ = (&c).read(&mut buf);
        }
    });
    let body = format!(r#"{{"kind":"tcp_trace","window_ms":3500,"port":{port}}}"#);
    let resp = client::request(
        &d.socket,
        "POST",
        "/v1/captures",
        Some(body.as_bytes()),
        Duration::from_secs(30),
    )
    .unwrap();
    traffic.join().unwrap();
    assert_eq!(resp.status, 200, "{}", String::from_utf8_lossy(&resp.body));
    assert_eq!(
        resp.header("x-pstack-trace-refused"),
        None,
        "eBPF is available to pstackd as root: {}",
        d.log_text()
    );
    assert_eq!(resp.header("x-pstack-capture-kind"), Some("tcp_trace"));
    let text = String::from_utf8(resp.body).unwrap();
    let envs: Vec<_> = text
        .lines()
        .map(|l| pstack_testkit::verify(l.as_bytes()).unwrap())
        .collect();
    assert_eq!(envs.len(), 1);
    let sender = envs[0]
        .claims
        .iter()
        .filter(|c| c.code == "tcp_reset_sender")
        .map(|c| c.statement.as_str())
        .collect::<Vec<_>>();
    assert!(
        sender.iter().any(|s| s.contains("(this host) sent")),
        "{:#?}",
        envs[0].claims
    );
    let s = d.status();
    assert_eq!(s["spool"]["files"], 1, "{s:#}");
    assert_eq!(s["captures"]["ok_total"], 1);
}
