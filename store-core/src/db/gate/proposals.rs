//! Remediation proposals: the stored row, its reads, and the insert under
//! the fence and the circuit breaker.
//!
//! Invariants:
//! - A proposal row never holds a token: only `grant_hash`.
//! - **The breaker counts under a lock.** Counting live proposals of one
//!   (fingerprint, action) and inserting the next happen in one transaction
//!   serialized per pair (SQLite's single writer; a PostgreSQL transaction
//!   advisory lock), after overdue grants were moved to `expired`.
//! - One idempotency key, one proposal: a second insert under it replays
//!   the first.
//! - A cited `pre_mutation_envelope` references `envelopes.digest ON DELETE
//!   RESTRICT` and retention skips it.

use serde_json::Value;
use sqlx::Row;

use super::incidents::{
    Fence, FenceRefusal, INCIDENT_COLUMNS, IncidentRow, fence_check, incident_row,
};
use super::parse_json;
use crate::db::{Pools, Store, StoreError};

/// A stored remediation proposal (never holds a token; `grant_hash` only).
#[derive(Debug, Clone, PartialEq)]
pub struct ProposalRow {
    /// `rem_…`.
    pub id: String,
    /// Incident.
    pub incident_id: String,
    /// Finding.
    pub finding_id: String,
    /// Action wire name.
    pub action: String,
    /// Target as given (JSON).
    pub target: Value,
    /// `service:<env>/<name>` or `subject:<subject key>`.
    pub target_key: String,
    /// `expectedCurrentState` (JSON).
    pub expected_state: Value,
    /// Caller's requested autonomy.
    pub requested_autonomy: Option<String>,
    /// Policy decision.
    pub effective_autonomy: String,
    /// The finding's tier when proposed.
    pub causal_proof_tier: String,
    /// The finding's fingerprint (breaker scope).
    pub fingerprint: String,
    /// Status.
    pub status: String,
    /// Idempotency key.
    pub idempotency_key: String,
    /// Cited pre-mutation envelope digest (host subjects).
    pub pre_mutation_envelope: Option<String>,
    /// Keyed hash of the grant token.
    pub grant_hash: Option<String>,
    /// Grant minted, ns.
    pub grant_issued_ns: Option<i64>,
    /// Claim deadline, ns.
    pub grant_expires_ns: Option<i64>,
    /// Claiming runner.
    pub runner_id: Option<String>,
    /// Claimed, ns.
    pub claimed_ns: Option<i64>,
    /// Complete/fail deadline, ns.
    pub execution_deadline_ns: Option<i64>,
    /// Completed/failed/timed out, ns.
    pub finished_ns: Option<i64>,
    /// Runner's report (JSON).
    pub outcome: Option<Value>,
    /// Sealed stored callback (URL + secret).
    pub callback_sealed: Option<String>,
    /// Host of the stored callback.
    pub callback_host: Option<String>,
    /// Last delivery outcome (JSON).
    pub callback_delivery: Option<Value>,
    /// Watchdog: recovery status.
    pub recovery_status: Option<String>,
    /// Watchdog: causal verification status.
    pub causal_verification_status: Option<String>,
    /// Who approved or rejected (key id).
    pub decided_by: Option<String>,
    /// Created, ns.
    pub created_ns: i64,
    /// Updated, ns.
    pub updated_ns: i64,
}

pub(super) const PROPOSAL_COLUMNS: &str = "id, incident_id, finding_id, action, target, target_key,
    expected_state, requested_autonomy, effective_autonomy, causal_proof_tier, fingerprint, status,
    idempotency_key, pre_mutation_envelope, grant_hash, grant_issued_ns, grant_expires_ns, runner_id,
    claimed_ns, execution_deadline_ns, finished_ns, outcome, callback_sealed, callback_host,
    callback_delivery, recovery_status, causal_verification_status, decided_by, created_ns, updated_ns";

macro_rules! proposal_row {
    ($row:expr) => {{
        let row = $row;
        ProposalRow {
            id: row.try_get("id")?,
            incident_id: row.try_get("incident_id")?,
            finding_id: row.try_get("finding_id")?,
            action: row.try_get("action")?,
            target: parse_json(&row.try_get::<String, _>("target")?),
            target_key: row.try_get("target_key")?,
            expected_state: parse_json(&row.try_get::<String, _>("expected_state")?),
            requested_autonomy: row.try_get("requested_autonomy")?,
            effective_autonomy: row.try_get("effective_autonomy")?,
            causal_proof_tier: row.try_get("causal_proof_tier")?,
            fingerprint: row.try_get("fingerprint")?,
            status: row.try_get("status")?,
            idempotency_key: row.try_get("idempotency_key")?,
            pre_mutation_envelope: row.try_get("pre_mutation_envelope")?,
            grant_hash: row.try_get("grant_hash")?,
            grant_issued_ns: row.try_get("grant_issued_ns")?,
            grant_expires_ns: row.try_get("grant_expires_ns")?,
            runner_id: row.try_get("runner_id")?,
            claimed_ns: row.try_get("claimed_ns")?,
            execution_deadline_ns: row.try_get("execution_deadline_ns")?,
            finished_ns: row.try_get("finished_ns")?,
            outcome: row
                .try_get::<Option<String>, _>("outcome")?
                .map(|s| parse_json(&s)),
            callback_sealed: row.try_get("callback_sealed")?,
            callback_host: row.try_get("callback_host")?,
            callback_delivery: row
                .try_get::<Option<String>, _>("callback_delivery")?
                .map(|s| parse_json(&s)),
            recovery_status: row.try_get("recovery_status")?,
            causal_verification_status: row.try_get("causal_verification_status")?,
            decided_by: row.try_get("decided_by")?,
            created_ns: row.try_get("created_ns")?,
            updated_ns: row.try_get("updated_ns")?,
        }
    }};
}
pub(super) use proposal_row;

/// Outcome of inserting a proposal.
#[derive(Debug, Clone)]
pub enum ProposeOutcome {
    /// Stored now.
    Inserted(ProposalRow),
    /// A proposal with this idempotency key exists.
    Replay(ProposalRow),
    /// The circuit breaker holds: `live` live proposals in the window.
    BreakerOpen { live: i64 },
    /// The incident's lease refused this write.
    Fence(FenceRefusal),
}

/// Filters of the proposal list.
#[derive(Debug, Clone, Default)]
pub struct ProposalFilter {
    /// One incident.
    pub incident_id: Option<String>,
    /// One status.
    pub status: Option<String>,
    /// Page size.
    pub limit: i64,
}

impl Store {
    /// A proposal by id.
    pub async fn proposal(&self, id: &str) -> Result<Option<ProposalRow>, StoreError> {
        self.proposal_where("id", id).await
    }

    /// The key that proposed `id` (its provenance; the claim refuses it
    /// for an autonomous grant, `crate::gate::provenance`).
    pub async fn proposal_writer(&self, id: &str) -> Result<Option<String>, StoreError> {
        with_pool!(self, read, |pool, pg| {
            Ok(
                sqlx::query_scalar("SELECT key_id FROM remediation_proposals WHERE id = $1")
                    .bind(id)
                    .fetch_optional(pool)
                    .await?,
            )
        })
    }

    /// A proposal by idempotency key.
    pub async fn proposal_by_key(&self, key: &str) -> Result<Option<ProposalRow>, StoreError> {
        self.proposal_where("idempotency_key", key).await
    }

    async fn proposal_where(
        &self,
        column: &'static str,
        value: &str,
    ) -> Result<Option<ProposalRow>, StoreError> {
        with_pool!(self, read, |pool, pg| {
            let row = sqlx::query(&format!(
                "SELECT {PROPOSAL_COLUMNS} FROM remediation_proposals WHERE {column} = $1"
            ))
            .bind(value)
            .fetch_optional(pool)
            .await?;
            match row {
                Some(r) => Ok(Some(proposal_row!(&r))),
                None => Ok(None),
            }
        })
    }

    /// Proposals, newest first.
    pub async fn proposals(&self, f: &ProposalFilter) -> Result<Vec<ProposalRow>, StoreError> {
        with_pool!(self, read, |pool, pg| {
            let rows = sqlx::query(&format!(
                "SELECT {PROPOSAL_COLUMNS} FROM remediation_proposals
                 WHERE ($1 IS NULL OR incident_id = $1) AND ($2 IS NULL OR status = $2)
                 ORDER BY created_ns DESC, id DESC LIMIT $3"
            ))
            .bind(f.incident_id.as_deref())
            .bind(f.status.as_deref())
            .bind(f.limit)
            .fetch_all(pool)
            .await?;
            let mut out = Vec::with_capacity(rows.len());
            for r in &rows {
                out.push(proposal_row!(r));
            }
            Ok(out)
        })
    }

    /// Insert a proposal: fenced against the incident's lease, counted by the
    /// circuit breaker (when its status holds a slot), deduplicated by
    /// idempotency key — all in one transaction.
    pub async fn insert_proposal(
        &self,
        p: &ProposalRow,
        fence: &Fence,
        key_id: &str,
        now_ns: i64,
    ) -> Result<ProposeOutcome, StoreError> {
        use crate::gate::policy::{BREAKER_LIMIT, BREAKER_WINDOW_NS, Status};
        if let Some(existing) = self.proposal_by_key(&p.idempotency_key).await? {
            return Ok(ProposeOutcome::Replay(existing));
        }
        let counts = Status::parse(&p.status).is_some_and(Status::counts_for_breaker);
        // `None`: another request with this idempotency key committed first
        // (seen inside the transaction, or lost to on the unique index); the
        // winner is read after this transaction ends.
        let inserted: Option<ProposeOutcome> = with_pool!(self, write, |pool, pg| {
            let mut tx = begin_write!(pool, pg);
            // A replay is a replay whatever the lease or the breaker say
            // now: it returns what the first request got. SQLite's writer
            // is serialized (BEGIN IMMEDIATE), so this sees any winner.
            let replayed: bool = sqlx::query_scalar(
                "SELECT EXISTS (SELECT 1 FROM remediation_proposals WHERE idempotency_key = $1)",
            )
            .bind(&p.idempotency_key)
            .fetch_one(&mut *tx)
            .await?;
            if replayed {
                tx.rollback().await?;
                return self.replay_of(&p.idempotency_key).await;
            }
            // FOR SHARE: a lease change (an UPDATE of this row) waits for this
            // proposal, while proposals of one incident do not wait for each other.
            let lock = if pg { " FOR SHARE" } else { "" };
            let row = sqlx::query(&format!(
                "SELECT {INCIDENT_COLUMNS} FROM incident_investigations WHERE id = $1{lock}"
            ))
            .bind(&p.incident_id)
            .fetch_optional(&mut *tx)
            .await?;
            let Some(row) = row else {
                return Ok(ProposeOutcome::Fence(FenceRefusal::NoIncident));
            };
            let inc = incident_row!(&row);
            if let Err(r) = fence_check(&inc, fence, now_ns) {
                return Ok(ProposeOutcome::Fence(r));
            }
            if pg {
                sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended($1, 7470530003))")
                    .bind(format!("{}\u{1f}{}", p.fingerprint, p.action))
                    .execute(&mut *tx)
                    .await?;
                // A same-key request for the same (fingerprint, action) that
                // held the lock before us has committed by now: replay it
                // rather than count it against the breaker (a 429 for a
                // replay) or lose to it on the unique index.
                let replayed: bool = sqlx::query_scalar(
                    "SELECT EXISTS (SELECT 1 FROM remediation_proposals WHERE idempotency_key = $1)",
                )
                .bind(&p.idempotency_key)
                .fetch_one(&mut *tx)
                .await?;
                if replayed {
                    tx.rollback().await?;
                    return self.replay_of(&p.idempotency_key).await;
                }
            }
            sqlx::query(
                "UPDATE remediation_proposals SET status = 'expired', updated_ns = $1
                 WHERE fingerprint = $2 AND action = $3 AND status = 'grant_issued' AND grant_expires_ns <= $1",
            )
            .bind(now_ns)
            .bind(&p.fingerprint)
            .bind(&p.action)
            .execute(&mut *tx)
            .await?;
            if counts {
                let live: i64 = sqlx::query_scalar(
                    "SELECT COUNT(*) FROM remediation_proposals
                     WHERE fingerprint = $1 AND action = $2 AND created_ns > $3
                       AND status NOT IN ('rejected', 'expired')",
                )
                .bind(&p.fingerprint)
                .bind(&p.action)
                .bind(now_ns - BREAKER_WINDOW_NS)
                .fetch_one(&mut *tx)
                .await?;
                if live >= BREAKER_LIMIT {
                    return Ok(ProposeOutcome::BreakerOpen { live });
                }
            }
            // ON CONFLICT: a same-key request that is not serialized with
            // this one (another fingerprint or action, another replica's
            // transaction in flight) may win the index; PostgreSQL waits for
            // it to commit, and this insert then does nothing.
            let stored = sqlx::query(&format!(
                "INSERT INTO remediation_proposals ({PROPOSAL_COLUMNS}, key_id)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18,
                         $19, $20, $21, $22, $23, $24, $25, $26, $27, $28, $29, $30, $31)
                 ON CONFLICT (idempotency_key) DO NOTHING"
            ))
            .bind(&p.id)
            .bind(&p.incident_id)
            .bind(&p.finding_id)
            .bind(&p.action)
            .bind(p.target.to_string())
            .bind(&p.target_key)
            .bind(p.expected_state.to_string())
            .bind(p.requested_autonomy.as_deref())
            .bind(&p.effective_autonomy)
            .bind(&p.causal_proof_tier)
            .bind(&p.fingerprint)
            .bind(&p.status)
            .bind(&p.idempotency_key)
            .bind(p.pre_mutation_envelope.as_deref())
            .bind(p.grant_hash.as_deref())
            .bind(p.grant_issued_ns)
            .bind(p.grant_expires_ns)
            .bind(p.runner_id.as_deref())
            .bind(p.claimed_ns)
            .bind(p.execution_deadline_ns)
            .bind(p.finished_ns)
            .bind(p.outcome.as_ref().map(Value::to_string))
            .bind(p.callback_sealed.as_deref())
            .bind(p.callback_host.as_deref())
            .bind(p.callback_delivery.as_ref().map(Value::to_string))
            .bind(p.recovery_status.as_deref())
            .bind(p.causal_verification_status.as_deref())
            .bind(p.decided_by.as_deref())
            .bind(p.created_ns)
            .bind(p.updated_ns)
            .bind(key_id)
            .execute(&mut *tx)
            .await?
            .rows_affected();
            if stored == 0 {
                tx.rollback().await?;
                None
            } else {
                tx.commit().await?;
                Some(ProposeOutcome::Inserted(p.clone()))
            }
        });
        match inserted {
            Some(outcome) => Ok(outcome),
            None => self.replay_of(&p.idempotency_key).await,
        }
    }

    /// The replay of the committed proposal with this idempotency key.
    async fn replay_of(&self, idempotency_key: &str) -> Result<ProposeOutcome, StoreError> {
        match self.proposal_by_key(idempotency_key).await? {
            Some(existing) => Ok(ProposeOutcome::Replay(existing)),
            // Only a hand-deleted row gets here: the key was taken, then gone.
            None => Err(StoreError::ProposalVanished(idempotency_key.to_string())),
        }
    }
}
