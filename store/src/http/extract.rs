//! What every route does with its request before it decides: authenticate
//! with the route's scope (or, for an operator's action, the session and
//! its CSRF token), read a bounded JSON body, and refuse unknown or
//! malformed query parameters naming the parameter.
//!
//! Invariants:
//! - Authentication comes first; a body is read only after it.
//! - A JSON body is read to at most 1 MiB before it is decoded; a decode
//!   error names the field path that failed.
//! - Every refusal is an [`ApiError`](crate::http::ApiError) with `field`.

// These fail with the finished HTTP response, as the handlers do: it is
// what the caller returns, once, so its size is not worth a box.
#![allow(
    clippy::result_large_err,
    reason = "the error is the HTTP response itself, built once on the way out"
)]

use std::collections::BTreeMap;

use axum::body::Body;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::Response;
use serde::de::DeserializeOwned;

use crate::http::error::{api, err, store_err};
use crate::http::{AppState, Scope, authenticate};
use pstack_store_core::operators;

/// Authenticate and require `need` (see [`crate::http::authenticate`]);
/// the caller's key id.
pub(crate) async fn auth(
    state: &AppState,
    headers: &HeaderMap,
    need: Scope,
) -> Result<String, Response> {
    authenticate(state, headers, need)
        .await
        .map(|c| c.key_id)
        .map_err(api)
}

/// A request body of at most 1 MiB, or 413.
async fn bounded(body: Body) -> Result<axum::body::Bytes, Response> {
    axum::body::to_bytes(body, 1 << 20).await.map_err(|_| {
        err(
            StatusCode::PAYLOAD_TOO_LARGE,
            "body_too_large",
            "JSON bodies are at most 1 MiB",
            None,
        )
    })
}

/// Read a JSON body (≤ 1 MiB) into `T`, naming the field on failure.
pub(crate) async fn json_body<T: DeserializeOwned>(body: Body, code: &str) -> Result<T, Response> {
    decode(&bounded(body).await?, code)
}

/// [`json_body`], where an empty (or all-whitespace) body means `T::default()`.
pub(crate) async fn optional_body<T: Default + DeserializeOwned>(
    body: Body,
    code: &str,
) -> Result<T, Response> {
    let bytes = bounded(body).await?;
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    decode(&bytes, code)
}

fn decode<T: DeserializeOwned>(bytes: &[u8], code: &str) -> Result<T, Response> {
    let de = &mut serde_json::Deserializer::from_slice(bytes);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        let field = (path != "." && !path.is_empty()).then_some(path);
        err(
            StatusCode::BAD_REQUEST,
            code,
            e.inner().to_string(),
            field.as_deref(),
        )
    })
}

pub(crate) fn bad_query(field: &str, message: impl Into<String>) -> Response {
    err(
        StatusCode::BAD_REQUEST,
        "invalid_query",
        message,
        Some(field),
    )
}

pub(crate) fn only_params(
    params: &BTreeMap<String, String>,
    allowed: &[&str],
) -> Result<(), Response> {
    match params.keys().find(|k| !allowed.contains(&k.as_str())) {
        Some(k) => Err(bad_query(
            k,
            format!("unknown parameter {k:?} (allowed: {})", allowed.join(", ")),
        )),
        None => Ok(()),
    }
}

/// `limit=` in 1..=1000, `default` when absent.
pub(crate) fn limit_param(
    params: &BTreeMap<String, String>,
    default: i64,
) -> Result<i64, Response> {
    match params.get("limit") {
        None => Ok(default),
        Some(s) => s
            .parse::<i64>()
            .ok()
            .filter(|n| (1..=1000).contains(n))
            .ok_or_else(|| {
                bad_query(
                    "limit",
                    format!("limit {s:?} must be an integer in 1..=1000"),
                )
            }),
    }
}

/// The operator behind this request's session; with `state_changing`, the
/// request must also carry the session's CSRF token.
pub async fn human(
    state: &AppState,
    headers: &HeaderMap,
    state_changing: bool,
) -> Result<(String, String), Response> {
    let none = || {
        err(
            StatusCode::UNAUTHORIZED,
            "human_session_required",
            "log in on the approval page (/ui/): this action takes an operator session, not an API key",
            None,
        )
    };
    let Some(id) = headers
        .get(header::COOKIE)
        .and_then(|v| v.to_str().ok())
        .and_then(operators::cookie_value)
    else {
        return Err(none());
    };
    let hash = operators::session_hash(id);
    let Some((user, csrf_hash)) = state
        .store
        .session(&hash, state.clock.now_ns())
        .await
        .map_err(store_err)?
    else {
        return Err(none());
    };
    if state_changing {
        let sent = headers
            .get("x-csrf-token")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        // Compare digests: equal-length, no early exit on the secret.
        if operators::csrf_hash(sent) != csrf_hash {
            tracing::warn!(user = %pstack_store_core::logsafe::text(&user), "request without the session's CSRF token");
            return Err(err(
                StatusCode::FORBIDDEN,
                "csrf_token_invalid",
                "send the session's CSRF token in X-CSRF-Token",
                None,
            ));
        }
    }
    Ok((user, hash))
}
