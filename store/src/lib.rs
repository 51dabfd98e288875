//! `pstack-store`: the causal store — verified ingest, evidence queries,
//! receipts. The HTTP contract is in `store/README.md`.
//!
//! Data flows one way: [`ingest`] (pure: decode, split, verify each item with
//! `pstack-envelope`) → [`db`] (one sqlx storage layer over SQLite and
//! PostgreSQL) → [`http`] (axum routes, auth, metrics). [`receipts`] and
//! [`ident`] are pure rule and identity modules; [`keys`] generates and checks
//! API keys.
//!
//! Invariants the whole crate keeps:
//! - Nothing is stored that `pstack_envelope::verify` refused, and what is
//!   stored is the exact bytes received: reading an envelope back yields bytes
//!   whose digest still verifies.
//! - Each digest is stored once, whatever the replays and concurrency.
//! - A request's accepted envelopes are committed together or not at all;
//!   every rejected item carries typed reasons.
//! - No receipt stands in for another layer's ([`receipts`]); no envelope a
//!   receipt cites is ever deleted.
//! - Nothing logs a key, a body or envelope contents; a caller-supplied
//!   string reaches a log field only through [`logsafe::text`] (escaped,
//!   capped).
//! - The remediation gate ([`gate`] rules, `db::gate` storage,
//!   [`http_gate`] routes, [`gate_tick`] periodic work, [`http_ui`] the
//!   approval page): a grant token exists only in the response that mints
//!   it; every status change of a proposal is one conditional update; time
//!   windows read [`clock::Clock`] only (docs/gate.md).

pub mod analysis;
pub mod bundle;
pub mod changes_cli;
pub mod client;
pub mod clock;
pub mod conn;
pub mod db;
pub mod gate;
pub mod gate_tick;
pub mod http;
pub mod http_analysis;
pub mod http_bundles;
pub mod http_gate;
pub mod http_runs;
pub mod http_transfers;
pub mod http_ui;
pub mod ident;
pub mod ingest;
pub mod keys;
pub mod login;
pub mod logsafe;
pub mod mcp;
pub mod operators;
pub mod query;
pub mod query_params;
pub mod receipts;
pub mod runs;
pub mod synthetic;
pub mod transfers;
pub mod transfers_cli;

/// Wall-clock now, ns since the Unix epoch.
pub fn now_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}
