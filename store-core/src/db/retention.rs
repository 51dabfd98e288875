//! Retention: dropping old envelopes by age and by stored bytes.
//!
//! "Bytes" are envelope bytes as received (`envelopes.size`), not the
//! compressed length a body may have on disk (`super::body`): a limit means
//! the same whatever the codec, and across stores written before v11.
//!
//! Invariants:
//! - No envelope a receipt cites is ever deleted (the query never selects
//!   one, and the foreign key would refuse it anyway).
//! - Both limits apply; deletion runs in bounded chunks, oldest first.
//! - A subject whose newest envelope was dropped points at its newest
//!   remaining envelope afterwards.

use std::collections::BTreeSet;
use std::time::Duration;

use super::{Backend, Bind, HistoryQuery, Pools, Store, StoreError, placeholders};
use serde::Serialize;

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

impl Store {
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
