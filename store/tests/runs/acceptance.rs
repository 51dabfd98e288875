//! Seed 001's acceptance metrics (AC1, issue 29 item 7): each of the seven
//! on `/metrics` (Prometheus's `promtool check metrics` is the oracle of the
//! format), moved by a scripted pair of runs exactly as their definitions
//! in `store/docs/runs.md` say, and the same per run in the run report.

use std::collections::BTreeMap;

use pstack_envelope::Completeness;
use reqwest::StatusCode;
use serde_json::{Value, json};

use super::mutation::{envelope, hypothesis, ingest, past_second};
use super::{post, start, step};
use crate::on_both_backends;
use crate::support::{Db, Harness, code};

const S: i64 = 1_000_000_000;

/// Every AC1 metric's family name.
const FAMILIES: [&str; 8] = [
    "pstack_store_run_first_discriminating_observation_seconds",
    "pstack_store_hypothesis_retractions_total",
    "pstack_store_repeated_investigations_total",
    "pstack_store_unknowns_without_owner_or_probe_total",
    "pstack_store_stale_handoffs_total",
    "pstack_store_run_transitions_total",
    "pstack_store_run_agent_seconds_total",
    "pstack_store_run_narration_tokens_total",
];

/// `/metrics`, linted by promtool, as sample → value.
async fn scrape(h: &Harness) -> BTreeMap<String, f64> {
    let text = h
        .client
        .get(h.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    pstack_testkit::require!(
        pstack_testkit::have_tool("promtool"),
        "promtool is not installed (scripts/setup.d/60-oracles.sh installs Debian's prometheus)"
    );
    if let Err(said) = pstack_testkit::promtool_check_metrics(&text) {
        panic!("promtool check metrics on the store's /metrics:\n{said}\n---\n{text}");
    }
    for family in FAMILIES {
        let kind = if family.ends_with("_seconds") {
            "histogram"
        } else {
            "counter"
        };
        assert!(
            text.contains(&format!("# TYPE {family} {kind}\n"))
                && text.contains(&format!("# HELP {family} ")),
            "{family} is not on /metrics:\n{text}"
        );
    }
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| {
            let (name, v) = l.rsplit_once(' ')?;
            Some((name.to_string(), v.parse().ok()?))
        })
        .collect()
}

/// A foreign envelope whose one unknown has an empty `field`, sealed
/// (digest recomputed) so only the validator judges it.
fn unknown_without(field: &str) -> Vec<u8> {
    let (_, bytes) = envelope(past_second(50), Completeness::Complete, &[], vec![]);
    let mut v: Value = serde_json::from_slice(&bytes).unwrap();
    let mut u = json!({
        "id": "u-foreign", "owner": "the node's SRE", "question": "Which peer reset it?",
        "probe": "pstackctl trace tcp --window 10s", "blocks": "confirm_transport_fault",
    });
    u[field] = json!("");
    v["unknowns"] = json!([u]);
    v["digest"] = Value::String(pstack_envelope::compute_digest(&v).unwrap());
    serde_json::to_vec(&v).unwrap()
}

async fn report(h: &Harness, run: &str) -> Value {
    let (st, r) = h
        .get(&format!(
            "/internal/runs/{run}/report?executorKind=agent-assisted&envClass=staging"
        ))
        .await;
    assert_eq!(st, StatusCode::OK, "{r}");
    r["acceptance"].clone()
}

on_both_backends!(each_acceptance_metric_is_exposed_and_moves_as_defined);

/// Each of the seven AC1 metrics is on `/metrics` (promtool-clean before and
/// after) and moves by exactly what two scripted runs do (regression: none
/// was measured).
async fn each_acceptance_metric_is_exposed_and_moves_as_defined(db: Db) {
    let Some(h) = Harness::start(db).await else {
        return;
    };
    let before = scrape(&h).await;
    let fuse = "fuse_server_not_answering";
    let a = 4243;
    let t0 = past_second(1000);

    // Run 1: a FUSE hypothesis on thread a, falsified 90 s after the run
    // started by the post-mutation capture (a still in D, no FUSE wait).
    h.clock.pin(t0);
    let pre = ingest(
        &h,
        envelope(
            t0 - 10 * S,
            Completeness::Complete,
            &[a],
            vec![hypothesis(fuse, a)],
        ),
    )
    .await;
    let r1 = start(&h, json!({})).await;
    let status_text = "x".repeat(40); // 42 bytes as JSON: 11 tokens
    step(
        &h,
        &r1,
        json!({"kind": "observe", "envelope": pre, "stdout": status_text}),
    )
    .await;
    for to in ["bind-identity", "classify-unknown", "choose-falsifier"] {
        step(&h, &r1, json!({"kind": "advance", "step": to})).await;
    }
    h.clock.pin(t0 + 60 * S);
    for to in ["mutate", "capture-again"] {
        let r = step(&h, &r1, json!({"kind": "advance", "step": to})).await;
        assert_eq!(r["verdict"], "permit", "{to}: {r}");
    }
    h.clock.pin(t0 + 90 * S);
    let post_env = ingest(
        &h,
        envelope(t0 + 70 * S, Completeness::Complete, &[a], vec![]),
    )
    .await;
    step(&h, &r1, json!({"kind": "observe", "envelope": post_env})).await;
    step(&h, &r1, json!({"kind": "advance", "step": "diff"})).await;
    step(&h, &r1, json!({"kind": "observe", "exitCode": 0})).await;
    for to in ["issue-receipt", "end:success"] {
        step(&h, &r1, json!({"kind": "advance", "step": to})).await;
    }
    let (_, got) = h.get(&format!("/internal/runs/{r1}")).await;
    assert_eq!(got["run"]["reportOutcome"], "success", "{got}");

    // Run 2, 200 s in, on the same subject: it binds a subject run 1
    // settled (a repeated investigation); its capture puts the falsified
    // hypothesis forward again (a retraction); it cites an expired handoff
    // and an unknown one before it moves.
    h.clock.pin(t0 + 200 * S);
    let again = ingest(
        &h,
        envelope(
            t0 + 190 * S,
            Completeness::Complete,
            &[a],
            vec![hypothesis(fuse, a)],
        ),
    )
    .await;
    let r2 = start(&h, json!({})).await;
    step(
        &h,
        &r2,
        json!({"kind": "proposeCommand", "command": "pstackctl capture --pid 4242"}),
    )
    .await; // 30 bytes as JSON: 8 tokens
    step(&h, &r2, json!({"kind": "observe", "envelope": again})).await;
    let (st, e) = post(
        &h,
        &format!("/internal/runs/{r2}/steps"),
        &json!({"kind": "advance", "step": "bind-identity", "handoff": pre}),
    )
    .await;
    assert_eq!((st, code(&e)), (StatusCode::GONE, "handoff_expired"));
    let (st, e) = post(
        &h,
        &format!("/internal/runs/{r2}/steps"),
        &json!({"kind": "advance", "step": "bind-identity",
                "handoff": format!("sha256:{}", "0".repeat(64))}),
    )
    .await;
    assert_eq!(
        (st, code(&e)),
        (StatusCode::UNPROCESSABLE_ENTITY, "envelope_unknown")
    );
    h.clock.pin(t0 + 230 * S);
    step(
        &h,
        &r2,
        json!({"kind": "advance", "step": "bind-identity", "handoff": again}),
    )
    .await;

    // Two foreign envelopes, one unknown without an owner, one without a
    // probe: both refused at ingest, both counted.
    let (_, refused) = h
        .post_batch(&[unknown_without("owner"), unknown_without("probe")])
        .await;
    assert_eq!(refused.rejected, 2, "{:?}", refused.results);

    let after = scrape(&h).await;
    let delta = |sample: &str| {
        after.get(sample).copied().unwrap_or(f64::NAN) - before.get(sample).copied().unwrap_or(0.0)
    };
    let first = "pstack_store_run_first_discriminating_observation_seconds";
    for (sample, want) in [
        (format!("{first}_count"), 1.0),
        (format!("{first}_sum"), 90.0),
        (format!("{first}_bucket{{le=\"60\"}}"), 0.0),
        (format!("{first}_bucket{{le=\"120\"}}"), 1.0),
        ("pstack_store_hypothesis_retractions_total".into(), 1.0),
        ("pstack_store_repeated_investigations_total".into(), 1.0),
        (
            "pstack_store_unknowns_without_owner_or_probe_total{missing=\"owner\"}".into(),
            1.0,
        ),
        (
            "pstack_store_unknowns_without_owner_or_probe_total{missing=\"probe\"}".into(),
            1.0,
        ),
        (
            "pstack_store_stale_handoffs_total{reason=\"expired\"}".into(),
            1.0,
        ),
        (
            "pstack_store_stale_handoffs_total{reason=\"unbound\"}".into(),
            1.0,
        ),
        // Run 1 entered 8 steps, run 2 one.
        ("pstack_store_run_transitions_total".into(), 9.0),
        // Run 1: 90 s from its start to its last step; run 2: 30 s.
        ("pstack_store_run_agent_seconds_total".into(), 120.0),
        ("pstack_store_run_narration_tokens_total".into(), 19.0),
    ] {
        assert_eq!(delta(&sample), want, "{sample}");
    }

    // Per run, in the report (bucketed and rounded) and the run (exact).
    let one = report(&h, &r1).await;
    assert_eq!(
        one,
        json!({
            "first_discriminating_observation_bucket": "1-5m",
            "retractions": 0, "repeated_investigation": false,
            "unknowns_without_owner_or_probe": 0, "stale_handoffs": 0,
            "transitions": 8, "transitions_per_agent_hour": 320,
            "narration_tokens": 11,
        })
    );
    let two = report(&h, &r2).await;
    assert_eq!(
        two,
        json!({
            "retractions": 1, "repeated_investigation": true,
            "unknowns_without_owner_or_probe": 0, "stale_handoffs": 2,
            "transitions": 1, "transitions_per_agent_hour": 120,
            "narration_tokens": 8,
        })
    );
    let (_, got) = h.get(&format!("/internal/runs/{r1}")).await;
    assert_eq!(
        got["run"]["acceptance"]["firstDiscriminatingObservationSeconds"],
        90.0
    );
    assert_eq!(got["run"]["acceptance"]["agentSeconds"], 90.0);
    h.clock.unpin();
    h.finish().await;
}
