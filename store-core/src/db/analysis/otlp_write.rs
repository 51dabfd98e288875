//! OTLP aggregates, the write: one body's request, call and cohort rows,
//! and the one-time conversion of legacy `request_stats` rows.
//!
//! Invariants:
//! - One OTLP body's aggregates are upserted in one transaction (counters
//!   add; a failed body adds nothing). Rows are written in key order so
//!   concurrent PostgreSQL upserts wait rather than deadlock; transient
//!   conflicts are retried.
//! - Cohort rows (`cohort_stats`, [`crate::analysis::cohort`]) merge by
//!   read-modify-write inside that transaction: existing rows are read
//!   `FOR UPDATE` (PostgreSQL; SQLite has one writer), merged (addition,
//!   [`crate::analysis::sketch`]) and rewritten; new rows are inserted
//!   `ON CONFLICT DO NOTHING`, and a row another writer inserted first is
//!   merged in a second pass. Nothing is lost or counted twice.
//! - Config digests and flag variants are capped per (environment,
//!   service, minute) across bodies: the dimension's overflow row is
//!   locked first, so concurrent writers see each other's new values, and
//!   values past the cap are counted in it.
//! - `request_stats` rows (before cohort rows existed) are converted into
//!   cohort rows with `legacy = 1` on open, each batch in one transaction
//!   with the deletion of what it converted.

use std::collections::{BTreeMap, BTreeSet};

use crate::analysis::cohort::{CohortKey, Dimension};
use crate::analysis::otlp::{Batch, CallAgg, CallKey, FailedRequest};
use crate::analysis::sketch::{MinuteCells, SketchError};
use crate::db::{Bind, Pools, Store, StoreError, values_rows};

/// (environment, service, minute bucket, version) of a `span_writers` row;
/// its value is (requests, errors, calls).
type WriterKey<'a> = (&'a str, &'a str, i64, &'a str);

/// Rows per multi-row statement.
const COHORT_ROWS: usize = 200;
const COHORT_KEY_COLS: &str = "environment, service, dimension, name, bucket_ns, value";
const COHORT_COLS: &str = "environment, service, dimension, name, bucket_ns, value, requests, errors, seconds, sketch, legacy";
/// Legacy rows were 4 latency bins per octave, recorded at their bin's
/// geometric middle: a true value is within 2^(1/8) of it.
const LEGACY_BINS_PER_OCTAVE: f64 = 4.0;

/// One cohort row to merge into the store.
#[derive(Debug, Clone, Default)]
struct PendingRow {
    cells: MinuteCells,
    legacy: bool,
}

/// A stored row's key and merge state: (environment, service, dimension,
/// name, bucket_ns, value, seconds, legacy).
type StoredCohortRow = (String, String, String, String, i64, String, Vec<u8>, i64);
/// A cohort key as read back: (environment, service, dimension, name, bucket_ns, value).
type CohortKeyRow = (String, String, String, String, i64, String);

pub(super) fn decode_err(e: SketchError) -> StoreError {
    StoreError::Db(sqlx::Error::Decode(Box::new(e)))
}

fn key_of_row(r: CohortKeyRow) -> Result<CohortKey, StoreError> {
    let (environment, service, dimension, name, bucket_ns, value) = r;
    let dimension = Dimension::parse(&dimension).ok_or_else(|| {
        StoreError::Db(sqlx::Error::Decode(
            format!("unknown cohort dimension {dimension:?}").into(),
        ))
    })?;
    Ok(CohortKey {
        environment,
        service,
        dimension,
        name,
        bucket_ns,
        value,
    })
}

/// What a merged row writes: (requests, errors, seconds, sketch, legacy).
/// `sketch` is the whole minute's buckets when that is at most half the
/// size of `seconds` (a whole-minute read then reads it instead), else empty.
fn encode_row(p: &PendingRow) -> (i64, i64, Vec<u8>, Vec<u8>, i64) {
    let seconds = p.cells.encode();
    let mut sketch = p.cells.sketch().encode();
    if sketch.len() * 2 > seconds.len() {
        sketch.clear();
    }
    let (r, e) = p.cells.totals();
    (
        i64::try_from(r).unwrap_or(i64::MAX),
        i64::try_from(e).unwrap_or(i64::MAX),
        seconds,
        sketch,
        i64::from(p.legacy),
    )
}

/// Merge `rows` into `cohort_stats` inside the open transaction `$tx`
/// (the module's invariants say how). `$rows`: `&mut BTreeMap<CohortKey, PendingRow>`.
macro_rules! upsert_cohorts {
    ($tx:expr, $pg:expr, $rows:expr) => {{
        let rows: &mut BTreeMap<CohortKey, PendingRow> = $rows;
        let pg: bool = $pg;
        // 1. Caps on distinct config digests / flag variants per service-minute.
        let groups: BTreeSet<CohortKey> = rows
            .keys()
            .filter(|k| k.dimension.cap().is_some())
            .map(CohortKey::overflow)
            .collect();
        let empty = MinuteCells::default().encode();
        for guard in groups {
            let cap = guard.dimension.cap().unwrap_or(usize::MAX);
            sqlx::query(&format!(
                "INSERT INTO cohort_stats ({COHORT_COLS}) VALUES ($1, $2, $3, $4, $5, $6, 0, 0, $7, $8, 0)
                 ON CONFLICT ({COHORT_KEY_COLS}) DO UPDATE SET requests = cohort_stats.requests"
            ))
            .bind(&guard.environment)
            .bind(&guard.service)
            .bind(guard.dimension.as_str())
            .bind(&guard.name)
            .bind(guard.bucket_ns)
            .bind(&guard.value)
            .bind(empty.as_slice())
            .bind(&[][..] as &[u8])
            .execute(&mut *$tx)
            .await?;
            let existing: BTreeSet<(String, String)> = sqlx::query_as::<_, (String, String)>(
                "SELECT name, value FROM cohort_stats
                 WHERE environment = $1 AND service = $2 AND dimension = $3 AND bucket_ns = $4
                   AND value <> '' AND dimension <> 'version'",
            )
            .bind(&guard.environment)
            .bind(&guard.service)
            .bind(guard.dimension.as_str())
            .bind(guard.bucket_ns)
            .fetch_all(&mut *$tx)
            .await?
            .into_iter()
            .collect();
            let mut distinct = existing.len();
            let group: Vec<CohortKey> = rows
                .keys()
                .filter(|k| !k.is_overflow() && k.overflow() == guard)
                .cloned()
                .collect();
            for key in group {
                if existing.contains(&(key.name.clone(), key.value.clone())) {
                    continue;
                }
                if distinct < cap {
                    distinct += 1;
                    continue;
                }
                if let Some(moved) = rows.remove(&key) {
                    rows.entry(guard.clone()).or_default().cells.merge(&moved.cells);
                }
            }
        }
        // 2. Merge into existing rows; insert new ones; merge any a
        // concurrent writer inserted first on the next pass.
        let mut todo: Vec<CohortKey> = rows.keys().cloned().collect();
        let mut pass = 0;
        while !todo.is_empty() {
            pass += 1;
            if pass > 3 {
                return Err(StoreError::Db(sqlx::Error::Protocol(
                    "cohort rows kept changing under a concurrent writer".into(),
                )));
            }
            let mut present: BTreeMap<CohortKey, (Vec<u8>, i64)> = BTreeMap::new();
            for chunk in todo.chunks(COHORT_ROWS) {
                let sql = format!(
                    "SELECT {COHORT_KEY_COLS}, seconds, legacy FROM cohort_stats
                     WHERE ({COHORT_KEY_COLS}) IN (VALUES {}){}",
                    values_rows(pg, chunk.len(), 6),
                    if pg { " FOR UPDATE" } else { "" }
                );
                let mut binds: Vec<Bind<'_>> = Vec::with_capacity(chunk.len() * 6);
                for k in chunk {
                    binds.extend([
                        Bind::Text(&k.environment),
                        Bind::Text(&k.service),
                        Bind::Text(k.dimension.as_str()),
                        Bind::Text(&k.name),
                        Bind::I64(k.bucket_ns),
                        Bind::Text(&k.value),
                    ]);
                }
                let found: Vec<StoredCohortRow> = bind_all!(sqlx::query_as(&sql), &binds)
                    .fetch_all(&mut *$tx)
                    .await?;
                for (e, s, d, n, b, v, seconds, legacy) in found {
                    present.insert(key_of_row((e, s, d, n, b, v))?, (seconds, legacy));
                }
            }
            let mut writes: Vec<(&CohortKey, (i64, i64, Vec<u8>, Vec<u8>, i64))> = Vec::new();
            let mut absent: Vec<(&CohortKey, (i64, i64, Vec<u8>, Vec<u8>, i64))> = Vec::new();
            for key in &todo {
                let Some(pending) = rows.get(key) else {
                    continue;
                };
                match present.get(key) {
                    Some((seconds, legacy)) => {
                        let mut merged = PendingRow {
                            cells: MinuteCells::decode(seconds).map_err(decode_err)?,
                            legacy: *legacy != 0 || pending.legacy,
                        };
                        merged.cells.merge(&pending.cells);
                        writes.push((key, encode_row(&merged)));
                    }
                    None => absent.push((key, encode_row(pending))),
                }
            }
            for (chunk, conflict) in writes
                .chunks(COHORT_ROWS)
                .map(|c| (c, " DO UPDATE SET requests = excluded.requests, errors = excluded.errors,
                    seconds = excluded.seconds, sketch = excluded.sketch, legacy = excluded.legacy"))
                .chain(absent.chunks(COHORT_ROWS).map(|c| (c, " DO NOTHING")))
            {
                let mut sql = format!(
                    "INSERT INTO cohort_stats ({COHORT_COLS}) VALUES {} ON CONFLICT ({COHORT_KEY_COLS}){conflict}",
                    values_rows(pg, chunk.len(), 11)
                );
                sql.push_str(&format!(" RETURNING {COHORT_KEY_COLS}"));
                let mut binds: Vec<Bind<'_>> = Vec::with_capacity(chunk.len() * 11);
                for (k, (req, err, seconds, sketch, legacy)) in chunk {
                    binds.extend([
                        Bind::Text(&k.environment),
                        Bind::Text(&k.service),
                        Bind::Text(k.dimension.as_str()),
                        Bind::Text(&k.name),
                        Bind::I64(k.bucket_ns),
                        Bind::Text(&k.value),
                        Bind::I64(*req),
                        Bind::I64(*err),
                        Bind::Bytes(seconds),
                        Bind::Bytes(sketch),
                        Bind::I64(*legacy),
                    ]);
                }
                let done: Vec<CohortKeyRow> = bind_all!(sqlx::query_as(&sql), &binds)
                    .fetch_all(&mut *$tx)
                    .await?;
                for r in done {
                    let k = key_of_row(r)?;
                    rows.remove(&k);
                }
            }
            // What is still pending was inserted by someone else meanwhile.
            todo = rows.keys().cloned().collect();
        }
    }};
}

impl Store {
    /// Add one body's aggregates, atomically, with `key_id` recorded as a
    /// writer of every (environment, service, version, minute) it touches.
    pub async fn ingest_traces(&self, batch: &Batch, key_id: &str) -> Result<(), StoreError> {
        let mut attempt = 0;
        loop {
            match self.ingest_traces_once(batch, key_id).await {
                Err(e) if e.is_transient() && attempt < 5 => {
                    attempt += 1;
                    tokio::time::sleep(std::time::Duration::from_millis(5 << attempt)).await;
                }
                other => return other,
            }
        }
    }

    async fn ingest_traces_once(&self, batch: &Batch, key_id: &str) -> Result<(), StoreError> {
        const ROWS: usize = 200;
        let mut cohorts: BTreeMap<CohortKey, PendingRow> = batch
            .cohorts
            .rows
            .iter()
            .map(|(k, cells)| {
                (
                    k.clone(),
                    PendingRow {
                        cells: cells.clone(),
                        legacy: false,
                    },
                )
            })
            .collect();
        // This body's provenance rows, in key order like the rest: requests
        // from the version cohorts (each request is in exactly one), calls
        // from the call counters.
        let mut writes: BTreeMap<WriterKey<'_>, (i64, i64, i64)> = BTreeMap::new();
        for (k, cells) in batch
            .cohorts
            .rows
            .iter()
            .filter(|(k, _)| k.dimension == Dimension::Version)
        {
            let (requests, errors) = cells.totals();
            let w = writes
                .entry((&k.environment, &k.service, k.bucket_ns, &k.value))
                .or_default();
            w.0 += i64::try_from(requests).unwrap_or(i64::MAX);
            w.1 += i64::try_from(errors).unwrap_or(i64::MAX);
        }
        for (k, v) in &batch.calls {
            let w = writes
                .entry((&k.environment, &k.service, k.bucket_ns, &k.version))
                .or_default();
            w.2 += v.calls;
        }
        let writes: Vec<_> = writes.into_iter().collect();
        let calls: BTreeMap<&CallKey, &CallAgg> = batch.calls.iter().collect();
        let calls: Vec<_> = calls.into_iter().collect();
        let mut failed: Vec<&FailedRequest> = batch.failed.iter().collect();
        failed.sort_by(|a, b| a.span_id.cmp(&b.span_id));
        failed.dedup_by(|a, b| a.span_id == b.span_id);
        with_pool!(self, write, |pool, pg| {
            let mut tx = begin_write!(pool, pg);
            upsert_cohorts!(tx, pg, &mut cohorts);
            for chunk in writes.chunks(ROWS) {
                let mut sql = format!(
                    "INSERT INTO span_writers (environment, service, bucket_ns, version, key_id, requests, errors, calls) VALUES {}",
                    values_rows(pg, chunk.len(), 8)
                );
                let mut binds: Vec<Bind<'_>> = Vec::with_capacity(chunk.len() * 8);
                for ((env, service, bucket, version), (requests, errors, calls)) in chunk.iter() {
                    binds.extend([
                        Bind::Text(env),
                        Bind::Text(service),
                        Bind::I64(*bucket),
                        Bind::Text(version),
                        Bind::Text(key_id),
                        Bind::I64(*requests),
                        Bind::I64(*errors),
                        Bind::I64(*calls),
                    ]);
                }
                sql.push_str(
                    " ON CONFLICT (environment, service, bucket_ns, version, key_id) DO UPDATE
                      SET requests = span_writers.requests + excluded.requests,
                          errors = span_writers.errors + excluded.errors,
                          calls = span_writers.calls + excluded.calls",
                );
                bind_all!(sqlx::query(&sql), &binds)
                    .execute(&mut *tx)
                    .await?;
            }
            for chunk in calls.chunks(ROWS) {
                let mut sql = format!(
                    "INSERT INTO call_stats (environment, service, version, bucket_ns, resource, calls, errors, duration_us, exemplar) VALUES {}",
                    values_rows(pg, chunk.len(), 9)
                );
                let mut binds: Vec<Bind<'_>> = Vec::with_capacity(chunk.len() * 9);
                for (k, v) in chunk.iter() {
                    binds.extend([
                        Bind::Text(&k.environment),
                        Bind::Text(&k.service),
                        Bind::Text(&k.version),
                        Bind::I64(k.bucket_ns),
                        Bind::Text(&k.resource),
                        Bind::I64(v.calls),
                        Bind::I64(v.errors),
                        Bind::I64(v.duration_us),
                        Bind::Text(&v.exemplar),
                    ]);
                }
                sql.push_str(
                    " ON CONFLICT (environment, service, bucket_ns, version, resource) DO UPDATE
                      SET calls = call_stats.calls + excluded.calls,
                          errors = call_stats.errors + excluded.errors,
                          duration_us = call_stats.duration_us + excluded.duration_us",
                );
                bind_all!(sqlx::query(&sql), &binds)
                    .execute(&mut *tx)
                    .await?;
            }
            let texts: Vec<(String, String)> = failed
                .iter()
                .map(|f| {
                    (
                        serde_json::to_string(&f.code_paths).unwrap_or_else(|_| "[]".into()),
                        serde_json::to_string(&f.feature_flags).unwrap_or_else(|_| "{}".into()),
                    )
                })
                .collect();
            for (ci, chunk) in failed.chunks(ROWS).enumerate() {
                let mut sql = format!(
                    "INSERT INTO failed_requests (span_id, trace_id, environment, service, version, operation,
                        error_signature, downstream, code_paths, config_digest, feature_flags, start_ns, key_id) VALUES {}",
                    values_rows(pg, chunk.len(), 13)
                );
                let mut binds: Vec<Bind<'_>> = Vec::with_capacity(chunk.len() * 13);
                for (r, f) in chunk.iter().enumerate() {
                    let (paths, flags) = &texts[ci * ROWS + r];
                    binds.extend([
                        Bind::Text(&f.span_id),
                        Bind::Text(&f.trace_id),
                        Bind::Text(&f.environment),
                        Bind::Text(&f.service),
                        Bind::Text(&f.version),
                        Bind::Text(&f.operation),
                        Bind::Text(&f.error_signature),
                        Bind::OptText(f.downstream.as_deref()),
                        Bind::Text(paths),
                        Bind::OptText(f.config_digest.as_deref()),
                        Bind::Text(flags),
                        Bind::I64(f.start_ns),
                        Bind::Text(key_id),
                    ]);
                }
                sql.push_str(" ON CONFLICT (span_id) DO NOTHING");
                bind_all!(sqlx::query(&sql), &binds)
                    .execute(&mut *tx)
                    .await?;
            }
            tx.commit().await?;
            Ok(())
        })
    }

    /// Convert `request_stats` rows (minute resolution, 4 latency bins per
    /// octave, written before cohort rows existed) into version cohort rows
    /// marked `legacy`: each minute's requests at its second 0 (so they
    /// belong to the cohort their minute starts in, as before), each bin at
    /// its geometric middle. Batches of at most 20,000 rows, each converted
    /// and deleted in one transaction; a crash between batches resumes on
    /// the next open. Returns the rows converted (0, one cheap read, once
    /// there are none).
    pub async fn convert_legacy_request_stats(&self) -> Result<u64, StoreError> {
        const BATCH: i64 = 20_000;
        type LegacyRow = (String, String, String, i64, i64, i64, i64);
        let mut converted = 0u64;
        loop {
            let done = with_pool!(self, write, |pool, pg| {
                let mut tx = begin_write!(pool, pg);
                let legacy: Vec<LegacyRow> = sqlx::query_as(
                    "SELECT environment, service, version, bucket_ns, latency_bin, requests, errors
                     FROM request_stats
                     ORDER BY environment, service, bucket_ns, version, latency_bin LIMIT $1",
                )
                .bind(BATCH)
                .fetch_all(&mut *tx)
                .await?;
                if legacy.is_empty() {
                    tx.commit().await?;
                    None
                } else {
                    let mut rows: BTreeMap<CohortKey, PendingRow> = BTreeMap::new();
                    for (environment, service, version, bucket_ns, bin, req, err) in &legacy {
                        let middle_us = 2f64.powf((*bin as f64 + 0.5) / LEGACY_BINS_PER_OCTAVE);
                        let key = crate::analysis::sketch::key_of_ns((middle_us * 1000.0) as i64);
                        let row = rows
                            .entry(CohortKey {
                                environment: environment.clone(),
                                service: service.clone(),
                                dimension: Dimension::Version,
                                name: String::new(),
                                bucket_ns: *bucket_ns,
                                value: version.clone(),
                            })
                            .or_default();
                        row.legacy = true;
                        row.cells.record_many(
                            0,
                            key,
                            u64::try_from(*req).unwrap_or(0),
                            u64::try_from(*err).unwrap_or(0),
                        );
                    }
                    upsert_cohorts!(tx, pg, &mut rows);
                    for chunk in legacy.chunks(COHORT_ROWS) {
                        let sql = format!(
                        "DELETE FROM request_stats
                         WHERE (environment, service, bucket_ns, version, latency_bin) IN (VALUES {})",
                        values_rows(pg, chunk.len(), 5)
                    );
                        let mut binds: Vec<Bind<'_>> = Vec::with_capacity(chunk.len() * 5);
                        for (e, s, v, b, bin, _, _) in chunk {
                            binds.extend([
                                Bind::Text(e),
                                Bind::Text(s),
                                Bind::I64(*b),
                                Bind::Text(v),
                                Bind::I64(*bin),
                            ]);
                        }
                        bind_all!(sqlx::query(&sql), &binds)
                            .execute(&mut *tx)
                            .await?;
                    }
                    tx.commit().await?;
                    Some(legacy.len() as u64)
                }
            });
            match done {
                Some(n) => converted += n,
                None => return Ok(converted),
            }
        }
    }
}
