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
//! - **Exact bytes.** `envelopes.body` holds the bytes exactly as received;
//!   nothing re-serializes an envelope. The digest is the primary identity
//!   (`UNIQUE`), so a replay or a concurrent duplicate inserts nothing
//!   (`ON CONFLICT (digest) DO NOTHING`) and answers with the stored record.
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

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use serde::Serialize;
use sqlx::Row;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};

use crate::ident::{format_ns, identity_fields, locator_field, subject_key};
use crate::keys::{self, KeyError};
use crate::receipts::{
    self, EvidenceFacts, PriorReceipt, ReceiptContext, ReceiptKind, ReceiptRefusal, ReceiptRequest,
};

/// Versioned migrations: (version, name, SQLite SQL, PostgreSQL SQL).
const MIGRATIONS: &[(i64, &str, &str, &str)] = &[
    (
        1,
        "core",
        include_str!("../migrations/sqlite/0001_core.sql"),
        include_str!("../migrations/postgres/0001_core.sql"),
    ),
    (
        2,
        "analysis",
        include_str!("../migrations/sqlite/0002_analysis.sql"),
        include_str!("../migrations/postgres/0002_analysis.sql"),
    ),
    (
        3,
        "gate",
        include_str!("../migrations/sqlite/0003_gate.sql"),
        include_str!("../migrations/postgres/0003_gate.sql"),
    ),
    (
        4,
        "runs",
        include_str!("../migrations/sqlite/0004_runs.sql"),
        include_str!("../migrations/postgres/0004_runs.sql"),
    ),
    (
        5,
        "transfers",
        include_str!("../migrations/sqlite/0005_transfers.sql"),
        include_str!("../migrations/postgres/0005_transfers.sql"),
    ),
    (
        6,
        "scopes",
        include_str!("../migrations/sqlite/0006_scopes.sql"),
        include_str!("../migrations/postgres/0006_scopes.sql"),
    ),
    (
        7,
        "gate_key",
        include_str!("../migrations/sqlite/0007_gate_key.sql"),
        include_str!("../migrations/postgres/0007_gate_key.sql"),
    ),
    (
        8,
        "hypotheses",
        include_str!("../migrations/sqlite/0008_hypotheses.sql"),
        include_str!("../migrations/postgres/0008_hypotheses.sql"),
    ),
    (
        9,
        "accounts",
        include_str!("../migrations/sqlite/0009_accounts.sql"),
        include_str!("../migrations/postgres/0009_accounts.sql"),
    ),
    (
        10,
        "cohorts",
        include_str!("../migrations/sqlite/0010_cohorts.sql"),
        include_str!("../migrations/postgres/0010_cohorts.sql"),
    ),
];

/// The schema version a store opened by this build is at: its newest
/// migration.
pub const SCHEMA_VERSION: i64 = MIGRATIONS[MIGRATIONS.len() - 1].0;

/// The migration that created the transfer join (`crate::transfers`).
const TRANSFERS_MIGRATION: i64 = 5;

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

/// Which database is behind the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Backend {
    /// Embedded SQLite file.
    Sqlite,
    /// PostgreSQL server.
    Postgres,
}

/// Knobs for [`Store::open`].
#[derive(Debug, Clone)]
pub struct OpenOptions {
    /// PostgreSQL schema to create (if missing) and use; `None` uses the
    /// connection's default search path. Lets tests share one database.
    pub pg_schema: Option<String>,
    /// PostgreSQL pool size. Default 16 (more only queues inside the server).
    pub pg_max_connections: u32,
    /// SQLite reader pool size. Default 4.
    pub sqlite_readers: u32,
    /// SQLite `synchronous=FULL`: fsync the WAL at every commit, so an
    /// acknowledged batch survives power loss. Default off (`NORMAL`): a
    /// commit survives a store crash but a power loss can roll back the
    /// commits since the last checkpoint (at most ~200 ms of ingest); in
    /// exchange ingest needs no fsync per batch.
    pub sqlite_durable: bool,
    /// How far apart the capture windows of two mirrored stream ends may lie
    /// and still be joined as one transfer (`crate::transfers`). Default
    /// 120 s: wide enough for two nodes' captures of one fault fired by
    /// rules seconds apart, narrow enough that a 4-tuple reused hours later
    /// is not taken for the same connection.
    pub transfer_join_window: Duration,
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions {
            pg_schema: None,
            pg_max_connections: 16,
            sqlite_readers: 4,
            sqlite_durable: false,
            transfer_join_window: crate::transfers::DEFAULT_JOIN_WINDOW,
        }
    }
}

#[derive(Debug)]
enum Pools {
    Sqlite {
        writer: SqlitePool,
        reader: SqlitePool,
        checkpointer: SqlitePool,
    },
    Postgres(PgPool),
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

/// One row of a subject history.
#[derive(Debug, Clone, Serialize)]
pub struct EnvelopeSummary {
    /// Envelope digest.
    pub digest: String,
    /// Subject key.
    pub subject_key: String,
    /// Subject kind.
    pub kind: String,
    /// Flattened identity fields.
    pub identity: serde_json::Value,
    /// Capture wall time (RFC 3339, ms).
    pub wall_time: String,
    /// Capture wall time, ns.
    pub wall_ns: i64,
    /// When the store received it (RFC 3339, ms).
    pub received_at: String,
    /// Completeness.
    pub completeness: String,
    /// Key that shipped it.
    pub key_id: String,
    /// Stored bytes.
    pub size: i64,
}

/// A history query, already validated.
#[derive(Debug, Clone, Default)]
pub struct HistoryQuery {
    /// Exact subject key (used when the full identity is known).
    pub subject_key: Option<String>,
    /// Kind.
    pub kind: String,
    /// Locator value (required without `subject_key`).
    pub locator: String,
    /// PID (process/thread).
    pub pid: Option<i64>,
    /// Other identity fields to match exactly.
    pub filters: Vec<(String, String)>,
    /// Keyset cursor: strictly older than (wall_ns, digest).
    pub before: Option<(i64, String)>,
    /// Page size.
    pub limit: i64,
}

/// One unknown in the fleet view.
#[derive(Debug, Clone, Serialize)]
pub struct FleetUnknown {
    /// Envelope that carries it.
    pub digest: String,
    /// Subject key.
    pub subject_key: String,
    /// Subject kind.
    pub kind: String,
    /// Flattened identity.
    pub identity: serde_json::Value,
    /// Capture time of that envelope.
    pub wall_time: String,
    /// Whether it is still open (carried by the subject's newest envelope).
    pub open: bool,
    /// The question.
    pub question: String,
    /// The transition it blocks.
    pub blocks: String,
    /// Who answers it.
    pub owner: String,
    /// The probe that answers it.
    pub probe: String,
    /// Surface whose failure raised it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub surface: Option<String>,
}

/// An API key as listed (never its hash).
#[derive(Debug, Clone, Serialize)]
pub struct KeyInfo {
    /// Public id.
    pub id: String,
    /// Name given at creation.
    pub name: String,
    /// Created at (RFC 3339).
    pub created_at: String,
    /// Revoked at, if revoked.
    pub revoked_at: Option<String>,
    /// What it may do (`legacy`: every scope; see [`crate::keys::Scope`]).
    pub scopes: Vec<&'static str>,
}

/// Outcome of authenticating a presented key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyCheck {
    /// Valid and live: the key id and its scopes.
    Valid(String, keys::ScopeSet),
    /// Matches a revoked key.
    Revoked(String),
    /// Matches nothing.
    Unknown,
}

/// A recorded receipt.
#[derive(Debug, Clone, Serialize)]
pub struct ReceiptRecord {
    /// Row id.
    pub id: i64,
    /// Kind.
    pub kind: ReceiptKind,
    /// Subject key.
    pub subject_key: String,
    /// Change id.
    pub change: String,
    /// Revision, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,
    /// Effective time of the change (REALIZED).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub realized_at: Option<String>,
    /// Soak (SOAKED).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub soak_ms: Option<i64>,
    /// Note.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// Evidence digests.
    pub evidence: Vec<String>,
    /// Key that recorded it.
    pub key_id: String,
    /// When.
    pub created_at: String,
}

/// Retention knobs. Both limits apply; cited envelopes are always kept.
#[derive(Debug, Clone, Copy, Default)]
pub struct RetentionPolicy {
    /// Drop envelopes received longer ago than this.
    pub max_age: Option<Duration>,
    /// Drop the oldest envelopes while stored bytes exceed this.
    pub max_bytes: Option<u64>,
}

/// What one retention pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct RetentionReport {
    /// Envelopes deleted.
    pub deleted: u64,
    /// Bytes freed.
    pub freed_bytes: u64,
    /// Envelopes kept only because a receipt cites them.
    pub cited_kept: u64,
    /// Stored bytes after the pass.
    pub stored_bytes: u64,
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

/// Create the SQLite file 0600 when it does not exist, and narrow an
/// existing one to 0600: it holds every envelope (other users' process
/// evidence). SQLite gives its `-wal` and `-shm` files the database file's
/// mode, so they are 0600 too.
fn restrict_database_file(path: &Path) -> Result<(), StoreError> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let io = |e: std::io::Error| StoreError::BadUrl(format!("{}: {e}", path.display()));
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
    {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            let mode = std::fs::metadata(path).map_err(io)?.permissions().mode() & 0o777;
            if mode & 0o077 != 0 {
                tracing::warn!(path = %path.display(), mode = format!("{mode:o}"), "database file readable by others; narrowing it to 0600");
                for p in [
                    path.to_path_buf(),
                    wal_sibling(path, "-wal"),
                    wal_sibling(path, "-shm"),
                ] {
                    if p.exists() {
                        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600))
                            .map_err(io)?;
                    }
                }
            }
            Ok(())
        }
        Err(e) => Err(io(e)),
    }
}

fn wal_sibling(path: &Path, suffix: &str) -> std::path::PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(suffix);
    s.into()
}

impl Store {
    /// Open (creating if needed) and migrate. `url` is a file path or
    /// `sqlite://PATH` for SQLite, `postgres://` / `postgresql://` for PostgreSQL.
    pub async fn open(url: &str, opts: &OpenOptions) -> Result<Store, StoreError> {
        let pools = if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            let base = PgConnectOptions::from_str(url)?;
            let connect = if let Some(schema) = &opts.pg_schema {
                if !schema
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
                {
                    return Err(StoreError::BadUrl(format!("schema name {schema:?}")));
                }
                let boot = PgPoolOptions::new()
                    .max_connections(1)
                    .connect_with(base.clone())
                    .await?;
                sqlx::query(&format!("CREATE SCHEMA IF NOT EXISTS {schema}"))
                    .execute(&boot)
                    .await?;
                boot.close().await;
                base.options([("search_path", schema.as_str())])
            } else {
                base
            };
            let pool = PgPoolOptions::new()
                .max_connections(opts.pg_max_connections)
                .acquire_timeout(Duration::from_secs(30))
                .connect_with(connect)
                .await?;
            Pools::Postgres(pool)
        } else {
            let path = url
                .strip_prefix("sqlite://")
                .or_else(|| url.strip_prefix("sqlite:"))
                .unwrap_or(url);
            if path.is_empty()
                || path.contains(":memory:")
                || url.contains("://") && !url.starts_with("sqlite://")
            {
                return Err(StoreError::BadUrl(url.into()));
            }
            restrict_database_file(Path::new(path))?;
            let base = SqliteConnectOptions::new()
                .filename(path)
                .create_if_missing(true)
                .journal_mode(SqliteJournalMode::Wal)
                .synchronous(if opts.sqlite_durable {
                    SqliteSynchronous::Full
                } else {
                    SqliteSynchronous::Normal
                })
                .busy_timeout(Duration::from_secs(30))
                .foreign_keys(true)
                .page_size(8192)
                .pragma("cache_size", "-65536")
                .pragma("journal_size_limit", "134217728")
                .pragma("temp_store", "memory");
            // The writer never checkpoints (a checkpoint fsyncs the database
            // file and would stall every ingest behind it); a separate
            // connection checkpoints in the background.
            let writer = SqlitePoolOptions::new()
                .max_connections(1)
                .acquire_timeout(Duration::from_secs(60))
                .connect_with(base.clone().pragma("wal_autocheckpoint", "0"))
                .await?;
            let checkpointer = SqlitePoolOptions::new()
                .max_connections(1)
                .connect_with(base.clone())
                .await?;
            tokio::spawn(checkpoint_loop(checkpointer.clone()));
            let reader = SqlitePoolOptions::new()
                .max_connections(opts.sqlite_readers.max(1))
                .acquire_timeout(Duration::from_secs(30))
                .connect_with(base.read_only(false))
                .await?;
            Pools::Sqlite {
                writer,
                reader,
                checkpointer,
            }
        };
        let store = Store {
            pools: std::sync::Arc::new(pools),
            join_window_ns: i64::try_from(opts.transfer_join_window.as_nanos()).unwrap_or(i64::MAX),
        };
        let applied = store.migrate().await?;
        // Request aggregates stored before the cohort rows existed, converted
        // once (a no-op read when there are none; see crate::db::analysis).
        let converted = store.convert_legacy_request_stats().await?;
        if converted > 0 {
            tracing::info!(
                rows = converted,
                "converted stored request aggregates into cohort rows (minute resolution, legacy error bound)"
            );
        }
        if applied.contains(&TRANSFERS_MIGRATION) {
            // Envelopes stored before the join existed are offered to it once.
            let n = store.backfill_transfers().await?;
            tracing::info!(
                envelopes = n,
                "offered stored stream and storage-transfer envelopes to the transfer join"
            );
        }
        Ok(store)
    }

    /// Which backend this is.
    pub fn backend(&self) -> Backend {
        match &*self.pools {
            Pools::Sqlite { .. } => Backend::Sqlite,
            Pools::Postgres(_) => Backend::Postgres,
        }
    }

    /// Close every pool (waits for in-flight queries).
    pub async fn close(&self) {
        match &*self.pools {
            Pools::Sqlite {
                writer,
                reader,
                checkpointer,
            } => {
                reader.close().await;
                writer.close().await;
                // A last full checkpoint leaves a self-contained database file.
                let _ = sqlx::query("PRAGMA wal_checkpoint(TRUNCATE)")
                    .execute(checkpointer)
                    .await;
                checkpointer.close().await;
            }
            Pools::Postgres(p) => p.close().await,
        }
    }

    /// Apply pending migrations; the versions applied now.
    async fn migrate(&self) -> Result<Vec<i64>, StoreError> {
        with_pool!(self, write, |pool, pg| {
            let mut conn = pool.acquire().await?;
            if pg {
                // One migrator at a time across processes.
                sqlx::query("SELECT pg_advisory_lock(7470530001)")
                    .execute(&mut *conn)
                    .await?;
            }
            let result: Result<Vec<i64>, StoreError> = async {
                let mut now_applied = Vec::new();
                sqlx::raw_sql(
                    "CREATE TABLE IF NOT EXISTS pstack_schema_migrations (
                        version BIGINT PRIMARY KEY, name TEXT NOT NULL, applied_ns BIGINT NOT NULL)",
                )
                .execute(&mut *conn)
                .await?;
                // Each migration not recorded yet, in order (not only those
                // above the highest recorded: a step is self-contained, so
                // one added below an applied one still runs). Whether it is
                // recorded is read inside its own transaction: on SQLite,
                // which has no advisory lock, `BEGIN IMMEDIATE` takes the
                // write lock first, so of two processes opening one fresh
                // file together the second sees the first's steps applied.
                for (version, name, lite, post) in MIGRATIONS {
                    let sql = if pg { *post } else { *lite };
                    let wrap = |source| StoreError::Migration {
                        version: *version,
                        name,
                        source,
                    };
                    let mut tx = if pg {
                        sqlx::Connection::begin(&mut *conn).await?
                    } else {
                        sqlx::Connection::begin_with(&mut *conn, "BEGIN IMMEDIATE").await?
                    };
                    let applied: Option<i64> = sqlx::query_scalar(
                        "SELECT version FROM pstack_schema_migrations WHERE version = $1",
                    )
                    .bind(*version)
                    .fetch_optional(&mut *tx)
                    .await?;
                    if applied.is_some() {
                        tx.rollback().await?;
                        continue;
                    }
                    sqlx::raw_sql(sql).execute(&mut *tx).await.map_err(wrap)?;
                    sqlx::query(
                        "INSERT INTO pstack_schema_migrations (version, name, applied_ns) VALUES ($1, $2, $3)",
                    )
                    .bind(*version)
                    .bind(*name)
                    .bind(crate::now_ns())
                    .execute(&mut *tx)
                    .await
                    .map_err(wrap)?;
                    tx.commit().await.map_err(wrap)?;
                    tracing::info!(version, name, "applied migration");
                    now_applied.push(*version);
                }
                Ok(now_applied)
            }
            .await;
            if pg {
                sqlx::query("SELECT pg_advisory_unlock(7470530001)")
                    .execute(&mut *conn)
                    .await?;
            }
            result
        })
    }

    /// The schema version applied.
    pub async fn schema_version(&self) -> Result<i64, StoreError> {
        with_pool!(self, read, |pool, pg| {
            let v: Option<i64> =
                sqlx::query_scalar("SELECT MAX(version) FROM pstack_schema_migrations")
                    .fetch_one(pool)
                    .await?;
            Ok(v.unwrap_or(0))
        })
    }

    /// Cheap liveness probe of the database.
    pub async fn ping(&self) -> Result<(), StoreError> {
        with_pool!(self, read, |pool, pg| {
            sqlx::query("SELECT 1").execute(pool).await?;
            Ok(())
        })
    }

    /// The exact stored bytes of an envelope.
    pub async fn envelope_bytes(&self, digest: &str) -> Result<Option<Vec<u8>>, StoreError> {
        with_pool!(self, read, |pool, pg| {
            Ok(
                sqlx::query_scalar::<_, Vec<u8>>("SELECT body FROM envelopes WHERE digest = $1")
                    .bind(digest)
                    .fetch_optional(pool)
                    .await?,
            )
        })
    }

    /// A stored envelope, parsed.
    pub async fn envelope(
        &self,
        digest: &str,
    ) -> Result<Option<pstack_envelope::Envelope>, StoreError> {
        let Some(bytes) = self.envelope_bytes(digest).await? else {
            return Ok(None);
        };
        pstack_envelope::parse(&bytes)
            .map(|(e, _)| Some(e))
            .map_err(|e| StoreError::Corrupt {
                digest: digest.into(),
                reason: e.to_string(),
            })
    }

    /// Number of stored envelopes (exact; scans on large stores).
    pub async fn count_envelopes(&self) -> Result<i64, StoreError> {
        with_pool!(self, read, |pool, pg| {
            Ok(
                sqlx::query_scalar::<_, i64>("SELECT COUNT(*) FROM envelopes")
                    .fetch_one(pool)
                    .await?,
            )
        })
    }

    /// Digests stored, sorted (for tests and tools).
    pub async fn all_digests(&self) -> Result<Vec<String>, StoreError> {
        with_pool!(self, read, |pool, pg| {
            Ok(
                sqlx::query_scalar::<_, String>("SELECT digest FROM envelopes ORDER BY digest")
                    .fetch_all(pool)
                    .await?,
            )
        })
    }

    /// One page of a subject history, newest first.
    pub async fn history(&self, q: &HistoryQuery) -> Result<Vec<EnvelopeSummary>, StoreError> {
        // There is no index on subject_key (a random key would dirty one more
        // index page per envelope at ingest): an exact subject is found
        // through the (kind, locator, pid, wall_ns) index, narrowed by key.
        let mut q = q.clone();
        if let Some(key) = &q.subject_key
            && q.locator.is_empty()
        {
            let row: Option<(String, String)> = with_pool!(self, read, |pool, pg| {
                sqlx::query_as("SELECT kind, identity FROM subjects WHERE subject_key = $1")
                    .bind(key.as_str())
                    .fetch_optional(pool)
                    .await?
            });
            let Some((kind, identity)) = row else {
                return Ok(Vec::new());
            };
            let fields: BTreeMap<String, String> =
                serde_json::from_str(&identity).unwrap_or_default();
            q.locator = locator_field(&kind)
                .and_then(|l| fields.get(l).cloned())
                .unwrap_or_default();
            q.pid = fields.get("pid").and_then(|p| p.parse().ok());
            q.kind = kind;
        }
        let mut binds: Vec<Bind<'_>> = Vec::new();
        let mut sql = String::from(
            "SELECT digest, subject_key, kind, identity, wall_ns, received_ns, completeness, key_id, size
             FROM envelopes WHERE ",
        );
        let pg = self.backend() == Backend::Postgres;
        binds.push(Bind::Str(q.kind.clone()));
        binds.push(Bind::Str(q.locator.clone()));
        sql.push_str("kind = $1 AND locator = $2");
        match q.pid {
            Some(pid) => {
                binds.push(Bind::I64(pid));
                sql.push_str(&format!(" AND pid = ${}", binds.len()));
            }
            None => sql.push_str(" AND pid IS NULL"),
        }
        if let Some(key) = &q.subject_key {
            binds.push(Bind::Str(key.clone()));
            sql.push_str(&format!(" AND subject_key = ${}", binds.len()));
        } else {
            for (field, value) in &q.filters {
                if pg {
                    binds.push(Bind::Str(field.clone()));
                    sql.push_str(&format!(" AND (identity::jsonb ->> ${})", binds.len()));
                } else {
                    binds.push(Bind::Str(format!("$.\"{field}\"")));
                    sql.push_str(&format!(" AND json_extract(identity, ${})", binds.len()));
                }
                binds.push(Bind::Str(value.clone()));
                sql.push_str(&format!(" = ${}", binds.len()));
            }
        }
        if let Some((wall, digest)) = &q.before {
            binds.push(Bind::I64(*wall));
            let w = binds.len();
            binds.push(Bind::Str(digest.clone()));
            let d = binds.len();
            sql.push_str(&format!(
                " AND (wall_ns < ${w} OR (wall_ns = ${w} AND digest < ${d}))"
            ));
        }
        binds.push(Bind::I64(q.limit));
        sql.push_str(&format!(
            " ORDER BY wall_ns DESC, digest DESC LIMIT ${}",
            binds.len()
        ));
        with_pool!(self, read, |pool, pg| {
            let rows = bind_all!(sqlx::query(&sql), &binds).fetch_all(pool).await?;
            rows.iter()
                .map(|r| {
                    let wall_ns: i64 = r.try_get(4)?;
                    let received_ns: i64 = r.try_get(5)?;
                    Ok(EnvelopeSummary {
                        digest: r.try_get(0)?,
                        subject_key: r.try_get(1)?,
                        kind: r.try_get(2)?,
                        identity: parse_identity(&r.try_get::<String, _>(3)?),
                        wall_time: format_ns(wall_ns),
                        wall_ns,
                        received_at: format_ns(received_ns),
                        completeness: r.try_get(6)?,
                        key_id: r.try_get(7)?,
                        size: r.try_get(8)?,
                    })
                })
                .collect::<Result<Vec<_>, StoreError>>()
        })
    }

    /// Unknowns across the fleet: `open_only` gives those carried by each
    /// subject's newest envelope; otherwise every unknown ever stored, marked.
    pub async fn unknowns(
        &self,
        open_only: bool,
        owner: Option<&str>,
        limit: i64,
        offset: i64,
    ) -> Result<Vec<FleetUnknown>, StoreError> {
        let mut binds = Vec::new();
        let mut sql = if open_only {
            String::from(
                "SELECT u.digest, s.subject_key, s.kind, s.identity, s.latest_wall_ns, 1,
                        u.question, u.blocks, u.owner, u.probe, u.surface
                 FROM subjects s JOIN unknowns u ON u.digest = s.latest_digest WHERE 1 = 1",
            )
        } else {
            String::from(
                "SELECT u.digest, e.subject_key, e.kind, e.identity, e.wall_ns,
                        CASE WHEN s.subject_key IS NULL THEN 0 ELSE 1 END,
                        u.question, u.blocks, u.owner, u.probe, u.surface
                 FROM unknowns u JOIN envelopes e ON e.digest = u.digest
                 LEFT JOIN subjects s ON s.latest_digest = u.digest WHERE 1 = 1",
            )
        };
        if let Some(owner) = owner {
            binds.push(Bind::Str(owner.to_string()));
            sql.push_str(&format!(" AND u.owner = ${}", binds.len()));
        }
        let order = if open_only {
            "s.latest_wall_ns"
        } else {
            "e.wall_ns"
        };
        binds.push(Bind::I64(limit));
        binds.push(Bind::I64(offset));
        sql.push_str(&format!(
            " ORDER BY {order} DESC, u.digest, u.ord LIMIT ${} OFFSET ${}",
            binds.len() - 1,
            binds.len()
        ));
        with_pool!(self, read, |pool, pg| {
            let rows = bind_all!(sqlx::query(&sql), &binds).fetch_all(pool).await?;
            rows.iter()
                .map(|r| {
                    Ok(FleetUnknown {
                        digest: r.try_get(0)?,
                        subject_key: r.try_get(1)?,
                        kind: r.try_get(2)?,
                        identity: parse_identity(&r.try_get::<String, _>(3)?),
                        wall_time: format_ns(r.try_get(4)?),
                        open: r.try_get::<i32, _>(5)? != 0,
                        question: r.try_get(6)?,
                        blocks: r.try_get(7)?,
                        owner: r.try_get(8)?,
                        probe: r.try_get(9)?,
                        surface: r.try_get(10)?,
                    })
                })
                .collect::<Result<Vec<_>, StoreError>>()
        })
    }

    // ---- API keys ----

    /// Create a key holding `scopes`; returns its id and the plaintext
    /// (shown once).
    pub async fn create_key(
        &self,
        name: &str,
        scopes: &keys::ScopeSet,
    ) -> Result<keys::NewKey, StoreError> {
        if scopes.is_empty() {
            return Err(StoreError::NoScopes);
        }
        let key = keys::generate()?;
        with_pool!(self, write, |pool, pg| {
            sqlx::query(
                "INSERT INTO api_keys (id, name, key_hash, created_ns, scopes) VALUES ($1, $2, $3, $4, $5)",
            )
            .bind(key.id.as_str())
            .bind(name)
            .bind(key.hash.as_str())
            .bind(crate::now_ns())
            .bind(scopes.to_stored())
            .execute(pool)
            .await?;
            Ok::<(), StoreError>(())
        })?;
        Ok(key)
    }

    /// Every key, oldest first.
    pub async fn list_keys(&self) -> Result<Vec<KeyInfo>, StoreError> {
        with_pool!(self, read, |pool, pg| {
            let rows = sqlx::query(
                "SELECT id, name, created_ns, revoked_ns, scopes FROM api_keys ORDER BY created_ns, id",
            )
            .fetch_all(pool)
            .await?;
            rows.iter()
                .map(|r| {
                    Ok(KeyInfo {
                        id: r.try_get(0)?,
                        name: r.try_get(1)?,
                        created_at: format_ns(r.try_get(2)?),
                        revoked_at: r.try_get::<Option<i64>, _>(3)?.map(format_ns),
                        scopes: keys::ScopeSet::from_stored(&r.try_get::<String, _>(4)?)
                            .0
                            .names(),
                    })
                })
                .collect::<Result<Vec<_>, StoreError>>()
        })
    }

    /// Revoke a key (idempotent); effective on the next request.
    pub async fn revoke_key(&self, id: &str) -> Result<(), StoreError> {
        let n = with_pool!(self, write, |pool, pg| {
            sqlx::query("UPDATE api_keys SET revoked_ns = COALESCE(revoked_ns, $1) WHERE id = $2")
                .bind(crate::now_ns())
                .bind(id)
                .execute(pool)
                .await?
                .rows_affected()
        });
        if n == 0 {
            return Err(StoreError::NoSuchKey(id.into()));
        }
        Ok(())
    }

    /// Replace a key's scopes (narrow a `legacy` key, or widen one);
    /// effective on its next request. Returns (before, after).
    pub async fn set_key_scopes(
        &self,
        id: &str,
        scopes: &keys::ScopeSet,
    ) -> Result<(keys::ScopeSet, keys::ScopeSet), StoreError> {
        if scopes.is_empty() {
            return Err(StoreError::NoScopes);
        }
        let before: Option<String> = with_pool!(self, write, |pool, pg| {
            let mut tx = begin_write!(pool, pg);
            let before: Option<String> =
                sqlx::query_scalar("SELECT scopes FROM api_keys WHERE id = $1")
                    .bind(id)
                    .fetch_optional(&mut *tx)
                    .await?;
            sqlx::query("UPDATE api_keys SET scopes = $1 WHERE id = $2")
                .bind(scopes.to_stored())
                .bind(id)
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
            before
        });
        let Some(before) = before else {
            return Err(StoreError::NoSuchKey(id.into()));
        };
        Ok((keys::ScopeSet::from_stored(&before).0, scopes.clone()))
    }

    /// Check a presented key: valid ones come back with their scopes.
    pub async fn check_key(&self, presented: &str) -> Result<KeyCheck, StoreError> {
        let Ok(id) = keys::parse_id(presented) else {
            return Ok(KeyCheck::Unknown);
        };
        let row: Option<(String, Option<i64>, String)> = with_pool!(self, read, |pool, pg| {
            sqlx::query_as("SELECT key_hash, revoked_ns, scopes FROM api_keys WHERE id = $1")
                .bind(id)
                .fetch_optional(pool)
                .await?
        });
        let Some((hash, revoked, scopes)) = row else {
            return Ok(KeyCheck::Unknown);
        };
        if !keys::hashes_equal(&keys::hash_key(presented), &hash) {
            return Ok(KeyCheck::Unknown);
        }
        Ok(match revoked {
            Some(_) => KeyCheck::Revoked(id.to_string()),
            None => {
                let (set, unknown) = keys::ScopeSet::from_stored(&scopes);
                if !unknown.is_empty() {
                    tracing::warn!(key_id = id, unknown = ?unknown, "stored key scopes this store does not know grant nothing");
                }
                KeyCheck::Valid(id.to_string(), set)
            }
        })
    }

    // ---- receipts ----

    /// Check a receipt against every rule and record it, atomically.
    pub async fn record_receipt(
        &self,
        req: &ReceiptRequest,
        key_id: &str,
        now_ns: i64,
    ) -> Result<ReceiptRecord, StoreError> {
        let realized_ns = receipts::check_request(req)?;
        let mut evidence: Vec<String> = Vec::new();
        for d in &req.evidence {
            if !evidence.contains(d) {
                evidence.push(d.clone());
            }
        }
        let req = ReceiptRequest {
            evidence,
            ..req.clone()
        };
        let result = with_pool!(self, write, |pool, pg| {
            let mut tx = begin_write!(pool, pg);
            let mut ctx = ReceiptContext::default();
            for d in &req.evidence {
                let row = sqlx::query(
                    "SELECT subject_key, wall_ns, completeness,
                            (SELECT COUNT(*) FROM unknowns u WHERE u.digest = e.digest)
                     FROM envelopes e WHERE digest = $1",
                )
                .bind(d.as_str())
                .fetch_optional(&mut *tx)
                .await?;
                ctx.evidence.push(match row {
                    Some(r) => Some(EvidenceFacts {
                        digest: d.clone(),
                        subject_key: r.try_get(0)?,
                        wall_ns: r.try_get(1)?,
                        completeness: r.try_get(2)?,
                        open_unknowns: usize::try_from(r.try_get::<i64, _>(3)?).unwrap_or(0),
                    }),
                    None => None,
                });
            }
            let subject = receipts::subject_of(&ctx).unwrap_or_default().to_string();
            let prior_rows = sqlx::query(
                "SELECT id, kind, realized_ns FROM receipts WHERE subject_key = $1 AND change_id = $2",
            )
            .bind(subject.as_str())
            .bind(req.change.as_str())
            .fetch_all(&mut *tx)
            .await?;
            for r in &prior_rows {
                let id: i64 = r.try_get(0)?;
                let kind = ReceiptKind::parse(&r.try_get::<String, _>(1)?);
                let cited: Vec<String> = sqlx::query_scalar(
                    "SELECT digest FROM receipt_evidence WHERE receipt_id = $1 ORDER BY digest",
                )
                .bind(id)
                .fetch_all(&mut *tx)
                .await?;
                if let Some(kind) = kind {
                    ctx.prior.push(PriorReceipt {
                        kind,
                        realized_ns: r.try_get(2)?,
                        evidence: cited,
                    });
                }
            }
            let problem: Vec<String> = ctx
                .prior
                .iter()
                .find(|p| p.kind == ReceiptKind::SourceFixed)
                .map(|p| p.evidence.clone())
                .unwrap_or_default();
            for d in &problem {
                let w: Option<i64> =
                    sqlx::query_scalar("SELECT wall_ns FROM envelopes WHERE digest = $1")
                        .bind(d.as_str())
                        .fetch_optional(&mut *tx)
                        .await?;
                ctx.problem_wall_ns.extend(w);
            }
            ctx.latest_of_subject =
                sqlx::query_scalar("SELECT latest_digest FROM subjects WHERE subject_key = $1")
                    .bind(subject.as_str())
                    .fetch_optional(&mut *tx)
                    .await?;
            if req.kind == ReceiptKind::Verified && ctx.evidence.iter().all(Option::is_some) {
                let mut bodies: BTreeMap<String, Vec<u8>> = BTreeMap::new();
                for d in req.evidence.iter().chain(&problem) {
                    if bodies.contains_key(d) {
                        continue;
                    }
                    let b: Option<Vec<u8>> =
                        sqlx::query_scalar("SELECT body FROM envelopes WHERE digest = $1")
                            .bind(d.as_str())
                            .fetch_optional(&mut *tx)
                            .await?;
                    if let Some(b) = b {
                        bodies.insert(d.clone(), b);
                    }
                }
                ctx.unchanged_against_problem = unchanged_pairs(&req.evidence, &problem, &bodies)?;
            }
            receipts::check(&req, &ctx)?;
            let id: i64 = sqlx::query_scalar(
                "INSERT INTO receipts (subject_key, change_id, kind, revision, realized_ns, soak_ms, note, key_id, created_ns)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) RETURNING id",
            )
            .bind(subject.as_str())
            .bind(req.change.as_str())
            .bind(req.kind.as_str())
            .bind(req.revision.as_deref())
            .bind(realized_ns)
            .bind(req.soak_ms.map(|s| i64::try_from(s).unwrap_or(i64::MAX)))
            .bind(req.note.as_deref())
            .bind(key_id)
            .bind(now_ns)
            .fetch_one(&mut *tx)
            .await?;
            for d in &req.evidence {
                sqlx::query("INSERT INTO receipt_evidence (receipt_id, digest) VALUES ($1, $2)")
                    .bind(id)
                    .bind(d.as_str())
                    .execute(&mut *tx)
                    .await?;
            }
            tx.commit().await?;
            Ok::<ReceiptRecord, StoreError>(ReceiptRecord {
                id,
                kind: req.kind,
                subject_key: subject,
                change: req.change.clone(),
                revision: req.revision.clone(),
                realized_at: realized_ns.map(format_ns),
                soak_ms: req.soak_ms.map(|s| i64::try_from(s).unwrap_or(i64::MAX)),
                note: req.note.clone(),
                evidence: req.evidence.clone(),
                key_id: key_id.to_string(),
                created_at: format_ns(now_ns),
            })
        });
        match result {
            // Two identical receipts raced; the unique constraint decided.
            Err(e) if e.is_unique_violation() => {
                Err(ReceiptRefusal::AlreadyRecorded { kind: req.kind }.into())
            }
            other => other,
        }
    }

    /// Receipts of a subject, oldest first.
    pub async fn receipts(&self, subject: &str) -> Result<Vec<ReceiptRecord>, StoreError> {
        with_pool!(self, read, |pool, pg| {
            let rows = sqlx::query(
                "SELECT id, kind, subject_key, change_id, revision, realized_ns, soak_ms, note, key_id, created_ns
                 FROM receipts WHERE subject_key = $1 ORDER BY id",
            )
            .bind(subject)
            .fetch_all(pool)
            .await?;
            let mut out = Vec::with_capacity(rows.len());
            for r in &rows {
                let id: i64 = r.try_get(0)?;
                let evidence: Vec<String> = sqlx::query_scalar(
                    "SELECT digest FROM receipt_evidence WHERE receipt_id = $1 ORDER BY digest",
                )
                .bind(id)
                .fetch_all(pool)
                .await?;
                let Some(kind) = ReceiptKind::parse(&r.try_get::<String, _>(1)?) else {
                    continue;
                };
                out.push(ReceiptRecord {
                    id,
                    kind,
                    subject_key: r.try_get(2)?,
                    change: r.try_get(3)?,
                    revision: r.try_get(4)?,
                    realized_at: r.try_get::<Option<i64>, _>(5)?.map(format_ns),
                    soak_ms: r.try_get(6)?,
                    note: r.try_get(7)?,
                    evidence,
                    key_id: r.try_get(8)?,
                    created_at: format_ns(r.try_get(9)?),
                });
            }
            Ok(out)
        })
    }

    // ---- retention ----

    /// Apply a retention policy once. Deletes in chunks (oldest received
    /// first) so ingest is never blocked for long; never deletes an envelope a
    /// receipt cites; repoints subjects whose newest envelope was deleted.
    pub async fn apply_retention(
        &self,
        policy: &RetentionPolicy,
        now_ns: i64,
    ) -> Result<RetentionReport, StoreError> {
        const CHUNK: i64 = 500;
        let mut report = RetentionReport::default();
        let mut touched: BTreeSet<String> = BTreeSet::new();
        let uncited =
            "NOT EXISTS (SELECT 1 FROM receipt_evidence r WHERE r.digest = envelopes.digest)
             AND NOT EXISTS (SELECT 1 FROM finding_evidence f WHERE f.digest = envelopes.digest)
             AND NOT EXISTS (SELECT 1 FROM remediation_proposals p WHERE p.pre_mutation_envelope = envelopes.digest)
             AND NOT EXISTS (SELECT 1 FROM remediation_receipts g WHERE g.evidence = envelopes.digest)
             AND NOT EXISTS (SELECT 1 FROM run_failure_receipts x WHERE x.pre_digest = envelopes.digest OR x.post_digest = envelopes.digest)
             AND NOT EXISTS (SELECT 1 FROM hypothesis_moves m WHERE m.digest = envelopes.digest)";
        if let Some(age) = policy.max_age {
            let cutoff = now_ns.saturating_sub(i64::try_from(age.as_nanos()).unwrap_or(i64::MAX));
            loop {
                let sql = format!(
                    "SELECT id, digest, subject_key, size FROM envelopes
                     WHERE received_ns < $1 AND {uncited} ORDER BY received_ns, id LIMIT $2"
                );
                let victims = self
                    .select_victims(&sql, &[Bind::I64(cutoff), Bind::I64(CHUNK)])
                    .await?;
                if victims.is_empty() {
                    break;
                }
                self.delete_victims(&victims, &mut report, &mut touched)
                    .await?;
            }
        }
        let mut stored = self.stored_bytes().await?;
        if let Some(max) = policy.max_bytes {
            while stored > max {
                let sql = format!(
                    "SELECT id, digest, subject_key, size FROM envelopes
                     WHERE {uncited} ORDER BY received_ns, id LIMIT $1"
                );
                let mut victims = self.select_victims(&sql, &[Bind::I64(CHUNK)]).await?;
                if victims.is_empty() {
                    break;
                }
                // Only as many as needed to get under the cap.
                let mut excess = stored - max;
                let mut keep = 0;
                for (i, v) in victims.iter().enumerate() {
                    keep = i + 1;
                    let size = u64::try_from(v.3).unwrap_or(0);
                    if size >= excess {
                        break;
                    }
                    excess -= size;
                }
                victims.truncate(keep);
                let before = report.freed_bytes;
                self.delete_victims(&victims, &mut report, &mut touched)
                    .await?;
                stored = stored.saturating_sub(report.freed_bytes - before);
            }
        }
        self.repoint_subjects(&touched).await?;
        report.stored_bytes = self.stored_bytes().await?;
        report.cited_kept = with_pool!(self, read, |pool, pg| {
            let n: i64 = sqlx::query_scalar(
                "SELECT COUNT(*) FROM envelopes WHERE EXISTS (SELECT 1 FROM receipt_evidence r WHERE r.digest = envelopes.digest)",
            )
            .fetch_one(pool)
            .await?;
            u64::try_from(n).unwrap_or(0)
        });
        if report.deleted > 0 {
            tracing::info!(
                deleted = report.deleted,
                freed_bytes = report.freed_bytes,
                cited_kept = report.cited_kept,
                "retention pass"
            );
        }
        Ok(report)
    }

    /// Total bytes of stored envelopes.
    pub async fn stored_bytes(&self) -> Result<u64, StoreError> {
        with_pool!(self, read, |pool, pg| {
            let n: Option<i64> =
                sqlx::query_scalar("SELECT CAST(SUM(size) AS BIGINT) FROM envelopes")
                    .fetch_one(pool)
                    .await?;
            Ok(u64::try_from(n.unwrap_or(0)).unwrap_or(0))
        })
    }

    async fn select_victims(
        &self,
        sql: &str,
        binds: &[Bind<'_>],
    ) -> Result<Vec<(i64, String, String, i64)>, StoreError> {
        with_pool!(self, write, |pool, pg| {
            Ok(
                bind_all!(sqlx::query_as::<_, (i64, String, String, i64)>(sql), binds)
                    .fetch_all(pool)
                    .await?,
            )
        })
    }

    async fn delete_victims(
        &self,
        victims: &[(i64, String, String, i64)],
        report: &mut RetentionReport,
        touched: &mut BTreeSet<String>,
    ) -> Result<(), StoreError> {
        let ids: Vec<Bind> = victims.iter().map(|v| Bind::I64(v.0)).collect();
        let digests: Vec<Bind> = victims.iter().map(|v| Bind::Str(v.1.clone())).collect();
        let list = placeholders(self.backend() == Backend::Postgres, 1, victims.len());
        with_pool!(self, write, |pool, pg| {
            let mut tx = begin_write!(pool, pg);
            let del_unknowns = format!("DELETE FROM unknowns WHERE digest IN ({list})");
            bind_all!(sqlx::query(&del_unknowns), &digests)
                .execute(&mut *tx)
                .await?;
            let del_envelopes = format!("DELETE FROM envelopes WHERE id IN ({list})");
            let n = bind_all!(sqlx::query(&del_envelopes), &ids)
                .execute(&mut *tx)
                .await?
                .rows_affected();
            tx.commit().await?;
            report.deleted += n;
            Ok::<(), StoreError>(())
        })?;
        for v in victims {
            report.freed_bytes += u64::try_from(v.3).unwrap_or(0);
            touched.insert(v.2.clone());
        }
        Ok(())
    }

    async fn repoint_subjects(&self, touched: &BTreeSet<String>) -> Result<(), StoreError> {
        // Only a subject whose newest envelope is gone is touched: the guard
        // keeps a pointer a concurrent ingest just moved to a newer capture.
        let gone = "NOT EXISTS (SELECT 1 FROM envelopes e WHERE e.digest = subjects.latest_digest)";
        for key in touched {
            let newest = self
                .history(&HistoryQuery {
                    subject_key: Some(key.clone()),
                    limit: 1,
                    ..HistoryQuery::default()
                })
                .await?;
            with_pool!(self, write, |pool, pg| {
                match newest.first() {
                    Some(n) => {
                        sqlx::query(&format!(
                            "UPDATE subjects SET latest_digest = $1, latest_wall_ns = $2
                             WHERE subject_key = $3 AND {gone}"
                        ))
                        .bind(n.digest.as_str())
                        .bind(n.wall_ns)
                        .bind(key.as_str())
                        .execute(pool)
                        .await?;
                    }
                    None => {
                        sqlx::query(&format!(
                            "DELETE FROM subjects WHERE subject_key = $1 AND {gone}"
                        ))
                        .bind(key.as_str())
                        .execute(pool)
                        .await?;
                    }
                }
                Ok::<(), StoreError>(())
            })?;
        }
        Ok(())
    }
}

/// Copy committed WAL frames into the SQLite database file every 200 ms
/// (PASSIVE: never blocks the writer or readers). Under sustained ingest the
/// writer keeps appending, so a PASSIVE checkpoint never catches up with the
/// end and the WAL would grow without bound; once it holds more than
/// [`WAL_RESTART_FRAMES`] a RESTART checkpoint briefly waits for the writer,
/// backfills the rest and makes the next transaction rewrite the WAL from its
/// start (its pages are still cached: no file growth). Ends when the pool closes.
async fn checkpoint_loop(pool: SqlitePool) {
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        if pool.is_closed() {
            return;
        }
        let passive: Result<(i64, i64, i64), sqlx::Error> =
            sqlx::query_as("PRAGMA wal_checkpoint(PASSIVE)")
                .fetch_one(&pool)
                .await;
        let result = match passive {
            Ok((_, log_frames, _)) if log_frames > WAL_RESTART_FRAMES => {
                sqlx::query("PRAGMA wal_checkpoint(RESTART)")
                    .execute(&pool)
                    .await
                    .map(|_| ())
            }
            other => other.map(|_| ()),
        };
        if let Err(e) = result {
            if pool.is_closed() {
                return;
            }
            tracing::warn!(error = %e, "WAL checkpoint failed; retrying");
        }
    }
}

/// WAL size (in 8 KiB frames; 64 MiB) beyond which the checkpointer restarts the WAL.
const WAL_RESTART_FRAMES: i64 = 8192;

/// (cited, problem) pairs whose envelope diff is empty.
fn unchanged_pairs(
    cited: &[String],
    problem: &[String],
    bodies: &BTreeMap<String, Vec<u8>>,
) -> Result<Vec<(String, String)>, StoreError> {
    let parse = |d: &String| -> Result<Option<pstack_envelope::Envelope>, StoreError> {
        match bodies.get(d) {
            None => Ok(None),
            Some(b) => pstack_envelope::parse(b)
                .map(|(e, _)| Some(e))
                .map_err(|e| StoreError::Corrupt {
                    digest: d.clone(),
                    reason: e.to_string(),
                }),
        }
    };
    let mut out = Vec::new();
    for c in cited {
        let Some(after) = parse(c)? else { continue };
        for p in problem {
            let Some(before) = parse(p)? else { continue };
            if let Ok(d) = pstack_envelope::diff(&before, &after)
                && d.is_empty()
            {
                out.push((c.clone(), p.clone()));
            }
        }
    }
    Ok(out)
}

/// Validate history query parameters into a [`HistoryQuery`]. `params` are the
/// identity fields given (everything but `kind`, `limit`, `before`).
pub fn history_query(
    kind: &str,
    params: &BTreeMap<String, String>,
    before: Option<(i64, String)>,
    limit: i64,
) -> Result<HistoryQuery, String> {
    let fields = identity_fields(kind).ok_or_else(|| format!("unknown subject kind {kind:?}"))?;
    for name in params.keys() {
        if !fields.contains(&name.as_str()) {
            return Err(format!(
                "{name:?} is not an identity field of a {kind} subject (fields: {})",
                fields.join(", ")
            ));
        }
    }
    let locator = locator_field(kind).unwrap_or("host");
    let Some(loc) = params.get(locator) else {
        return Err(format!("a {kind} history needs {locator}="));
    };
    let pid = match params.get("pid") {
        Some(p) => Some(
            p.parse::<i64>()
                .map_err(|_| format!("pid {p:?} is not an integer"))?,
        ),
        None if matches!(kind, "process" | "thread") => {
            return Err(format!(
                "a {kind} history needs pid= (a host alone names no process)"
            ));
        }
        None => None,
    };
    let required: Vec<&str> = fields.iter().copied().filter(|f| *f != "net_ns").collect();
    let full = required.iter().all(|f| params.contains_key(*f))
        && (kind != "network_stream" || params.contains_key("net_ns"));
    let subject_key = full.then(|| {
        let map: BTreeMap<&str, &str> = params
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        subject_key(kind, &serde_json::to_string(&map).unwrap_or_default())
    });
    let filters = params
        .iter()
        .filter(|(k, _)| k.as_str() != locator && k.as_str() != "pid")
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    Ok(HistoryQuery {
        subject_key,
        kind: kind.to_string(),
        locator: loc.clone(),
        pid,
        filters,
        before,
        limit,
    })
}

// After the macros above, which it uses.
pub mod analysis;
mod bench_fill;
pub mod gate;
pub mod gate_key;
mod ingest;
pub mod login_throttle;
pub mod operators;
pub mod runs;
pub mod transfers;
