//! Issue 20 item 8: pstackd's `longhorn_rebuild` rule on the three-namespace
//! Longhorn testbed (E, S, T), against a stand-in manager on loopback that
//! serves v1.9.0 `api/model.go` documents and whose answer the test flips:
//! no rebuild → `in_progress` (the rule starts a capture window on T while
//! T's control connection to S:P_S+2 and S's bulk stream to T:P_T+3 run) →
//! S resets the control channel and the manager says `error` with the
//! engine's real-format error text naming that connection (the window ends,
//! the terminal reading is sealed, the error's address pair is linked to
//! the control stream) → the envelopes reach a real `pstack-store`.
//! Root only (namespaces, the net helper, eBPF).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use pstack_envelope::{Subject, SurfaceStatus};
use serde_json::{Value, json};

use crate::daemon_common::{Daemon, Settings};
use crate::daemon_e2e::Store;
use crate::longhorn::{lh_im, lh_volume};
use crate::testbed::*;

/// A stand-in Longhorn manager answering by path from shared state:
/// `GET /v1/volumes` (a go-rancher collection), `GET /v1/volumes/pvc-7`,
/// `GET /v1/instancemanagers/im-s|im-t`; anything else is 404.
struct FakeManager {
    addr: SocketAddr,
    volume: Arc<Mutex<String>>,
    requests: Arc<Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl FakeManager {
    fn start(volume: String) -> FakeManager {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.set_nonblocking(true).unwrap();
        let addr = l.local_addr().unwrap();
        let volume = Arc::new(Mutex::new(volume));
        let requests = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (v, r, st) = (volume.clone(), requests.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            while !st.load(Ordering::Relaxed) {
                let mut s = match l.accept() {
                    Ok((s, _)) => s,
                    Err(_) => {
                        std::thread::sleep(Duration::from_millis(10));
                        continue;
                    }
                };
                let _ = s.set_nonblocking(false);
                let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
                let mut req = Vec::new();
                let mut buf = [0u8; 2048];
                while !req.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => req.extend_from_slice(&buf[..n]),
                    }
                }
                let line = String::from_utf8_lossy(&req)
                    .lines()
                    .next()
                    .unwrap_or("")
                    .to_string();
                let path = line.split(' ').nth(1).unwrap_or("").to_string();
                r.lock().unwrap().push(line);
                let vol = v.lock().unwrap().clone();
                let body = match path.as_str() {
                    "/v1/volumes" => Some(format!(
                        r#"{{"type":"collection","resourceType":"volume","links":{{"self":"http://{addr}/v1/volumes"}},"createTypes":{{}},"actions":{{}},"data":[{vol}]}}"#
                    )),
                    "/v1/volumes/pvc-7" => Some(vol),
                    "/v1/instancemanagers/im-s" => Some(lh_im("im-s", "pvc-7-r-s", P_S)),
                    "/v1/instancemanagers/im-t" => Some(lh_im("im-t", "pvc-7-r-t", P_T)),
                    _ => None,
                };
                let _ = match body {
                    Some(b) => write!(
                        s,
                        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{b}",
                        b.len()
                    ),
                    None => write!(
                        s,
                        "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                    ),
                };
            }
        });
        FakeManager {
            addr,
            volume,
            requests,
            stop,
            thread: Some(thread),
        }
    }

    fn set(&self, volume: String) {
        *self.volume.lock().unwrap() = volume;
    }

    fn list_reads(&self) -> usize {
        self.requests
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.starts_with("GET /v1/volumes "))
            .count()
    }
}

impl Drop for FakeManager {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A stand-in Kubernetes API on loopback: `GET
/// /api/v1/namespaces/longhorn-system/events?fieldSelector=involvedObject.name%3D<name>`
/// answered with a `v1.EventList` (k8s.io/api `core/v1/types.go`) holding a
/// `FailedRebuilding` Warning on the engine, when the bearer token is
/// `token`; 401 otherwise. Serves until the test process ends.
fn kube_api(token: &'static str, message: String) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { continue };
            let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
            let mut buf = vec![0u8; 8192];
            let n = s.read(&mut buf).unwrap_or(0);
            let head = String::from_utf8_lossy(&buf[..n]).to_string();
            let authorized = head.to_ascii_lowercase().contains(&format!(
                "authorization: bearer {}",
                token.to_ascii_lowercase()
            ));
            let object = head
                .split(' ')
                .nth(1)
                .and_then(|p| p.rsplit("involvedObject.name%3D").next())
                .unwrap_or("")
                .to_string();
            let (code, body) = if !authorized {
                (
                    "401 Unauthorized",
                    json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Unauthorized", "code": 401}),
                )
            } else {
                let items = if object == "pvc-7-e-0" {
                    vec![
                        json!({"metadata": {"name": "pvc-7-e-0.18a0", "namespace": "longhorn-system"},
                        "involvedObject": {"kind": "Engine", "namespace": "longhorn-system", "name": "pvc-7-e-0", "apiVersion": "longhorn.io/v1beta2"},
                        "reason": "FailedRebuilding", "message": message, "type": "Warning", "count": 1,
                        "source": {"component": "longhorn-engine-controller", "host": "node-e"},
                        "firstTimestamp": "2026-12-04T18:00:00Z", "lastTimestamp": "2026-12-04T18:00:00Z",
                        "reportingComponent": "", "reportingInstance": ""}),
                    ]
                } else {
                    vec![]
                };
                (
                    "200 OK",
                    json!({"kind": "EventList", "apiVersion": "v1", "metadata": {}, "items": items}),
                )
            };
            let body = body.to_string();
            let _ = write!(
                s,
                "HTTP/1.1 {code}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    addr
}

fn entry(state: &str, is_rebuilding: bool, progress: i64, error: &str) -> Value {
    json!([{"id": "", "type": "rebuildStatus", "links": null, "actions": null,
        "replica": "pvc-7-r-t", "fromReplica": "pvc-7-r-s", "state": state, "progress": progress,
        "isRebuilding": is_rebuilding, "error": error}])
}

fn statement_of<'a>(e: &'a pstack_envelope::Envelope, code: &str) -> &'a str {
    &e.claims.iter().find(|c| c.code == code).unwrap().statement
}

fn events_of(d: &Daemon, event: &str) -> Vec<Value> {
    d.watch_events()
        .into_iter()
        .filter(|e| e["event"] == event)
        .collect()
}

#[test]
fn root_a_rebuild_that_fails_is_captured_on_the_target_until_it_ends_and_its_error_is_linked() {
    if !root_or_skip(
        "root_a_rebuild_that_fails_is_captured_on_the_target_until_it_ends_and_its_error_is_linked",
    ) {
        return;
    }
    let _serial = serial();
    let bed = LonghornBed::new("lhw");
    let mut rb = bed.start_rebuild(3, Some((15, 15, 20_000)));
    let manager = FakeManager::start(lh_volume(json!([])));
    let dir = tempfile::tempdir().unwrap();
    let store = Store::start(dir.path());
    const TOKEN: &str = "kube-token-for-the-watch-test";
    let token_file = dir.path().join("k8s-token");
    std::fs::write(&token_file, TOKEN).unwrap();
    let kube = kube_api(
        TOKEN,
        format!(
            "Failed rebuilding replica with Address {LH_T}:{P_T}: failed to add replica tcp://{LH_T}:{P_T} for volume: rpc error: code = Unknown desc = read tcp {LH_T}:43999->{LH_S}:{}: read: connection reset by peer",
            P_S + 2
        ),
    );
    let rule = format!(
        "[[watch]]\nname = \"rebuilds\"\nkind = \"longhorn_rebuild\"\nmanager_url = \"http://{}/v1\"\nnode = \"node-t\"\nnetns = \"{}\"\npoll_seconds = 1\nwindow = \"60s\"\nkubernetes_api = \"http://{kube}\"\nkubernetes_token_file = \"{}\"\n",
        manager.addr,
        bed.t.name,
        token_file.display()
    );
    let settings = Settings {
        collector_url: Some(format!("http://{}", store.addr)),
        api_key: Some(store.key.clone()),
        backoff_initial_ms: 50,
        backoff_max_ms: 300,
        extra: rule,
        ..Settings::default()
    };
    let d = Daemon::start(&dir.path().join("d"), &settings);
    d.wait_status(Duration::from_secs(20), "the rule reads the manager", |s| {
        s["watch"]["rules"][0]["state"] == "armed"
            && s["watch"]["rules"][0]["longhorn"]["manager"]["state"] == "ok"
    });
    // No rebuild: polls, nothing fires.
    let reads = manager.list_reads();
    std::thread::sleep(Duration::from_millis(2500));
    assert!(
        manager.list_reads() >= reads + 2,
        "the rule polls the list every second"
    );
    assert!(events_of(&d, "fired").is_empty(), "{:#?}", d.watch_events());

    // The rebuild starts: a window starts on T.
    manager.set(lh_volume(entry("in_progress", true, 12, "")));
    let subject = "longhorn:pvc-7/pvc-7-r-t";
    let deadline = Instant::now() + Duration::from_secs(15);
    while !events_of(&d, "started")
        .iter()
        .any(|e| e["subject"] == subject)
    {
        assert!(
            Instant::now() < deadline,
            "no window started: {:#?}\n{:#}\n{}",
            d.watch_events(),
            d.status()["watch"],
            d.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let fired = events_of(&d, "fired");
    let fired = fired.iter().find(|e| e["subject"] == subject).unwrap();
    assert_eq!(fired["condition"]["role"], "target", "{fired:#}");
    assert_eq!(fired["condition"]["peer"], LH_S);
    assert_eq!(fired["condition"]["phase"], "started");
    let status = d.watch_rule("rebuilds");
    assert_eq!(
        status["longhorn"]["following"][0]["replica"], "pvc-7-r-t",
        "{status:#}"
    );
    // The rebuild's connections exist in T while the window runs.
    let ss = run("ip", &["netns", "exec", &bed.t.name, "ss", "-tn"]);
    let ss = String::from_utf8_lossy(&ss.stdout);
    assert!(
        ss.contains(&format!("{LH_S}:{}", P_S + 2)),
        "control T→S:P_S+2: {ss}"
    );
    assert!(
        ss.contains(&format!("{LH_T}:{}", P_T + 3)),
        "bulk S→T:P_T+3: {ss}"
    );
    std::thread::sleep(Duration::from_secs(2));

    // S resets the control channel; the manager reports the engine's error.
    rb.source_resets_control();
    let error = format!(
        "failed to send file volume-snap-c3.img to {LH_T}:{}: failed to sync: Post \"http://{LH_T}:{}/v1-ssync/open\": read tcp {}->{LH_S}:{}: read: connection reset by peer",
        P_T + 3,
        P_T + 3,
        rb.control_local,
        P_S + 2
    );
    let failed_at = Instant::now();
    manager.set(lh_volume(entry("error", false, 12, &error)));
    let captured = d.wait_captured(Duration::from_secs(40), "the rebuild's window", |e| {
        e["subject"] == subject
    });
    let took = failed_at.elapsed();
    assert!(
        took < Duration::from_secs(30),
        "the window ended with the rebuild, not at its 60 s bound: {took:?}"
    );
    let digests: Vec<String> = captured["envelopes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_str().unwrap().to_string())
        .collect();
    // Every envelope reaches the store; the transfer is the last.
    let envs: Vec<_> = digests.iter().map(|x| store.envelope(x)).collect();
    let transfer = envs.last().unwrap();
    let Subject::StorageTransfer(t) = &transfer.subject else {
        panic!("{:?}", transfer.subject)
    };
    assert_eq!(t.transfer_id, "pvc-7/pvc-7-r-t");
    let trig = transfer
        .collector
        .trigger
        .as_ref()
        .expect("fired by the rule");
    assert_eq!(
        (trig.rule.as_str(), trig.kind.as_str()),
        ("rebuilds", "longhorn_rebuild")
    );
    assert_eq!(trig.condition["replica"], "pvc-7-r-t");
    assert_eq!(
        surface(transfer, "longhorn/topology").facts["capture_role"],
        "target"
    );
    // The terminal reading is the end read: state error, its text.
    let end = surface(transfer, "longhorn/manager/end");
    assert_eq!(end.status, SurfaceStatus::Ok, "{end:?}");
    assert_eq!(
        end.facts["rebuild_status"][0]["state"], "error",
        "{:#?}",
        end.facts
    );
    // The error's connection is the control stream, by role.
    let named = transfer
        .claims
        .iter()
        .find(|c| c.code == "longhorn_error_names_stream")
        .unwrap_or_else(|| panic!("{:#?}", transfer.claims));
    let pair = format!("{}→{LH_S}:{}", rb.control_local, P_S + 2);
    assert!(named.statement.contains(&pair), "{}", named.statement);
    assert!(
        named.statement.contains("role sync_control"),
        "{}",
        named.statement
    );
    let links = surface(transfer, "streams").facts["links"]
        .as_array()
        .unwrap()
        .clone();
    let ctl = links.iter().find(|l| l["role"] == "sync_control").unwrap();
    assert!(named.statement.contains(ctl["digest"].as_str().unwrap()));
    assert!(
        links.iter().any(|l| l["role"] == "ssync_data"),
        "the bulk stream is linked: {links:#?}"
    );
    // The rule counted it: one start, one failure, one sealed window.
    let r = d.wait_status(Duration::from_secs(10), "the end is counted", |s| {
        s["watch"]["rules"][0]["captured_total"] == 1
    })["watch"]["rules"][0]
        .clone();
    assert_eq!(r["fired_total"], 1, "{r:#}");
    assert_eq!(r["longhorn"]["rebuilds_ended"]["failed_state_error"], 1);
    let ended = events_of(&d, "rebuild_ended");
    assert_eq!(ended.len(), 1, "{ended:#?}");
    assert_eq!(
        ended[0]["outcome"]["error_pairs"],
        format!("{}->{LH_S}:{}", rb.control_local, P_S + 2)
    );

    // 2. Another rebuild of the same replica; this time Longhorn drops the
    //    entry and marks the replica failed (`[]`, mode ERR, failedAt): the
    //    window ends, the end read is that reading, and the Events are read
    //    through the Kubernetes API.
    manager.set(lh_volume(entry("in_progress", true, 3, "")));
    let deadline = Instant::now() + Duration::from_secs(15);
    while events_of(&d, "started")
        .iter()
        .filter(|e| e["subject"] == subject)
        .count()
        < 2
    {
        assert!(
            Instant::now() < deadline,
            "no second window: {:#?}",
            d.watch_events()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_millis(1500));
    let mut gone: Value = serde_json::from_str(&lh_volume(json!([]))).unwrap();
    gone["replicas"][1]["mode"] = json!("ERR");
    gone["replicas"][1]["failedAt"] = json!("2026-12-04T18:00:00Z");
    manager.set(gone.to_string());
    let deadline = Instant::now() + Duration::from_secs(40);
    let second = loop {
        let caps: Vec<Value> = events_of(&d, "captured")
            .into_iter()
            .filter(|e| e["subject"] == subject)
            .collect();
        if caps.len() >= 2 {
            break caps[1].clone();
        }
        assert!(
            Instant::now() < deadline,
            "no second capture: {:#?}\n{}",
            d.watch_events(),
            d.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let last = second["envelopes"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .as_str()
        .unwrap()
        .to_string();
    let transfer = store.envelope(&last);
    let codes: Vec<&str> = transfer.claims.iter().map(|c| c.code.as_str()).collect();
    assert!(codes.contains(&"longhorn_rebuild_entry_gone"), "{codes:?}");
    let ev = transfer
        .claims
        .iter()
        .find(|c| c.code == "longhorn_failed_rebuilding_event")
        .unwrap_or_else(|| {
            panic!(
                "{codes:?} {:#?}",
                transfer
                    .surfaces
                    .iter()
                    .map(|s| (&s.id, s.status, &s.cause))
                    .collect::<Vec<_>>()
            )
        });
    assert!(
        ev.statement.contains("Engine pvc-7-e-0"),
        "{}",
        ev.statement
    );
    assert_eq!(
        surface(&transfer, "kubernetes/events/pvc-7-e-0").status,
        SurfaceStatus::Ok
    );
    assert!(
        statement_of(&transfer, "longhorn_rebuild_entry_gone")
            .contains("failedAt 2026-12-04T18:00:00Z"),
        "{codes:?}"
    );
    let ended = events_of(&d, "rebuild_ended");
    assert_eq!(ended.len(), 2, "{ended:#?}");
    assert_eq!(ended[1]["outcome"]["failure"], "replica_failed");
    assert!(!d.log_text().contains(TOKEN), "the token is never logged");
    assert!(!serde_json::to_string(&transfer).unwrap().contains(TOKEN));

    let r = d.watch_rule("rebuilds");
    eprintln!(
        "BENCH longhorn_rebuild poll: last poll {} us over loopback (GET /v1/volumes, one volume, {} polls); failure seen → window sealed {:.2} s",
        r["longhorn"]["manager"]["last_poll_us"],
        r["longhorn"]["manager"]["polls"],
        took.as_secs_f64()
    );
}
