//! pstack-store's MCP server (seed 000, "Agent workflow with MCP tools"):
//! over stdio (`pstack-store mcp`) and over streamable HTTP at `/mcp` on
//! the store's port, built on `rmcp`.
//!
//! Invariants: a tool is a store route called in process with the
//! caller's credentials (the HTTP transport's bearer key, or the stdio
//! process's `PSTACK_STORE_API_KEY`), so every check and refusal of the
//! route applies unchanged; writes exist only when
//! `OBS_MCP_ENABLE_WRITES=true`; only the minting tool may carry a grant
//! token out (any other response that has one is withheld); tool errors
//! carry the route's typed error, never the arguments.
//!
//! Over HTTP: `/mcp` accepts only the `Host` headers it is configured for
//! (loopback names, plus `serve --public-url` / `--mcp-allowed-host`; rmcp
//! answers any other 403, its DNS-rebinding guard), and a session belongs to
//! the API key that opened it ([`SessionOwners`]): a request carrying its
//! `Mcp-Session-Id` with any other key is refused `403
//! mcp_session_key_mismatch` before it reaches the session, and a session
//! id this server did not open with a key is `404 mcp_session_unknown`.

pub mod tools;

use std::sync::Arc;

use axum::body::Body;
use axum::http::{HeaderValue, Request, header};
use rmcp::ErrorData as McpError;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ListToolsResult,
    PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::{RequestContext, RoleServer};
use serde_json::Value;
use tower::ServiceExt;

use crate::http::AppState;

/// `OBS_MCP_ENABLE_WRITES=true` (exactly) enables the four write tools.
pub fn writes_enabled_from_env() -> bool {
    std::env::var("OBS_MCP_ENABLE_WRITES").is_ok_and(|v| v == "true")
}

/// The server.
#[derive(Clone)]
#[allow(
    missing_debug_implementations,
    reason = "holds a Router (no Debug) and a key"
)]
pub struct PstackMcp {
    api: axum::Router,
    key: Option<Arc<str>>,
    writes: bool,
}

impl PstackMcp {
    /// A server dispatching to the store's routes. `key`: the credential
    /// for stdio; over HTTP the request's own `Authorization` is used.
    pub fn new(state: AppState, key: Option<String>, writes: bool) -> PstackMcp {
        PstackMcp {
            api: crate::http::api_router(state),
            key: key.map(Arc::from),
            writes,
        }
    }

    fn authorization(&self, ctx: &RequestContext<RoleServer>) -> Option<HeaderValue> {
        if let Some(parts) = ctx.extensions.get::<axum::http::request::Parts>() {
            return parts.headers.get(header::AUTHORIZATION).cloned();
        }
        self.key
            .as_ref()
            .and_then(|k| HeaderValue::from_str(&format!("Bearer {k}")).ok())
    }
}

/// Every string in the arguments (3+ bytes): what an error must not echo.
fn collect_strings(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::String(s) if s.len() >= 3 => out.push(s.clone()),
        Value::Array(a) => a.iter().for_each(|v| collect_strings(v, out)),
        Value::Object(m) => m.values().for_each(|v| collect_strings(v, out)),
        _ => {}
    }
}

fn is_word_byte(b: u8) -> bool {
    // Letters and digits only: a value glued to `_` or `-` (`inc_<arg>`)
    // is still scrubbed.
    b.is_ascii_alphanumeric()
}

/// `s` with each occurrence of `a` that stands as a whole token (no ASCII
/// letter or digit on either side) replaced by `<argument>`: an argument
/// such as `claim` leaves the store's own words (`claimed`,
/// `claimed_executing`) intact.
fn replace_tokens(s: &str, a: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = String::with_capacity(s.len());
    let mut from = 0;
    while let Some(i) = s[from..].find(a).map(|i| i + from) {
        let end = i + a.len();
        let free_before = i == 0 || !is_word_byte(bytes[i - 1]);
        let free_after = end == bytes.len() || !is_word_byte(bytes[end]);
        if free_before && free_after {
            out.push_str(&s[from..i]);
            out.push_str("<argument>");
            from = end;
        } else {
            // Step past this match by one character (a char boundary).
            let step = s[i..].chars().next().map_or(1, char::len_utf8);
            out.push_str(&s[from..i + step]);
            from = i + step;
        }
    }
    out.push_str(&s[from..]);
    out
}

/// Replace each attempted string inside an error body by `<argument>`
/// (longest first, as a whole token). `code` is the store's fixed
/// vocabulary, never the caller's text, and is kept as it is.
fn scrub(v: Value, attempted: &[String]) -> Value {
    match v {
        Value::String(mut s) => {
            for a in attempted {
                if s.contains(a.as_str()) {
                    s = replace_tokens(&s, a);
                }
            }
            Value::String(s)
        }
        Value::Array(a) => Value::Array(a.into_iter().map(|v| scrub(v, attempted)).collect()),
        Value::Object(m) => Value::Object(
            m.into_iter()
                .map(|(k, v)| {
                    if k == "code" && v.is_string() {
                        (k, v)
                    } else {
                        (k, scrub(v, attempted))
                    }
                })
                .collect(),
        ),
        other => other,
    }
}

fn text(v: &Value) -> Vec<ContentBlock> {
    vec![ContentBlock::text(v.to_string())]
}

impl rmcp::ServerHandler for PstackMcp {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build()).with_instructions(
            "pstack evidence: read tools by default; write tools only with OBS_MCP_ENABLE_WRITES=true.",
        )
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _ctx: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        let tools = tools::offered(self.writes)
            .into_iter()
            .map(|t| {
                let schema = match (t.schema)() {
                    Value::Object(m) => m,
                    _ => serde_json::Map::new(),
                };
                Tool::new(t.name, t.description, Arc::new(schema))
            })
            .collect();
        Ok(ListToolsResult::with_all_items(tools))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let Some(spec) = tools::offered(self.writes)
            .into_iter()
            .find(|t| t.name == request.name)
        else {
            return Err(McpError::invalid_params(
                "no such tool (write tools need OBS_MCP_ENABLE_WRITES=true)",
                None,
            ));
        };
        let args = Value::Object(request.arguments.unwrap_or_default());
        let mut attempted = Vec::new();
        collect_strings(&args, &mut attempted);
        attempted.sort_by_key(|a| std::cmp::Reverse(a.len()));
        let (method, path, body) = (spec.call)(args).map_err(|e| {
            McpError::invalid_params(e.to_string(), Some(serde_json::json!({"field": e.field})))
        })?;
        let mut req = Request::builder().method(method).uri(path);
        if let Some(auth) = self.authorization(&ctx) {
            req = req.header(header::AUTHORIZATION, auth);
        }
        let req = match body {
            Some(b) => req
                .header(header::CONTENT_TYPE, "application/json")
                .body(Body::from(b.to_string())),
            None => req.body(Body::empty()),
        }
        .map_err(|e| McpError::internal_error(e.to_string(), None))?;
        let resp = self
            .api
            .clone()
            .oneshot(req)
            .await
            .map_err(|e| McpError::internal_error(e.to_string(), None))?;
        let ok = resp.status().is_success();
        let bytes = axum::body::to_bytes(resp.into_body(), 16 << 20)
            .await
            .map_err(|e| McpError::internal_error(e.to_string(), None))?;
        let value: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        if !spec.mints && tools::carries_grant_token(&value) {
            return Ok(CallToolResult::error(text(&serde_json::json!({
                "error": {"code": "grant_token_withheld",
                          "message": "only the tool that mints a grant returns its token"}
            })))
            .into());
        }
        Ok(if ok {
            let mut r = CallToolResult::success(text(&value));
            r.structured_content = Some(value);
            r
        } else {
            // The route's typed error, minus anything the caller sent.
            CallToolResult::error(text(&scrub(value, &attempted)))
        }
        .into())
    }
}

/// `Host` header values `/mcp` always accepts (any port): a client on the
/// store's own machine.
pub const LOOPBACK_HOSTS: [&str; 3] = ["localhost", "127.0.0.1", "::1"];

/// A `serve` flag naming an unusable MCP host.
#[derive(Debug, thiserror::Error)]
pub enum AllowedHostError {
    /// `--public-url` is not an absolute http(s) URL with a host.
    #[error(
        "--public-url {0:?}: expected the absolute http:// or https:// URL clients reach the store at, e.g. https://store.example:7443"
    )]
    PublicUrl(String),
    /// `--mcp-allowed-host` is not a bare authority.
    #[error(
        "--mcp-allowed-host {0:?}: expected a host name or address, optionally with :port (no scheme, path, user or wildcard), e.g. store.example or store.example:7443"
    )]
    Host(String),
}

/// The `Host` values `/mcp` accepts besides [`LOOPBACK_HOSTS`]: the host of
/// `public_url` on any port (a proxy forwarding nginx's `$host` drops the
/// port, and the name is what a DNS-rebinding page cannot forge), and each
/// of `extra` (with a port, that port only).
pub fn allowed_hosts(
    public_url: Option<&str>,
    extra: &[String],
) -> Result<Vec<String>, AllowedHostError> {
    let mut out = Vec::new();
    if let Some(raw) = public_url {
        let bad = || AllowedHostError::PublicUrl(raw.to_string());
        let url = reqwest::Url::parse(raw).map_err(|_| bad())?;
        let host = url.host_str().filter(|h| !h.is_empty()).ok_or_else(bad)?;
        if !matches!(url.scheme(), "http" | "https") || !url.username().is_empty() {
            return Err(bad());
        }
        out.push(host.to_ascii_lowercase());
    }
    for raw in extra {
        let value = raw.trim();
        let bad = || AllowedHostError::Host(raw.clone());
        if value.is_empty() || value.contains(['/', '@', '*', '?', '#']) {
            return Err(bad());
        }
        let authority = axum::http::uri::Authority::try_from(value).map_err(|_| bad())?;
        if authority.host().is_empty() {
            return Err(bad());
        }
        out.push(value.to_ascii_lowercase());
    }
    Ok(out)
}

/// The streamable HTTP service mounted at `/mcp`: rmcp's, with its `Host`
/// allow-list from the state, behind the session-owner check.
pub fn http_service(state: AppState) -> axum::Router {
    use rmcp::transport::streamable_http_server::{
        StreamableHttpServerConfig, StreamableHttpService, session::local::LocalSessionManager,
    };
    let writes = state.mcp_writes;
    let hosts: Vec<String> = LOOPBACK_HOSTS
        .iter()
        .map(|h| h.to_string())
        .chain(state.mcp_allowed_hosts.iter().cloned())
        .collect();
    let server = PstackMcp::new(state, None, writes);
    let sessions = Arc::new(LocalSessionManager::default());
    let service = StreamableHttpService::new(
        move || Ok(server.clone()),
        sessions.clone(),
        StreamableHttpServerConfig::default().with_allowed_hosts(hosts),
    );
    let owners = Arc::new(SessionOwners::new(sessions));
    axum::Router::new()
        .fallback_service(service)
        .layer(axum::middleware::from_fn_with_state(owners, bind_session))
}

/// Which API key opened each live MCP session (by SHA-256 of the key, so
/// no key is held in memory longer than its request).
///
/// Invariants: an owner is recorded from the response that hands out the
/// session id, before the client can use it; a session id without an owner
/// is refused, so no session is usable by a key that did not open it; the
/// map drops sessions rmcp no longer has (closed, or idle past its
/// keep-alive) whenever it doubles, so it stays bounded by the live ones.
pub struct SessionOwners {
    owners: std::sync::Mutex<OwnerMap>,
    sessions: Arc<rmcp::transport::streamable_http_server::session::local::LocalSessionManager>,
}

#[derive(Default)]
struct OwnerMap {
    by_session: std::collections::HashMap<String, [u8; 32]>,
    prune_at: usize,
}

impl std::fmt::Debug for SessionOwners {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SessionOwners(..)")
    }
}

/// Smallest map size at which stale owners are looked for.
const OWNER_PRUNE_FLOOR: usize = 64;

impl SessionOwners {
    fn new(
        sessions: Arc<rmcp::transport::streamable_http_server::session::local::LocalSessionManager>,
    ) -> SessionOwners {
        SessionOwners {
            owners: std::sync::Mutex::new(OwnerMap {
                prune_at: OWNER_PRUNE_FLOOR,
                ..OwnerMap::default()
            }),
            sessions,
        }
    }

    fn map(&self) -> std::sync::MutexGuard<'_, OwnerMap> {
        self.owners.lock().unwrap_or_else(|p| p.into_inner())
    }

    async fn record(&self, session: String, owner: [u8; 32]) {
        let prune = {
            let mut m = self.map();
            m.by_session.insert(session, owner);
            m.by_session.len() >= m.prune_at
        };
        if prune {
            let live: std::collections::HashSet<String> = self
                .sessions
                .sessions
                .read()
                .await
                .keys()
                .map(|k| k.to_string())
                .collect();
            let mut m = self.map();
            m.by_session.retain(|id, _| live.contains(id));
            m.prune_at = (m.by_session.len() * 2).max(OWNER_PRUNE_FLOOR);
        }
    }
}

/// rmcp refuses a `Host` outside the allow-list with a plain-text 403;
/// answer it in the store's error shape, saying which flag fixes it.
async fn host_refusal_as_json(resp: axum::response::Response) -> axum::response::Response {
    use axum::response::IntoResponse;
    let plain = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .is_none_or(|v| v.as_bytes().starts_with(b"text/plain"));
    if resp.status() != axum::http::StatusCode::FORBIDDEN || !plain {
        return resp;
    }
    let (parts, body) = resp.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, 4096).await else {
        return axum::response::Response::from_parts(parts, Body::empty());
    };
    if !bytes.windows(11).any(|w| w == b"Host header") {
        return axum::response::Response::from_parts(parts, Body::from(bytes));
    }
    crate::http::ApiError::new(
        axum::http::StatusCode::FORBIDDEN,
        "mcp_host_not_allowed",
        "/mcp does not serve this Host: start the store with --public-url https://<this host> or --mcp-allowed-host <this host> (loopback names are always served)",
    )
    .into_response()
}

/// SHA-256 of the bearer key (`mcp_auth` in `crate::http` has already
/// checked it is a valid key).
fn credential(headers: &axum::http::HeaderMap) -> Option<[u8; 32]> {
    let key = headers
        .get(header::AUTHORIZATION)?
        .to_str()
        .ok()?
        .strip_prefix("Bearer ")?
        .trim();
    let digest = ring::digest::digest(&ring::digest::SHA256, key.as_bytes());
    digest.as_ref().try_into().ok()
}

const SESSION_HEADER: &str = "mcp-session-id";

async fn bind_session(
    axum::extract::State(owners): axum::extract::State<Arc<SessionOwners>>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::http::StatusCode;
    use axum::response::IntoResponse;
    let caller = credential(req.headers());
    let session = req
        .headers()
        .get(SESSION_HEADER)
        .map(|v| v.to_str().unwrap_or_default().to_string());
    if let Some(id) = &session {
        let owner = owners.map().by_session.get(id).copied();
        match owner {
            Some(o) if Some(o) == caller => {}
            Some(_) => {
                tracing::warn!(
                    "refused an MCP request: its session was opened with another API key"
                );
                return crate::http::ApiError::new(
                    StatusCode::FORBIDDEN,
                    "mcp_session_key_mismatch",
                    "this MCP session was opened with another API key; initialize a session with your own key",
                )
                .into_response();
            }
            None => {
                return crate::http::ApiError::new(
                    StatusCode::NOT_FOUND,
                    "mcp_session_unknown",
                    "no such MCP session (closed, expired, or opened on another store process); initialize a new one",
                )
                .into_response();
            }
        }
    }
    let closing = req.method() == axum::http::Method::DELETE;
    let resp = host_refusal_as_json(next.run(req).await).await;
    match (&session, caller) {
        (None, Some(owner)) => {
            if let Some(id) = resp
                .headers()
                .get(SESSION_HEADER)
                .and_then(|v| v.to_str().ok())
            {
                owners.record(id.to_string(), owner).await;
            }
        }
        (Some(id), _) if closing && resp.status().is_success() => {
            owners.map().by_session.remove(id);
            // rmcp answers a closed session 202; clients (the official
            // Python SDK) read 200 or 204 as closed and warn on anything
            // else. The session is gone: say so with 204.
            if resp.status() == StatusCode::ACCEPTED {
                let (mut parts, _) = resp.into_parts();
                parts.status = StatusCode::NO_CONTENT;
                parts.headers.remove(header::CONTENT_LENGTH);
                parts.headers.remove(header::CONTENT_TYPE);
                return axum::response::Response::from_parts(parts, Body::empty());
            }
        }
        _ => {}
    }
    resp
}

/// Serve MCP over stdio until the client closes it.
pub async fn serve_stdio(state: AppState, key: String) -> anyhow::Result<()> {
    use rmcp::ServiceExt as _;
    let server = PstackMcp::new(state, Some(key), writes_enabled_from_env());
    let running = server.serve(rmcp::transport::stdio()).await?;
    running.waiting().await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn scrub_removes_arguments_as_tokens_and_keeps_the_stores_words() {
        let attempted = vec!["sk-live-1".to_string(), "claim".to_string()];
        let body = json!({"error": {
            "code": "grant_already_claimed",
            "message": "the grant was claimed; token sk-live-1 refused; operation \"claim\"",
            "field": "claim",
        }});
        let out = scrub(body, &attempted);
        assert_eq!(out["error"]["code"], "grant_already_claimed");
        assert_eq!(
            out["error"]["message"],
            "the grant was claimed; token <argument> refused; operation \"<argument>\""
        );
        assert_eq!(out["error"]["field"], "<argument>");
        // Inside another word the argument stays (it is not the caller's).
        assert_eq!(replace_tokens("xsk-live-1y", "sk-live-1"), "xsk-live-1y");
        assert_eq!(replace_tokens("é claim é", "claim"), "é <argument> é");
        assert_eq!(
            replace_tokens("claimclaim claim", "claim"),
            "claimclaim <argument>"
        );
    }
}
