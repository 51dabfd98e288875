//! The post-remediation watchdog with the injected clock: checkpoints at
//! +2/+5/+15 min judged on real OTLP traffic, and host-subject receipts
//! judged on post-mutation envelopes.

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use opentelemetry_proto::tonic::trace::v1::status::StatusCode as OtelStatus;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span, Status};
use prost::Message;
use pstack_store_core::synthetic::Capture;
use reqwest::StatusCode;
use serde_json::{Value, json};

use super::{MIN, deploy, finding, open_incident, post, proposal};
use crate::on_both_backends;
use crate::support::{Db, Harness};

const MIN_NS: i64 = 60_000_000_000;

fn kv(k: &str, v: &str) -> KeyValue {
    KeyValue {
        key: k.into(),
        value: Some(AnyValue {
            value: Some(any_value::Value::StringValue(v.into())),
        }),
        ..Default::default()
    }
}

/// `requests` server spans of checkout-api in prod (the first `errors`
/// failed), starting at the first minute boundary at or after `from_ns`.
async fn traffic(h: &Harness, from_ns: i64, requests: u64, errors: u64, seed: u64) {
    let start = (from_ns + MIN_NS - 1).div_euclid(MIN_NS) * MIN_NS;
    let spans: Vec<Span> = (0..requests)
        .map(|i| {
            let failed = i < errors;
            let t = u64::try_from(start).unwrap() + i * 1_000_000;
            let mut id = [0u8; 16];
            id[..8].copy_from_slice(&seed.to_be_bytes());
            id[8..].copy_from_slice(&(i + 1).to_be_bytes());
            Span {
                trace_id: id.to_vec(),
                span_id: id[8..].to_vec(),
                name: "POST /checkout".into(),
                kind: SpanKind::Server as i32,
                start_time_unix_nano: t,
                end_time_unix_nano: t + 20_000_000,
                status: Some(Status {
                    code: if failed {
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
    let req = ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(Resource {
                attributes: vec![
                    kv("service.name", "checkout-api"),
                    kv("service.version", "2.4.0"),
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
    };
    let resp = h
        .client
        .post(h.url("/v1/traces"))
        .bearer_auth(&h.key)
        .header("content-type", "application/x-protobuf")
        .body(req.encode_to_vec())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
}

/// A completed autonomous rollback: (proposal id, completion time).
async fn completed(h: &Harness, key: &str) -> (String, i64) {
    let inc = open_incident(h, key).await;
    let f = finding(h, &inc, "counterfactual_verified", &format!("fp_{key}")).await;
    let (_, b) = post(
        h,
        "/internal/remediations/propose",
        &proposal(&inc, &f, "rollback_deploy", key),
    )
    .await;
    let id = b["proposal"]["id"].as_str().unwrap().to_string();
    let token = b["grantToken"].as_str().unwrap();
    let path = format!("/internal/remediations/{id}/grant");
    let op = |o: &str| json!({"operation": o, "grantToken": token, "runnerId": "runner-1"});
    assert_eq!(post(h, &path, &op("claim")).await.0, StatusCode::OK);
    let done_at = h.clock.now_ns();
    let (st, d) = post(h, &path, &op("complete")).await;
    assert_eq!(st, StatusCode::OK, "{d}");
    (id, done_at)
}

async fn tick(h: &Harness) -> Value {
    let (st, t) = post(h, "/internal/remediations/watchdog", &json!({})).await;
    assert_eq!(st, StatusCode::OK);
    t
}

async fn statuses(h: &Harness, id: &str) -> (Value, Value, Value) {
    let (_, g) = h.get(&format!("/internal/remediations/{id}")).await;
    let p = &g["proposal"];
    (
        p["recoveryStatus"].clone(),
        p["causalVerificationStatus"].clone(),
        p["checkpoints"].clone(),
    )
}

async fn watchdog_two_consecutive_healthy_checkpoints_recover(db: Db) {
    let Some(h) = Harness::start(db).await else {
        return;
    };
    deploy(&h, "2.4.1", "8f3a1b2").await;
    let (id, t0) = completed(&h, "heal").await;
    traffic(&h, t0, 120, 1, 1).await; // +0..2 m: healthy
    traffic(&h, t0 + 2 * MIN_NS, 120, 3, 2).await; // +2..5 m: healthy
    // Nothing is due yet.
    assert_eq!(tick(&h).await["checkpointsEvaluated"], 0);
    h.clock.advance(2 * MIN + std::time::Duration::from_secs(1));
    assert_eq!(tick(&h).await["checkpointsEvaluated"], 1);
    let (r, c, cps) = statuses(&h, &id).await;
    assert_eq!(
        (r.as_str(), c.as_str()),
        (Some("monitoring"), Some("pending"))
    );
    assert_eq!(cps[0]["verdict"], "healthy", "{cps}");
    assert_eq!(cps[0]["requests"], 120);
    h.clock.advance(3 * MIN);
    assert_eq!(tick(&h).await["checkpointsEvaluated"], 1);
    let (r, c, _) = statuses(&h, &id).await;
    assert_eq!(r, "recovered");
    assert_eq!(c, "operationally_corroborated");
    // Recovered: the +15 m checkpoint is not needed, and nothing ever
    // claims counterfactual proof.
    h.clock.advance(11 * MIN);
    assert_eq!(tick(&h).await["checkpointsEvaluated"], 0);
    let (_, c, _) = statuses(&h, &id).await;
    assert_ne!(c, "counterfactual_verified");
    h.finish().await;
}

async fn watchdog_healthy_degraded_healthy_is_not_recovery(db: Db) {
    let Some(h) = Harness::start(db).await else {
        return;
    };
    deploy(&h, "2.4.1", "8f3a1b2").await;
    let (id, t0) = completed(&h, "flap").await;
    // Each minute's spans are sent when it comes (spans more than the
    // skew ahead of the store's clock are refused).
    traffic(&h, t0, 100, 0, 1).await; // healthy
    h.clock.advance(2 * MIN);
    traffic(&h, t0 + 2 * MIN_NS, 100, 20, 2).await; // degraded
    h.clock.advance(3 * MIN);
    traffic(&h, t0 + 5 * MIN_NS, 100, 1, 3).await; // healthy
    h.clock
        .advance(10 * MIN + std::time::Duration::from_secs(1));
    assert_eq!(tick(&h).await["checkpointsEvaluated"], 3);
    let (r, c, cps) = statuses(&h, &id).await;
    let verdicts: Vec<&str> = cps
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["verdict"].as_str().unwrap())
        .collect();
    assert_eq!(verdicts, ["healthy", "degraded", "healthy"]);
    assert_eq!(r, "still_degraded");
    assert_ne!(c, "operationally_corroborated");
    assert_ne!(c, "counterfactual_verified");
    h.finish().await;
}

async fn watchdog_low_traffic_is_inconclusive(db: Db) {
    let Some(h) = Harness::start(db).await else {
        return;
    };
    deploy(&h, "2.4.1", "8f3a1b2").await;
    let (id, t0) = completed(&h, "quiet").await;
    traffic(&h, t0, 49, 0, 1).await; // one short of N ≥ 50
    traffic(&h, t0 + 2 * MIN_NS, 20, 0, 2).await;
    h.clock.advance(16 * MIN);
    tick(&h).await;
    let (r, c, cps) = statuses(&h, &id).await;
    assert_eq!(cps[0]["verdict"], "low_traffic", "{cps}");
    assert_eq!(r, "inconclusive_low_traffic");
    assert_eq!(c, "inconclusive_low_traffic");
    h.finish().await;
}

/// A sealed, complete capture of process 4242 on node-a at `wall_ns`
/// showing (`fault`) or not showing a thread in D.
fn capture(wall_ns: i64, fault: bool) -> (String, Vec<u8>) {
    let seq = u64::try_from(wall_ns / 1_000_000_000 - 1_796_000_000).unwrap();
    let mut c = Capture::new("node-a", 4242, seq);
    c.blocked = fault;
    let mut env = c.unsealed();
    if fault {
        // The stack surface read fine this time: a complete envelope that
        // still shows the thread in D.
        env.surfaces
            .retain(|s| s.status == pstack_envelope::SurfaceStatus::Ok);
        env.unknowns.clear();
        env.completeness = pstack_envelope::Completeness::Complete;
    }
    let env = env.seal().expect("seals");
    (env.digest.clone(), serde_json::to_vec(&env).unwrap())
}

async fn watchdog_receipts_for_a_host_subject(db: Db) {
    let Some(h) = Harness::start(db).await else {
        return;
    };
    let now = h.clock.now_ns();
    let (pre, pre_b) = capture(now - 60_000_000_000, true);
    h.post_batch(&[pre_b]).await;
    let subject = h.store.envelope_meta(&pre).await.unwrap().unwrap().0;
    let inc = open_incident(&h, "host-rx").await;
    let f = finding(&h, &inc, "counterfactual_verified", "fp_host_rx").await;
    let (st, b) = post(
        &h,
        "/internal/remediations/propose",
        &json!({"incidentId": inc, "findingId": f, "action": "apply_config",
                "target": {"subject": subject}, "expectedCurrentState": {"envelopeDigest": pre},
                "preMutationEnvelope": pre, "idempotencyKey": "host-rx"}),
    )
    .await;
    assert_eq!(st, StatusCode::CREATED, "{b}");
    let id = b["proposal"]["id"].as_str().unwrap().to_string();
    let token = b["grantToken"].as_str().unwrap();
    let path = format!("/internal/remediations/{id}/grant");
    let op = |o: &str| json!({"operation": o, "grantToken": token, "runnerId": "runner-1"});
    assert_eq!(post(&h, &path, &op("claim")).await.0, StatusCode::OK);
    let (st, _) = post(&h, &path, &op("complete")).await;
    assert_eq!(st, StatusCode::OK);
    let done = h.clock.now_ns();
    // No post-mutation capture yet: no receipt.
    tick(&h).await;
    let (_, g) = h.get(&format!("/internal/remediations/{id}")).await;
    assert_eq!(g["proposal"]["receipts"], json!([]));
    // A capture after the mutation that still shows the fault.
    let (standing, standing_b) = capture(done + 30_000_000_000, true);
    h.post_batch(&[standing_b]).await;
    tick(&h).await;
    let (_, g) = h.get(&format!("/internal/remediations/{id}")).await;
    let kinds: Vec<(String, String)> = g["proposal"]["receipts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["kind"].as_str().unwrap().to_string(),
                r["evidence"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert!(
        kinds.contains(&("REALIZED".into(), standing.clone())),
        "{kinds:?}"
    );
    assert!(
        kinds.contains(&("FAULT_STANDING".into(), standing.clone())),
        "{kinds:?}"
    );
    assert!(!kinds.iter().any(|k| k.0 == "VERIFIED"));
    // A later capture with the fault gone: VERIFIED, citing it.
    let (clear, clear_b) = capture(done + 90_000_000_000, false);
    h.post_batch(&[clear_b]).await;
    assert_eq!(tick(&h).await["receiptsRecorded"], 1);
    let (_, g) = h.get(&format!("/internal/remediations/{id}")).await;
    let verified = g["proposal"]["receipts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["kind"] == "VERIFIED")
        .cloned()
        .expect("VERIFIED");
    assert_eq!(verified["evidence"], clear.as_str());
    assert!(
        verified["detail"]["claimsResolved"][0]
            .as_str()
            .unwrap()
            .contains("thread_in_d_state"),
        "{verified}"
    );
    assert_eq!(
        tick(&h).await["receiptsRecorded"],
        0,
        "receipts are issued once"
    );
    h.finish().await;
}

on_both_backends!(
    watchdog_two_consecutive_healthy_checkpoints_recover,
    watchdog_healthy_degraded_healthy_is_not_recovery,
    watchdog_low_traffic_is_inconclusive,
    watchdog_receipts_for_a_host_subject,
);
