//! HTTP routes of the analysis half (seed 000): change ledger, OTLP traces,
//! blast radius, findings, eval runs, cross-node claims, and the OpenAPI
//! document of every route the store serves.
//!
//! Invariants:
//! - Every route but `/openapi.json` authenticates with an API key holding
//!   the route's scope before it reads a body.
//! - Errors are [`ApiError`](crate::http::ApiError)s, `{"error": {"code", "message", "field"?}}`; a refusal of
//!   input names the field (camelCase path) that caused it.
//! - A request is validated whole before anything is stored: a finding
//!   citing an unknown digest, change or eval run stores nothing.
//! - `causalProofTier` is always derived by the server; a client-sent one is
//!   ignored (and reported as ignored).
//! - OTLP decoding (CPU-bound) runs on the blocking pool, under the same
//!   per-key concurrency and in-flight memory budget as envelope ingest,
//!   its decoded size bounded before it is decoded (`analysis::otlp_cost`).

// Handlers and their helpers fail with the finished HTTP response: it is
// what the caller returns, once, so its size is not worth a box.
#![allow(
    clippy::result_large_err,
    reason = "the error is the HTTP response itself, built once on the way out"
)]

use crate::api::bodies::{CounterfactualRequest, FindingRequest};
use crate::api::query::{BlastQuery, ChangesQuery, FindingsQuery, QueryParams};
use std::collections::BTreeMap;

use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use prost::Message;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::http::error::{Reply, api, err, field_err, store_err, unprocessable};
use crate::http::extract::{auth, bad_query, json_body, limit_param, only_params};
use crate::http::{AppState, Scope};
use pstack_store_core::analysis::blast::{BlastParams, blast_radius};
use pstack_store_core::analysis::fleet::FleetMetric;
use pstack_store_core::analysis::future::{FutureBound, FutureTime};
use pstack_store_core::analysis::ledger::{self, ChangeRequest, rfc3339};
use pstack_store_core::analysis::otlp::{self, Encoding};
use pstack_store_core::analysis::otlp_cost::{Grant, Meter};
use pstack_store_core::analysis::proof::{
    self, BrokenState, CausalProofTier, EvalRun, FingerprintInput, ProofFacts,
    RelationshipCertainty,
};
use pstack_store_core::analysis::verdict::Verdict;
use pstack_store_core::db::analysis::{FindingRow, new_id};

/// The OpenAPI document (every route of the store).
pub const OPENAPI: &str = include_str!("../../openapi.json");

/// `30s`, `15m`, `24h`, `7d` → ns.
pub fn parse_window(s: &str) -> Option<i64> {
    let (num, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit())?);
    let n: i64 = num.parse().ok()?;
    let mult: i64 = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return None,
    };
    n.checked_mul(mult)?
        .checked_mul(1_000_000_000)
        .filter(|v| *v > 0)
}

fn time_param(params: &BTreeMap<String, String>, name: &str) -> Result<Option<i64>, Response> {
    match params.get(name) {
        None => Ok(None),
        Some(s) => ledger::parse_time(name, s)
            .map(Some)
            .map_err(|e| bad_query(name, e.message)),
    }
}

/// The analysis routes (merged into [`crate::http::api_router`]).
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/openapi.json", get(openapi))
        .route("/v1/changes", post(post_change).get(get_changes))
        .route("/v1/changes/{id}", get(get_change))
        .route("/v1/traces", post(post_traces))
        .route("/v1/claims", get(get_claims))
        .route("/internal/changes/{id}/blast-radius", get(get_blast_radius))
        .route("/internal/findings", post(post_finding).get(get_findings))
        .route("/internal/findings/{id}", get(get_finding))
        .route(
            "/internal/findings/{id}/counterfactual",
            post(post_counterfactual),
        )
        .route("/internal/evals/runs", post(post_eval_run))
        .route("/internal/evals/runs/{id}", get(get_eval_run))
}

async fn openapi() -> Response {
    ([(header::CONTENT_TYPE, "application/json")], OPENAPI).into_response()
}

// ---- change ledger ----

async fn post_change(State(state): State<AppState>, headers: HeaderMap, body: Body) -> Reply {
    let key_id = auth(&state, &headers, Scope::Telemetry).await?;
    let req: ChangeRequest = json_body(body, "invalid_change").await?;
    let now = pstack_store_core::now_ns();
    let change = ledger::validate(req, now)
        .map_err(|e| field_err(StatusCode::UNPROCESSABLE_ENTITY, "invalid_change", e))?;
    future_bound(&state)
        .check_change(&change)
        .map_err(future_refused)?;
    let id = state
        .store
        .record_change(&change, &key_id, now)
        .await
        .map_err(store_err)?;
    tracing::info!(id = %id, kind = %change.kind, key_id = %key_id, "change recorded");
    Ok((StatusCode::CREATED, Json(json!({"id": id}))).into_response())
}

async fn get_changes(
    State(state): State<AppState>,
    headers: HeaderMap,
    Query(params): Query<BTreeMap<String, String>>,
) -> Reply {
    auth(&state, &headers, Scope::Read).await?;
    let accepted: Vec<&str> = ChangesQuery::PARAMS
        .iter()
        .chain(ChangesQuery::ALIASES)
        .copied()
        .collect();
    only_params(&params, &accepted)?;
    // `serviceName` is the seed's name; `service` its older alias.
    let service = match (params.get("serviceName"), params.get("service")) {
        (Some(_), Some(_)) => {
            return Err(bad_query(
                "service",
                "give serviceName or its alias service, not both",
            ));
        }
        (name, alias) => name.or(alias),
    };
    let since = time_param(&params, "since")?;
    let limit = limit_param(&params, 100)?;
    let items = state
        .store
        .changes(
            params.get("environment").map(String::as_str),
            service.map(String::as_str),
            since,
            limit,
        )
        .await
        .map_err(store_err)?;
    Ok(Json(json!({"items": items})).into_response())
}

async fn get_change(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Reply {
    auth(&state, &headers, Scope::Read).await?;
    let c = state.store.change(&id).await.map_err(store_err)?;
    match c {
        Some(c) => Ok(Json(c).into_response()),
        None => Err(err(
            StatusCode::NOT_FOUND,
            "change_not_found",
            format!("no change {id}"),
            None,
        )),
    }
}

/// Times past this are refused (`serve --max-future-skew`), read on the
/// gate's clock so the bound moves with the windows it protects.
fn future_bound(state: &AppState) -> FutureBound {
    FutureBound::new(state.clock.now_ns(), state.max_future_skew_ns)
}

fn future_refused(e: FutureTime) -> Response {
    err(
        StatusCode::BAD_REQUEST,
        "time_in_future",
        e.to_string(),
        Some(&e.field),
    )
}

// ---- OTLP ----

/// A 503 that says when to come back.
fn busy(code: &str, message: String) -> Response {
    err(StatusCode::SERVICE_UNAVAILABLE, code, message, None)
}

fn body_refused(e: pstack_store_core::ingest::BodyError) -> Response {
    use pstack_store_core::ingest::BodyError;
    let status = match e {
        BodyError::UnsupportedEncoding(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
        BodyError::TooLarge { .. } | BodyError::DecodedTooLarge { .. } => {
            StatusCode::PAYLOAD_TOO_LARGE
        }
        BodyError::Busy => return busy(e.code(), e.to_string()),
        _ => StatusCode::BAD_REQUEST,
    };
    err(status, e.code(), e.to_string(), None)
}

fn traces_refused(e: otlp::OtlpError) -> Response {
    use otlp::OtlpError;
    let status = match e {
        OtlpError::TooManySpans { .. } | OtlpError::DecodeTooLarge { .. } => {
            StatusCode::PAYLOAD_TOO_LARGE
        }
        OtlpError::Busy => return busy(e.code(), e.to_string()),
        OtlpError::Protobuf(_)
        | OtlpError::Json(_)
        | OtlpError::TooLong { .. }
        | OtlpError::TooMany { .. } => StatusCode::BAD_REQUEST,
    };
    err(status, e.code(), e.to_string(), e.field())
}

async fn post_traces(State(state): State<AppState>, headers: HeaderMap, body: Body) -> Reply {
    let key_id = auth(&state, &headers, Scope::Telemetry).await?;
    let bound = future_bound(&state);
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let encoding = Encoding::from_content_type(ct).ok_or_else(|| {
        err(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_content_type",
            format!(
                "Content-Type {ct:?}: send application/x-protobuf or application/json (OTLP/HTTP)"
            ),
            Some("content-type"),
        )
    })?;
    let limits = state.limits;
    // As /v1/envelopes: a slot of the key's concurrency and the wire body
    // reserved before a byte is read; then the gzip-decoded body, the
    // decoded request (bounded by its census before decoding) and the
    // aggregates are reserved as they grow, and all of it is held until the
    // batch is stored.
    let (mut held, declared) = crate::http::admit_ingest(&state, &key_id, &headers).map_err(api)?;
    let raw = crate::http::read_body(body, &headers, declared, &limits)
        .await
        .map_err(api)?;
    let content_encoding = headers
        .get(header::CONTENT_ENCODING)
        .map(|v| v.to_str().unwrap_or("invalid").to_string());
    let guards = state.guards.clone();
    let (batch, held) = tokio::task::spawn_blocking(move || {
        let batch = {
            let budget_refused = || {
                guards
                    .budget_refused
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            };
            let decoded = pstack_store_core::ingest::decode_body_within(
                raw,
                content_encoding.as_deref(),
                &limits,
                &mut |n| {
                    let ok = held.grow(n);
                    if !ok {
                        budget_refused();
                    }
                    ok
                },
            )
            .map_err(body_refused)?;
            let mut grant = |n: usize| {
                if !held.could_hold(n) {
                    Grant::OverBudget {
                        budget: held.budget_bytes(),
                    }
                } else if held.grow(n) {
                    Grant::Granted
                } else {
                    budget_refused();
                    Grant::Busy
                }
            };
            let mut meter = Meter::new(&mut grant);
            let req = otlp::decode_within(&decoded, encoding, limits.max_spans, &mut meter)
                .map_err(traces_refused)?;
            drop(decoded);
            otlp::check(&req).map_err(traces_refused)?;
            bound.check_spans(&req).map_err(future_refused)?;
            otlp::aggregate_within(&req, &mut meter).map_err(traces_refused)?
        };
        Ok::<_, Response>((batch, held))
    })
    .await
    .map_err(|e| {
        err(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            e.to_string(),
            None,
        )
    })??;
    state
        .store
        .ingest_traces(&batch, &key_id)
        .await
        .map_err(store_err)?;
    drop(held);
    tracing::debug!(spans = batch.spans, key_id = %key_id, "otlp traces");
    Ok(match encoding {
        Encoding::Protobuf => {
            let resp = opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceResponse::default();
            (
                [(header::CONTENT_TYPE, "application/x-protobuf")],
                resp.encode_to_vec(),
            )
                .into_response()
        }
        Encoding::Json => Json(json!({})).into_response(),
    })
}

// ---- blast radius ----

async fn get_blast_radius(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(params): Query<BTreeMap<String, String>>,
) -> Reply {
    auth(&state, &headers, Scope::Read).await?;
    only_params(&params, BlastQuery::PARAMS)?;
    let mut p = BlastParams::default();
    if let Some(s) = params.get("minSample") {
        p.min_sample = s.parse::<u64>().ok().filter(|n| *n >= 1).ok_or_else(|| {
            bad_query(
                "minSample",
                format!("minSample {s:?} must be a positive integer"),
            )
        })?;
    }
    if let Some(s) = params.get("window") {
        p.window_ns = Some(
            parse_window(s)
                .ok_or_else(|| bad_query("window", format!("window {s:?}: e.g. 30m, 24h, 7d")))?,
        );
    }
    if let Some(s) = params.get("metric") {
        p.metric = FleetMetric::parse(s).ok_or_else(|| {
            bad_query(
                "metric",
                format!("metric {s:?}: resets, rto_timeouts, d_state_episodes or rebuild_failures"),
            )
        })?;
    }
    let change = state
        .store
        .change(&id)
        .await
        .map_err(store_err)?
        .ok_or_else(|| {
            err(
                StatusCode::NOT_FOUND,
                "change_not_found",
                format!("no change {id}"),
                None,
            )
        })?;
    let b = blast_radius(&state.store, &change, &p, state.clock.now_ns())
        .await
        .map_err(store_err)?;
    Ok(Json(b.body).into_response())
}

// ---- claims across nodes ----

async fn get_claims(
    State(state): State<AppState>,
    headers: HeaderMap,
    Query(params): Query<BTreeMap<String, String>>,
) -> Reply {
    auth(&state, &headers, Scope::Read).await?;
    only_params(&params, &["code", "since"])?;
    let code = params
        .get("code")
        .ok_or_else(|| bad_query("code", "give code=<claim code>, e.g. flow_rto_timeouts"))?;
    if code.is_empty()
        || code.len() > 64
        || !code
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
    {
        return Err(bad_query(
            "code",
            format!("{code:?} is not a claim code (snake_case, at most 64 bytes)"),
        ));
    }
    let since = time_param(&params, "since")?
        .unwrap_or_else(|| pstack_store_core::now_ns() - 86_400_000_000_000);
    const CAP: i64 = 100_000;
    let (rows, cut) = state
        .store
        .envelopes_with_claim(code, since, CAP)
        .await
        .map_err(store_err)?;
    let mut nodes: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (node, digest, _) in &rows {
        nodes.entry(node.clone()).or_default().push(digest.clone());
    }
    let nodes: Vec<Value> = nodes
        .into_iter()
        .map(
            |(node, digests)| json!({"node": node, "envelopes": digests.len(), "digests": digests}),
        )
        .collect();
    Ok(Json(json!({
        "code": code,
        "since": rfc3339(since),
        "envelopes": rows.len(),
        "capReached": cut,
        "nodes": nodes,
    }))
    .into_response())
}

// ---- eval runs ----

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct EvalRunRequest {
    eval_case_id: String,
    input_payload_hash: String,
    passed: bool,
    #[serde(default)]
    service_version: Option<String>,
    #[serde(default)]
    commit_sha: Option<String>,
    #[serde(default)]
    candidate_agent_version: Option<String>,
    #[serde(default)]
    failure_fingerprint: Option<String>,
}

fn eval_json(r: &EvalRun, created_ns: i64) -> Value {
    json!({
        "id": r.id,
        "evalCaseId": r.eval_case_id,
        "inputPayloadHash": r.input_payload_hash,
        "passed": r.passed,
        "serviceVersion": r.service_version,
        "commitSha": r.commit_sha,
        "candidateAgentVersion": r.candidate_agent_version,
        "failureFingerprint": r.failure_fingerprint,
        "createdAt": rfc3339(created_ns),
    })
}

async fn post_eval_run(State(state): State<AppState>, headers: HeaderMap, body: Body) -> Reply {
    let key_id = auth(&state, &headers, Scope::Analysis).await?;
    let r: EvalRunRequest = json_body(body, "invalid_eval_run").await?;
    for (field, v) in [
        ("evalCaseId", &r.eval_case_id),
        ("inputPayloadHash", &r.input_payload_hash),
    ] {
        if v.trim().is_empty() || v.len() > 1024 {
            return Err(err(
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid_eval_run",
                "required, at most 1024 bytes",
                Some(field),
            ));
        }
    }
    let run = EvalRun {
        id: String::new(),
        eval_case_id: r.eval_case_id,
        input_payload_hash: r.input_payload_hash,
        passed: r.passed,
        service_version: r.service_version,
        commit_sha: r.commit_sha,
        candidate_agent_version: r.candidate_agent_version,
        failure_fingerprint: r.failure_fingerprint,
    };
    let id = state
        .store
        .record_eval_run(&run, &key_id, pstack_store_core::now_ns())
        .await
        .map_err(store_err)?;
    Ok((StatusCode::CREATED, Json(json!({"id": id}))).into_response())
}

async fn get_eval_run(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Reply {
    auth(&state, &headers, Scope::Read).await?;
    match state.store.eval_run(&id).await.map_err(store_err)? {
        Some((r, created)) => Ok(Json(eval_json(&r, created)).into_response()),
        None => Err(err(
            StatusCode::NOT_FOUND,
            "eval_run_not_found",
            format!("no eval run {id}"),
            None,
        )),
    }
}

// ---- findings ----

pub(crate) fn finding_json(f: &FindingRow) -> Value {
    json!({
        "id": f.id,
        "environment": f.environment,
        "incidentId": f.incident_id,
        "faultLocusEntityId": f.fault_locus_entity_id,
        "causalChain": f.causal_chain,
        "citedEvidenceIds": f.cited_evidence_ids,
        "contributingChangeId": f.contributing_change_id,
        "changeVerdict": f.change_verdict,
        "counterfactual": f.counterfactual,
        "fingerprint": f.fingerprint,
        "fingerprintInput": f.fingerprint_input,
        "causalProofTier": f.causal_proof_tier,
        "idempotencyKey": f.idempotency_key,
        "createdAt": rfc3339(f.created_ns),
        "updatedAt": rfc3339(f.updated_ns),
    })
}

/// Load every named run, or refuse naming the first missing one.
async fn load_runs(
    state: &AppState,
    cf: &CounterfactualRequest,
    prefix: &str,
) -> Result<(EvalRun, Vec<EvalRun>), Response> {
    let get = |id: String, field: String| async move {
        match state.store.eval_run(&id).await.map_err(store_err)? {
            Some((r, _)) => Ok(r),
            None => Err(unprocessable(
                "unknown_eval_run",
                format!("no eval run {id}"),
                &field,
            )),
        }
    };
    let failing = get(cf.failing_run_id.clone(), format!("{prefix}failingRunId")).await?;
    let mut passing = Vec::with_capacity(cf.passing_run_ids.len());
    for (i, id) in cf.passing_run_ids.iter().enumerate() {
        passing.push(get(id.clone(), format!("{prefix}passingRunIds[{i}]")).await?);
    }
    Ok((failing, passing))
}

async fn broken_state(state: &AppState, f: &FindingRow) -> Result<BrokenState, Response> {
    let change = match &f.contributing_change_id {
        Some(id) => state.store.change(id).await.map_err(store_err)?,
        None => None,
    };
    Ok(BrokenState {
        fingerprint: f.fingerprint.clone(),
        service_version: change.as_ref().and_then(|c| c.version.clone()),
        commit_sha: change.as_ref().and_then(|c| c.commit_sha.clone()),
        candidate_agent_version: change
            .as_ref()
            .and_then(|c| c.candidate_agent_version.clone()),
    })
}

fn counterfactual_json(
    cf: &CounterfactualRequest,
    outcome: &Result<(), proof::CounterfactualRefusal>,
) -> Value {
    json!({
        "failingRunId": cf.failing_run_id,
        "passingRunIds": cf.passing_run_ids,
        "requiredTrials": cf.required_trials,
        "verified": outcome.is_ok(),
        "error": outcome.as_ref().err().map(|e| e.to_string()),
    })
}

fn refusal_json(e: &proof::CounterfactualRefusal) -> Value {
    let code = serde_json::to_value(e)
        .ok()
        .and_then(|v| v.get("code").cloned())
        .unwrap_or(json!("counterfactual_not_verified"));
    json!({"code": code, "message": e.to_string()})
}

/// A retry of a recorded finding: the stored finding, unchanged, under
/// the seed's `data.finding` (and its top-level alias `finding`).
fn replayed(f: &FindingRow) -> Response {
    let f = finding_json(f);
    (
        StatusCode::OK,
        Json(json!({"data": {"finding": f}, "finding": f, "idempotentReplay": true})),
    )
        .into_response()
}

async fn post_finding(State(state): State<AppState>, headers: HeaderMap, body: Body) -> Reply {
    let key_id = auth(&state, &headers, Scope::Analysis).await?;
    let req: FindingRequest = json_body(body, "invalid_finding").await?;
    // Validate everything before storing anything.
    for (field, v) in [
        ("environment", &req.environment),
        ("faultLocusEntityId", &req.fault_locus_entity_id),
        ("idempotencyKey", &req.idempotency_key),
    ] {
        if v.trim().is_empty() || v.len() > 1024 {
            return Err(unprocessable(
                "invalid_finding",
                "required, at most 1024 bytes",
                field,
            ));
        }
    }
    if req.causal_chain.is_empty() {
        return Err(unprocessable(
            "invalid_finding",
            "at least one {subject, relation, object} link",
            "causalChain",
        ));
    }
    for (i, l) in req.causal_chain.iter().enumerate() {
        if !proof::RELATIONS.contains(&l.relation.as_str()) {
            return Err(unprocessable(
                "unknown_relation",
                format!(
                    "{:?} is not one of {}",
                    l.relation,
                    proof::RELATIONS.join(", ")
                ),
                &format!("causalChain[{i}].relation"),
            ));
        }
    }
    let digests: Vec<String> = req
        .cited_evidence_ids
        .iter()
        .filter(|d| d.starts_with("sha256:"))
        .cloned()
        .collect();
    for d in &digests {
        if !pstack_envelope::is_sha256_digest(d) {
            let i = req
                .cited_evidence_ids
                .iter()
                .position(|x| x == d)
                .unwrap_or(0);
            return Err(unprocessable(
                "invalid_digest",
                format!("{d:?} is not sha256:<64 lowercase hex>"),
                &format!("citedEvidenceIds[{i}]"),
            ));
        }
    }
    let missing = state
        .store
        .missing_digests(&digests)
        .await
        .map_err(store_err)?;
    if let Some(m) = missing.first() {
        let i = req
            .cited_evidence_ids
            .iter()
            .position(|x| x == m)
            .unwrap_or(0);
        return Err(unprocessable(
            "unknown_evidence",
            format!("no envelope {m} in the store"),
            &format!("citedEvidenceIds[{i}]"),
        ));
    }
    let change = match &req.contributing_change_id {
        None => None,
        Some(id) => Some(
            state
                .store
                .change(id)
                .await
                .map_err(store_err)?
                .ok_or_else(|| {
                    unprocessable(
                        "unknown_change",
                        format!("no change {id}"),
                        "contributingChangeId",
                    )
                })?,
        ),
    };
    let runs = match &req.counterfactual {
        Some(cf) => Some(load_runs(&state, cf, "counterfactual.").await?),
        None => None,
    };
    // Idempotent replay: the stored finding, unchanged.
    if let Some(existing) = state
        .store
        .finding_by_key(&req.idempotency_key)
        .await
        .map_err(store_err)?
    {
        return Ok(replayed(&existing));
    }
    // Fingerprint: given, else resolved from a sampled failing span, else the locus as a service.
    let fp_input = match req.fingerprint_input.clone() {
        Some(f) => f,
        None => match state
            .store
            .failed_request(&req.fault_locus_entity_id.to_ascii_lowercase())
            .await
            .map_err(store_err)?
        {
            Some(span) => FingerprintInput {
                originating_node_id: span.service,
                normalized_operation: proof::normalize_operation(&span.operation),
                error_signature: span.error_signature,
                downstream_target_node_id: span.downstream.unwrap_or_default(),
            },
            None => FingerprintInput {
                originating_node_id: req.fault_locus_entity_id.clone(),
                ..FingerprintInput::default()
            },
        },
    };
    let fingerprint = proof::fingerprint(&req.environment, &fp_input);
    // The server's own evidence: the change's blast radius.
    let radius = match &change {
        Some(c) => Some(
            blast_radius(
                &state.store,
                c,
                &BlastParams::default(),
                pstack_store_core::now_ns(),
            )
            .await
            .map_err(store_err)?,
        ),
        None => None,
    };
    let verdict: Option<Verdict> = radius.as_ref().map(|r| r.verdict);
    let overlap_found = radius
        .as_ref()
        .is_some_and(|r| !r.touched_paths_overlap.is_empty());
    let asserts_overlap = req
        .causal_chain
        .iter()
        .any(|l| l.relation == "touched_same_code_path");
    let chain: Vec<Value> = req
        .causal_chain
        .iter()
        .map(|l| {
            let certainty = if l.relation == "touched_same_code_path" && overlap_found {
                RelationshipCertainty::Exact
            } else {
                l.relationship_certainty.unwrap_or(RelationshipCertainty::Heuristic)
            };
            json!({"subject": l.subject, "relation": l.relation, "object": l.object, "relationshipCertainty": certainty})
        })
        .collect();
    let facts = ProofFacts {
        change_verdict: verdict,
        counterfactual_verified: false,
        code_path_overlap: overlap_found || asserts_overlap,
    };
    let now = pstack_store_core::now_ns();
    let row = FindingRow {
        id: new_id("fnd").map_err(store_err)?,
        environment: req.environment.clone(),
        incident_id: req.incident_id.clone(),
        fault_locus_entity_id: req.fault_locus_entity_id.clone(),
        causal_chain: Value::Array(chain),
        cited_evidence_ids: json!(req.cited_evidence_ids),
        contributing_change_id: req.contributing_change_id.clone(),
        change_verdict: verdict.map(|v| v.as_str().to_string()),
        counterfactual: None,
        fingerprint,
        fingerprint_input: serde_json::to_value(&fp_input).unwrap_or(Value::Null),
        causal_proof_tier: proof::derive_tier(&facts).as_str().to_string(),
        idempotency_key: req.idempotency_key.clone(),
        created_ns: now,
        updated_ns: now,
    };
    let (mut stored, inserted) = state
        .store
        .insert_finding(&row, &digests, &key_id)
        .await
        .map_err(store_err)?;
    if !inserted {
        return Ok(replayed(&stored));
    }
    let mut out = json!({});
    if let (Some(cf), Some((failing, passing))) = (&req.counterfactual, runs) {
        let broken = broken_state(&state, &stored).await?;
        let outcome = proof::check_counterfactual(&broken, &failing, &passing, cf.required_trials);
        let tier = proof::derive_tier(&ProofFacts {
            counterfactual_verified: outcome.is_ok(),
            ..facts
        });
        let cf_json = counterfactual_json(cf, &outcome);
        state
            .store
            .update_finding_proof(&stored.id, &cf_json, tier.as_str(), now)
            .await
            .map_err(store_err)?;
        stored.counterfactual = Some(cf_json);
        stored.causal_proof_tier = tier.as_str().to_string();
        if let Err(e) = &outcome {
            out["counterfactualError"] = refusal_json(e);
        }
    }
    out["finding"] = finding_json(&stored);
    // The seed's shape is `data.finding` (+ `data.counterfactualError`);
    // the top-level members stay as aliases for the clients reading them.
    out["data"] = json!({"finding": out["finding"]});
    if let Some(e) = out.get("counterfactualError").cloned() {
        out["data"]["counterfactualError"] = e;
    }
    if req.causal_proof_tier.is_some() {
        out["ignoredFields"] = json!(["causalProofTier"]);
    }
    tracing::info!(id = %stored.id, tier = %stored.causal_proof_tier, key_id = %key_id, "finding recorded");
    Ok((StatusCode::CREATED, Json(out)).into_response())
}

async fn get_finding(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Reply {
    auth(&state, &headers, Scope::Read).await?;
    match state.store.finding(&id).await.map_err(store_err)? {
        Some(f) => Ok(Json(finding_json(&f)).into_response()),
        None => Err(err(
            StatusCode::NOT_FOUND,
            "finding_not_found",
            format!("no finding {id}"),
            None,
        )),
    }
}

async fn get_findings(
    State(state): State<AppState>,
    headers: HeaderMap,
    Query(params): Query<BTreeMap<String, String>>,
) -> Reply {
    auth(&state, &headers, Scope::Read).await?;
    only_params(&params, FindingsQuery::PARAMS)?;
    let limit = limit_param(&params, 50)?;
    let rows = match (params.get("fingerprint"), params.get("faultLocusEntityId")) {
        (Some(fp), None) => state.store.findings_by_fingerprint(fp, limit).await,
        (None, Some(entity)) if !entity.is_empty() && entity.len() <= 256 => {
            state.store.findings_by_locus(entity, limit).await
        }
        (None, Some(_)) => {
            return Err(bad_query("faultLocusEntityId", "1 to 256 bytes"));
        }
        _ => {
            return Err(bad_query(
                "fingerprint",
                "give exactly one of fingerprint=fp_… or faultLocusEntityId=…",
            ));
        }
    };
    let items: Vec<Value> = rows.map_err(store_err)?.iter().map(finding_json).collect();
    Ok(Json(json!({"items": items})).into_response())
}

async fn post_counterfactual(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Body,
) -> Reply {
    auth(&state, &headers, Scope::Analysis).await?;
    let cf: CounterfactualRequest = json_body(body, "invalid_counterfactual").await?;
    let finding = state
        .store
        .finding(&id)
        .await
        .map_err(store_err)?
        .ok_or_else(|| {
            err(
                StatusCode::NOT_FOUND,
                "finding_not_found",
                format!("no finding {id}"),
                None,
            )
        })?;
    let (failing, passing) = load_runs(&state, &cf, "").await?;
    let broken = broken_state(&state, &finding).await?;
    let outcome = proof::check_counterfactual(&broken, &failing, &passing, cf.required_trials);
    if let Err(e) = &outcome {
        return Ok((
            StatusCode::UNPROCESSABLE_ENTITY,
            Json(json!({"error": refusal_json(e), "finding": finding_json(&finding)})),
        )
            .into_response());
    }
    let now = pstack_store_core::now_ns();
    let cf_json = counterfactual_json(&cf, &outcome);
    let tier = CausalProofTier::CounterfactualVerified;
    state
        .store
        .update_finding_proof(&id, &cf_json, tier.as_str(), now)
        .await
        .map_err(store_err)?;
    let mut f = finding;
    f.counterfactual = Some(cf_json);
    f.causal_proof_tier = tier.as_str().into();
    f.updated_ns = now;
    Ok(Json(json!({"finding": finding_json(&f)})).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_parse() {
        assert_eq!(parse_window("30m"), Some(1_800_000_000_000));
        assert_eq!(parse_window("1d"), Some(86_400_000_000_000));
        assert_eq!(parse_window("0h"), None);
        assert_eq!(parse_window("10"), None);
        assert_eq!(parse_window("h"), None);
    }
}
