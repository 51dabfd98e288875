//! Evidence bundles within a token budget, saying what they cut, with
//! handoffs an agent can act on alone.

use pstack_store::db::analysis::FindingRow;
use pstack_store::synthetic::Capture;
use reqwest::StatusCode;
use serde_json::{Value, json};

use super::post;
use crate::on_both_backends;
use crate::support::{Db, Harness, code};

on_both_backends!(bundles_stay_within_budget_and_say_what_they_cut);

async fn finding(h: &Harness, incident: &str, fp: &str, cited: &[String]) {
    let now = h.clock.now_ns();
    let id = format!("fnd_{}_{}", incident, cited.len());
    let row = FindingRow {
        id: id.clone(),
        environment: "prod".into(),
        incident_id: Some(incident.into()),
        fault_locus_entity_id: "checkout-api".into(),
        causal_chain: json!([]),
        cited_evidence_ids: json!(cited),
        contributing_change_id: None,
        change_verdict: None,
        counterfactual: None,
        fingerprint: fp.into(),
        fingerprint_input: json!({}),
        causal_proof_tier: "correlated".into(),
        idempotency_key: id,
        created_ns: now,
        updated_ns: now,
    };
    h.store
        .insert_finding(&row, cited, &h.key_id)
        .await
        .expect("insert finding");
}

async fn incident(h: &Harness, key: &str) -> String {
    let (st, r) = post(
        h,
        "/internal/incidents",
        &json!({"project": "p", "environment": "prod", "dedupKey": key, "title": "checkout slow", "faultLocusEntityId": "checkout-api"}),
    )
    .await;
    assert!(st.is_success(), "{r}");
    r["incident"]["id"].as_str().unwrap().to_string()
}

async fn bundles_stay_within_budget_and_say_what_they_cut(db: Db) {
    let Some(h) = Harness::start(db).await else {
        return;
    };
    let inc = incident(&h, "a").await;
    let old = incident(&h, "b").await;
    // A D-state process (one thread's stack read timed out: partial).
    let now = h.clock.now_ns();
    let seq = u64::try_from(now / 1_000_000_000 - 5 - 1_796_000_000).unwrap();
    let (d, b) = Capture::new("node-a", 4242, seq).bytes().unwrap();
    h.post_batch(&[b]).await;
    finding(&h, &inc, "fp_checkout", std::slice::from_ref(&d)).await;
    finding(&h, &old, "fp_checkout", &[]).await;
    for i in 0..12 {
        let (st, r) = post(
            &h,
            "/v1/changes",
            &json!({"environment": "prod", "kind": "deploy", "service": format!("svc-{i}"), "version": format!("v{i}"), "summary": "x".repeat(200)}),
        )
        .await;
        assert!(st.is_success(), "{r}");
    }
    let get = |budget: u32| {
        let h = &h;
        let inc = inc.clone();
        async move {
            h.get(&format!(
                "/internal/bundles?intent=triage_incident&incident={inc}&budgetTokens={budget}"
            ))
            .await
        }
    };
    let (st, full) = get(1_000_000).await;
    assert_eq!(st, StatusCode::OK, "{full}");
    assert_eq!(full["cut"], json!([]));
    assert_eq!(full["faultLocus"], "checkout-api");
    assert_eq!(full["candidateChanges"].as_array().unwrap().len(), 12);
    assert_eq!(full["priorFindings"].as_array().unwrap().len(), 1, "{full}");
    let handoff = &full["handoffs"][0];
    assert_eq!(handoff["uri"], format!("/v1/envelopes/{d}"));
    assert!(handoff["observedAt"].is_string() && handoff["expiresAt"].is_string());
    assert_eq!(handoff["expired"], false);
    assert_eq!(
        handoff["firstMissingTransition"]["edge"], "surface",
        "{handoff}"
    );
    assert!(
        handoff["nextLegalAction"]["action"].is_string(),
        "{handoff}"
    );
    let total = |b: &Value| {
        [
            "handoffs",
            "candidateChanges",
            "priorFindings",
            "contentionCandidates",
        ]
        .iter()
        .map(|s| b[s].as_array().unwrap().len() as u64)
        .sum::<u64>()
            + b["cut"]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| c["dropped"].as_u64().unwrap())
                .sum::<u64>()
    };
    for budget in [400, 900, 2000] {
        let (st, b) = get(budget).await;
        assert_eq!(st, StatusCode::OK, "{b}");
        let size = b.to_string().len().div_ceil(4);
        assert!(size <= budget as usize, "{budget}: {size}");
        assert!(
            !b["cut"].as_array().unwrap().is_empty(),
            "{budget}: something was cut"
        );
        assert_eq!(total(&b), total(&full), "{budget}: kept + cut = everything");
        assert!(!b.to_string().contains("grantToken"));
    }
    let (st, e) = get(50).await;
    assert_eq!(
        (st, e["error"]["field"].as_str()),
        (StatusCode::BAD_REQUEST, Some("budgetTokens"))
    );
    let (st, e) = h
        .get("/internal/bundles?intent=triage_incident&incident=inc_nope")
        .await;
    assert_eq!(
        (st, code(&e)),
        (StatusCode::NOT_FOUND, "incident_not_found")
    );
    let (st, e) = h
        .get(&format!("/internal/bundles?intent=guess&incident={inc}"))
        .await;
    assert_eq!(
        (st, e["error"]["field"].as_str()),
        (StatusCode::BAD_REQUEST, Some("intent"))
    );
    h.finish().await;
}
