//! Storage of the remediation gate: incidents and runner leases, the
//! ontology of current target state, remediation proposals and their
//! grants, watchdog checkpoints and receipts.
//!
//! Invariants:
//! - **One active incident per (project, environment, dedup key)**, enforced
//!   by the partial unique index `uq_incidents_active_dedup` (predicate on
//!   status only). A concurrent duplicate open loses on the index and joins
//!   the winner.
//! - **Leases are fenced.** Every grant of a lease increments the incident's
//!   `fencing_token` in the same statement that takes the lease, so two
//!   racing acquirers cannot both win and a token, once superseded, never
//!   matches again. Runner writes are conditional on the current token.
//! - **Grants are single-use and hashed.** Only `grant_hash` is stored. Every
//!   status transition is one conditional `UPDATE … WHERE status = <from>`,
//!   so of two concurrent claims (or approve/reject races) exactly one
//!   changes the row.
//! - **CAS at claim is atomic.** The claim reads the target's ontology row
//!   and moves the proposal in one transaction; on PostgreSQL the ontology
//!   row is read `FOR SHARE`, so a ledger write to it waits for the claim.
//! - **The breaker counts under a lock.** Counting live proposals of one
//!   (fingerprint, action) and inserting the next happen in one transaction
//!   serialized per pair (SQLite's single writer; a PostgreSQL transaction
//!   advisory lock), after overdue grants were moved to `expired`.
//! - Cited envelopes (`pre_mutation_envelope`, receipt evidence) reference
//!   `envelopes.digest ON DELETE RESTRICT` and retention skips them.

use serde_json::Value;
use sqlx::Row;

use super::{Bind, Pools, Store, StoreError};
use crate::analysis::ledger::NewChange;

/// Ontology node key of a service target.
pub fn service_node_key(environment: &str, service: &str) -> String {
    format!("service:{environment}/{service}")
}

/// A stored incident.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IncidentRow {
    /// `inc_…`.
    pub id: String,
    /// Project.
    pub project_id: String,
    /// Environment.
    pub environment: String,
    /// Dedup key.
    pub dedup_key: String,
    /// Title.
    pub title: String,
    /// Fault locus entity, when known.
    pub fault_locus_entity_id: Option<String>,
    /// `open`, `leased` or `resolved`.
    pub status: String,
    /// Lease holder.
    pub lease_runner_id: Option<String>,
    /// Lease expiry, ns.
    pub lease_expires_ns: Option<i64>,
    /// Current fencing token (0: never leased).
    pub fencing_token: i64,
    /// Opens and alerts that joined it.
    pub alert_count: i64,
    /// Created, ns.
    pub created_ns: i64,
    /// Updated, ns.
    pub updated_ns: i64,
}

const INCIDENT_COLUMNS: &str =
    "id, project_id, environment, dedup_key, title, fault_locus_entity_id,
    status, lease_runner_id, lease_expires_ns, fencing_token, alert_count, created_ns, updated_ns";

macro_rules! incident_row {
    ($row:expr) => {{
        let row = $row;
        IncidentRow {
            id: row.try_get("id")?,
            project_id: row.try_get("project_id")?,
            environment: row.try_get("environment")?,
            dedup_key: row.try_get("dedup_key")?,
            title: row.try_get("title")?,
            fault_locus_entity_id: row.try_get("fault_locus_entity_id")?,
            status: row.try_get("status")?,
            lease_runner_id: row.try_get("lease_runner_id")?,
            lease_expires_ns: row.try_get("lease_expires_ns")?,
            fencing_token: row.try_get("fencing_token")?,
            alert_count: row.try_get("alert_count")?,
            created_ns: row.try_get("created_ns")?,
            updated_ns: row.try_get("updated_ns")?,
        }
    }};
}

/// An incident to open.
#[derive(Debug, Clone)]
pub struct NewIncident {
    /// Project.
    pub project_id: String,
    /// Environment.
    pub environment: String,
    /// Dedup key.
    pub dedup_key: String,
    /// Title.
    pub title: String,
    /// Fault locus.
    pub fault_locus_entity_id: Option<String>,
}

/// Outcome of a lease request.
#[derive(Debug, Clone)]
pub enum LeaseOutcome {
    /// Granted (acquire: a new fencing token) or renewed/released.
    Ok(IncidentRow),
    /// Another runner holds an unexpired lease (acquire), or the presented
    /// runner/token is not the current holder's (renew/release).
    Refused(IncidentRow),
    /// The incident is resolved.
    Resolved(IncidentRow),
    /// No such incident.
    NotFound,
}

/// A runner's fencing credentials on a write.
#[derive(Debug, Clone)]
pub struct Fence {
    /// Runner.
    pub runner_id: Option<String>,
    /// Token it holds.
    pub fencing_token: Option<i64>,
}

/// Why a fenced write was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FenceRefusal {
    /// The incident does not exist.
    NoIncident,
    /// The incident is resolved.
    Resolved,
    /// An unexpired lease is held and this write did not present it.
    LeaseHeld { holder: String, current: i64 },
    /// The presented token is not the current one.
    Stale { presented: i64, current: i64 },
}

/// Whether a write with `fence` may touch `inc` now.
pub fn fence_check(inc: &IncidentRow, fence: &Fence, now_ns: i64) -> Result<(), FenceRefusal> {
    if inc.status == "resolved" {
        return Err(FenceRefusal::Resolved);
    }
    let live = inc.status == "leased" && inc.lease_expires_ns.is_some_and(|e| e > now_ns);
    match fence.fencing_token {
        Some(t) if t != inc.fencing_token || !live && inc.status == "leased" => {
            Err(FenceRefusal::Stale {
                presented: t,
                current: inc.fencing_token,
            })
        }
        Some(_) if live && fence.runner_id.as_deref() != inc.lease_runner_id.as_deref() => {
            Err(FenceRefusal::Stale {
                presented: fence.fencing_token.unwrap_or(0),
                current: inc.fencing_token,
            })
        }
        None if live => Err(FenceRefusal::LeaseHeld {
            holder: inc.lease_runner_id.clone().unwrap_or_default(),
            current: inc.fencing_token,
        }),
        _ => Ok(()),
    }
}

/// The current state of one target, as the change ledger set it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct OntologyNode {
    /// Node key.
    pub node_key: String,
    /// `service`.
    pub kind: String,
    /// Environment.
    pub environment: String,
    /// Service name.
    pub name: String,
    /// Live version.
    pub version: Option<String>,
    /// Live commit.
    pub commit_sha: Option<String>,
    /// Live config digest.
    pub config_digest: Option<String>,
    /// Feature-flag values (JSON object).
    pub flags: Value,
    /// The change that last set it.
    pub last_change_id: String,
    /// That change's effective time, ns.
    pub changed_ns: i64,
}

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

const PROPOSAL_COLUMNS: &str = "id, incident_id, finding_id, action, target, target_key,
    expected_state, requested_autonomy, effective_autonomy, causal_proof_tier, fingerprint, status,
    idempotency_key, pre_mutation_envelope, grant_hash, grant_issued_ns, grant_expires_ns, runner_id,
    claimed_ns, execution_deadline_ns, finished_ns, outcome, callback_sealed, callback_host,
    callback_delivery, recovery_status, causal_verification_status, decided_by, created_ns, updated_ns";

fn parse_json(s: &str) -> Value {
    serde_json::from_str(s).unwrap_or(Value::Null)
}

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
    // ---- incidents ----

    /// Open an incident, or join the active one with the same dedup triple:
    /// (incident, deduplicated).
    pub async fn open_incident(
        &self,
        n: &NewIncident,
        key_id: &str,
        now_ns: i64,
    ) -> Result<(IncidentRow, bool), StoreError> {
        for _ in 0..5 {
            let id = super::analysis::new_id("inc")?;
            let inserted = with_pool!(self, write, |pool, pg| {
                sqlx::query(
                    "INSERT INTO incident_investigations (id, project_id, environment, dedup_key, title,
                        fault_locus_entity_id, status, fencing_token, alert_count, key_id, created_ns, updated_ns)
                     VALUES ($1, $2, $3, $4, $5, $6, 'open', 0, 1, $7, $8, $8)",
                )
                .bind(&id)
                .bind(&n.project_id)
                .bind(&n.environment)
                .bind(&n.dedup_key)
                .bind(&n.title)
                .bind(n.fault_locus_entity_id.as_deref())
                .bind(key_id)
                .bind(now_ns)
                .execute(pool)
                .await
                .map(|_| ())
                .map_err(StoreError::from)
            });
            match inserted {
                Ok(_) => {
                    let row = self.incident(&id).await?;
                    return row
                        .map(|r| (r, false))
                        .ok_or_else(|| StoreError::Db(sqlx::Error::RowNotFound));
                }
                Err(e) if e.is_unique_violation() => {
                    let joined = with_pool!(self, write, |pool, pg| {
                        let row = sqlx::query(&format!(
                            "UPDATE incident_investigations SET alert_count = alert_count + 1, updated_ns = $4
                             WHERE project_id = $1 AND environment = $2 AND dedup_key = $3
                               AND status IN ('open', 'leased')
                             RETURNING {INCIDENT_COLUMNS}"
                        ))
                        .bind(&n.project_id)
                        .bind(&n.environment)
                        .bind(&n.dedup_key)
                        .bind(now_ns)
                        .fetch_optional(pool)
                        .await?;
                        match row {
                            Some(r) => Some(incident_row!(&r)),
                            None => None,
                        }
                    });
                    if let Some(r) = joined {
                        return Ok((r, true));
                    }
                    // The active one was resolved in between: open anew.
                }
                Err(e) => return Err(e),
            }
        }
        Err(StoreError::Db(sqlx::Error::RowNotFound))
    }

    /// The active incident of a dedup triple, if any.
    pub async fn active_incident(
        &self,
        n: &NewIncident,
    ) -> Result<Option<IncidentRow>, StoreError> {
        with_pool!(self, read, |pool, pg| {
            let row = sqlx::query(&format!(
                "SELECT {INCIDENT_COLUMNS} FROM incident_investigations
                 WHERE project_id = $1 AND environment = $2 AND dedup_key = $3 AND status IN ('open', 'leased')"
            ))
            .bind(&n.project_id)
            .bind(&n.environment)
            .bind(&n.dedup_key)
            .fetch_optional(pool)
            .await?;
            match row {
                Some(r) => Ok(Some(incident_row!(&r))),
                None => Ok(None),
            }
        })
    }

    /// One incident.
    pub async fn incident(&self, id: &str) -> Result<Option<IncidentRow>, StoreError> {
        with_pool!(self, read, |pool, pg| {
            let row = sqlx::query(&format!(
                "SELECT {INCIDENT_COLUMNS} FROM incident_investigations WHERE id = $1"
            ))
            .bind(id)
            .fetch_optional(pool)
            .await?;
            match row {
                Some(r) => Ok(Some(incident_row!(&r))),
                None => Ok(None),
            }
        })
    }

    /// Incidents, newest first.
    pub async fn incidents(
        &self,
        environment: Option<&str>,
        status: Option<&str>,
        limit: i64,
    ) -> Result<Vec<IncidentRow>, StoreError> {
        with_pool!(self, read, |pool, pg| {
            let rows = sqlx::query(&format!(
                "SELECT {INCIDENT_COLUMNS} FROM incident_investigations
                 WHERE ($1 IS NULL OR environment = $1) AND ($2 IS NULL OR status = $2)
                 ORDER BY created_ns DESC, id DESC LIMIT $3"
            ))
            .bind(environment)
            .bind(status)
            .bind(limit)
            .fetch_all(pool)
            .await?;
            let mut out = Vec::with_capacity(rows.len());
            for r in &rows {
                out.push(incident_row!(r));
            }
            Ok(out)
        })
    }

    /// Take the lease when it is free or expired: a new fencing token.
    pub async fn acquire_lease(
        &self,
        id: &str,
        runner_id: &str,
        ttl_ns: i64,
        now_ns: i64,
    ) -> Result<LeaseOutcome, StoreError> {
        let taken = with_pool!(self, write, |pool, pg| {
            let row = sqlx::query(&format!(
                "UPDATE incident_investigations
                 SET status = 'leased', lease_runner_id = $2, lease_expires_ns = $3,
                     fencing_token = fencing_token + 1, updated_ns = $4
                 WHERE id = $1 AND (status = 'open' OR (status = 'leased' AND lease_expires_ns <= $4))
                 RETURNING {INCIDENT_COLUMNS}"
            ))
            .bind(id)
            .bind(runner_id)
            .bind(now_ns.saturating_add(ttl_ns))
            .bind(now_ns)
            .fetch_optional(pool)
            .await?;
            match row {
                Some(r) => Some(incident_row!(&r)),
                None => None,
            }
        });
        if let Some(r) = taken {
            return Ok(LeaseOutcome::Ok(r));
        }
        self.lease_refusal(id).await
    }

    async fn lease_refusal(&self, id: &str) -> Result<LeaseOutcome, StoreError> {
        Ok(match self.incident(id).await? {
            None => LeaseOutcome::NotFound,
            Some(r) if r.status == "resolved" => LeaseOutcome::Resolved(r),
            Some(r) => LeaseOutcome::Refused(r),
        })
    }

    /// Extend the holder's unexpired lease (same fencing token).
    pub async fn renew_lease(
        &self,
        id: &str,
        runner_id: &str,
        token: i64,
        ttl_ns: i64,
        now_ns: i64,
    ) -> Result<LeaseOutcome, StoreError> {
        let renewed = with_pool!(self, write, |pool, pg| {
            let row = sqlx::query(&format!(
                "UPDATE incident_investigations SET lease_expires_ns = $4, updated_ns = $5
                 WHERE id = $1 AND status = 'leased' AND lease_runner_id = $2 AND fencing_token = $3
                   AND lease_expires_ns > $5
                 RETURNING {INCIDENT_COLUMNS}"
            ))
            .bind(id)
            .bind(runner_id)
            .bind(token)
            .bind(now_ns.saturating_add(ttl_ns))
            .bind(now_ns)
            .fetch_optional(pool)
            .await?;
            match row {
                Some(r) => Some(incident_row!(&r)),
                None => None,
            }
        });
        match renewed {
            Some(r) => Ok(LeaseOutcome::Ok(r)),
            None => self.lease_refusal(id).await,
        }
    }

    /// Give the lease back (holder, current token): the incident is `open`.
    pub async fn release_lease(
        &self,
        id: &str,
        runner_id: &str,
        token: i64,
        now_ns: i64,
    ) -> Result<LeaseOutcome, StoreError> {
        let released = with_pool!(self, write, |pool, pg| {
            let row = sqlx::query(&format!(
                "UPDATE incident_investigations
                 SET status = 'open', lease_runner_id = NULL, lease_expires_ns = NULL, updated_ns = $4
                 WHERE id = $1 AND status = 'leased' AND lease_runner_id = $2 AND fencing_token = $3
                   AND lease_expires_ns > $4
                 RETURNING {INCIDENT_COLUMNS}"
            ))
            .bind(id)
            .bind(runner_id)
            .bind(token)
            .bind(now_ns)
            .fetch_optional(pool)
            .await?;
            match row {
                Some(r) => Some(incident_row!(&r)),
                None => None,
            }
        });
        match released {
            Some(r) => Ok(LeaseOutcome::Ok(r)),
            None => self.lease_refusal(id).await,
        }
    }

    /// Resolve an incident (fenced like any runner write): it leaves the
    /// dedup index, so the next open of the same key starts a new one.
    pub async fn resolve_incident(
        &self,
        id: &str,
        fence: &Fence,
        now_ns: i64,
    ) -> Result<Result<IncidentRow, FenceRefusal>, StoreError> {
        with_pool!(self, write, |pool, pg| {
            let mut tx = begin_write!(pool, pg);
            let lock = if pg { " FOR UPDATE" } else { "" };
            let row = sqlx::query(&format!(
                "SELECT {INCIDENT_COLUMNS} FROM incident_investigations WHERE id = $1{lock}"
            ))
            .bind(id)
            .fetch_optional(&mut *tx)
            .await?;
            let Some(row) = row else {
                return Ok(Err(FenceRefusal::NoIncident));
            };
            let inc = incident_row!(&row);
            if let Err(r) = fence_check(&inc, fence, now_ns) {
                return Ok(Err(r));
            }
            let row = sqlx::query(&format!(
                "UPDATE incident_investigations
                 SET status = 'resolved', lease_runner_id = NULL, lease_expires_ns = NULL, updated_ns = $2
                 WHERE id = $1 RETURNING {INCIDENT_COLUMNS}"
            ))
            .bind(id)
            .bind(now_ns)
            .fetch_one(&mut *tx)
            .await?;
            let inc = incident_row!(&row);
            tx.commit().await?;
            Ok(Ok(inc))
        })
    }

    /// Reap expired leases back to `open`; the number reaped.
    pub async fn reap_leases(&self, now_ns: i64) -> Result<u64, StoreError> {
        with_pool!(self, write, |pool, pg| {
            let r = sqlx::query(
                "UPDATE incident_investigations
                 SET status = 'open', lease_runner_id = NULL, lease_expires_ns = NULL, updated_ns = $1
                 WHERE status = 'leased' AND lease_expires_ns <= $1",
            )
            .bind(now_ns)
            .execute(pool)
            .await?;
            Ok(r.rows_affected())
        })
    }

    /// Record one received alert against an incident.
    pub async fn record_alert(
        &self,
        incident_id: &str,
        a: &crate::gate::alertmanager::AlertRecord,
        now_ns: i64,
    ) -> Result<(), StoreError> {
        with_pool!(self, write, |pool, pg| {
            sqlx::query(
                "INSERT INTO incident_alerts (incident_id, fingerprint, status, starts_at, ends_at, labels, received_ns)
                 VALUES ($1, $2, $3, $4, $5, $6, $7)",
            )
            .bind(incident_id)
            .bind(&a.fingerprint)
            .bind(&a.status)
            .bind(a.starts_at.as_deref())
            .bind(a.ends_at.as_deref())
            .bind(a.labels.to_string())
            .bind(now_ns)
            .execute(pool)
            .await?;
            Ok(())
        })
    }

    /// Alerts of an incident, oldest first: (fingerprint, status, received ns).
    pub async fn incident_alerts(
        &self,
        incident_id: &str,
    ) -> Result<Vec<(String, String, i64)>, StoreError> {
        with_pool!(self, read, |pool, pg| {
            Ok(sqlx::query_as(
                "SELECT fingerprint, status, received_ns FROM incident_alerts
                 WHERE incident_id = $1 ORDER BY received_ns, id",
            )
            .bind(incident_id)
            .fetch_all(pool)
            .await?)
        })
    }

    // ---- ontology ----

    /// One ontology node.
    pub async fn ontology_node(&self, key: &str) -> Result<Option<OntologyNode>, StoreError> {
        with_pool!(self, read, |pool, pg| {
            let row = sqlx::query(
                "SELECT node_key, kind, environment, name, version, commit_sha, config_digest,
                        flags, last_change_id, changed_ns
                 FROM ontology_nodes WHERE node_key = $1",
            )
            .bind(key)
            .fetch_optional(pool)
            .await?;
            match row {
                None => Ok(None),
                Some(r) => Ok(Some(OntologyNode {
                    node_key: r.try_get("node_key")?,
                    kind: r.try_get("kind")?,
                    environment: r.try_get("environment")?,
                    name: r.try_get("name")?,
                    version: r.try_get("version")?,
                    commit_sha: r.try_get("commit_sha")?,
                    config_digest: r.try_get("config_digest")?,
                    flags: parse_json(&r.try_get::<String, _>("flags")?),
                    last_change_id: r.try_get("last_change_id")?,
                    changed_ns: r.try_get("changed_ns")?,
                })),
            }
        })
    }

    // ---- proposals ----

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

    /// Findings of an incident: ids, oldest first.
    pub async fn incident_finding_ids(&self, incident_id: &str) -> Result<Vec<String>, StoreError> {
        with_pool!(self, read, |pool, pg| {
            Ok(sqlx::query_scalar(
                "SELECT id FROM findings WHERE incident_id = $1 ORDER BY created_ns, id",
            )
            .bind(incident_id)
            .fetch_all(pool)
            .await?)
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

    // ---- watchdog ----

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

/// Each field of `expected` that differs from `current`: (field, expected,
/// actual). A field the target does not record reads as `null`, so it
/// mismatches: an unknown state never satisfies a CAS.
pub fn cas_mismatches(expected: &Value, current: &Value) -> Vec<(String, Value, Value)> {
    let mut out = Vec::new();
    if let Some(map) = expected.as_object() {
        for (k, want) in map {
            if k == "flags"
                && let Some(flags) = want.as_object()
            {
                // Flag by flag: only the named flags must hold.
                for (name, want) in flags {
                    let have = current
                        .get("flags")
                        .and_then(|f| f.get(name))
                        .cloned()
                        .unwrap_or(Value::Null);
                    if have.is_null() || &have != want {
                        out.push((format!("flags.{name}"), want.clone(), have));
                    }
                }
                continue;
            }
            let have = current.get(k).cloned().unwrap_or(Value::Null);
            if have.is_null() || &have != want {
                out.push((k.clone(), want.clone(), have));
            }
        }
    }
    out
}

/// The ontology upsert a service change implies: (node key, SQL) for the
/// change's transaction, or `None` for host changes. Fields the change does
/// not carry keep their value, flags merge one by one; an older change (by
/// effective time) never overwrites a newer one. Binds: node key,
/// environment, service, version, commit, config digest, change id,
/// effective ns, now ns, flags (JSON object text).
pub(super) fn ontology_upsert(c: &NewChange, pg: bool) -> Option<(String, String)> {
    let service = c.service.as_deref()?;
    if !crate::analysis::ledger::SERVICE_KINDS.contains(&c.kind.as_str()) {
        return None;
    }
    let merge = if pg {
        "(ontology_nodes.flags::jsonb || excluded.flags::jsonb)::text"
    } else {
        "json_patch(ontology_nodes.flags, excluded.flags)"
    };
    Some((
        service_node_key(&c.environment, service),
        format!(
            "INSERT INTO ontology_nodes (node_key, kind, environment, name, version, commit_sha,
                config_digest, last_change_id, changed_ns, updated_ns, flags)
             VALUES ($1, 'service', $2, $3, $4, $5, $6, $7, $8, $9, $10)
             ON CONFLICT (node_key) DO UPDATE SET
                version = COALESCE(excluded.version, ontology_nodes.version),
                commit_sha = COALESCE(excluded.commit_sha, ontology_nodes.commit_sha),
                config_digest = COALESCE(excluded.config_digest, ontology_nodes.config_digest),
                flags = {merge},
                last_change_id = excluded.last_change_id,
                changed_ns = excluded.changed_ns,
                updated_ns = excluded.updated_ns
             WHERE excluded.changed_ns >= ontology_nodes.changed_ns"
        ),
    ))
}
