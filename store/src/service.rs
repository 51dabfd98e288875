//! The store's whole HTTP service: the API routes ([`crate::http`]) with
//! the MCP server ([`crate::mcp`]) nested at `/mcp`, served under the
//! connection limits of [`crate::conn`]. It sits above both so that the
//! routes and the MCP tools (which call the routes in process) do not
//! import each other in a circle.
//!
//! Invariant: `/mcp` authenticates with an API key before anything is read;
//! each tool call then needs its route's scope.

use axum::Router;
use axum::response::{IntoResponse, Response};

use crate::http::{AppState, api_router, authenticate_any};

/// Build the router: the API plus the MCP server at `/mcp` (the MCP
/// endpoint authenticates with the API key before anything is read).
pub fn router(state: AppState) -> Router {
    let mcp = crate::mcp::http_service(state.clone());
    api_router(state.clone()).nest_service(
        "/mcp",
        tower::ServiceBuilder::new()
            .layer(axum::middleware::from_fn_with_state(state, mcp_auth))
            .service(mcp),
    )
}

async fn mcp_auth(
    axum::extract::State(state): axum::extract::State<AppState>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    // Opening the transport needs a live key only: each tool call is a
    // route called in process with this same key, and needs that route's
    // scope (crate::mcp).
    match authenticate_any(&state, req.headers()).await {
        Ok(_) => next.run(req).await,
        Err(e) => e.into_response(),
    }
}

/// Serve until `shutdown` resolves, then stop accepting and drain in-flight
/// requests (axum's graceful shutdown).
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: AppState,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let guards = state.guards.clone();
    crate::conn::serve_router(listener, router(state), guards, shutdown).await
}
