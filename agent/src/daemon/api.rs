//! The HTTP API served on the Unix socket.
//!
//! Routes: `POST /v1/captures`, `GET /v1/envelopes/{digest}`, `GET /v1/status`,
//! `GET /metrics`. Every error is JSON `{"error":{"code","message"}}` with a
//! precise status: 400 malformed or invalid request, 403 peer not authorized,
//! 404 unknown route or absent envelope, 405 wrong method, 413 body too large,
//! 429 over the capture limit (with `Retry-After`), 503 draining or no helper,
//! 504 supervisor overran its deadline, 507 spool full under `refuse_new`.
//!
//! Invariants:
//! - Authorization runs before any handler: a refused peer never reaches
//!   body parsing. The refusal log carries uid, gid and pid, never the request.
//! - A capture answers 200 only after its envelope is durably spooled (see
//!   `spool`): a 200 is the daemon's promise that the envelope will be shipped
//!   (or, under `drop_oldest`, counted in `pstackd_spool_dropped_total` and
//!   journaled if it is ever dropped). The answer says which: header
//!   `x-pstack-spool-status: spooled | spooled_may_be_dropped |
//!   already_spooled`, and `x-pstack-spool-dropped: N` older envelopes
//!   dropped to make room for it.
//! - Over-limit captures are refused at once with 429; nothing queues. Every
//!   capture kind (process, thread, host, transport, longhorn, tcp_trace)
//!   holds one slot while its engine runs (`engines`).
//! - A refused request names the field at fault (`"field"` in the error
//!   body) and runs nothing.
//! - A process capture answers its envelope as JSON; the other kinds answer
//!   NDJSON, one spooled envelope per line (`x-pstack-digest` lists them).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime};

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::json;

use super::capture::parse_request;
use super::config::CaptureConfig;
use super::engines::{self, EngineFailure};
use super::peer::PeerCred;
use super::spool::SpoolError;
use super::state::DaemonState;
use crate::supervisor::CaptureError;
use pstack_capture::request::ValidRequest;
use pstack_capture::transport::TransportError;

/// Extra time the supervisor gets past its bundle deadline before the
/// request is answered 504 (it still finishes in the background).
pub const OVERRUN_GRACE: Duration = Duration::from_secs(2);

/// An API error response.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
    retry_after: Option<u64>,
    field: Option<String>,
}

impl ApiError {
    /// A new error.
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            code,
            message: message.into(),
            retry_after: None,
            field: None,
        }
    }

    /// Name the request field at fault (`"field"` in the error body).
    pub fn with_field(mut self, field: Option<String>) -> ApiError {
        self.field = field;
        self
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = match &self.field {
            Some(f) => json!({"error": {"code": self.code, "message": self.message, "field": f}}),
            None => json!({"error": {"code": self.code, "message": self.message}}),
        };
        let mut resp = (self.status, axum::Json(body)).into_response();
        if let Some(secs) = self.retry_after
            && let Ok(v) = HeaderValue::from_str(&secs.to_string())
        {
            resp.headers_mut().insert(header::RETRY_AFTER, v);
        }
        resp
    }
}

/// The router, with authorization applied to every route.
pub fn router(state: Arc<DaemonState>) -> Router {
    Router::new()
        .route("/v1/captures", post(post_capture))
        .route("/v1/envelopes/{digest}", get(get_envelope))
        .route("/v1/status", get(get_status))
        .route("/metrics", get(get_metrics))
        .fallback(fallback)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(state.clone(), authorize))
        .with_state(state)
}

async fn authorize(State(state): State<Arc<DaemonState>>, req: Request, next: Next) -> Response {
    let peer = req.extensions().get::<PeerCred>().copied();
    let policy = state.policy();
    match peer {
        Some(p) if policy.allows(&p) => next.run(req).await,
        _ => {
            state.counters.unauthorized.fetch_add(1, Ordering::Relaxed);
            let (uid, gid, pid) =
                peer.map(|p| (p.uid, p.gid, p.pid.unwrap_or(0)))
                    .unwrap_or((u32::MAX, u32::MAX, 0));
            tracing::warn!(
                uid,
                gid,
                pid,
                "refused a peer that is neither root nor in the configured group"
            );
            ApiError::new(
                StatusCode::FORBIDDEN,
                "forbidden",
                format!(
                    "uid {uid} (gid {gid}) may not use pstackd: only root and members of group {:?} may",
                    policy.group_name
                ),
            )
            .into_response()
        }
    }
}

async fn fallback(State(state): State<Arc<DaemonState>>) -> ApiError {
    state.counters.bad_requests.fetch_add(1, Ordering::Relaxed);
    ApiError::new(
        StatusCode::NOT_FOUND,
        "no_such_route",
        "routes: POST /v1/captures, GET /v1/envelopes/{digest}, GET /v1/status, GET /metrics",
    )
}

async fn method_not_allowed(State(state): State<Arc<DaemonState>>) -> ApiError {
    state.counters.bad_requests.fetch_add(1, Ordering::Relaxed);
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "method not allowed on this route",
    )
}

/// A Longhorn request may name only the manager APIs and Hubble servers the
/// daemon's configuration lists: pstackd is root, its caller only a member of
/// the socket's group, so an address only the caller chose is never
/// contacted. Refused before anything is opened.
fn endpoints_allowed(request: &ValidRequest, capture: &CaptureConfig) -> Result<(), ApiError> {
    let ValidRequest::Longhorn(plan) = request else {
        return Ok(());
    };
    let checks = [
        (
            "longhorn_api",
            "capture.longhorn_apis",
            plan.request.longhorn_api.as_deref(),
            &capture.longhorn_apis,
        ),
        (
            "hubble_server",
            "capture.hubble_servers",
            plan.request.hubble_server.as_deref(),
            &capture.hubble_servers,
        ),
    ];
    for (field, key, asked, allowed) in checks {
        if let Some(asked) = asked
            && !allowed.iter().any(|a| a == asked)
        {
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "endpoint_not_allowed",
                format!("{field} {asked:?} is not listed in pstackd's {key}; add it there (and reload) to let callers name it"),
            )
            .with_field(Some(field.to_string())));
        }
    }
    Ok(())
}

fn capture_status(e: &CaptureError) -> (StatusCode, &'static str) {
    match e {
        CaptureError::NoSuchProcess { .. } => (StatusCode::NOT_FOUND, "no_such_subject"),
        CaptureError::InvalidParameter { .. } | CaptureError::MissingDeadline { .. } => {
            (StatusCode::BAD_REQUEST, "invalid_request")
        }
        CaptureError::IdentityUnreadable { .. } => {
            (StatusCode::UNPROCESSABLE_ENTITY, "identity_unreadable")
        }
        CaptureError::HelperNotFound { .. } => {
            (StatusCode::SERVICE_UNAVAILABLE, "helper_not_found")
        }
        _ => (StatusCode::INTERNAL_SERVER_ERROR, "capture_failed"),
    }
}

async fn post_capture(
    State(state): State<Arc<DaemonState>>,
    body: Body,
) -> Result<Response, ApiError> {
    let config = state.config();
    let bytes = axum::body::to_bytes(body, config.max_request_bytes)
        .await
        .map_err(|_| {
            state.counters.bad_requests.fetch_add(1, Ordering::Relaxed);
            ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "body_too_large",
                format!("request body exceeds {} bytes", config.max_request_bytes),
            )
        })?;
    let request = parse_request(&bytes, &config).map_err(|e| {
        state.counters.bad_requests.fetch_add(1, Ordering::Relaxed);
        ApiError::new(StatusCode::BAD_REQUEST, e.code(), e.to_string()).with_field(e.field())
    })?;
    if let Err(e) = endpoints_allowed(&request, &config.capture) {
        state.counters.bad_requests.fetch_add(1, Ordering::Relaxed);
        return Err(e);
    }
    if state.draining.load(Ordering::SeqCst) {
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "draining",
            "pstackd is shutting down; retry against the restarted daemon",
        ));
    }
    let Some(slot) = state.admit() else {
        state.counters.captures_busy.fetch_add(1, Ordering::Relaxed);
        let mut e = ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "too_many_captures",
            format!(
                "{} captures are running (the limit); retry later",
                config.max_concurrent_captures
            ),
        );
        e.retry_after = Some(1);
        return Err(e);
    };
    // Only a spool already at its bound refuses before capturing; the real
    // size is checked by the spool's put, against the same bound.
    if !state.spool.has_room_for(0) {
        state
            .counters
            .captures_spool_full
            .fetch_add(1, Ordering::Relaxed);
        state.spool.counters.refused.fetch_add(1, Ordering::Relaxed);
        return Err(ApiError::new(
            StatusCode::INSUFFICIENT_STORAGE,
            "spool_full",
            "the spool is full and the overflow policy refuses new captures until shipping makes room",
        ));
    }
    let supervisor = match &state.engine.supervisor {
        Ok(s) => s.clone(),
        Err(reason) => {
            return Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "helper_not_found",
                reason.clone(),
            ));
        }
    };
    let Some(budget) = state.engine.budget.clone() else {
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "helper_not_found",
            "no leak budget",
        ));
    };
    let bundle = request.run_deadline();
    let spool = state.spool.clone();
    let work = tokio::task::spawn_blocking(move || {
        let _slot = slot; // held until the engine really returns
        engines::run_and_spool(&request, &supervisor, &budget, &spool)
    });
    let result = match tokio::time::timeout(bundle + OVERRUN_GRACE, work).await {
        Ok(Ok(r)) => r,
        Ok(Err(join)) => {
            state
                .counters
                .captures_failed
                .fetch_add(1, Ordering::Relaxed);
            return Err(ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "capture_panicked",
                format!("the capture task failed: {join}"),
            ));
        }
        Err(_) => {
            state
                .counters
                .captures_overran
                .fetch_add(1, Ordering::Relaxed);
            return Err(ApiError::new(
                StatusCode::GATEWAY_TIMEOUT,
                "capture_overran",
                format!(
                    "the capture did not finish within its {} ms deadline plus {} ms grace",
                    bundle.as_millis(),
                    OVERRUN_GRACE.as_millis()
                ),
            ));
        }
    };
    match result {
        Ok(captured) => {
            state.counters.captures_ok.fetch_add(1, Ordering::Relaxed);
            state.shipper_wake.notify_one();
            for e in &captured.envelopes {
                tracing::info!(kind = captured.kind, digest = %e.digest, bytes = e.bytes.len(), outcome = ?e.put, "capture spooled");
            }
            Ok(captured_response(&state, captured))
        }
        Err(e) => Err(failure_response(&state, e)),
    }
}

/// A process capture answers its one envelope as JSON (as before kinds);
/// every other kind answers NDJSON, one compact envelope per line, in the
/// order `pstackctl … --json` prints them.
fn captured_response(state: &DaemonState, captured: engines::Captured) -> Response {
    let single = captured.kind == "process";
    let mut body = Vec::new();
    for e in &captured.envelopes {
        body.extend_from_slice(&e.bytes);
        if !single {
            body.push(b'\n');
        }
    }
    let mut resp = Response::new(Body::from(body));
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(if single {
            "application/json"
        } else {
            "application/x-ndjson"
        }),
    );
    let digests: Vec<&str> = captured
        .envelopes
        .iter()
        .map(|e| e.digest.as_str())
        .collect();
    if let Ok(v) = HeaderValue::from_str(&digests.join(",")) {
        h.insert("x-pstack-digest", v);
    }
    h.insert(
        "x-pstack-capture-kind",
        HeaderValue::from_static(captured.kind),
    );
    if let Some(status) = captured.trace_refused
        && let Ok(v) = HeaderValue::from_str(status.as_str())
    {
        h.insert("x-pstack-trace-refused", v);
    }
    // What the acknowledgement promises: under drop_oldest a spooled
    // capture may still be dropped before it is shipped. With several
    // envelopes: `already_spooled` only when every one was.
    let mut dropped = 0;
    let mut written = false;
    for e in &captured.envelopes {
        if let super::spool::PutOutcome::Written { dropped: d } = e.put {
            written = true;
            dropped += d;
        }
    }
    let spool_status = if !written {
        "already_spooled"
    } else if state.spool.limits().overflow == super::config::OverflowPolicy::DropOldest {
        "spooled_may_be_dropped"
    } else {
        "spooled"
    };
    h.insert(
        "x-pstack-spool-status",
        HeaderValue::from_static(spool_status),
    );
    h.insert("x-pstack-spool-dropped", HeaderValue::from(dropped));
    resp
}

fn failure_response(state: &DaemonState, e: EngineFailure) -> ApiError {
    let failed = || {
        state
            .counters
            .captures_failed
            .fetch_add(1, Ordering::Relaxed);
    };
    match e {
        EngineFailure::Capture(e) => {
            failed();
            let (status, code) = capture_status(&e);
            ApiError::new(status, code, e.to_string())
        }
        EngineFailure::Transport(e) => {
            failed();
            let (status, code, field) = transport_status(&e);
            ApiError::new(status, code, e.to_string()).with_field(field.map(String::from))
        }
        EngineFailure::Trace(e) => {
            failed();
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "capture_failed",
                e.to_string(),
            )
        }
        EngineFailure::Spool(e) => {
            let (status, code) = match e {
                SpoolError::Full { .. } | SpoolError::NoSpace { .. } => {
                    state
                        .counters
                        .captures_spool_full
                        .fetch_add(1, Ordering::Relaxed);
                    (StatusCode::INSUFFICIENT_STORAGE, "spool_full")
                }
                _ => {
                    failed();
                    (StatusCode::INTERNAL_SERVER_ERROR, "spool_failed")
                }
            };
            tracing::error!(error = %e, "captured envelope could not be spooled; not acknowledged");
            ApiError::new(status, code, e.to_string())
        }
        EngineFailure::Encode(e) => {
            failed();
            ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "encode_failed", e)
        }
    }
}

/// Status, code and request field of a transport engine refusal. A netns
/// the caller named that cannot be opened is the caller's input: 400 with
/// the field, and nothing was spawned or read.
fn transport_status(e: &TransportError) -> (StatusCode, &'static str, Option<&'static str>) {
    use pstack_collectors::net::netns::NetnsError;
    match e {
        TransportError::Invalid(_) => (StatusCode::BAD_REQUEST, "invalid_parameter", None),
        TransportError::Netns(NetnsError::ProcessGone { .. }) => (
            StatusCode::BAD_REQUEST,
            "netns_unavailable",
            Some("netns_pid"),
        ),
        TransportError::Netns(NetnsError::NoSuchNetns { .. } | NetnsError::InvalidName { .. }) => {
            (StatusCode::BAD_REQUEST, "netns_unavailable", Some("netns"))
        }
        TransportError::Netns(NetnsError::PermissionDenied { .. }) => {
            (StatusCode::FORBIDDEN, "netns_permission_denied", None)
        }
        TransportError::Netns(_) => (StatusCode::UNPROCESSABLE_ENTITY, "netns_unavailable", None),
        TransportError::Helper(c) => {
            let (s, code) = capture_status(c);
            (s, code, None)
        }
        TransportError::Host(_) => (
            StatusCode::UNPROCESSABLE_ENTITY,
            "identity_unreadable",
            None,
        ),
        TransportError::Sealing(_) | TransportError::Building(_) => {
            (StatusCode::INTERNAL_SERVER_ERROR, "capture_failed", None)
        }
    }
}

async fn get_envelope(
    State(state): State<Arc<DaemonState>>,
    Path(digest): Path<String>,
) -> Result<Response, ApiError> {
    if !pstack_envelope::is_sha256_digest(&digest) {
        state.counters.bad_requests.fetch_add(1, Ordering::Relaxed);
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_digest",
            format!("{digest:?} is not sha256:<64 lowercase hex>"),
        ));
    }
    let spool = state.spool.clone();
    let d = digest.clone();
    let read = tokio::task::spawn_blocking(move || spool.read_verified(&d))
        .await
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string()))?;
    match read {
        Ok(Some(bytes)) => {
            let mut resp = Response::new(Body::from(bytes));
            resp.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            Ok(resp)
        }
        Ok(None) => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "envelope_not_spooled",
            format!(
                "{digest} is not in the spool (never captured here, or already shipped: ask the store)"
            ),
        )),
        Err(e) => Err(ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "spool_failed",
            e.to_string(),
        )),
    }
}

fn lag_seconds(state: &DaemonState) -> u64 {
    state
        .spool
        .oldest_spooled_at()
        .and_then(|t| SystemTime::now().duration_since(t).ok())
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// The status document (also used by `pstackctl status`).
pub fn status_json(state: &DaemonState) -> serde_json::Value {
    let config = state.config();
    let s = &state.shipper_stats;
    let failures: serde_json::Map<String, serde_json::Value> = s
        .failures
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .map(|(k, v)| ((*k).to_string(), json!(v)))
        .collect();
    let (leaked, budget, available) = match &state.engine.budget {
        Some(b) => {
            b.refresh_from_journal();
            (b.in_use(), b.capacity(), b.available())
        }
        None => (0, 0, 0),
    };
    let in_flight = state.in_flight.load(Ordering::SeqCst);
    json!({
        "version": env!("CARGO_PKG_VERSION"),
        "uptime_seconds": state.started.elapsed().as_secs(),
        "draining": state.draining.load(Ordering::SeqCst),
        "captures": {
            "in_flight": in_flight,
            "max_concurrent": config.max_concurrent_captures,
            "ok_total": state.counters.captures_ok.load(Ordering::Relaxed),
            "failed_total": state.counters.captures_failed.load(Ordering::Relaxed),
            "busy_total": state.counters.captures_busy.load(Ordering::Relaxed),
        },
        "helpers": {
            "live": in_flight,
            "leaked": leaked,
            "leak_budget": budget,
            "leak_budget_available": available,
            "helper": match &state.engine.supervisor {
                Ok(s) => json!({"path": s.helper_path.display().to_string()}),
                Err(e) => json!({"error": e}),
            },
        },
        "spool": state.spool.snapshot(),
        "shipping": {
            "enabled": !config.shipper.url.is_empty(),
            "collector": config.shipper.url,
            "lag_seconds": lag_seconds(state),
            "last_error": s.last_error.lock().unwrap_or_else(|p| p.into_inner()).clone(),
            "last_error_unix": s.last_error_unix.load(Ordering::Relaxed),
            "last_success_unix": s.last_success_unix.load(Ordering::Relaxed),
            "next_retry_ms": s.next_delay_ms.load(Ordering::Relaxed),
            "batches_total": s.batches.load(Ordering::Relaxed),
            "accepted_total": s.accepted.load(Ordering::Relaxed),
            "duplicate_total": s.duplicate.load(Ordering::Relaxed),
            "rejected_total": s.rejected.load(Ordering::Relaxed),
            "failures_total": failures,
        },
        "ebpf": state.engine.ebpf.status_json(),
    })
}

async fn get_status(State(state): State<Arc<DaemonState>>) -> Response {
    axum::Json(status_json(&state)).into_response()
}

async fn get_metrics(State(state): State<Arc<DaemonState>>) -> Response {
    let mut resp = Response::new(Body::from(metrics_text(&state)));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    resp
}

/// Prometheus text exposition.
pub fn metrics_text(state: &DaemonState) -> String {
    use std::fmt::Write;
    let mut out = String::with_capacity(4096);
    let mut metric = |name: &str, kind: &str, help: &str, samples: &[(&str, u64)]| {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} {kind}");
        for (labels, v) in samples {
            if labels.is_empty() {
                let _ = writeln!(out, "{name} {v}");
            } else {
                let _ = writeln!(out, "{name}{{{labels}}} {v}");
            }
        }
    };
    let c = &state.counters;
    let r = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
    metric(
        "pstackd_captures_total",
        "counter",
        "Capture requests by outcome.",
        &[
            ("outcome=\"ok\"", r(&c.captures_ok)),
            ("outcome=\"failed\"", r(&c.captures_failed)),
            ("outcome=\"busy\"", r(&c.captures_busy)),
            ("outcome=\"spool_full\"", r(&c.captures_spool_full)),
            ("outcome=\"overran\"", r(&c.captures_overran)),
        ],
    );
    metric(
        "pstackd_captures_in_flight",
        "gauge",
        "Captures running now (each holds one helper).",
        &[("", state.in_flight.load(Ordering::SeqCst) as u64)],
    );
    metric(
        "pstackd_requests_refused_total",
        "counter",
        "Requests refused.",
        &[
            ("reason=\"unauthorized\"", r(&c.unauthorized)),
            ("reason=\"bad_request\"", r(&c.bad_requests)),
        ],
    );
    metric(
        "pstackd_connections_open",
        "gauge",
        "Connections open.",
        &[("", r(&c.connections_open))],
    );
    metric(
        "pstackd_connections_refused_total",
        "counter",
        "Connections closed at accept (over max_connections).",
        &[("", r(&c.connections_refused))],
    );
    metric(
        "pstackd_reloads_total",
        "counter",
        "Configuration reloads.",
        &[
            ("result=\"applied\"", r(&c.reloads_ok)),
            ("result=\"rejected\"", r(&c.reloads_rejected)),
        ],
    );
    let sp = state.spool.snapshot();
    metric(
        "pstackd_spool_files",
        "gauge",
        "Envelopes in the spool.",
        &[("", sp.files)],
    );
    metric(
        "pstackd_spool_bytes",
        "gauge",
        "Bytes in the spool.",
        &[("", sp.bytes)],
    );
    metric(
        "pstackd_spool_written_total",
        "counter",
        "Envelopes spooled.",
        &[("", sp.written_total)],
    );
    metric(
        "pstackd_spool_dropped_total",
        "counter",
        "Envelopes dropped by the drop_oldest overflow policy.",
        &[("", sp.dropped_total)],
    );
    metric(
        "pstackd_spool_refused_total",
        "counter",
        "Envelopes the spool refused.",
        &[("", sp.refused_total)],
    );
    metric(
        "pstackd_spool_quarantined_total",
        "counter",
        "Spool files quarantined (corrupt, stray, rejected).",
        &[("", sp.quarantined_total)],
    );
    let s = &state.shipper_stats;
    metric(
        "pstackd_ship_items_total",
        "counter",
        "Items acknowledged by the collector.",
        &[
            ("status=\"accepted\"", r(&s.accepted)),
            ("status=\"duplicate\"", r(&s.duplicate)),
            ("status=\"rejected\"", r(&s.rejected)),
        ],
    );
    metric(
        "pstackd_ship_batches_total",
        "counter",
        "Batches sent.",
        &[("", r(&s.batches))],
    );
    let failures: Vec<(String, u64)> = s
        .failures
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .map(|(k, v)| (format!("class=\"{k}\""), *v))
        .collect();
    let failures: Vec<(&str, u64)> = failures.iter().map(|(k, v)| (k.as_str(), *v)).collect();
    metric(
        "pstackd_ship_failures_total",
        "counter",
        "Failed batch attempts by class.",
        &failures,
    );
    metric(
        "pstackd_ship_lag_seconds",
        "gauge",
        "Age of the oldest unshipped envelope.",
        &[("", lag_seconds(state))],
    );
    if let Some(b) = &state.engine.budget {
        metric(
            "pstackd_helpers_leaked",
            "gauge",
            "Helpers killed but not reaped.",
            &[("", b.in_use())],
        );
        metric(
            "pstackd_leak_budget",
            "gauge",
            "Leak budget capacity.",
            &[("", b.capacity())],
        );
    }
    out.push_str(&state.engine.ebpf.prometheus());
    out
}
