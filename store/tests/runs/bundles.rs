//! Evidence bundles within a token budget, saying what they cut, with
//! handoffs an agent can act on alone.

use pstack_store_core::db::analysis::FindingRow;
use pstack_store_core::synthetic::Capture;
use reqwest::StatusCode;
use serde_json::{Value, json};

use super::post;
use crate::on_both_backends;
use crate::support::{Db, Harness, code};

on_both_backends!(
    bundles_stay_within_budget_and_say_what_they_cut,
    prior_findings_match_by_entity_and_by_fingerprint,
    bundles_anchor_at_an_incident_a_change_or_a_finding,
);

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
    let autosre = &full["bundle"]["autosre"];
    assert_eq!(
        autosre["faultLocus"],
        json!({"entityId": "checkout-api", "source": "incident"})
    );
    assert_eq!(autosre["candidateChanges"].as_array().unwrap().len(), 12);
    assert_eq!(
        autosre["priorFindings"].as_array().unwrap().len(),
        1,
        "{full}"
    );
    assert_eq!(full["anchor"], json!({"kind": "incident", "id": inc}));
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
        let autosre = &b["bundle"]["autosre"];
        [
            &b["handoffs"],
            &autosre["candidateChanges"],
            &autosre["priorFindings"],
            &autosre["contentionCandidates"],
        ]
        .iter()
        .map(|s| s.as_array().unwrap().len() as u64)
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

/// A finding of `incident` on `locus` whose recurrence fingerprint comes
/// from `signature`, through the route; its id.
async fn posted_finding(h: &Harness, incident: &str, locus: &str, signature: &str) -> String {
    let (st, r) = post(
        h,
        "/internal/findings",
        &json!({"environment": "prod", "incidentId": incident, "faultLocusEntityId": locus,
            "causalChain": [{"subject": locus, "relation": "originated_fault_in_span", "object": locus}],
            "idempotencyKey": format!("{incident}-{locus}-{signature}"),
            "fingerprintInput": {"originatingNodeId": locus, "normalizedOperation": "POST /checkout",
                "errorSignature": signature}}),
    )
    .await;
    assert_eq!(st, StatusCode::CREATED, "{r}");
    r["finding"]["id"].as_str().unwrap().to_string()
}

async fn prior_findings_match_by_entity_and_by_fingerprint(db: Db) {
    let Some(h) = Harness::start(db).await else {
        return;
    };
    let inc = incident(&h, "now").await;
    posted_finding(&h, &inc, "checkout-api", "TaxRoundingError").await;
    // Same entity, another error: by entity.
    let b = incident(&h, "b").await;
    let by_entity = posted_finding(&h, &b, "checkout-api", "Timeout").await;
    // Same error on another entity: by fingerprint (the fingerprint hashes
    // the originating node, so name the same one).
    let c = incident(&h, "c").await;
    let (st, r) = post(
        &h,
        "/internal/findings",
        &json!({"environment": "prod", "incidentId": c, "faultLocusEntityId": "orders-db",
            "causalChain": [{"subject": "orders-db", "relation": "originated_fault_in_span", "object": "orders-db"}],
            "idempotencyKey": "c-orders",
            "fingerprintInput": {"originatingNodeId": "checkout-api", "normalizedOperation": "POST /checkout",
                "errorSignature": "TaxRoundingError"}}),
    )
    .await;
    assert_eq!(st, StatusCode::CREATED, "{r}");
    let by_fp = r["finding"]["id"].as_str().unwrap().to_string();
    // Both: listed once, as fingerprint.
    let e = incident(&h, "e").await;
    let both = posted_finding(&h, &e, "checkout-api", "TaxRoundingError").await;
    // Neither.
    let d = incident(&h, "d").await;
    posted_finding(&h, &d, "orders-db", "DiskFull").await;

    let (st, bundle) = h
        .get(&format!(
            "/internal/bundles?intent=triage_incident&incident={inc}&budgetTokens=100000"
        ))
        .await;
    assert_eq!(st, StatusCode::OK, "{bundle}");
    let mut got: Vec<(String, String)> = bundle["bundle"]["autosre"]["priorFindings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["matchedBy"].as_str().unwrap().to_string(),
                p["finding"]["id"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    got.sort();
    let mut want = vec![
        ("entity".to_string(), by_entity),
        ("fingerprint".to_string(), by_fp),
        ("fingerprint".to_string(), both),
    ];
    want.sort();
    assert_eq!(got, want, "{bundle:#}");

    // The route: exactly one of the two keys, the field named.
    let (st, items) = h
        .get("/internal/findings?faultLocusEntityId=orders-db")
        .await;
    assert_eq!(st, StatusCode::OK, "{items}");
    assert_eq!(items["items"].as_array().unwrap().len(), 2);
    for (q, field) in [
        ("faultLocusEntityId=", "faultLocusEntityId"),
        (
            "fingerprint=fp_x&faultLocusEntityId=orders-db",
            "fingerprint",
        ),
        ("limit=3", "fingerprint"),
    ] {
        let (st, e) = h.get(&format!("/internal/findings?{q}")).await;
        assert_eq!(
            (st, e["error"]["field"].as_str()),
            (StatusCode::BAD_REQUEST, Some(field)),
            "{q}: {e}"
        );
    }
    h.finish().await;
}

/// Seed 000: `get_evidence_bundle` takes an `incident`, `change` or
/// `finding` anchor and answers `bundle.autosre` (`faultLocus`,
/// `candidateChanges`, `contentionCandidates`, `priorFindings`).
async fn bundles_anchor_at_an_incident_a_change_or_a_finding(db: Db) {
    let Some(h) = Harness::start(db).await else {
        return;
    };
    let (st, c) = post(
        &h,
        "/v1/changes",
        &json!({"environment": "prod", "kind": "deploy", "service": "checkout-api",
            "version": "2.4.1", "previousVersion": "2.4.0"}),
    )
    .await;
    assert!(st.is_success(), "{c}");
    let chg = c["id"].as_str().unwrap().to_string();
    for i in 0..3 {
        let (st, r) = post(
            &h,
            "/v1/changes",
            &json!({"environment": "prod", "kind": "deploy", "service": format!("svc-{i}"), "version": "1"}),
        )
        .await;
        assert!(st.is_success(), "{r}");
    }
    let inc = incident(&h, "now").await;
    let (st, r) = post(
        &h,
        "/internal/findings",
        &json!({"environment": "prod", "incidentId": inc, "faultLocusEntityId": "checkout-api",
            "contributingChangeId": chg,
            "causalChain": [{"subject": chg, "relation": "degraded_after_change", "object": "checkout-api"}],
            "idempotencyKey": "anchor-now"}),
    )
    .await;
    assert_eq!(st, StatusCode::CREATED, "{r}");
    let fnd = r["finding"]["id"].as_str().unwrap().to_string();
    let earlier = incident(&h, "earlier").await;
    let prior = posted_finding(&h, &earlier, "checkout-api", "Timeout").await;
    let prior_ids = |b: &Value| -> Vec<String> {
        let mut v: Vec<String> = b["bundle"]["autosre"]["priorFindings"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["finding"]["id"].as_str().unwrap().to_string())
            .collect();
        v.sort();
        v
    };

    // A change: it is the first candidate, its service the locus; every
    // finding on that service is prior (no incident owns the bundle).
    let (st, b) = h
        .get(&format!(
            "/internal/bundles?change={chg}&budgetTokens=100000"
        ))
        .await;
    assert_eq!(st, StatusCode::OK, "{b}");
    let autosre = &b["bundle"]["autosre"];
    assert_eq!(b["anchor"], json!({"kind": "change", "id": chg}));
    assert_eq!(b["incident"], Value::Null);
    assert_eq!(b["intent"], "triage_incident");
    assert_eq!(
        autosre["faultLocus"],
        json!({"entityId": "checkout-api", "source": "change"})
    );
    assert_eq!(autosre["candidateChanges"][0]["change"]["id"], chg.as_str());
    assert_eq!(autosre["candidateChanges"].as_array().unwrap().len(), 4);
    assert!(autosre["contentionCandidates"].is_array(), "{b}");
    let mut want = vec![fnd.clone(), prior.clone()];
    want.sort();
    assert_eq!(prior_ids(&b), want, "{b:#}");

    // A finding: its incident, its locus, the change it names first; its
    // own incident's findings are not prior.
    let (st, b) = h
        .get(&format!(
            "/internal/bundles?intent=triage_incident&finding={fnd}&budgetTokens=100000"
        ))
        .await;
    assert_eq!(st, StatusCode::OK, "{b}");
    let autosre = &b["bundle"]["autosre"];
    assert_eq!(b["anchor"], json!({"kind": "finding", "id": fnd}));
    assert_eq!(b["incident"]["id"], inc.as_str());
    assert_eq!(
        autosre["faultLocus"],
        json!({"entityId": "checkout-api", "source": "finding"})
    );
    assert_eq!(autosre["candidateChanges"][0]["change"]["id"], chg.as_str());
    assert_eq!(prior_ids(&b), vec![prior.clone()], "{b:#}");

    // The incident anchor ranks the change its finding names first too.
    let (st, b) = h
        .get(&format!(
            "/internal/bundles?incident={inc}&budgetTokens=100000"
        ))
        .await;
    assert_eq!(st, StatusCode::OK, "{b}");
    assert_eq!(
        b["bundle"]["autosre"]["candidateChanges"][0]["change"]["id"],
        chg.as_str()
    );
    assert_eq!(prior_ids(&b), vec![prior], "{b:#}");

    // Exactly one anchor, an id, that exists.
    for (q, want_st, want_code, field) in [
        (
            format!("incident={inc}&change={chg}"),
            StatusCode::BAD_REQUEST,
            "invalid_query",
            "change",
        ),
        (
            "budgetTokens=1000".to_string(),
            StatusCode::BAD_REQUEST,
            "invalid_query",
            "incident",
        ),
        (
            "change=chg%20x".to_string(),
            StatusCode::BAD_REQUEST,
            "invalid_query",
            "change",
        ),
        (
            "change=chg_nope".to_string(),
            StatusCode::NOT_FOUND,
            "change_not_found",
            "change",
        ),
        (
            "finding=fnd_nope".to_string(),
            StatusCode::NOT_FOUND,
            "finding_not_found",
            "finding",
        ),
    ] {
        let (st, e) = h.get(&format!("/internal/bundles?{q}")).await;
        assert_eq!(
            (st, code(&e), e["error"]["field"].as_str()),
            (want_st, want_code, Some(field)),
            "{q}: {e}"
        );
    }
    h.finish().await;
}
