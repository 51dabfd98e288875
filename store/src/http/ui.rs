//! The approval page (`/ui/`, the seed's `#/autonomous-review` view inside
//! it) and human sessions.
//!
//! Invariants:
//! - Human sessions are distinct from node API keys: approve and reject
//!   take a session cookie (never a key), and a key never opens the page's
//!   API.
//! - The cookie is `HttpOnly`, `SameSite=Strict`, `Path=/`, and `Secure`
//!   when the request came over TLS (a TLS-terminating proxy sets
//!   `X-Forwarded-Proto: https`, see docs/store-tls.md).
//! - Every state-changing request of a session (approve, reject, logout)
//!   carries the session's CSRF token in `X-CSRF-Token`; without it: 403.
//!   The token is derived from the session id and stored only hashed
//!   (`pstack_store_core::operators`). Login takes JSON only (a cross-site form cannot
//!   send it without a preflight the store never answers).
//! - A login takes a verifier slot before anything else and is charged to
//!   the database throttle before its password is verified
//!   (`pstack_store_core::login`: 429 `login_verifier_busy` / `login_source_busy` /
//!   `too_many_login_failures` / `login_source_throttled` /
//!   `login_user_throttled`, each with `Retry-After`). A disabled operator
//!   cannot log in (403 `operator_disabled`, only after the right password)
//!   and has no live session.
//! - The page renders every value with `textContent`; a grant token is
//!   shown only from the approve response that minted it and kept in no
//!   storage, so a reload shows it no more. Scripts come from the store
//!   only (Content-Security-Policy).

#![allow(
    clippy::result_large_err,
    reason = "the error is the HTTP response itself, built once on the way out"
)]

use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::http::error::{Reply, err, store_err};
use crate::http::extract::{human, json_body};
use crate::http::{ApiError, AppState};
use pstack_store_core::db::gate::ProposalFilter;
use pstack_store_core::login::{ClientSource, ThrottleRefusal, VerifierBusy};
use pstack_store_core::operators::{self, COOKIE};

const PAGE: &str = include_str!("../ui/index.html");
const SCRIPT: &str = include_str!("../ui/app.js");
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// The page's routes (merged into [`crate::http::api_router`]).
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/ui/", get(page))
        .route("/ui/app.js", get(script))
        .route("/ui/login", post(login))
        .route("/ui/logout", post(logout))
        .route("/ui/api/session", get(session))
        .route("/ui/api/queue", get(queue))
}

fn hardened(mut r: Response) -> Response {
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    r
}

async fn page() -> Response {
    hardened(([(header::CONTENT_TYPE, "text/html; charset=utf-8")], PAGE).into_response())
}

async fn script() -> Response {
    hardened(
        (
            [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
            SCRIPT,
        )
            .into_response(),
    )
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct LoginRequest {
    username: String,
    password: String,
}

fn cookie(headers: &HeaderMap, value: &str, max_age: i64) -> HeaderValue {
    let tls = headers
        .get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|p| p.eq_ignore_ascii_case("https"));
    let secure = if tls { "; Secure" } else { "" };
    HeaderValue::from_str(&format!(
        "{COOKIE}={value}; Path=/; HttpOnly; SameSite=Strict; Max-Age={max_age}{secure}"
    ))
    .unwrap_or_else(|_| HeaderValue::from_static("pstack_session=; Max-Age=0"))
}

fn verifier_busy(busy: VerifierBusy) -> Response {
    let (code, message) = match busy {
        VerifierBusy::Slots { limit } => (
            "login_verifier_busy",
            format!("{limit} password verifications are running; try again in 1 s"),
        ),
        VerifierBusy::Source { limit } => (
            "login_source_busy",
            format!("{limit} login(s) from this address are being verified; try again in 1 s"),
        ),
    };
    ApiError::new(StatusCode::TOO_MANY_REQUESTS, code, message)
        .retry_after(1)
        .into_response()
}

fn throttled(r: ThrottleRefusal) -> Response {
    let seconds = r.retry_after_ns / 1_000_000_000 + 1;
    let what = match r.dimension {
        pstack_store_core::login::ThrottleDimension::Source => "from this address",
        pstack_store_core::login::ThrottleDimension::Pair => "for this user from this address",
        pstack_store_core::login::ThrottleDimension::Name => {
            "for this user from addresses it has not logged in from"
        }
    };
    ApiError::new(
        StatusCode::TOO_MANY_REQUESTS,
        r.dimension.code(),
        format!("{} failed logins {what}; try again in {seconds} s", r.limit),
    )
    .retry_after(u64::try_from(seconds).unwrap_or(1))
    .into_response()
}

async fn login(State(state): State<AppState>, request: Request) -> Reply {
    let (parts, body) = request.into_parts();
    let headers = &parts.headers;
    let json_ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if !json_ct {
        return Err(err(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "json_required",
            "log in with Content-Type: application/json",
            None,
        ));
    }
    let req: LoginRequest = json_body(body, "invalid_login").await?;
    let peer = parts
        .extensions
        .get::<ConnectInfo<std::net::SocketAddr>>()
        .map(|c| c.0.ip());
    let source = ClientSource::resolve(
        peer,
        headers
            .get_all("x-forwarded-for")
            .iter()
            .filter_map(|v| v.to_str().ok()),
        &state.login.trusted_proxies,
    );
    // A slot first (no database work without one); unknown names too.
    let slot = state.login.verifier.try_begin(&source).map_err(|busy| {
        tracing::warn!(
            source = source.as_str(),
            "operator login refused: verifier busy"
        );
        verifier_busy(busy)
    })?;
    let limits = state.login.limits;
    let charge = state
        .store
        .charge_login(&req.username, &source, &limits, state.clock.now_ns())
        .await
        .map_err(store_err)?;
    if let Some(refusal) = charge.refused {
        tracing::warn!(user = %pstack_store_core::logsafe::text(&req.username), "operator login throttled");
        return Err(throttled(refusal));
    }
    let (stored, disabled) = match state
        .store
        .operator_login(&req.username)
        .await
        .map_err(store_err)?
    {
        Some((phc, disabled)) => (Some(phc), disabled),
        None => (None, false),
    };
    let ok = slot.verify(req.password, stored).await;
    if !ok {
        tracing::warn!(user = %pstack_store_core::logsafe::text(&req.username), "operator login refused");
        return Err(err(
            StatusCode::UNAUTHORIZED,
            "invalid_credentials",
            "unknown user or wrong password",
            None,
        ));
    }
    if disabled {
        tracing::warn!(user = %pstack_store_core::logsafe::text(&req.username), "operator login refused: operator disabled");
        return Err(err(
            StatusCode::FORBIDDEN,
            "operator_disabled",
            "this operator is disabled (pstack-store users enable NAME)",
            None,
        ));
    }
    state
        .store
        .login_succeeded(&req.username, &source, &charge, state.clock.now_ns())
        .await
        .map_err(store_err)?;
    let (id, hash, csrf) = operators::new_session().map_err(|e| {
        err(
            StatusCode::SERVICE_UNAVAILABLE,
            "random_unavailable",
            e.to_string(),
            None,
        )
    })?;
    let now = state.clock.now_ns();
    state
        .store
        .create_session(
            &hash,
            &req.username,
            &operators::csrf_hash(&csrf),
            now,
            now + operators::SESSION_NS,
        )
        .await
        .map_err(store_err)?;
    tracing::info!(user = %pstack_store_core::logsafe::text(&req.username), "operator logged in");
    let mut r = Json(json!({"username": req.username, "csrfToken": csrf})).into_response();
    r.headers_mut().insert(
        header::SET_COOKIE,
        cookie(headers, &id, operators::SESSION_NS / 1_000_000_000),
    );
    Ok(hardened(r))
}

async fn logout(State(state): State<AppState>, headers: HeaderMap) -> Reply {
    let (user, hash) = human(&state, &headers, true).await?;
    state
        .store
        .delete_session(&hash, state.clock.now_ns())
        .await
        .map_err(store_err)?;
    tracing::info!(user = %pstack_store_core::logsafe::text(&user), "operator logged out");
    let mut r = Json(json!({"loggedOut": true})).into_response();
    r.headers_mut()
        .insert(header::SET_COOKIE, cookie(&headers, "", 0));
    Ok(hardened(r))
}

async fn session(State(state): State<AppState>, headers: HeaderMap) -> Reply {
    let (user, _) = human(&state, &headers, false).await?;
    // The token is derived from the cookie; the database holds only its hash.
    let csrf = headers
        .get(header::COOKIE)
        .and_then(|v| v.to_str().ok())
        .and_then(operators::cookie_value)
        .map(operators::csrf_token)
        .unwrap_or_default();
    Ok(hardened(
        Json(json!({"username": user, "csrfToken": csrf})).into_response(),
    ))
}

/// The review queue: proposals with their finding, tier, blast-radius
/// verdict and cited envelopes (as handoffs). Never a token.
async fn queue(State(state): State<AppState>, headers: HeaderMap) -> Reply {
    human(&state, &headers, false).await?;
    let rows = state
        .store
        .proposals(&ProposalFilter {
            incident_id: None,
            status: None,
            limit: 100,
        })
        .await
        .map_err(store_err)?;
    let mut items = Vec::with_capacity(rows.len());
    for p in &rows {
        let finding = state
            .store
            .finding(&p.finding_id)
            .await
            .map_err(store_err)?;
        let mut digests: Vec<String> = finding
            .as_ref()
            .and_then(|f| f.cited_evidence_ids.as_array().cloned())
            .unwrap_or_default()
            .iter()
            .filter_map(|v| {
                v.as_str()
                    .filter(|s| s.starts_with("sha256:"))
                    .map(str::to_string)
            })
            .collect();
        if let Some(d) = &p.pre_mutation_envelope {
            digests.insert(0, d.clone());
        }
        let mut envelopes = Vec::new();
        for d in digests {
            let handoff = match state.store.envelope_bytes(&d).await.map_err(store_err)? {
                Some(b) => pstack_envelope::parse(&b)
                    .ok()
                    .map(|(e, _)| json!(pstack_envelope::handoff(&e))),
                None => None,
            };
            envelopes.push(json!({"digest": d, "handoff": handoff,
                "preMutation": p.pre_mutation_envelope.as_deref() == Some(d.as_str())}));
        }
        let mut item = crate::http::gate::proposal_json(p);
        item["finding"] = json!({
            "id": p.finding_id,
            "faultLocusEntityId": finding.as_ref().map(|f| f.fault_locus_entity_id.clone()),
            "fingerprint": p.fingerprint,
            "causalProofTier": finding.as_ref().map(|f| f.causal_proof_tier.clone()),
            "blastRadiusVerdict": finding.as_ref().and_then(|f| f.change_verdict.clone()),
            "contributingChangeId": finding.as_ref().and_then(|f| f.contributing_change_id.clone()),
        });
        item["envelopes"] = Value::Array(envelopes);
        items.push(item);
    }
    Ok(hardened(Json(json!({"items": items})).into_response()))
}
