//! Issue 20 item 8: pstackd's `longhorn_rebuild` rule on the three-namespace
//! Longhorn testbed (E, S, T), against a stand-in manager on loopback that
//! serves v1.9.0 `api/model.go` documents and whose answer the test flips:
//! no rebuild → `in_progress` (the rule starts a capture window on T while
//! T's control connection to S:P_S+2 and S's bulk stream to T:P_T+3 run) →
//! S resets the control channel and the manager says `error` with the
//! engine's real-format error text naming that connection (the window ends,
//! the terminal reading is sealed, the error's address pair is linked to
//! the control stream) → the envelopes reach a real `pstack-store`.
//!
//! Issue 30: a loopback Kubernetes API with a real Engine Events watch
//! (list for the resourceVersion, then streamed `WatchEvent` lines) and
//! Replica CRs: a dial timeout E→T:P_T before file sync (nftables drop) is
//! sealed with its `FailedRebuilding` text, the step and the dropped flow,
//! the window having opened at `Rebuilding`; a replica deleted on purpose
//! is not a failure; `Rebuilt` closes the terminal question as success; a
//! `RebuildFailed` condition is the verdict when the Event was missed.
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
use crate::longhorn::{lh_im, lh_settings_with, lh_volume};
use crate::testbed::*;

/// A stand-in Longhorn manager answering by path from shared state:
/// `GET /v1/volumes` (a go-rancher collection), `GET /v1/volumes/pvc-7`,
/// `GET /v1/instancemanagers/im-s|im-t`; anything else is 404.
struct FakeManager {
    addr: SocketAddr,
    volume: Arc<Mutex<String>>,
    /// The `GET /v1/settings` answer.
    settings: Arc<Mutex<String>>,
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
        let settings = Arc::new(Mutex::new(crate::longhorn::lh_settings()));
        let requests = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (v, r, st, se) = (
            volume.clone(),
            requests.clone(),
            stop.clone(),
            settings.clone(),
        );
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
                    "/v1/settings" => Some(se.lock().unwrap().clone()),
                    "/v1/instancemanagers/im-s" => Some(lh_im("im-s", "pvc-7-r-s", P_S)),
                    "/v1/instancemanagers/im-t" => Some(lh_im("im-t", "pvc-7-r-t", P_T)),
                    "/v1/instancemanagers/im-s2" => Some(lh_im("im-s2", "pvc-7-r-s2", P_S2)),
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
            settings,
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

/// A stand-in Kubernetes API on loopback, for bearer `token` (401
/// otherwise), serving what pstack reads (k8s.io/api `core/v1/types.go`
/// `Event`/`EventList`, apimachinery `metav1.WatchEvent`):
/// - `GET …/events?fieldSelector=involvedObject.kind%3DEngine&limit=…`: an
///   `EventList` of the Events pushed so far, with the current
///   `metadata.resourceVersion`;
/// - the same with `watch=1&resourceVersion=N&timeoutSeconds=S`: one JSON
///   line per Event pushed after N, streamed as pushed, closed after S;
/// - `GET …/events?fieldSelector=involvedObject.name%3D<name>`: the Events
///   on that object, pushed or `listed_only` (an Event the watch missed).
struct KubeFixture {
    addr: SocketAddr,
    events: Arc<Mutex<Vec<(u64, Value)>>>,
    listed_only: Arc<Mutex<Vec<Value>>>,
    watches: Arc<Mutex<u64>>,
    /// Replica CRs by name (`GET /apis/longhorn.io/v1beta2/namespaces/longhorn-system/replicas/<name>`).
    replicas: Arc<Mutex<std::collections::BTreeMap<String, Value>>>,
}

impl KubeFixture {
    fn start(token: &'static str) -> KubeFixture {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let events: Arc<Mutex<Vec<(u64, Value)>>> = Arc::new(Mutex::new(Vec::new()));
        let listed_only: Arc<Mutex<Vec<Value>>> = Arc::new(Mutex::new(Vec::new()));
        let watches = Arc::new(Mutex::new(0u64));
        let replicas = Arc::new(Mutex::new(std::collections::BTreeMap::new()));
        let (ev, lo, w, rp) = (
            events.clone(),
            listed_only.clone(),
            watches.clone(),
            replicas.clone(),
        );
        std::thread::spawn(move || {
            for s in l.incoming() {
                let Ok(s) = s else { continue };
                let (ev, lo, w, rp) = (ev.clone(), lo.clone(), w.clone(), rp.clone());
                std::thread::spawn(move || serve_kube(s, token, &ev, &lo, &w, &rp));
            }
        });
        KubeFixture {
            addr,
            events,
            listed_only,
            watches,
            replicas,
        }
    }

    /// Record an Event on the Engine `pvc-7-e-0`, as the manager's
    /// `eventRecorder.Eventf` does; its resourceVersion.
    fn push(&self, reason: &str, event_type: &str, message: &str) -> u64 {
        let mut ev = self.events.lock().unwrap();
        let rv = 100 + ev.len() as u64 + 1;
        ev.push((rv, engine_event(rv, reason, event_type, message)));
        rv
    }

    fn watch_requests(&self) -> u64 {
        *self.watches.lock().unwrap()
    }
}

fn engine_event(rv: u64, reason: &str, event_type: &str, message: &str) -> Value {
    let now = pstack_capture::clock::wall_time_now();
    json!({"metadata": {"name": format!("pvc-7-e-0.{rv:x}"), "namespace": "longhorn-system", "resourceVersion": rv.to_string()},
        "involvedObject": {"kind": "Engine", "namespace": "longhorn-system", "name": "pvc-7-e-0", "apiVersion": "longhorn.io/v1beta2"},
        "reason": reason, "message": message, "type": event_type, "count": 1,
        "source": {"component": "longhorn-engine-controller", "host": "node-e"},
        "firstTimestamp": now, "lastTimestamp": now, "reportingComponent": "", "reportingInstance": ""})
}

fn serve_kube(
    mut s: std::net::TcpStream,
    token: &str,
    events: &Mutex<Vec<(u64, Value)>>,
    listed_only: &Mutex<Vec<Value>>,
    watches: &Mutex<u64>,
    replicas: &Mutex<std::collections::BTreeMap<String, Value>>,
) {
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    let mut buf = vec![0u8; 8192];
    let n = s.read(&mut buf).unwrap_or(0);
    let head = String::from_utf8_lossy(&buf[..n]).to_string();
    let authorized = head.to_ascii_lowercase().contains(&format!(
        "authorization: bearer {}",
        token.to_ascii_lowercase()
    ));
    let target = head.split(' ').nth(1).unwrap_or("").to_string();
    let param = |k: &str| {
        target
            .split(['?', '&'])
            .find_map(|p| p.strip_prefix(&format!("{k}=")).map(str::to_string))
    };
    let reply = |s: &mut std::net::TcpStream, code: &str, body: Value| {
        let body = body.to_string();
        let _ = write!(
            s,
            "HTTP/1.1 {code}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
    };
    if !authorized {
        return reply(
            &mut s,
            "401 Unauthorized",
            json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Unauthorized", "code": 401}),
        );
    }
    if let Some(name) =
        target.strip_prefix("/apis/longhorn.io/v1beta2/namespaces/longhorn-system/replicas/")
    {
        return match replicas.lock().unwrap().get(name).cloned() {
            Some(cr) => reply(&mut s, "200 OK", cr),
            None => reply(
                &mut s,
                "404 Not Found",
                json!({"kind": "Status", "status": "Failure", "reason": "NotFound", "code": 404}),
            ),
        };
    }
    if !target.starts_with("/api/v1/namespaces/longhorn-system/events?") {
        return reply(
            &mut s,
            "404 Not Found",
            json!({"kind": "Status", "code": 404}),
        );
    }
    if param("watch").as_deref() == Some("1") {
        *watches.lock().unwrap() += 1;
        let mut from: u64 = param("resourceVersion")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let secs: u64 = param("timeoutSeconds")
            .and_then(|v| v.parse().ok())
            .unwrap_or(30);
        if write!(
            s,
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n"
        )
        .is_err()
        {
            return;
        }
        let end = Instant::now() + Duration::from_secs(secs);
        while Instant::now() < end {
            let new: Vec<(u64, Value)> = events
                .lock()
                .unwrap()
                .iter()
                .filter(|(rv, _)| *rv > from)
                .cloned()
                .collect();
            for (rv, e) in new {
                let line = json!({"type": "ADDED", "object": e}).to_string();
                if writeln!(s, "{line}").is_err() {
                    return;
                }
                from = rv;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        return;
    }
    let all = events.lock().unwrap().clone();
    let rv = all.last().map(|(rv, _)| *rv).unwrap_or(100);
    let items: Vec<Value> = match target.rsplit("involvedObject.name%3D").next() {
        Some(object) if target.contains("involvedObject.name%3D") => all
            .iter()
            .map(|(_, e)| e.clone())
            .chain(listed_only.lock().unwrap().iter().cloned())
            .filter(|e| e["involvedObject"]["name"] == object)
            .collect(),
        _ => all.iter().map(|(_, e)| e.clone()).collect(),
    };
    reply(
        &mut s,
        "200 OK",
        json!({"kind": "EventList", "apiVersion": "v1", "metadata": {"resourceVersion": rv.to_string()}, "items": items}),
    );
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
    let manager = FakeManager::start(volume_with_target(json!([]), "RW"));
    let dir = tempfile::tempdir().unwrap();
    let store = Store::start(dir.path());
    const TOKEN: &str = "kube-token-for-the-watch-test";
    let token_file = dir.path().join("k8s-token");
    std::fs::write(&token_file, TOKEN).unwrap();
    let kube = KubeFixture::start(TOKEN);
    // An Event the watch missed (pstackd started after it), read at the end.
    // Format: manager v1.9.0 `controller/engine_controller.go` l.1874 around
    // the engine's `FilesSync` error as in longhorn#11006.
    kube.listed_only.lock().unwrap().push(engine_event(
        1,
        "FailedRebuilding",
        "Warning",
        &format!(
            "Failed rebuilding replica with Address {LH_T}:{P_T}: proxyServer={LH_E}:8501 destination={LH_E}:10000: failed to add replica tcp://{LH_T}:{P_T} for volume: rpc error: code = Unknown desc = replica tcp://{LH_S}:{P_S} failed to send file volume-snap-c3.img to {LH_T}:{}: failed to send file volume-snap-c3.img to {LH_T}:{}: rpc error: code = Unavailable desc = error reading from server: read tcp {LH_T}:43999->{LH_S}:{}: read: connection reset by peer",
            P_T + 3,
            P_T + 3,
            P_S + 2
        ),
    ));
    let kube = kube.addr;
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
        // longhorn-engine v1.9.0 `pkg/sync/rpc/server.go` l.539 around
        // `pkg/replica/client/client.go` l.465 around the gRPC error, as in
        // longhorn#11006.
        "replica tcp://{LH_S}:{P_S} failed to send file volume-snap-c3.img to {LH_T}:{}: failed to send file volume-snap-c3.img to {LH_T}:{}: rpc error: code = Unavailable desc = error reading from server: read tcp {}->{LH_S}:{}: read: connection reset by peer",
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
    //    entry, removes the replica from the engine (`ReplicaRemove`, so
    //    mode "") and marks it failed (failedAt, outside backoff): the window
    //    ends, the end read is that reading, and the Events the watch missed
    //    are read through the Kubernetes API.
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
    gone["replicas"][1]["mode"] = json!("");
    gone["replicas"][1]["running"] = json!(false);
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

/// [`lh_volume`] with T's replica in `mode` (`""`: not in the engine yet,
/// or removed from it; `RW`: healthy; `WO`: added, rebuilding).
fn volume_with_target(rebuild: Value, mode: &str) -> String {
    let mut v: Value = serde_json::from_str(&lh_volume(rebuild)).unwrap();
    v["replicas"][1]["mode"] = json!(mode);
    v.to_string()
}

/// The manager's `Rebuilding` Event (v1.9.0 `controller/engine_controller.go` l.1860).
fn start_rebuilding() -> String {
    format!(
        "Start rebuilding replica pvc-7-r-t with Address {LH_T}:{P_T} for normal engine pvc-7-e-0 and volume pvc-7"
    )
}

/// One rule on one node of the bed, its manager, Kubernetes API and store.
struct Rig {
    bed: LonghornBed,
    manager: FakeManager,
    kube: KubeFixture,
    store: Store,
    d: Daemon,
    _dir: tempfile::TempDir,
}

const SUBJECT: &str = "longhorn:pvc-7/pvc-7-r-t";
const RIG_TOKEN: &str = "kube-token-for-the-events-watch";

/// The rule on `node` (`node-e`/`node-t`), capturing in that node's
/// namespace; T's replica starts outside the engine (`mode ""`). Returns
/// once the rule reads the manager and its Events watch is established.
fn rig(tag: &str, node: &str) -> Rig {
    let bed = LonghornBed::new(tag);
    let manager = FakeManager::start(volume_with_target(json!([]), ""));
    let dir = tempfile::tempdir().unwrap();
    let store = Store::start(dir.path());
    let token_file = dir.path().join("k8s-token");
    std::fs::write(&token_file, RIG_TOKEN).unwrap();
    let kube = KubeFixture::start(RIG_TOKEN);
    let netns = match node {
        "node-e" => bed.e.name.clone(),
        "node-s" => bed.s.name.clone(),
        _ => bed.t.name.clone(),
    };
    let rule = format!(
        "[[watch]]\nname = \"rebuilds\"\nkind = \"longhorn_rebuild\"\nmanager_url = \"http://{}\"\nnode = \"{node}\"\nnetns = \"{netns}\"\npoll_seconds = 1\nwindow = \"60s\"\nkubernetes_api = \"http://{}\"\nkubernetes_token_file = \"{}\"\n",
        manager.addr,
        kube.addr,
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
    d.wait_status(
        Duration::from_secs(20),
        "the rule reads the manager and watches the Engine Events",
        |s| {
            let r = &s["watch"]["rules"][0];
            r["state"] == "armed"
                && r["longhorn"]["manager"]["state"] == "ok"
                && r["longhorn"]["engine_events"]["state"] == "ok"
        },
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while kube.watch_requests() == 0 {
        assert!(Instant::now() < deadline, "no watch request after the list");
        std::thread::sleep(Duration::from_millis(20));
    }
    Rig {
        bed,
        manager,
        kube,
        store,
        d,
        _dir: dir,
    }
}

impl Rig {
    fn wait_event(&self, event: &str, what: &str, want: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(e) = events_of(&self.d, event).into_iter().find(|e| want(e)) {
                return e;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: {:#?}\n{:#}\n{}",
                self.d.watch_events(),
                self.d.status()["watch"],
                self.d.log_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The transfer envelope of the first capture of the rebuild.
    fn transfer(&self) -> pstack_envelope::Envelope {
        let captured = self
            .d
            .wait_captured(Duration::from_secs(40), "the rebuild's window", |e| {
                e["subject"] == SUBJECT
            });
        let last = captured["envelopes"]
            .as_array()
            .unwrap()
            .last()
            .unwrap()
            .as_str()
            .unwrap()
            .to_string();
        self.store.envelope(&last)
    }
}

fn codes_of(e: &pstack_envelope::Envelope) -> Vec<String> {
    e.claims.iter().map(|c| c.code.clone()).collect()
}

#[test]
fn root_a_dial_timeout_before_file_sync_is_sealed_with_the_event_the_step_and_the_dropped_flow() {
    if !root_or_skip(
        "root_a_dial_timeout_before_file_sync_is_sealed_with_the_event_the_step_and_the_dropped_flow",
    ) {
        return;
    }
    let _serial = serial();
    let rig = rig("lhd", "node-e");
    // T drops E's SYNs to P_T: the engine's GetReplica cannot connect.
    rig.bed.t.nft(&format!(
        "table inet pstest {{ chain input {{ type filter hook input priority 0; policy accept; \
         tcp dport {P_T} drop; }} }}"
    ));
    // The manager records `Rebuilding` and calls ReplicaAdd: the window
    // opens on the Event, while T's replica is not in the engine yet.
    rig.kube.push("Rebuilding", "Normal", &start_rebuilding());
    let started = rig.wait_event("started", "a window opened by the Rebuilding Event", |e| {
        e["subject"] == SUBJECT
    });
    let opened = rig.wait_event("rebuild_started", "the rebuild followed", |e| {
        e["replica"] == "pvc-7-r-t"
    });
    assert_eq!(opened["opened_by"], "Rebuilding Event", "{opened:#}");
    assert_eq!(opened["role"], "engine");
    let fired = events_of(&rig.d, "fired")
        .into_iter()
        .find(|e| e["subject"] == SUBJECT)
        .unwrap();
    assert_eq!(fired["condition"]["peer"], LH_T, "{fired:#}");
    assert_eq!(fired["condition"]["phase"], "started", "{started:#}");
    // Let the capture's first sample pass, then the engine dials T:P_T (E's
    // GetReplica) and times out on the dropped SYN.
    std::thread::sleep(Duration::from_millis(1500));
    let to: SocketAddr = format!("{LH_T}:{P_T}").parse().unwrap();
    let dial = rig.bed.e.spawn(move || {
        std::net::TcpStream::connect_timeout(&to, Duration::from_secs(4)).map(|_| ())
    });
    let dialled = dial.join().unwrap();
    let err = dialled.expect_err("the SYN is dropped");
    assert_eq!(err.kind(), std::io::ErrorKind::TimedOut, "{err}");
    // Only now does Longhorn say why: FailedRebuilding in #8091's format.
    let text = format!(
        "Failed rebuilding replica with Address {LH_T}:{P_T}: proxyServer={LH_E}:8501 destination={LH_E}:10000: failed to add replica tcp://{LH_T}:{P_T} for volume: rpc error: code = Unavailable desc = failed to get replica {LH_T}:{P_T}: rpc error: code = Unavailable desc = connection error: desc = \"transport: Error while dialing: dial tcp {LH_T}:{P_T}: i/o timeout\""
    );
    let event_at = Instant::now();
    rig.kube.push("FailedRebuilding", "Warning", &text);
    let transfer = rig.transfer();
    let sealed_in = event_at.elapsed();
    let codes = codes_of(&transfer);
    // The verdict: failed at GetReplica, before file sync, with the text.
    let failed = transfer
        .claims
        .iter()
        .find(|c| c.code == "longhorn_rebuild_failed")
        .unwrap_or_else(|| panic!("{codes:?}"));
    assert!(
        failed.statement.contains("at step get_replica"),
        "{}",
        failed.statement
    );
    assert!(
        failed.statement.contains("before file sync"),
        "{}",
        failed.statement
    );
    assert!(
        failed.statement.contains("i/o timeout"),
        "{}",
        failed.statement
    );
    // Both Events are in the envelope, in order.
    let evs: Vec<&str> = transfer
        .claims
        .iter()
        .filter(|c| c.code == "longhorn_engine_event")
        .map(|c| c.statement.as_str())
        .collect();
    assert_eq!(evs.len(), 2, "{evs:#?}");
    assert!(
        evs[0].starts_with("Kubernetes Event Rebuilding"),
        "{evs:#?}"
    );
    assert!(
        evs[1].starts_with("Kubernetes Event FailedRebuilding"),
        "{evs:#?}"
    );
    // The dropped flow is linked: E's connection to T:P_T, which lived
    // between the window's two sock_diag samples (eBPF saw it) and never
    // reached ESTABLISHED.
    let linked = transfer
        .claims
        .iter()
        .find(|c| {
            c.code == "longhorn_error_names_short_lived_flow"
                && c.statement
                    .contains(&format!("a connection to {LH_T}:{P_T}"))
        })
        .unwrap_or_else(|| panic!("{codes:?} {:#?}", transfer.claims));
    assert!(
        linked.statement.contains("FailedRebuilding"),
        "{}",
        linked.statement
    );
    assert!(
        linked.statement.contains(&format!("{LH_E}:"))
            && linked.statement.contains("SYN_SENT")
            && linked.statement.contains("never reached ESTABLISHED"),
        "{}",
        linked.statement
    );
    // The capture knew the target before file sync (from the rule).
    let topo = transfer
        .claims
        .iter()
        .find(|c| c.code == "longhorn_topology_resolved")
        .unwrap();
    assert!(
        topo.statement.contains("target pvc-7-r-t on node-t"),
        "{}",
        topo.statement
    );
    assert!(
        !codes.iter().any(|c| c == "longhorn_flag_mismatch"),
        "{codes:?}"
    );
    let trig = transfer.collector.trigger.as_ref().unwrap();
    assert_eq!(
        trig.condition["phase"], "started",
        "the window opened at the Rebuilding Event"
    );
    // No terminal question is left open.
    assert!(
        !transfer
            .unknowns
            .iter()
            .any(|u| u.blocks == "CLASSIFY_TRANSFER_TERMINAL"),
        "{:#?}",
        transfer.unknowns
    );
    let ended = rig.wait_event("rebuild_ended", "the end", |_| true);
    assert_eq!(
        ended["outcome"]["failure"], "failed_rebuilding",
        "{ended:#}"
    );
    assert_eq!(ended["outcome"]["step"], "get_replica");
    assert_eq!(ended["outcome"]["before_file_sync"], "true");
    assert!(
        !rig.d.log_text().contains(RIG_TOKEN),
        "the token is never logged"
    );
    eprintln!(
        "BENCH longhorn_rebuild FailedRebuilding Event → transfer sealed and captured {:.3} s",
        sealed_in.as_secs_f64()
    );
}

#[test]
fn root_a_replica_deleted_on_purpose_mid_rebuild_is_not_a_failure() {
    if !root_or_skip("root_a_replica_deleted_on_purpose_mid_rebuild_is_not_a_failure") {
        return;
    }
    let _serial = serial();
    let rig = rig("lhr", "node-t");
    let _rb = rig.bed.start_rebuild(0, None);
    // The engine added T in WO; file sync runs.
    rig.manager
        .set(volume_with_target(entry("in_progress", true, 20, ""), "WO"));
    rig.wait_event("started", "a window", |e| e["subject"] == SUBJECT);
    std::thread::sleep(Duration::from_millis(1500));
    // The user deletes the replica: it leaves the list, no FailedRebuilding.
    let mut v: Value = serde_json::from_str(&lh_volume(json!([]))).unwrap();
    v["replicas"].as_array_mut().unwrap().truncate(1);
    rig.manager.set(v.to_string());
    let ended = rig.wait_event("rebuild_ended", "the end", |_| true);
    assert_eq!(ended["outcome"]["outcome"], "removed", "{ended:#}");
    let transfer = rig.transfer();
    let codes = codes_of(&transfer);
    assert!(
        codes.iter().any(|c| c == "longhorn_rebuild_removed"),
        "{codes:?}"
    );
    assert!(
        !codes.iter().any(|c| c == "longhorn_rebuild_failed"),
        "{codes:?}"
    );
    let r = rig.d.watch_rule("rebuilds");
    assert_eq!(r["longhorn"]["rebuilds_ended"]["removed"], 1, "{r:#}");
    assert!(
        r["longhorn"]["rebuilds_ended"]
            .as_object()
            .unwrap()
            .keys()
            .all(|k| !k.starts_with("failed")),
        "{r:#}"
    );
    assert_eq!(r["longhorn"]["terminal_captures"], 0, "no failure capture");
}

#[test]
fn root_a_rebuilt_event_closes_the_terminal_question_as_success() {
    if !root_or_skip("root_a_rebuilt_event_closes_the_terminal_question_as_success") {
        return;
    }
    let _serial = serial();
    let rig = rig("lhb", "node-t");
    let _rb = rig.bed.start_rebuild(0, None);
    rig.kube.push("Rebuilding", "Normal", &start_rebuilding());
    rig.wait_event("started", "a window", |e| e["subject"] == SUBJECT);
    rig.manager
        .set(volume_with_target(entry("in_progress", true, 60, ""), "WO"));
    std::thread::sleep(Duration::from_millis(1500));
    // Success as upstream records it (v1.9.0 l.1916), before the manager's
    // next poll shows RW.
    rig.kube.push(
        "Rebuilt",
        "Normal",
        &format!("Replica pvc-7-r-t with Address {LH_T}:{P_T} has been rebuilt for volume pvc-7"),
    );
    let ended = rig.wait_event("rebuild_ended", "the end", |_| true);
    assert_eq!(ended["outcome"]["outcome"], "complete", "{ended:#}");
    assert_eq!(ended["outcome"]["basis"], "Rebuilt Event");
    let transfer = rig.transfer();
    let codes = codes_of(&transfer);
    let done = transfer
        .claims
        .iter()
        .find(|c| c.code == "longhorn_rebuild_complete")
        .unwrap_or_else(|| panic!("{codes:?}"));
    assert!(
        done.statement.contains("Rebuilt Event"),
        "{}",
        done.statement
    );
    assert!(
        !transfer
            .unknowns
            .iter()
            .any(|u| u.blocks == "CLASSIFY_TRANSFER_TERMINAL"),
        "{:#?}",
        transfer.unknowns
    );
    assert!(
        codes.iter().any(|c| c == "longhorn_engine_event"),
        "{codes:?}"
    );
}

#[test]
fn root_a_rebuild_failed_condition_on_the_replica_cr_is_the_verdict_when_the_event_was_missed() {
    if !root_or_skip(
        "root_a_rebuild_failed_condition_on_the_replica_cr_is_the_verdict_when_the_event_was_missed",
    ) {
        return;
    }
    let _serial = serial();
    let rig = rig("lhc", "node-t");
    let _rb = rig.bed.start_rebuild(0, None);
    rig.manager
        .set(volume_with_target(entry("in_progress", true, 30, ""), "WO"));
    rig.wait_event("started", "a window", |e| e["subject"] == SUBJECT);
    std::thread::sleep(Duration::from_millis(1500));
    // Outside backoff the manager sets the condition (engine_controller.go
    // v1.9.0 l.1892-1899, reason from getReplicaRebuildFailedReasonFromError)
    // and removes the replica from the engine; the watch never saw the Event.
    let message = format!(
        "proxyServer={LH_E}:8501 destination={LH_E}:10000: failed to add replica tcp://{LH_T}:{P_T} for volume: rpc error: code = Unavailable desc = error reading from server: EOF"
    );
    rig.kube.replicas.lock().unwrap().insert(
        "pvc-7-r-t".into(),
        json!({"apiVersion": "longhorn.io/v1beta2", "kind": "Replica",
            "metadata": {"name": "pvc-7-r-t", "namespace": "longhorn-system"},
            "spec": {"failedAt": "2026-12-07T08:00:00Z"},
            "status": {"conditions": [{"type": "RebuildFailed", "status": "True", "reason": "Disconnection", "message": message}]}}),
    );
    let mut v: Value = serde_json::from_str(&volume_with_target(json!([]), "")).unwrap();
    v["replicas"][1]["failedAt"] = json!("2026-12-07T08:00:00Z");
    rig.manager.set(v.to_string());
    let ended = rig.wait_event("rebuild_ended", "the end", |_| true);
    assert_eq!(
        ended["outcome"]["failure"], "rebuild_failed_condition",
        "{ended:#}"
    );
    assert!(
        ended["outcome"]["error"]
            .as_str()
            .unwrap()
            .starts_with("RebuildFailed (Disconnection): "),
        "{ended:#}"
    );
    let transfer = rig.transfer();
    let failed = transfer
        .claims
        .iter()
        .find(|c| c.code == "longhorn_rebuild_failed")
        .unwrap_or_else(|| panic!("{:?}", codes_of(&transfer)));
    assert!(
        failed.statement.contains("Disconnection"),
        "{}",
        failed.statement
    );
    let r = rig.d.watch_rule("rebuilds");
    assert!(
        r["longhorn"]["replica_crs"]["reads"].as_u64().unwrap() >= 1,
        "{r:#}"
    );
}

/// Issue 30, storage network: with `storage-network` set, the rebuild runs
/// on a second network (a second veth pair per namespace, as Multus's
/// `lhnet1`) whose addresses only the Replica CRs' `status.storageIP`
/// give; the REST API gives pod IPs. The capture on T reads the CRs through
/// the Kubernetes API, selects flows on the storage IPs (none on the pod
/// network, where a connection inside S's port block is left as a decoy)
/// and says so in the envelope.
#[test]
fn root_under_a_storage_network_flows_are_selected_on_the_replica_crs_storage_ips() {
    if !root_or_skip(
        "root_under_a_storage_network_flows_are_selected_on_the_replica_crs_storage_ips",
    ) {
        return;
    }
    let _serial = serial();
    let rig = rig("lhn", "node-t");
    rig.bed.add_storage_network();
    *rig.manager.settings.lock().unwrap() = lh_settings_with("kube-system/demo-192-168-0-0");
    for (name, pod_ip, storage_ip, port) in [
        ("pvc-7-r-s", LH_S, LH_S_STORAGE, P_S),
        ("pvc-7-r-t", LH_T, LH_T_STORAGE, P_T),
    ] {
        rig.kube.replicas.lock().unwrap().insert(
            name.into(),
            json!({"apiVersion": "longhorn.io/v1beta2", "kind": "Replica",
                "metadata": {"name": name, "namespace": "longhorn-system"},
                "spec": {"failedAt": ""},
                "status": {"ip": pod_ip, "storageIP": storage_ip, "port": port, "conditions": []}}),
        );
    }
    let _rb = rig
        .bed
        .start_rebuild_on([LH_S_STORAGE, LH_T_STORAGE], 0, None);
    // A decoy on the pod network inside S's block (T → S:P_S+5).
    let decoy_l = rig
        .bed
        .s
        .within(|| std::net::TcpListener::bind(format!("{LH_S}:{}", P_S + 5)).expect("bind decoy"));
    let _decoy_t = rig.bed.t.within(|| {
        std::net::TcpStream::connect(format!("{LH_S}:{}", P_S + 5)).expect("connect decoy")
    });
    let _decoy_s = decoy_l.accept().unwrap();
    rig.manager
        .set(volume_with_target(entry("in_progress", true, 30, ""), "WO"));
    rig.wait_event("started", "a window", |e| e["subject"] == SUBJECT);
    std::thread::sleep(Duration::from_millis(1500));
    rig.kube.push(
        "Rebuilt",
        "Normal",
        &format!(
            "Replica pvc-7-r-t with Address {LH_T_STORAGE}:{P_T} has been rebuilt for volume pvc-7"
        ),
    );
    rig.wait_event("rebuild_ended", "the end", |_| true);
    let transfer = rig.transfer();
    let selected = statement_of(&transfer, "longhorn_flows_selected_on");
    assert!(
        selected.starts_with("flows selected on the storage_network"),
        "{selected}"
    );
    for ip in [LH_S_STORAGE, LH_T_STORAGE] {
        assert!(selected.contains(ip), "{selected}");
    }
    let topo = surface(&transfer, "longhorn/topology");
    assert_eq!(
        topo.facts["selected_on"]["network"], "storage_network",
        "{:#?}",
        topo.facts
    );
    assert_eq!(topo.facts["capture_role"], "target", "{:#?}", topo.facts);
    let links = surface(&transfer, "streams").facts["links"]
        .as_array()
        .unwrap()
        .clone();
    let mut roles: Vec<&str> = links.iter().filter_map(|l| l["role"].as_str()).collect();
    roles.sort();
    assert_eq!(roles, ["ssync_data", "sync_control"], "{links:#?}");
    for l in &links {
        for end in ["src", "dst"] {
            let a = l[end].as_str().unwrap();
            assert!(
                a.starts_with("10.79.0."),
                "{end} {a} not on the storage network: {l}"
            );
        }
    }
}

/// A v1.11 volume: a second source `pvc-7-r-s2` on node-s (im-s2, block
/// P_S2) and T's entry naming both in `fromReplicaList`
/// (`api/model.go` v1.11.x `RebuildStatus`).
fn v1_11_volume(state: &str, progress: i64, error: &str) -> String {
    let mut v: Value = serde_json::from_str(&volume_with_target(
        json!([{"id": "", "type": "rebuildStatus", "links": null, "actions": null,
            "replica": "pvc-7-r-t", "fromReplicaList": ["pvc-7-r-s", "pvc-7-r-s2"],
            "state": state, "progress": progress, "isRebuilding": state == "in_progress", "error": error}]),
        "WO",
    ))
    .unwrap();
    let mut s2 = v["replicas"][0].clone();
    s2["name"] = json!("pvc-7-r-s2");
    s2["instanceManagerName"] = json!("im-s2");
    v["replicas"].as_array_mut().unwrap().push(s2);
    v.to_string()
}

/// Issue 30, multi-source (v1.11+): a rebuild from two sources on S's node;
/// the first source's control channel is reset by S, the engine's text
/// names it while the entry stays `in_progress`, and T's sync agent opens
/// the file's next attempt. Both sources' flows are labelled with their
/// replica, the reset is counted as a retry (not the end), and the rebuild
/// is judged by its final state (`Rebuilt`: complete).
#[test]
fn root_a_v1_11_rebuild_from_two_sources_counts_a_reset_and_retry_and_ends_by_its_final_state() {
    if !root_or_skip(
        "root_a_v1_11_rebuild_from_two_sources_counts_a_reset_and_retry_and_ends_by_its_final_state",
    ) {
        return;
    }
    let _serial = serial();
    let rig = rig("lhm", "node-s");
    let mut rb = rig.bed.start_rebuild(0, None);
    // The second source: T's sync agent → S2:P_S2+2 (FileSend), S2 → T:P_T+4.
    let pair = |from: &Netns, to: &Netns, ip: &'static str, port: u16| {
        let l =
            to.within(move || std::net::TcpListener::bind(format!("{ip}:{port}")).expect("bind"));
        let c = from
            .within(move || std::net::TcpStream::connect(format!("{ip}:{port}")).expect("connect"));
        (c, l.accept().unwrap().0)
    };
    let _s2_control = pair(&rig.bed.t, &rig.bed.s, LH_S, P_S2 + 2);
    let _s2_bulk = pair(&rig.bed.s, &rig.bed.t, LH_T, P_T + 4);
    rig.manager.set(v1_11_volume("in_progress", 20, ""));
    rig.wait_event("started", "a window", |e| e["subject"] == SUBJECT);
    std::thread::sleep(Duration::from_millis(1500));
    // S resets the first source's control channel; the engine's text names
    // it (sync/rpc/server.go FileSend error, #11006 shape) and the entry
    // stays in file sync.
    let t_end = rb.control_local;
    rb.source_resets_control();
    let reset = format!(
        "replica tcp://{LH_S}:{P_S} failed to send file volume-snap-x.img to {LH_T}:{}: failed to send file volume-snap-x.img to {LH_T}:{}: rpc error: code = Unavailable desc = error reading from server: read tcp {t_end}->{LH_S}:{}: read: connection reset by peer",
        P_T + 3,
        P_T + 3,
        P_S + 2
    );
    rig.manager.set(v1_11_volume("in_progress", 40, &reset));
    std::thread::sleep(Duration::from_millis(2000));
    // The file's next attempt: T's sync agent opens a new FileSend channel.
    let _retry = pair(&rig.bed.t, &rig.bed.s, LH_S, P_S + 2);
    rig.manager.set(v1_11_volume("in_progress", 80, ""));
    std::thread::sleep(Duration::from_millis(2000));
    rig.kube.push(
        "Rebuilt",
        "Normal",
        &format!("Replica pvc-7-r-t with Address {LH_T}:{P_T} has been rebuilt for volume pvc-7"),
    );
    let ended = rig.wait_event("rebuild_ended", "the end", |_| true);
    assert_eq!(ended["outcome"]["outcome"], "complete", "{ended:#}");
    assert_eq!(ended["outcome"]["retries"], "1", "{ended:#}");
    let transfer = rig.transfer();
    let codes = codes_of(&transfer);
    assert!(
        codes.iter().any(|c| c == "longhorn_rebuild_complete"),
        "{codes:?}"
    );
    assert!(
        !codes.iter().any(|c| c == "longhorn_rebuild_failed"),
        "{codes:?}"
    );
    let retries = statement_of(&transfer, "longhorn_rebuild_retries");
    assert!(retries.contains("survived 1 reset(s)"), "{retries}");
    assert!(
        retries.contains("pvc-7-r-s not named by a failure, 1 retried reset(s)"),
        "{retries}"
    );
    assert!(
        retries.contains("pvc-7-r-s2 not named by a failure;")
            || retries.ends_with("pvc-7-r-s2 not named by a failure"),
        "{retries}"
    );
    let links = surface(&transfer, "streams").facts["links"]
        .as_array()
        .unwrap()
        .clone();
    let labelled: Vec<(String, String)> = links
        .iter()
        .map(|l| {
            (
                l["role"].as_str().unwrap_or("").to_string(),
                l["source_replica"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    for source in ["pvc-7-r-s", "pvc-7-r-s2"] {
        assert!(
            labelled.contains(&("sync_control".to_string(), source.to_string())),
            "{source}: {labelled:?}"
        );
    }
    assert!(
        labelled.iter().any(|(r, _)| r == "ssync_data"),
        "{labelled:?}"
    );
    assert_eq!(
        surface(&transfer, "streams").facts["excluded_count"],
        0,
        "the second source's flows are not another volume's"
    );
}
