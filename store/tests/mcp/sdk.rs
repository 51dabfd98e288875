//! The MCP tools driven by a client the store never saw: the official MCP
//! Python SDK (`sdk_client.py`, venv from `scripts/setup.d/62-mcp-python.sh`;
//! env `PSTACK_MCP_PYTHON` names another interpreter), over stdio (two
//! `pstack-store mcp` processes, one per key, sharing a gate key file) and
//! over streamable HTTP (`/mcp`). The client calls every tool with seed
//! 000's argument names; a runner holding only the `runner` scope claims and
//! completes one grant and fails another over MCP alone. This test then
//! checks through REST that the completion armed the recovery watchdog: the
//! proposal is `monitoring` with checkpoints due at +2, +5 and +15 minutes of
//! its completion, and a watchdog tick past +2 minutes evaluates one. Over
//! stdio, a write-enabled `pstack-store mcp` without the database's gate
//! key (none, or another) then refuses to start; a read-only one needs none.

use std::io::Write;
use std::process::{Command, Stdio};

use pstack_store_core::analysis::proof::{FingerprintInput, fingerprint};
use pstack_store_core::keys::Scope;
use pstack_store_core::synthetic::Capture;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::support::{Db, Harness};

const DEFAULT_PYTHON: &str = "/opt/pstack-mcp-python-2.3.0/bin/python";

/// The interpreter with the SDK, or None (a reported skip; a failure under
/// PSTACK_STRICT=1 / CI=true).
fn python() -> Option<String> {
    crate::support::python_with(
        "PSTACK_MCP_PYTHON",
        DEFAULT_PYTHON,
        "mcp.client.stdio, mcp.client.streamable_http, httpx2",
        "MCP Python SDK",
        "scripts/setup.d/62-mcp-python.sh",
    )
}

async fn post_as(h: &Harness, key: &str, path: &str, body: &Value) -> (StatusCode, Value) {
    let resp = h
        .client
        .post(h.url(path))
        .bearer_auth(key)
        .json(body)
        .send()
        .await
        .expect("POST");
    let status = resp.status();
    (status, resp.json().await.unwrap_or(Value::Null))
}

/// What the test prepares over REST, as the client's plan: a deploy of
/// checkout-api 2.4.1 by CI, the counterfactual's eval runs written by a
/// third key (the gate acts on evidence only when neither the proposing
/// nor the claiming key wrote it), two envelopes of one process.
async fn prepare(h: &Harness) -> Value {
    let (ci, _) = h.scoped_key("ci", &[Scope::Telemetry]).await;
    let (evals, _) = h.scoped_key("evals", &[Scope::Analysis]).await;
    let (st, c) = post_as(
        h,
        &ci,
        "/v1/changes",
        &json!({"environment": "prod", "kind": "deploy", "service": "checkout-api",
            "version": "2.4.1", "previousVersion": "2.4.0", "commitSha": "8f3a1b2",
            "previousCommitSha": "7d2e0a1", "candidateAgentVersion": "agent-7",
            "touchedPaths": ["src/checkout/charge.ts"]}),
    )
    .await;
    assert_eq!(st, StatusCode::CREATED, "{c}");
    let input = FingerprintInput {
        originating_node_id: "checkout-api".into(),
        normalized_operation: "POST /checkout".into(),
        error_signature: "TaxRoundingError".into(),
        downstream_target_node_id: String::new(),
    };
    let fp = fingerprint("prod", &input);
    let mut runs = Vec::new();
    for (passed, version, commit, payload) in [
        (false, "2.4.1", "8f3a1b2", "sha256:aa"),
        (true, "2.4.0", "7d2e0a1", "sha256:aa"),
        (true, "2.4.0", "7d2e0a1", "sha256:bb"),
    ] {
        let mut run = json!({"evalCaseId": "case-7", "inputPayloadHash": payload, "passed": passed,
            "serviceVersion": version, "commitSha": commit, "candidateAgentVersion": "agent-7"});
        if !passed {
            run["failureFingerprint"] = json!(fp);
        }
        let (st, r) = post_as(h, &evals, "/internal/evals/runs", &run).await;
        assert_eq!(st, StatusCode::CREATED, "{r}");
        runs.push(r["id"].as_str().unwrap().to_string());
    }
    let before = Capture::new("node-a", 4242, 1);
    let mut after = Capture::new("node-a", 4242, 2);
    after.blocked = false;
    let (bd, bb) = before.bytes().unwrap();
    let (ad, ab) = after.bytes().unwrap();
    h.post_batch(&[bb, ab]).await;
    let (agent, _) = h.scoped_key("agent", &[Scope::Analysis, Scope::Read]).await;
    json!({
        "agentKey": agent,
        "runnerKey": h.runner_key,
        "changeId": c["id"],
        "fingerprint": fp,
        "fingerprintInput": input,
        "failingRunId": runs[0],
        "passingRunId": runs[1],
        "otherPayloadRunId": runs[2],
        "before": bd,
        "after": ad,
    })
}

/// Run the SDK client with `plan`; its report.
async fn run_client(py: &str, plan: Value) -> Value {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/mcp/sdk_client.py");
    let py = py.to_string();
    let out = tokio::task::spawn_blocking(move || {
        let mut child = Command::new(py)
            .arg(script)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn the MCP SDK client");
        child
            .stdin
            .take()
            .unwrap()
            .write_all(plan.to_string().as_bytes())
            .unwrap();
        child.wait_with_output().expect("the MCP SDK client")
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "the MCP SDK client failed ({}):\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stderr.contains("Session termination failed"),
        "the SDK closes its sessions cleanly:\n{stderr}"
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "the client's report: {e}: {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

/// Everything the client did, read back through REST: every tool called,
/// the findings and proposals stored, and the watchdog armed by the
/// MCP-only runner's `complete`.
async fn check_store(h: &Harness, report: &Value) {
    let all: Vec<&str> = pstack_store::mcp::tools::all()
        .iter()
        .map(|t| t.name)
        .collect();
    let mut all = all;
    all.sort();
    assert_eq!(report["toolsCalled"], json!(all), "{report}");
    let id = report["proposalId"].as_str().unwrap();
    let (st, g) = h.get(&format!("/internal/remediations/{id}")).await;
    assert_eq!(st, StatusCode::OK, "{g}");
    let p = &g["proposal"];
    assert_eq!(p["status"], "completed", "{p}");
    assert_eq!(p["runnerId"], "runner-sdk-1");
    assert_eq!(p["outcome"], json!({"rolledBackTo": "2.4.0"}));
    assert_eq!(p["recoveryStatus"], "monitoring", "{p}");
    assert_eq!(p["callbackHost"], "127.0.0.1", "{p}");
    assert_eq!(p["callbackDelivery"]["status"], "delivered", "{p}");
    let finished = p["finishedAt"].as_str().unwrap();
    let finished_ns = time_ns(finished);
    let due: Vec<i64> = p["checkpoints"]
        .as_array()
        .unwrap_or_else(|| panic!("checkpoints: {p}"))
        .iter()
        .map(|c| time_ns(c["dueAt"].as_str().unwrap()) - finished_ns)
        .collect();
    assert_eq!(
        due,
        [2, 5, 15].map(|m| m * 60_000_000_000),
        "checkpoints +2/+5/+15 m of the completion: {p}"
    );
    // Armed: a tick past +2 m evaluates the first checkpoint.
    let (st, t) = h
        .client
        .post(h.url("/internal/remediations/watchdog"))
        .bearer_auth(&h.key)
        .send()
        .await
        .map(|r| (r.status(), r))
        .unwrap();
    assert_eq!(st, StatusCode::OK);
    let t: Value = t.json().await.unwrap();
    assert_eq!(t["checkpointsEvaluated"], 0, "nothing due yet: {t}");
    h.clock.advance(std::time::Duration::from_secs(2 * 60 + 1));
    let t: Value = h
        .client
        .post(h.url("/internal/remediations/watchdog"))
        .bearer_auth(&h.key)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(t["checkpointsEvaluated"], 1, "{t}");
    let (_, g) = h.get(&format!("/internal/remediations/{id}")).await;
    assert_eq!(
        g["proposal"]["checkpoints"][0]["verdict"], "low_traffic",
        "{g}"
    );
    // The failed grant: no watchdog.
    let failed = report["failedProposalId"].as_str().unwrap();
    let (_, g) = h.get(&format!("/internal/remediations/{failed}")).await;
    assert_eq!(g["proposal"]["status"], "failed_execution", "{g}");
    assert_eq!(g["proposal"]["recoveryStatus"], Value::Null, "{g}");
    // The mismatched pairing's finding is stored (data.finding was real).
    let (st, f) = h
        .get(&format!(
            "/internal/findings?fingerprint={}",
            report_fingerprint(h, report).await
        ))
        .await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(f["items"].as_array().unwrap().len(), 2, "{f}");
}

async fn report_fingerprint(h: &Harness, report: &Value) -> String {
    let (_, f) = h
        .get(&format!(
            "/internal/findings/{}",
            report["findingId"].as_str().unwrap()
        ))
        .await;
    f["fingerprint"].as_str().unwrap().to_string()
}

fn time_ns(rfc3339: &str) -> i64 {
    pstack_store_core::analysis::ledger::parse_time("time", rfc3339)
        .unwrap_or_else(|e| panic!("a time: {rfc3339}: {e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mcp_python_sdk_over_streamable_http_runs_the_seed_workflow() {
    let Some(py) = python() else {
        return;
    };
    let Some(h) = Harness::start_custom(Db::Sqlite, Default::default(), |s| {
        s.mcp_writes = true;
        s.gate.allow_private_webhooks = true;
    })
    .await
    else {
        return;
    };
    let mut plan = prepare(&h).await;
    plan["transport"] = json!("http");
    plan["url"] = json!(h.url("/mcp"));
    let report = run_client(&py, plan).await;
    check_store(&h, &report).await;
    h.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mcp_python_sdk_over_stdio_runs_the_seed_workflow() {
    let Some(py) = python() else {
        return;
    };
    let Some(h) = Harness::start(Db::Sqlite).await else {
        return;
    };
    let db = h.sqlite_path.clone().expect("a SQLite harness");
    let mut plan = prepare(&h).await;
    // The agent's and the runner's processes share one gate key (a grant
    // minted in one is claimed in the other), as `serve` replicas do.
    let dir = tempfile::tempdir().unwrap();
    let key_file = dir.path().join("gate.key");
    std::fs::write(&key_file, hex::encode([7u8; 32])).unwrap();
    plan["transport"] = json!("stdio");
    plan["command"] = json!(env!("CARGO_BIN_EXE_pstack-store"));
    plan["args"] = json!(["--db", db, "mcp"]);
    plan["env"] = json!({
        "OBS_MCP_ENABLE_WRITES": "true",
        "ALERT_WEBHOOK_ALLOW_PRIVATE": "true",
        "PSTACK_STORE_GATE_KEY_FILE": key_file,
        "RUST_LOG": "warn",
    });
    let report = run_client(&py, plan).await;
    check_store(&h, &report).await;
    // The database now records that gate key: a write-enabled MCP process
    // with none, or another, refuses to start (its grants would not be
    // honoured), naming the fix; a read-only one needs none.
    let other = dir.path().join("other.key");
    std::fs::write(&other, hex::encode([9u8; 32])).unwrap();
    for (writes, key, refused) in [
        ("true", None, true),
        ("true", Some(&other), true),
        ("true", Some(&key_file), false),
        ("false", None, false),
    ] {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_pstack-store"));
        cmd.args(["--db", &db, "mcp"])
            .env("PSTACK_STORE_API_KEY", &h.key)
            .env("OBS_MCP_ENABLE_WRITES", writes)
            .env_remove("PSTACK_STORE_GATE_KEY_FILE")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        if let Some(k) = key {
            cmd.env("PSTACK_STORE_GATE_KEY_FILE", k);
        }
        // stdin closed: a process that got to serving ends waiting for
        // the client's initialize; a refused one never gets there.
        let out = cmd.output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{stderr}");
        assert_eq!(
            (
                stderr.contains("refusing to start") && stderr.contains("--gate-key-file"),
                stderr.contains("initialize")
            ),
            (refused, !refused),
            "writes={writes} key={key:?}: {stderr}"
        );
    }
    h.finish().await;
}
