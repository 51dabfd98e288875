//! Storage of joined transfers (migration `0005_transfers`).
//!
//! Invariants:
//! - **Idempotent linking.** Every row is written with `ON CONFLICT DO
//!   NOTHING` and a transfer's id is derived from its basis and join key
//!   (`crate::transfers::transfer_id`), so linking the same envelope again —
//!   a replayed batch, a duplicate — changes nothing, and the two arrival
//!   orders write the same rows.
//! - **No lost join under concurrency.** On PostgreSQL, the linking
//!   transaction first takes a transaction-scoped advisory lock per
//!   would-be transfer (the same key for both ends), in sorted order: of two
//!   ends arriving at once, the second to lock sees the first's committed
//!   candidate row. On SQLite the single writer serializes linking.
//! - **Nothing outlives its evidence.** Candidates and ends reference
//!   `envelopes.digest ON DELETE CASCADE`: retention that drops an envelope
//!   drops its part in a transfer with it.
//! - A side is keyed by what distinguishes the two views — a stream's
//!   subject key (its socket in its netns), a storage transfer's shipping
//!   key (its node) — never by arrival.

use std::collections::BTreeSet;
use std::time::Duration;

use sqlx::Row;

use super::{Pools, Store, StoreError};
use crate::ingest::VerifiedItem;
use crate::transfers::{Basis, JoinCandidate, mirrored_join_key, transfer_id};

/// A stored transfer with its ends, as read back.
#[derive(Debug, Clone)]
pub struct TransferRow {
    /// `trf_…`.
    pub id: String,
    /// Why it was joined.
    pub basis: Basis,
    /// The joined subject keys (mirrored) or the transfer id.
    pub join_key: String,
    /// First linked, ns.
    pub linked_ns: i64,
    /// Its ends read, ordered by side key then capture time: per side the
    /// newest [`MAX_ENDS_PER_SIDE`].
    pub ends: Vec<EndRow>,
    /// Every side key with its number of ends (read or not).
    pub totals: Vec<(String, u64)>,
}

/// Most ends of one side read for a view (the newest); a side with more
/// says so (`SideView::ends_total`).
pub const MAX_ENDS_PER_SIDE: u64 = 100;

/// One joined envelope.
#[derive(Debug, Clone)]
pub struct EndRow {
    /// Envelope digest.
    pub digest: String,
    /// The side it stands for.
    pub side_key: String,
    /// Capture start, ns.
    pub wall_ns: i64,
    /// The name of the key that shipped it (its node), when the key exists.
    pub node: Option<String>,
    /// The shipping key id.
    pub key_id: String,
    /// Exact stored bytes.
    pub body: Vec<u8>,
}

/// A transfer one envelope completes: (id, join key, the matched ends as
/// (digest, side key)).
type Completed = (String, String, Vec<(String, String)>);

/// Advisory lock id of a join-lock key (first 8 bytes of its SHA-256).
fn lock_id(key: &str) -> i64 {
    use sha2::Digest;
    let d = sha2::Sha256::digest(key.as_bytes());
    let mut b = [0u8; 8];
    b.copy_from_slice(&d[..8]);
    i64::from_be_bytes(b)
}

impl Store {
    /// Offer each item to the join and link every transfer it completes. A
    /// storage transfer's side is the key that first shipped it (a
    /// duplicate shipped by another key keeps it).
    pub(crate) async fn link_transfers(
        &self,
        items: &[&VerifiedItem],
        now_ns: i64,
    ) -> Result<(), StoreError> {
        let mut seen = BTreeSet::new();
        let mut joinable: Vec<(&VerifiedItem, &JoinCandidate)> = items
            .iter()
            .filter_map(|i| i.join.as_ref().map(|j| (*i, j)))
            .filter(|(i, _)| seen.insert(i.digest.as_str()))
            .collect();
        if joinable.is_empty() {
            return Ok(());
        }
        joinable.sort_by(|a, b| a.0.digest.cmp(&b.0.digest));
        let mut attempt = 0;
        loop {
            match self.link_once(&joinable, now_ns).await {
                Err(e) if e.is_transient() && attempt < 5 => {
                    attempt += 1;
                    tracing::debug!(
                        attempt,
                        "transient conflict while linking transfers; retrying"
                    );
                    tokio::time::sleep(Duration::from_millis(5 << attempt)).await;
                }
                other => return other,
            }
        }
    }

    async fn link_once(
        &self,
        joinable: &[(&VerifiedItem, &JoinCandidate)],
        now_ns: i64,
    ) -> Result<(), StoreError> {
        let window = self.join_window_ns;
        let locks: BTreeSet<i64> = joinable
            .iter()
            .map(|(_, j)| lock_id(&j.lock_key()))
            .collect();
        with_pool!(self, write, |pool, pg| {
            let mut tx = begin_write!(pool, pg);
            if pg {
                for l in &locks {
                    sqlx::query("SELECT pg_advisory_xact_lock($1)")
                        .bind(*l)
                        .execute(&mut *tx)
                        .await?;
                }
            }
            for (item, j) in joinable {
                // The side: a stream's own socket (subject), a storage
                // transfer's node (the key that first shipped it).
                let side_expr = match j.basis {
                    Basis::Mirrored4tuple => "$4",
                    Basis::TransferId => "e.key_id",
                };
                let insert = format!(
                    "INSERT INTO transfer_candidates (digest, basis, near, side_key, start_ns, end_ns)
                     SELECT e.digest, $2, $3, {side_expr}, $5, $6 FROM envelopes e WHERE e.digest = $1
                     ON CONFLICT (digest) DO NOTHING"
                );
                sqlx::query(&insert)
                    .bind(item.digest.as_str())
                    .bind(j.basis.as_str())
                    .bind(j.near.as_str())
                    .bind(item.subject.key.as_str())
                    .bind(j.start_ns)
                    .bind(j.end_ns)
                    .execute(&mut *tx)
                    .await?;
                let own: Option<String> = sqlx::query_scalar(
                    "SELECT side_key FROM transfer_candidates WHERE digest = $1",
                )
                .bind(item.digest.as_str())
                .fetch_optional(&mut *tx)
                .await?;
                let Some(own_side) = own else {
                    // Deleted by retention since it was stored: nothing to join.
                    continue;
                };
                let matches: Vec<(String, String)> = match j.basis {
                    Basis::Mirrored4tuple => {
                        sqlx::query_as(
                            "SELECT c.digest, c.side_key FROM transfer_candidates c
                         WHERE c.basis = $1 AND c.near = $2 AND c.side_key <> $3
                           AND c.start_ns <= $4 AND c.end_ns >= $5
                         ORDER BY c.digest",
                        )
                        .bind(j.basis.as_str())
                        .bind(j.far.as_str())
                        .bind(own_side.as_str())
                        .bind(j.end_ns.saturating_add(window))
                        .bind(j.start_ns.saturating_sub(window))
                        .fetch_all(&mut *tx)
                        .await?
                    }
                    Basis::TransferId => {
                        sqlx::query_as(
                            "SELECT c.digest, c.side_key FROM transfer_candidates c
                         WHERE c.basis = $1 AND c.near = $2 AND c.side_key <> $3
                         ORDER BY c.digest",
                        )
                        .bind(j.basis.as_str())
                        .bind(j.far.as_str())
                        .bind(own_side.as_str())
                        .fetch_all(&mut *tx)
                        .await?
                    }
                };
                // Group the matches by the transfer they complete.
                let mut by_transfer: Vec<Completed> = Vec::new();
                for (digest, side) in matches {
                    let join_key = match j.basis {
                        Basis::Mirrored4tuple => mirrored_join_key(&own_side, &side),
                        Basis::TransferId => j.near.clone(),
                    };
                    let id = transfer_id(j.basis, &join_key);
                    match by_transfer.iter_mut().find(|(i, _, _)| *i == id) {
                        Some((_, _, ends)) => ends.push((digest, side)),
                        None => by_transfer.push((id, join_key, vec![(digest, side)])),
                    }
                }
                for (id, join_key, mut ends) in by_transfer {
                    sqlx::query(
                        "INSERT INTO transfers (id, basis, join_key, linked_ns) VALUES ($1, $2, $3, $4)
                         ON CONFLICT (id) DO NOTHING",
                    )
                    .bind(id.as_str())
                    .bind(j.basis.as_str())
                    .bind(join_key.as_str())
                    .bind(now_ns)
                    .execute(&mut *tx)
                    .await?;
                    ends.push((item.digest.clone(), own_side.clone()));
                    for (digest, side) in &ends {
                        sqlx::query(
                            "INSERT INTO transfer_ends (transfer_id, digest, side_key, linked_ns)
                             VALUES ($1, $2, $3, $4) ON CONFLICT (transfer_id, digest) DO NOTHING",
                        )
                        .bind(id.as_str())
                        .bind(digest.as_str())
                        .bind(side.as_str())
                        .bind(now_ns)
                        .execute(&mut *tx)
                        .await?;
                    }
                    tracing::debug!(transfer = %id, basis = j.basis.as_str(), "transfer linked");
                }
            }
            tx.commit().await?;
            Ok::<(), StoreError>(())
        })
    }

    /// Offer every stored stream and storage-transfer envelope that has no
    /// join candidate yet to the join (after the migration that created it:
    /// envelopes stored before it). Pages of 200 by row id; each stored body
    /// is verified again before it is indexed. Returns how many were offered.
    pub async fn backfill_transfers(&self) -> Result<u64, StoreError> {
        let limits = crate::ingest::IngestLimits {
            max_envelope_bytes: usize::MAX,
            ..crate::ingest::IngestLimits::default()
        };
        let mut after = 0i64;
        let mut offered = 0u64;
        loop {
            let page: Vec<(i64, String, Vec<u8>, i64)> = with_pool!(self, read, |pool, pg| {
                sqlx::query_as(
                    "SELECT e.id, e.digest, e.body, e.body_codec FROM envelopes e
                     WHERE e.id > $1 AND e.kind IN ('network_stream', 'storage_transfer')
                       AND NOT EXISTS (SELECT 1 FROM transfer_candidates c WHERE c.digest = e.digest)
                     ORDER BY e.id LIMIT 200",
                )
                .bind(after)
                .fetch_all(pool)
                .await?
            });
            let Some(last) = page.last() else {
                return Ok(offered);
            };
            after = last.0;
            let items: Vec<VerifiedItem> = page
                .into_iter()
                .filter_map(|(_, digest, body, codec)| {
                    let body = match super::body::decode(&digest, codec, body) {
                        Ok(body) => body,
                        Err(e) => {
                            tracing::warn!(%digest, error = %e, "stored envelope does not decode; not offered to the transfer join");
                            return None;
                        }
                    };
                    match crate::ingest::verify_item(body.into(), &limits) {
                        crate::ingest::ItemVerdict::Verified(v) => Some(*v),
                        crate::ingest::ItemVerdict::Rejected(r) => {
                            tracing::warn!(%digest, reasons = r.reasons.len(), "stored envelope no longer verifies; not offered to the transfer join");
                            None
                        }
                    }
                })
                .collect();
            let refs: Vec<&VerifiedItem> = items.iter().collect();
            offered += refs.len() as u64;
            self.link_transfers(&refs, crate::now_ns()).await?;
        }
    }

    /// A transfer and its ends, or `None`.
    pub async fn transfer(&self, id: &str) -> Result<Option<TransferRow>, StoreError> {
        with_pool!(self, read, |pool, pg| {
            let head: Option<(String, String, i64)> =
                sqlx::query_as("SELECT basis, join_key, linked_ns FROM transfers WHERE id = $1")
                    .bind(id)
                    .fetch_optional(pool)
                    .await?;
            let Some((basis, join_key, linked_ns)) = head else {
                return Ok(None);
            };
            let Some(basis) = Basis::parse(&basis) else {
                return Err(StoreError::Corrupt {
                    digest: id.to_string(),
                    reason: format!("transfer basis {basis:?} is not one this store writes"),
                });
            };
            let rows = sqlx::query(
                "SELECT t.digest, t.side_key, e.wall_ns, k.name, e.key_id
                 FROM transfer_ends t JOIN envelopes e ON e.digest = t.digest
                 LEFT JOIN api_keys k ON k.id = e.key_id
                 WHERE t.transfer_id = $1
                 ORDER BY t.side_key, e.wall_ns DESC, t.digest",
            )
            .bind(id)
            .fetch_all(pool)
            .await?;
            // Per side, the newest MAX_ENDS_PER_SIDE are read (bodies); the
            // count of every end is kept so the view can say it was cut.
            let mut ends = Vec::new();
            let mut totals: Vec<(String, u64)> = Vec::new();
            for r in &rows {
                let side_key: String = r.try_get(1)?;
                match totals.last_mut() {
                    Some((k, n)) if *k == side_key => *n += 1,
                    _ => totals.push((side_key.clone(), 1)),
                }
                if totals.last().map(|t| t.1).unwrap_or(0) > MAX_ENDS_PER_SIDE {
                    continue;
                }
                let digest: String = r.try_get(0)?;
                let body: Option<(Vec<u8>, i64)> =
                    sqlx::query_as("SELECT body, body_codec FROM envelopes WHERE digest = $1")
                        .bind(digest.as_str())
                        .fetch_optional(pool)
                        .await?;
                let Some((body, codec)) = body else { continue };
                let body = super::body::decode(&digest, codec, body)?;
                ends.push(EndRow {
                    digest,
                    side_key,
                    wall_ns: r.try_get(2)?,
                    node: r.try_get(3)?,
                    key_id: r.try_get(4)?,
                    body,
                });
            }
            // Oldest capture first within each side.
            ends.sort_by(|a, b| {
                (a.side_key.as_str(), a.wall_ns, a.digest.as_str()).cmp(&(
                    b.side_key.as_str(),
                    b.wall_ns,
                    b.digest.as_str(),
                ))
            });
            Ok(Some(TransferRow {
                id: id.to_string(),
                basis,
                join_key,
                linked_ns,
                ends,
                totals,
            }))
        })
    }

    /// The transfers an envelope is an end of, first linked first.
    pub async fn transfers_of(&self, digest: &str) -> Result<Vec<String>, StoreError> {
        with_pool!(self, read, |pool, pg| {
            Ok(sqlx::query_scalar(
                "SELECT transfer_id FROM transfer_ends WHERE digest = $1 ORDER BY linked_ns, transfer_id",
            )
            .bind(digest)
            .fetch_all(pool)
            .await?)
        })
    }

    /// Whether an envelope is stored (for telling 404s apart).
    pub async fn has_envelope(&self, digest: &str) -> Result<bool, StoreError> {
        with_pool!(self, read, |pool, pg| {
            let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM envelopes WHERE digest = $1")
                .bind(digest)
                .fetch_one(pool)
                .await?;
            Ok(n > 0)
        })
    }
}
