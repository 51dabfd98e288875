//! The schema: versioned migrations per backend and the step that applies
//! them.
//!
//! Invariants:
//! - Migrations are SQL files per backend (`store-core/migrations/`), applied
//!   in order, each in one transaction, and recorded in
//!   `pstack_schema_migrations`; every step not recorded there runs, each
//!   once — also one added below an applied one.
//! - One migrator at a time: a PostgreSQL advisory lock across processes;
//!   on SQLite `BEGIN IMMEDIATE` before the "applied?" read.

use super::{Pools, Store, StoreError};

/// Versioned migrations: (version, name, SQLite SQL, PostgreSQL SQL).
const MIGRATIONS: &[(i64, &str, &str, &str)] = &[
    (
        1,
        "core",
        include_str!("../../migrations/sqlite/0001_core.sql"),
        include_str!("../../migrations/postgres/0001_core.sql"),
    ),
    (
        2,
        "analysis",
        include_str!("../../migrations/sqlite/0002_analysis.sql"),
        include_str!("../../migrations/postgres/0002_analysis.sql"),
    ),
    (
        3,
        "gate",
        include_str!("../../migrations/sqlite/0003_gate.sql"),
        include_str!("../../migrations/postgres/0003_gate.sql"),
    ),
    (
        4,
        "runs",
        include_str!("../../migrations/sqlite/0004_runs.sql"),
        include_str!("../../migrations/postgres/0004_runs.sql"),
    ),
    (
        5,
        "transfers",
        include_str!("../../migrations/sqlite/0005_transfers.sql"),
        include_str!("../../migrations/postgres/0005_transfers.sql"),
    ),
    (
        6,
        "scopes",
        include_str!("../../migrations/sqlite/0006_scopes.sql"),
        include_str!("../../migrations/postgres/0006_scopes.sql"),
    ),
    (
        7,
        "gate_key",
        include_str!("../../migrations/sqlite/0007_gate_key.sql"),
        include_str!("../../migrations/postgres/0007_gate_key.sql"),
    ),
    (
        8,
        "hypotheses",
        include_str!("../../migrations/sqlite/0008_hypotheses.sql"),
        include_str!("../../migrations/postgres/0008_hypotheses.sql"),
    ),
    (
        9,
        "accounts",
        include_str!("../../migrations/sqlite/0009_accounts.sql"),
        include_str!("../../migrations/postgres/0009_accounts.sql"),
    ),
    (
        10,
        "cohorts",
        include_str!("../../migrations/sqlite/0010_cohorts.sql"),
        include_str!("../../migrations/postgres/0010_cohorts.sql"),
    ),
    (
        11,
        "body_codec",
        include_str!("../../migrations/sqlite/0011_body_codec.sql"),
        include_str!("../../migrations/postgres/0011_body_codec.sql"),
    ),
];

/// The schema version a store opened by this build is at: its newest
/// migration.
pub const SCHEMA_VERSION: i64 = MIGRATIONS[MIGRATIONS.len() - 1].0;

/// The migration that created the transfer join (`crate::transfers`).
pub(super) const TRANSFERS_MIGRATION: i64 = 5;

impl Store {
    /// Apply pending migrations; the versions applied now.
    pub(super) async fn migrate(&self) -> Result<Vec<i64>, StoreError> {
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
}
