//! `capture longhorn`: the storage_transfer envelope links the stream
//! envelopes by digest; the manager API is read when configured, else unknown.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

use pstack_envelope::{Completeness, Subject, SurfaceStatus};

use crate::testbed::*;

fn longhorn_args<'a>(ns: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut v = vec![
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
        ns,
        "--peer",
        B_V4,
        "--window",
        "1s",
        "--json",
        "--no-ebpf",
    ];
    v.extend_from_slice(extra);
    v
}

#[test]
fn root_transfer_links_stream_digests_and_leaves_manager_and_hubble_as_probes() {
    if !root_or_skip("root_transfer_links_stream_digests_and_leaves_manager_and_hubble_as_probes") {
        return;
    }
    let _s = serial();
    let bed = Testbed::new("lh");
    let _t = Transfer::start(&bed, false, None);
    let (code, out, err) = pstackctl(&longhorn_args(&bed.a.name, &[]));
    assert_eq!(code, 0, "{err}");
    let envs = envelopes(&out);
    let transfer = envs.last().unwrap();
    let Subject::StorageTransfer(t) = &transfer.subject else {
        panic!("last envelope is the transfer")
    };
    assert_eq!(
        (t.volume.as_str(), t.engine.as_str()),
        ("pvc-7", "pvc-7-e-0")
    );
    assert!(t.transfer_id.starts_with("derived-"));
    let links = surface(transfer, "streams").facts["links"]
        .as_array()
        .unwrap()
        .clone();
    let streams: Vec<_> = envs
        .iter()
        .filter(|e| matches!(e.subject, Subject::NetworkStream(_)))
        .collect();
    assert_eq!(links.len(), streams.len());
    assert_eq!(streams.len(), 2);
    for s in &streams {
        assert!(
            links.iter().any(|l| l["digest"] == s.digest.as_str()),
            "stream {} not linked",
            s.digest
        );
    }
    let probes: Vec<&str> = transfer.unknowns.iter().map(|u| u.probe.as_str()).collect();
    assert!(
        probes
            .iter()
            .any(|p| p.contains("kubectl -n longhorn-system get engines.longhorn.io pvc-7-e-0")),
        "{probes:?}"
    );
    assert!(
        probes
            .iter()
            .any(|p| p.starts_with("hubble observe --ip 10.77.0.2")),
        "{probes:?}"
    );
    assert_eq!(transfer.completeness, Completeness::Complete);
}

/// A stand-in manager on loopback answers with a volume document of the
/// manager's shape; an unreachable one becomes a non-ok surface plus the probe.
#[test]
fn root_transfer_reads_manager_api_when_configured() {
    if !root_or_skip("root_transfer_reads_manager_api_when_configured") {
        return;
    }
    let _s = serial();
    let bed = Testbed::new("lhapi");
    let _t = Transfer::start(&bed, false, None);
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    // The v1.9.0 `api/model.go` volume shape (rebuildStatus with
    // `fromReplica`, a replica name), answered at window start and end.
    let server = std::thread::spawn(move || {
        let mut first = String::new();
        // Volume at start, the settings, volume at end.
        for _ in 0..3 {
            let (mut s, _) = l.accept().unwrap();
            let mut req = vec![0u8; 4096];
            let n = s.read(&mut req).unwrap();
            let head = String::from_utf8_lossy(&req[..n]).into_owned();
            if first.is_empty() {
                first = head.clone();
            }
            let settings = lh_settings();
            let body = if head.starts_with("GET /v1/settings ") {
                settings.as_str()
            } else {
                r#"{"id":"pvc-7","type":"volume","name":"pvc-7","state":"attached","robustness":"degraded","dataEngine":"v1","controllers":[{"name":"pvc-7-e-0","hostId":"node-a","address":"10.77.0.1","instanceManagerName":"im-a"}],"replicas":[],"rebuildStatus":[{"id":"","type":"rebuildStatus","links":null,"actions":null,"replica":"pvc-7-r-1","fromReplica":"pvc-7-r-0","state":"in_progress","progress":37,"isRebuilding":true,"error":""}]}"#
            };
            write!(
                s,
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            )
            .unwrap();
        }
        first
    });
    let api = format!("http://127.0.0.1:{port}");
    let (code, out, err) = pstackctl(&longhorn_args(&bed.a.name, &["--longhorn-api", &api]));
    assert_eq!(code, 0, "{err}");
    assert!(
        server
            .join()
            .unwrap()
            .starts_with("GET /v1/volumes/pvc-7 HTTP/1.1")
    );
    let envs = envelopes(&out);
    let transfer = envs.last().unwrap();
    for id in ["longhorn/manager/start", "longhorn/manager/end"] {
        let m = surface(transfer, id);
        assert_eq!(m.status, SurfaceStatus::Ok, "{id}");
        assert_eq!(m.facts["rebuild_status"][0]["progress"], 37);
        assert_eq!(
            m.facts["rebuild_status"][0]["from_replicas"][0],
            "pvc-7-r-0"
        );
        assert!(m.facts["read_at"].is_string());
    }
    assert!(
        transfer
            .claims
            .iter()
            .any(|c| c.code == "longhorn_manager_reports_rebuild")
    );
    // `in_progress` at both ends is not an outcome: the question stays open.
    assert!(
        transfer
            .unknowns
            .iter()
            .any(|u| u.blocks == "CLASSIFY_TRANSFER_TERMINAL")
    );

    // Nothing listens there now: refused, partial, and the kubectl probe is back.
    let (code, out, err) = pstackctl(&longhorn_args(&bed.a.name, &["--longhorn-api", &api]));
    assert_eq!(code, 0, "{err}");
    let envs = envelopes(&out);
    let transfer = envs.last().unwrap();
    assert_eq!(
        surface(transfer, "longhorn/manager/start").status,
        SurfaceStatus::Error
    );
    assert_eq!(transfer.completeness, Completeness::Partial);
    assert!(
        transfer
            .unknowns
            .iter()
            .any(|u| u.probe.contains("kubectl"))
    );
}

/// Hubble read through the `hubble` CLI: a stand-in CLI prints recorded
/// `observe -o jsonpb` lines (and refuses the wrong peer); a missing CLI is an
/// `unsupported` surface plus the probe.
#[test]
fn root_hubble_verdicts_are_read_when_reachable_else_unknown() {
    if !root_or_skip("root_hubble_verdicts_are_read_when_reachable_else_unknown") {
        return;
    }
    let _s = serial();
    let bed = Testbed::new("hub");
    let _t = Transfer::start(&bed, false, None);
    let dir = tempfile::tempdir().unwrap();
    let cli = dir.path().join("hubble");
    std::fs::write(
        &cli,
        format!(
            "#!/bin/sh\n\
             case \"$*\" in *\"--ip {B_V4} \"*) ;; *) echo \"unexpected args: $*\" >&2; exit 3;; esac\n\
             echo '{{\"flow\":{{\"time\":\"2026-12-02T12:00:00Z\",\"verdict\":\"DROPPED\",\"drop_reason_desc\":\"POLICY_DENIED\",\"IP\":{{\"source\":\"{A_V4}\",\"destination\":\"{B_V4}\"}},\"l4\":{{\"TCP\":{{\"source_port\":40000,\"destination_port\":{DATA_PORT}}}}}}},\"node_name\":\"node-a\"}}'\n\
             echo '{{\"flow\":{{\"verdict\":\"FORWARDED\"}}}}'\n"
        ),
    )
    .unwrap();
    std::fs::set_permissions(&cli, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let cli_s = cli.display().to_string();
    let (code, out, err) = pstackctl(&longhorn_args(
        &bed.a.name,
        &["--hubble-server", "127.0.0.1:4245", "--hubble", &cli_s],
    ));
    assert_eq!(code, 0, "{err}");
    let envs = envelopes(&out);
    let transfer = envs.last().unwrap();
    let h = surface(transfer, "cilium/hubble");
    assert_eq!(h.status, SurfaceStatus::Ok, "{:?}", h.cause);
    assert_eq!(h.facts["dropped_flows"], 1);
    assert_eq!(h.facts["reasons"]["POLICY_DENIED"], 1);
    assert!(
        transfer
            .claims
            .iter()
            .any(|c| c.code == "hubble_reports_drops")
    );
    assert!(
        !transfer
            .unknowns
            .iter()
            .any(|u| u.blocks == "EXCLUDE_POLICY_DROP")
    );

    let (code, out, err) = pstackctl(&longhorn_args(
        &bed.a.name,
        &[
            "--hubble-server",
            "127.0.0.1:4245",
            "--hubble",
            "/nonexistent/hubble",
        ],
    ));
    assert_eq!(code, 0, "{err}");
    let envs = envelopes(&out);
    let transfer = envs.last().unwrap();
    assert_eq!(
        surface(transfer, "cilium/hubble").status,
        SurfaceStatus::Unsupported
    );
    assert_eq!(transfer.completeness, Completeness::Partial);
    let u = transfer
        .unknowns
        .iter()
        .find(|u| u.blocks == "EXCLUDE_POLICY_DROP")
        .unwrap();
    assert!(u.probe.starts_with("hubble observe --ip 10.77.0.2"));
    assert_eq!(u.surface.as_deref(), Some("cilium/hubble"));
}

/// A v1.9.0 `api/model.go` volume document of the three-namespace bed:
/// replica S on node-s, T (WO) on node-t, the engine on node-e; `rebuild`
/// is the `rebuildStatus` array.
pub(crate) fn lh_volume(rebuild: serde_json::Value) -> String {
    let inst = |name: &str, node: &str, ip: &str, im: &str, mode: &str| {
        serde_json::json!({"name": name, "hostId": node, "address": ip, "running": true,
            "image": "longhornio/longhorn-engine:v1.9.0", "currentImage": "longhornio/longhorn-engine:v1.9.0",
            "instanceManagerName": im, "diskID": "d", "diskPath": "/var/lib/longhorn/",
            "dataPath": "/var/lib/longhorn/replicas/x", "mode": mode, "failedAt": "", "dataEngine": "v1"})
    };
    serde_json::json!({
        "id": "pvc-7", "type": "volume", "links": {}, "actions": {}, "name": "pvc-7",
        "state": "attached", "robustness": "degraded", "dataEngine": "v1",
        "replicas": [inst("pvc-7-r-s", "node-s", LH_S, "im-s", "RW"), inst("pvc-7-r-t", "node-t", LH_T, "im-t", "WO")],
        "controllers": [{"name": "pvc-7-e-0", "hostId": "node-e", "address": LH_E, "running": true,
                         "instanceManagerName": "im-e", "endpoint": "/dev/longhorn/pvc-7"}],
        "rebuildStatus": rebuild,
    })
    .to_string()
}

/// A v1.9.0 `GET /v1/settings` collection (`api/model.go` `Setting`) with
/// the defaults of the settings that bound a rebuild's failure.
pub(crate) fn lh_settings() -> String {
    lh_settings_with("")
}

/// [`lh_settings`] with `storage-network` set to `storage_network` (a
/// Multus NetworkAttachmentDefinition `namespace/name`, "" = none).
pub(crate) fn lh_settings_with(storage_network: &str) -> String {
    let set = |n: &str, v: &str| serde_json::json!({"id": n, "type": "setting", "links": {}, "actions": {}, "name": n, "value": v, "applied": true, "definition": {}});
    serde_json::json!({"type": "collection", "resourceType": "setting", "links": {}, "createTypes": {}, "actions": {},
        "data": [set("engine-replica-timeout", "8"), set("replica-file-sync-http-client-timeout", "30"),
                 set("long-grpc-timeout", "86400"), set("storage-network", storage_network), set("backup-target", "")]})
    .to_string()
}

/// A v1.9.0 instance-manager document with `replica`'s block at `port`, plus
/// another volume's replica next to it.
pub(crate) fn lh_im(name: &str, replica: &str, port: u16) -> String {
    let p = |start: u16| {
        serde_json::json!({"spec": {"name": "x", "dataEngine": "v1"},
        "status": {"endpoint": "", "errorMsg": "", "listen": "", "portStart": start, "portEnd": start + 9,
                   "targetPortStart": 0, "targetPortEnd": 0, "state": "running", "type": "replica"}})
    };
    serde_json::json!({"id": name, "type": "instanceManager", "currentState": "running", "name": name,
        "nodeID": "n", "managerType": "aio", "dataEngine": "v1", "instanceEngines": {},
        "instanceReplicas": {replica: p(port), "pvc-other-r-0": p(OTHER_FIRST)}, "instances": {}})
    .to_string()
}

/// A stand-in manager on loopback answering by path; the volume's answers
/// are served in order (start, end). Returns the request lines seen.
fn lh_manager(
    volume: Vec<String>,
    ims: Vec<(String, String)>,
) -> (String, std::thread::JoinHandle<Vec<String>>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let total = volume.len() + ims.len() + 1;
    let h = std::thread::spawn(move || {
        let mut volume = volume.into_iter();
        let mut seen = Vec::new();
        for _ in 0..total {
            let (mut s, _) = l.accept().unwrap();
            let mut req = vec![0u8; 4096];
            let n = s.read(&mut req).unwrap();
            let line = String::from_utf8_lossy(&req[..n])
                .lines()
                .next()
                .unwrap_or("")
                .to_string();
            let body = if line.starts_with("GET /v1/volumes/pvc-7 ") {
                volume.next().unwrap_or_default()
            } else if line.starts_with("GET /v1/settings ") {
                lh_settings()
            } else {
                ims.iter()
                    .find(|(n, _)| line.starts_with(&format!("GET /v1/instancemanagers/{n} ")))
                    .map(|(_, b)| b.clone())
                    .unwrap_or_default()
            };
            seen.push(line);
            let _ = write!(
                s,
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            );
        }
        seen
    });
    (format!("http://127.0.0.1:{port}/v1"), h)
}

fn lh3_args<'a>(ns: &'a str, api: &'a str, window: &'a str) -> Vec<&'a str> {
    vec![
        "capture",
        "longhorn",
        "--volume",
        "pvc-7",
        "--engine",
        "pvc-7-e-0",
        "--netns",
        ns,
        "--peer",
        LH_S,
        "--window",
        window,
        "--json",
        "--no-ebpf",
        "--longhorn-api",
        api,
    ]
}

/// Longhorn's real pattern in three namespaces: a capture on T (peer S)
/// with 40 other volumes' flows between S and T. The #13703 socket options on
/// S's accepted end of the control channel give the keepalive-vs-user-timeout
/// hypothesis on S's capture (T's end is the client's, named so); then S
/// resets the control channel mid-window, the manager's end read carries the
/// engine's error text with the 4-tuple, and the capture names that stream by
/// role. Prints the Longhorn capture measurement (BENCHMARKS.md).
#[test]
fn root_target_capture_names_the_control_channel_reset_by_the_source_by_role() {
    if !root_or_skip("root_target_capture_names_the_control_channel_reset_by_the_source_by_role") {
        return;
    }
    let _s = serial();
    let bed = LonghornBed::new("lh3");
    // #13703: Go's 15 s keepalive against grpc-go's 20 s TCP_USER_TIMEOUT.
    let mut rb = bed.start_rebuild(40, Some((15, 15, 20_000)));
    let ims = || {
        vec![
            ("im-s".to_string(), lh_im("im-s", "pvc-7-r-s", P_S)),
            ("im-t".to_string(), lh_im("im-t", "pvc-7-r-t", P_T)),
        ]
    };
    let in_progress = serde_json::json!([{"id": "", "type": "rebuildStatus", "links": null, "actions": null,
        "replica": "pvc-7-r-t", "fromReplica": "pvc-7-r-s", "state": "in_progress", "progress": 12,
        "isRebuilding": true, "error": ""}]);

    // 1. No failure: the roles, the exclusions, the sockopt hypothesis.
    let (api, h) = lh_manager(
        vec![
            lh_volume(in_progress.clone()),
            lh_volume(in_progress.clone()),
        ],
        ims(),
    );
    let t0 = std::time::Instant::now();
    let (code, out, err) = pstackctl(&lh3_args(&bed.t.name, &api, "1s"));
    let wall = t0.elapsed();
    assert_eq!(code, 0, "{err}");
    let seen = h.join().unwrap();
    assert_eq!(seen.len(), 5, "{seen:?}");
    let envs = envelopes(&out);
    let transfer = envs.last().unwrap();
    // The settings that bound each failure, as facts.
    let settings = surface(transfer, "longhorn/settings");
    assert_eq!(
        settings.facts["engine-replica-timeout"], "8",
        "{settings:?}"
    );
    assert_eq!(settings.facts["long-grpc-timeout"], "86400");
    assert!(settings.facts["replica-rebuild-concurrent-sync-limit"].is_null());
    assert!(codes(transfer).contains(&"longhorn_settings_bound_failures".to_string()));
    let streams = surface(transfer, "streams");
    assert_eq!(streams.facts["excluded_count"], 40, "{:?}", streams.facts);
    let mut roles: Vec<&str> = streams.facts["links"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|l| l["role"].as_str())
        .collect();
    roles.sort();
    assert_eq!(
        roles,
        ["ssync_data", "sync_control"],
        "E's flows have another peer; others excluded"
    );
    assert_eq!(envs.len(), 3, "two linked streams and the transfer");
    assert_eq!(
        surface(transfer, "longhorn/topology").facts["capture_role"],
        "target"
    );
    // T holds the gRPC client's end: not the side that aborts (#13703).
    let ctl = surface(transfer, "longhorn/control_channel");
    let t_end = &ctl.facts["idle_channel_sockopts"][0];
    assert_eq!(t_end["server_side"], false, "{t_end}");
    assert_eq!(t_end["hazard"], "client_side", "{t_end}");
    assert!(
        !codes(transfer)
            .contains(&"control_channel_user_timeout_below_keepalive_retry".to_string()),
        "{:?}",
        codes(transfer)
    );
    assert!(codes(transfer).contains(&"control_channel_client_side".to_string()));
    let Subject::StorageTransfer(t) = &transfer.subject else {
        panic!()
    };
    assert_eq!(
        (
            t.source_node.as_str(),
            t.target_node.as_str(),
            t.transfer_id.as_str()
        ),
        ("node-s", "node-t", "pvc-7/pvc-7-r-t")
    );
    let bytes = out.lines().last().unwrap().len();
    let t1 = std::time::Instant::now();
    let ss = run("ip", &["netns", "exec", &bed.t.name, "ss", "-tinoe"]);
    let ss_wall = t1.elapsed();
    assert!(ss.status.success());
    eprintln!(
        "BENCH longhorn capture: flows selected {} excluded {} (40 other volumes), transfer envelope {bytes} bytes, all envelopes {} bytes, wall {:.2} s for a 1 s window (ss -tinoe in the same netns: {:.3} s, ratio {:.0}x; the ss snapshot has no window, manager reads or envelopes)",
        roles.len(),
        streams.facts["excluded_count"],
        out.len(),
        wall.as_secs_f64(),
        ss_wall.as_secs_f64(),
        wall.as_secs_f64() / ss_wall.as_secs_f64().max(1e-6)
    );

    // The other two capture points: each says which role it plays and
    // labels its side's flows (E: live writes and FilesSync to T; S: the
    // control channel's server end and the bulk stream's client end).
    for (ns, peer, role, want) in [
        (&bed.e, LH_T, "engine", vec!["engine_data", "files_sync"]),
        (&bed.s, LH_T, "source", vec!["ssync_data", "sync_control"]),
    ] {
        let (api, h) = lh_manager(
            vec![
                lh_volume(in_progress.clone()),
                lh_volume(in_progress.clone()),
            ],
            ims(),
        );
        let mut args = lh3_args(&ns.name, &api, "1s");
        args[9] = peer;
        let (code, out, err) = pstackctl(&args);
        assert_eq!(code, 0, "{err}");
        h.join().unwrap();
        let envs = envelopes(&out);
        let transfer = envs.last().unwrap();
        assert_eq!(
            surface(transfer, "longhorn/topology").facts["capture_role"],
            role
        );
        let mut roles: Vec<&str> = surface(transfer, "streams").facts["links"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|l| l["role"].as_str())
            .collect();
        roles.sort();
        assert_eq!(roles, want, "{role}");
        if role == "source" {
            // S's sync agent holds the accepted end: grpc-go's 20 s user
            // timeout against the 15 s keepalive is judged here (#13703).
            let s_end =
                &surface(transfer, "longhorn/control_channel").facts["idle_channel_sockopts"][0];
            assert_eq!(s_end["server_side"], true, "{s_end}");
            assert_eq!(s_end["user_timeout_ms"], 20_000, "{s_end}");
            let hyp = transfer
                .claims
                .iter()
                .find(|c| c.code == "control_channel_user_timeout_below_keepalive_retry")
                .unwrap_or_else(|| panic!("{:?}", codes(transfer)));
            assert!(
                hyp.statement.contains("the source's sync agent (S:P_S+2)"),
                "{}",
                hyp.statement
            );
            assert!(
                hyp.falsifier
                    .as_deref()
                    .is_some_and(|f| f.contains("20000 ms"))
            );
        }
        let Subject::StorageTransfer(t) = &transfer.subject else {
            panic!()
        };
        assert_eq!(
            t.transfer_id, "pvc-7/pvc-7-r-t",
            "{role}: the same join key on every node"
        );
    }

    // 2. S resets the control channel mid-window; the manager's end read
    //    reports the engine's error with the dead connection's 4-tuple.
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
    let failed = serde_json::json!([{"id": "", "type": "rebuildStatus", "links": null, "actions": null,
        "replica": "pvc-7-r-t", "fromReplica": "pvc-7-r-s", "state": "error", "progress": 12,
        "isRebuilding": false, "error": error}]);
    let (api, h) = lh_manager(vec![lh_volume(in_progress), lh_volume(failed)], ims());
    let child = pstackctl_bg(&lh3_args(&bed.t.name, &api, "3s"));
    std::thread::sleep(Duration::from_millis(1500));
    rb.source_resets_control();
    let envs = finish(child);
    h.join().unwrap();
    let transfer = envs.last().unwrap();
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
    assert!(
        named.statement.contains("connection reset by peer"),
        "{}",
        named.statement
    );
    // The named stream is the linked control-channel envelope, and it
    // recorded the failure itself (not only the manager's word).
    let link = surface(transfer, "streams").facts["links"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["role"] == "sync_control")
        .unwrap()
        .clone();
    assert!(named.statement.contains(link["digest"].as_str().unwrap()));
    let stream = envs
        .iter()
        .find(|e| e.digest == link["digest"].as_str().unwrap())
        .unwrap();
    eprintln!("control stream claims after the reset: {:?}", codes(stream));
    assert!(
        codes(stream).iter().any(|c| c == "reset_by_peer_inferred"),
        "the control stream records the reset itself: {:?}",
        codes(stream)
    );
}

/// Issue 20 item 3: S's per-file bulk streams to T:P_T+3…+9 that open and
/// close inside the window are in neither sock_diag sample; the capture's
/// eBPF session sees them close and the transfer lists them with their
/// role (and another volume's short-lived flows are excluded and counted).
#[test]
fn root_short_lived_bulk_streams_inside_the_window_come_from_ebpf_with_their_role() {
    if !root_or_skip(
        "root_short_lived_bulk_streams_inside_the_window_come_from_ebpf_with_their_role",
    ) {
        return;
    }
    let _s = serial();
    let bed = LonghornBed::new("lhsl");
    let _rb = bed.start_rebuild(2, None);
    let in_progress = serde_json::json!([{"id": "", "type": "rebuildStatus", "links": null, "actions": null,
        "replica": "pvc-7-r-t", "fromReplica": "pvc-7-r-s", "state": "in_progress", "progress": 12,
        "isRebuilding": true, "error": ""}]);
    let (api, h) = lh_manager(
        vec![lh_volume(in_progress.clone()), lh_volume(in_progress)],
        vec![
            ("im-s".to_string(), lh_im("im-s", "pvc-7-r-s", P_S)),
            ("im-t".to_string(), lh_im("im-t", "pvc-7-r-t", P_T)),
        ],
    );
    // Receivers in T: one file port of the rebuild, one of another volume.
    let file_port = P_T + 5;
    let other_port = OTHER_FIRST + 7;
    let listeners: Vec<TcpListener> = [file_port, other_port]
        .into_iter()
        .map(|p| {
            bed.t
                .within(move || TcpListener::bind(format!("{LH_T}:{p}")).unwrap())
        })
        .collect();
    let accepting: Vec<_> = listeners
        .into_iter()
        .map(|l| {
            std::thread::spawn(move || {
                // One reader per connection: the parallel ones are read at once.
                let readers: Vec<_> = l
                    .incoming()
                    .take(4)
                    .map(|s| {
                        let mut s = s.unwrap();
                        std::thread::spawn(move || {
                            let mut buf = vec![0u8; 64 << 10];
                            while let Ok(n) = s.read(&mut buf) {
                                if n == 0 {
                                    break;
                                }
                            }
                        })
                    })
                    .collect();
                for r in readers {
                    r.join().unwrap();
                }
            })
        })
        .collect();
    let mut args = lh3_args(&bed.t.name, &api, "4s");
    args.retain(|a| *a != "--no-ebpf");
    let child = pstackctl_bg(&args);
    // Inside the window: one file to the rebuild's port over four parallel
    // connections (sparse-tools' 4 sync workers on one receiver), and four
    // one-connection files to the other volume's port.
    std::thread::sleep(Duration::from_millis(1500));
    let sender = bed.s.spawn(move || {
        let mut parallel: Vec<TcpStream> = (0..4)
            .map(|_| TcpStream::connect(format!("{LH_T}:{file_port}")).unwrap())
            .collect();
        for c in &mut parallel {
            c.write_all(&vec![0x42u8; 256 << 10]).unwrap();
        }
        drop(parallel);
        for _ in 0..4 {
            let mut c = TcpStream::connect(format!("{LH_T}:{other_port}")).unwrap();
            c.write_all(&vec![0x42u8; 256 << 10]).unwrap();
            drop(c);
            std::thread::sleep(Duration::from_millis(100));
        }
    });
    sender.join().unwrap();
    for a in accepting {
        a.join().unwrap();
    }
    let envs = finish(child);
    h.join().unwrap();
    let transfer = envs.last().unwrap();
    let streams = surface(transfer, "streams");
    let source = streams.facts["short_lived_source"].as_str().unwrap_or("");
    pstack_testkit::require!(
        !source.starts_with("eBPF did not run"),
        "needs the eBPF TCP programs (BTF, CAP_BPF)"
    );
    let short = streams.facts["short_lived"].as_array().unwrap();
    let files: Vec<&serde_json::Value> = short
        .iter()
        .filter(|f| f["local"] == format!("{LH_T}:{file_port}"))
        .collect();
    assert_eq!(files.len(), 4, "{short:#?}");
    for f in &files {
        assert_eq!(f["role"], "ssync_data", "{f:#}");
        assert!(f["remote"].as_str().unwrap().starts_with(LH_S), "{f:#}");
        assert!(
            f["transitions"]
                .as_array()
                .unwrap()
                .iter()
                .any(|t| t.as_str().unwrap().contains("CLOSE"))
        );
    }
    // The four parallel connections are one transfer, read as one group
    // (the bed's live stream to P_T+3 is a group of its own).
    let groups = streams.facts["data_connection_groups"].as_array().unwrap();
    let on_file_port: Vec<&serde_json::Value> = groups
        .iter()
        .filter(|g| g["receiver"] == format!("{LH_T}:{file_port}"))
        .collect();
    assert_eq!(on_file_port.len(), 1, "{groups:#?}");
    let group = on_file_port[0];
    assert_eq!(group["sender_ip"], LH_S, "{group:#}");
    assert_eq!(group["members"].as_array().unwrap().len(), 4, "{group:#}");
    assert_eq!(group["members_timed"], 4, "{group:#}");
    assert!(
        !short
            .iter()
            .any(|f| f["local"] == format!("{LH_T}:{other_port}")),
        "another volume's short-lived flows are not the rebuild's: {short:#?}"
    );
    let excluded_short = streams.facts["excluded_sample"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|x| x["flow_id"].as_str().unwrap().starts_with("short-lived"))
        .count();
    assert!(
        excluded_short >= 1,
        "{:#}",
        streams.facts["excluded_sample"]
    );
    assert_eq!(
        streams.facts["excluded_count"],
        2 + 4,
        "two other volumes' live flows and four short-lived ones"
    );
    let fact = transfer
        .claims
        .iter()
        .find(|c| c.code == "longhorn_short_lived_streams")
        .unwrap_or_else(|| panic!("{:?}", codes(transfer)));
    assert!(
        fact.statement.contains("4 ssync_data"),
        "{}",
        fact.statement
    );
}
