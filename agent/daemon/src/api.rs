//! The HTTP API served on the Unix socket.
//!
//! Routes: `POST /v1/captures`, `GET /v1/captures/{id}`,
//! `GET /v1/captures/{id}/events` (long captures by id, see `captures`),
//! `GET /v1/envelopes/{digest}`, `GET /v1/status`, `GET /metrics`. Every error is JSON `{"error":{"code","message"}}` with a
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
//! - With `Prefer: respond-async` every kind is admitted exactly as above
//!   (same validation, 429, spool and helper checks, same slot held while
//!   the engine runs) and answered `202` + `Location: /v1/captures/{id}`
//!   once admitted; its outcome — envelopes spooled, or the error a
//!   synchronous request would have got — is written to the capture's log.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::SystemTime;

use axum::Extension;
use axum::Router;
use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::json;

use super::capture::parse_request;
use super::captures::{Record, Registry};
use super::config::CaptureConfig;
use super::engines::{self, EngineFailure, RunAborted};
use super::peer::PeerCred;
use super::spool::SpoolError;
use super::state::DaemonState;
use pstack_capture::process::CaptureError;
use pstack_capture::request::ValidRequest;
use pstack_capture::transport::TransportError;
use pstack_exposition::{Exposition, Family};
use pstackd_api::status::{
    CaptureCounts, DaemonStatus, HelperBinary, HelperStatus, ShippingStatus,
};
use pstackd_api::{CaptureEvent, CaptureStarted, ErrorBody, ErrorDetail};

/// Extra time the supervisor gets past its bundle deadline before the
/// request is answered 504 (it still finishes in the background).
pub use pstackd_api::limits::OVERRUN_GRACE;

/// A wire document as JSON whose objects' members are in name order (the
/// order `/v1/status` and the error bodies have always had; serde writes a
/// struct in declaration order).
fn document<T: serde::Serialize>(doc: &T) -> axum::Json<serde_json::Value> {
    axum::Json(serde_json::to_value(doc).unwrap_or_else(|e| {
        json!({"error": {"code": "internal", "message": format!("document not serializable: {e}")}})
    }))
}

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
        let body = document(&ErrorBody {
            error: ErrorDetail {
                code: self.code.to_string(),
                message: self.message,
                field: self.field,
            },
        });
        let mut resp = (self.status, body).into_response();
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
        .route("/v1/captures/{id}", get(get_capture))
        .route("/v1/captures/{id}/events", get(get_capture_events))
        .route("/v1/envelopes/{digest}", get(get_envelope))
        .route("/v1/status", get(get_status))
        .route("/v1/watch", get(get_watch))
        .route("/v1/watch/events", get(get_watch_events))
        .route("/metrics", get(get_metrics))
        .fallback(fallback)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(Extension(Arc::new(Registry::default())))
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
        "routes: POST /v1/captures, GET /v1/captures/{id}, GET /v1/captures/{id}/events, GET /v1/envelopes/{digest}, GET /v1/status, GET /metrics",
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
            plan.request().longhorn_api.as_deref(),
            &capture.longhorn_apis,
        ),
        (
            "hubble_server",
            "capture.hubble_servers",
            plan.request().hubble_server.as_deref(),
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

/// Whether the caller asked for the asynchronous form (RFC 7240
/// `Prefer: respond-async`).
fn wants_async(headers: &HeaderMap) -> bool {
    headers.get_all("prefer").iter().any(|v| {
        v.to_str().is_ok_and(|v| {
            v.split(',')
                .any(|p| p.trim().eq_ignore_ascii_case("respond-async"))
        })
    })
}

/// A request admitted to run: validated, within limits, holding its slot.
struct Admitted {
    request: ValidRequest,
    slot: super::state::CaptureSlot,
    supervisor: pstack_capture::process::SupervisorConfig,
    budget: pstack_capture::process::LeakBudget,
}

/// Everything that refuses a capture before it runs, in order: body size,
/// validation, endpoints, draining, the slot (429), spool room, the helper.
async fn admit(state: &Arc<DaemonState>, body: Body) -> Result<Admitted, ApiError> {
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
    Ok(Admitted {
        request,
        slot,
        supervisor,
        budget,
    })
}

/// Run an admitted capture on the blocking pool; the slot is held until
/// the engine really returns. The outer error is the capture's overrun or
/// panic, counted here.
async fn run_admitted(
    state: &Arc<DaemonState>,
    admitted: Admitted,
    record: Option<Arc<Record>>,
) -> Result<Result<engines::Captured, EngineFailure>, ApiError> {
    let Admitted {
        request,
        slot,
        supervisor,
        budget,
    } = admitted;
    let bundle = request.run_deadline();
    let spool = state.spool.clone();
    let work = move || {
        let _slot = slot; // held until the engine really returns
        engines::run_and_spool_with(&request, &supervisor, &budget, &spool, record.as_deref())
    };
    match engines::run_bounded(bundle, work).await {
        Ok(r) => Ok(r),
        Err(RunAborted::Failed(join)) => {
            state
                .counters
                .captures_failed
                .fetch_add(1, Ordering::Relaxed);
            Err(ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "capture_panicked",
                format!("the capture task failed: {join}"),
            ))
        }
        Err(RunAborted::Overran) => {
            state
                .counters
                .captures_overran
                .fetch_add(1, Ordering::Relaxed);
            Err(ApiError::new(
                StatusCode::GATEWAY_TIMEOUT,
                "capture_overran",
                format!(
                    "the capture did not finish within its {} ms deadline plus {} ms grace",
                    bundle.as_millis(),
                    OVERRUN_GRACE.as_millis()
                ),
            ))
        }
    }
}

fn spooled_ok(state: &DaemonState, captured: &engines::Captured) {
    state.counters.captures_ok.fetch_add(1, Ordering::Relaxed);
    state.shipper_wake.notify_one();
    for e in &captured.envelopes {
        tracing::info!(kind = captured.kind, digest = %e.digest, bytes = e.bytes.len(), outcome = ?e.put, "capture spooled");
    }
}

async fn post_capture(
    State(state): State<Arc<DaemonState>>,
    Extension(registry): Extension<Arc<Registry>>,
    peer: Option<Extension<PeerCred>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let admitted = admit(&state, body).await?;
    if wants_async(&headers) {
        let owner = peer.map_or(u32::MAX, |Extension(p)| p.uid);
        return start_async(state, &registry, owner, admitted);
    }
    match run_admitted(&state, admitted, None).await? {
        Ok(captured) => {
            spooled_ok(&state, &captured);
            Ok(captured_response(&state, captured))
        }
        Err(e) => Err(failure_response(&state, e)),
    }
}

/// `202 Accepted`, `Location: /v1/captures/{id}`, body
/// `{"id","kind","state":"running","status","events"}`; the capture runs
/// on and writes its log into the record.
fn start_async(
    state: Arc<DaemonState>,
    registry: &Registry,
    owner: u32,
    admitted: Admitted,
) -> Result<Response, ApiError> {
    let kind = admitted.request.kind();
    let record = registry.start(owner, kind).map_err(|e| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            format!("no capture id: {e}"),
        )
    })?;
    let location = format!("/v1/captures/{}", record.id);
    let body = document(&CaptureStarted {
        id: record.id.to_string(),
        kind: kind.to_string(),
        state: "running".to_string(),
        events: format!("{location}/events"),
        status: location.clone(),
    });
    tracing::info!(kind, id = %record.id, uid = owner, "capture started (async)");
    tokio::spawn(async move {
        let outcome = run_admitted(&state, admitted, Some(record.clone())).await;
        let failed = |e: ApiError| CaptureEvent::Failed {
            status: e.status.as_u16(),
            code: e.code.to_string(),
            message: e.message,
            field: e.field,
        };
        match outcome {
            Ok(Ok(captured)) => {
                spooled_ok(&state, &captured);
                for e in &captured.envelopes {
                    record.push(CaptureEvent::Envelope {
                        digest: e.digest.clone(),
                        envelope: String::from_utf8_lossy(&e.bytes).into_owned(),
                    });
                }
                record.push(CaptureEvent::Done {
                    digests: captured
                        .envelopes
                        .iter()
                        .map(|e| e.digest.clone())
                        .collect(),
                    spool_status: spool_status(&state, &captured).0.to_string(),
                    trace_refused: captured.trace_refused,
                });
            }
            Ok(Err(e)) => record.push(failed(failure_response(&state, e))),
            Err(e) => record.push(failed(e)),
        }
    });
    let mut resp = (StatusCode::ACCEPTED, body).into_response();
    if let Ok(v) = HeaderValue::from_str(&location) {
        resp.headers_mut().insert(header::LOCATION, v);
    }
    Ok(resp)
}

fn unknown_capture(id: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "no_such_capture",
        format!(
            "no capture {id:?} started by this uid (ids are kept {} s after the end)",
            super::captures::KEEP_FINISHED.as_secs()
        ),
    )
}

async fn get_capture(
    Extension(registry): Extension<Arc<Registry>>,
    peer: Option<Extension<PeerCred>>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let uid = peer.map_or(u32::MAX, |Extension(p)| p.uid);
    let record = registry.get(&id, uid).ok_or_else(|| unknown_capture(&id))?;
    Ok(axum::Json(record.status()).into_response())
}

/// A streamed body: lines handed over by the task that follows a record.
struct LineBody(tokio::sync::mpsc::Receiver<bytes::Bytes>);

impl hyper::body::Body for LineBody {
    type Data = bytes::Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        self.0
            .poll_recv(cx)
            .map(|line| line.map(|b| Ok(hyper::body::Frame::data(b))))
    }
}

async fn get_capture_events(
    Extension(registry): Extension<Arc<Registry>>,
    peer: Option<Extension<PeerCred>>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let uid = peer.map_or(u32::MAX, |Extension(p)| p.uid);
    let record = registry.get(&id, uid).ok_or_else(|| unknown_capture(&id))?;
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    tokio::spawn(async move {
        let mut ticks = record.subscribe();
        let mut cursor = 0;
        loop {
            ticks.borrow_and_update();
            let (lines, done) = record.lines_from(cursor);
            cursor += lines.len();
            for line in lines {
                if tx.send(line).await.is_err() {
                    return; // the reader went away; the capture runs on
                }
            }
            if done || ticks.changed().await.is_err() {
                return;
            }
        }
    });
    let mut resp = Response::new(Body::new(LineBody(rx)));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/x-ndjson"),
    );
    Ok(resp)
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
    let (spool_status, dropped) = spool_status(state, &captured);
    h.insert(
        "x-pstack-spool-status",
        HeaderValue::from_static(spool_status),
    );
    h.insert("x-pstack-spool-dropped", HeaderValue::from(dropped));
    resp
}

/// What the acknowledgement promises: under drop_oldest a spooled capture
/// may still be dropped before it is shipped. With several envelopes:
/// `already_spooled` only when every one was. Also the number of older
/// envelopes dropped to make room.
fn spool_status(state: &DaemonState, captured: &engines::Captured) -> (&'static str, u64) {
    let mut dropped = 0;
    let mut written = false;
    for e in &captured.envelopes {
        if let super::spool::PutOutcome::Written { dropped: d } = e.put {
            written = true;
            dropped += d;
        }
    }
    let status = if !written {
        "already_spooled"
    } else if state.spool.limits().overflow == super::config::OverflowPolicy::DropOldest {
        "spooled_may_be_dropped"
    } else {
        "spooled"
    };
    (status, dropped)
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

/// The status document (`GET /v1/status`, read by `pstackctl status`).
pub fn status(state: &DaemonState) -> DaemonStatus {
    let config = state.config();
    let s = &state.shipper_stats;
    let failures_total = s
        .failures
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .map(|(k, v)| ((*k).to_string(), *v))
        .collect();
    let (leaked, budget, available) = match &state.engine.budget {
        Some(b) => {
            b.refresh_from_journal();
            (b.in_use(), b.capacity(), b.available())
        }
        None => (0, 0, 0),
    };
    let in_flight = state.in_flight.load(Ordering::SeqCst) as u64;
    DaemonStatus {
        version: env!("CARGO_PKG_VERSION").to_string(),
        uptime_seconds: state.started.elapsed().as_secs(),
        draining: state.draining.load(Ordering::SeqCst),
        captures: CaptureCounts {
            in_flight,
            max_concurrent: config.max_concurrent_captures as u64,
            ok_total: state.counters.captures_ok.load(Ordering::Relaxed),
            failed_total: state.counters.captures_failed.load(Ordering::Relaxed),
            busy_total: state.counters.captures_busy.load(Ordering::Relaxed),
        },
        helpers: HelperStatus {
            live: in_flight,
            leaked,
            leak_budget: budget,
            leak_budget_available: available,
            helper: match &state.engine.supervisor {
                Ok(s) => HelperBinary::Found {
                    path: s.helper_path.display().to_string(),
                },
                Err(e) => HelperBinary::Missing { error: e.clone() },
            },
        },
        spool: state.spool.snapshot().into(),
        shipping: ShippingStatus {
            enabled: !config.shipper.url.is_empty(),
            collector: config.shipper.url.clone(),
            lag_seconds: lag_seconds(state),
            last_error: s
                .last_error
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
            last_error_unix: s.last_error_unix.load(Ordering::Relaxed),
            last_success_unix: s.last_success_unix.load(Ordering::Relaxed),
            next_retry_ms: s.next_delay_ms.load(Ordering::Relaxed),
            batches_total: s.batches.load(Ordering::Relaxed),
            accepted_total: s.accepted.load(Ordering::Relaxed),
            duplicate_total: s.duplicate.load(Ordering::Relaxed),
            rejected_total: s.rejected.load(Ordering::Relaxed),
            failures_total,
        },
        ebpf: state.engine.ebpf.status_doc(),
        watch: state.watch.status(),
    }
}

async fn get_watch(State(state): State<Arc<DaemonState>>) -> Response {
    document(&state.watch.status()).into_response()
}

/// NDJSON: the recent watch events, then each new one as it happens.
async fn get_watch_events(State(state): State<Arc<DaemonState>>) -> Response {
    let (recent, mut live, mut closing) = state.watch.subscribe();
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    let line = |v: &pstackd_api::WatchEvent| {
        let mut b = serde_json::to_vec(v).unwrap_or_default();
        b.push(b'\n');
        bytes::Bytes::from(b)
    };
    tokio::spawn(async move {
        for v in &recent {
            if tx.send(line(v)).await.is_err() {
                return;
            }
        }
        loop {
            if *closing.borrow_and_update() {
                return; // draining: the stream ends, the connection closes
            }
            let received = tokio::select! {
                r = live.recv() => r,
                c = closing.changed() => {
                    if c.is_err() {
                        return;
                    }
                    continue;
                }
            };
            let v = match received {
                Ok(v) => v,
                Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => {
                    pstackd_api::WatchEvent::new(pstackd_api::WatchEventKind::Lagged { missed: n })
                }
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
            };
            if tx.send(line(&v)).await.is_err() {
                return;
            }
        }
    });
    let mut resp = Response::new(Body::new(LineBody(rx)));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/x-ndjson"),
    );
    resp
}

async fn get_status(State(state): State<Arc<DaemonState>>) -> Response {
    document(&status(&state)).into_response()
}

async fn get_metrics(State(state): State<Arc<DaemonState>>) -> Response {
    let mut resp = Response::new(Body::from(metrics_text(&state)));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(pstack_exposition::CONTENT_TYPE),
    );
    resp
}

const CAPTURES: Family = Family::counter("pstackd_captures_total", "Capture requests by outcome.");
const CAPTURES_IN_FLIGHT: Family = Family::gauge(
    "pstackd_captures_in_flight",
    "Captures running now (each holds one helper).",
);
const REQUESTS_REFUSED: Family =
    Family::counter("pstackd_requests_refused_total", "Requests refused.");
const CONNECTIONS_OPEN: Family = Family::gauge("pstackd_connections_open", "Connections open.");
const CONNECTIONS_REFUSED: Family = Family::counter(
    "pstackd_connections_refused_total",
    "Connections closed at accept (over max_connections).",
);
const RELOADS: Family = Family::counter("pstackd_reloads_total", "Configuration reloads.");
const SPOOL_FILES: Family = Family::gauge("pstackd_spool_files", "Envelopes in the spool.");
const SPOOL_BYTES: Family = Family::gauge("pstackd_spool_bytes", "Bytes in the spool.");
const SPOOL_WRITTEN: Family = Family::counter("pstackd_spool_written_total", "Envelopes spooled.");
const SPOOL_DROPPED: Family = Family::counter(
    "pstackd_spool_dropped_total",
    "Envelopes dropped by the drop_oldest overflow policy.",
);
const SPOOL_REFUSED: Family = Family::counter(
    "pstackd_spool_refused_total",
    "Envelopes the spool refused.",
);
const SPOOL_QUARANTINED: Family = Family::counter(
    "pstackd_spool_quarantined_total",
    "Spool files quarantined (corrupt, stray, rejected).",
);
const SHIP_ITEMS: Family = Family::counter(
    "pstackd_ship_items_total",
    "Items acknowledged by the collector.",
);
const SHIP_BATCHES: Family = Family::counter("pstackd_ship_batches_total", "Batches sent.");
const SHIP_FAILURES: Family = Family::counter(
    "pstackd_ship_failures_total",
    "Failed batch attempts by class.",
);
const SHIP_LAG: Family = Family::gauge(
    "pstackd_ship_lag_seconds",
    "Age of the oldest unshipped envelope.",
);
const HELPERS_LEAKED: Family =
    Family::gauge("pstackd_helpers_leaked", "Helpers killed but not reaped.");
const LEAK_BUDGET: Family = Family::gauge("pstackd_leak_budget", "Leak budget capacity.");

/// Prometheus text exposition: the daemon's families, then the eBPF
/// session's, then the watch rules' and the flight recorder's.
pub fn metrics_text(state: &DaemonState) -> String {
    let mut e = Exposition::new();
    let c = &state.counters;
    let r = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
    for (outcome, v) in [
        ("ok", &c.captures_ok),
        ("failed", &c.captures_failed),
        ("busy", &c.captures_busy),
        ("spool_full", &c.captures_spool_full),
        ("overran", &c.captures_overran),
    ] {
        e.sample(CAPTURES, &[("outcome", outcome)], r(v));
    }
    e.sample(
        CAPTURES_IN_FLIGHT,
        &[],
        state.in_flight.load(Ordering::SeqCst),
    );
    e.sample(
        REQUESTS_REFUSED,
        &[("reason", "unauthorized")],
        r(&c.unauthorized),
    );
    e.sample(
        REQUESTS_REFUSED,
        &[("reason", "bad_request")],
        r(&c.bad_requests),
    );
    e.sample(CONNECTIONS_OPEN, &[], r(&c.connections_open));
    e.sample(CONNECTIONS_REFUSED, &[], r(&c.connections_refused));
    e.sample(RELOADS, &[("result", "applied")], r(&c.reloads_ok));
    e.sample(RELOADS, &[("result", "rejected")], r(&c.reloads_rejected));
    let sp = state.spool.snapshot();
    e.sample(SPOOL_FILES, &[], sp.files);
    e.sample(SPOOL_BYTES, &[], sp.bytes);
    e.sample(SPOOL_WRITTEN, &[], sp.written_total);
    e.sample(SPOOL_DROPPED, &[], sp.dropped_total);
    e.sample(SPOOL_REFUSED, &[], sp.refused_total);
    e.sample(SPOOL_QUARANTINED, &[], sp.quarantined_total);
    let s = &state.shipper_stats;
    for (status, v) in [
        ("accepted", &s.accepted),
        ("duplicate", &s.duplicate),
        ("rejected", &s.rejected),
    ] {
        e.sample(SHIP_ITEMS, &[("status", status)], r(v));
    }
    e.sample(SHIP_BATCHES, &[], r(&s.batches));
    e.declare(SHIP_FAILURES);
    for (class, v) in s.failures.lock().unwrap_or_else(|p| p.into_inner()).iter() {
        e.sample(SHIP_FAILURES, &[("class", class)], *v);
    }
    e.sample(SHIP_LAG, &[], lag_seconds(state));
    if let Some(b) = &state.engine.budget {
        e.sample(HELPERS_LEAKED, &[], b.in_use());
        e.sample(LEAK_BUDGET, &[], b.capacity());
    }
    state.engine.ebpf.write_metrics(&mut e);
    state.watch.write_metrics(&mut e);
    e.render()
}
