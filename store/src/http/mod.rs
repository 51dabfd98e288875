//! The HTTP API (axum). Contract in `store/README.md`.
//!
//! Invariants:
//! - Every `/v1` route authenticates with `Authorization: Bearer <key>` before
//!   it reads a body; `/healthz` and `/metrics` are open (they expose counts,
//!   never evidence).
//! - Every authenticated route names the one [`Scope`] it needs at its
//!   [`authenticate`] call (the same table as `openapi.json`'s `security`); a
//!   live key without it gets 403 `insufficient_scope` naming the scope,
//!   before the body is read.
//! - Errors are [`ApiError`]s (`error.rs`): `{"error": {"code", "message", "field"?}}` with a stable snake_case
//!   code and the precise status (400 malformed, 401 auth, 404 absent, 413 too
//!   large, 415 encoding, 422 refused by a rule, 503 database unavailable).
//! - Envelope verification (CPU-bound) runs on the blocking pool, never on the
//!   async workers; database work is the only thing awaited in handlers.
//! - Logs: one structured event per request (route, status, latency, key id,
//!   item counts). Never bodies, never keys, never envelope contents;
//!   caller-supplied strings only through `logsafe::text`.
//!
//! This file holds the shared edge (state, auth, metrics, envelope ingest
//! and reads, receipts); one file per route group below it:
//! [`analysis`] (changes, spans, findings, evaluations), [`gate`]
//! (incidents, proposals, grants), [`ui`] (the approval page and operator
//! logins), [`runs`], [`bundles`], [`transfers`].

pub mod analysis;
pub mod bundles;
pub mod error;
pub mod extract;
pub mod gate;
pub mod runs;
pub mod transfers;
pub mod ui;

pub use error::ApiError;

use crate::api::query::{DiffQuery, QueryParams, UnknownsQuery};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use axum::body::Body;
use axum::extract::{MatchedPath, Path, Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use pstack_exposition::{Exposition, Family, HistogramSample};
use serde::Serialize;
use serde_json::json;

use pstack_store_core::db::{self, KeyCheck, Store, StoredStatus};
use pstack_store_core::ingest::{self, Framing, IngestLimits, ItemVerdict, Reason};
pub use pstack_store_core::keys::Scope;
use pstack_store_core::keys::ScopeSet;
use pstack_store_core::receipts::ReceiptRequest;

/// Shared state of the server.
#[derive(Debug, Clone)]
pub struct AppState {
    /// The database.
    pub store: Store,
    /// Ingest caps.
    pub limits: IngestLimits,
    /// Counters for `/metrics`.
    pub metrics: Arc<Metrics>,
    /// Connection, per-key and byte-budget limits.
    pub guards: Arc<crate::conn::Guards>,
    /// The remediation gate's keys and knobs.
    pub gate: pstack_store_core::gate::GateConfig,
    /// The clock every time window of the gate reads.
    pub clock: pstack_store_core::clock::Clock,
    /// Operator logins: verifier slots, throttle limits, trusted proxies.
    pub login: pstack_store_core::login::LoginControls,
    /// How long an envelope of each subject kind stays fresh (handoff
    /// expiry, run captures, the gate's pre-mutation envelope).
    pub freshness: pstack_store_core::runs::freshness::Freshness,
    /// The MCP server offers its four write tools
    /// (`OBS_MCP_ENABLE_WRITES=true`).
    pub mcp_writes: bool,
    /// How far in the future a change's `at` or a span's time may lie
    /// (`serve --max-future-skew`); later ones are refused with the field.
    pub max_future_skew_ns: i64,
    /// `Host` values `/mcp` accepts besides loopback (`serve --public-url`,
    /// `--mcp-allowed-host`; `crate::mcp::allowed_hosts`).
    pub mcp_allowed_hosts: Vec<String>,
}

/// Default of [`AppState::max_future_skew_ns`]: 5 minutes (clock skew
/// between hosts; a "deploy in 2099" pins the target's current state).
pub const DEFAULT_MAX_FUTURE_SKEW_NS: i64 = 5 * 60 * 1_000_000_000;

impl AppState {
    /// State with default limits and fresh metrics.
    pub fn new(store: Store, limits: IngestLimits) -> AppState {
        AppState::with_conn_limits(store, limits, crate::conn::ConnLimits::default())
    }

    /// State with these connection limits.
    pub fn with_conn_limits(
        store: Store,
        limits: IngestLimits,
        conn: crate::conn::ConnLimits,
    ) -> AppState {
        AppState {
            store,
            limits,
            metrics: Arc::new(Metrics::default()),
            guards: Arc::new(crate::conn::Guards::new(conn)),
            gate: pstack_store_core::gate::GateConfig::with_keys(
                pstack_store_core::gate::keys::GateKeys::ephemeral()
                    .expect("the operating system random source works"),
            ),
            clock: pstack_store_core::clock::Clock::system(),
            login: pstack_store_core::login::LoginControls::default(),
            freshness: pstack_store_core::runs::freshness::Freshness::default(),
            mcp_writes: false,
            max_future_skew_ns: DEFAULT_MAX_FUTURE_SKEW_NS,
            mcp_allowed_hosts: Vec::new(),
        }
    }
}

/// Prometheus counters, read at scrape time into one text exposition
/// (`pstack_exposition`).
#[derive(Debug, Default)]
pub struct Metrics {
    items_accepted: AtomicU64,
    items_duplicate: AtomicU64,
    items_rejected: AtomicU64,
    ingest_bytes: AtomicU64,
    ingest_batches: AtomicU64,
    retention_deleted: AtomicU64,
    rejected_by_rule: Mutex<BTreeMap<String, u64>>,
    auth_failures: Mutex<BTreeMap<&'static str, u64>>,
    responses: Mutex<BTreeMap<(String, u16), u64>>,
    latency: Mutex<BTreeMap<String, Histogram>>,
    /// Seed 001's acceptance metrics (AC1; `pstack_store_core::runs::acceptance`).
    pub acceptance: pstack_store_core::runs::acceptance::AcceptanceMetrics,
}

const BUCKETS_S: [f64; 10] = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0];

#[derive(Debug, Default, Clone)]
struct Histogram {
    counts: [u64; BUCKETS_S.len()],
    count: u64,
    sum: f64,
}

impl Metrics {
    /// Count envelopes deleted by retention.
    pub fn add_retention_deleted(&self, n: u64) {
        self.retention_deleted.fetch_add(n, Ordering::Relaxed);
    }

    fn write_metrics(&self, e: &mut Exposition) {
        let n = |a: &AtomicU64| a.load(Ordering::Relaxed);
        for (status, v) in [
            ("accepted", &self.items_accepted),
            ("duplicate", &self.items_duplicate),
            ("rejected", &self.items_rejected),
        ] {
            e.sample(INGEST_ITEMS, &[("status", status)], n(v));
        }
        e.declare(INGEST_REJECTIONS);
        for (rule, v) in lock(&self.rejected_by_rule).iter() {
            e.sample(INGEST_REJECTIONS, &[("rule", rule)], *v);
        }
        e.sample(INGEST_BYTES, &[], n(&self.ingest_bytes));
        e.sample(INGEST_BATCHES, &[], n(&self.ingest_batches));
        e.declare(AUTH_FAILURES);
        for (reason, v) in lock(&self.auth_failures).iter() {
            e.sample(AUTH_FAILURES, &[("reason", reason)], *v);
        }
        e.sample(RETENTION_DELETED, &[], n(&self.retention_deleted));
        e.declare(HTTP_RESPONSES);
        for ((route, status), v) in lock(&self.responses).iter() {
            e.sample(
                HTTP_RESPONSES,
                &[("route", route), ("status", &status.to_string())],
                *v,
            );
        }
        e.declare(HTTP_DURATION);
        for (route, h) in lock(&self.latency).iter() {
            let mut cumulative = [0; BUCKETS_S.len()];
            let mut below = 0;
            for (c, n) in cumulative.iter_mut().zip(h.counts) {
                below += n;
                *c = below;
            }
            e.histogram(
                HTTP_DURATION,
                &[("route", route)],
                HistogramSample {
                    bounds: &BUCKETS_S,
                    cumulative: &cumulative,
                    count: h.count,
                    sum: h.sum,
                },
            );
        }
        self.acceptance.write_metrics(e);
    }
}

const INGEST_ITEMS: Family = Family::counter(
    "pstack_store_ingest_items_total",
    "Envelopes received, by outcome.",
);
const INGEST_REJECTIONS: Family = Family::counter(
    "pstack_store_ingest_rejections_total",
    "Rule violations in rejected envelopes, by rule.",
);
const INGEST_BYTES: Family = Family::counter(
    "pstack_store_ingest_bytes_total",
    "Decoded ingest body bytes.",
);
const INGEST_BATCHES: Family = Family::counter(
    "pstack_store_ingest_batches_total",
    "Ingest requests that reached the database.",
);
const AUTH_FAILURES: Family = Family::counter(
    "pstack_store_auth_failures_total",
    "Refused API keys, by reason.",
);
const RETENTION_DELETED: Family = Family::counter(
    "pstack_store_retention_deleted_total",
    "Envelopes deleted by retention.",
);
const HTTP_RESPONSES: Family = Family::counter(
    "pstack_store_http_responses_total",
    "HTTP responses, by route and status.",
);
const HTTP_DURATION: Family = Family::histogram(
    "pstack_store_http_request_duration_seconds",
    "Request latency, by route.",
);

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Build the API router (every route but `/mcp`).
pub fn api_router(state: AppState) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics))
        .route("/v1/envelopes", post(post_envelopes))
        .route("/v1/envelopes/{digest}", get(get_envelope))
        .route("/v1/subjects", get(get_subjects))
        .route("/v1/diff", get(get_diff))
        .route("/v1/handoff/{digest}", get(get_handoff))
        .route("/v1/unknowns", get(get_unknowns))
        .route("/v1/receipts", post(post_receipt).get(get_receipts))
        .merge(crate::http::analysis::routes())
        .merge(crate::http::gate::routes())
        .merge(crate::http::ui::routes())
        .merge(crate::http::runs::routes())
        .merge(crate::http::bundles::routes())
        .merge(crate::http::transfers::routes())
        .fallback(no_such_route)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(axum::middleware::from_fn_with_state(state.clone(), observe))
        .with_state(state)
}

async fn no_such_route() -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "no_such_route",
        "no such route (see store/README.md for the API)",
    )
}

async fn method_not_allowed() -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "this route does not take that method",
    )
}

/// Records one request when dropped: on completion with its status, or —
/// when the client went away and hyper dropped the request mid-way — as 499
/// (`client_closed`), so every request is counted and logged.
struct Observed {
    state: AppState,
    route: String,
    method: axum::http::Method,
    started: Instant,
    status: Option<u16>,
}

impl Drop for Observed {
    fn drop(&mut self) {
        let elapsed = self.started.elapsed();
        let status = self.status.unwrap_or(499);
        let (method, route) = (&self.method, &self.route);
        if self.status.is_some() {
            tracing::info!(method = %pstack_store_core::logsafe::text(method), route = %route, status, elapsed_ms = elapsed.as_secs_f64() * 1e3, "request");
        } else {
            tracing::warn!(method = %pstack_store_core::logsafe::text(method), route = %route, status, elapsed_ms = elapsed.as_secs_f64() * 1e3, "request abandoned: the client closed the connection first");
        }
        let metrics = &self.state.metrics;
        *lock(&metrics.responses)
            .entry((route.clone(), status))
            .or_insert(0) += 1;
        let mut lat = lock(&metrics.latency);
        let h = lat.entry(route.clone()).or_default();
        let s = elapsed.as_secs_f64();
        if let Some(i) = BUCKETS_S.iter().position(|le| s <= *le) {
            h.counts[i] += 1;
        }
        h.count += 1;
        h.sum += s;
    }
}

/// Per-request log line and metrics; the request timeout.
async fn observe(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "unmatched".into());
    let timeout = state.guards.limits().request_timeout;
    let mut observed = Observed {
        state,
        route,
        method: req.method().clone(),
        started: Instant::now(),
        status: None,
    };
    let resp = match tokio::time::timeout(timeout, next.run(req)).await {
        Ok(r) => r,
        Err(_) => ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            "request_timeout",
            format!(
                "the request was not complete within {} s",
                timeout.as_secs()
            ),
        )
        .into_response(),
    };
    observed.status = Some(resp.status().as_u16());
    resp
}

async fn healthz(State(state): State<AppState>) -> Response {
    match state.store.ping().await {
        Ok(()) => Json(json!({"status": "ok", "backend": state.store.backend()})).into_response(),
        Err(e) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": "unavailable", "backend": state.store.backend(), "error": e.to_string()})),
        )
            .into_response(),
    }
}

async fn metrics(State(state): State<AppState>) -> Response {
    let mut e = Exposition::new();
    state.metrics.write_metrics(&mut e);
    let g = &state.guards;
    for (family, v) in [
        (
            LOGIN_VERIFIER_BUSY,
            state.login.verifier.refused_busy.load(Ordering::Relaxed),
        ),
        (CONNECTIONS_OPEN, g.connections_open.load(Ordering::Relaxed)),
        (
            CONNECTIONS_REFUSED,
            g.connections_refused.load(Ordering::Relaxed),
        ),
        (BUDGET_REFUSED, g.budget_refused.load(Ordering::Relaxed)),
        (KEY_LIMITED, g.key_limited.load(Ordering::Relaxed)),
        (HEAP_TRIMS, g.heap_trims()),
    ] {
        e.sample(family, &[], v);
    }
    (
        [(header::CONTENT_TYPE, pstack_exposition::CONTENT_TYPE)],
        e.render(),
    )
        .into_response()
}

const LOGIN_VERIFIER_BUSY: Family = Family::counter(
    "pstack_store_login_verifier_busy_total",
    "Operator logins answered 429 because every password verifier slot, or this address's share, was taken.",
);
const CONNECTIONS_OPEN: Family =
    Family::gauge("pstack_store_connections_open", "Connections served now.");
const CONNECTIONS_REFUSED: Family = Family::counter(
    "pstack_store_connections_refused_total",
    "Connections closed at accept over the connection cap.",
);
const BUDGET_REFUSED: Family = Family::counter(
    "pstack_store_budget_refused_total",
    "Ingest requests answered 503 because the in-flight byte budget was held.",
);
const HEAP_TRIMS: Family = Family::counter(
    "pstack_store_heap_trims_total",
    "Times freed heap was given back to the OS, once ingest had been quiet for 200 ms.",
);
const KEY_LIMITED: Family = Family::counter(
    "pstack_store_key_limited_total",
    "Ingest requests answered 429 because their key had its limit in flight.",
);

/// The authenticated caller of a route.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// The key's public id (recorded on everything it writes).
    pub key_id: String,
    /// What it may do.
    pub scopes: ScopeSet,
}

/// Authenticate the request's key and require `need` of it: 401 without a
/// live key, 403 `insufficient_scope` naming `need` when the key lacks it.
pub(crate) async fn authenticate(
    state: &AppState,
    headers: &HeaderMap,
    need: Scope,
) -> Result<Caller, ApiError> {
    let caller = authenticate_any(state, headers).await?;
    if caller.scopes.allows(need) {
        return Ok(caller);
    }
    *lock(&state.metrics.auth_failures)
        .entry("insufficient_scope")
        .or_insert(0) += 1;
    tracing::warn!(key_id = %caller.key_id, need = %need, scopes = %caller.scopes, "refused API key: insufficient scope");
    let e = ApiError::new(
        StatusCode::FORBIDDEN,
        "insufficient_scope",
        format!(
            "this route needs scope {need}; key {} holds {} (scope {need} is for {})",
            caller.key_id,
            caller.scopes,
            need.holder()
        ),
    );
    Err(e
        .detail(json!({"requiredScope": need.as_str(), "keyScopes": caller.scopes.names()}))
        .needs_scope(need))
}

/// Authenticate the request's key, whatever its scopes.
pub(crate) async fn authenticate_any(
    state: &AppState,
    headers: &HeaderMap,
) -> Result<Caller, ApiError> {
    let fail = |reason: &'static str, message: &str| {
        *lock(&state.metrics.auth_failures)
            .entry(reason)
            .or_insert(0) += 1;
        tracing::warn!(reason, "refused API key");
        ApiError::new(StatusCode::UNAUTHORIZED, reason, message)
    };
    let Some(value) = headers.get(header::AUTHORIZATION) else {
        return Err(fail("missing_api_key", "send Authorization: Bearer <key>"));
    };
    let Some(key) = value.to_str().ok().and_then(|v| v.strip_prefix("Bearer ")) else {
        return Err(fail(
            "missing_api_key",
            "Authorization must be Bearer <key>",
        ));
    };
    match state.store.check_key(key.trim()).await? {
        KeyCheck::Valid(key_id, scopes) => Ok(Caller { key_id, scopes }),
        KeyCheck::Revoked(_) => Err(fail("revoked_api_key", "this API key was revoked")),
        KeyCheck::Unknown => Err(fail("unknown_api_key", "no such API key")),
    }
}

/// One per-item result of `POST /v1/envelopes`.
#[derive(Debug, Clone, Serialize, serde::Deserialize, PartialEq, Eq)]
pub struct ItemResult {
    /// Position in the batch (0-based).
    pub index: usize,
    /// The digest (for rejected items: the declared one, when well-formed).
    pub digest: Option<String>,
    /// `accepted`, `duplicate` or `rejected`.
    pub status: String,
    /// When the store first received it (accepted/duplicate).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub received_at: Option<String>,
    /// Key that first shipped it (accepted/duplicate).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_id: Option<String>,
    /// Why it was rejected.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reasons: Vec<Reason>,
}

/// Body of a `POST /v1/envelopes` response.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct IngestResponse {
    /// Newly stored.
    pub accepted: usize,
    /// Already stored.
    pub duplicate: usize,
    /// Refused.
    pub rejected: usize,
    /// One per item, in request order.
    pub results: Vec<ItemResult>,
}

/// Admit one ingest request (`/v1/envelopes`, `/v1/traces`) of `key_id`:
/// a slot of the key's concurrency and its declared wire body reserved from
/// the in-flight budget, before a byte of the body is read. Refused: 429
/// `key_busy` or 503 `busy`, both with Retry-After. Returns what it holds
/// and the bytes declared (Content-Length, at most `max_body_bytes`).
pub(crate) fn admit_ingest(
    state: &AppState,
    key_id: &str,
    headers: &HeaderMap,
) -> Result<(crate::conn::Held, u64), ApiError> {
    let limits = state.limits;
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        .map_or(limits.max_body_bytes as u64, |n| {
            n.min(limits.max_body_bytes as u64)
        });
    let held = state
        .guards
        .admit(key_id, declared)
        .map_err(|r| match r {
            crate::conn::Refusal::KeyBusy { limit } => {
                ApiError::new(
                    StatusCode::TOO_MANY_REQUESTS,
                    "key_busy",
                    format!("this key already has {limit} ingest requests in flight; retry after the Retry-After delay"),
                )
                .retry_after(1)
            }
            crate::conn::Refusal::Budget { wanted, budget } => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "busy",
                format!("requests in flight hold the store's {budget}-byte memory budget; this one needs up to {wanted} bytes: retry after the Retry-After delay"),
            ),
        })?;
    Ok((held, declared))
}

/// Read an admitted request's body: at most `max_body_bytes`, streamed into
/// one buffer sized from Content-Length (what [`admit_ingest`] reserved),
/// never grown by doubling past it.
pub(crate) async fn read_body(
    body: Body,
    headers: &HeaderMap,
    declared: u64,
    limits: &IngestLimits,
) -> Result<bytes::Bytes, ApiError> {
    use http_body_util::BodyExt;
    let too_large = || {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "body_too_large",
            format!("request body exceeds {} bytes", limits.max_body_bytes),
        )
    };
    if let Some(len) = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        && len > limits.max_body_bytes as u64
    {
        return Err(too_large());
    }
    let mut body = body;
    let mut buf = Vec::with_capacity(declared as usize);
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                "body_incomplete",
                format!("the request body ended early: {e}"),
            )
        })?;
        if let Ok(data) = frame.into_data() {
            if buf.len() + data.len() > limits.max_body_bytes {
                return Err(too_large());
            }
            buf.extend_from_slice(&data);
        }
    }
    Ok(bytes::Bytes::from(buf))
}

async fn post_envelopes(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let key_id = authenticate(&state, &headers, Scope::Ingest).await?.key_id;
    let limits = state.limits;
    // Reserve the wire body before reading a byte of it; decoding reserves
    // each further megabyte as it goes (ingest::decode_body_within).
    let (mut held, declared) = admit_ingest(&state, &key_id, &headers)?;
    let raw = read_body(body, &headers, declared, &limits).await?;
    let encoding = headers
        .get(header::CONTENT_ENCODING)
        .map(|v| v.to_str().unwrap_or("invalid").to_string());
    let ndjson = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(|t| {
            let t = t
                .split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase();
            t == "application/x-ndjson" || t == "application/ndjson" || t == "application/jsonl"
        })
        .unwrap_or(false);
    let guards = state.guards.clone();
    let verdicts = tokio::task::spawn_blocking(move || {
        let decoded = ingest::decode_body_within(raw, encoding.as_deref(), &limits, &mut |n| {
            let ok = held.grow(n);
            if !ok {
                guards
                    .budget_refused
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            ok
        })?;
        let (framing, items) = ingest::split_items(&decoded, ndjson, &limits)?;
        let verdicts = ingest::verify_items(&decoded, &items, &limits);
        Ok::<_, ingest::BodyError>((framing, verdicts, decoded.len()))
    })
    .await
    .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string()))?;
    let (framing, verdicts, decoded_len) = verdicts.map_err(|e| {
        let status = match e {
            ingest::BodyError::TooLarge { .. }
            | ingest::BodyError::DecodedTooLarge { .. }
            | ingest::BodyError::TooManyItems { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ingest::BodyError::UnsupportedEncoding(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ingest::BodyError::Busy => StatusCode::SERVICE_UNAVAILABLE,
            _ => StatusCode::BAD_REQUEST,
        };
        ApiError::new(status, e.code(), e.to_string())
    })?;
    let m = &state.metrics;
    m.ingest_bytes
        .fetch_add(decoded_len as u64, Ordering::Relaxed);
    let verified: Vec<&ingest::VerifiedItem> = verdicts
        .iter()
        .filter_map(|v| match v {
            ItemVerdict::Verified(item) => Some(item.as_ref()),
            ItemVerdict::Rejected(_) => None,
        })
        .collect();
    let records = if verified.is_empty() {
        Vec::new()
    } else {
        m.ingest_batches.fetch_add(1, Ordering::Relaxed);
        state
            .store
            .ingest(&verified, &key_id, pstack_store_core::now_ns())
            .await?
    };
    let mut records = records.into_iter();
    let mut resp = IngestResponse {
        accepted: 0,
        duplicate: 0,
        rejected: 0,
        results: Vec::with_capacity(verdicts.len()),
    };
    for (index, v) in verdicts.iter().enumerate() {
        match v {
            ItemVerdict::Verified(item) => {
                let Some(rec) = records.next() else { break };
                let status = match rec.status {
                    StoredStatus::Accepted => {
                        resp.accepted += 1;
                        "accepted"
                    }
                    StoredStatus::Duplicate => {
                        resp.duplicate += 1;
                        "duplicate"
                    }
                };
                resp.results.push(ItemResult {
                    index,
                    digest: Some(item.digest.clone()),
                    status: status.into(),
                    received_at: Some(pstack_store_core::ident::format_ns(rec.received_ns)),
                    key_id: Some(rec.key_id),
                    reasons: Vec::new(),
                });
            }
            ItemVerdict::Rejected(r) => {
                resp.rejected += 1;
                let mut by_rule = lock(&m.rejected_by_rule);
                for reason in &r.reasons {
                    *by_rule.entry(reason.rule.clone()).or_insert(0) += 1;
                    if let Some(missing) =
                        pstack_store_core::runs::acceptance::unknown_missing(reason)
                    {
                        m.acceptance.add_unknown_missing(missing);
                    }
                }
                resp.results.push(ItemResult {
                    index,
                    digest: r.declared_digest.clone(),
                    status: "rejected".into(),
                    received_at: None,
                    key_id: None,
                    reasons: r.reasons.clone(),
                });
            }
        }
    }
    m.items_accepted
        .fetch_add(resp.accepted as u64, Ordering::Relaxed);
    m.items_duplicate
        .fetch_add(resp.duplicate as u64, Ordering::Relaxed);
    m.items_rejected
        .fetch_add(resp.rejected as u64, Ordering::Relaxed);
    tracing::info!(
        key_id = %key_id,
        accepted = resp.accepted,
        duplicate = resp.duplicate,
        rejected = resp.rejected,
        bytes = decoded_len,
        "ingest"
    );
    let status = match framing {
        Framing::Single if resp.rejected == 1 => StatusCode::UNPROCESSABLE_ENTITY,
        Framing::Single if resp.accepted == 1 => StatusCode::CREATED,
        _ => StatusCode::OK,
    };
    Ok((status, Json(resp)).into_response())
}

fn check_digest(d: &str) -> Result<(), ApiError> {
    if pstack_envelope::is_sha256_digest(d) {
        Ok(())
    } else {
        Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_digest",
            format!("{d:?} is not sha256:<64 lowercase hex>"),
        ))
    }
}

fn not_found(d: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "envelope_not_found",
        format!("no envelope {d} in the store"),
    )
}

async fn get_envelope(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(digest): Path<String>,
) -> Result<Response, ApiError> {
    authenticate(&state, &headers, Scope::Read).await?;
    check_digest(&digest)?;
    let bytes = state
        .store
        .envelope_bytes(&digest)
        .await?
        .ok_or_else(|| not_found(&digest))?;
    let etag = HeaderValue::from_str(&format!("\"{digest}\"")).ok();
    let mut resp = ([(header::CONTENT_TYPE, "application/json")], bytes).into_response();
    if let Some(etag) = etag {
        resp.headers_mut().insert(header::ETAG, etag);
    }
    Ok(resp)
}

async fn load(state: &AppState, digest: &str) -> Result<pstack_envelope::Envelope, ApiError> {
    check_digest(digest)?;
    state
        .store
        .envelope(digest)
        .await?
        .ok_or_else(|| not_found(digest))
}

fn bad_query(message: impl Into<String>) -> ApiError {
    ApiError::new(StatusCode::BAD_REQUEST, "invalid_query", message)
}

fn parse_limit(v: Option<&String>, default: i64) -> Result<i64, ApiError> {
    match v {
        None => Ok(default),
        Some(s) => match s.parse::<i64>() {
            Ok(n) if (1..=1000).contains(&n) => Ok(n),
            _ => Err(bad_query(format!(
                "limit {s:?} must be an integer in 1..=1000"
            ))),
        },
    }
}

async fn get_subjects(
    State(state): State<AppState>,
    headers: HeaderMap,
    Query(mut params): Query<BTreeMap<String, String>>,
) -> Result<Response, ApiError> {
    authenticate(&state, &headers, Scope::Read).await?;
    let limit = parse_limit(params.remove("limit").as_ref(), 50)?;
    let before =
        match params.remove("before") {
            None => None,
            Some(c) => {
                let parsed = c
                    .split_once('_')
                    .and_then(|(w, d)| Some((w.parse::<i64>().ok()?, d.to_string())))
                    .filter(|(_, d)| pstack_envelope::is_sha256_digest(d));
                Some(parsed.ok_or_else(|| {
                    bad_query(format!("cursor {c:?} is not one this store issued"))
                })?)
            }
        };
    let q = if let Some(key) = params.remove("subject") {
        check_digest(&key)?;
        if !params.is_empty() {
            return Err(bad_query(
                "subject= names the whole identity; give no other identity fields",
            ));
        }
        db::HistoryQuery {
            subject_key: Some(key),
            before,
            limit,
            ..Default::default()
        }
    } else {
        let kind = params.remove("kind").ok_or_else(|| {
            bad_query("give kind= and the subject's identity fields, or subject=<key>")
        })?;
        db::history_query(&kind, &params, before, limit).map_err(bad_query)?
    };
    let items = state.store.history(&q).await?;
    let next = (items.len() as i64 == limit)
        .then(|| items.last().map(|l| format!("{}_{}", l.wall_ns, l.digest)))
        .flatten();
    Ok(Json(json!({"items": items, "next": next})).into_response())
}

async fn get_diff(
    State(state): State<AppState>,
    headers: HeaderMap,
    Query(params): Query<BTreeMap<String, String>>,
) -> Result<Response, ApiError> {
    authenticate(&state, &headers, Scope::Read).await?;
    if let Some(k) = params
        .keys()
        .find(|k| !DiffQuery::PARAMS.contains(&k.as_str()))
    {
        return Err(bad_query(format!(
            "unknown parameter {k:?} ({})",
            DiffQuery::PARAMS.join(", ")
        )));
    }
    let (Some(b), Some(a)) = (params.get("before"), params.get("after")) else {
        return Err(bad_query("give before=<digest>&after=<digest>"));
    };
    let before = load(&state, b).await?;
    let after = load(&state, a).await?;
    match pstack_envelope::diff(&before, &after) {
        Ok(d) => Ok(Json(d).into_response()),
        Err(e) => Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            e.rule(),
            e.to_string(),
        )),
    }
}

async fn get_handoff(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(digest): Path<String>,
) -> Result<Response, ApiError> {
    authenticate(&state, &headers, Scope::Read).await?;
    let env = load(&state, &digest).await?;
    Ok(Json(pstack_envelope::handoff(&env)).into_response())
}

async fn get_unknowns(
    State(state): State<AppState>,
    headers: HeaderMap,
    Query(params): Query<BTreeMap<String, String>>,
) -> Result<Response, ApiError> {
    authenticate(&state, &headers, Scope::Read).await?;
    for k in params.keys() {
        if !UnknownsQuery::PARAMS.contains(&k.as_str()) {
            return Err(bad_query(format!(
                "unknown parameter {k:?} ({})",
                UnknownsQuery::PARAMS.join(", ")
            )));
        }
    }
    let open = match params.get("open").map(String::as_str) {
        None | Some("true") => true,
        Some("false") => false,
        Some(o) => return Err(bad_query(format!("open={o:?} must be true or false"))),
    };
    let limit = parse_limit(params.get("limit"), 100)?;
    let offset = match params.get("offset") {
        None => 0,
        Some(o) => o
            .parse::<i64>()
            .ok()
            .filter(|n| *n >= 0)
            .ok_or_else(|| bad_query(format!("offset {o:?} must be a non-negative integer")))?,
    };
    let items = state
        .store
        .unknowns(open, params.get("owner").map(String::as_str), limit, offset)
        .await?;
    Ok(Json(json!({"items": items})).into_response())
}

async fn post_receipt(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let key_id = authenticate(&state, &headers, Scope::Analysis)
        .await?
        .key_id;
    let bytes = axum::body::to_bytes(body, 1 << 20).await.map_err(|_| {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "body_too_large",
            "receipt bodies are at most 1 MiB",
        )
    })?;
    let req: ReceiptRequest = serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, "invalid_receipt", e.to_string()))?;
    let rec = state
        .store
        .record_receipt(&req, &key_id, pstack_store_core::now_ns())
        .await?;
    tracing::info!(kind = %rec.kind, id = rec.id, key_id = %key_id, "receipt recorded");
    Ok((StatusCode::CREATED, Json(rec)).into_response())
}

async fn get_receipts(
    State(state): State<AppState>,
    headers: HeaderMap,
    Query(params): Query<BTreeMap<String, String>>,
) -> Result<Response, ApiError> {
    authenticate(&state, &headers, Scope::Read).await?;
    let subject = params
        .get("subject")
        .ok_or_else(|| bad_query("give subject=<subject key>"))?;
    check_digest(subject)?;
    let items = state.store.receipts(subject).await?;
    Ok(Json(json!({"items": items})).into_response())
}
