//! Grants: the guarded status transitions of a proposal after it is
//! stored — approve, reject, claim (with the CAS), complete or fail, and
//! the expiry of lapsed windows.
//!
//! Invariants:
//! - **Grants are single-use and hashed.** Only `grant_hash` is stored. Every
//!   status transition is one conditional `UPDATE … WHERE status = <from>`,
//!   so of two concurrent claims (or approve/reject races) exactly one
//!   changes the row.
//! - **CAS at claim is atomic.** The claim reads the target's ontology row
//!   and moves the proposal in one transaction; on PostgreSQL the ontology
//!   row is read `FOR SHARE`, so a ledger write to it waits for the claim.
//! - A window that passed is recorded in the same transaction that refuses
//!   the late write (`expired`, `execution_timed_out`).

use serde_json::Value;
use sqlx::Row;

use super::ontology::cas_mismatches;
use super::parse_json;
use super::proposals::{PROPOSAL_COLUMNS, ProposalRow, proposal_row};
use crate::db::{Bind, Pools, Store, StoreError};

/// Outcome of a guarded status transition.
#[derive(Debug, Clone)]
pub enum Transition {
    /// Moved; the row after.
    Done(ProposalRow),
    /// Not moved: the row as it is (its status says why).
    Refused(ProposalRow),
    /// No such proposal.
    NotFound,
}

/// Outcome of a claim.
#[derive(Debug, Clone)]
pub enum ClaimOutcome {
    /// Claimed by this runner.
    Claimed(ProposalRow),
    /// The grant's window passed (the row is now `expired`).
    Expired(ProposalRow),
    /// Not claimable in its status (already claimed, rejected, …).
    Conflict(ProposalRow),
    /// `expectedCurrentState` does not match the target now: (field,
    /// expected, actual) per mismatch.
    Mismatch(Vec<(String, Value, Value)>),
    /// No such proposal.
    NotFound,
}

/// What a complete/fail report asks.
#[derive(Debug, Clone)]
pub struct Finish<'a> {
    /// Claiming runner.
    pub runner_id: &'a str,
    /// `true`: completed; `false`: failed_execution.
    pub success: bool,
    /// Runner's report.
    pub outcome: &'a Value,
    /// Checkpoint offsets to arm on success, ns after completion.
    pub checkpoints: &'a [i64],
}

impl Store {
    async fn transition(
        &self,
        id: &str,
        set: &str,
        guard: &str,
        binds: &[Bind<'_>],
    ) -> Result<Transition, StoreError> {
        let moved = with_pool!(self, write, |pool, pg| {
            let sql = format!(
                "UPDATE remediation_proposals SET {set} WHERE id = $1 AND {guard} RETURNING {PROPOSAL_COLUMNS}"
            );
            let row = bind_all!(sqlx::query(&sql).bind(id), binds)
                .fetch_optional(pool)
                .await?;
            match row {
                Some(r) => Some(proposal_row!(&r)),
                None => None,
            }
        });
        match moved {
            Some(r) => Ok(Transition::Done(r)),
            None => Ok(match self.proposal(id).await? {
                Some(r) => Transition::Refused(r),
                None => Transition::NotFound,
            }),
        }
    }

    /// A human approves a parked proposal: a grant (hash, claimable until
    /// `grant_expires_ns`) is stored and the stored callback cleared.
    pub async fn approve_proposal(
        &self,
        id: &str,
        grant_hash: &str,
        decided_by: &str,
        now_ns: i64,
        grant_expires_ns: i64,
    ) -> Result<Transition, StoreError> {
        self.transition(
            id,
            "status = 'grant_issued', grant_hash = $2, grant_issued_ns = $3, grant_expires_ns = $4,
             callback_sealed = NULL, decided_by = $5, updated_ns = $3",
            "status = 'pending_human_approval'",
            &[
                Bind::Text(grant_hash),
                Bind::I64(now_ns),
                Bind::I64(grant_expires_ns),
                Bind::Text(decided_by),
            ],
        )
        .await
    }

    /// A human rejects a parked proposal or an unclaimed grant.
    pub async fn reject_proposal(
        &self,
        id: &str,
        decided_by: &str,
        now_ns: i64,
    ) -> Result<Transition, StoreError> {
        self.transition(
            id,
            "status = 'rejected', callback_sealed = NULL, decided_by = $2, updated_ns = $3",
            "(status = 'pending_human_approval' OR (status = 'grant_issued' AND grant_expires_ns > $3))",
            &[Bind::Text(decided_by), Bind::I64(now_ns)],
        )
        .await
    }

    /// Store the last webhook delivery outcome.
    pub async fn set_callback_delivery(
        &self,
        id: &str,
        delivery: &Value,
        now_ns: i64,
    ) -> Result<(), StoreError> {
        with_pool!(self, write, |pool, pg| {
            sqlx::query(
                "UPDATE remediation_proposals SET callback_delivery = $2, updated_ns = $3 WHERE id = $1",
            )
            .bind(id)
            .bind(delivery.to_string())
            .bind(now_ns)
            .execute(pool)
            .await?;
            Ok(())
        })
    }

    /// Claim a grant: the CAS of `expectedCurrentState` against the target's
    /// current state and the move to `claimed_executing` (to be finished
    /// before `execution_deadline_ns`), atomically. The caller has checked
    /// the token against `grant_hash`.
    pub async fn claim_grant(
        &self,
        id: &str,
        grant_hash: &str,
        runner_id: &str,
        now_ns: i64,
        execution_deadline_ns: i64,
    ) -> Result<ClaimOutcome, StoreError> {
        let Some(p) = self.proposal(id).await? else {
            return Ok(ClaimOutcome::NotFound);
        };
        let outcome = with_pool!(self, write, |pool, pg| {
            let mut tx = begin_write!(pool, pg);
            // Lapsed: record it, and say so.
            let lapsed = sqlx::query(
                "UPDATE remediation_proposals SET status = 'expired', updated_ns = $2
                 WHERE id = $1 AND status = 'grant_issued' AND grant_expires_ns <= $2",
            )
            .bind(id)
            .bind(now_ns)
            .execute(&mut *tx)
            .await?
            .rows_affected();
            if lapsed == 1 {
                tx.commit().await?;
                None
            } else {
                let share = if pg { " FOR SHARE" } else { "" };
                // The target's current state, read inside the transaction.
                let current: Value = if let Some(subject) = p.target_key.strip_prefix("subject:") {
                    let latest: Option<String> = sqlx::query_scalar(&format!(
                        "SELECT latest_digest FROM subjects WHERE subject_key = $1{share}"
                    ))
                    .bind(subject)
                    .fetch_optional(&mut *tx)
                    .await?;
                    serde_json::json!({"envelopeDigest": latest})
                } else {
                    let row = sqlx::query(&format!(
                        "SELECT version, commit_sha, config_digest, flags FROM ontology_nodes WHERE node_key = $1{share}"
                    ))
                    .bind(&p.target_key)
                    .fetch_optional(&mut *tx)
                    .await?;
                    match row {
                        None => serde_json::json!({}),
                        Some(r) => serde_json::json!({
                            "version": r.try_get::<Option<String>, _>("version")?,
                            "commitSha": r.try_get::<Option<String>, _>("commit_sha")?,
                            "configDigest": r.try_get::<Option<String>, _>("config_digest")?,
                            "flags": parse_json(&r.try_get::<String, _>("flags")?),
                        }),
                    }
                };
                let expected = if p.target_key.starts_with("subject:") {
                    serde_json::json!({"envelopeDigest": p.pre_mutation_envelope})
                } else {
                    p.expected_state.clone()
                };
                let mismatches = cas_mismatches(&expected, &current);
                if !mismatches.is_empty() {
                    tx.rollback().await?;
                    return Ok(ClaimOutcome::Mismatch(mismatches));
                }
                let row = sqlx::query(&format!(
                    "UPDATE remediation_proposals
                     SET status = 'claimed_executing', runner_id = $3, claimed_ns = $4,
                         execution_deadline_ns = $5, updated_ns = $4
                     WHERE id = $1 AND status = 'grant_issued' AND grant_hash = $2 AND grant_expires_ns > $4
                     RETURNING {PROPOSAL_COLUMNS}"
                ))
                .bind(id)
                .bind(grant_hash)
                .bind(runner_id)
                .bind(now_ns)
                .bind(execution_deadline_ns)
                .fetch_optional(&mut *tx)
                .await?;
                let claimed = match row {
                    Some(r) => Some(proposal_row!(&r)),
                    None => None,
                };
                tx.commit().await?;
                claimed.map(ClaimOutcome::Claimed)
            }
        });
        if let Some(o) = outcome {
            return Ok(o);
        }
        Ok(match self.proposal(id).await? {
            None => ClaimOutcome::NotFound,
            Some(r) if r.status == "expired" => ClaimOutcome::Expired(r),
            Some(r) => ClaimOutcome::Conflict(r),
        })
    }

    /// Complete or fail a claimed grant (claiming runner, within the
    /// execution window); completion arms the watchdog checkpoints. A late
    /// report moves the row to `execution_timed_out` and is refused.
    pub async fn finish_grant(
        &self,
        id: &str,
        f: &Finish<'_>,
        now_ns: i64,
    ) -> Result<Transition, StoreError> {
        let status = if f.success {
            "completed"
        } else {
            "failed_execution"
        };
        let moved = with_pool!(self, write, |pool, pg| {
            let mut tx = begin_write!(pool, pg);
            sqlx::query(
                "UPDATE remediation_proposals SET status = 'execution_timed_out', finished_ns = $2, updated_ns = $2
                 WHERE id = $1 AND status = 'claimed_executing' AND execution_deadline_ns <= $2",
            )
            .bind(id)
            .bind(now_ns)
            .execute(&mut *tx)
            .await?;
            let recovery = if f.success { Some("monitoring") } else { None };
            let causal = if f.success { Some("pending") } else { None };
            let row = sqlx::query(&format!(
                "UPDATE remediation_proposals
                 SET status = $3, finished_ns = $4, outcome = $5, recovery_status = $6,
                     causal_verification_status = $7, updated_ns = $4
                 WHERE id = $1 AND status = 'claimed_executing' AND runner_id = $2
                   AND execution_deadline_ns > $4
                 RETURNING {PROPOSAL_COLUMNS}"
            ))
            .bind(id)
            .bind(f.runner_id)
            .bind(status)
            .bind(now_ns)
            .bind(f.outcome.to_string())
            .bind(recovery)
            .bind(causal)
            .fetch_optional(&mut *tx)
            .await?;
            let moved = match row {
                Some(r) => Some(proposal_row!(&r)),
                None => None,
            };
            if moved.is_some() && f.success {
                for (ord, offset) in f.checkpoints.iter().enumerate() {
                    sqlx::query(
                        "INSERT INTO remediation_checkpoints (proposal_id, ord, due_ns) VALUES ($1, $2, $3)",
                    )
                    .bind(id)
                    .bind(ord as i64)
                    .bind(now_ns + offset)
                    .execute(&mut *tx)
                    .await?;
                }
            }
            tx.commit().await?;
            moved
        });
        match moved {
            Some(r) => Ok(Transition::Done(r)),
            None => Ok(match self.proposal(id).await? {
                Some(r) => Transition::Refused(r),
                None => Transition::NotFound,
            }),
        }
    }

    /// Move unclaimed grants past their window to `expired` and claims past
    /// their execution window to `execution_timed_out`: (expired, timed out).
    pub async fn expire_grants(&self, now_ns: i64) -> Result<(u64, u64), StoreError> {
        with_pool!(self, write, |pool, pg| {
            let expired = sqlx::query(
                "UPDATE remediation_proposals SET status = 'expired', updated_ns = $1
                 WHERE status = 'grant_issued' AND grant_expires_ns <= $1",
            )
            .bind(now_ns)
            .execute(pool)
            .await?
            .rows_affected();
            let timed_out = sqlx::query(
                "UPDATE remediation_proposals SET status = 'execution_timed_out', finished_ns = $1, updated_ns = $1
                 WHERE status = 'claimed_executing' AND execution_deadline_ns <= $1",
            )
            .bind(now_ns)
            .execute(pool)
            .await?
            .rows_affected();
            Ok((expired, timed_out))
        })
    }
}
