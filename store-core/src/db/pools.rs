//! Opening and closing the database: the pools of each backend.
//!
//! Invariants:
//! - **SQLite** runs in WAL mode with one writer connection (SQLite admits
//!   one writer; queueing in the pool beats `SQLITE_BUSY` retries), a pool
//!   of readers, and a checkpointer connection that copies the WAL into the
//!   database every 200 ms ([`checkpoint_loop`]) so the writer never stalls
//!   on a checkpoint's fsync, and restarts the WAL past
//!   [`WAL_RESTART_FRAMES`] so it cannot grow without bound.
//! - `synchronous=NORMAL` by default: a crash of the store process loses
//!   nothing committed; a power loss may roll back the last ~200 ms of
//!   commits (never corrupts). [`OpenOptions::sqlite_durable`] makes every
//!   acknowledged batch survive power loss too.
//! - The SQLite file (and its `-wal`/`-shm`) is 0600: it holds every
//!   envelope.
//! - A store is migrated before [`Store::open`] returns it; envelopes stored
//!   before the transfer join existed are offered to it once, when that
//!   migration is applied.

use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use serde::Serialize;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};

use super::migrations::TRANSFERS_MIGRATION;
use super::{Store, StoreError};

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
pub(super) enum Pools {
    Sqlite {
        writer: SqlitePool,
        reader: SqlitePool,
        checkpointer: SqlitePool,
    },
    Postgres(PgPool),
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

    /// Cheap liveness probe of the database.
    pub async fn ping(&self) -> Result<(), StoreError> {
        with_pool!(self, read, |pool, pg| {
            sqlx::query("SELECT 1").execute(pool).await?;
            Ok(())
        })
    }
}
