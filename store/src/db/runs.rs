//! Storage of supervised runs (migration `0004_runs`).
//!
//! Invariants: a registered graph's (name, version) never changes body; a
//! run changes only by [`Store::update_run`], one conditional update on its
//! revision, so two racing steps cannot both apply; an ended run's row is
//! never set back to running (the update's predicate refuses it); a run has
//! at most one typed-failure receipt.

use super::{Pools, Store, StoreError};

/// A stored run.
#[derive(Debug, Clone)]
pub struct RunRow {
    /// Id.
    pub id: String,
    /// Graph name.
    pub graph_name: String,
    /// Graph version.
    pub graph_version: String,
    /// Graph content hash.
    pub content_hash: String,
    /// `running` / `ended`.
    pub status: String,
    /// The supervisor state (`runs::supervisor::RunState` as JSON).
    pub state_json: String,
    /// Bumped by every update.
    pub revision: i64,
    /// Started.
    pub created_ns: i64,
    /// Last step.
    pub updated_ns: i64,
    /// Ended.
    pub ended_ns: Option<i64>,
}

/// A typed-failure receipt.
#[derive(Debug, Clone)]
pub struct FailureReceiptRow {
    /// The run.
    pub run_id: String,
    /// Where it failed.
    pub failed_step_id: Option<String>,
    /// The failure class, if one was derivable.
    pub failure_class: Option<String>,
    /// The run's subject key.
    pub subject_key: Option<String>,
    /// The last pre-mutation envelope.
    pub pre_digest: Option<String>,
    /// The last post-mutation envelope.
    pub post_digest: Option<String>,
    /// When.
    pub created_ns: i64,
}

/// Whether a graph registration stored, matched, or conflicted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GraphPut {
    /// New.
    Created,
    /// The same body was already registered.
    Same,
    /// Another body is registered under this name and version.
    Conflict,
}

impl Store {
    /// Register a graph.
    pub async fn put_run_graph(
        &self,
        name: &str,
        version: &str,
        content_hash: &str,
        graph_json: &str,
        key_id: &str,
        now_ns: i64,
    ) -> Result<GraphPut, StoreError> {
        let r = with_pool!(self, write, |pool, pg| {
            sqlx::query(
                "INSERT INTO run_graphs (name, version, content_hash, graph_json, key_id, created_ns) VALUES ($1, $2, $3, $4, $5, $6)",
            )
            .bind(name)
            .bind(version)
            .bind(content_hash)
            .bind(graph_json)
            .bind(key_id)
            .bind(now_ns)
            .execute(pool)
            .await
            .map(|_| ())
            .map_err(StoreError::from)
        });
        match r {
            Ok(()) => Ok(GraphPut::Created),
            Err(e) if e.is_unique_violation() => match self.run_graph(name, version).await? {
                Some((hash, _)) if hash == content_hash => Ok(GraphPut::Same),
                _ => Ok(GraphPut::Conflict),
            },
            Err(e) => Err(e),
        }
    }

    /// A registered graph: (content hash, JSON).
    pub async fn run_graph(
        &self,
        name: &str,
        version: &str,
    ) -> Result<Option<(String, String)>, StoreError> {
        with_pool!(self, read, |pool, pg| {
            Ok(sqlx::query_as(
                "SELECT content_hash, graph_json FROM run_graphs WHERE name = $1 AND version = $2",
            )
            .bind(name)
            .bind(version)
            .fetch_optional(pool)
            .await?)
        })
    }

    /// Store a new run.
    pub async fn create_run(&self, row: &RunRow, key_id: &str) -> Result<(), StoreError> {
        with_pool!(self, write, |pool, pg| {
            sqlx::query(
                "INSERT INTO runs (id, graph_name, graph_version, content_hash, status, state_json, revision, key_id, created_ns, updated_ns, ended_ns) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
            )
            .bind(&row.id)
            .bind(&row.graph_name)
            .bind(&row.graph_version)
            .bind(&row.content_hash)
            .bind(&row.status)
            .bind(&row.state_json)
            .bind(row.revision)
            .bind(key_id)
            .bind(row.created_ns)
            .bind(row.updated_ns)
            .bind(row.ended_ns)
            .execute(pool)
            .await?;
            Ok(())
        })
    }

    /// A run.
    pub async fn run(&self, id: &str) -> Result<Option<RunRow>, StoreError> {
        type Row = (
            String,
            String,
            String,
            String,
            String,
            String,
            i64,
            i64,
            i64,
            Option<i64>,
        );
        let r: Option<Row> = with_pool!(self, read, |pool, pg| {
            sqlx::query_as(
                "SELECT id, graph_name, graph_version, content_hash, status, state_json, revision, created_ns, updated_ns, ended_ns FROM runs WHERE id = $1",
            )
            .bind(id)
            .fetch_optional(pool)
            .await?
        });
        Ok(r.map(|r| RunRow {
            id: r.0,
            graph_name: r.1,
            graph_version: r.2,
            content_hash: r.3,
            status: r.4,
            state_json: r.5,
            revision: r.6,
            created_ns: r.7,
            updated_ns: r.8,
            ended_ns: r.9,
        }))
    }

    /// Apply a step: `false` if the run moved on since `revision` was read
    /// (or is ended and the new status would be running).
    pub async fn update_run(
        &self,
        id: &str,
        revision: i64,
        status: &str,
        state_json: &str,
        now_ns: i64,
    ) -> Result<bool, StoreError> {
        let ended = (status == "ended").then_some(now_ns);
        with_pool!(self, write, |pool, pg| {
            let r = sqlx::query(
                "UPDATE runs SET status = $1, state_json = $2, revision = revision + 1, updated_ns = $3, ended_ns = COALESCE(ended_ns, $4)
                 WHERE id = $5 AND revision = $6 AND NOT (status = 'ended' AND $1 <> 'ended')",
            )
            .bind(status)
            .bind(state_json)
            .bind(now_ns)
            .bind(ended)
            .bind(id)
            .bind(revision)
            .execute(pool)
            .await?;
            Ok(r.rows_affected() == 1)
        })
    }

    /// Record a run's typed-failure receipt (once; a second is ignored).
    pub async fn put_failure_receipt(&self, r: &FailureReceiptRow) -> Result<(), StoreError> {
        with_pool!(self, write, |pool, pg| {
            sqlx::query(
                "INSERT INTO run_failure_receipts (run_id, failed_step_id, failure_class, subject_key, pre_digest, post_digest, created_ns) VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (run_id) DO NOTHING",
            )
            .bind(&r.run_id)
            .bind(&r.failed_step_id)
            .bind(&r.failure_class)
            .bind(&r.subject_key)
            .bind(&r.pre_digest)
            .bind(&r.post_digest)
            .bind(r.created_ns)
            .execute(pool)
            .await?;
            Ok(())
        })
    }

    /// A run's typed-failure receipt.
    pub async fn failure_receipt(
        &self,
        run_id: &str,
    ) -> Result<Option<FailureReceiptRow>, StoreError> {
        type Row = (
            String,
            Option<String>,
            Option<String>,
            Option<String>,
            Option<String>,
            Option<String>,
            i64,
        );
        let r: Option<Row> = with_pool!(self, read, |pool, pg| {
            sqlx::query_as(
                "SELECT run_id, failed_step_id, failure_class, subject_key, pre_digest, post_digest, created_ns FROM run_failure_receipts WHERE run_id = $1",
            )
            .bind(run_id)
            .fetch_optional(pool)
            .await?
        });
        Ok(r.map(|r| FailureReceiptRow {
            run_id: r.0,
            failed_step_id: r.1,
            failure_class: r.2,
            subject_key: r.3,
            pre_digest: r.4,
            post_digest: r.5,
            created_ns: r.6,
        }))
    }

    /// An envelope's (subject key, kind, wall ns).
    pub async fn envelope_subject(
        &self,
        digest: &str,
    ) -> Result<Option<(String, String, i64)>, StoreError> {
        with_pool!(self, read, |pool, pg| {
            Ok(
                sqlx::query_as(
                    "SELECT subject_key, kind, wall_ns FROM envelopes WHERE digest = $1",
                )
                .bind(digest)
                .fetch_optional(pool)
                .await?,
            )
        })
    }
}
