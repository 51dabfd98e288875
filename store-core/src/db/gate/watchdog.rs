//! The watchdog's storage: the checkpoints a completed grant arms, their
//! verdicts, and the receipts the gate writes on host subjects.
//!
//! Invariants:
//! - A checkpoint is evaluated once: its verdict is written only while it
//!   has none.
//! - Receipt evidence references `envelopes.digest ON DELETE RESTRICT` and
//!   retention skips it.

use serde_json::Value;
use sqlx::Row;

use super::parse_json;
use crate::db::{Pools, Store, StoreError};

/// A due watchdog checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DueCheckpoint {
    /// Proposal.
    pub proposal_id: String,
    /// 0, 1, 2.
    pub ord: i64,
    /// Due, ns.
    pub due_ns: i64,
}

/// An evaluated (or pending) checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointRow {
    /// 0, 1, 2.
    pub ord: i64,
    /// Due, ns.
    pub due_ns: i64,
    /// Evaluated, ns.
    pub evaluated_ns: Option<i64>,
    /// Comparable requests.
    pub requests: Option<i64>,
    /// Failed among them.
    pub errors: Option<i64>,
    /// `healthy`, `degraded`, `low_traffic`.
    pub verdict: Option<String>,
}

/// A gate receipt on a host subject.
#[derive(Debug, Clone, PartialEq)]
pub struct GateReceipt {
    /// `REALIZED`, `VERIFIED` or `FAULT_STANDING`.
    pub kind: String,
    /// Subject key.
    pub subject_key: String,
    /// Post-mutation envelope.
    pub evidence: String,
    /// Detail (JSON).
    pub detail: Value,
    /// Created, ns.
    pub created_ns: i64,
}

impl Store {
    /// Checkpoints due and not yet evaluated, oldest first.
    pub async fn due_checkpoints(&self, now_ns: i64) -> Result<Vec<DueCheckpoint>, StoreError> {
        with_pool!(self, read, |pool, pg| {
            let rows: Vec<(String, i64, i64)> = sqlx::query_as(
                "SELECT c.proposal_id, c.ord, c.due_ns FROM remediation_checkpoints c
                 JOIN remediation_proposals p ON p.id = c.proposal_id
                 WHERE c.evaluated_ns IS NULL AND c.due_ns <= $1 AND p.recovery_status = 'monitoring'
                 ORDER BY c.due_ns, c.proposal_id, c.ord",
            )
            .bind(now_ns)
            .fetch_all(pool)
            .await?;
            Ok(rows
                .into_iter()
                .map(|(proposal_id, ord, due_ns)| DueCheckpoint {
                    proposal_id,
                    ord,
                    due_ns,
                })
                .collect())
        })
    }

    /// The checkpoints of a proposal, in order.
    pub async fn checkpoints(&self, proposal_id: &str) -> Result<Vec<CheckpointRow>, StoreError> {
        with_pool!(self, read, |pool, pg| {
            let rows = sqlx::query(
                "SELECT ord, due_ns, evaluated_ns, requests, errors, verdict
                 FROM remediation_checkpoints WHERE proposal_id = $1 ORDER BY ord",
            )
            .bind(proposal_id)
            .fetch_all(pool)
            .await?;
            let mut out = Vec::with_capacity(rows.len());
            for r in &rows {
                out.push(CheckpointRow {
                    ord: r.try_get("ord")?,
                    due_ns: r.try_get("due_ns")?,
                    evaluated_ns: r.try_get("evaluated_ns")?,
                    requests: r.try_get("requests")?,
                    errors: r.try_get("errors")?,
                    verdict: r.try_get("verdict")?,
                });
            }
            Ok(out)
        })
    }

    /// Record a checkpoint's verdict and the proposal's recovery statuses
    /// after it, in one transaction (a checkpoint is evaluated once).
    #[allow(
        clippy::too_many_arguments,
        reason = "one call site; the columns of one row, named"
    )]
    pub async fn record_checkpoint(
        &self,
        proposal_id: &str,
        ord: i64,
        requests: i64,
        errors: i64,
        verdict: &str,
        recovery: (&str, &str),
        now_ns: i64,
    ) -> Result<bool, StoreError> {
        with_pool!(self, write, |pool, pg| {
            let mut tx = begin_write!(pool, pg);
            let n = sqlx::query(
                "UPDATE remediation_checkpoints SET evaluated_ns = $3, requests = $4, errors = $5, verdict = $6
                 WHERE proposal_id = $1 AND ord = $2 AND evaluated_ns IS NULL",
            )
            .bind(proposal_id)
            .bind(ord)
            .bind(now_ns)
            .bind(requests)
            .bind(errors)
            .bind(verdict)
            .execute(&mut *tx)
            .await?
            .rows_affected();
            if n == 0 {
                return Ok(false);
            }
            sqlx::query(
                "UPDATE remediation_proposals SET recovery_status = $2, causal_verification_status = $3, updated_ns = $4
                 WHERE id = $1",
            )
            .bind(proposal_id)
            .bind(recovery.0)
            .bind(recovery.1)
            .bind(now_ns)
            .execute(&mut *tx)
            .await?;
            tx.commit().await?;
            Ok(true)
        })
    }

    /// Record a gate receipt once per (proposal, kind); `false` if present.
    pub async fn record_gate_receipt(
        &self,
        proposal_id: &str,
        r: &GateReceipt,
    ) -> Result<bool, StoreError> {
        let res = with_pool!(self, write, |pool, pg| {
            sqlx::query(
                "INSERT INTO remediation_receipts (proposal_id, kind, subject_key, evidence, detail, created_ns)
                 VALUES ($1, $2, $3, $4, $5, $6)",
            )
            .bind(proposal_id)
            .bind(&r.kind)
            .bind(&r.subject_key)
            .bind(&r.evidence)
            .bind(r.detail.to_string())
            .bind(r.created_ns)
            .execute(pool)
            .await
            .map(|_| ())
            .map_err(StoreError::from)
        });
        match res {
            Ok(_) => Ok(true),
            Err(e) if e.is_unique_violation() => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Gate receipts of a proposal.
    pub async fn gate_receipts(&self, proposal_id: &str) -> Result<Vec<GateReceipt>, StoreError> {
        with_pool!(self, read, |pool, pg| {
            let rows: Vec<(String, String, String, String, i64)> = sqlx::query_as(
                "SELECT kind, subject_key, evidence, detail, created_ns FROM remediation_receipts
                 WHERE proposal_id = $1 ORDER BY created_ns, kind",
            )
            .bind(proposal_id)
            .fetch_all(pool)
            .await?;
            Ok(rows
                .into_iter()
                .map(
                    |(kind, subject_key, evidence, detail, created_ns)| GateReceipt {
                        kind,
                        subject_key,
                        evidence,
                        detail: parse_json(&detail),
                        created_ns,
                    },
                )
                .collect())
        })
    }

    /// Envelopes of a subject captured after `after_ns`, oldest first:
    /// (digest, wall ns, completeness).
    pub async fn subject_envelopes_after(
        &self,
        subject_key: &str,
        after_ns: i64,
    ) -> Result<Vec<(String, i64, String)>, StoreError> {
        with_pool!(self, read, |pool, pg| {
            Ok(sqlx::query_as(
                "SELECT digest, wall_ns, completeness FROM envelopes
                 WHERE subject_key = $1 AND wall_ns > $2 ORDER BY wall_ns, digest",
            )
            .bind(subject_key)
            .bind(after_ns)
            .fetch_all(pool)
            .await?)
        })
    }

    /// (subject key, wall ns, completeness) of one stored envelope.
    pub async fn envelope_meta(
        &self,
        digest: &str,
    ) -> Result<Option<(String, i64, String)>, StoreError> {
        with_pool!(self, read, |pool, pg| {
            Ok(sqlx::query_as(
                "SELECT subject_key, wall_ns, completeness FROM envelopes WHERE digest = $1",
            )
            .bind(digest)
            .fetch_optional(pool)
            .await?)
        })
    }
}
