//! `GET /internal/bundles`: the evidence bundle a responder triages an
//! incident with, anchored at an incident, a change or a finding (seed 000,
//! `get_evidence_bundle`), assembled from the store's own routes (in
//! process, with the caller's credentials) and fitted to a token budget
//! ([`pstack_store_core::bundle::fit`]). The seed's four sections sit at
//! `bundle.autosre` (`faultLocus`, `candidateChanges`,
//! `contentionCandidates`, `priorFindings`); `handoffs`, the anchor and the
//! budget accounting at the top level.
//!
//! Invariants: authenticated before anything is read; exactly one anchor;
//! never a grant token; every handoff carries the envelope's canonical URI,
//! its observation time, its expiry (freshness per subject kind) and the
//! first missing transition and next legal action of the envelope's
//! handoff; an anchor that does not exist is a 404 naming it, never an
//! empty bundle.

#![allow(
    clippy::result_large_err,
    reason = "the error is the HTTP response itself, built once on the way out"
)]

use crate::api::query::{BundleQuery, QueryParams};
use std::collections::{BTreeMap, BTreeSet};

use axum::body::Body;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, Request, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::{Map, Value, json};
use tower::ServiceExt;

use crate::http::error::{Reply, err, store_err};
use crate::http::extract::{auth, bad_query, only_params};
use crate::http::{AppState, Scope};
use pstack_store_core::analysis::ledger::rfc3339;
use pstack_store_core::bundle::{Section, fit};

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

/// What a bundle is anchored at (one of the query's `incident`, `change`,
/// `finding`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Anchor {
    /// An incident: its findings, its fault locus.
    Incident(String),
    /// A change: it is the first candidate; the locus is its service.
    Change(String),
    /// A finding: its incident (if any) and its fault locus.
    Finding(String),
}

impl Anchor {
    /// The query parameter (and `anchor.kind`).
    pub fn kind(&self) -> &'static str {
        match self {
            Anchor::Incident(_) => "incident",
            Anchor::Change(_) => "change",
            Anchor::Finding(_) => "finding",
        }
    }

    /// The anchored id.
    pub fn id(&self) -> &str {
        match self {
            Anchor::Incident(id) | Anchor::Change(id) | Anchor::Finding(id) => id,
        }
    }
}

/// Ids the bundle looks up: what the store mints (`inc_…`, `chg_…`,
/// `fnd_…`), so an id is a path segment as it is.
fn id_like(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 128
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// The anchor of a bundle query: exactly one of `incident`, `change`,
/// `finding`, each an id.
pub fn anchor_of(q: &BTreeMap<String, String>) -> Result<Anchor, Response> {
    let given: Vec<(&str, &String)> = ["incident", "change", "finding"]
        .into_iter()
        .filter_map(|k| q.get(k).map(|v| (k, v)))
        .collect();
    let [(kind, id)] = given.as_slice() else {
        let field = given.get(1).map_or("incident", |g| g.0);
        return Err(bad_query(
            field,
            "exactly one anchor: incident=inc_…, change=chg_… or finding=fnd_…",
        ));
    };
    if !id_like(id) {
        return Err(bad_query(kind, "an id (1-128 letters, digits, _ or -)"));
    }
    Ok(match *kind {
        "incident" => Anchor::Incident(id.to_string()),
        "change" => Anchor::Change(id.to_string()),
        _ => Anchor::Finding(id.to_string()),
    })
}

async fn get_bundle(
    State(state): State<AppState>,
    headers: HeaderMap,
    Query(q): Query<BTreeMap<String, String>>,
) -> Reply {
    auth(&state, &headers, Scope::Read).await?;
    only_params(&q, BundleQuery::PARAMS)?;
    match q.get("intent").map(String::as_str) {
        None | Some("triage_incident") => {}
        _ => return Err(bad_query("intent", "intent is triage_incident")),
    }
    let anchor = anchor_of(&q)?;
    let budget = match q.get("budgetTokens") {
        None => DEFAULT_BUDGET_TOKENS,
        Some(b) => b
            .parse::<usize>()
            .ok()
            .filter(|b| (100..=1_000_000).contains(b))
            .ok_or_else(|| bad_query("budgetTokens", "an integer from 100 to 1000000"))?,
    };
    let bundle = assemble(&state, headers.get(header::AUTHORIZATION), &anchor, budget).await?;
    Ok(Json(bundle).into_response())
}

fn not_found(code: &str, what: &str, field: &str) -> Response {
    err(
        StatusCode::NOT_FOUND,
        code,
        format!("no such {what}"),
        Some(field),
    )
}

fn query_enc(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b == b'-' || b == b'_' {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// What an anchor resolves to before the sections are gathered.
struct Context {
    /// The incident (anchored, or the anchored finding's).
    incident: Option<Value>,
    /// The findings the bundle is about: the incident's, the anchored one
    /// first.
    findings: Vec<Value>,
    environment: String,
    /// The fault locus entity and where it was read.
    locus: Option<(String, &'static str)>,
    /// Changes to rank first (the anchor, those findings name).
    named: Vec<String>,
}

async fn resolve(
    api: &Router,
    authz: Option<&axum::http::HeaderValue>,
    anchor: &Anchor,
) -> Result<Context, Response> {
    let incident_detail =
        |id: String| async move { call(api, authz, &format!("/internal/incidents/{id}")).await };
    let locus_of = |v: &Value, from: &'static str| {
        v["faultLocusEntityId"]
            .as_str()
            .filter(|e| !e.is_empty())
            .map(|e| (e.to_string(), from))
    };
    let mut ctx = match anchor {
        Anchor::Incident(id) => {
            let detail = incident_detail(id.clone())
                .await
                .ok_or_else(|| not_found("incident_not_found", "incident", "incident"))?;
            let inc = detail["incident"].clone();
            Context {
                environment: inc["environment"].as_str().unwrap_or_default().into(),
                locus: locus_of(&inc, "incident"),
                findings: detail["findings"].as_array().cloned().unwrap_or_default(),
                incident: Some(inc),
                named: Vec::new(),
            }
        }
        Anchor::Finding(id) => {
            let f = call(api, authz, &format!("/internal/findings/{id}"))
                .await
                .ok_or_else(|| not_found("finding_not_found", "finding", "finding"))?;
            let detail = match f["incidentId"].as_str().filter(|i| id_like(i)) {
                Some(i) => incident_detail(i.to_string()).await,
                None => None,
            };
            let mut findings = vec![f.clone()];
            if let Some(d) = &detail {
                findings.extend(
                    d["findings"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter(|g| g["id"] != f["id"])
                        .cloned(),
                );
            }
            let incident = detail.map(|d| d["incident"].clone());
            Context {
                environment: f["environment"].as_str().unwrap_or_default().into(),
                locus: locus_of(&f, "finding")
                    .or_else(|| incident.as_ref().and_then(|i| locus_of(i, "incident"))),
                findings,
                incident,
                named: Vec::new(),
            }
        }
        Anchor::Change(id) => {
            let c = call(api, authz, &format!("/v1/changes/{id}"))
                .await
                .ok_or_else(|| not_found("change_not_found", "change", "change"))?;
            // A change's locus is the service it changed: the store's
            // entity id for a service (a finding's fallback names it so).
            let locus = c["service"]
                .as_str()
                .filter(|s| !s.is_empty())
                .map(|s| (s.to_string(), "change"));
            Context {
                environment: c["environment"].as_str().unwrap_or_default().into(),
                locus,
                findings: Vec::new(),
                incident: None,
                named: vec![id.clone()],
            }
        }
    };
    for f in &ctx.findings {
        if let Some(c) = f["contributingChangeId"].as_str()
            && !ctx.named.iter().any(|n| n == c)
        {
            ctx.named.push(c.to_string());
        }
    }
    Ok(ctx)
}

/// Assemble and fit the bundle anchored at `anchor`.
pub async fn assemble(
    state: &AppState,
    authz: Option<&axum::http::HeaderValue>,
    anchor: &Anchor,
    budget: usize,
) -> Result<Value, Response> {
    let api = crate::http::api_router(state.clone());
    let ctx = resolve(&api, authz, anchor).await?;
    // Candidate changes: the environment's recent changes, the named ones
    // (the anchor, those a finding names) first, each with its blast
    // radius; a named change older than the recent ones is fetched.
    let env_q = query_enc(&ctx.environment);
    let mut changes = call(
        &api,
        authz,
        &format!("/v1/changes?environment={env_q}&limit={MAX_CHANGES}"),
    )
    .await
    .and_then(|v| v["items"].as_array().cloned())
    .unwrap_or_default();
    for n in ctx.named.iter().rev() {
        if let Some(i) = changes.iter().position(|c| c["id"] == n.as_str()) {
            let c = changes.remove(i);
            changes.insert(0, c);
        } else if id_like(n)
            && let Some(c) = call(&api, authz, &format!("/v1/changes/{n}")).await
        {
            changes.insert(0, c);
        }
    }
    let mut candidates = Vec::new();
    for c in changes {
        let id = c["id"].as_str().unwrap_or_default().to_string();
        let radius = if id_like(&id) {
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
    // Prior findings, other incidents only (and never the bundle's own
    // findings): by each finding's recurrence fingerprint first, then by
    // fault locus entity (the bundle's locus and its findings'); a finding
    // both match is listed once, as `fingerprint`.
    let mut lookups: Vec<(&str, String)> = Vec::new();
    for f in &ctx.findings {
        if let Some(fp) = f["fingerprint"].as_str().filter(|fp| id_like(fp)) {
            lookups.push(("fingerprint", format!("fingerprint={fp}")));
        }
    }
    let mut entities = BTreeSet::new();
    for e in ctx
        .locus
        .iter()
        .map(|(e, _)| e.as_str())
        .chain(
            ctx.findings
                .iter()
                .filter_map(|f| f["faultLocusEntityId"].as_str()),
        )
        .filter(|e| !e.is_empty() && e.len() <= 256)
    {
        if entities.insert(e) {
            lookups.push(("entity", format!("faultLocusEntityId={}", query_enc(e))));
        }
    }
    let own: BTreeSet<&str> = ctx
        .findings
        .iter()
        .filter_map(|f| f["id"].as_str())
        .collect();
    let incident_id = ctx.incident.as_ref().map(|i| i["id"].clone());
    let mut prior = Vec::new();
    let mut seen = BTreeSet::new();
    for (matched_by, q) in lookups {
        if let Some(v) = call(&api, authz, &format!("/internal/findings?{q}&limit=20")).await {
            for p in v["items"].as_array().cloned().unwrap_or_default() {
                let id = p["id"].as_str().unwrap_or_default().to_string();
                let same_incident = incident_id.as_ref().is_some_and(|i| p["incidentId"] == *i);
                if !same_incident && !own.contains(id.as_str()) && seen.insert(id) {
                    prior.push(json!({"matchedBy": matched_by, "finding": p}));
                }
            }
        }
    }
    // Handoffs of the pstack subjects the findings cite.
    let mut digests = BTreeSet::new();
    for f in &ctx.findings {
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
    header.insert(
        "anchor".into(),
        json!({"kind": anchor.kind(), "id": anchor.id()}),
    );
    header.insert(
        "incident".into(),
        ctx.incident.as_ref().map_or(Value::Null, |inc| {
            json!({"id": inc["id"], "title": inc["title"], "environment": inc["environment"], "status": inc["status"]})
        }),
    );
    header.insert("environment".into(), json!(ctx.environment));
    let locus = ctx.locus.as_ref().map_or(
        Value::Null,
        |(e, from)| json!({"entityId": e, "source": from}),
    );
    header.insert("bundle".into(), json!({"autosre": {"faultLocus": locus}}));
    const AUTOSRE: &[&str] = &["bundle", "autosre"];
    let sections = vec![
        Section {
            name: "handoffs",
            parent: &[],
            items: handoffs,
        },
        Section {
            name: "candidateChanges",
            parent: AUTOSRE,
            items: candidates,
        },
        Section {
            name: "priorFindings",
            parent: AUTOSRE,
            items: prior,
        },
        Section {
            name: "contentionCandidates",
            parent: AUTOSRE,
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
