//! Eval runs' storage: record a run, read it back, and the key that
//! recorded it.
//!
//! Invariants:
//! - Ids are `evr_` + 16 random hex digits ([`super::new_id`]); the writing
//!   key is recorded with the run.

use sqlx::Row;

use super::new_id;
use crate::analysis::proof::EvalRun;
use crate::db::{Pools, Store, StoreError};

macro_rules! eval_row {
    ($row:expr) => {{
        let row = $row;
        EvalRun {
            id: row.try_get("id")?,
            eval_case_id: row.try_get("eval_case_id")?,
            input_payload_hash: row.try_get("input_payload_hash")?,
            passed: row.try_get::<i64, _>("passed")? != 0,
            service_version: row.try_get("service_version")?,
            commit_sha: row.try_get("commit_sha")?,
            candidate_agent_version: row.try_get("candidate_agent_version")?,
            failure_fingerprint: row.try_get("failure_fingerprint")?,
        }
    }};
}

impl Store {
    /// The key that recorded eval run `id`.
    pub async fn eval_run_writer(&self, id: &str) -> Result<Option<String>, StoreError> {
        with_pool!(self, read, |pool, pg| {
            Ok(
                sqlx::query_scalar("SELECT key_id FROM eval_runs WHERE id = $1")
                    .bind(id)
                    .fetch_optional(pool)
                    .await?,
            )
        })
    }

    /// Store an eval run.
    pub async fn record_eval_run(
        &self,
        run: &EvalRun,
        key_id: &str,
        now_ns: i64,
    ) -> Result<String, StoreError> {
        let id = new_id("evr")?;
        with_pool!(self, write, |pool, pg| {
            sqlx::query(
                "INSERT INTO eval_runs (id, eval_case_id, input_payload_hash, passed, service_version, commit_sha,
                    candidate_agent_version, failure_fingerprint, key_id, created_ns)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
            )
            .bind(&id)
            .bind(&run.eval_case_id)
            .bind(&run.input_payload_hash)
            .bind(i64::from(run.passed))
            .bind(run.service_version.as_deref())
            .bind(run.commit_sha.as_deref())
            .bind(run.candidate_agent_version.as_deref())
            .bind(run.failure_fingerprint.as_deref())
            .bind(key_id)
            .bind(now_ns)
            .execute(pool)
            .await?;
            Ok::<(), StoreError>(())
        })?;
        Ok(id)
    }

    /// One eval run.
    pub async fn eval_run(&self, id: &str) -> Result<Option<(EvalRun, i64)>, StoreError> {
        with_pool!(self, read, |pool, pg| {
            let Some(row) = sqlx::query(
                "SELECT id, eval_case_id, input_payload_hash, passed, service_version, commit_sha,
                        candidate_agent_version, failure_fingerprint, created_ns
                 FROM eval_runs WHERE id = $1",
            )
            .bind(id)
            .fetch_optional(pool)
            .await?
            else {
                return Ok(None);
            };
            let created: i64 = row.try_get("created_ns")?;
            Ok(Some((eval_row!(&row), created)))
        })
    }
}
