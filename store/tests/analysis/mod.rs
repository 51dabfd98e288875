//! The analysis half end to end: real OTLP (protobuf and JSON, built with the
//! `opentelemetry-proto` types) over real HTTP into a real server on SQLite
//! and PostgreSQL, then the change ledger, blast radius, findings, eval runs,
//! fleet cohorts from sealed envelopes, and the OpenAPI document.

use std::collections::BTreeSet;
use std::time::Duration;

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::span::{Event, SpanKind};
use opentelemetry_proto::tonic::trace::v1::status::StatusCode as OtelStatus;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span, Status};
use prost::Message;
use pstack_envelope::{Claim, ClaimKind, Scope};
use pstack_store_core::synthetic::Capture;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::on_both_backends;
use crate::support::{Db, Harness, code, gzip};

mod cohorts;
mod otel_sdk;

const MIN_NS: i64 = 60_000_000_000;
const HOUR_NS: i64 = 60 * MIN_NS;

/// A minute-aligned time `hours_ago` hours before now.
fn anchor(hours_ago: i64) -> i64 {
    let now = pstack_store_core::now_ns();
    now - now.rem_euclid(MIN_NS) - hours_ago * HOUR_NS
}

fn rfc(ns: i64) -> String {
    pstack_store_core::ident::format_ns(ns)
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

fn kv_int(k: &str, v: i64) -> KeyValue {
    KeyValue {
        key: k.into(),
        value: Some(AnyValue {
            value: Some(any_value::Value::IntValue(v)),
        }),
        ..Default::default()
    }
}

/// What requests of one version look like.
#[derive(Clone)]
struct Traffic {
    service: &'static str,
    version: &'static str,
    requests: usize,
    errors: usize,
    /// First request start, ns; requests are 100 ms apart.
    start_ns: i64,
    latency_ms: u64,
    /// (resource attributes, calls per request, call duration ms, failed calls per 100 requests).
    db: Option<(Vec<KeyValue>, usize, u64, usize)>,
    /// Failing requests carry an exception event with this `code.filepath`.
    code_path: Option<&'static str>,
}

impl Traffic {
    fn new(version: &'static str, requests: usize, errors: usize, start_ns: i64) -> Traffic {
        Traffic {
            service: "checkout-api",
            version,
            requests,
            errors,
            start_ns,
            latency_ms: 20,
            db: None,
            code_path: None,
        }
    }
}

fn orders_db() -> Vec<KeyValue> {
    vec![
        kv("db.system.name", "postgresql"),
        kv("server.address", "orders-primary"),
        kv_int("server.port", 5432),
        kv("db.namespace", "orders"),
    ]
}

fn id_bytes(n: u64, len: usize) -> Vec<u8> {
    let mut b = vec![0u8; len];
    b[len - 8..].copy_from_slice(&(n + 1).to_be_bytes());
    b[0] = 0x5a;
    b
}

/// OTLP requests for `t`, 500 requests per export (as a batching SDK sends).
fn export(t: &Traffic, seed: u64) -> Vec<ExportTraceServiceRequest> {
    let mut out = Vec::new();
    let resource = Resource {
        attributes: vec![
            kv("service.name", t.service),
            kv("service.version", t.version),
            kv("deployment.environment.name", "prod"),
            kv("vcs.commit.id", "8f3a1b2c"),
        ],
        ..Default::default()
    };
    let mut spans = Vec::new();
    for i in 0..t.requests {
        let n = seed * 10_000_000 + i as u64 * 100;
        let start = (t.start_ns + i as i64 * 100_000_000) as u64;
        let failed = i < t.errors;
        let trace_id = id_bytes(n, 16);
        let span_id = id_bytes(n, 8);
        let mut events = Vec::new();
        if failed && let Some(p) = t.code_path {
            events.push(Event {
                name: "exception".into(),
                time_unix_nano: start,
                attributes: vec![
                    kv("exception.type", "TaxRoundingError"),
                    kv("code.filepath", p),
                ],
                ..Default::default()
            });
        }
        spans.push(Span {
            trace_id: trace_id.clone(),
            span_id: span_id.clone(),
            name: "POST /checkout".into(),
            kind: SpanKind::Server as i32,
            start_time_unix_nano: start,
            end_time_unix_nano: start + t.latency_ms * 1_000_000,
            attributes: vec![
                kv("http.request.method", "POST"),
                kv_int("http.response.status_code", if failed { 503 } else { 200 }),
            ],
            events,
            status: Some(Status {
                code: if failed {
                    OtelStatus::Error
                } else {
                    OtelStatus::Ok
                } as i32,
                message: String::new(),
            }),
            ..Default::default()
        });
        if let Some((attrs, per_request, dur_ms, fail_pct)) = &t.db {
            for c in 0..*per_request {
                let call_failed = (i % 100) < *fail_pct && c == 0;
                spans.push(Span {
                    trace_id: trace_id.clone(),
                    span_id: id_bytes(n + 1 + c as u64, 8),
                    parent_span_id: span_id.clone(),
                    name: "SELECT orders".into(),
                    kind: SpanKind::Client as i32,
                    start_time_unix_nano: start + 1_000_000,
                    end_time_unix_nano: start + 1_000_000 + dur_ms * 1_000_000,
                    attributes: attrs.clone(),
                    status: call_failed.then(|| Status {
                        code: OtelStatus::Error as i32,
                        message: "connection timeout".into(),
                    }),
                    ..Default::default()
                });
            }
        }
        if (i + 1) % 500 == 0 || i + 1 == t.requests {
            out.push(ExportTraceServiceRequest {
                resource_spans: vec![ResourceSpans {
                    resource: Some(resource.clone()),
                    scope_spans: vec![ScopeSpans {
                        spans: std::mem::take(&mut spans),
                        ..Default::default()
                    }],
                    ..Default::default()
                }],
            });
        }
    }
    out
}

#[derive(Clone, Copy, Debug)]
enum Wire {
    Protobuf,
    Json,
    JsonGzip,
    ProtobufGzip,
}

async fn post_traces(
    h: &Harness,
    body: Vec<u8>,
    content_type: &str,
    gz: bool,
) -> (StatusCode, Vec<u8>) {
    let mut req = h
        .client
        .post(h.url("/v1/traces"))
        .bearer_auth(&h.key)
        .header("content-type", content_type);
    let body = if gz {
        req = req.header("content-encoding", "gzip");
        gzip(&body)
    } else {
        body
    };
    let resp = req.body(body).send().await.expect("POST /v1/traces");
    let status = resp.status();
    (status, resp.bytes().await.expect("body").to_vec())
}

async fn send(h: &Harness, t: &Traffic, seed: u64, wire: Wire) {
    for req in export(t, seed) {
        let (ct, body, gz) = match wire {
            Wire::Protobuf => ("application/x-protobuf", req.encode_to_vec(), false),
            Wire::ProtobufGzip => ("application/x-protobuf", req.encode_to_vec(), true),
            Wire::Json => (
                "application/json",
                serde_json::to_vec(&req).expect("json"),
                false,
            ),
            Wire::JsonGzip => (
                "application/json",
                serde_json::to_vec(&req).expect("json"),
                true,
            ),
        };
        let (status, body) = post_traces(h, body, ct, gz).await;
        assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    }
}

/// Ships each cohort's traffic in order: (traffic, seed, wire format).
async fn send_all(h: &Harness, cohorts: &[(&Traffic, u64, Wire)]) {
    for (t, seed, wire) in cohorts {
        send(h, t, *seed, *wire).await;
    }
}

/// A harness with one checkout-api deploy at `anchor(1)`: (harness, deploy
/// time, change id); `None` where [`Harness::start`] gives none.
async fn start_deployed(db: Db) -> Option<(Harness, i64, String)> {
    let h = Harness::start(db).await?;
    let at = anchor(1);
    let change = deploy(&h, at, json!({})).await;
    Some((h, at, change))
}

async fn post_json(h: &Harness, path: &str, body: &Value) -> (StatusCode, Value) {
    let resp = h
        .client
        .post(h.url(path))
        .bearer_auth(&h.key)
        .json(body)
        .send()
        .await
        .expect("POST");
    let status = resp.status();
    (status, resp.json().await.unwrap_or(Value::Null))
}

async fn deploy(h: &Harness, at_ns: i64, extra: Value) -> String {
    let mut body = json!({
        "environment": "prod",
        "kind": "deploy",
        "service": "checkout-api",
        "version": "2.4.1",
        "previousVersion": "2.4.0",
        "commitSha": "8f3a1b2c",
        "previousCommitSha": "7d2e0a1b",
        "candidateAgentVersion": "agent-7",
        "summary": "Switch tax rounding to strict decimal mode",
        "at": rfc(at_ns),
    });
    if let (Some(b), Value::Object(e)) = (body.as_object_mut(), extra) {
        b.extend(e);
    }
    let (status, resp) = post_json(h, "/v1/changes", &body).await;
    assert_eq!(status, StatusCode::CREATED, "{resp}");
    resp["id"].as_str().expect("id").to_string()
}

async fn blast(h: &Harness, id: &str, query: &str) -> Value {
    let (status, body) = h
        .get(&format!(
            "/internal/changes/{id}/blast-radius?window=30m{query}"
        ))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    body
}

fn finding(key: &str, change: Option<&str>, chain: Value) -> Value {
    let mut f = json!({
        "environment": "prod",
        "faultLocusEntityId": "checkout-api",
        "causalChain": chain,
        "citedEvidenceIds": [],
        "idempotencyKey": key,
        "fingerprintInput": {
            "originatingNodeId": "checkout-api",
            "normalizedOperation": "POST /checkout",
            "errorSignature": "TaxRoundingError",
        },
    });
    if let Some(c) = change {
        f["contributingChangeId"] = json!(c);
    }
    f
}

fn chain(relation: &str) -> Value {
    json!([{"subject": "chg", "relation": relation, "object": "checkout-api"}])
}

async fn tier_of(h: &Harness, change: &str, key: &str, relation: &str) -> String {
    let (status, body) = post_json(
        h,
        "/internal/findings",
        &finding(key, Some(change), chain(relation)),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    body["finding"]["causalProofTier"]
        .as_str()
        .expect("tier")
        .to_string()
}

// ---- scenario 1: the traffic-share fallacy ----

async fn traffic_share_fallacy(db: Db) {
    let Some((h, at, change)) = start_deployed(db).await else {
        return;
    };
    // 95 % / 5 % of traffic, the same 10 % error rate (an upstream outage).
    let new = Traffic::new("2.4.1", 1900, 190, at + MIN_NS);
    let old = Traffic::new("2.4.0", 100, 10, at + MIN_NS);
    send_all(
        &h,
        &[(&new, 1, Wire::Protobuf), (&old, 2, Wire::ProtobufGzip)],
    )
    .await;
    let b = blast(&h, &change, "").await;
    assert_eq!(b["verdict"], "shared_degradation_external_cause", "{b:#}");
    assert_eq!(b["cohorts"]["new"]["requestCount"], 1900);
    assert_eq!(b["cohorts"]["new"]["errorCount"], 190);
    assert_eq!(b["cohorts"]["previous"]["requestCount"], 100);
    assert_eq!(b["cohorts"]["previous"]["version"], "2.4.0");
    assert!(
        (b["relativeRisk"].as_f64().unwrap() - 1.0).abs() < 1e-9,
        "{b}"
    );
    // 95 % of errors are on the new version, yet nothing blames it.
    let ci = &b["errorRateDifferenceCi95"];
    assert_eq!(ci["method"], "newcombe_hybrid_score");
    assert!(
        ci["lower"].as_f64().unwrap() < 0.0 && ci["upper"].as_f64().unwrap() > 0.0,
        "{ci}"
    );
    assert_eq!(b["sharedResourceAggressors"], json!([]));
    assert_eq!(
        tier_of(&h, &change, "k1", "degraded_after_change").await,
        "unverified_locus"
    );
    h.finish().await;
}

// ---- a real regression ----

async fn real_regression(db: Db) {
    let Some((h, at, change)) = start_deployed(db).await else {
        return;
    };
    let new = Traffic::new("2.4.1", 1000, 120, at + MIN_NS);
    let old = Traffic::new("2.4.0", 1250, 1, at + MIN_NS);
    send_all(&h, &[(&new, 3, Wire::JsonGzip), (&old, 4, Wire::Json)]).await;
    let b = blast(&h, &change, "").await;
    assert_eq!(b["verdict"], "isolated_to_new_version", "{b:#}");
    assert_eq!(b["comparedWith"], "previous");
    assert!((b["cohorts"]["new"]["errorRate"].as_f64().unwrap() - 0.12).abs() < 1e-12);
    assert!(
        (b["relativeRisk"].as_f64().unwrap() - 0.12 / 0.001).abs() < 1e-6,
        "{b}"
    );
    assert!(
        b["errorRateDifferenceCi95"]["lower"].as_f64().unwrap() > 0.09,
        "{b}"
    );
    assert_eq!(
        tier_of(&h, &change, "k1", "isolated_to_version_cohort").await,
        "cohort_rate_isolated"
    );
    h.finish().await;
}

// ---- an instant 100 % cutover ----

async fn instant_cutover(db: Db) {
    let Some((h, at, change)) = start_deployed(db).await else {
        return;
    };
    // Before: only 2.4.0, healthy. After: only 2.4.1, failing.
    let old = Traffic::new("2.4.0", 1000, 1, at - 20 * MIN_NS);
    let new = Traffic::new("2.4.1", 1000, 200, at + MIN_NS);
    send_all(&h, &[(&old, 5, Wire::Protobuf), (&new, 6, Wire::Json)]).await;
    let b = blast(&h, &change, "").await;
    assert_eq!(b["verdict"], "sequential_post_cutover_regression", "{b:#}");
    assert_eq!(b["comparedWith"], "preBaseline");
    assert_eq!(b["cohorts"]["previous"]["requestCount"], 0);
    assert_eq!(b["cohorts"]["preBaseline"]["requestCount"], 1000);
    assert_eq!(
        tier_of(&h, &change, "k1", "degraded_after_change").await,
        "corroborated_candidate"
    );
    h.finish().await;
}

// ---- noisy neighbour on a shared PostgreSQL, and its external twin ----

async fn noisy_neighbour(db: Db) {
    let Some((h, at, change)) = start_deployed(db).await else {
        return;
    };
    let mut new = Traffic::new("2.4.1", 600, 180, at + MIN_NS);
    new.db = Some((orders_db(), 10, 8, 0)); // 10 queries per request, none failing
    let mut old = Traffic::new("2.4.0", 600, 120, at + MIN_NS);
    old.db = Some((orders_db(), 1, 8, 20)); // 1 query per request, 20 % time out
    send_all(&h, &[(&new, 7, Wire::Protobuf), (&old, 8, Wire::Protobuf)]).await;
    let b = blast(&h, &change, "").await;
    assert_eq!(
        b["verdict"], "shared_degradation_new_version_aggressor",
        "{b:#}"
    );
    let aggressors = b["sharedResourceAggressors"].as_array().unwrap();
    assert_eq!(aggressors.len(), 1, "{b:#}");
    let a = &aggressors[0];
    assert_eq!(
        a["resource"],
        "db:prod:postgresql:orders-primary:5432/orders"
    );
    assert!(
        (a["fanoutRatio"].as_f64().unwrap() - 10.0).abs() < 1e-9,
        "{a}"
    );
    assert_eq!(a["spanId"].as_str().unwrap().len(), 16);
    assert_eq!(a["traceId"].as_str().unwrap().len(), 32);
    assert_eq!(
        tier_of(&h, &change, "k1", "induced_shared_resource_contention").await,
        "corroborated_candidate"
    );
    // An incident's evidence bundle names the aggressor as a contention
    // candidate, with the change that amplified it.
    let (st, inc) = post_json(
        &h,
        "/internal/incidents",
        &json!({"project": "p", "environment": "prod", "dedupKey": "orders-slow", "title": "orders slow", "faultLocusEntityId": "checkout-api"}),
    )
    .await;
    assert!(st.is_success(), "{inc}");
    let (st, bundle) = h
        .get(&format!(
            "/internal/bundles?intent=triage_incident&incident={}&budgetTokens=100000",
            inc["incident"]["id"].as_str().unwrap()
        ))
        .await;
    assert_eq!(st, StatusCode::OK, "{bundle}");
    let cc = bundle["bundle"]["autosre"]["contentionCandidates"]
        .as_array()
        .unwrap();
    assert_eq!(cc.len(), 1, "{bundle:#}");
    assert_eq!(
        cc[0]["resource"],
        "db:prod:postgresql:orders-primary:5432/orders"
    );
    assert_eq!(cc[0]["changeId"], change.as_str());
    assert_eq!(
        cc[0]["changeVerdict"],
        "shared_degradation_new_version_aggressor"
    );
    assert!(!bundle.to_string().contains("not assembled"), "{bundle}");

    // The twin: same failures, no amplification by the new version.
    let at = anchor(3);
    let twin = deploy(&h, at, json!({"service": "ledger-api"})).await;
    let mut new = Traffic::new("2.4.1", 600, 180, at + MIN_NS);
    new.service = "ledger-api";
    new.db = Some((orders_db(), 1, 8, 20));
    let mut old = new.clone();
    old.version = "2.4.0";
    old.errors = 120;
    send_all(&h, &[(&new, 9, Wire::Protobuf), (&old, 10, Wire::Protobuf)]).await;
    let (status, b) = h
        .get(&format!("/internal/changes/{twin}/blast-radius?window=30m"))
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(b["verdict"], "shared_degradation_external_cause", "{b:#}");
    assert_eq!(b["sharedResourceAggressors"], json!([]));
    h.finish().await;
}

// ---- code-path overlap alone; a client-sent tier ----

async fn code_path_overlap_is_capped(db: Db) {
    let Some(h) = Harness::start(db).await else {
        return;
    };
    let at = anchor(1);
    let change = deploy(
        &h,
        at,
        json!({"touchedPaths": ["src/checkout/charge.ts", "README.md"]}),
    )
    .await;
    let mut new = Traffic::new("2.4.1", 1000, 20, at + MIN_NS);
    new.code_path = Some("/app/src/checkout/charge.ts");
    let old = Traffic::new("2.4.0", 1000, 20, at + MIN_NS);
    send_all(&h, &[(&new, 11, Wire::Json), (&old, 12, Wire::Protobuf)]).await;
    let b = blast(&h, &change, "").await;
    assert_eq!(b["verdict"], "no_regression_detected", "{b:#}");
    assert_eq!(b["touchedPathsOverlap"], json!(["src/checkout/charge.ts"]));
    let mut f = finding("k1", Some(&change), chain("touched_same_code_path"));
    f["causalProofTier"] = json!("counterfactual_verified");
    let (status, body) = post_json(&h, "/internal/findings", &f).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(
        body["finding"]["causalProofTier"], "corroborated_candidate",
        "{body:#}"
    );
    assert_eq!(body["ignoredFields"], json!(["causalProofTier"]));
    assert_eq!(
        body["finding"]["causalChain"][0]["relationshipCertainty"],
        "exact"
    );
    // The idempotency key returns the same finding, not a second one.
    let (status, again) = post_json(&h, "/internal/findings", &f).await;
    assert_eq!(status, StatusCode::OK, "{again}");
    assert_eq!(again["finding"]["id"], body["finding"]["id"]);
    let fp = body["finding"]["fingerprint"].as_str().unwrap();
    let (_, similar) = h.get(&format!("/internal/findings?fingerprint={fp}")).await;
    assert_eq!(similar["items"].as_array().unwrap().len(), 1);
    h.finish().await;
}

// ---- counterfactual pairing ----

async fn eval_run(
    h: &Harness,
    case: &str,
    payload: &str,
    passed: bool,
    version: &str,
    fp: Option<&str>,
) -> String {
    // The broken state (deploy()): 2.4.1 / 8f3a1b2c / agent-7.
    let commit = if version == "2.4.1" {
        "8f3a1b2c"
    } else {
        "9c4d5e6f"
    };
    let mut r = json!({"evalCaseId": case, "inputPayloadHash": payload, "passed": passed,
                       "serviceVersion": version, "commitSha": commit,
                       "candidateAgentVersion": "agent-7"});
    if let Some(fp) = fp {
        r["failureFingerprint"] = json!(fp);
    }
    let (status, body) = post_json(h, "/internal/evals/runs", &r).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    body["id"].as_str().unwrap().to_string()
}

async fn counterfactual(db: Db) {
    let Some((h, _at, change)) = start_deployed(db).await else {
        return;
    };
    let (status, body) = post_json(
        &h,
        "/internal/findings",
        &finding("base", Some(&change), chain("degraded_after_change")),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let fid = body["finding"]["id"].as_str().unwrap().to_string();
    let fp = body["finding"]["fingerprint"].as_str().unwrap().to_string();
    let pass = eval_run(&h, "case-7", "sha256:aa", true, "2.4.2", None).await;
    let pass2 = eval_run(&h, "case-7", "sha256:aa", true, "2.4.2", None).await;
    let other_payload = eval_run(&h, "case-7", "sha256:bb", true, "2.4.2", None).await;
    let fail = eval_run(&h, "case-7", "sha256:aa", false, "2.4.1", Some(&fp)).await;
    let (status, run) = h.get(&format!("/internal/evals/runs/{fail}")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(run["passed"], false);
    assert_eq!(run["failureFingerprint"], fp.as_str());
    let cf = |failing: &str, passing: &[&str], k: usize| json!({"failingRunId": failing, "passingRunIds": passing, "requiredTrials": k});
    let path = format!("/internal/findings/{fid}/counterfactual");
    // A passing candidate without a failing baseline.
    let (status, body) = post_json(&h, &path, &cf(&pass2, &[&pass], 1)).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(code(&body), "baseline_passed");
    // A mismatched payload hash.
    let (status, body) = post_json(&h, &path, &cf(&fail, &[&other_payload], 1)).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(code(&body), "payload_mismatch");
    // K = 2 with one passing run.
    let (status, body) = post_json(&h, &path, &cf(&fail, &[&pass], 2)).await;
    assert_eq!(code(&body), "too_few_passes", "{status} {body}");
    // A missing run: refused, naming it, before anything changes.
    let (status, body) =
        post_json(&h, &path, &cf(&fail, &[&pass, "evr_0000000000000000"], 1)).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(body["error"]["field"], "passingRunIds[1]", "{body}");
    let (_, f) = h.get(&format!("/internal/findings/{fid}")).await;
    assert_eq!(f["causalProofTier"], "unverified_locus", "{f}");
    // The proper pair.
    let (status, body) = post_json(&h, &path, &cf(&fail, &[&pass, &pass2], 2)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        body["finding"]["causalProofTier"],
        "counterfactual_verified"
    );
    let (_, f) = h.get(&format!("/internal/findings/{fid}")).await;
    assert_eq!(f["causalProofTier"], "counterfactual_verified");
    assert_eq!(f["counterfactual"]["verified"], true);

    // Inline on POST /internal/findings: a bad pairing still stores the
    // finding and says why; a missing run stores nothing.
    let mut inline = finding("inline", Some(&change), chain("verified_by_counterfactual"));
    inline["counterfactual"] = cf(&fail, &[&other_payload], 1);
    let (status, body) = post_json(&h, "/internal/findings", &inline).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(body["counterfactualError"]["code"], "payload_mismatch");
    assert_eq!(body["finding"]["causalProofTier"], "unverified_locus");
    // The seed's shape: `data.finding` + `data.counterfactualError` (the
    // top-level members above are their aliases).
    assert_eq!(
        body["data"]["counterfactualError"]["code"],
        "payload_mismatch"
    );
    assert_eq!(body["data"]["finding"], body["finding"], "{body}");
    let mut missing = finding(
        "missing-run",
        Some(&change),
        chain("verified_by_counterfactual"),
    );
    missing["counterfactual"] = cf("evr_ffffffffffffffff", &[&pass], 1);
    let (status, body) = post_json(&h, "/internal/findings", &missing).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(body["error"]["field"], "counterfactual.failingRunId");
    let (_, similar) = h.get(&format!("/internal/findings?fingerprint={fp}")).await;
    assert_eq!(similar["items"].as_array().unwrap().len(), 2, "{similar}");
    h.finish().await;
}

// Regression (issue 28): a baseline was held to the broken serviceVersion
// and commitSha only when both it and the contributing change gave them, and
// never to candidateAgentVersion, so any key could mint
// counterfactual_verified with a failing run carrying the (public)
// fingerprint. Each of the three is now required on both sides, exactly.
async fn counterfactual_baseline_must_match_the_broken_state_exactly(db: Db) {
    let Some((h, _at, change)) = start_deployed(db).await else {
        return;
    };
    let (status, body) = post_json(
        &h,
        "/internal/findings",
        &finding("strict", Some(&change), chain("degraded_after_change")),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let fid = body["finding"]["id"].as_str().unwrap().to_string();
    let fp = body["finding"]["fingerprint"].as_str().unwrap().to_string();
    let pass = eval_run(&h, "case-9", "sha256:cc", true, "2.4.2", None).await;
    let path = format!("/internal/findings/{fid}/counterfactual");
    let broken = json!({"evalCaseId": "case-9", "inputPayloadHash": "sha256:cc", "passed": false,
                        "serviceVersion": "2.4.1", "commitSha": "8f3a1b2c",
                        "candidateAgentVersion": "agent-7", "failureFingerprint": fp});
    for (field, value) in [
        ("candidateAgentVersion", Value::Null),
        ("candidateAgentVersion", json!("agent-6")),
        ("serviceVersion", Value::Null),
        ("serviceVersion", json!("2.4.0")),
        ("commitSha", Value::Null),
        ("commitSha", json!("7d2e0a1b")),
    ] {
        let mut run = broken.clone();
        if value.is_null() {
            run.as_object_mut().unwrap().remove(field);
        } else {
            run[field] = value.clone();
        }
        let (status, made) = post_json(&h, "/internal/evals/runs", &run).await;
        assert_eq!(status, StatusCode::CREATED, "{made}");
        let baseline = made["id"].as_str().unwrap();
        let (status, body) = post_json(
            &h,
            &path,
            &json!({"failingRunId": baseline, "passingRunIds": [pass], "requiredTrials": 1}),
        )
        .await;
        assert_eq!(
            status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{field}={value}: {body}"
        );
        assert_eq!(code(&body), "not_broken_state", "{field}={value}: {body}");
        assert!(
            body["error"]["message"].as_str().unwrap().contains(field),
            "{body}"
        );
    }
    let (_, f) = h.get(&format!("/internal/findings/{fid}")).await;
    assert_eq!(f["causalProofTier"], "unverified_locus", "{f}");
    // A finding whose broken state is unknown (no contributing change) has
    // nothing to hold a baseline to: never counterfactual_verified.
    let (status, body) = post_json(
        &h,
        "/internal/findings",
        &finding("no-change", None, chain("verified_by_counterfactual")),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let lone = body["finding"]["id"].as_str().unwrap().to_string();
    let (_, made) = post_json(&h, "/internal/evals/runs", &broken).await;
    let (status, body) = post_json(
        &h,
        &format!("/internal/findings/{lone}/counterfactual"),
        &json!({"failingRunId": made["id"], "passingRunIds": [pass], "requiredTrials": 1}),
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(code(&body), "broken_state_unknown", "{body}");
    // The exact baseline verifies.
    let (_, made) = post_json(&h, "/internal/evals/runs", &broken).await;
    let (status, body) = post_json(
        &h,
        &path,
        &json!({"failingRunId": made["id"], "passingRunIds": [pass], "requiredTrials": 1}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        body["finding"]["causalProofTier"],
        "counterfactual_verified"
    );
    h.finish().await;
}

// ---- thresholds and minSample over HTTP ----

async fn thresholds_and_min_sample(db: Db) {
    let Some(h) = Harness::start(db).await else {
        return;
    };
    // Absolute difference just below / at the 5 % threshold (RR far above 5).
    for (i, (errors, want)) in [
        (49, "no_regression_detected"),
        (50, "isolated_to_new_version"),
    ]
    .into_iter()
    .enumerate()
    {
        let at = anchor(2 + 2 * i as i64);
        let svc = ["svc-below", "svc-at"][i];
        let change = deploy(&h, at, json!({"service": svc})).await;
        let mut new = Traffic::new("2.4.1", 1000, errors, at + MIN_NS);
        new.service = svc;
        let mut old = Traffic::new("2.4.0", 1000, 0, at + MIN_NS);
        old.service = svc;
        send(&h, &new, 20 + i as u64, Wire::Protobuf).await;
        send(&h, &old, 30 + i as u64, Wire::Protobuf).await;
        assert_eq!(
            blast(&h, &change, "").await["verdict"],
            want,
            "{errors} errors"
        );
    }
    // minSample edges: a 50-request new cohort.
    let at = anchor(1);
    let change = deploy(&h, at, json!({})).await;
    let new = Traffic::new("2.4.1", 50, 50, at + MIN_NS);
    let old = Traffic::new("2.4.0", 500, 0, at + MIN_NS);
    send_all(
        &h,
        &[(&new, 40, Wire::Protobuf), (&old, 41, Wire::Protobuf)],
    )
    .await;
    assert_eq!(
        blast(&h, &change, "&minSample=50").await["verdict"],
        "isolated_to_new_version"
    );
    assert_eq!(
        blast(&h, &change, "&minSample=51").await["verdict"],
        "insufficient_sample"
    );
    assert_eq!(blast(&h, &change, "").await["minSample"], 50);
    // Zero traffic: insufficient, and every number is finite JSON.
    let empty = deploy(&h, at, json!({"service": "no-traffic"})).await;
    let b = blast(&h, &empty, "").await;
    assert_eq!(b["verdict"], "insufficient_sample");
    assert_eq!(b["cohorts"]["new"]["errorRate"], 0.0);
    assert_eq!(b["relativeRisk"], Value::Null);
    // p95 alone: same error rate, 3x latency.
    let at = anchor(8);
    let slow_change = deploy(&h, at, json!({"service": "svc-slow"})).await;
    let mut slow = Traffic::new("2.4.1", 500, 0, at + MIN_NS);
    slow.service = "svc-slow";
    slow.latency_ms = 60;
    let mut fast = slow.clone();
    fast.version = "2.4.0";
    fast.latency_ms = 20;
    send_all(
        &h,
        &[(&slow, 50, Wire::Protobuf), (&fast, 51, Wire::Protobuf)],
    )
    .await;
    let b = blast(&h, &slow_change, "").await;
    assert_eq!(b["verdict"], "isolated_to_new_version", "{b:#}");
    assert!(b["p95Ratio"].as_f64().unwrap() > 2.5, "{b}");
    let (status, body) = h
        .get(&format!(
            "/internal/changes/{change}/blast-radius?minSample=0"
        ))
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(body["error"]["field"], "minSample");
    let (status, _) = h
        .get("/internal/changes/chg_0000000000000000/blast-radius")
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    h.finish().await;
}

// ---- fleet: a kernel change on 3 of 10 nodes ----

/// A sealed capture from `node` at `wall_ns`, with a reset claim or not.
fn node_envelope(node: &str, seq: u64, wall_ns: i64, reset: bool) -> (String, Vec<u8>) {
    let mut c = Capture::new(node, 4242, seq);
    c.threads = 1;
    c.blocked = false;
    let mut env = c.unsealed();
    env.clock.wall_time = rfc(wall_ns);
    if reset {
        env.claims.push(Claim {
            id: "c2".into(),
            kind: ClaimKind::Fact,
            code: "rst_received_from_peer".into(),
            statement: "RST received from 10.0.0.9:9502 on a replica stream".into(),
            surfaces: vec![env.surfaces[0].id.clone()],
            scope: Scope::Existential,
            falsifier: None,
        });
    }
    let env = env.seal().expect("valid envelope");
    let bytes = serde_json::to_vec(&env).expect("json");
    (env.digest, bytes)
}

/// Ship 48 hourly envelopes per node around `t0`: unchanged nodes reset once
/// a day; changed nodes too before `t0`, and every `changed_every` hours after.
async fn ship_fleet(
    h: &Harness,
    t0: i64,
    changed: &[&str],
    changed_every: i64,
) -> BTreeSet<String> {
    let mut cited = BTreeSet::new();
    let mut batch = Vec::new();
    for n in 1..=10 {
        let node = format!("node-{n:02}");
        let is_changed = changed.contains(&node.as_str());
        for hour in -24..24i64 {
            let wall = t0 + hour * HOUR_NS + 30 * MIN_NS;
            let every = if is_changed && hour >= 0 {
                changed_every
            } else {
                24
            };
            let reset = (hour + 24 + n) % every == 0;
            let (digest, bytes) = node_envelope(&node, (hour + 100) as u64, wall, reset);
            if reset && is_changed && hour >= 0 {
                cited.insert(digest);
            }
            batch.push(bytes);
        }
    }
    for chunk in batch.chunks(200) {
        let (_, r) = h.post_batch(chunk).await;
        assert_eq!(
            r.rejected,
            0,
            "{:?}",
            r.results.iter().find(|x| x.status == "rejected")
        );
    }
    cited
}

async fn fleet_kernel_change(db: Db) {
    let Some(h) = Harness::start(db).await else {
        return;
    };
    let changed = ["node-01", "node-02", "node-03"];
    for (i, (every, want)) in [
        (3, "isolated_to_new_version"),
        (24, "no_regression_detected"),
    ]
    .into_iter()
    .enumerate()
    {
        // Separate days so the two fleets do not mix.
        let t0 = anchor(24 * 7 * (i as i64 + 1));
        let cited = ship_fleet(&h, t0, &changed, every).await;
        let nodes: Vec<Value> = changed
            .iter()
            .map(|n| json!({"node": n, "at": rfc(t0)}))
            .collect();
        let (status, body) = post_json(
            &h,
            "/v1/changes",
            &json!({"environment": "prod", "kind": "kernel", "version": "6.8.0-45", "previousVersion": "6.8.0-40",
                    "summary": "kernel upgrade", "at": rfc(t0), "nodes": nodes}),
        )
        .await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        let id = body["id"].as_str().unwrap();
        let (status, b) = h
            .get(&format!("/internal/changes/{id}/blast-radius?window=24h"))
            .await;
        assert_eq!(status, StatusCode::OK, "{b}");
        assert_eq!(b["verdict"], want, "{b:#}");
        assert_eq!(b["unit"], "node_hours");
        assert_eq!(b["cohorts"]["new"]["nodes"], json!(changed));
        assert_eq!(b["cohorts"]["new"]["nodeHours"], 72.0);
        assert_eq!(
            b["cohorts"]["previous"]["nodes"].as_array().unwrap().len(),
            7
        );
        assert_eq!(b["cohorts"]["previous"]["nodeHours"], 168.0);
        let digests: BTreeSet<String> = b["cohorts"]["new"]["evidenceDigests"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d.as_str().unwrap().to_string())
            .collect();
        assert_eq!(
            digests, cited,
            "the new cohort cites exactly its reset envelopes"
        );
        if i == 0 {
            assert!(
                (b["relativeRisk"].as_f64().unwrap() - 8.0).abs() < 1e-9,
                "{b}"
            );
            // Cross-node claim query over the same day.
            let since = rfc(t0);
            let (status, c) = h
                .get(&format!(
                    "/v1/claims?code=rst_received_from_peer&since={since}"
                ))
                .await;
            assert_eq!(status, StatusCode::OK, "{c}");
            let nodes = c["nodes"].as_array().unwrap();
            let n1 = nodes
                .iter()
                .find(|n| n["node"] == "node-01")
                .expect("node-01");
            assert_eq!(n1["envelopes"], 8, "{c}");
            assert_eq!(nodes.len(), 10, "{c}");
            // A finding citing one of those digests is stored; one citing an unknown digest is not.
            let d = cited.iter().next().unwrap();
            let mut f = finding("fleet", Some(id), chain("degraded_after_change"));
            f["citedEvidenceIds"] = json!([d]);
            let (status, body) = post_json(&h, "/internal/findings", &f).await;
            assert_eq!(status, StatusCode::CREATED, "{body}");
            assert_eq!(body["finding"]["causalProofTier"], "cohort_rate_isolated");
            // Retention keeps what a finding cites, and drops the rest.
            let report = h
                .store
                .apply_retention(
                    &pstack_store_core::db::RetentionPolicy {
                        max_age: Some(Duration::ZERO),
                        max_bytes: None,
                    },
                    pstack_store_core::now_ns() + 1,
                )
                .await
                .expect("retention");
            assert_eq!(report.deleted, 479, "{report:?}");
            let (status, _) = h.get(&format!("/v1/envelopes/{d}")).await;
            assert_eq!(
                status,
                StatusCode::OK,
                "the cited envelope survives retention"
            );
        }
    }
    h.finish().await;
}

// ---- bad input ----

async fn bad_input_stores_nothing(db: Db) {
    let Some(h) = Harness::start(db).await else {
        return;
    };
    let (status, body) =
        post_traces(&h, vec![0x0a, 0xff, 0x01], "application/x-protobuf", false).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let body: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(code(&body), "malformed_otlp_protobuf");
    let (status, body) = post_traces(
        &h,
        br#"{"resourceSpans": [{"scopeSpans": 7}]}"#.to_vec(),
        "application/json",
        false,
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(
        code(&serde_json::from_slice(&body).unwrap()),
        "malformed_otlp_json"
    );
    let (status, _) = post_traces(&h, b"x".to_vec(), "text/plain", false).await;
    assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    let (status, _) = post_traces(&h, vec![1, 2, 3], "application/x-protobuf", true).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "bad gzip");
    let t = h
        .store
        .request_totals(
            "prod",
            "checkout-api",
            pstack_store_core::db::analysis::VersionFilter::Any,
            0,
            i64::MAX,
        )
        .await
        .unwrap();
    assert_eq!(t.requests, 0);
    // Unauthenticated.
    let resp = h
        .client
        .post(h.url("/v1/traces"))
        .body(vec![])
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);

    let (status, body) = post_json(
        &h,
        "/v1/changes",
        &json!({"environment": "prod", "kind": "deploy", "version": "1"}),
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(body["error"]["field"], "service", "{body}");
    let (status, body) = post_json(
        &h,
        "/v1/changes",
        &json!({"environment": "prod", "kind": "kernel"}),
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(body["error"]["field"], "nodes", "{body}");
    let (status, body) = post_json(
        &h,
        "/v1/changes",
        &json!({"environment": "prod", "kind": "deploy", "service": "a", "colour": "red"}),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let (status, body) = post_json(
        &h,
        "/v1/changes",
        &json!({"environment": "prod", "kind": "deploy", "service": "a", "touchedPaths": "a,b"}),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(body["error"]["field"], "touchedPaths", "{body}");
    let (_, list) = h.get("/v1/changes").await;
    assert_eq!(list["items"], json!([]), "nothing stored");

    let unknown = format!("sha256:{}", "ab".repeat(32));
    let mut f = finding("bad", None, chain("degraded_after_change"));
    f["citedEvidenceIds"] = json!(["span:1234", unknown]);
    let (status, body) = post_json(&h, "/internal/findings", &f).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(body["error"]["field"], "citedEvidenceIds[1]");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains(&unknown)
    );
    let mut f = finding("bad2", None, chain("caused_by_vibes"));
    f["citedEvidenceIds"] = json!([]);
    let (status, body) = post_json(&h, "/internal/findings", &f).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(body["error"]["field"], "causalChain[0].relation");
    let f = finding(
        "bad3",
        Some("chg_0000000000000000"),
        chain("degraded_after_change"),
    );
    let (status, body) = post_json(&h, "/internal/findings", &f).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(body["error"]["field"], "contributingChangeId");
    for key in ["bad", "bad2", "bad3"] {
        assert!(
            h.store.finding_by_key(key).await.unwrap().is_none(),
            "{key} stored"
        );
    }
    h.finish().await;
}

// ---- OTLP JSON as the specification writes it ----

/// The OTLP/JSON example of the opentelemetry-proto repository
/// (examples/trace.json, abridged): uppercase hex ids, string int64s,
/// integer enums. Written by others, so it checks the decoder, not our
/// own encoder's agreement with itself.
async fn otlp_json_spec_example(db: Db) {
    let Some(h) = Harness::start(db).await else {
        return;
    };
    let start = anchor(1);
    let body = format!(
        r#"{{"resourceSpans":[{{"resource":{{"attributes":[{{"key":"service.name","value":{{"stringValue":"my.service"}}}},
        {{"key":"deployment.environment","value":{{"stringValue":"prod"}}}}]}},
        "scopeSpans":[{{"scope":{{"name":"my.library","version":"1.0.0","attributes":[{{"key":"my.scope.attribute","value":{{"stringValue":"some scope attribute"}}}}]}},
        "spans":[{{"traceId":"5B8EFFF798038103D269B633813FC60C","spanId":"EEE19B7EC3C1B174","parentSpanId":"EEE19B7EC3C1B173",
        "name":"I'm a server span","startTimeUnixNano":"{start}","endTimeUnixNano":"{end}","kind":2,
        "attributes":[{{"key":"my.span.attr","value":{{"stringValue":"some value"}}}},{{"key":"http.response.status_code","value":{{"intValue":"503"}}}}]}}]}}]}}]}}"#,
        end = start + 1_000_000_000
    );
    let (status, resp) = post_traces(
        &h,
        body.into_bytes(),
        "application/json; charset=utf-8",
        false,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&resp));
    let t = h
        .store
        .request_totals(
            "prod",
            "my.service",
            pstack_store_core::db::analysis::VersionFilter::Is("unknown"),
            0,
            i64::MAX,
        )
        .await
        .unwrap();
    assert_eq!((t.requests, t.errors), (1, 1));
    let failed = h
        .store
        .failed_request("eee19b7ec3c1b174")
        .await
        .unwrap()
        .expect("sampled failure");
    assert_eq!(failed.error_signature, "http_503");
    // The fingerprint resolves from the span id when fingerprintInput is omitted.
    let mut f = finding("by-span", None, chain("originated_fault_in_span"));
    f.as_object_mut().unwrap().remove("fingerprintInput");
    f["faultLocusEntityId"] = json!("EEE19B7EC3C1B174");
    let (status, body) = post_json(&h, "/internal/findings", &f).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(
        body["finding"]["fingerprintInput"]["originatingNodeId"],
        "my.service"
    );
    assert_eq!(
        body["finding"]["fingerprintInput"]["errorSignature"],
        "http_503"
    );
    h.finish().await;
}

on_both_backends!(
    traffic_share_fallacy,
    real_regression,
    instant_cutover,
    noisy_neighbour,
    code_path_overlap_is_capped,
    counterfactual,
    counterfactual_baseline_must_match_the_broken_state_exactly,
    thresholds_and_min_sample,
    fleet_kernel_change,
    bad_input_stores_nothing,
    otlp_json_spec_example,
);

// ---- the OpenAPI document against the router ----

/// Every `.route("PATH", get(..).post(..))` in the store's sources.
fn source_routes() -> BTreeSet<(String, String)> {
    let mut dirs = vec![std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src")];
    let mut files = Vec::new();
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }
    let mut out = BTreeSet::new();
    for path in files {
        let text = std::fs::read_to_string(&path).unwrap();
        for (i, _) in text.match_indices(".route(") {
            let rest = text[i + 7..].trim_start();
            let Some(rest) = rest.strip_prefix('"') else {
                continue;
            };
            let end = rest.find('"').unwrap();
            let route = rest[..end].to_string();
            // The call's arguments, up to the matching parenthesis.
            let mut depth = 1;
            let mut call_end = rest.len();
            for (j, ch) in rest[end..].char_indices() {
                match ch {
                    '(' => depth += 1,
                    ')' => {
                        depth -= 1;
                        if depth == 0 {
                            call_end = end + j;
                            break;
                        }
                    }
                    _ => {}
                }
            }
            let call = &rest[end..call_end];
            for m in ["get", "post", "put", "patch", "delete"] {
                if call.contains(&format!("{m}(")) {
                    out.insert((m.to_string(), route.clone()));
                }
            }
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openapi_lists_every_route_and_only_those() {
    let Some(h) = Harness::start(Db::Sqlite).await else {
        return;
    };
    let resp = h.client.get(h.url("/openapi.json")).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let doc: Value = resp.json().await.unwrap();
    assert_eq!(doc["openapi"], "3.1.0");
    let mut documented = BTreeSet::new();
    for (path, ops) in doc["paths"].as_object().unwrap() {
        for m in ops.as_object().unwrap().keys() {
            documented.insert((m.clone(), path.clone()));
        }
    }
    let routed = source_routes();
    assert!(routed.len() >= 20, "{routed:?}");
    assert_eq!(documented, routed, "openapi.json and the router disagree");
    // And each documented route is really served: no 404/405 from routing.
    for (method, path) in &documented {
        let concrete = path
            .replace("{digest}", &format!("sha256:{}", "0".repeat(64)))
            .replace("{id}", "x");
        let req = match method.as_str() {
            "get" => h.client.get(h.url(&concrete)),
            _ => h.client.post(h.url(&concrete)),
        };
        let resp = req
            .bearer_auth(&h.key)
            .timeout(Duration::from_secs(10))
            .send()
            .await
            .unwrap();
        let status = resp.status();
        let body: Value = resp.json().await.unwrap_or(Value::Null);
        assert_ne!(status, StatusCode::METHOD_NOT_ALLOWED, "{method} {path}");
        if status == StatusCode::NOT_FOUND {
            // A handler's own 404 says what is missing; routing's does not.
            let c = code(&body);
            assert!(
                c != "not_found" && c.ends_with("_not_found"),
                "{method} {path} unrouted: {body}"
            );
        }
    }
    h.finish().await;
}

// ---- CLI: changes record ----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_changes_record_posts_a_change() {
    let Some(h) = Harness::start(Db::Sqlite).await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_pstack-store"))
        .current_dir(dir.path())
        .env("PSTACK_STORE_API_KEY", &h.key)
        .args([
            "changes",
            "record",
            "--url",
            &h.base,
            "--environment",
            "prod",
            "--kind",
            "deploy",
            "--service",
            "checkout-api",
            "--version",
            "2.4.1",
            "--previous-version",
            "2.4.0",
            "--commit-sha",
            "8f3a1b2c",
            "--previous-commit-sha",
            "7d2e0a1b",
            "--summary",
            "Switch tax rounding to strict decimal mode",
            "--touched-paths",
            "src/checkout/charge.ts,src/checkout/tax.ts",
        ])
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let id = String::from_utf8(out.stdout).unwrap().trim().to_string();
    assert!(id.starts_with("chg_"), "{id}");
    let (status, c) = h.get(&format!("/v1/changes/{id}")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        c["touchedPaths"],
        json!(["src/checkout/charge.ts", "src/checkout/tax.ts"])
    );
    assert_eq!(c["previousCommitSha"], "7d2e0a1b");
    let (_, list) = h
        .get("/v1/changes?environment=prod&service=checkout-api")
        .await;
    assert_eq!(list["items"][0]["id"], id.as_str());
    // The seed's name `serviceName`; `service` above is its alias; both at
    // once is refused, named.
    let (_, list) = h
        .get("/v1/changes?environment=prod&serviceName=checkout-api")
        .await;
    assert_eq!(list["items"][0]["id"], id.as_str(), "{list}");
    let (_, none) = h.get("/v1/changes?serviceName=other-api").await;
    assert_eq!(none["items"], json!([]), "{none}");
    let (status, e) = h
        .get("/v1/changes?serviceName=checkout-api&service=checkout-api")
        .await;
    assert_eq!(
        (status, e["error"]["field"].as_str()),
        (StatusCode::BAD_REQUEST, Some("service"))
    );
    // A refusal names the field and exits non-zero; no database file appears.
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_pstack-store"))
        .current_dir(dir.path())
        .env("PSTACK_STORE_API_KEY", &h.key)
        .args([
            "changes",
            "record",
            "--url",
            &h.base,
            "--environment",
            "prod",
            "--kind",
            "deploy",
        ])
        .output()
        .await
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("field service"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "the client opened no database"
    );
    h.finish().await;
}
