//! HTTP routes of joined transfers: `GET /v1/transfers/{id}` (both ends side
//! by side) and `GET /v1/envelopes/{digest}/transfer` (the transfer an
//! envelope is an end of).
//!
//! Invariants:
//! - Every route authenticates before anything else.
//! - Typed errors: a malformed id or digest is `400` (`invalid_transfer_id`,
//!   `invalid_digest`), an unknown one `404` (`transfer_not_found`,
//!   `envelope_not_found`); an envelope that is stored but not joined is
//!   `404 transfer_not_found`, never an empty transfer.
//! - The view is computed from the stored bytes on every read
//!   ([`pstack_store_core::transfers`]); nothing derived is stored, so a verdict can
//!   never disagree with the envelopes it cites.

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::json;

use crate::http::{ApiError, AppState, Scope, authenticate};
use pstack_store_core::db::transfers::TransferRow;
use pstack_store_core::ident::format_ns;
use pstack_store_core::transfers::{self, SideView, TransferView, end_view, is_transfer_id};

/// The routes (merged into [`crate::http::api_router`]).
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/v1/transfers/{id}", get(get_transfer))
        .route(
            "/v1/envelopes/{digest}/transfer",
            get(get_envelope_transfer),
        )
}

fn transfer_not_found(message: String) -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "transfer_not_found", message)
}

/// Both ends of a stored transfer, side by side.
pub fn view(row: &TransferRow) -> Result<TransferView, ApiError> {
    let mut sides: Vec<SideView> = Vec::new();
    let side_keys: Vec<(&str, u64)> = row.totals.iter().map(|(k, n)| (k.as_str(), *n)).collect();
    for (n, (key, total)) in side_keys.iter().enumerate() {
        let label = side_label(n);
        let mut ends = Vec::new();
        let mut nodes = Vec::new();
        for e in row.ends.iter().filter(|e| e.side_key == *key) {
            let (env, _) = pstack_envelope::parse(&e.body).map_err(|err| {
                ApiError::from(pstack_store_core::db::StoreError::Corrupt {
                    digest: e.digest.clone(),
                    reason: err.to_string(),
                })
            })?;
            ends.push(end_view(&env, format_ns(e.wall_ns)));
            nodes.push(
                e.node
                    .clone()
                    .unwrap_or_else(|| format!("key {}", e.key_id)),
            );
        }
        let mut side = SideView::new(label, ends, nodes);
        side.ends_total = *total;
        sides.push(side);
    }
    let verdicts = transfers::verdicts(&sides);
    Ok(TransferView {
        id: row.id.clone(),
        basis: row.basis,
        join_key: row.join_key.clone(),
        linked_at: format_ns(row.linked_ns),
        sides,
        verdicts,
    })
}

/// `a`, `b`, … `z`, then `s26`, `s27`, …
fn side_label(n: usize) -> String {
    match u8::try_from(n) {
        Ok(i) if i < 26 => char::from(b'a' + i).to_string(),
        _ => format!("s{n}"),
    }
}

async fn get_transfer(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    authenticate(&state, &headers, Scope::Read).await?;
    if !is_transfer_id(&id) {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_transfer_id",
            format!("{id:?} is not a transfer id (trf_ + 16 lowercase hex digits)"),
        ));
    }
    let row = state
        .store
        .transfer(&id)
        .await?
        .ok_or_else(|| transfer_not_found(format!("no transfer {id} in the store")))?;
    if row.totals.is_empty() {
        return Err(transfer_not_found(format!(
            "transfer {id} has no envelope left in the store (retention deleted its ends)"
        )));
    }
    Ok(Json(view(&row)?).into_response())
}

async fn get_envelope_transfer(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(digest): Path<String>,
) -> Result<Response, ApiError> {
    authenticate(&state, &headers, Scope::Read).await?;
    if !pstack_envelope::is_sha256_digest(&digest) {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_digest",
            format!("{digest:?} is not sha256:<64 lowercase hex>"),
        ));
    }
    let ids = state.store.transfers_of(&digest).await?;
    let Some(first) = ids.first() else {
        if state.store.has_envelope(&digest).await? {
            return Err(transfer_not_found(format!(
                "envelope {digest} is not joined to a transfer: no envelope of the other end has been stored within the join window"
            )));
        }
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "envelope_not_found",
            format!("no envelope {digest} in the store"),
        ));
    };
    let row = state
        .store
        .transfer(first)
        .await?
        .ok_or_else(|| transfer_not_found(format!("transfer {first} vanished while read")))?;
    Ok(Json(json!({
        "envelope": digest,
        "transfer_ids": ids,
        "transfer": view(&row)?,
    }))
    .into_response())
}
