//! `capture longhorn`: the storage_transfer envelope links the stream
//! envelopes by digest; the manager API is read when configured, else unknown.

use std::io::{Read, Write};
use std::net::TcpListener;

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
        for _ in 0..2 {
            let (mut s, _) = l.accept().unwrap();
            let mut req = vec![0u8; 4096];
            let n = s.read(&mut req).unwrap();
            if first.is_empty() {
                first = String::from_utf8_lossy(&req[..n]).into_owned();
            }
            let body = r#"{"id":"pvc-7","type":"volume","name":"pvc-7","state":"attached","robustness":"degraded","dataEngine":"v1","controllers":[{"name":"pvc-7-e-0","hostId":"node-a","address":"10.77.0.1","instanceManagerName":"im-a"}],"replicas":[],"rebuildStatus":[{"id":"","type":"rebuildStatus","links":null,"actions":null,"replica":"pvc-7-r-1","fromReplica":"pvc-7-r-0","state":"in_progress","progress":37,"isRebuilding":true,"error":""}]}"#;
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
