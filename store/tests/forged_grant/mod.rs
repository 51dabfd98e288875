//! The forged-grant sequence of issue 28 against the real `pstack-store`
//! binary (SQLite), keys made with `pstack-store keys create --scope`:
//! a back-dated deploy, fabricated OTLP spans (new version 50 % errors, old
//! 0 %), an incident, a finding and a proposal. Before scopes and
//! provenance, a node's shipping key alone reached
//! `cohort_rate_isolated` → `rollback_deploy` `autonomous_write`, took the
//! grant token from the answer and claimed it itself. Also: future-dated
//! changes and spans refused at a configured skew.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use opentelemetry_proto::tonic::trace::v1::status::StatusCode as OtelStatus;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span, Status};
use prost::Message;
use reqwest::StatusCode;
use serde_json::{Value, json};

const MIN_NS: i64 = 60_000_000_000;

/// A `pstack-store serve` child on a free loopback port, over SQLite.
struct StoreProcess {
    child: Child,
    base: String,
    db: std::path::PathBuf,
    _dir: tempfile::TempDir,
    client: reqwest::Client,
}

impl Drop for StoreProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_pstack-store"))
}

impl StoreProcess {
    async fn start(flags: &[&str]) -> StoreProcess {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("store.db");
        // Migrate before serving, so `keys create` and `serve` never race.
        let out = bin().arg("--db").arg(&db).arg("migrate").output().unwrap();
        assert!(out.status.success(), "{out:?}");
        let client = reqwest::Client::new();
        for _ in 0..5 {
            let port = std::net::TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port();
            let listen = format!("127.0.0.1:{port}");
            let mut child = bin()
                .arg("--db")
                .arg(&db)
                .args(["serve", "--listen", &listen])
                .args(flags)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            let deadline = Instant::now() + Duration::from_secs(20);
            while Instant::now() < deadline {
                if let Ok(r) = client.get(format!("http://{listen}/healthz")).send().await
                    && r.status().is_success()
                {
                    return StoreProcess {
                        child,
                        base: format!("http://{listen}"),
                        db,
                        _dir: dir,
                        client,
                    };
                }
                if child.try_wait().unwrap().is_some() {
                    break; // lost the port: pick another
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        panic!("pstack-store serve did not come up");
    }

    /// `pstack-store keys create --name NAME --scope SCOPES`: (key, id).
    fn key(&self, name: &str, scopes: &str) -> (String, String) {
        let out = bin()
            .arg("--db")
            .arg(&self.db)
            .args(["keys", "create", "--name", name, "--scope", scopes])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        let key = String::from_utf8(out.stdout).unwrap().trim().to_string();
        let id = key[4..20].to_string();
        (key, id)
    }

    async fn post(&self, key: &str, path: &str, body: &Value) -> (StatusCode, Value) {
        let resp = self
            .client
            .post(format!("{}{path}", self.base))
            .bearer_auth(key)
            .json(body)
            .send()
            .await
            .unwrap();
        let status = resp.status();
        (status, resp.json().await.unwrap_or(Value::Null))
    }

    async fn get(&self, key: &str, path: &str) -> (StatusCode, Value) {
        let resp = self
            .client
            .get(format!("{}{path}", self.base))
            .bearer_auth(key)
            .send()
            .await
            .unwrap();
        let status = resp.status();
        (status, resp.json().await.unwrap_or(Value::Null))
    }

    async fn traces(&self, key: &str, req: &ExportTraceServiceRequest) -> (StatusCode, Value) {
        let resp = self
            .client
            .post(format!("{}/v1/traces", self.base))
            .bearer_auth(key)
            .header("content-type", "application/x-protobuf")
            .body(req.encode_to_vec())
            .send()
            .await
            .unwrap();
        let status = resp.status();
        let bytes = resp.bytes().await.unwrap();
        (
            status,
            serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        )
    }
}

fn code(body: &Value) -> &str {
    body["error"]["code"].as_str().unwrap_or("<no error code>")
}

fn kv(k: &str, v: &str) -> KeyValue {
    KeyValue {
        key: k.into(),
        value: Some(AnyValue {
            value: Some(any_value::Value::StringValue(v.into())),
        }),
        ..Default::default()
    }
}

/// `requests` server spans of `service` at `version`, the first `errors`
/// failed, 100 ms apart from `start_ns`.
fn spans(
    service: &str,
    version: &str,
    requests: u64,
    errors: u64,
    start_ns: i64,
    seed: u8,
) -> ExportTraceServiceRequest {
    let spans = (0..requests)
        .map(|i| {
            let t = u64::try_from(start_ns).unwrap() + i * 100_000_000;
            let mut id = [seed; 16];
            id[8..].copy_from_slice(&(i + 1).to_be_bytes());
            Span {
                trace_id: id.to_vec(),
                span_id: id[8..].to_vec(),
                name: "POST /checkout".into(),
                kind: SpanKind::Server as i32,
                start_time_unix_nano: t,
                end_time_unix_nano: t + 20_000_000,
                status: Some(Status {
                    code: if i < errors {
                        OtelStatus::Error
                    } else {
                        OtelStatus::Ok
                    } as i32,
                    message: String::new(),
                }),
                ..Default::default()
            }
        })
        .collect();
    ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(Resource {
                attributes: vec![
                    kv("service.name", service),
                    kv("service.version", version),
                    kv("deployment.environment.name", "prod"),
                ],
                ..Default::default()
            }),
            scope_spans: vec![ScopeSpans {
                spans,
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
}

fn rfc(ns: i64) -> String {
    pstack_store_core::ident::format_ns(ns)
}

/// The evidence half of the sequence, written with `key`: a deploy of
/// `service` 2.4.0 → 2.4.1 back-dated 10 minutes, then spans (2.4.1: 200
/// requests, half failed; 2.4.0: 200, none). The change id, or the refusal.
async fn forge_evidence(
    s: &StoreProcess,
    key: &str,
    service: &str,
) -> Result<String, (StatusCode, Value)> {
    let now = pstack_store_core::now_ns();
    let at = now - now.rem_euclid(MIN_NS) - 10 * MIN_NS;
    let (st, change) = s
        .post(
            key,
            "/v1/changes",
            &json!({"environment": "prod", "kind": "deploy", "service": service,
                    "version": "2.4.1", "previousVersion": "2.4.0", "commitSha": "8f3a1b2",
                    "at": rfc(at)}),
        )
        .await;
    if st != StatusCode::CREATED {
        return Err((st, change));
    }
    for (version, errors, seed) in [("2.4.1", 100, 1), ("2.4.0", 0, 2)] {
        let (st, body) = s
            .traces(
                key,
                &spans(service, version, 200, errors, at + MIN_NS, seed),
            )
            .await;
        if st != StatusCode::OK {
            return Err((st, body));
        }
    }
    Ok(change["id"].as_str().unwrap().to_string())
}

/// The analysis half, written with `key`: an incident, a finding naming
/// the change (the server derives its tier), a rollback proposal. The
/// propose answer, or the first refusal.
async fn forge_proposal(
    s: &StoreProcess,
    key: &str,
    service: &str,
    change: &str,
    idempotency: &str,
) -> Result<Value, (StatusCode, Value)> {
    let (st, inc) = s
        .post(
            key,
            "/internal/incidents",
            &json!({"project": "shop", "environment": "prod", "dedupKey": format!("{service}-5xx"),
                    "title": "5xx"}),
        )
        .await;
    if !st.is_success() {
        return Err((st, inc));
    }
    let inc = inc["incident"]["id"].as_str().unwrap().to_string();
    let (st, f) = s
        .post(
            key,
            "/internal/findings",
            &json!({"environment": "prod", "incidentId": inc, "faultLocusEntityId": service,
                    "causalChain": [{"subject": change, "relation": "degraded_after_change", "object": service}],
                    "contributingChangeId": change, "idempotencyKey": format!("f-{idempotency}"),
                    "fingerprintInput": {"originatingNodeId": service,
                        "normalizedOperation": "POST /checkout", "errorSignature": "TaxRoundingError"}}),
        )
        .await;
    if st != StatusCode::CREATED {
        return Err((st, f));
    }
    // The server derives the tier from the evidence, whoever wrote it.
    assert_eq!(
        f["finding"]["causalProofTier"], "cohort_rate_isolated",
        "{f:#}"
    );
    let fid = f["finding"]["id"].as_str().unwrap().to_string();
    let (st, p) = s
        .post(
            key,
            "/internal/remediations/propose",
            &json!({"incidentId": inc, "findingId": fid, "action": "rollback_deploy",
                    "target": {"service": service, "environment": "prod"},
                    "expectedCurrentState": {"version": "2.4.1"},
                    "idempotencyKey": idempotency}),
        )
        .await;
    if st != StatusCode::CREATED {
        return Err((st, p));
    }
    Ok(p)
}

async fn claim(s: &StoreProcess, key: &str, p: &Value) -> (StatusCode, Value) {
    let id = p["proposal"]["id"].as_str().unwrap();
    s.post(
        key,
        &format!("/internal/remediations/{id}/grant"),
        &json!({"operation": "claim", "grantToken": p["grantToken"], "runnerId": "runner-1"}),
    )
    .await
}

// Regression (issue 28): with a node's shipping key alone, the five writes
// reached an autonomous rollback grant the same key claimed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_grant_sequence_is_refused() {
    let s = StoreProcess::start(&[]).await;
    let (node, _) = s.key("node-a", "ingest");
    let (reader, _) = s.key("dashboard", "read");

    // 1. A node's key (ingest only) is refused at its first write beyond
    //    envelopes, naming the scope it lacks — and every later one.
    let (st, body) = forge_evidence(&s, &node, "checkout-api").await.unwrap_err();
    assert_eq!(st, StatusCode::FORBIDDEN, "{body}");
    assert_eq!(code(&body), "insufficient_scope", "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("needs scope telemetry"),
        "{body}"
    );
    let (st, body) = s
        .traces(
            &node,
            &spans(
                "checkout-api",
                "2.4.1",
                10,
                5,
                pstack_store_core::now_ns(),
                9,
            ),
        )
        .await;
    assert_eq!(
        (st, code(&body)),
        (StatusCode::FORBIDDEN, "insufficient_scope")
    );
    for path in [
        "/internal/incidents",
        "/internal/findings",
        "/internal/remediations/propose",
    ] {
        let (st, body) = s.post(&node, path, &json!({})).await;
        assert_eq!(st, StatusCode::FORBIDDEN, "{path}: {body}");
        assert_eq!(
            body["error"]["detail"]["requiredScope"], "analysis",
            "{path}"
        );
    }
    let (_, changes) = s.get(&reader, "/v1/changes").await;
    assert_eq!(changes["items"], json!([]), "nothing was stored");

    // 2. One key holding every writing scope writes all the evidence
    //    itself: the finding is cohort_rate_isolated, but the gate does not
    //    act on evidence the proposing key wrote — no autonomy, no token.
    let (forger, forger_id) = s.key("forger", "telemetry,analysis,runner,read");
    let change = forge_evidence(&s, &forger, "checkout-api").await.unwrap();
    let p = forge_proposal(&s, &forger, "checkout-api", &change, "forged")
        .await
        .unwrap();
    assert_eq!(p["grantToken"], Value::Null, "{p:#}");
    assert_eq!(p["proposal"]["effectiveAutonomy"], "human_approved_write");
    assert_eq!(p["proposal"]["status"], "pending_human_approval");
    assert_eq!(p["proposal"]["causalProofTier"], "corroborated_candidate");
    let d = &p["tierDemotion"];
    assert_eq!(d["code"], "self_attested_evidence", "{p:#}");
    assert_eq!(d["findingTier"], "cohort_rate_isolated");
    assert_eq!(d["gateTier"], "corroborated_candidate");
    assert!(
        d["reason"].as_str().unwrap().contains(&format!(
            "key {forger_id} (the proposing key) wrote all of change {change}"
        )),
        "{d}"
    );
    // With no token there is nothing to claim.
    let (st, body) = claim(&s, &forger, &p).await;
    assert_eq!(st, StatusCode::BAD_REQUEST, "{body}");

    // 3. The same evidence written by others (CI writes the deploy, the
    //    collector the spans; here one key for both) earns the agent its
    //    autonomous grant — which no key that proposed it or wrote its
    //    evidence may claim.
    let (ci, _) = s.key("ci", "telemetry,runner");
    let (agent, _) = s.key("agent", "analysis,read");
    let (executor, _) = s.key("executor", "runner");
    let change = forge_evidence(&s, &ci, "payments-api").await.unwrap();
    let p = forge_proposal(&s, &agent, "payments-api", &change, "honest")
        .await
        .unwrap();
    assert_eq!(
        p["proposal"]["effectiveAutonomy"], "autonomous_write",
        "{p:#}"
    );
    assert!(p["grantToken"].as_str().unwrap().starts_with("rgt_"));
    assert!(p.get("tierDemotion").is_none(), "{p:#}");
    let (st, body) = claim(&s, &agent, &p).await;
    assert_eq!(
        (st, code(&body)),
        (StatusCode::FORBIDDEN, "insufficient_scope")
    );
    assert_eq!(body["error"]["detail"]["requiredScope"], "runner");
    let (st, body) = claim(&s, &ci, &p).await;
    assert_eq!(
        (st, code(&body)),
        (StatusCode::FORBIDDEN, "self_attested_evidence"),
        "{body}"
    );
    // A key that proposed on others' evidence does not claim its own grant.
    let p2 = {
        let (st, f) = s
            .get(
                &reader,
                &format!(
                    "/internal/remediations/{}",
                    p["proposal"]["id"].as_str().unwrap()
                ),
            )
            .await;
        assert_eq!(st, StatusCode::OK);
        let (st, p2) = s
            .post(
                &forger,
                "/internal/remediations/propose",
                &json!({"incidentId": f["proposal"]["incidentId"], "findingId": f["proposal"]["findingId"],
                        "action": "rollback_deploy",
                        "target": {"service": "payments-api", "environment": "prod"},
                        "expectedCurrentState": {"version": "2.4.1"}, "idempotencyKey": "forger-on-ci"}),
            )
            .await;
        assert_eq!(st, StatusCode::CREATED, "{p2}");
        assert_eq!(
            p2["proposal"]["effectiveAutonomy"], "autonomous_write",
            "{p2:#}"
        );
        p2
    };
    let (st, body) = claim(&s, &forger, &p2).await;
    assert_eq!(
        (st, code(&body)),
        (StatusCode::FORBIDDEN, "claimer_is_proposer"),
        "{body}"
    );
    // The executor, which wrote none of it, claims.
    let (st, body) = claim(&s, &executor, &p).await;
    assert_eq!(st, StatusCode::OK, "{body}");
    assert_eq!(body["proposal"]["status"], "claimed_executing");
}

// Regression (issue 28): `at` had no upper bound; a deploy dated 2099 stayed
// the target's current state and hid every later real deploy. Spans dated
// ahead answered the watchdog's future checkpoints.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn future_dated_changes_and_spans_are_refused() {
    let s = StoreProcess::start(&["--max-future-skew", "2m"]).await;
    let (ci, _) = s.key("ci", "telemetry,read");
    let change = |at: String| {
        json!({"environment": "prod", "kind": "deploy", "service": "checkout-api",
               "version": "9.9.9", "at": at})
    };
    let now = pstack_store_core::now_ns();
    // The bound is now + 2 min; 30 s either side of it (the process reads
    // its clock a few ms after this one).
    for (label, at, want) in [
        (
            "2099",
            "2099-01-01T00:00:00Z".to_string(),
            StatusCode::BAD_REQUEST,
        ),
        (
            "skew + 30 s",
            rfc(now + 150_000_000_000),
            StatusCode::BAD_REQUEST,
        ),
        (
            "skew - 30 s",
            rfc(now + 90_000_000_000),
            StatusCode::CREATED,
        ),
        ("now", rfc(now), StatusCode::CREATED),
    ] {
        let (st, body) = s.post(&ci, "/v1/changes", &change(at)).await;
        assert_eq!(st, want, "{label}: {body}");
        if want == StatusCode::BAD_REQUEST {
            assert_eq!(code(&body), "time_in_future", "{label}");
            assert_eq!(body["error"]["field"], "at", "{label}");
        }
    }
    // A host change's node dated ahead is named.
    let (st, body) = s
        .post(
            &ci,
            "/v1/changes",
            &json!({"environment": "prod", "kind": "kernel", "at": rfc(now),
                    "nodes": [{"node": "n1"}, {"node": "n2", "at": "2099-01-01T00:00:00Z"}]}),
        )
        .await;
    assert_eq!(st, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["error"]["field"], "nodes[1].at");
    // Spans: the first span past the bound is named; nothing is stored.
    let mut req = spans("checkout-api", "9.9.9", 3, 0, now - MIN_NS, 3);
    let far = u64::try_from(now + 150_000_000_000).unwrap();
    req.resource_spans[0].scope_spans[0].spans[2].start_time_unix_nano = far;
    req.resource_spans[0].scope_spans[0].spans[2].end_time_unix_nano = far + 1;
    let (st, body) = s.traces(&ci, &req).await;
    assert_eq!(st, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(code(&body), "time_in_future");
    assert_eq!(
        body["error"]["field"],
        "resourceSpans[0].scopeSpans[0].spans[2].startTimeUnixNano"
    );
    let end_only = {
        let mut r = spans("checkout-api", "9.9.9", 1, 0, now, 4);
        r.resource_spans[0].scope_spans[0].spans[0].end_time_unix_nano = far;
        r
    };
    let (st, body) = s.traces(&ci, &end_only).await;
    assert_eq!(st, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(
        body["error"]["field"],
        "resourceSpans[0].scopeSpans[0].spans[0].endTimeUnixNano"
    );
    let (st, _) = s
        .traces(&ci, &spans("checkout-api", "9.9.9", 3, 0, now - MIN_NS, 5))
        .await;
    assert_eq!(st, StatusCode::OK, "spans within the bound are taken");
    // The refused deploy pinned nothing: the ledger holds the two accepted.
    let (_, list) = s.get(&ci, "/v1/changes?service=checkout-api").await;
    assert_eq!(list["items"].as_array().unwrap().len(), 2, "{list:#}");
}
