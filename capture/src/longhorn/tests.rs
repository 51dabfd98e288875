//! Manager fixtures built to the v1.9.0 and v1.11.0 `api/model.go`
//! shapes (`fixtures/`), each with the facts and unknowns it must
//! produce; and the bad inputs over real loopback HTTP. No root.
use std::io::{Read, Write};
use std::net::TcpListener;

use pstack_envelope::{ClaimKind, Completeness, StreamIdentity, Subject, SurfaceStatus};
use serde_json::json;

use super::*;

const IN_PROGRESS: &[u8] = include_bytes!("fixtures/v1.9-in-progress.json");
const ERROR: &[u8] = include_bytes!("fixtures/v1.9-error.json");
const UNREPORTED: &[u8] = include_bytes!("fixtures/v1.9-unreported.json");
/// After a failed rebuild outside backoff: the engine removed the replica
/// (`ReplicaRemove`, manager v1.9.0 `controller/engine_controller.go`
/// l.1880), so its REST `mode` (the engine's `ReplicaModeMap`, `api/model.go`
/// l.1515-1520) is `""`, not `ERR`; `failedAt` set and desire state stopped
/// (l.1892-1899), so `running: false`.
const AFTER_FAILURE: &[u8] = include_bytes!("fixtures/v1.9-after-failure.json");
const V11_IN_PROGRESS: &[u8] = include_bytes!("fixtures/v1.11-in-progress.json");
const V11_COMPLETE: &[u8] = include_bytes!("fixtures/v1.11-complete.json");
const V2: &[u8] = include_bytes!("fixtures/v2-volume.json");
const IM_S: &[u8] = include_bytes!("fixtures/im-s.json");
const IM_T: &[u8] = include_bytes!("fixtures/im-t.json");

// S = 10.78.0.2 block 10000-10009, T = 10.78.0.3 block 10020-10029,
// another volume's replica on T at 10030-10039.
const CONTROL: (&str, &str) = ("10.78.0.3:43126", "10.78.0.2:10002");
const BULK: (&str, &str) = ("10.78.0.3:10024", "10.78.0.2:40100");
const OTHER: (&str, &str) = ("10.78.0.3:10031", "10.78.0.2:40200");

fn read(url: &str, body: &[u8]) -> ApiRead {
    ApiRead {
        url: url.into(),
        at: "2026-12-03T19:40:00.000Z".into(),
        result: Ok(body.to_vec()),
        elapsed_us: 7,
    }
}

fn stream((src, dst): (&str, &str), sockopt: Option<serde_json::Value>) -> Envelope {
    let mut e = pstack_envelope::example::example_sealed();
    e.subject = Subject::NetworkStream(StreamIdentity {
        src: src.into(),
        dst: dst.into(),
        flow_id: format!("{src}>{dst}"),
        net_ns: None,
        protocol: "tcp".into(),
    });
    e.digest = pstack_envelope::sha256_digest(format!("{src}{dst}").as_bytes());
    e.completeness = Completeness::Complete;
    e.universe.termination = pstack_envelope::Termination::Exhausted;
    if let Some(v) = sockopt {
        let mut s = e.surfaces[0].clone();
        s.id = "tcp/sockopt".into();
        s.status = SurfaceStatus::Ok;
        s.facts = v.as_object().unwrap().clone();
        e.surfaces.push(s);
    }
    e
}

fn request(target_node: &str) -> LonghornRequest {
    serde_json::from_value(json!({
        "volume": "pvc-7", "engine": "pvc-7-e-0", "source_node": "node-s",
        "target_node": target_node, "peer": "10.78.0.2",
        "longhorn_api": "http://lh:9500/v1"
    }))
    .unwrap()
}

/// Readings of a target-side capture: `start`/`end` volume documents,
/// the three flows (`flows`) selected by the S/T port blocks.
fn readings(start: &[u8], end: &[u8], flows: Vec<Envelope>) -> Readings {
    let topo = model::parse_volume(start)
        .ok()
        .filter(|v| v.data_engine != "v2")
        .map(|v| {
            let mut t = topology::resolve(&v, None);
            for im in [IM_S, IM_T] {
                t.set_blocks(&model::parse_instance_manager(im).unwrap());
            }
            t
        });
    let (streams, excluded, by_ip) = select(
        CaptureResult {
            net_ns: 4026531840,
            flows,
            no_match: None,
            short_lived: None,
        },
        topo.as_ref(),
    );
    let ims = if topo.is_some() {
        vec![
            (
                "instance-manager-s".to_string(),
                read(
                    "http://lh:9500/v1/instancemanagers/instance-manager-s",
                    IM_S,
                ),
            ),
            (
                "instance-manager-t".to_string(),
                read(
                    "http://lh:9500/v1/instancemanagers/instance-manager-t",
                    IM_T,
                ),
            ),
        ]
    } else {
        Vec::new()
    };
    Readings {
        streams,
        excluded,
        start: Some(read("http://lh:9500/v1/volumes/pvc-7", start)),
        end: Some(read("http://lh:9500/v1/volumes/pvc-7", end)),
        ims,
        topology: topo,
        by_ip,
        hubble: None,
        events: None,
        signals: Vec::new(),
        verdict: None,
        settings: None,
        selected_on: None,
        clock: Clock {
            wall_time: "2026-12-03T19:39:58.000Z".into(),
            monotonic_start_ns: "1".into(),
            monotonic_end_ns: "2".into(),
            bundle_deadline_ms: 30_000,
        },
    }
}

fn three() -> Vec<Envelope> {
    vec![
        stream(CONTROL, None),
        stream(BULK, None),
        stream(OTHER, None),
    ]
}

fn build(req: &LonghornRequest, r: &Readings) -> Envelope {
    let plan = plan(req).unwrap();
    transfer_envelope(req, &plan.transport, r).unwrap()
}

fn codes(e: &Envelope) -> Vec<&str> {
    e.claims.iter().map(|c| c.code.as_str()).collect()
}

fn statement<'a>(e: &'a Envelope, code: &str) -> &'a str {
    &e.claims
        .iter()
        .find(|c| c.code == code)
        .unwrap_or_else(|| panic!("{code} not in {:?}", codes(e)))
        .statement
}

fn blocks(e: &Envelope) -> Vec<&str> {
    e.unknowns.iter().map(|u| u.blocks.as_str()).collect()
}

#[test]
fn the_transfer_envelope_declares_every_cap_it_enforced() {
    let e = build(&request(""), &readings(IN_PROGRESS, IN_PROGRESS, three()));
    let caps = &e.bounds.caps;
    assert_eq!(
        caps.get("max_api_bytes"),
        Some(&(client::MAX_API_BYTES as u64))
    );
    assert_eq!(
        caps.get("api_deadline_ms"),
        Some(&(client::API_DEADLINE.as_millis() as u64))
    );
    assert_eq!(caps.get("max_api_reads"), Some(&u64::from(MAX_API_READS)));
    assert!(caps.contains_key("max_flows"), "{caps:?}");
    // No Hubble server asked for: no Hubble caps claimed.
    assert!(!caps.keys().any(|k| k.starts_with("hubble_")), "{caps:?}");
    let mut with_hubble = request("");
    with_hubble.hubble_server = Some("127.0.0.1:4245".into());
    let e = build(&with_hubble, &readings(IN_PROGRESS, IN_PROGRESS, three()));
    for k in [
        "hubble_deadline_ms",
        "hubble_max_output_bytes",
        "hubble_lookback_ms",
    ] {
        assert!(
            e.bounds.caps.contains_key(k),
            "{k} missing: {:?}",
            e.bounds.caps
        );
    }
}

#[test]
fn fixtures_produce_their_facts_and_unknowns() {
    // (name, start, end, must have, must not have, terminal unknown open)
    type Row<'a> = (
        &'a str,
        &'a [u8],
        &'a [u8],
        Vec<&'a str>,
        Vec<&'a str>,
        bool,
    );
    let table: Vec<Row> = vec![
        (
            "v1.9 in progress",
            IN_PROGRESS,
            IN_PROGRESS,
            vec![
                "longhorn_topology_resolved",
                "longhorn_manager_reports_rebuild",
                "longhorn_flows_excluded",
                "streams_linked",
            ],
            vec![
                "longhorn_rebuild_entry_gone",
                "longhorn_error_names_stream",
                "longhorn_flag_mismatch",
            ],
            true,
        ),
        (
            "v1.9 error with the 4-tuple",
            IN_PROGRESS,
            ERROR,
            vec!["longhorn_error_names_stream"],
            vec![
                "longhorn_rebuild_entry_gone",
                "longhorn_error_names_unlinked_connection",
            ],
            false,
        ),
        (
            "v1.9 empty state",
            IN_PROGRESS,
            UNREPORTED,
            vec!["longhorn_manager_reports_rebuild"],
            vec!["longhorn_error_names_stream", "longhorn_rebuild_entry_gone"],
            true,
        ),
        (
            "v1.9 [] after failure",
            IN_PROGRESS,
            AFTER_FAILURE,
            vec!["longhorn_rebuild_entry_gone"],
            vec!["longhorn_error_names_stream"],
            true,
        ),
        (
            "v1.11 in progress",
            V11_IN_PROGRESS,
            V11_IN_PROGRESS,
            vec!["longhorn_topology_resolved"],
            vec!["longhorn_rebuild_entry_gone"],
            true,
        ),
        (
            "v1.11 complete",
            V11_IN_PROGRESS,
            V11_COMPLETE,
            vec!["longhorn_manager_reports_rebuild"],
            vec!["longhorn_rebuild_entry_gone"],
            false,
        ),
    ];
    for (name, start, end, has, hasnt, open) in table {
        let e = build(&request(""), &readings(start, end, three()));
        let c = codes(&e);
        for h in &has {
            assert!(c.contains(h), "{name}: {h} missing from {c:?}");
        }
        for h in &hasnt {
            assert!(!c.contains(h), "{name}: {h} present: {c:?}");
        }
        assert_eq!(
            blocks(&e).contains(&"CLASSIFY_TRANSFER_TERMINAL"),
            open,
            "{name}: terminal unknown {:?}",
            e.unknowns
        );
        // Its own clock, not a stream's.
        assert_eq!(e.clock.wall_time, "2026-12-03T19:39:58.000Z", "{name}");
        let Subject::StorageTransfer(t) = &e.subject else {
            panic!()
        };
        assert_eq!(t.transfer_id, "pvc-7/pvc-7-r-t", "{name}: the join key");
        assert_eq!(t.target_node, "node-t", "{name}: from the manager");
        let topo = &e
            .surfaces
            .iter()
            .find(|s| s.id == "longhorn/topology")
            .unwrap()
            .facts;
        assert_eq!(topo["capture_role"], "target", "{name}");
        assert_eq!(topo["rebuild_identity"]["replica"], "pvc-7-r-t", "{name}");
        assert_eq!(
            topo["topology"]["source"]["block"]["start"], 10000,
            "{name}"
        );
        let streams = &e.surfaces[0].facts;
        assert_eq!(streams["excluded_count"], 1, "{name}");
        let roles: Vec<&str> = streams["links"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|l| l["role"].as_str())
            .collect();
        assert_eq!(roles, ["sync_control", "ssync_data"], "{name}");
    }
    // The error names the control channel by role, as a fact.
    let e = build(&request(""), &readings(IN_PROGRESS, ERROR, three()));
    let s = statement(&e, "longhorn_error_names_stream");
    assert!(
        s.contains("connection reset by peer on 10.78.0.3:43126→10.78.0.2:10002"),
        "{s}"
    );
    assert!(s.contains("role sync_control"), "{s}");
    // Entry gone: the probes are the replica's condition/failedAt and the Events.
    let e = build(&request(""), &readings(IN_PROGRESS, AFTER_FAILURE, three()));
    assert!(statement(&e, "longhorn_rebuild_entry_gone").contains("failedAt 2026-12-03T19:40:12Z"));
    let u = e
        .unknowns
        .iter()
        .find(|u| u.blocks == "CLASSIFY_TRANSFER_TERMINAL")
        .unwrap();
    assert!(
        u.probe.contains("RebuildFailed") && u.probe.contains("reason=FailedRebuilding"),
        "{}",
        u.probe
    );
    // v1.11 reads fromReplicaList.
    let e = build(
        &request(""),
        &readings(V11_IN_PROGRESS, V11_COMPLETE, three()),
    );
    let m = &e
        .surfaces
        .iter()
        .find(|s| s.id == "longhorn/manager/end")
        .unwrap()
        .facts;
    assert_eq!(m["shape"], "v1.11+ (fromReplicaList)");
    assert_eq!(m["rebuild_status"][0]["from_replicas"][0], "pvc-7-r-s");
    assert_eq!(m["rebuild_status"][0]["progress"], 100);
    assert!(
        m["base_url_note"].is_string(),
        "the /v1 base URL is reported"
    );
}

#[test]
fn flags_are_checked_and_a_storage_network_is_a_fact_with_a_probe() {
    let e = build(
        &request("node-x"),
        &readings(IN_PROGRESS, IN_PROGRESS, three()),
    );
    assert!(statement(&e, "longhorn_flag_mismatch").contains("--target-node node-x"));
    let Subject::StorageTransfer(t) = &e.subject else {
        panic!()
    };
    assert_eq!(
        t.target_node, "node-x",
        "the override stands, and its mismatch is recorded"
    );
    // Storage network: flows on 192.168.78.x, peer not a pod IP.
    let mut req = request("");
    req.peer = "192.168.78.2".into();
    let flows = vec![
        stream(("192.168.78.3:43126", "192.168.78.2:10002"), None),
        stream(("192.168.78.3:10031", "192.168.78.2:40200"), None),
    ];
    let r = readings(IN_PROGRESS, IN_PROGRESS, flows);
    assert!(!r.by_ip);
    let e = build(&req, &r);
    assert!(codes(&e).contains(&"longhorn_flag_mismatch"));
    assert!(blocks(&e).contains(&"RESOLVE_STORAGE_NETWORK"));
    assert_eq!(e.surfaces[0].facts["excluded_count"], 1);
    assert_eq!(e.surfaces[0].facts["links"][0]["role"], "sync_control");
}

/// S's sync agent's accepted end of T's `FileSend` channel (S:P_S+2).
const CONTROL_AT_S: (&str, &str) = ("10.78.0.2:10002", "10.78.0.3:43126");
/// T's sync agent's accepted end of E's `FilesSync` channel (T:P_T+2).
const FILES_SYNC_AT_T: (&str, &str) = ("10.78.0.3:10022", "10.78.0.1:51000");

#[test]
fn keepalive_against_user_timeout_on_the_control_channel_is_a_hypothesis_with_a_falsifier() {
    let so = |ut: i64, idle: i64| json!({"owner_pid": 1, "fd": 3, "owner_comm": "longhorn", "user_timeout_ms": ut, "keepalive": true, "keepidle_s": idle, "keepintvl_s": 15, "keepcnt": 9});
    let hyps = |e: &Envelope| {
        e.claims
            .iter()
            .filter(|c| c.code == "control_channel_user_timeout_below_keepalive_retry")
            .cloned()
            .collect::<Vec<_>>()
    };
    // The aborting side is the gRPC server's accepted socket: S's sync
    // agent for FileSend, T's for FilesSync; both idle channels are checked.
    let e = build(
        &request(""),
        &readings(
            IN_PROGRESS,
            IN_PROGRESS,
            vec![
                stream(CONTROL_AT_S, Some(so(20_000, 15))),
                stream(FILES_SYNC_AT_T, Some(so(20_000, 15))),
                stream(BULK, Some(so(20_000, 15))),
            ],
        ),
    );
    let h = hyps(&e);
    assert_eq!(
        h.len(),
        2,
        "both idle channels, not the bulk stream: {:?}",
        codes(&e)
    );
    assert!(h.iter().all(|h| h.kind == ClaimKind::Hypothesis));
    assert!(
        h[0].statement.contains("TCP_USER_TIMEOUT is 20000 ms")
            && h[0].statement.contains("the source's sync agent (S:P_S+2)")
            && h[0].statement.contains("FileSend"),
        "{}",
        h[0].statement
    );
    assert!(
        h[1].statement.contains("the target's sync agent (T:P_T+2)")
            && h[1].statement.contains("FilesSync"),
        "{}",
        h[1].statement
    );
    assert!(h[0].falsifier.as_deref().unwrap().contains("20000 ms"));
    // The client's end (T's ephemeral port) is not the side that aborts.
    let e = build(
        &request(""),
        &readings(
            IN_PROGRESS,
            IN_PROGRESS,
            vec![stream(CONTROL, Some(so(20_000, 15)))],
        ),
    );
    assert!(hyps(&e).is_empty(), "{:?}", codes(&e));
    assert!(statement(&e, "control_channel_client_side").contains("S:P_S+2"));
    // Upstream's fix: the OS keepalive (first probe after 2 h) is not the hazard.
    let e = build(
        &request(""),
        &readings(
            IN_PROGRESS,
            IN_PROGRESS,
            vec![stream(CONTROL_AT_S, Some(so(20_000, 7200)))],
        ),
    );
    assert!(hyps(&e).is_empty(), "{:?}", codes(&e));
    assert!(
        statement(&e, "control_channel_keepalive_not_hazardous")
            .contains("preserve OS TCP keepalive")
    );
    // Near misses: no user timeout, or one that outlasts the keepalive retry.
    for ut in [0, 31_000] {
        let e = build(
            &request(""),
            &readings(
                IN_PROGRESS,
                IN_PROGRESS,
                vec![stream(CONTROL_AT_S, Some(so(ut, 15)))],
            ),
        );
        assert!(hyps(&e).is_empty(), "{ut}");
    }
}

#[test]
fn hubble_connections_carry_their_rebuild_role_and_no_drop_does_not_clear() {
    let out = br#"{"flow":{"time":"t1","verdict":"FORWARDED","IP":{"source":"10.78.0.3","destination":"10.78.0.2"},"l4":{"TCP":{"source_port":43126,"destination_port":10002,"flags":{"ACK":true}}}},"node_name":"node-t"}
{"flow":{"time":"t2","verdict":"FORWARDED","IP":{"source":"10.78.0.3","destination":"10.78.0.2"},"l4":{"TCP":{"source_port":10031,"destination_port":40200}}},"node_name":"node-t"}
"#;
    let mut r = readings(IN_PROGRESS, IN_PROGRESS, three());
    r.hubble = Some(HubbleRead {
        command: "hubble observe --ip 10.78.0.2".into(),
        result: Ok(out.to_vec()),
        elapsed_us: 3,
    });
    let e = build(&request(""), &r);
    let h = e.surfaces.iter().find(|s| s.id == "cilium/hubble").unwrap();
    let roles: Vec<&str> = h.facts["connections"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c["role"].as_str())
        .collect();
    assert_eq!(
        roles,
        ["excluded", "sync_control"],
        "keyed by node and tuple"
    );
    assert!(statement(&e, "hubble_reports_no_drops").contains("does not clear the network"));
    assert!(!blocks(&e).contains(&"EXCLUDE_POLICY_DROP"));
}

#[test]
fn identity_is_re_read_at_the_end_and_node_flags_need_the_api() {
    let moved = String::from_utf8(IN_PROGRESS.to_vec())
        .unwrap()
        .replace("pvc-7-e-0", "pvc-7-e-1")
        .replace("instance-manager-t", "instance-manager-t2");
    let e = build(
        &request(""),
        &readings(IN_PROGRESS, moved.as_bytes(), three()),
    );
    let s = statement(&e, "longhorn_identity_changed");
    assert!(s.contains("engine") && s.contains("target replica"), "{s}");
    let e = build(&request(""), &readings(IN_PROGRESS, IN_PROGRESS, three()));
    assert!(!codes(&e).contains(&"longhorn_identity_changed"));
    // Without the manager the node flags are required, and named.
    let mut r = request("");
    r.longhorn_api = None;
    let err = plan(&r).unwrap_err();
    assert!(err.to_string().contains("target-node"), "{err}");
}

#[test]
fn a_v2_volume_is_unsupported_never_no_volume() {
    let e = build(&request("node-t"), &readings(V2, V2, three()));
    let s = e
        .surfaces
        .iter()
        .find(|s| s.id == "longhorn/manager/start")
        .unwrap();
    assert_eq!(s.status, SurfaceStatus::Unsupported);
    assert!(s.cause.as_ref().unwrap().message.contains("v2 data engine"));
    assert_eq!(e.completeness, Completeness::Partial);
    assert!(blocks(&e).contains(&"CLASSIFY_TRANSFER_TERMINAL"));
    assert!(
        !codes(&e)
            .iter()
            .any(|c| c.starts_with("longhorn_manager_reports"))
    );
}

#[test]
fn a_partial_linked_stream_keeps_the_transfer_from_complete() {
    let mut s = stream(CONTROL, None);
    s.completeness = Completeness::Partial;
    let e = build(&request(""), &readings(IN_PROGRESS, IN_PROGRESS, vec![s]));
    assert_ne!(e.completeness, Completeness::Complete);
    let e = build(
        &request(""),
        &readings(IN_PROGRESS, IN_PROGRESS, vec![stream(CONTROL, None)]),
    );
    assert_eq!(e.completeness, Completeness::Complete);
}

/// A loopback manager answering each connection with the next canned
/// response (or holding it open without answering for `None`).
fn manager(
    answers: Vec<Option<(&'static str, Vec<u8>)>>,
) -> (String, std::thread::JoinHandle<Vec<String>>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let h = std::thread::spawn(move || {
        let mut seen = Vec::new();
        for a in answers {
            let (mut s, _) = l.accept().unwrap();
            let mut req = vec![0u8; 4096];
            let n = s.read(&mut req).unwrap();
            seen.push(
                String::from_utf8_lossy(&req[..n])
                    .lines()
                    .next()
                    .unwrap_or("")
                    .to_string(),
            );
            match a {
                Some((ctype, body)) => {
                    write!(
                        s,
                        "HTTP/1.1 200 OK\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\n\r\n",
                        body.len()
                    )
                    .unwrap();
                    s.write_all(&body).unwrap();
                }
                None => std::thread::sleep(API_DEADLINE + std::time::Duration::from_secs(1)),
            }
        }
        seen
    });
    (format!("http://127.0.0.1:{port}"), h)
}

/// A loopback Kubernetes API answering `GET …/events?fieldSelector=
/// involvedObject.name%3D<name>` with `v1.EventList` documents built to
/// k8s.io/api `core/v1/types.go` (`EventList`, `Event`,
/// `ObjectReference`, `EventSource`), or 401 for every request when
/// `refuse`. Returns the base URL and the request heads seen.
fn kube_api(refuse: bool, n: usize) -> (String, std::thread::JoinHandle<Vec<String>>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let h = std::thread::spawn(move || {
        let mut seen = Vec::new();
        for _ in 0..n {
            let (mut s, _) = l.accept().unwrap();
            let mut req = vec![0u8; 8192];
            let k = s.read(&mut req).unwrap();
            let head = String::from_utf8_lossy(&req[..k]).to_string();
            let path = head.split(' ').nth(1).unwrap_or("").to_string();
            seen.push(head);
            let (code, body) = if refuse {
                (
                    "401 Unauthorized",
                    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                           "message": "Unauthorized", "reason": "Unauthorized", "code": 401}),
                )
            } else {
                let object = path.rsplit("involvedObject.name%3D").next().unwrap_or("");
                let ev = |kind: &str, name: &str, reason: &str, ty: &str, msg: &str| {
                    json!({"metadata": {"name": format!("{name}.17f1c2a3b4c5d6e7"), "namespace": "longhorn-system",
                                        "uid": "0b6f", "resourceVersion": "9911", "creationTimestamp": "2026-12-03T19:40:12Z"},
                           "involvedObject": {"kind": kind, "namespace": "longhorn-system", "name": name,
                                              "uid": "77aa", "apiVersion": "longhorn.io/v1beta2", "resourceVersion": "812"},
                           "reason": reason, "message": msg,
                           "source": {"component": "longhorn-engine-controller", "host": "node-e"},
                           "firstTimestamp": "2026-12-03T19:40:12Z", "lastTimestamp": "2026-12-03T19:40:12Z",
                           "count": 1, "type": ty, "eventTime": null,
                           "reportingComponent": "", "reportingInstance": ""})
                };
                let items = match object {
                    "pvc-7" => vec![ev(
                        "Volume",
                        "pvc-7",
                        "Degraded",
                        "Normal",
                        "volume pvc-7 became degraded",
                    )],
                    "pvc-7-e-0" => vec![ev(
                        "Engine",
                        "pvc-7-e-0",
                        "FailedRebuilding",
                        "Warning",
                        "Failed rebuilding replica with Address 10.78.0.3:10020: proxyServer=10.78.0.1:8501 destination=10.78.0.1:10010: failed to add replica tcp://10.78.0.3:10020 for volume: rpc error: code = Unknown desc = failed to sync files: read tcp 10.78.0.3:43126->10.78.0.2:10002: read: connection reset by peer",
                    )],
                    _ => vec![],
                };
                (
                    "200 OK",
                    json!({"kind": "EventList", "apiVersion": "v1",
                                  "metadata": {"resourceVersion": "9912"}, "items": items}),
                )
            };
            let body = body.to_string();
            write!(s, "HTTP/1.1 {code}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len()).unwrap();
        }
        seen
    });
    (format!("http://127.0.0.1:{port}"), h)
}

#[test]
fn an_entry_gone_reads_the_events_through_the_kubernetes_api_or_names_the_kubectl_command() {
    const TOKEN: &str = "eyJhbGciOiJSUzI1NiJ9.secret-test-token.sig";
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, format!("{TOKEN}\n")).unwrap();
    let objects = ["pvc-7", "pvc-7-e-0", "pvc-7-r-t"];
    let mut r = readings(IN_PROGRESS, AFTER_FAILURE, three());
    assert_eq!(
        envelope::entry_gone(r.topology.as_ref(), r.start.as_ref(), r.end.as_ref()).as_deref(),
        Some("pvc-7-r-t")
    );
    let probe = |e: &Envelope| {
        e.unknowns
            .iter()
            .find(|u| u.blocks == "CLASSIFY_TRANSFER_TERMINAL")
            .unwrap()
            .probe
            .clone()
    };
    let exact = "kubectl get events -n longhorn-system --field-selector involvedObject.name=pvc-7";

    // No Kubernetes API: the probe is the exact command.
    let e = build(&request(""), &r);
    assert!(probe(&e).contains(exact), "{}", probe(&e));

    // A good token: the Events are read, FailedRebuilding is a fact.
    let (base, h) = kube_api(false, 3);
    let api = kube::KubeApi {
        base,
        token_file: token_file.clone(),
        ca_file: None,
    };
    r.events = Some(
        objects
            .iter()
            .map(|o| kube::fetch_events(&api, o))
            .collect(),
    );
    let seen = h.join().unwrap();
    for (head, o) in seen.iter().zip(objects) {
        assert!(
            head.starts_with(&format!(
                "GET /api/v1/namespaces/longhorn-system/events?fieldSelector=involvedObject.name%3D{o} "
            )),
            "{head}"
        );
        assert!(
            head.to_ascii_lowercase().contains(&format!(
                "authorization: bearer {}",
                TOKEN.to_ascii_lowercase()
            )),
            "{head}"
        );
    }
    let e = build(&request(""), &r);
    let s = statement(&e, "longhorn_failed_rebuilding_event");
    assert!(
        s.contains("Engine pvc-7-e-0") && s.contains("connection reset by peer"),
        "{s}"
    );
    assert!(s.contains("10.78.0.3:43126→10.78.0.2:10002"), "{s}");
    let sf = e
        .surfaces
        .iter()
        .find(|x| x.id == "kubernetes/events/pvc-7-e-0")
        .unwrap();
    assert_eq!(sf.status, SurfaceStatus::Ok);
    assert_eq!(sf.facts["events"][0]["reason"], "FailedRebuilding");
    assert!(
        statement(&e, "kubernetes_events_without_failed_rebuilding").contains("pvc-7"),
        "the volume's own Events were read and say no FailedRebuilding"
    );
    assert!(
        !probe(&e).contains(exact),
        "read, so no command: {}",
        probe(&e)
    );
    assert!(blocks(&e).contains(&"CLASSIFY_TRANSFER_TERMINAL"));
    assert!(
        !serde_json::to_string(&e)
            .unwrap()
            .contains("secret-test-token")
    );

    // A bad token: 401 is permission_denied on each Events surface, never "no events".
    let (base, h) = kube_api(true, 3);
    let api = kube::KubeApi {
        base,
        token_file,
        ca_file: None,
    };
    r.events = Some(
        objects
            .iter()
            .map(|o| kube::fetch_events(&api, o))
            .collect(),
    );
    h.join().unwrap();
    let e = build(&request(""), &r);
    for o in objects {
        let sf = e
            .surfaces
            .iter()
            .find(|x| x.id == format!("kubernetes/events/{o}"))
            .unwrap();
        assert_eq!(sf.status, SurfaceStatus::PermissionDenied, "{sf:?}");
        let why = &sf.cause.as_ref().unwrap().message;
        assert!(why.contains("HTTP 401") && why.contains("token"), "{why}");
    }
    let c = codes(&e);
    assert!(
        !c.contains(&"longhorn_failed_rebuilding_event")
            && !c.contains(&"kubernetes_events_without_failed_rebuilding"),
        "{c:?}"
    );
    assert!(probe(&e).contains(exact), "{}", probe(&e));
    assert_ne!(e.completeness, Completeness::Complete);
    assert!(
        !serde_json::to_string(&e)
            .unwrap()
            .contains("secret-test-token")
    );
    // A missing token file is typed too.
    let api = kube::KubeApi {
        base: "http://127.0.0.1:9".into(),
        token_file: dir.path().join("absent"),
        ca_file: None,
    };
    let read = kube::fetch_events(&api, "pvc-7");
    assert_eq!(read.result.unwrap_err().status, SurfaceStatus::Error);
}

#[test]
fn bad_managers_are_typed_surface_statuses_never_no_volume() {
    // A base URL ending in /v1: the path is not doubled, and the IMs are read.
    let (api, h) = manager(vec![
        Some(("application/json", IN_PROGRESS.to_vec())),
        Some(("application/json", IM_S.to_vec())),
        Some(("application/json", IM_T.to_vec())),
    ]);
    let (start, topo, ims) = read_start(&format!("{api}/v1/"), "pvc-7", None);
    assert!(start.result.is_ok());
    assert_eq!(ims.len(), 2);
    let t = topo.unwrap();
    assert_eq!(t.covering_ports(), Some((10000, 10029)));
    assert_eq!(
        h.join().unwrap(),
        [
            "GET /v1/volumes/pvc-7 HTTP/1.1",
            "GET /v1/instancemanagers/instance-manager-s HTTP/1.1",
            "GET /v1/instancemanagers/instance-manager-t HTTP/1.1"
        ]
    );
    // HTML (the UI, or a proxy's page): an error naming it, no topology.
    let (api, _h) = manager(vec![Some((
        "text/html",
        b"<!DOCTYPE html><html><body>Longhorn UI</body></html>".to_vec(),
    ))]);
    let (start, topo, _) = read_start(&api, "pvc-7", None);
    assert!(topo.is_none());
    let mut r = readings(IN_PROGRESS, IN_PROGRESS, vec![]);
    r.start = Some(start);
    r.topology = None;
    r.ims.clear();
    let e = build(&request("node-t"), &r);
    let s = e
        .surfaces
        .iter()
        .find(|s| s.id == "longhorn/manager/start")
        .unwrap();
    assert_eq!(s.status, SurfaceStatus::Error);
    assert!(
        s.cause.as_ref().unwrap().message.contains("HTML page"),
        "{:?}",
        s.cause
    );
    assert_eq!(e.completeness, Completeness::Partial);
    // A manager that accepts and never answers: timeout within the deadline.
    let (api, _h) = manager(vec![None]);
    let t0 = std::time::Instant::now();
    let r = client::fetch_volume(&api, "pvc-7");
    assert!(t0.elapsed() < API_DEADLINE + std::time::Duration::from_secs(2));
    assert_eq!(r.result.unwrap_err().status, SurfaceStatus::Timeout);
}
