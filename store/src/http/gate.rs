//! HTTP routes of the remediation gate (seed 000, scenario 5): incidents
//! and leases, Alertmanager alerts, proposals, grants, approval, the
//! watchdog.
//!
//! Invariants:
//! - Every route authenticates with the API key before it reads a body.
//! - A grant token appears in exactly one response: the one that minted it
//!   (an autonomous `propose`, or `approve`). No GET, list, replay, log
//!   line or metric carries it; proposals serialize through
//!   [`proposal_json`], which has no field for it.
//! - Errors are `{"error": {"code", "message", "field"?}}`: 403 policy or
//!   wrong token, 404 absent, 409 conflict with the current state, 410 a
//!   window passed, 422 a precondition (evidence) missing, 429 circuit
//!   breaker.
//! - Time comes from `AppState::clock` only.
//! - A webhook failure never undoes an approval or a grant.

#![allow(
    clippy::result_large_err,
    reason = "the error is the HTTP response itself, built once on the way out"
)]

use crate::api::bodies::{IncidentRequest, ProposeRequest};
use crate::api::query::{IncidentsQuery, QueryParams};
use std::collections::BTreeMap;

use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::http::analysis::finding_json;
use crate::http::error::{Reply, err, store_err, unprocessable};
use crate::http::extract::{auth, bad_query, json_body, limit_param, only_params, optional_body};
use crate::http::{ApiError, AppState, Scope};
use crate::webhook::{self, Callback, Delivery};
use pstack_store_core::analysis::ledger::rfc3339;
use pstack_store_core::db::analysis::new_id;
use pstack_store_core::db::gate::{
    Fence, FenceRefusal, Finish, IncidentRow, LeaseOutcome, NewIncident, ProposalFilter,
    ProposalRow, ProposeOutcome, Transition,
};
use pstack_store_core::gate::policy::{self, Status};
use pstack_store_core::gate::provenance;
use pstack_store_core::gate::{admission, grant};
use pstack_store_core::gate::{alertmanager, watchdog};

/// Default lease length.
const DEFAULT_LEASE_NS: i64 = 60_000_000_000;
/// Longest lease a runner may ask for.
const MAX_LEASE_NS: i64 = 3_600_000_000_000;

/// The gate routes (merged into [`crate::http::api_router`]).
pub fn routes() -> Router<AppState> {
    Router::new()
        .route(
            "/internal/incidents",
            post(post_incident).get(get_incidents),
        )
        .route("/internal/incidents/{id}", get(get_incident))
        .route("/internal/incidents/{id}/lease", post(post_lease))
        .route("/internal/incidents/{id}/resolve", post(post_resolve))
        .route("/internal/remediations", get(get_proposals))
        .route("/internal/remediations/propose", post(post_propose))
        .route("/internal/remediations/watchdog", post(post_watchdog))
        .route("/internal/remediations/{id}", get(get_proposal))
        .route("/internal/remediations/{id}/grant", post(post_grant))
        .route("/internal/remediations/{id}/approve", post(post_approve))
        .route("/internal/remediations/{id}/reject", post(post_reject))
        .route("/v1/alerts/alertmanager", post(post_alertmanager))
}

fn opt_time(ns: Option<i64>) -> Value {
    ns.map_or(Value::Null, |n| json!(rfc3339(n)))
}

fn text_field(field: &str, v: &str) -> Result<(), Response> {
    admission::text_field(field, v).map_err(refused)
}

/// An admission refusal as the route answers it (422).
fn refused(r: admission::Refusal) -> Response {
    unprocessable(r.code, r.message, &r.field)
}

// ---- incidents ----

fn incident_json(i: &IncidentRow) -> Value {
    json!({
        "id": i.id,
        "project": i.project_id,
        "environment": i.environment,
        "dedupKey": i.dedup_key,
        "title": i.title,
        "faultLocusEntityId": i.fault_locus_entity_id,
        "status": i.status,
        "lease": i.lease_runner_id.as_ref().map(|r| json!({
            "runnerId": r,
            "fencingToken": i.fencing_token,
            "expiresAt": opt_time(i.lease_expires_ns),
        })),
        "fencingToken": i.fencing_token,
        "alertCount": i.alert_count,
        "createdAt": rfc3339(i.created_ns),
        "updatedAt": rfc3339(i.updated_ns),
    })
}

async fn post_incident(State(state): State<AppState>, headers: HeaderMap, body: Body) -> Reply {
    let key_id = auth(&state, &headers, Scope::Analysis).await?;
    let req: IncidentRequest = json_body(body, "invalid_incident").await?;
    for (f, v) in [
        ("project", &req.project),
        ("environment", &req.environment),
        ("dedupKey", &req.dedup_key),
        ("title", &req.title),
    ] {
        text_field(f, v)?;
    }
    let n = NewIncident {
        project_id: req.project,
        environment: req.environment,
        dedup_key: req.dedup_key,
        title: req.title,
        fault_locus_entity_id: req.fault_locus_entity_id,
    };
    let (inc, dedup) = state
        .store
        .open_incident(&n, &key_id, state.clock.now_ns())
        .await
        .map_err(store_err)?;
    let status = if dedup {
        StatusCode::OK
    } else {
        StatusCode::CREATED
    };
    Ok((
        status,
        Json(json!({"incident": incident_json(&inc), "deduplicated": dedup})),
    )
        .into_response())
}

async fn get_incidents(
    State(state): State<AppState>,
    headers: HeaderMap,
    Query(params): Query<BTreeMap<String, String>>,
) -> Reply {
    auth(&state, &headers, Scope::Read).await?;
    only_params(&params, IncidentsQuery::PARAMS)?;
    if let Some(s) = params.get("status")
        && !["open", "leased", "resolved"].contains(&s.as_str())
    {
        return Err(bad_query("status", "status is open, leased or resolved"));
    }
    let limit = limit_param(&params, 50)?;
    let items: Vec<Value> = state
        .store
        .incidents(
            params.get("environment").map(String::as_str),
            params.get("status").map(String::as_str),
            limit,
        )
        .await
        .map_err(store_err)?
        .iter()
        .map(incident_json)
        .collect();
    Ok(Json(json!({"items": items})).into_response())
}

fn incident_not_found(id: &str) -> Response {
    err(
        StatusCode::NOT_FOUND,
        "incident_not_found",
        format!("no incident {id}"),
        None,
    )
}

async fn get_incident(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Reply {
    auth(&state, &headers, Scope::Read).await?;
    let Some(inc) = state.store.incident(&id).await.map_err(store_err)? else {
        return Err(incident_not_found(&id));
    };
    let mut findings = Vec::new();
    for fid in state
        .store
        .incident_finding_ids(&id)
        .await
        .map_err(store_err)?
    {
        if let Some(f) = state.store.finding(&fid).await.map_err(store_err)? {
            findings.push(finding_json(&f));
        }
    }
    let proposals: Vec<Value> = state
        .store
        .proposals(&ProposalFilter {
            incident_id: Some(id.clone()),
            status: None,
            limit: 1000,
        })
        .await
        .map_err(store_err)?
        .iter()
        .map(proposal_json)
        .collect();
    let alerts: Vec<Value> = state
        .store
        .incident_alerts(&id)
        .await
        .map_err(store_err)?
        .into_iter()
        .map(|(fp, st, at)| json!({"fingerprint": fp, "status": st, "receivedAt": rfc3339(at)}))
        .collect();
    Ok(Json(json!({
        "incident": incident_json(&inc),
        "findings": findings,
        "proposals": proposals,
        "alerts": alerts,
    }))
    .into_response())
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct LeaseRequest {
    runner_id: String,
    #[serde(default)]
    operation: Option<String>,
    #[serde(default)]
    fencing_token: Option<i64>,
    #[serde(default)]
    ttl_seconds: Option<i64>,
}

fn fence_refused(r: FenceRefusal) -> Response {
    match r {
        FenceRefusal::NoIncident => err(
            StatusCode::UNPROCESSABLE_ENTITY,
            "unknown_incident",
            "no such incident",
            Some("incidentId"),
        ),
        FenceRefusal::Resolved => err(
            StatusCode::CONFLICT,
            "incident_resolved",
            "the incident is resolved",
            None,
        ),
        FenceRefusal::LeaseHeld { holder, current } => err(
            StatusCode::CONFLICT,
            "lease_held",
            format!(
                "runner {holder:?} holds the incident's lease (fencing token {current}); present it as runnerId + fencingToken"
            ),
            Some("fencingToken"),
        ),
        FenceRefusal::Stale { presented, current } => err(
            StatusCode::CONFLICT,
            "stale_fencing_token",
            format!(
                "fencing token {presented} is not the incident's current lease (token {current})"
            ),
            Some("fencingToken"),
        ),
    }
}

async fn post_lease(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Body,
) -> Reply {
    auth(&state, &headers, Scope::Analysis).await?;
    let req: LeaseRequest = json_body(body, "invalid_lease").await?;
    text_field("runnerId", &req.runner_id)?;
    let ttl = match req.ttl_seconds {
        None => DEFAULT_LEASE_NS,
        Some(s) if (1..=MAX_LEASE_NS / 1_000_000_000).contains(&s) => s * 1_000_000_000,
        Some(_) => {
            return Err(unprocessable(
                "invalid_lease",
                "ttlSeconds is 1..=3600",
                "ttlSeconds",
            ));
        }
    };
    let now = state.clock.now_ns();
    let op = req.operation.as_deref().unwrap_or("acquire");
    let need_token = || {
        req.fencing_token.ok_or_else(|| {
            unprocessable(
                "invalid_lease",
                "renew and release present the fencing token",
                "fencingToken",
            )
        })
    };
    let outcome = match op {
        "acquire" => {
            state
                .store
                .acquire_lease(&id, &req.runner_id, ttl, now)
                .await
        }
        "renew" => {
            let t = need_token()?;
            state
                .store
                .renew_lease(&id, &req.runner_id, t, ttl, now)
                .await
        }
        "release" => {
            let t = need_token()?;
            state.store.release_lease(&id, &req.runner_id, t, now).await
        }
        other => {
            return Err(unprocessable(
                "invalid_lease",
                format!("operation {other:?} is acquire, renew or release"),
                "operation",
            ));
        }
    }
    .map_err(store_err)?;
    match outcome {
        LeaseOutcome::Ok(inc) => {
            tracing::info!(incident = %inc.id, runner = %pstack_store_core::logsafe::text(&req.runner_id), op, fencing_token = inc.fencing_token, "incident lease");
            Ok(Json(json!({
                "incident": incident_json(&inc),
                "lease": {
                    "runnerId": inc.lease_runner_id,
                    "fencingToken": inc.fencing_token,
                    "expiresAt": opt_time(inc.lease_expires_ns),
                },
            }))
            .into_response())
        }
        LeaseOutcome::NotFound => Err(incident_not_found(&id)),
        LeaseOutcome::Resolved(_) => Err(fence_refused(FenceRefusal::Resolved)),
        LeaseOutcome::Refused(inc) => {
            let live = inc.status == "leased" && inc.lease_expires_ns.is_some_and(|e| e > now);
            if op == "acquire" {
                Err(fence_refused(FenceRefusal::LeaseHeld {
                    holder: inc.lease_runner_id.unwrap_or_default(),
                    current: inc.fencing_token,
                }))
            } else if !live && req.fencing_token == Some(inc.fencing_token) {
                Err(err(
                    StatusCode::GONE,
                    "lease_expired",
                    "the lease expired; acquire it again (a new fencing token)",
                    None,
                ))
            } else {
                Err(fence_refused(FenceRefusal::Stale {
                    presented: req.fencing_token.unwrap_or(0),
                    current: inc.fencing_token,
                }))
            }
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct FenceBody {
    #[serde(default)]
    runner_id: Option<String>,
    #[serde(default)]
    fencing_token: Option<i64>,
}

async fn post_resolve(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Body,
) -> Reply {
    auth(&state, &headers, Scope::Analysis).await?;
    let req: FenceBody = json_body(body, "invalid_resolve").await?;
    let fence = Fence {
        runner_id: req.runner_id,
        fencing_token: req.fencing_token,
    };
    match state
        .store
        .resolve_incident(&id, &fence, state.clock.now_ns())
        .await
        .map_err(store_err)?
    {
        Ok(inc) => Ok(Json(json!({"incident": incident_json(&inc)})).into_response()),
        Err(FenceRefusal::NoIncident) => Err(incident_not_found(&id)),
        Err(r) => Err(fence_refused(r)),
    }
}

// ---- alerts ----

async fn post_alertmanager(State(state): State<AppState>, headers: HeaderMap, body: Body) -> Reply {
    let key_id = auth(&state, &headers, Scope::Telemetry).await?;
    let msg: alertmanager::Message = json_body(body, "invalid_alertmanager_payload").await?;
    let opens = alertmanager::incidents_of(&msg).map_err(|e| {
        err(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_alertmanager_payload",
            e.message,
            Some(&e.field),
        )
    })?;
    let now = state.clock.now_ns();
    let mut out = Vec::new();
    for o in opens {
        let found = if o.firing {
            let (inc, dedup) = state
                .store
                .open_incident(&o.incident, &key_id, now)
                .await
                .map_err(store_err)?;
            Some((inc, dedup))
        } else {
            // Resolved alone: recorded on the active incident, never opens one.
            state
                .store
                .active_incident(&o.incident)
                .await
                .map_err(store_err)?
                .map(|i| (i, true))
        };
        let Some((inc, dedup)) = found else {
            out.push(json!({"incident": null, "deduplicated": false, "alerts": 0, "unmatchedResolved": o.alerts.len()}));
            continue;
        };
        for a in &o.alerts {
            state
                .store
                .record_alert(&inc.id, a, now)
                .await
                .map_err(store_err)?;
        }
        out.push(json!({"incident": incident_json(&inc), "deduplicated": dedup, "alerts": o.alerts.len()}));
    }
    Ok(Json(json!({"items": out})).into_response())
}

// ---- proposals ----

/// A proposal as every route shows it. It has no field for a token, the
/// grant hash, or the stored callback's URL or secret.
pub fn proposal_json(p: &ProposalRow) -> Value {
    json!({
        "id": p.id,
        "incidentId": p.incident_id,
        "findingId": p.finding_id,
        "action": p.action,
        "target": p.target,
        "expectedCurrentState": p.expected_state,
        "requestedAutonomy": p.requested_autonomy,
        "effectiveAutonomy": p.effective_autonomy,
        "causalProofTier": p.causal_proof_tier,
        "fingerprint": p.fingerprint,
        "status": p.status,
        "idempotencyKey": p.idempotency_key,
        "preMutationEnvelope": p.pre_mutation_envelope,
        "grantIssuedAt": opt_time(p.grant_issued_ns),
        "grantExpiresAt": opt_time(p.grant_expires_ns),
        "runnerId": p.runner_id,
        "claimedAt": opt_time(p.claimed_ns),
        "executionDeadline": opt_time(p.execution_deadline_ns),
        "finishedAt": opt_time(p.finished_ns),
        "outcome": p.outcome,
        "callbackHost": p.callback_host,
        "callbackDelivery": p.callback_delivery,
        "recoveryStatus": p.recovery_status,
        "causalVerificationStatus": p.causal_verification_status,
        "decidedBy": p.decided_by,
        "createdAt": rfc3339(p.created_ns),
        "updatedAt": rfc3339(p.updated_ns),
    })
}

/// `secret_field`: the secret's name in the request (`webhookSecret` at
/// propose, `secret` at approve), for the error.
fn validate_callback(
    url: Option<&String>,
    secret: Option<&String>,
    secret_field: &str,
) -> Result<Option<(Callback, String)>, admission::Refusal> {
    match (url, secret) {
        (None, None) => Ok(None),
        (None, Some(_)) => Err(admission::Refusal {
            code: "invalid_webhook",
            message: format!("{secret_field} needs webhookUrl"),
            field: secret_field.to_string(),
        }),
        (Some(u), s) => {
            let bad_url = |message: String| admission::Refusal {
                code: "invalid_webhook_url",
                message,
                field: "webhookUrl".to_string(),
            };
            let host = webhook::callback_host(u).map_err(|e| bad_url(e.to_string()))?;
            if u.len() > 2048 {
                return Err(bad_url("at most 2048 bytes".to_string()));
            }
            Ok(Some((
                Callback {
                    url: u.clone(),
                    secret: s.cloned().filter(|s| !s.is_empty()),
                },
                host,
            )))
        }
    }
}

async fn deliver_grant(
    state: &AppState,
    p: &ProposalRow,
    token: &str,
    cb: &Callback,
) -> Result<Delivery, Response> {
    let incident = state
        .store
        .incident(&p.incident_id)
        .await
        .map_err(store_err)?;
    let body = json!({
        "event": webhook::GRANT_EVENT,
        "proposalId": p.id,
        "status": p.status,
        "grantToken": token,
        "grantExpiresAt": opt_time(p.grant_expires_ns),
        "action": p.action,
        "target": p.target,
        "expectedCurrentState": p.expected_state,
        "incident": incident.as_ref().map(|i| json!({
            "id": i.id,
            "project": i.project_id,
            "environment": i.environment,
            "title": i.title,
            "dedupKey": i.dedup_key,
        })),
    });
    let bytes = serde_json::to_vec(&body).unwrap_or_default();
    let d = webhook::deliver(cb, &bytes, state.gate.allow_private_webhooks).await;
    record_delivery(state, p, d).await
}

/// Store a delivery's outcome on the proposal (`callbackDelivery`) and log it.
async fn record_delivery(
    state: &AppState,
    p: &ProposalRow,
    d: Delivery,
) -> Result<Delivery, Response> {
    let now = state.clock.now_ns();
    let stored = json!({
        "status": if d.delivered { "delivered" } else { "failed" },
        "attempts": d.attempts,
        "lastError": d.error,
        "at": rfc3339(now),
    });
    state
        .store
        .set_callback_delivery(&p.id, &stored, now)
        .await
        .map_err(store_err)?;
    tracing::info!(proposal = %p.id, host = %pstack_store_core::logsafe::text(&d.host), delivered = d.delivered, attempts = d.attempts, "grant webhook");
    Ok(d)
}

async fn post_propose(State(state): State<AppState>, headers: HeaderMap, body: Body) -> Reply {
    let key_id = auth(&state, &headers, Scope::Analysis).await?;
    let req: ProposeRequest = json_body(body, "invalid_proposal").await?;
    text_field("idempotencyKey", &req.idempotency_key)?;
    if let Some(existing) = state
        .store
        .proposal_by_key(&req.idempotency_key)
        .await
        .map_err(store_err)?
    {
        return Ok(replay(&existing));
    }
    let now = state.clock.now_ns();
    // Load what the admission rule reads ...
    let finding = state
        .store
        .finding(&req.finding_id)
        .await
        .map_err(store_err)?;
    let incident = state
        .store
        .incident(&req.incident_id)
        .await
        .map_err(store_err)?;
    let envelope = match req.pre_mutation_envelope.as_deref() {
        Some(d) => state.store.envelope_facts(d).await.map_err(store_err)?,
        None => None,
    };
    let tier_evidence = match &finding {
        Some(f) => Some(
            provenance::evidence(&state.store, f)
                .await
                .map_err(store_err)?,
        ),
        None => None,
    };
    // ... decide ...
    let plan = admission::propose(admission::ProposeReadings {
        action: &req.action,
        requested_autonomy: req.requested_autonomy.as_deref(),
        finding_id: &req.finding_id,
        finding: finding.as_ref(),
        incident_id: &req.incident_id,
        incident: incident.as_ref(),
        target: &req.target,
        expected_current_state: &req.expected_current_state,
        pre_mutation_envelope: req.pre_mutation_envelope.as_deref(),
        envelope: envelope.as_ref(),
        tier_evidence: tier_evidence.as_ref(),
        key_id: &key_id,
        callback: validate_callback(
            req.webhook_url.as_ref(),
            req.webhook_secret.as_ref(),
            "webhookSecret",
        ),
        freshness: &state.freshness,
        now_ns: now,
    })
    .map_err(refused)?;
    // ... persist ...
    let admission::ProposePlan {
        incident_id,
        finding_id,
        fingerprint,
        action,
        requested,
        target,
        tier,
        demotion,
        effective,
        status,
        callback,
    } = plan;
    if let Some(d) = &demotion {
        tracing::info!(finding = %finding_id, key_id = %key_id, finding_tier = d.finding_tier, gate_tier = d.gate_tier, "tier demoted at the gate: self-attested evidence");
    }
    let minted = if status == Status::GrantIssued {
        Some(state.gate.keys.mint_token().map_err(|e| {
            err(
                StatusCode::SERVICE_UNAVAILABLE,
                "random_unavailable",
                e.to_string(),
                None,
            )
        })?)
    } else {
        None
    };
    let (callback_sealed, callback_host) = match (&callback, status) {
        (Some((cb, host)), Status::PendingHumanApproval) => {
            let sealed = state
                .gate
                .keys
                .seal(&serde_json::to_vec(cb).unwrap_or_default())
                .map_err(|e| {
                    err(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "seal_failed",
                        e.to_string(),
                        None,
                    )
                })?;
            (Some(sealed), Some(host.clone()))
        }
        (Some((_, host)), Status::GrantIssued) => (None, Some(host.clone())),
        _ => (None, None),
    };
    let row = ProposalRow {
        id: new_id("rem").map_err(store_err)?,
        incident_id,
        finding_id,
        action: action.as_str().into(),
        target: req.target.clone(),
        target_key: target.key,
        expected_state: req.expected_current_state.clone(),
        requested_autonomy: requested.map(|a| a.as_str().to_string()),
        effective_autonomy: effective.as_str().into(),
        causal_proof_tier: tier.as_str().into(),
        fingerprint: fingerprint.clone(),
        status: status.as_str().into(),
        idempotency_key: req.idempotency_key.clone(),
        pre_mutation_envelope: req.pre_mutation_envelope.clone(),
        grant_hash: minted.as_ref().map(|(_, h)| h.clone()),
        grant_issued_ns: minted.as_ref().map(|_| now),
        grant_expires_ns: minted.as_ref().map(|_| now + policy::GRANT_CLAIM_WINDOW_NS),
        runner_id: None,
        claimed_ns: None,
        execution_deadline_ns: None,
        finished_ns: None,
        outcome: None,
        callback_sealed,
        callback_host,
        callback_delivery: None,
        recovery_status: None,
        causal_verification_status: None,
        decided_by: None,
        created_ns: now,
        updated_ns: now,
    };
    let fence = Fence {
        runner_id: req.runner_id.clone(),
        fencing_token: req.fencing_token,
    };
    let outcome = state
        .store
        .insert_proposal(&row, &fence, &key_id, now)
        .await
        .map_err(store_err)?;
    let p = match outcome {
        ProposeOutcome::Inserted(p) => p,
        ProposeOutcome::Replay(p) => return Ok(replay(&p)),
        ProposeOutcome::BreakerOpen { live } => {
            return Err(err(
                StatusCode::TOO_MANY_REQUESTS,
                "circuit_breaker_open",
                format!(
                    "{live} live {} proposals for finding fingerprint {} in the last hour; the circuit breaker allows {} (reject or let one expire to free a slot)",
                    action.as_str(),
                    fingerprint,
                    policy::BREAKER_LIMIT
                ),
                Some("action"),
            ));
        }
        ProposeOutcome::Fence(r) => return Err(fence_refused(r)),
    };
    tracing::info!(proposal = %p.id, action = %p.action, tier = %p.causal_proof_tier, effective = %p.effective_autonomy, status = %p.status, "remediation proposed");
    let mut delivery = None;
    if let (Some((token, _)), Some((cb, _))) = (&minted, &callback) {
        delivery = Some(deliver_grant(&state, &p, token, cb).await?);
    }
    let p = state
        .store
        .proposal(&p.id)
        .await
        .map_err(store_err)?
        .unwrap_or(p);
    let mut body = json!({
        "proposal": proposal_json(&p),
        "grantToken": minted.map(|(t, _)| t),
    });
    if let Some(d) = delivery {
        body["grantDelivery"] = json!(d);
    }
    if let Some(d) = demotion {
        body["tierDemotion"] = json!(d);
    }
    Ok((StatusCode::CREATED, Json(body)).into_response())
}

fn replay(p: &ProposalRow) -> Response {
    (
        StatusCode::OK,
        Json(json!({"proposal": proposal_json(p), "grantToken": null, "replayed": true})),
    )
        .into_response()
}

fn proposal_not_found(id: &str) -> Response {
    denied(grant::not_found(id))
}

async fn get_proposal(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Reply {
    auth(&state, &headers, Scope::Read).await?;
    let Some(p) = state.store.proposal(&id).await.map_err(store_err)? else {
        return Err(proposal_not_found(&id));
    };
    let checkpoints: Vec<Value> = state
        .store
        .checkpoints(&id)
        .await
        .map_err(store_err)?
        .into_iter()
        .map(|c| {
            json!({
                "offsetSeconds": watchdog::CHECKPOINTS_NS.get(c.ord as usize).map(|n| n / 1_000_000_000),
                "dueAt": rfc3339(c.due_ns),
                "evaluatedAt": opt_time(c.evaluated_ns),
                "requests": c.requests,
                "errors": c.errors,
                "verdict": c.verdict,
            })
        })
        .collect();
    let receipts: Vec<Value> = state
        .store
        .gate_receipts(&id)
        .await
        .map_err(store_err)?
        .into_iter()
        .map(|r| {
            json!({
                "kind": r.kind,
                "subjectKey": r.subject_key,
                "evidence": r.evidence,
                "detail": r.detail,
                "createdAt": rfc3339(r.created_ns),
            })
        })
        .collect();
    let mut body = json!({"proposal": proposal_json(&p)});
    body["proposal"]["checkpoints"] = json!(checkpoints);
    body["proposal"]["receipts"] = json!(receipts);
    Ok(Json(body).into_response())
}

async fn get_proposals(
    State(state): State<AppState>,
    headers: HeaderMap,
    Query(params): Query<BTreeMap<String, String>>,
) -> Reply {
    auth(&state, &headers, Scope::Read).await?;
    only_params(&params, &["incidentId", "status", "limit"])?;
    if let Some(s) = params.get("status")
        && Status::parse(s).is_none()
    {
        return Err(bad_query(
            "status",
            format!(
                "status is one of {}",
                Status::ALL.map(Status::as_str).join(", ")
            ),
        ));
    }
    let f = ProposalFilter {
        incident_id: params.get("incidentId").cloned(),
        status: params.get("status").cloned(),
        limit: limit_param(&params, 50)?,
    };
    let items: Vec<Value> = state
        .store
        .proposals(&f)
        .await
        .map_err(store_err)?
        .iter()
        .map(proposal_json)
        .collect();
    Ok(Json(json!({"items": items})).into_response())
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct GrantRequest {
    operation: String,
    grant_token: String,
    runner_id: String,
    #[serde(default)]
    result: Option<Value>,
}

fn status_conflict(p: &ProposalRow, wanted: &str) -> Response {
    denied(grant::status_conflict(p, wanted))
}

async fn post_grant(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Body,
) -> Reply {
    let key_id = auth(&state, &headers, Scope::Runner).await?;
    let req: GrantRequest = json_body(body, "invalid_grant_request").await?;
    // Load what the rule reads (a claim also reads who proposed the grant,
    // the evidence its tier rests on and the cited envelope) ...
    let p = state.store.proposal(&id).await.map_err(store_err)?;
    let (mut proposer, mut tier_evidence, mut envelope) = (None, None, None);
    if let Some(p) = p.as_ref().filter(|_| req.operation == grant::CLAIM) {
        proposer = state
            .store
            .proposal_writer(&p.id)
            .await
            .map_err(store_err)?;
        if let Some(f) = state
            .store
            .finding(&p.finding_id)
            .await
            .map_err(store_err)?
        {
            tier_evidence = Some(
                provenance::evidence(&state.store, &f)
                    .await
                    .map_err(store_err)?,
            );
        }
        if let Some(d) = p.pre_mutation_envelope.as_deref() {
            envelope = state.store.envelope_facts(d).await.map_err(store_err)?;
        }
    }
    let now = state.clock.now_ns();
    // ... decide ...
    let plan = grant::grant(grant::GrantReadings {
        id: &id,
        operation: &req.operation,
        grant_token: &req.grant_token,
        runner_id: &req.runner_id,
        key_id: &key_id,
        proposal: p.as_ref(),
        proposer: proposer.as_deref(),
        tier_evidence: tier_evidence.as_ref(),
        envelope: envelope.as_ref(),
        keys: &state.gate.keys,
        freshness: &state.freshness,
        now_ns: now,
    })
    .map_err(|r| {
        match r.code {
            "invalid_grant_token" => {
                tracing::warn!(proposal = %id, "grant token refused");
            }
            "claimer_is_proposer" => {
                tracing::warn!(proposal = %id, key_id = %key_id, "grant claim refused: the proposing key");
            }
            "self_attested_evidence" => {
                tracing::warn!(proposal = %id, key_id = %key_id, "grant claim refused: self-attested evidence");
            }
            _ => {}
        }
        denied(r)
    })?;
    // ... persist and answer.
    match plan {
        grant::GrantPlan::Claim {
            grant_hash,
            runner_id,
            execution_deadline_ns,
        } => {
            let outcome = state
                .store
                .claim_grant(&id, grant_hash, runner_id, now, execution_deadline_ns)
                .await
                .map_err(store_err)?;
            let p = grant::claim_answer(&id, outcome).map_err(denied)?;
            tracing::info!(proposal = %p.id, runner = %pstack_store_core::logsafe::text(runner_id), "grant claimed");
            Ok(Json(json!({"proposal": proposal_json(&p)})).into_response())
        }
        grant::GrantPlan::Finish {
            success,
            runner_id,
            checkpoints,
        } => {
            let outcome = req.result.clone().unwrap_or(Value::Null);
            let f = Finish {
                runner_id,
                success,
                outcome: &outcome,
                checkpoints,
            };
            let outcome = state
                .store
                .finish_grant(&id, &f, now)
                .await
                .map_err(store_err)?;
            let p = grant::finish_answer(&id, outcome).map_err(denied)?;
            tracing::info!(proposal = %p.id, status = %p.status, "grant finished");
            Ok(Json(json!({"proposal": proposal_json(&p)})).into_response())
        }
    }
}

/// A grant or approval refusal as the route answers it.
fn denied(r: grant::Refusal) -> Response {
    use grant::RefusalKind;
    let status = match r.kind {
        RefusalKind::Precondition => StatusCode::UNPROCESSABLE_ENTITY,
        RefusalKind::Forbidden => StatusCode::FORBIDDEN,
        RefusalKind::NotFound => StatusCode::NOT_FOUND,
        RefusalKind::Conflict => StatusCode::CONFLICT,
        RefusalKind::Gone => StatusCode::GONE,
    };
    let mut e = ApiError::new(status, r.code, r.message);
    if let Some(f) = r.field {
        e = e.field(f);
    }
    if let Some(d) = r.detail {
        e = e.detail(d);
    }
    e.into_response()
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ApproveRequest {
    #[serde(default)]
    webhook_url: Option<String>,
    #[serde(default)]
    secret: Option<String>,
}

async fn post_approve(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Body,
) -> Reply {
    // A human decision: an operator session with its CSRF token, never an API key.
    let (user, _) = crate::http::extract::human(&state, &headers, true).await?;
    let key_id = format!("user:{user}");
    let req: ApproveRequest = optional_body(body, "invalid_approval").await?;
    // Load what the rule reads ...
    let callback = validate_callback(req.webhook_url.as_ref(), req.secret.as_ref(), "secret");
    let before = match &callback {
        // A refused callback is answered before anything is read.
        Err(_) => None,
        Ok(_) => state.store.proposal(&id).await.map_err(store_err)?,
    };
    let envelope = match before
        .as_ref()
        .and_then(|p| p.pre_mutation_envelope.as_deref())
    {
        Some(d) => state.store.envelope_facts(d).await.map_err(store_err)?,
        None => None,
    };
    let now = state.clock.now_ns();
    // ... decide ...
    let plan = grant::approve(grant::ApproveReadings {
        id: &id,
        callback,
        proposal: before.as_ref(),
        envelope: envelope.as_ref(),
        freshness: &state.freshness,
        now_ns: now,
    })
    .map_err(denied)?;
    // ... persist ...
    let (token, hash) = state.gate.keys.mint_token().map_err(|e| {
        err(
            StatusCode::SERVICE_UNAVAILABLE,
            "random_unavailable",
            e.to_string(),
            None,
        )
    })?;
    let outcome = state
        .store
        .approve_proposal(&id, &hash, &key_id, now, plan.grant_expires_ns)
        .await
        .map_err(store_err)?;
    let p = grant::approve_answer(&id, outcome).map_err(denied)?;
    tracing::info!(proposal = %p.id, by = %pstack_store_core::logsafe::text(&key_id), "remediation approved");
    // The request's callback wins over the one stored at propose time. A
    // stored one that does not open (sealed under another gate key, or an
    // edited row) is a failed delivery with its reason, never a silent none.
    let delivery = match plan.delivery {
        grant::GrantDelivery::Requested((cb, _)) => {
            Some(deliver_grant(&state, &p, &token, &cb).await?)
        }
        grant::GrantDelivery::Stored(sealed) => match open_callback(&state, sealed) {
            Ok(cb) => Some(deliver_grant(&state, &p, &token, &cb).await?),
            Err(why) => {
                let host = before.as_ref().and_then(|b| b.callback_host.clone());
                tracing::warn!(proposal = %p.id, host = ?host, reason = why, "grant webhook not delivered: the stored callback does not open");
                let failed = Delivery {
                    attempted: true,
                    delivered: false,
                    attempts: 0,
                    host: host.unwrap_or_default(),
                    error: Some(format!(
                        "{why}; nothing was sent: hand the grant token to the runner, or approve with webhookUrl"
                    )),
                };
                Some(record_delivery(&state, &p, failed).await?)
            }
        },
        grant::GrantDelivery::None => None,
    };
    // ... and answer.
    let p = state
        .store
        .proposal(&id)
        .await
        .map_err(store_err)?
        .unwrap_or(p);
    let mut body = json!({"proposal": proposal_json(&p), "grantToken": token});
    if let Some(d) = delivery {
        body["grantDelivery"] = json!(d);
    }
    Ok(Json(body).into_response())
}

/// Open a callback sealed at propose time, or say why it does not open.
fn open_callback(state: &AppState, sealed: &str) -> Result<Callback, &'static str> {
    let bytes = state.gate.keys.open(sealed).map_err(|_| {
        "the stored callback did not open: it was sealed under another gate key (a replica with a different --gate-key-file) or the row was modified"
    })?;
    serde_json::from_slice::<Callback>(&bytes)
        .map_err(|_| "the stored callback opened but is not a callback (a modified row)")
}

async fn post_reject(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Body,
) -> Reply {
    let (user, _) = crate::http::extract::human(&state, &headers, true).await?;
    let key_id = format!("user:{user}");
    let _: ApproveRequestEmpty = optional_body(body, "invalid_rejection").await?;
    match state
        .store
        .reject_proposal(&id, &key_id, state.clock.now_ns())
        .await
        .map_err(store_err)?
    {
        Transition::Done(p) => {
            tracing::info!(proposal = %p.id, by = %pstack_store_core::logsafe::text(&key_id), "remediation rejected");
            Ok(Json(json!({"proposal": proposal_json(&p)})).into_response())
        }
        Transition::Refused(p) => Err(status_conflict(
            &p,
            "only a pending proposal or an unclaimed grant can be rejected",
        )),
        Transition::NotFound => Err(proposal_not_found(&id)),
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ApproveRequestEmpty {
    #[serde(default)]
    #[allow(
        dead_code,
        reason = "accepted so a client may send it; not stored on reject"
    )]
    reason: Option<String>,
}

// ---- watchdog ----

async fn post_watchdog(State(state): State<AppState>, headers: HeaderMap) -> Reply {
    auth(&state, &headers, Scope::Analysis).await?;
    let report = pstack_store_core::gate_tick::tick(&state.store, &state.clock)
        .await
        .map_err(store_err)?;
    Ok(Json(json!(report)).into_response())
}
