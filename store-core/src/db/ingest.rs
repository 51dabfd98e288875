//! Ingest's writes: the verified items of one request stored in one
//! transaction.
//!
//! Invariants (the module's part of the store's, `super`):
//! - **Batch atomicity.** Envelopes, their unknowns and their subjects'
//!   newest pointers are written in one transaction; a failure stores none of
//!   them and a shipper's retry is harmless (`ON CONFLICT (digest) DO
//!   NOTHING`).
//! - **Deadlock-free under concurrency.** Envelope rows go in digest order and
//!   subject pointers in subject-key order, whichever way the rows are sent,
//!   so overlapping PostgreSQL batches wait on each other rather than
//!   deadlock.
//! - **One statement shape per backend.** SQLite gets multi-row `VALUES`
//!   with `?` placeholders (a statement is a hop to SQLite's worker thread,
//!   and `?` avoids a per-parameter name scan). PostgreSQL gets each table's
//!   rows as one array per column, expanded by `unnest` in a single statement:
//!   one parse and one round trip per table per batch, whatever its size, and
//!   no 65,535-parameter ceiling.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use sqlx::{PgConnection, SqliteConnection};

use super::{Bind, Pools, Store, StoreError, StoredRecord, StoredStatus, placeholders};
use crate::ingest::VerifiedItem;

impl Store {
    /// Store verified envelopes atomically; one record per item, in order.
    pub async fn ingest(
        &self,
        items: &[&VerifiedItem],
        key_id: &str,
        now_ns: i64,
    ) -> Result<Vec<StoredRecord>, StoreError> {
        let records = self.ingest_with_retries(items, key_id, now_ns).await?;
        // Transfers are linked after the envelopes are committed, for every
        // item verified (a duplicate too): a link lost to a failure here is
        // made when the shipper retries the batch. Linking is idempotent.
        self.link_transfers(items, now_ns).await?;
        Ok(records)
    }

    async fn ingest_with_retries(
        &self,
        items: &[&VerifiedItem],
        key_id: &str,
        now_ns: i64,
    ) -> Result<Vec<StoredRecord>, StoreError> {
        let mut attempt = 0;
        loop {
            match self.ingest_once(items, key_id, now_ns).await {
                Err(e) if e.is_transient() && attempt < 5 => {
                    attempt += 1;
                    tracing::debug!(attempt, "transient conflict during ingest; retrying");
                    tokio::time::sleep(Duration::from_millis(5 << attempt)).await;
                }
                other => return other,
            }
        }
    }

    async fn ingest_once(
        &self,
        items: &[&VerifiedItem],
        key_id: &str,
        now_ns: i64,
    ) -> Result<Vec<StoredRecord>, StoreError> {
        let mut unique: Vec<&VerifiedItem> = items.to_vec();
        unique.sort_by(|a, b| a.digest.cmp(&b.digest));
        unique.dedup_by(|a, b| a.digest == b.digest);
        let (inserted, existing) = match &*self.pools {
            Pools::Sqlite { writer, .. } => {
                let mut tx = writer.begin_with("BEGIN IMMEDIATE").await?;
                let out = write_batch(&mut *tx, &unique, key_id, now_ns).await?;
                tx.commit().await?;
                out
            }
            Pools::Postgres(pool) => {
                let mut tx = pool.begin().await?;
                let out = write_batch(&mut *tx, &unique, key_id, now_ns).await?;
                tx.commit().await?;
                out
            }
        };
        // Per item, in request order. The first occurrence of a digest new to
        // the store is `accepted`; every other occurrence is `duplicate`.
        let mut first_seen: BTreeSet<&str> = BTreeSet::new();
        Ok(items
            .iter()
            .map(|item| {
                let new =
                    inserted.contains(&item.digest) && first_seen.insert(item.digest.as_str());
                if new {
                    return StoredRecord {
                        status: StoredStatus::Accepted,
                        received_ns: now_ns,
                        key_id: key_id.to_string(),
                    };
                }
                let (received_ns, first_key) = existing
                    .get(&item.digest)
                    .cloned()
                    .unwrap_or_else(|| (now_ns, key_id.to_string()));
                StoredRecord {
                    status: StoredStatus::Duplicate,
                    received_ns,
                    key_id: first_key,
                }
            })
            .collect())
    }
}

/// Digests this batch inserted, and the first record of each one already
/// stored (`received_ns`, `key_id`).
type BatchOutcome = (BTreeSet<String>, BTreeMap<String, (i64, String)>);

/// The batch's writes inside an open transaction. `unique` is sorted by
/// digest with no digest twice.
async fn write_batch<C: BatchRows>(
    conn: &mut C,
    unique: &[&VerifiedItem],
    key_id: &str,
    now_ns: i64,
) -> Result<BatchOutcome, StoreError> {
    let inserted: BTreeSet<String> = conn
        .insert_envelopes(unique, key_id, now_ns)
        .await?
        .into_iter()
        .collect();
    let accepted: Vec<&VerifiedItem> = unique
        .iter()
        .copied()
        .filter(|item| inserted.contains(&item.digest))
        .collect();
    let unknown_rows: Vec<(&VerifiedItem, usize)> = accepted
        .iter()
        .flat_map(|item| (0..item.unknowns.len()).map(move |k| (*item, k)))
        .collect();
    if !unknown_rows.is_empty() {
        conn.insert_unknowns(&unknown_rows).await?;
    }
    // Newest accepted capture per subject, in subject-key order.
    let mut newest: BTreeMap<&str, &VerifiedItem> = BTreeMap::new();
    for item in &accepted {
        let slot = newest.entry(item.subject.key.as_str()).or_insert(item);
        if (item.wall_ns, item.digest.as_str()) > (slot.wall_ns, slot.digest.as_str()) {
            *slot = item;
        }
    }
    let newest: Vec<&VerifiedItem> = newest.into_values().collect();
    if !newest.is_empty() {
        conn.upsert_subjects(&newest).await?;
    }
    let dups: Vec<&str> = unique
        .iter()
        .map(|item| item.digest.as_str())
        .filter(|d| !inserted.contains(*d))
        .collect();
    let existing = if dups.is_empty() {
        BTreeMap::new()
    } else {
        conn.first_records(&dups).await?
    };
    Ok((inserted, existing))
}

/// The newest pointer moves only forward: a later capture, or the same
/// instant with a greater digest (so two orders of arrival agree).
const SUBJECT_CONFLICT: &str = " ON CONFLICT (subject_key) DO UPDATE
    SET latest_digest = excluded.latest_digest,
        latest_wall_ns = excluded.latest_wall_ns
  WHERE excluded.latest_wall_ns > subjects.latest_wall_ns
     OR (excluded.latest_wall_ns = subjects.latest_wall_ns
         AND excluded.latest_digest > subjects.latest_digest)";

/// One batch's rows, written the way each backend takes them fastest.
trait BatchRows {
    /// Insert the envelopes (digest order); the digests actually inserted.
    async fn insert_envelopes(
        &mut self,
        rows: &[&VerifiedItem],
        key_id: &str,
        now_ns: i64,
    ) -> Result<Vec<String>, StoreError>;
    /// Insert unknowns: (envelope, index into its `unknowns`).
    async fn insert_unknowns(&mut self, rows: &[(&VerifiedItem, usize)]) -> Result<(), StoreError>;
    /// Move each subject's newest pointer (subject-key order).
    async fn upsert_subjects(&mut self, newest: &[&VerifiedItem]) -> Result<(), StoreError>;
    /// The first stored record of digests that were already there.
    async fn first_records(
        &mut self,
        digests: &[&str],
    ) -> Result<BTreeMap<String, (i64, String)>, StoreError>;
}

/// SQLite: envelope rows per statement ([`ENVELOPE_COLUMNS`] parameters each).
const SQLITE_ENVELOPE_ROWS: usize = 100;
/// Columns of an `envelopes` row as ingest writes it.
const ENVELOPE_COLUMNS: usize = 14;
/// SQLite: rows per statement for the narrow tables.
const SQLITE_SMALL_ROWS: usize = 400;

fn size_of(item: &VerifiedItem) -> i64 {
    i64::try_from(item.bytes.len()).unwrap_or(i64::MAX)
}

/// One column of a batch, as the array PostgreSQL's `unnest` takes.
pub(super) fn column<'r, T, U>(rows: &'r [T], cell: impl Fn(&'r T) -> U) -> Vec<U> {
    rows.iter().map(cell).collect()
}

fn ord_of(k: usize) -> i64 {
    i64::try_from(k).unwrap_or(i64::MAX)
}

/// `n` rows of `width` `?` placeholders, comma-separated.
fn sqlite_rows(n: usize, width: usize) -> String {
    let row = format!("({})", placeholders(false, 1, width));
    vec![row; n].join(",")
}

impl BatchRows for SqliteConnection {
    async fn insert_envelopes(
        &mut self,
        rows: &[&VerifiedItem],
        key_id: &str,
        now_ns: i64,
    ) -> Result<Vec<String>, StoreError> {
        let mut inserted = Vec::with_capacity(rows.len());
        for chunk in rows.chunks(SQLITE_ENVELOPE_ROWS) {
            let sql = format!(
                "INSERT INTO envelopes (digest, subject_key, kind, locator, pid, identity, wall_ns,
                    received_ns, completeness, key_id, size, body, body_codec, claim_codes)
                 VALUES {}
                 ON CONFLICT (digest) DO NOTHING RETURNING digest",
                sqlite_rows(chunk.len(), ENVELOPE_COLUMNS)
            );
            let mut binds: Vec<Bind<'_>> = Vec::with_capacity(chunk.len() * ENVELOPE_COLUMNS);
            for item in chunk {
                binds.extend([
                    Bind::Text(&item.digest),
                    Bind::Text(&item.subject.key),
                    Bind::Text(item.subject.kind),
                    Bind::Text(&item.subject.locator),
                    Bind::OptI64(item.subject.pid),
                    Bind::Text(&item.subject.identity_json),
                    Bind::I64(item.wall_ns),
                    Bind::I64(now_ns),
                    Bind::Text(item.completeness),
                    Bind::Text(key_id),
                    Bind::I64(size_of(item)),
                    Bind::Bytes(item.stored_body().0),
                    Bind::I64(item.stored_body().1),
                    Bind::Text(&item.claim_codes),
                ]);
            }
            let digests: Vec<String> = bind_all!(sqlx::query_scalar(&sql), &binds)
                .fetch_all(&mut *self)
                .await?;
            inserted.extend(digests);
        }
        Ok(inserted)
    }

    async fn insert_unknowns(&mut self, rows: &[(&VerifiedItem, usize)]) -> Result<(), StoreError> {
        for chunk in rows.chunks(SQLITE_SMALL_ROWS) {
            let sql = format!(
                "INSERT INTO unknowns (digest, ord, question, blocks, owner, probe, surface) VALUES {}",
                sqlite_rows(chunk.len(), 7)
            );
            let mut binds: Vec<Bind<'_>> = Vec::with_capacity(chunk.len() * 7);
            for (item, k) in chunk {
                let u = &item.unknowns[*k];
                binds.extend([
                    Bind::Text(&item.digest),
                    Bind::I64(ord_of(*k)),
                    Bind::Text(&u.question),
                    Bind::Text(&u.blocks),
                    Bind::Text(&u.owner),
                    Bind::Text(&u.probe),
                    Bind::OptText(u.surface.as_deref()),
                ]);
            }
            bind_all!(sqlx::query(&sql), &binds)
                .execute(&mut *self)
                .await?;
        }
        Ok(())
    }

    async fn upsert_subjects(&mut self, newest: &[&VerifiedItem]) -> Result<(), StoreError> {
        for chunk in newest.chunks(SQLITE_SMALL_ROWS) {
            let sql = format!(
                "INSERT INTO subjects (subject_key, kind, identity, latest_digest, latest_wall_ns)
                 VALUES {}{SUBJECT_CONFLICT}",
                sqlite_rows(chunk.len(), 5)
            );
            let mut binds: Vec<Bind<'_>> = Vec::with_capacity(chunk.len() * 5);
            for item in chunk {
                binds.extend([
                    Bind::Text(&item.subject.key),
                    Bind::Text(item.subject.kind),
                    Bind::Text(&item.subject.identity_json),
                    Bind::Text(&item.digest),
                    Bind::I64(item.wall_ns),
                ]);
            }
            bind_all!(sqlx::query(&sql), &binds)
                .execute(&mut *self)
                .await?;
        }
        Ok(())
    }

    async fn first_records(
        &mut self,
        digests: &[&str],
    ) -> Result<BTreeMap<String, (i64, String)>, StoreError> {
        let mut out = BTreeMap::new();
        for chunk in digests.chunks(SQLITE_SMALL_ROWS) {
            let sql = format!(
                "SELECT digest, received_ns, key_id FROM envelopes WHERE digest IN ({})",
                placeholders(false, 1, chunk.len())
            );
            let binds: Vec<Bind<'_>> = chunk.iter().map(|d| Bind::Text(d)).collect();
            let rows: Vec<(String, i64, String)> = bind_all!(sqlx::query_as(&sql), &binds)
                .fetch_all(&mut *self)
                .await?;
            out.extend(rows.into_iter().map(|(d, r, k)| (d, (r, k))));
        }
        Ok(out)
    }
}

impl BatchRows for PgConnection {
    async fn insert_envelopes(
        &mut self,
        rows: &[&VerifiedItem],
        key_id: &str,
        now_ns: i64,
    ) -> Result<Vec<String>, StoreError> {
        // `WITH ORDINALITY` + `ORDER BY` keeps the digest order the caller
        // sorted into (the deadlock-free invariant), not just the order
        // unnest happens to return.
        let digests: Vec<String> = sqlx::query_scalar(
            "INSERT INTO envelopes (digest, subject_key, kind, locator, pid, identity, wall_ns,
                received_ns, completeness, key_id, size, body, body_codec, claim_codes)
             SELECT d, s, k, l, p, i, w, $8, c, $10, z, b, bc, cc
               FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::int8[],
                           $6::text[], $7::int8[], $9::text[], $11::int8[], $12::bytea[],
                           $13::int8[], $14::text[])
                    WITH ORDINALITY AS r(d, s, k, l, p, i, w, c, z, b, bc, cc, n)
              ORDER BY n
             ON CONFLICT (digest) DO NOTHING RETURNING digest",
        )
        .bind(column(rows, |r| r.digest.as_str()))
        .bind(column(rows, |r| r.subject.key.as_str()))
        .bind(column(rows, |r| r.subject.kind))
        .bind(column(rows, |r| r.subject.locator.as_str()))
        .bind(column(rows, |r| r.subject.pid))
        .bind(column(rows, |r| r.subject.identity_json.as_str()))
        .bind(column(rows, |r| r.wall_ns))
        .bind(now_ns)
        .bind(column(rows, |r| r.completeness))
        .bind(key_id)
        .bind(column(rows, |r| size_of(r)))
        .bind(column(rows, |r| r.stored_body().0))
        .bind(column(rows, |r| r.stored_body().1))
        .bind(column(rows, |r| r.claim_codes.as_str()))
        .fetch_all(&mut *self)
        .await?;
        Ok(digests)
    }

    async fn insert_unknowns(&mut self, rows: &[(&VerifiedItem, usize)]) -> Result<(), StoreError> {
        fn unknown<'a>((item, k): &(&'a VerifiedItem, usize)) -> &'a pstack_envelope::Unknown {
            &item.unknowns[*k]
        }
        sqlx::query(
            "INSERT INTO unknowns (digest, ord, question, blocks, owner, probe, surface)
             SELECT * FROM unnest($1::text[], $2::int8[], $3::text[], $4::text[], $5::text[],
                                  $6::text[], $7::text[])",
        )
        .bind(column(rows, |(item, _)| item.digest.as_str()))
        .bind(column(rows, |(_, k)| ord_of(*k)))
        .bind(column(rows, |r| unknown(r).question.as_str()))
        .bind(column(rows, |r| unknown(r).blocks.as_str()))
        .bind(column(rows, |r| unknown(r).owner.as_str()))
        .bind(column(rows, |r| unknown(r).probe.as_str()))
        .bind(column(rows, |r| unknown(r).surface.as_deref()))
        .execute(&mut *self)
        .await?;
        Ok(())
    }

    async fn upsert_subjects(&mut self, newest: &[&VerifiedItem]) -> Result<(), StoreError> {
        let sql = format!(
            "INSERT INTO subjects (subject_key, kind, identity, latest_digest, latest_wall_ns)
             SELECT s, k, i, d, w
               FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::int8[])
                    WITH ORDINALITY AS r(s, k, i, d, w, n)
              ORDER BY n{SUBJECT_CONFLICT}"
        );
        sqlx::query(&sql)
            .bind(column(newest, |r| r.subject.key.as_str()))
            .bind(column(newest, |r| r.subject.kind))
            .bind(column(newest, |r| r.subject.identity_json.as_str()))
            .bind(column(newest, |r| r.digest.as_str()))
            .bind(column(newest, |r| r.wall_ns))
            .execute(&mut *self)
            .await?;
        Ok(())
    }

    async fn first_records(
        &mut self,
        digests: &[&str],
    ) -> Result<BTreeMap<String, (i64, String)>, StoreError> {
        let rows: Vec<(String, i64, String)> = sqlx::query_as(
            "SELECT digest, received_ns, key_id FROM envelopes WHERE digest = ANY($1::text[])",
        )
        .bind(digests)
        .fetch_all(&mut *self)
        .await?;
        Ok(rows.into_iter().map(|(d, r, k)| (d, (r, k))).collect())
    }
}
