//! Incidents and runner leases: open or join an incident, lease it to
//! one runner under a fencing token, resolve it; the alerts that opened it.
//!
//! Invariants:
//! - **One active incident per (project, environment, dedup key)**, enforced
//!   by the partial unique index `uq_incidents_active_dedup` (predicate on
//!   status only). A concurrent duplicate open loses on the index and joins
//!   the winner.
//! - **Leases are fenced.** Every grant of a lease increments the incident's
//!   `fencing_token` in the same statement that takes the lease, so two
//!   racing acquirers cannot both win and a token, once superseded, never
//!   matches again. Runner writes are conditional on the current token
//!   ([`fence_check`]).

use sqlx::Row;

use crate::db::{Pools, Store, StoreError};

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

pub(super) const INCIDENT_COLUMNS: &str =
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
pub(super) use incident_row;

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

impl Store {
    /// Open an incident, or join the active one with the same dedup triple:
    /// (incident, deduplicated).
    pub async fn open_incident(
        &self,
        n: &NewIncident,
        key_id: &str,
        now_ns: i64,
    ) -> Result<(IncidentRow, bool), StoreError> {
        for _ in 0..5 {
            let id = crate::db::analysis::new_id("inc")?;
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
}
