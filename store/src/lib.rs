//! `pstack-store`: the causal store's edges — the HTTP API, MCP, the
//! approval UI and the CLIs. The rules and the storage are
//! `pstack-store-core`; this crate only loads, calls and answers. The HTTP
//! contract is in `store/README.md`.
//!
//! Data flows one way: `pstack_store_core::ingest` (pure: decode, split,
//! verify each item with `pstack-envelope`) → `pstack_store_core::db` (one
//! sqlx storage layer over SQLite and PostgreSQL) → [`http`] (axum routes,
//! auth, metrics).
//!
//! Invariants the whole crate keeps:
//! - Nothing is stored that `pstack_envelope::verify` refused, and what is
//!   stored is the exact bytes received: reading an envelope back yields bytes
//!   whose digest still verifies.
//! - Each digest is stored once, whatever the replays and concurrency.
//! - A request's accepted envelopes are committed together or not at all;
//!   every rejected item carries typed reasons.
//! - No receipt stands in for another layer's (`pstack_store_core::receipts`);
//!   no envelope a receipt cites is ever deleted.
//! - Nothing logs a key, a body or envelope contents; a caller-supplied
//!   string reaches a log field only through `pstack_store_core::logsafe::text`
//!   (escaped, capped).
//! - The remediation gate (`pstack_store_core::gate` rules, `db::gate`
//!   storage, [`http::gate`] routes, `gate_tick` periodic work, [`http::ui`] the
//!   approval page): a grant token exists only in the response that mints
//!   it; every status change of a proposal is one conditional update; time
//!   windows read `pstack_store_core::clock::Clock` only (docs/gate.md).

pub mod api;
pub mod changes_cli;
pub mod client;
pub mod conn;
pub mod http;
pub mod mcp;
pub mod query;
pub mod service;
pub mod ssrf;
pub mod webhook;
