//! `pstack-store-core`: the causal store's rules and storage — verified
//! ingest, analysis, the remediation gate's rules, runs, receipts,
//! transfers, and the one sqlx storage layer. The HTTP routes, MCP, the
//! approval UI and the CLIs are `pstack-store`, which depends on this crate;
//! this crate depends on no HTTP server or MCP crate (axum, hyper, rmcp,
//! tower), so a rule cannot reach into a route (`scripts/crate-boundaries`
//! checks it).
//!
//! Data flows one way: [`ingest`] (pure: decode, split, verify each item with
//! `pstack-envelope`) → [`db`] (one sqlx storage layer over SQLite and
//! PostgreSQL) → the routes of `pstack-store`. [`receipts`] and [`ident`]
//! are pure rule and identity modules; [`keys`] generates and checks API
//! keys.
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
//! - The remediation gate ([`gate`] rules, `db::gate` storage, [`gate_tick`]
//!   periodic work; routes and the approval page in `pstack-store`): a grant
//!   token exists only in the response that mints it; every status change of
//!   a proposal is one conditional update; time windows read
//!   [`clock::Clock`] only (docs/gate.md).

pub mod analysis;
pub mod bundle;
pub mod clock;
pub mod db;
pub mod gate;
pub mod gate_tick;
pub mod ident;
pub mod ingest;
pub mod keys;
pub mod login;
pub mod logsafe;
pub mod operators;
pub mod receipts;
pub mod runs;
/// Synthetic envelopes for tests and benchmarks (feature `testing`).
#[cfg(any(test, feature = "testing"))]
pub mod synthetic;
pub mod transfers;

/// Wall-clock now, ns since the Unix epoch.
pub fn now_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}
