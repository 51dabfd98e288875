//! `GET /internal/bundles`: the evidence bundle a responder triages an
//! incident with, assembled from the store's own routes (in process, with
//! the caller's credentials) and fitted to a token budget
//! ([`crate::bundle::fit`]).
//!
//! Invariants: authenticated before anything is read; never a grant
//! token; every handoff carries the envelope's canonical URI, its
//! observation time, its expiry (freshness per subject kind) and the first
//! missing transition and next legal action of the envelope's handoff.

#![allow(
    clippy::result_large_err,
    reason = "the error is the HTTP response itself, built once on the way out"
)]

use crate::query_params::{BundleQuery, QueryParams};
use std::collections::{BTreeMap, BTreeSet};

use axum::body::Body;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, Request, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::{Map, Value, json};
use tower::ServiceExt;

use crate::analysis::ledger::rfc3339;
use crate::bundle::{Section, fit};
use crate::http::{AppState, Scope};
use crate::http_analysis::{Reply, auth, bad_query, err, only_params, store_err};

/// Default budget.
pub const DEFAULT_BUDGET_TOKENS: usize = 4000;
/// Candidate changes considered.
const MAX_CHANGES: usize = 50;

/// The routes.
pub fn routes() -> Router<AppState> {
    Router::new().route("/internal/bundles", get(get_bundle))
}

async fn call(api: &Router, auth: Option<&axum::http::HeaderValue>, path: &str) -> Option<Value> {
    let mut req = Request::builder().uri(path);
    if let Some(a) = auth {
        req = req.header(header::AUTHORIZATION, a);
    }
    let resp = api
        .clone()
        .oneshot(req.body(Body::empty()).ok()?)
        .await
        .ok()?;
    if !resp.status().is_success() {
        return None;
    }
    let bytes = axum::body::to_bytes(resp.into_body(), 16 << 20)
        .await
        .ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// A handoff an agent can act on alone.
pub async fn actionable_handoff(state: &AppState, digest: &str) -> Result<Option<Value>, Response> {
    let Some(env) = state.store.envelope(digest).await.map_err(store_err)? else {
        return Ok(None);
    };
    let Some((_, kind, wall_ns)) = state
        .store
        .envelope_subject(digest)
        .await
        .map_err(store_err)?
    else {
        return Ok(None);
    };
    let h = pstack_envelope::handoff(&env);
    let h = serde_json::to_value(&h).unwrap_or(Value::Null);
    let expires = state.freshness.expires_ns(&kind, wall_ns);
    Ok(Some(json!({
        "uri": format!("/v1/envelopes/{digest}"),
        "digest": digest,
        "subjectKind": kind,
        "observedAt": rfc3339(wall_ns),
        "expiresAt": rfc3339(expires),
        "expired": state.clock.now_ns() >= expires,
        "completeness": h["completeness"],
        "firstMissingTransition": h.get("frontier").cloned().unwrap_or(Value::Null),
        "nextLegalAction": h["next_transition"],
        "openUnknowns": h["open_unknowns"],
        "hypotheses": h["hypotheses"],
    })))
}

async fn get_bundle(
    State(state): State<AppState>,
    headers: HeaderMap,
    Query(q): Query<BTreeMap<String, String>>,
) -> Reply {
    auth(&state, &headers, Scope::Read).await?;
    only_params(&q, BundleQuery::PARAMS)?;
    match q.get("intent").map(String::as_str) {
        Some("triage_incident") => {}
        _ => return Err(bad_query("intent", "intent is triage_incident")),
    }
    let Some(incident) = q
        .get("incident")
        .filter(|s| !s.is_empty() && s.len() <= 128)
    else {
        return Err(bad_query("incident", "required: an incident id"));
    };
    let budget = match q.get("budgetTokens") {
        None => DEFAULT_BUDGET_TOKENS,
        Some(b) => b
            .parse::<usize>()
            .ok()
            .filter(|b| (100..=1_000_000).contains(b))
            .ok_or_else(|| bad_query("budgetTokens", "an integer from 100 to 1000000"))?,
    };
    let bundle = assemble(&state, headers.get(header::AUTHORIZATION), incident, budget).await?;
    Ok(Json(bundle).into_response())
}

/// Assemble and fit the bundle of `incident`.
pub async fn assemble(
    state: &AppState,
    authz: Option<&axum::http::HeaderValue>,
    incident: &str,
    budget: usize,
) -> Result<Value, Response> {
    let api = crate::http::api_router(state.clone());
    let enc = |s: &str| {
        s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    };
    if !enc(incident) {
        return Err(bad_query("incident", "an incident id"));
    }
    let Some(detail) = call(&api, authz, &format!("/internal/incidents/{incident}")).await else {
        return Err(err(
            StatusCode::NOT_FOUND,
            "incident_not_found",
            "no such incident",
            Some("incident"),
        ));
    };
    let inc = &detail["incident"];
    let env = inc["environment"].as_str().unwrap_or_default();
    let findings = detail["findings"].as_array().cloned().unwrap_or_default();
    // Candidate changes: the environment's recent changes, those a finding
    // names first, each with its blast radius.
    let named: BTreeSet<String> = findings
        .iter()
        .filter_map(|f| f["contributingChangeId"].as_str().map(String::from))
        .collect();
    let query_enc = |s: &str| -> String {
        s.bytes()
            .map(|b| {
                if b.is_ascii_alphanumeric() || b == b'-' || b == b'_' {
                    (b as char).to_string()
                } else {
                    format!("%{b:02X}")
                }
            })
            .collect()
    };
    let env_q = query_enc(env);
    let changes = call(
        &api,
        authz,
        &format!("/v1/changes?environment={env_q}&limit={MAX_CHANGES}"),
    )
    .await
    .and_then(|v| v["items"].as_array().cloned())
    .unwrap_or_default();
    let mut ranked: Vec<Value> = changes;
    ranked.sort_by_key(|c| !named.contains(c["id"].as_str().unwrap_or_default()));
    let mut candidates = Vec::new();
    for c in ranked {
        let id = c["id"].as_str().unwrap_or_default().to_string();
        let radius = if enc(&id) {
            call(&api, authz, &format!("/internal/changes/{id}/blast-radius")).await
        } else {
            None
        };
        candidates.push(json!({"change": c, "blastRadius": radius}));
    }
    // Contention candidates: the shared resources (database, queue) a
    // candidate change's new version amplified calls into while the old
    // version failed on them too — the blast radius's contention join
    // (`sharedResourceAggressors`), each named with its change and verdict.
    let mut contention = Vec::new();
    for c in &candidates {
        let radius = &c["blastRadius"];
        for a in radius["sharedResourceAggressors"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let mut item = a.clone();
            if let Some(o) = item.as_object_mut() {
                o.insert("changeId".into(), c["change"]["id"].clone());
                o.insert("changeVerdict".into(), radius["verdict"].clone());
            }
            contention.push(item);
        }
    }
    // Prior findings, other incidents only: by each finding's recurrence
    // fingerprint first, then by fault locus entity (the incident's and its
    // findings'); a finding both match is listed once, as `fingerprint`.
    let mut lookups: Vec<(&str, String)> = Vec::new();
    for f in &findings {
        if let Some(fp) = f["fingerprint"].as_str().filter(|fp| enc(fp)) {
            lookups.push(("fingerprint", format!("fingerprint={fp}")));
        }
    }
    let mut entities = BTreeSet::new();
    for e in std::iter::once(&inc["faultLocusEntityId"])
        .chain(findings.iter().map(|f| &f["faultLocusEntityId"]))
        .filter_map(Value::as_str)
        .filter(|e| !e.is_empty() && e.len() <= 256)
    {
        if entities.insert(e) {
            lookups.push(("entity", format!("faultLocusEntityId={}", query_enc(e))));
        }
    }
    let mut prior = Vec::new();
    let mut seen = BTreeSet::new();
    for (matched_by, q) in lookups {
        if let Some(v) = call(&api, authz, &format!("/internal/findings?{q}&limit=20")).await {
            for p in v["items"].as_array().cloned().unwrap_or_default() {
                let id = p["id"].as_str().unwrap_or_default().to_string();
                if p["incidentId"] != inc["id"] && seen.insert(id) {
                    prior.push(json!({"matchedBy": matched_by, "finding": p}));
                }
            }
        }
    }
    // Handoffs of the pstack subjects the findings cite.
    let mut digests = BTreeSet::new();
    for f in &findings {
        for d in f["citedEvidenceIds"]
            .as_array()
            .cloned()
            .unwrap_or_default()
        {
            if let Some(d) = d.as_str().filter(|d| d.starts_with("sha256:")) {
                digests.insert(d.to_string());
            }
        }
    }
    let mut handoffs = Vec::new();
    for d in digests {
        if let Some(h) = actionable_handoff(state, &d).await? {
            handoffs.push(h);
        }
    }
    let mut header = Map::new();
    header.insert("schema".into(), json!("pstack.bundle/v1"));
    header.insert("intent".into(), json!("triage_incident"));
    header.insert("incident".into(), json!({"id": inc["id"], "title": inc["title"], "environment": inc["environment"], "status": inc["status"]}));
    header.insert("faultLocus".into(), inc["faultLocusEntityId"].clone());
    let sections = vec![
        Section {
            name: "handoffs",
            items: handoffs,
        },
        Section {
            name: "candidateChanges",
            items: candidates,
        },
        Section {
            name: "priorFindings",
            items: prior,
        },
        Section {
            name: "contentionCandidates",
            items: contention,
        },
    ];
    fit(header, sections, budget).ok_or_else(|| {
        err(
            StatusCode::UNPROCESSABLE_ENTITY,
            "budget_too_small",
            "not even the bundle's header fits this budget",
            Some("budgetTokens"),
        )
    })
}
