//! The store's one HTTP error: every refusal and failure any route answers
//! is an [`ApiError`], rendered here and nowhere else.
//!
//! Invariants:
//! - The body is `{"error": {"code", "message", "field"?, "detail"?, …}}`:
//!   `code` a stable snake_case string, `message` for a person, `field` the
//!   camelCase path of the input that caused a refusal, `detail` structured
//!   data a client can act on; a few routes add named members (a run's
//!   `refusals`), never replacing those four.
//! - 503 always carries `Retry-After` (1 s unless the error says longer), and
//!   so does any error built with [`ApiError::retry_after`]; 401 carries
//!   `WWW-Authenticate: Bearer`; a 403 for a missing scope names the scope
//!   the route needs (RFC 6750 §3.1).
//! - A storage failure is logged here once, through `logsafe`, and answered
//!   as 503 `store_unavailable`; a receipt refusal is a 422 with its rule as
//!   the code and the receipt as `detail`.

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value};

use crate::http::Scope;
use pstack_store_core::analysis::ledger::FieldError;
use pstack_store_core::db::StoreError;

/// A handler's answer: the response, or the error it becomes.
pub(crate) type Reply = Result<Response, Response>;

/// An API error: status, stable code, message, and what else the client
/// needs to act on it.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    code: String,
    message: String,
    // Boxed: most errors carry none of it, and handlers return the error by
    // value through every `?`.
    more: Option<Box<More>>,
}

/// The optional parts of an [`ApiError`].
#[derive(Debug, Default)]
struct More {
    field: Option<String>,
    detail: Option<Value>,
    members: Map<String, Value>,
    retry_after_s: Option<u64>,
    www_scope: Option<Scope>,
}

impl ApiError {
    pub(crate) fn new(
        status: StatusCode,
        code: impl Into<String>,
        message: impl Into<String>,
    ) -> ApiError {
        ApiError {
            status,
            code: code.into(),
            message: message.into(),
            more: None,
        }
    }

    fn more(&mut self) -> &mut More {
        self.more.get_or_insert_with(Box::default)
    }

    /// The input field (camelCase path) the refusal is about.
    pub(crate) fn field(mut self, field: impl Into<String>) -> ApiError {
        self.more().field = Some(field.into());
        self
    }

    /// Structured data a client can act on.
    pub(crate) fn detail(mut self, detail: impl serde::Serialize) -> ApiError {
        self.more().detail = serde_json::to_value(detail).ok();
        self
    }

    /// A further named member of `error` (never one of the four above).
    pub(crate) fn member(mut self, name: &str, value: impl serde::Serialize) -> ApiError {
        debug_assert!(!matches!(name, "code" | "message" | "field" | "detail"));
        if let Ok(v) = serde_json::to_value(value) {
            self.more().members.insert(name.to_string(), v);
        }
        self
    }

    /// Come back after `seconds` (at least 1).
    pub(crate) fn retry_after(mut self, seconds: u64) -> ApiError {
        self.more().retry_after_s = Some(seconds.max(1));
        self
    }

    /// A 403 for a key without the scope `need`: the header names it.
    pub(crate) fn needs_scope(mut self, need: Scope) -> ApiError {
        self.more().www_scope = Some(need);
        self
    }

    /// The stable code.
    pub fn code(&self) -> &str {
        &self.code
    }

    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        self.status
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let more = self.more.map(|m| *m).unwrap_or_default();
        let mut error = Map::new();
        error.insert("code".into(), Value::String(self.code));
        error.insert("message".into(), Value::String(self.message));
        if let Some(f) = more.field {
            error.insert("field".into(), Value::String(f));
        }
        if let Some(d) = more.detail {
            error.insert("detail".into(), d);
        }
        error.extend(more.members);
        let mut body = Map::new();
        body.insert("error".into(), Value::Object(error));
        let mut resp = (self.status, Json(Value::Object(body))).into_response();
        let retry = match (more.retry_after_s, self.status) {
            (Some(s), _) => Some(s),
            (None, StatusCode::SERVICE_UNAVAILABLE) => Some(1),
            _ => None,
        };
        if let Some(v) = retry.and_then(|s| HeaderValue::from_str(&s.to_string()).ok()) {
            resp.headers_mut().insert(header::RETRY_AFTER, v);
        }
        if self.status == StatusCode::UNAUTHORIZED {
            resp.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        if let Some(need) = more.www_scope {
            // RFC 6750 §3.1: the scope the request needed.
            let v = format!("Bearer error=\"insufficient_scope\", scope=\"{need}\"");
            if let Ok(v) = HeaderValue::from_str(&v) {
                resp.headers_mut().insert(header::WWW_AUTHENTICATE, v);
            }
        }
        resp
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> ApiError {
        match e {
            StoreError::Receipt(r) => {
                let detail = serde_json::to_value(&r).ok();
                let out = ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, r.rule(), r.to_string());
                match detail {
                    Some(d) => out.detail(d),
                    None => out,
                }
            }
            other => {
                tracing::error!(error = %pstack_store_core::logsafe::text(&other), "storage failure");
                ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "store_unavailable",
                    other.to_string(),
                )
            }
        }
    }
}

/// The error response for `code`, naming `field` when the input caused it.
pub(crate) fn err(
    status: StatusCode,
    code: &str,
    message: impl Into<String>,
    field: Option<&str>,
) -> Response {
    let e = ApiError::new(status, code, message);
    match field {
        Some(f) => e.field(f),
        None => e,
    }
    .into_response()
}

/// A validation refusal that names its field.
pub(crate) fn field_err(status: StatusCode, code: &str, e: FieldError) -> Response {
    err(status, code, e.to_string(), Some(&e.field))
}

/// A 422: a rule refused the input at `field`.
pub(crate) fn unprocessable(code: &str, message: impl Into<String>, field: &str) -> Response {
    err(StatusCode::UNPROCESSABLE_ENTITY, code, message, Some(field))
}

/// An [`ApiError`] as the response it becomes.
pub(crate) fn api(e: ApiError) -> Response {
    e.into_response()
}

/// A storage error as its response (see [`ApiError`]'s `From`).
pub(crate) fn store_err(e: StoreError) -> Response {
    ApiError::from(e).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn body(r: Response) -> (StatusCode, axum::http::HeaderMap, Value) {
        let status = r.status();
        let headers = r.headers().clone();
        let bytes = axum::body::to_bytes(r.into_body(), 1 << 20).await.unwrap();
        (status, headers, serde_json::from_slice(&bytes).unwrap())
    }

    #[tokio::test]
    async fn one_shape_for_every_error() {
        let (s, h, b) = body(err(
            StatusCode::BAD_REQUEST,
            "invalid_query",
            "no",
            Some("limit"),
        ))
        .await;
        assert_eq!(s, StatusCode::BAD_REQUEST);
        assert_eq!(
            b,
            serde_json::json!({"error": {"code": "invalid_query", "message": "no", "field": "limit"}})
        );
        assert!(h.get(header::RETRY_AFTER).is_none());

        let (_, _, b) = body(
            ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "run_refused", "m")
                .field("nodes[0]")
                .detail(serde_json::json!({"x": 1}))
                .member("refusals", [1, 2])
                .into_response(),
        )
        .await;
        assert_eq!(
            b,
            serde_json::json!({"error": {"code": "run_refused", "message": "m",
                "field": "nodes[0]", "detail": {"x": 1}, "refusals": [1, 2]}})
        );
    }

    #[tokio::test]
    async fn headers_follow_the_status() {
        let (_, h, _) = body(api(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "busy",
            "b",
        )))
        .await;
        assert_eq!(h[header::RETRY_AFTER], "1");
        let (_, h, _) = body(api(ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "login_throttled",
            "t",
        )
        .retry_after(7)))
        .await;
        assert_eq!(h[header::RETRY_AFTER], "7");
        let (_, h, _) = body(api(ApiError::new(StatusCode::TOO_MANY_REQUESTS, "x", "t"))).await;
        assert!(
            h.get(header::RETRY_AFTER).is_none(),
            "a 429 says when only if told"
        );
        let (_, h, _) = body(api(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "u",
        )))
        .await;
        assert_eq!(h[header::WWW_AUTHENTICATE], "Bearer");
        let (_, h, _) = body(api(ApiError::new(
            StatusCode::FORBIDDEN,
            "insufficient_scope",
            "s",
        )
        .needs_scope(Scope::Runner)))
        .await;
        assert_eq!(
            h[header::WWW_AUTHENTICATE],
            "Bearer error=\"insufficient_scope\", scope=\"runner\""
        );
    }
}
