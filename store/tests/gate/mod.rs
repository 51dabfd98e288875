//! The remediation gate end to end (seed 000, scenario 5): incidents with
//! dedup and fenced leases, the ontology, proposals under the policy matrix
//! and circuit breaker, hashed single-use grants with CAS at claim, the
//! watchdog, webhooks, Alertmanager — real HTTP into a real server on
//! SQLite and PostgreSQL, time moved by the server's injected clock.

use std::time::Duration;

use pstack_store_core::analysis::cohort::{CohortKey, Dimension};
use pstack_store_core::analysis::ledger;
use pstack_store_core::analysis::otlp::Batch;
use pstack_store_core::analysis::proof::EvalRun;
use pstack_store_core::analysis::sketch::MinuteCells;
use pstack_store_core::db::analysis::FindingRow;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::on_both_backends;
use crate::support::{Db, Harness, code};

pub(crate) mod grants;
mod hooks;
mod recovery;
mod replays;

pub(crate) const MIN: Duration = Duration::from_secs(60);

/// POST with the API key — or, for approve/reject (human decisions), with
/// an operator session and its CSRF token instead; a grant is claimed,
/// completed or failed with the runner key (an autonomous grant is never
/// claimed by the key that proposed it).
pub(crate) async fn post(h: &Harness, path: &str, body: &Value) -> (StatusCode, Value) {
    let req = h.client.post(h.url(path)).json(body);
    let req = if path.ends_with("/approve") || path.ends_with("/reject") {
        let (cookie, csrf) = h.human_session().await;
        req.header("cookie", format!("pstack_session={cookie}"))
            .header("x-csrf-token", csrf)
    } else if path.ends_with("/grant") {
        req.bearer_auth(&h.runner_key)
    } else {
        req.bearer_auth(&h.key)
    };
    let resp = req.send().await.expect("POST");
    let status = resp.status();
    (status, resp.json().await.unwrap_or(Value::Null))
}

pub(crate) async fn open_incident(h: &Harness, dedup: &str) -> String {
    let (st, body) = post(
        h,
        "/internal/incidents",
        &json!({"project": "shop", "environment": "prod", "dedupKey": dedup, "title": "checkout 5xx"}),
    )
    .await;
    assert!(st.is_success(), "{st} {body}");
    body["incident"]["id"].as_str().unwrap().to_string()
}

/// A finding of `tier` (stored directly: the tier derivation has its own
/// tests in the analysis module) with fingerprint `fp`. A tier the gate
/// acts on autonomously rests on evidence another key wrote
/// (`gate::provenance`): a counterfactual's eval runs, or a cohort's change
/// and spans, recorded here under other key ids.
pub(crate) async fn finding(h: &Harness, incident: &str, tier: &str, fp: &str) -> String {
    let now = h.clock.now_ns();
    let id = format!("fnd_{:016x}", rand_u64());
    let (mut change_id, mut verdict, mut counterfactual) = (None, None, None);
    match tier {
        "counterfactual_verified" => {
            let mut runs = Vec::new();
            for passed in [false, true] {
                let run = EvalRun {
                    eval_case_id: "case-stub".into(),
                    input_payload_hash: "h".into(),
                    passed,
                    failure_fingerprint: (!passed).then(|| fp.to_string()),
                    ..EvalRun::default()
                };
                runs.push(
                    h.store
                        .record_eval_run(&run, "k_eval_harness", now)
                        .await
                        .expect("eval run"),
                );
            }
            counterfactual = Some(json!({"failingRunId": runs[0], "passingRunIds": [runs[1]],
                                         "requiredTrials": 1, "verified": true}));
        }
        "cohort_rate_isolated" => {
            let at = now - 600_000_000_000;
            let change = ledger::validate(
                serde_json::from_value(json!({"environment": "prod", "kind": "deploy",
                    "service": "provenance-stub", "version": "2"}))
                .unwrap(),
                at,
            )
            .unwrap();
            change_id = Some(
                h.store
                    .record_change(&change, "k_ci", at)
                    .await
                    .expect("change"),
            );
            let mut batch = Batch::default();
            let mut cells = MinuteCells::default();
            cells.record_many(0, 0, 100, 50);
            batch.cohorts.rows.insert(
                CohortKey {
                    environment: "prod".into(),
                    service: "provenance-stub".into(),
                    dimension: Dimension::Version,
                    name: String::new(),
                    bucket_ns: at + 60_000_000_000,
                    value: "2".into(),
                },
                cells,
            );
            h.store
                .ingest_traces(&batch, "k_collector")
                .await
                .expect("spans");
            verdict = Some("isolated_to_new_version".to_string());
        }
        _ => {}
    }
    let row = FindingRow {
        id: id.clone(),
        environment: "prod".into(),
        incident_id: Some(incident.into()),
        fault_locus_entity_id: "checkout-api".into(),
        causal_chain: json!([]),
        cited_evidence_ids: json!([]),
        contributing_change_id: change_id,
        change_verdict: verdict,
        counterfactual,
        fingerprint: fp.into(),
        fingerprint_input: json!({}),
        causal_proof_tier: tier.into(),
        idempotency_key: id.clone(),
        created_ns: now,
        updated_ns: now,
    };
    h.store
        .insert_finding(&row, &[], &h.key_id)
        .await
        .expect("insert finding");
    id
}

pub(crate) fn rand_u64() -> u64 {
    let mut b = [0u8; 8];
    getrandom::fill(&mut b).expect("random");
    u64::from_le_bytes(b)
}

/// Record a deploy of checkout-api in the change ledger.
pub(crate) async fn deploy(h: &Harness, version: &str, commit: &str) {
    let (st, body) = post(
        h,
        "/v1/changes",
        &json!({"environment": "prod", "kind": "deploy", "service": "checkout-api",
                "version": version, "commitSha": commit}),
    )
    .await;
    assert_eq!(st, StatusCode::CREATED, "{body}");
}

/// A proposal body for a service target expecting v2.4.1 / 8f3a1b2.
pub(crate) fn proposal(incident: &str, finding: &str, action: &str, key: &str) -> Value {
    json!({
        "incidentId": incident,
        "findingId": finding,
        "action": action,
        "target": {"service": "checkout-api", "environment": "prod"},
        "expectedCurrentState": {"version": "2.4.1", "commitSha": "8f3a1b2"},
        "idempotencyKey": key,
    })
}

// ---- incidents ----

async fn incidents_dedup_by_status_not_clock(db: Db) {
    let Some(h) = Harness::start(db).await else {
        return;
    };
    let body = json!({"project": "shop", "environment": "prod", "dedupKey": "checkout-5xx", "title": "checkout 5xx"});
    let (st, first) = post(&h, "/internal/incidents", &body).await;
    assert_eq!(st, StatusCode::CREATED, "{first}");
    assert_eq!(first["deduplicated"], false);
    let id = first["incident"]["id"].as_str().unwrap().to_string();
    assert!(id.starts_with("inc_"));
    // Much later (the index predicate is status, not time): still joins.
    h.clock.advance(Duration::from_secs(30 * 86_400));
    let (st, again) = post(&h, "/internal/incidents", &body).await;
    assert_eq!(st, StatusCode::OK, "{again}");
    assert_eq!(again["deduplicated"], true);
    assert_eq!(again["incident"]["id"], id.as_str());
    assert_eq!(again["incident"]["alertCount"], 2);
    // Another environment is another incident.
    let mut other = body.clone();
    other["environment"] = json!("staging");
    let (st, o) = post(&h, "/internal/incidents", &other).await;
    assert_eq!(st, StatusCode::CREATED);
    assert_ne!(o["incident"]["id"], id.as_str());
    // List, filtered.
    let (st, list) = h
        .get("/internal/incidents?environment=prod&status=open&limit=10")
        .await;
    assert_eq!(st, StatusCode::OK);
    let items = list["items"].as_array().unwrap();
    assert_eq!(items.len(), 1, "{list}");
    assert_eq!(items[0]["id"], id.as_str());
    // One, with its findings and proposals.
    let f = finding(&h, &id, "corroborated_candidate", "fp_inc").await;
    let (st, _) = post(
        &h,
        "/internal/remediations/propose",
        &proposal(&id, &f, "rollback_deploy", "k-inc"),
    )
    .await;
    assert_eq!(st, StatusCode::CREATED);
    let (st, one) = h.get(&format!("/internal/incidents/{id}")).await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(one["findings"][0]["id"], f.as_str());
    assert_eq!(one["proposals"][0]["status"], "pending_human_approval");
    let (st, missing) = h.get("/internal/incidents/inc_0000").await;
    assert_eq!(st, StatusCode::NOT_FOUND);
    assert_eq!(code(&missing), "incident_not_found");
    // Resolved leaves the index: the same key opens a new incident.
    let (st, r) = post(&h, &format!("/internal/incidents/{id}/resolve"), &json!({})).await;
    assert_eq!(st, StatusCode::OK, "{r}");
    assert_eq!(r["incident"]["status"], "resolved");
    let (st, fresh) = post(&h, "/internal/incidents", &body).await;
    assert_eq!(st, StatusCode::CREATED);
    assert_eq!(fresh["deduplicated"], false);
    assert_ne!(fresh["incident"]["id"], id.as_str());
    h.finish().await;
}

async fn concurrent_duplicate_opens_make_one_incident(db: Db) {
    let Some(h) = Harness::start(db).await else {
        return;
    };
    let h = std::sync::Arc::new(h);
    let mut tasks = Vec::new();
    for _ in 0..16 {
        let h = h.clone();
        tasks.push(tokio::spawn(async move {
            post(
                &h,
                "/internal/incidents",
                &json!({"project": "shop", "environment": "prod", "dedupKey": "race", "title": "t"}),
            )
            .await
        }));
    }
    let mut ids = std::collections::BTreeSet::new();
    let mut fresh = 0;
    for t in tasks {
        let (st, body) = t.await.unwrap();
        assert!(st.is_success(), "{st} {body}");
        ids.insert(body["incident"]["id"].as_str().unwrap().to_string());
        if body["deduplicated"] == false {
            fresh += 1;
        }
    }
    assert_eq!(ids.len(), 1, "{ids:?}");
    assert_eq!(fresh, 1);
    let (_, one) = h
        .get(&format!("/internal/incidents/{}", ids.first().unwrap()))
        .await;
    assert_eq!(one["incident"]["alertCount"], 16);
    std::sync::Arc::into_inner(h).unwrap().finish().await;
}

async fn lease_race_fencing_and_reaping(db: Db) {
    let Some(h) = Harness::start(db).await else {
        return;
    };
    let id = open_incident(&h, "lease").await;
    let path = format!("/internal/incidents/{id}/lease");
    let body_a = json!({"runnerId": "runner-a", "ttlSeconds": 60});
    let body_b = json!({"runnerId": "runner-b", "ttlSeconds": 60});
    let (a, b) = tokio::join!(post(&h, &path, &body_a), post(&h, &path, &body_b));
    let (winner, loser, win_body, lose_body) = if a.0 == StatusCode::OK {
        ("runner-a", "runner-b", a.1, b.1)
    } else {
        ("runner-b", "runner-a", b.1, a.1)
    };
    assert_eq!(code(&lose_body), "lease_held", "{lose_body}");
    let token = win_body["lease"]["fencingToken"].as_i64().unwrap();
    assert_eq!(token, 1);
    // The loser cannot write with any token.
    let (st, e) = post(
        &h,
        &path,
        &json!({"runnerId": loser, "operation": "renew", "fencingToken": token}),
    )
    .await;
    assert_eq!(st, StatusCode::CONFLICT);
    assert_eq!(code(&e), "stale_fencing_token");
    let f = finding(&h, &id, "corroborated_candidate", "fp_lease").await;
    let mut p = proposal(&id, &f, "rollback_deploy", "k-lease-1");
    let (st, e) = post(&h, "/internal/remediations/propose", &p).await;
    assert_eq!((st, code(&e)), (StatusCode::CONFLICT, "lease_held"), "{e}");
    p["runnerId"] = json!(winner);
    p["fencingToken"] = json!(token);
    let (st, ok) = post(&h, "/internal/remediations/propose", &p).await;
    assert_eq!(st, StatusCode::CREATED, "{ok}");
    // Renewal keeps the token.
    let (st, r) = post(
        &h,
        &path,
        &json!({"runnerId": winner, "operation": "renew", "fencingToken": token, "ttlSeconds": 60}),
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{r}");
    assert_eq!(r["lease"]["fencingToken"], token);
    // The winner stalls past expiry; the watchdog reaps the lease to open.
    h.clock.advance(2 * MIN);
    let (st, tick) = post(&h, "/internal/remediations/watchdog", &json!({})).await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(tick["reapedLeases"], 1, "{tick}");
    let (_, inc) = h.get(&format!("/internal/incidents/{id}")).await;
    assert_eq!(inc["incident"]["status"], "open");
    // The other runner takes it: a higher token.
    let (st, b2) = post(&h, &path, &json!({"runnerId": loser})).await;
    assert_eq!(st, StatusCode::OK, "{b2}");
    assert_eq!(b2["lease"]["fencingToken"], token + 1);
    // The old holder's writes with its stale token are refused.
    let (st, e) = post(
        &h,
        &path,
        &json!({"runnerId": winner, "operation": "renew", "fencingToken": token}),
    )
    .await;
    assert_eq!(
        (st, code(&e)),
        (StatusCode::CONFLICT, "stale_fencing_token")
    );
    let mut stale = proposal(&id, &f, "rollback_deploy", "k-lease-2");
    stale["runnerId"] = json!(winner);
    stale["fencingToken"] = json!(token);
    let (st, e) = post(&h, "/internal/remediations/propose", &stale).await;
    assert_eq!(
        (st, code(&e)),
        (StatusCode::CONFLICT, "stale_fencing_token"),
        "{e}"
    );
    let (st, e) = post(
        &h,
        &format!("/internal/incidents/{id}/resolve"),
        &json!({"runnerId": winner, "fencingToken": token}),
    )
    .await;
    assert_eq!(
        (st, code(&e)),
        (StatusCode::CONFLICT, "stale_fencing_token")
    );
    // Release by the current holder.
    let (st, rel) = post(
        &h,
        &path,
        &json!({"runnerId": loser, "operation": "release", "fencingToken": token + 1}),
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{rel}");
    assert_eq!(rel["incident"]["status"], "open");
    h.finish().await;
}

on_both_backends!(
    incidents_dedup_by_status_not_clock,
    concurrent_duplicate_opens_make_one_incident,
    lease_race_fencing_and_reaping,
);

// ---- ontology ----

async fn ontology_follows_the_ledger(db: Db) {
    let Some(h) = Harness::start(db).await else {
        return;
    };
    deploy(&h, "2.4.1", "8f3a1b2").await;
    let node = h
        .store
        .ontology_node("service:prod/checkout-api")
        .await
        .unwrap()
        .expect("node");
    assert_eq!(node.version.as_deref(), Some("2.4.1"));
    assert_eq!(node.commit_sha.as_deref(), Some("8f3a1b2"));
    // A config change keeps the version and sets the digest.
    let (st, b) = post(
        &h,
        "/v1/changes",
        &json!({"environment": "prod", "kind": "config", "service": "checkout-api",
                "configDigest": "sha256:cafe"}),
    )
    .await;
    assert_eq!(st, StatusCode::CREATED, "{b}");
    let node = h
        .store
        .ontology_node("service:prod/checkout-api")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(node.version.as_deref(), Some("2.4.1"));
    assert_eq!(node.config_digest.as_deref(), Some("sha256:cafe"));
    // Flag changes merge flag by flag.
    for flags in [
        json!({"new-checkout": true, "tax-v2": "off"}),
        json!({"tax-v2": "on"}),
    ] {
        let (st, b) = post(
            &h,
            "/v1/changes",
            &json!({"environment": "prod", "kind": "feature_flag", "service": "checkout-api", "flags": flags}),
        )
        .await;
        assert_eq!(st, StatusCode::CREATED, "{b}");
    }
    let node = h
        .store
        .ontology_node("service:prod/checkout-api")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(node.flags, json!({"new-checkout": true, "tax-v2": "on"}));
    assert_eq!(node.version.as_deref(), Some("2.4.1"));
    let (st, e) = post(
        &h,
        "/v1/changes",
        &json!({"environment": "prod", "kind": "kernel", "nodes": [{"node": "n1"}], "flags": {"x": true}}),
    )
    .await;
    assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(e["error"]["field"], "flags");
    // A change recorded late, effective earlier, does not roll state back.
    let (st, b) = post(
        &h,
        "/v1/changes",
        &json!({"environment": "prod", "kind": "deploy", "service": "checkout-api",
                "version": "2.3.0", "at": pstack_store_core::ident::format_ns(h.clock.now_ns() - 3_600_000_000_000)}),
    )
    .await;
    assert_eq!(st, StatusCode::CREATED, "{b}");
    let node = h
        .store
        .ontology_node("service:prod/checkout-api")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(node.version.as_deref(), Some("2.4.1"));
    h.finish().await;
}

on_both_backends!(ontology_follows_the_ledger);

// ---- Alertmanager ----

fn alertmanager(group: &str, status: &str, alerts: &[(&str, &str)]) -> Value {
    json!({
        "version": "4",
        "groupKey": group,
        "truncatedAlerts": 0,
        "status": status,
        "receiver": "pstack",
        "groupLabels": {"alertname": "CheckoutErrors"},
        "commonLabels": {"alertname": "CheckoutErrors", "environment": "prod", "project": "shop", "service": "checkout-api"},
        "commonAnnotations": {"summary": "checkout 5xx above 5%"},
        "externalURL": "http://alertmanager.local:9093",
        "alerts": alerts.iter().map(|(fp, st)| json!({
            "status": st,
            "labels": {"alertname": "CheckoutErrors", "instance": fp},
            "annotations": {},
            "startsAt": "2026-12-03T10:00:00Z",
            "endsAt": if *st == "resolved" { "2026-12-03T10:20:00Z" } else { "0001-01-01T00:00:00Z" },
            "generatorURL": "http://prometheus.local/graph",
            "fingerprint": fp,
        })).collect::<Vec<_>>(),
    })
}

async fn alertmanager_groups_open_or_join_one_incident(db: Db) {
    let Some(h) = Harness::start(db).await else {
        return;
    };
    let group = "{}/{alertname=\"CheckoutErrors\"}:{alertname=\"CheckoutErrors\"}";
    let msg = alertmanager(group, "firing", &[("a1b2", "firing"), ("c3d4", "firing")]);
    let (st, first) = post(&h, "/v1/alerts/alertmanager", &msg).await;
    assert_eq!(st, StatusCode::OK, "{first}");
    assert_eq!(first["items"][0]["deduplicated"], false);
    let id = first["items"][0]["incident"]["id"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(
        first["items"][0]["incident"]["title"],
        "checkout 5xx above 5%"
    );
    // The same group re-notified (repeat_interval), and concurrently.
    let h = std::sync::Arc::new(h);
    let mut tasks = Vec::new();
    for _ in 0..6 {
        let (h, msg) = (h.clone(), msg.clone());
        tasks.push(tokio::spawn(async move {
            post(&h, "/v1/alerts/alertmanager", &msg).await
        }));
    }
    for t in tasks {
        let (st, b) = t.await.unwrap();
        assert_eq!(st, StatusCode::OK);
        assert_eq!(b["items"][0]["deduplicated"], true);
        assert_eq!(b["items"][0]["incident"]["id"], id.as_str());
    }
    // Resolved: recorded, closes nothing.
    let resolved = alertmanager(group, "resolved", &[("a1b2", "resolved")]);
    let (st, r) = post(&h, "/v1/alerts/alertmanager", &resolved).await;
    assert_eq!(st, StatusCode::OK, "{r}");
    let (_, one) = h.get(&format!("/internal/incidents/{id}")).await;
    assert_eq!(one["incident"]["status"], "open");
    let alerts = one["alerts"].as_array().unwrap();
    assert_eq!(alerts.len(), 2 * 7 + 1);
    assert_eq!(alerts.last().unwrap()["status"], "resolved");
    let (_, list) = h.get("/internal/incidents?environment=prod").await;
    assert_eq!(list["items"].as_array().unwrap().len(), 1);
    // A resolved-only group never opens an incident.
    let (st, r) = post(
        &h,
        "/v1/alerts/alertmanager",
        &alertmanager("{}:{other}", "resolved", &[("e5", "resolved")]),
    )
    .await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(r["items"][0]["incident"], Value::Null);
    let (_, list) = h.get("/internal/incidents").await;
    assert_eq!(list["items"].as_array().unwrap().len(), 1);
    // Only version 4.
    let mut v3 = msg.clone();
    v3["version"] = json!("3");
    let (st, e) = post(&h, "/v1/alerts/alertmanager", &v3).await;
    assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(e["error"]["field"], "version");
    std::sync::Arc::into_inner(h).unwrap().finish().await;
}

on_both_backends!(alertmanager_groups_open_or_join_one_incident);
