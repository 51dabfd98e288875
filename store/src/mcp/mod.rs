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

/// Replace each attempted string inside an error body by `<argument>`.
fn scrub(v: Value, attempted: &[String]) -> Value {
    match v {
        Value::String(mut s) => {
            for a in attempted {
                if s.contains(a.as_str()) {
                    s = s.replace(a.as_str(), "<argument>");
                }
            }
            Value::String(s)
        }
        Value::Array(a) => Value::Array(a.into_iter().map(|v| scrub(v, attempted)).collect()),
        Value::Object(m) => Value::Object(
            m.into_iter()
                .map(|(k, v)| (k, scrub(v, attempted)))
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

/// The streamable HTTP service mounted at `/mcp`.
pub fn http_service(
    state: AppState,
) -> rmcp::transport::streamable_http_server::StreamableHttpService<
    PstackMcp,
    rmcp::transport::streamable_http_server::session::local::LocalSessionManager,
> {
    use rmcp::transport::streamable_http_server::{
        StreamableHttpServerConfig, StreamableHttpService, session::local::LocalSessionManager,
    };
    let writes = state.mcp_writes;
    let server = PstackMcp::new(state, None, writes);
    StreamableHttpService::new(
        move || Ok(server.clone()),
        LocalSessionManager::default().into(),
        StreamableHttpServerConfig::default(),
    )
}

/// Serve MCP over stdio until the client closes it.
pub async fn serve_stdio(state: AppState, key: String) -> anyhow::Result<()> {
    use rmcp::ServiceExt as _;
    let server = PstackMcp::new(state, Some(key), writes_enabled_from_env());
    let running = server.serve(rmcp::transport::stdio()).await?;
    running.waiting().await?;
    Ok(())
}
