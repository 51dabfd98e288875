//! The storage layer: one API over SQLite (embedded default) and PostgreSQL.
//!
//! **Why sqlx.** One async crate speaks both databases with the same query
//! API, the same connection pooling and the same transaction type, on tokio,
//! so the store's SQL is written once (numbered `$n` parameters work in both
//! dialects; `ON CONFLICT`, `RETURNING` and JSON extraction are the only
//! fragments that differ). No compile-time query macros are used: builds need
//! no `DATABASE_URL`. rusqlite + tokio-postgres would mean two APIs, a
//! hand-made blocking-thread bridge for SQLite and every query written twice.
//!
//! Invariants:
//! - **Exact bytes.** `envelopes.body` holds the bytes exactly as received,
//!   or an LZ4 block of them ([`body`]); every read returns the received
//!   bytes, and nothing re-serializes an envelope. The digest is the
//!   primary identity (`UNIQUE`), so a replay or a concurrent duplicate
//!   inserts nothing (`ON CONFLICT (digest) DO NOTHING`) and answers with
//!   the stored record.
//! - **Batch atomicity.** The verified items of one request are written in one
//!   transaction (envelope, its unknowns, its subject's newest pointer). Either
//!   all of them are stored or none is and the request fails with 503; a
//!   shipper retries the batch and duplicates are harmless.
//! - **Deadlock-free under concurrency.** Rows are written in digest order and
//!   subject pointers in subject-key order, so overlapping PostgreSQL batches
//!   wait rather than deadlock; transient serialization/deadlock errors are
//!   retried a bounded number of times anyway.
//! - **SQLite** runs in WAL mode with one writer connection (SQLite admits one
//!   writer; queueing in the pool beats `SQLITE_BUSY` retries), a pool of
//!   readers, and a checkpointer connection that copies the WAL into the
//!   database every 200 ms so the writer never stalls on a checkpoint's
//!   fsync. `synchronous=NORMAL` by default: a crash of the store process
//!   loses nothing committed; a power loss may roll back the last ~200 ms of
//!   commits (never corrupts). `OpenOptions::sqlite_durable` (`serve
//!   --durable`) makes every acknowledged batch survive power loss too.
//! - **Cited evidence is permanent.** `receipt_evidence.digest` references
//!   `envelopes.digest ON DELETE RESTRICT`; retention additionally never
//!   selects a cited envelope.
//! - **Migrations** are versioned SQL files per backend, applied in order in
//!   one transaction each and recorded in `pstack_schema_migrations`; every
//!   step not recorded there runs, each once.
//!
//! One file per concern, each opening with the invariants it keeps:
//! [`pools`] (opening, the SQLite writer/reader/checkpointer, closing),
//! [`migrations`], [`body`] (how bodies are kept), [`reads`] (envelopes,
//! histories, unknowns), [`keys`] (API keys), [`receipts`], [`retention`],
//! and per area [`ingest`], [`analysis`], [`gate`], [`runs`], [`transfers`],
//! [`operators`], [`login_throttle`].
//! This file holds what they share: the [`Store`] handle, [`StoreError`],
//! the pool and bind macros and the placeholder builders.

use serde::Serialize;

use crate::keys::KeyError;
use crate::receipts::ReceiptRefusal;

pub use keys::{KeyCheck, KeyInfo};
pub use migrations::SCHEMA_VERSION;
use pools::Pools;
pub use pools::{Backend, OpenOptions};
pub use reads::{EnvelopeSummary, FleetUnknown, HistoryQuery, history_query};
pub use receipts::ReceiptRecord;
pub use retention::{RetentionPolicy, RetentionReport};

/// Everything that can go wrong in the storage layer.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database failed.
    #[error("database error: {0}")]
    Db(#[from] sqlx::Error),
    /// The URL names no supported backend.
    #[error("unsupported database URL {0:?}: give a file path, sqlite://PATH, or postgres://...")]
    BadUrl(String),
    /// A migration failed to apply.
    #[error("migration {version} ({name}) failed: {source}")]
    Migration {
        version: i64,
        name: &'static str,
        source: sqlx::Error,
    },
    /// A stored envelope no longer parses (the database was edited by hand).
    #[error("stored envelope {digest} does not parse: {reason}")]
    Corrupt { digest: String, reason: String },
    /// A receipt was refused.
    #[error(transparent)]
    Receipt(#[from] ReceiptRefusal),
    /// Key generation failed.
    #[error(transparent)]
    Key(#[from] KeyError),
    /// `keys revoke` of an id that does not exist.
    #[error("no API key with id {0:?}")]
    NoSuchKey(String),
    /// A key with no scope would be refused everywhere.
    #[error("a key needs at least one scope")]
    NoScopes,
    /// A proposal's idempotency key was taken but its row is gone (deleted
    /// by hand between the insert that lost and the read of the winner).
    #[error("the proposal with idempotency key {0:?} vanished while being replayed")]
    ProposalVanished(String),
}

impl StoreError {
    fn is_transient(&self) -> bool {
        match self {
            StoreError::Db(sqlx::Error::Database(e)) => {
                matches!(e.code().as_deref(), Some("40P01" | "40001"))
            }
            _ => false,
        }
    }

    fn is_unique_violation(&self) -> bool {
        matches!(self, StoreError::Db(sqlx::Error::Database(e)) if e.is_unique_violation())
    }
}

/// The store's database handle (cheap to clone).
#[derive(Debug, Clone)]
pub struct Store {
    pools: std::sync::Arc<Pools>,
    /// [`OpenOptions::transfer_join_window`], ns.
    join_window_ns: i64,
}

/// Expand `$body` once per backend with `$p` bound to that backend's pool and
/// `$pg` to whether it is PostgreSQL. `write` uses SQLite's single writer.
macro_rules! with_pool {
    ($self:expr, write, |$p:ident, $pg:ident| $body:block) => {
        match &*$self.pools {
            Pools::Sqlite { writer, .. } => {
                let $p = writer;
                #[allow(unused_variables, reason = "a body that does not ask which backend")]
                let $pg = false;
                $body
            }
            Pools::Postgres(pool) => {
                let $p = pool;
                #[allow(unused_variables, reason = "a body that does not ask which backend")]
                let $pg = true;
                $body
            }
        }
    };
    ($self:expr, read, |$p:ident, $pg:ident| $body:block) => {
        match &*$self.pools {
            Pools::Sqlite { reader, .. } => {
                let $p = reader;
                #[allow(unused_variables, reason = "a body that does not ask which backend")]
                let $pg = false;
                $body
            }
            Pools::Postgres(pool) => {
                let $p = pool;
                #[allow(unused_variables, reason = "a body that does not ask which backend")]
                let $pg = true;
                $body
            }
        }
    };
}

/// Whether a new envelope was stored or was already there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StoredStatus {
    /// Stored by this request.
    Accepted,
    /// Already stored (by an earlier request, or earlier in this batch).
    Duplicate,
}

/// The stored record of one ingested envelope.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StoredRecord {
    /// Accepted now or duplicate.
    pub status: StoredStatus,
    /// When the store first received it, ns since the epoch.
    pub received_ns: i64,
    /// Which API key first shipped it.
    pub key_id: String,
}

enum Bind<'a> {
    I64(i64),
    OptI64(Option<i64>),
    Str(String),
    Text(&'a str),
    OptText(Option<&'a str>),
    Bytes(&'a [u8]),
}

/// Every write transaction of the store begins here. On SQLite it is
/// `BEGIN IMMEDIATE`, so a transaction that
/// reads before it writes holds the write lock from the start and never has
/// to upgrade a stale read snapshot (which SQLite refuses with
/// `SQLITE_BUSY_SNAPSHOT` after a WAL restart, without waiting).
macro_rules! begin_write {
    ($pool:expr, $pg:expr) => {
        if $pg {
            $pool.begin().await?
        } else {
            $pool.begin_with("BEGIN IMMEDIATE").await?
        }
    };
}

macro_rules! bind_all {
    ($q:expr, $binds:expr) => {{
        let mut q = $q;
        for b in ($binds).iter() {
            q = match b {
                Bind::I64(v) => q.bind(*v),
                Bind::OptI64(v) => q.bind(*v),
                Bind::Str(s) => q.bind(s.as_str()),
                Bind::Text(s) => q.bind(*s),
                Bind::OptText(s) => q.bind(*s),
                Bind::Bytes(b) => q.bind(*b),
            };
        }
        q
    }};
}

/// `n` placeholders numbered from `start`: `$k` for PostgreSQL, `?` for
/// SQLite (whose parameter-name lookup is linear per parameter, so numbered
/// names make a 1,200-parameter statement quadratic). Only for statements
/// whose parameters appear once each, in binding order.
fn placeholders(pg: bool, start: usize, n: usize) -> String {
    if pg {
        (start..start + n)
            .map(|i| format!("${i}"))
            .collect::<Vec<_>>()
            .join(",")
    } else {
        vec!["?"; n].join(",")
    }
}

/// `(…),(…)` for a multi-row `VALUES`: `rows` rows of `width` placeholders,
/// numbered on PostgreSQL in the order the row binds are pushed.
fn values_rows(pg: bool, rows: usize, width: usize) -> String {
    (0..rows)
        .map(|r| format!("({})", placeholders(pg, r * width + 1, width)))
        .collect::<Vec<_>>()
        .join(",")
}

fn parse_identity(text: &str) -> serde_json::Value {
    serde_json::from_str(text).unwrap_or(serde_json::Value::Null)
}

// After the macros above, which they use.
pub mod analysis;
#[cfg(feature = "testing")]
mod bench_fill;
pub mod body;
pub mod gate;
pub mod gate_key;
mod ingest;
pub mod keys;
pub mod login_throttle;
pub mod migrations;
pub mod operators;
pub mod pools;
pub mod reads;
pub mod receipts;
pub mod retention;
pub mod runs;
pub mod transfers;
