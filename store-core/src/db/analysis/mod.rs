//! Storage of the analysis half: change ledger, OTLP aggregates, findings,
//! eval runs, and the envelope reads the fleet verdicts need.
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
//! - A change and its nodes, a finding and its cited evidence, are each
//!   written in one transaction.
//! - `finding_evidence.digest` references `envelopes.digest ON DELETE
//!   RESTRICT`, and retention skips cited envelopes.
//! - Ids are `chg_`/`fnd_`/`evr_` + 16 random hex digits.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;
use sqlx::Row;

use super::{Bind, Pools, Store, StoreError, placeholders, values_rows};
use crate::analysis::cohort::{CohortKey, Dimension};
use crate::analysis::fleet::NodeEnvelope;
use crate::analysis::ledger::{ChangeNode, ChangeRecord, NewChange, rfc3339};
use crate::analysis::otlp::{Batch, CallAgg, CallKey, FailedRequest};
use crate::analysis::proof::EvalRun;
use crate::analysis::sketch::{MinuteCells, SecondRange, Sketch, SketchError};

/// A fresh id with `prefix`.
pub fn new_id(prefix: &str) -> Result<String, StoreError> {
    let mut b = [0u8; 8];
    getrandom::fill(&mut b)
        .map_err(|e| StoreError::Key(crate::keys::KeyError::Random(e.to_string())))?;
    Ok(format!("{prefix}_{}", hex::encode(b)))
}

/// (digest, wall_ns, kind, identity, key name, body).
type NodeRow = (String, i64, String, String, Option<String>, Vec<u8>);
/// (digest, wall_ns, identity, key name, body).
type ClaimRow = (String, i64, String, Option<String>, Vec<u8>);

/// (environment, service, minute bucket, version) of a `span_writers` row;
/// its value is (requests, errors, calls).
type WriterKey<'a> = (&'a str, &'a str, i64, &'a str);

/// Which versions a cohort holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VersionFilter<'a> {
    /// Every version.
    Any,
    /// Exactly this one.
    Is(&'a str),
    /// Every other one.
    Not(&'a str),
}

impl<'a> VersionFilter<'a> {
    fn binds(self) -> (Option<&'a str>, Option<&'a str>) {
        match self {
            VersionFilter::Any => (None, None),
            VersionFilter::Is(v) => (Some(v), None),
            VersionFilter::Not(v) => (None, Some(v)),
        }
    }
}

/// Request counts and latency sketch of a cohort over `[start, end)`, to the second.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RequestTotals {
    /// Requests.
    pub requests: i64,
    /// Failed requests.
    pub errors: i64,
    /// Latency sketch of those requests.
    pub latency: Sketch,
    /// Rows read that were converted from minute-resolution aggregates
    /// (their latency error bound is wider; see `convert_legacy_request_stats`).
    pub legacy_rows: i64,
}

/// Which cohort rows a read sums.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CohortFilter<'a> {
    /// Version, config digest or flag variant.
    pub dimension: Dimension,
    /// The flag key ([`Dimension::Flag`]), else "".
    pub name: &'a str,
    /// Which values.
    pub values: VersionFilter<'a>,
}

impl<'a> CohortFilter<'a> {
    /// Version cohorts.
    pub fn versions(values: VersionFilter<'a>) -> CohortFilter<'a> {
        CohortFilter {
            dimension: Dimension::Version,
            name: "",
            values,
        }
    }
}

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

fn decode_err(e: SketchError) -> StoreError {
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

/// Calls of a cohort to one resource.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CallTotals {
    /// Calls.
    pub calls: i64,
    /// Failed calls.
    pub errors: i64,
    /// Sum of durations, µs.
    pub duration_us: i64,
    /// One contending span (`traceId/spanId`).
    pub exemplar: String,
}

/// A stored finding row.
#[derive(Debug, Clone, PartialEq)]
pub struct FindingRow {
    /// `fnd_…`.
    pub id: String,
    /// Environment.
    pub environment: String,
    /// Incident.
    pub incident_id: Option<String>,
    /// Fault locus.
    pub fault_locus_entity_id: String,
    /// JSON array of links.
    pub causal_chain: Value,
    /// JSON array of ids.
    pub cited_evidence_ids: Value,
    /// Contributing change.
    pub contributing_change_id: Option<String>,
    /// That change's verdict when the finding was judged.
    pub change_verdict: Option<String>,
    /// JSON counterfactual (run ids, requiredTrials, verified).
    pub counterfactual: Option<Value>,
    /// Recurrence fingerprint.
    pub fingerprint: String,
    /// JSON fingerprint input.
    pub fingerprint_input: Value,
    /// Derived tier.
    pub causal_proof_tier: String,
    /// Idempotency key.
    pub idempotency_key: String,
    /// Created, ns.
    pub created_ns: i64,
    /// Updated, ns.
    pub updated_ns: i64,
}

fn json_text(v: &Value) -> String {
    v.to_string()
}

fn parse_json(s: &str) -> Value {
    serde_json::from_str(s).unwrap_or(Value::Null)
}

const FINDING_COLUMNS: &str = "id, environment, incident_id, fault_locus_entity_id, causal_chain,
    cited_evidence_ids, contributing_change_id, change_verdict, counterfactual, fingerprint,
    fingerprint_input, causal_proof_tier, idempotency_key, created_ns, updated_ns";

macro_rules! finding_row {
    ($row:expr) => {{
        let row = $row;
        FindingRow {
            id: row.try_get("id")?,
            environment: row.try_get("environment")?,
            incident_id: row.try_get("incident_id")?,
            fault_locus_entity_id: row.try_get("fault_locus_entity_id")?,
            causal_chain: parse_json(&row.try_get::<String, _>("causal_chain")?),
            cited_evidence_ids: parse_json(&row.try_get::<String, _>("cited_evidence_ids")?),
            contributing_change_id: row.try_get("contributing_change_id")?,
            change_verdict: row.try_get("change_verdict")?,
            counterfactual: row
                .try_get::<Option<String>, _>("counterfactual")?
                .map(|s| parse_json(&s)),
            fingerprint: row.try_get("fingerprint")?,
            fingerprint_input: parse_json(&row.try_get::<String, _>("fingerprint_input")?),
            causal_proof_tier: row.try_get("causal_proof_tier")?,
            idempotency_key: row.try_get("idempotency_key")?,
            created_ns: row.try_get("created_ns")?,
            updated_ns: row.try_get("updated_ns")?,
        }
    }};
}

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

/// A JSON text column decoded; text that does not parse reads as the
/// default (empty list / map).
fn json_column<'r, R, T>(row: &'r R, name: &'r str) -> Result<T, sqlx::Error>
where
    R: Row,
    &'r str: sqlx::ColumnIndex<R>,
    String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    T: serde::de::DeserializeOwned + Default,
{
    Ok(serde_json::from_str(&row.try_get::<String, _>(name)?).unwrap_or_default())
}

impl Store {
    // ---- change ledger ----

    /// Store a validated change (and its nodes) in one transaction.
    pub async fn record_change(
        &self,
        c: &NewChange,
        key_id: &str,
        now_ns: i64,
    ) -> Result<String, StoreError> {
        let id = new_id("chg")?;
        let paths = serde_json::to_string(&c.touched_paths).unwrap_or_else(|_| "[]".into());
        with_pool!(self, write, |pool, pg| {
            let mut tx = begin_write!(pool, pg);
            sqlx::query(
                "INSERT INTO changes (id, environment, kind, service, version, previous_version, commit_sha,
                    previous_commit_sha, config_digest, summary, touched_paths, at_ns, key_id, created_ns,
                    candidate_agent_version, flags)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16)",
            )
            .bind(&id)
            .bind(&c.environment)
            .bind(&c.kind)
            .bind(c.service.as_deref())
            .bind(c.version.as_deref())
            .bind(c.previous_version.as_deref())
            .bind(c.commit_sha.as_deref())
            .bind(c.previous_commit_sha.as_deref())
            .bind(c.config_digest.as_deref())
            .bind(c.summary.as_deref())
            .bind(&paths)
            .bind(c.at_ns)
            .bind(key_id)
            .bind(now_ns)
            .bind(c.candidate_agent_version.as_deref())
            .bind(serde_json::to_string(&c.flags).unwrap_or_else(|_| "{}".into()))
            .execute(&mut *tx)
            .await?;
            for chunk in c.nodes.chunks(300) {
                let sql = format!(
                    "INSERT INTO change_nodes (change_id, node, at_ns) VALUES {}",
                    values_rows(pg, chunk.len(), 3)
                );
                let mut binds: Vec<Bind<'_>> = Vec::with_capacity(chunk.len() * 3);
                for (node, at) in chunk.iter() {
                    binds.extend([Bind::Text(&id), Bind::Text(node), Bind::I64(*at)]);
                }
                bind_all!(sqlx::query(&sql), &binds)
                    .execute(&mut *tx)
                    .await?;
            }
            // The target's current state moves with the ledger, in the same
            // transaction (crate::db::gate).
            if let Some((node_key, sql)) = super::gate::ontology_upsert(c, pg) {
                sqlx::query(&sql)
                    .bind(&node_key)
                    .bind(&c.environment)
                    .bind(c.service.as_deref())
                    .bind(c.version.as_deref())
                    .bind(c.commit_sha.as_deref())
                    .bind(c.config_digest.as_deref())
                    .bind(&id)
                    .bind(c.at_ns)
                    .bind(now_ns)
                    .bind(serde_json::to_string(&c.flags).unwrap_or_else(|_| "{}".into()))
                    .execute(&mut *tx)
                    .await?;
            }
            tx.commit().await?;
            Ok::<(), StoreError>(())
        })?;
        Ok(id)
    }

    /// Changes, newest first.
    pub async fn changes(
        &self,
        environment: Option<&str>,
        service: Option<&str>,
        since_ns: Option<i64>,
        limit: i64,
    ) -> Result<Vec<ChangeRecord>, StoreError> {
        let ids: Vec<String> = with_pool!(self, read, |pool, pg| {
            sqlx::query_scalar(
                "SELECT id FROM changes
                 WHERE ($1 IS NULL OR environment = $1) AND ($2 IS NULL OR service = $2)
                   AND at_ns >= $3
                 ORDER BY at_ns DESC, id DESC LIMIT $4",
            )
            .bind(environment)
            .bind(service)
            .bind(since_ns.unwrap_or(i64::MIN))
            .bind(limit)
            .fetch_all(pool)
            .await?
        });
        let mut out = Vec::with_capacity(ids.len());
        for id in ids {
            if let Some(c) = self.change(&id).await? {
                out.push(c);
            }
        }
        Ok(out)
    }

    /// One change with its nodes.
    pub async fn change(&self, id: &str) -> Result<Option<ChangeRecord>, StoreError> {
        with_pool!(self, read, |pool, pg| {
            let Some(row) = sqlx::query(
                "SELECT id, environment, kind, service, version, previous_version, commit_sha,
                    previous_commit_sha, config_digest, summary, touched_paths, at_ns,
                    candidate_agent_version, key_id, flags
                 FROM changes WHERE id = $1",
            )
            .bind(id)
            .fetch_optional(pool)
            .await?
            else {
                return Ok(None);
            };
            let nodes: Vec<(String, i64)> = sqlx::query_as(
                "SELECT node, at_ns FROM change_nodes WHERE change_id = $1 ORDER BY node",
            )
            .bind(id)
            .fetch_all(pool)
            .await?;
            let at_ns: i64 = row.try_get("at_ns")?;
            Ok(Some(ChangeRecord {
                id: row.try_get("id")?,
                environment: row.try_get("environment")?,
                kind: row.try_get("kind")?,
                service: row.try_get("service")?,
                version: row.try_get("version")?,
                previous_version: row.try_get("previous_version")?,
                commit_sha: row.try_get("commit_sha")?,
                previous_commit_sha: row.try_get("previous_commit_sha")?,
                candidate_agent_version: row.try_get("candidate_agent_version")?,
                config_digest: row.try_get("config_digest")?,
                summary: row.try_get("summary")?,
                touched_paths: json_column(&row, "touched_paths")?,
                key_id: row.try_get("key_id")?,
                at: rfc3339(at_ns),
                at_ns,
                nodes: nodes
                    .into_iter()
                    .map(|(node, at)| ChangeNode {
                        node,
                        at: Some(rfc3339(at)),
                    })
                    .collect(),
                flags: json_column(&row, "flags")?,
            }))
        })
    }

    // ---- OTLP aggregates ----

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

    /// Who wrote the spans of `service` (every version) in `[start, end)`:
    /// key id → spans (requests + client calls) it shipped there.
    pub async fn span_writers(
        &self,
        environment: &str,
        service: &str,
        start_ns: i64,
        end_ns: i64,
    ) -> Result<BTreeMap<String, i64>, StoreError> {
        let rows: Vec<(String, i64)> = with_pool!(self, read, |pool, pg| {
            sqlx::query_as(
                "SELECT key_id, CAST(SUM(requests + calls) AS BIGINT) FROM span_writers
                 WHERE environment = $1 AND service = $2 AND bucket_ns >= $3 AND bucket_ns < $4
                 GROUP BY key_id",
            )
            .bind(environment)
            .bind(service)
            .bind(start_ns)
            .bind(end_ns)
            .fetch_all(pool)
            .await?
        });
        Ok(rows.into_iter().collect())
    }

    /// Who shipped the envelopes captured in `[start, end)`: key id →
    /// envelopes.
    pub async fn envelope_writers(
        &self,
        start_ns: i64,
        end_ns: i64,
    ) -> Result<BTreeMap<String, i64>, StoreError> {
        let rows: Vec<(String, i64)> = with_pool!(self, read, |pool, pg| {
            sqlx::query_as(
                "SELECT key_id, COUNT(*) FROM envelopes WHERE wall_ns >= $1 AND wall_ns < $2 GROUP BY key_id",
            )
            .bind(start_ns)
            .bind(end_ns)
            .fetch_all(pool)
            .await?
        });
        Ok(rows.into_iter().collect())
    }

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

    /// Requests of `service` in `[start, end)`, one version or all, to the
    /// second (a second counts when it starts in the window).
    pub async fn request_totals(
        &self,
        environment: &str,
        service: &str,
        versions: VersionFilter<'_>,
        start_ns: i64,
        end_ns: i64,
    ) -> Result<RequestTotals, StoreError> {
        self.cohort_totals(
            environment,
            service,
            CohortFilter::versions(versions),
            start_ns,
            end_ns,
        )
        .await
    }

    /// Requests of one cohort filter in `[start, end)`, to the second.
    pub async fn cohort_totals(
        &self,
        environment: &str,
        service: &str,
        filter: CohortFilter<'_>,
        start_ns: i64,
        end_ns: i64,
    ) -> Result<RequestTotals, StoreError> {
        self.sum_cohort_rows(environment, service, filter, false, start_ns, end_ns)
            .await
    }

    /// Requests counted in a dimension's overflow rows in `[start, end)`
    /// (values past the per-minute cap).
    pub async fn cohort_overflow(
        &self,
        environment: &str,
        service: &str,
        dimension: Dimension,
        start_ns: i64,
        end_ns: i64,
    ) -> Result<i64, StoreError> {
        let filter = CohortFilter {
            dimension,
            name: "",
            values: VersionFilter::Any,
        };
        Ok(self
            .sum_cohort_rows(environment, service, filter, true, start_ns, end_ns)
            .await?
            .requests)
    }

    async fn sum_cohort_rows(
        &self,
        environment: &str,
        service: &str,
        filter: CohortFilter<'_>,
        overflow: bool,
        start_ns: i64,
        end_ns: i64,
    ) -> Result<RequestTotals, StoreError> {
        const MINUTE: i64 = crate::analysis::otlp::BUCKET_NS;
        let mut t = RequestTotals::default();
        if end_ns <= start_ns {
            return Ok(t);
        }
        let (is, not) = filter.values.binds();
        let first_minute = start_ns - start_ns.rem_euclid(MINUTE);
        // Whole minutes read the minute sketch when one is stored; the
        // minutes at the edges (and rows without one) read the seconds.
        let sql = format!(
            "SELECT bucket_ns, requests, errors, legacy, sketch,
                    CASE WHEN length(sketch) = 0 OR bucket_ns < $3 OR bucket_ns > $4 THEN seconds END
             FROM cohort_stats
             WHERE environment = $1 AND service = $2 AND dimension = $5 AND name = $6
               AND bucket_ns >= $7 AND bucket_ns < $8 AND {}
               AND ($9 IS NULL OR value = $9) AND ($10 IS NULL OR value <> $10)",
            if overflow { "value = ''" } else { "value <> ''" }
        );
        type Row = (i64, i64, i64, i64, Vec<u8>, Option<Vec<u8>>);
        let rows: Vec<Row> = with_pool!(self, read, |pool, pg| {
            sqlx::query_as(&sql)
                .bind(environment)
                .bind(service)
                .bind(start_ns)
                .bind(end_ns.saturating_sub(MINUTE))
                .bind(filter.dimension.as_str())
                .bind(filter.name)
                .bind(first_minute)
                .bind(end_ns)
                .bind(is)
                .bind(not)
                .fetch_all(pool)
                .await?
        });
        let (mut requests, mut errors) = (0u64, 0u64);
        for (bucket_ns, req, err, legacy, sketch, seconds) in rows {
            let range = SecondRange::within(bucket_ns, start_ns, end_ns);
            if range.from >= range.to {
                continue;
            }
            t.legacy_rows += i64::from(legacy != 0);
            match seconds {
                Some(seconds) => {
                    let (r, e) = MinuteCells::read_into(&seconds, range, &mut t.latency)
                        .map_err(decode_err)?;
                    requests = requests.saturating_add(r);
                    errors = errors.saturating_add(e);
                }
                None => {
                    t.latency.merge_encoded(&sketch).map_err(decode_err)?;
                    requests = requests.saturating_add(u64::try_from(req).unwrap_or(0));
                    errors = errors.saturating_add(u64::try_from(err).unwrap_or(0));
                }
            }
        }
        t.requests = i64::try_from(requests).unwrap_or(i64::MAX);
        t.errors = i64::try_from(errors).unwrap_or(i64::MAX);
        Ok(t)
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

    /// Calls by resource of one version in `[start, end)`.
    pub async fn call_totals(
        &self,
        environment: &str,
        service: &str,
        versions: VersionFilter<'_>,
        start_ns: i64,
        end_ns: i64,
    ) -> Result<BTreeMap<String, CallTotals>, StoreError> {
        let (is, not) = versions.binds();
        let rows: Vec<(String, i64, i64, i64, String)> = with_pool!(self, read, |pool, pg| {
            sqlx::query_as(
                "SELECT resource, CAST(SUM(calls) AS BIGINT), CAST(SUM(errors) AS BIGINT),
                        CAST(SUM(duration_us) AS BIGINT), MAX(exemplar)
                 FROM call_stats
                 WHERE environment = $1 AND service = $2
                   AND bucket_ns >= $3 AND bucket_ns < $4
                   AND ($5 IS NULL OR version = $5) AND ($6 IS NULL OR version <> $6)
                 GROUP BY resource",
            )
            .bind(environment)
            .bind(service)
            .bind(start_ns)
            .bind(end_ns)
            .bind(is)
            .bind(not)
            .fetch_all(pool)
            .await?
        });
        Ok(rows
            .into_iter()
            .map(|(r, calls, errors, duration_us, exemplar)| {
                (
                    r,
                    CallTotals {
                        calls,
                        errors,
                        duration_us,
                        exemplar,
                    },
                )
            })
            .collect())
    }

    /// `code.filepath` values on failed requests of one version in `[start, end)`.
    pub async fn failing_code_paths(
        &self,
        environment: &str,
        service: &str,
        versions: VersionFilter<'_>,
        start_ns: i64,
        end_ns: i64,
    ) -> Result<BTreeSet<String>, StoreError> {
        let (is, not) = versions.binds();
        let rows: Vec<String> = with_pool!(self, read, |pool, pg| {
            sqlx::query_scalar(
                "SELECT DISTINCT code_paths FROM failed_requests
                 WHERE environment = $1 AND service = $2
                   AND start_ns >= $3 AND start_ns < $4 AND code_paths <> '[]'
                   AND ($5 IS NULL OR version = $5) AND ($6 IS NULL OR version <> $6)
                 LIMIT 10000",
            )
            .bind(environment)
            .bind(service)
            .bind(start_ns)
            .bind(end_ns)
            .bind(is)
            .bind(not)
            .fetch_all(pool)
            .await?
        });
        Ok(rows
            .iter()
            .flat_map(|s| serde_json::from_str::<Vec<String>>(s).unwrap_or_default())
            .collect())
    }

    /// A sampled failed request by span id (hex).
    pub async fn failed_request(&self, span_id: &str) -> Result<Option<FailedRequest>, StoreError> {
        with_pool!(self, read, |pool, pg| {
            let Some(row) = sqlx::query(
                "SELECT span_id, trace_id, environment, service, version, operation, error_signature,
                        downstream, code_paths, config_digest, feature_flags, start_ns
                 FROM failed_requests WHERE span_id = $1",
            )
            .bind(span_id)
            .fetch_optional(pool)
            .await?
            else {
                return Ok(None);
            };
            Ok(Some(FailedRequest {
                span_id: row.try_get("span_id")?,
                trace_id: row.try_get("trace_id")?,
                environment: row.try_get("environment")?,
                service: row.try_get("service")?,
                version: row.try_get("version")?,
                operation: row.try_get("operation")?,
                error_signature: row.try_get("error_signature")?,
                downstream: row.try_get("downstream")?,
                code_paths: json_column(&row, "code_paths")?,
                config_digest: row.try_get("config_digest")?,
                feature_flags: json_column(&row, "feature_flags")?,
                start_ns: row.try_get("start_ns")?,
            }))
        })
    }

    // ---- envelopes for the fleet ----

    /// Envelopes captured in `[start, end)` with their node (the subject's
    /// `host`, else `source_node`, else the name of the key that shipped it)
    /// and claim codes. At most `cap` (oldest first); the bool says whether
    /// the cap cut the list.
    pub async fn node_envelopes(
        &self,
        start_ns: i64,
        end_ns: i64,
        cap: i64,
    ) -> Result<(Vec<NodeEnvelope>, bool), StoreError> {
        let rows: Vec<NodeRow> = with_pool!(self, read, |pool, pg| {
            sqlx::query_as(
                "SELECT e.digest, e.wall_ns, e.kind, e.identity, k.name, e.body
                 FROM envelopes e LEFT JOIN api_keys k ON k.id = e.key_id
                 WHERE e.wall_ns >= $1 AND e.wall_ns < $2
                 ORDER BY e.wall_ns, e.digest LIMIT $3",
            )
            .bind(start_ns)
            .bind(end_ns)
            .bind(cap + 1)
            .fetch_all(pool)
            .await?
        });
        let cut = rows.len() as i64 > cap;
        let out = rows
            .into_iter()
            .take(usize::try_from(cap).unwrap_or(0))
            .map(
                |(digest, wall_ns, kind, identity, key_name, body)| NodeEnvelope {
                    node: node_of(&identity, key_name.as_deref()),
                    codes: claim_codes(&body),
                    digest,
                    wall_ns,
                    kind,
                },
            )
            .collect();
        Ok((out, cut))
    }

    /// Envelopes since `since_ns` carrying a claim `code`: (node, digest, wall_ns).
    pub async fn envelopes_with_claim(
        &self,
        code: &str,
        since_ns: i64,
        cap: i64,
    ) -> Result<(Vec<(String, String, i64)>, bool), StoreError> {
        // A cheap byte prefilter in SQL; the parsed claims decide.
        // The quoted code alone: envelopes need not be compact JSON.
        let needle = format!("\"{code}\"");
        let rows: Vec<ClaimRow> = with_pool!(self, read, |pool, pg| {
            let sql = if pg {
                "SELECT e.digest, e.wall_ns, e.identity, k.name, e.body
                 FROM envelopes e LEFT JOIN api_keys k ON k.id = e.key_id
                 WHERE e.wall_ns >= $1 AND position(convert_to($2, 'UTF8') in e.body) > 0
                 ORDER BY e.wall_ns, e.digest LIMIT $3"
            } else {
                "SELECT e.digest, e.wall_ns, e.identity, k.name, e.body
                 FROM envelopes e LEFT JOIN api_keys k ON k.id = e.key_id
                 WHERE e.wall_ns >= $1 AND instr(e.body, CAST($2 AS BLOB)) > 0
                 ORDER BY e.wall_ns, e.digest LIMIT $3"
            };
            sqlx::query_as(sql)
                .bind(since_ns)
                .bind(needle.as_str())
                .bind(cap + 1)
                .fetch_all(pool)
                .await?
        });
        let cut = rows.len() as i64 > cap;
        Ok((
            rows.into_iter()
                .take(usize::try_from(cap).unwrap_or(0))
                .filter(|r| claim_codes(&r.4).iter().any(|c| c == code))
                .map(|(digest, wall_ns, identity, key_name, _)| {
                    (node_of(&identity, key_name.as_deref()), digest, wall_ns)
                })
                .collect(),
            cut,
        ))
    }

    /// Which of `digests` are not stored.
    pub async fn missing_digests(&self, digests: &[String]) -> Result<Vec<String>, StoreError> {
        let mut present: BTreeSet<String> = BTreeSet::new();
        for chunk in digests.chunks(400) {
            let sql = format!(
                "SELECT digest FROM envelopes WHERE digest IN ({})",
                placeholders(self.backend() == super::Backend::Postgres, 1, chunk.len())
            );
            let binds: Vec<Bind<'_>> = chunk.iter().map(|d| Bind::Text(d)).collect();
            let rows: Vec<String> = with_pool!(self, read, |pool, pg| {
                bind_all!(sqlx::query_scalar(&sql), &binds)
                    .fetch_all(pool)
                    .await?
            });
            present.extend(rows);
        }
        Ok(digests
            .iter()
            .filter(|d| !present.contains(*d))
            .cloned()
            .collect())
    }

    // ---- eval runs ----

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

    // ---- findings ----

    /// Insert a finding and its cited envelopes in one transaction. An
    /// existing finding with the same idempotency key wins: returns it and
    /// `false`.
    pub async fn insert_finding(
        &self,
        f: &FindingRow,
        digests: &[String],
        key_id: &str,
    ) -> Result<(FindingRow, bool), StoreError> {
        if let Some(existing) = self.finding_by_key(&f.idempotency_key).await? {
            return Ok((existing, false));
        }
        let result = with_pool!(self, write, |pool, pg| {
            let mut tx = begin_write!(pool, pg);
            sqlx::query(&format!(
                "INSERT INTO findings ({FINDING_COLUMNS}, key_id)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16)"
            ))
            .bind(&f.id)
            .bind(&f.environment)
            .bind(f.incident_id.as_deref())
            .bind(&f.fault_locus_entity_id)
            .bind(json_text(&f.causal_chain))
            .bind(json_text(&f.cited_evidence_ids))
            .bind(f.contributing_change_id.as_deref())
            .bind(f.change_verdict.as_deref())
            .bind(f.counterfactual.as_ref().map(json_text))
            .bind(&f.fingerprint)
            .bind(json_text(&f.fingerprint_input))
            .bind(&f.causal_proof_tier)
            .bind(&f.idempotency_key)
            .bind(f.created_ns)
            .bind(f.updated_ns)
            .bind(key_id)
            .execute(&mut *tx)
            .await?;
            let unique: BTreeSet<&String> = digests.iter().collect();
            for d in unique {
                sqlx::query("INSERT INTO finding_evidence (finding_id, digest) VALUES ($1, $2)")
                    .bind(&f.id)
                    .bind(d)
                    .execute(&mut *tx)
                    .await?;
            }
            tx.commit().await?;
            Ok::<(), StoreError>(())
        });
        match result {
            Ok(()) => Ok((f.clone(), true)),
            // A concurrent retry with the same key inserted first.
            Err(e) if e.is_unique_violation() => {
                match self.finding_by_key(&f.idempotency_key).await? {
                    Some(existing) => Ok((existing, false)),
                    None => Err(e),
                }
            }
            Err(e) => Err(e),
        }
    }

    /// A finding by idempotency key.
    pub async fn finding_by_key(&self, key: &str) -> Result<Option<FindingRow>, StoreError> {
        self.finding_where("idempotency_key", key).await
    }

    /// A finding by id.
    pub async fn finding(&self, id: &str) -> Result<Option<FindingRow>, StoreError> {
        self.finding_where("id", id).await
    }

    async fn finding_where(
        &self,
        column: &'static str,
        value: &str,
    ) -> Result<Option<FindingRow>, StoreError> {
        with_pool!(self, read, |pool, pg| {
            let row = sqlx::query(&format!(
                "SELECT {FINDING_COLUMNS} FROM findings WHERE {column} = $1"
            ))
            .bind(value)
            .fetch_optional(pool)
            .await?;
            match row {
                None => Ok(None),
                Some(row) => Ok(Some(finding_row!(&row))),
            }
        })
    }

    /// Findings sharing a fingerprint, newest first.
    pub async fn findings_by_fingerprint(
        &self,
        fingerprint: &str,
        limit: i64,
    ) -> Result<Vec<FindingRow>, StoreError> {
        with_pool!(self, read, |pool, pg| {
            let rows = sqlx::query(&format!(
                "SELECT {FINDING_COLUMNS} FROM findings WHERE fingerprint = $1 ORDER BY created_ns DESC, id DESC LIMIT $2"
            ))
            .bind(fingerprint)
            .bind(limit)
            .fetch_all(pool)
            .await?;
            let mut out = Vec::with_capacity(rows.len());
            for row in &rows {
                out.push(finding_row!(row));
            }
            Ok(out)
        })
    }

    /// Findings whose fault locus is `entity`, newest first.
    pub async fn findings_by_locus(
        &self,
        entity: &str,
        limit: i64,
    ) -> Result<Vec<FindingRow>, StoreError> {
        with_pool!(self, read, |pool, pg| {
            let rows = sqlx::query(&format!(
                "SELECT {FINDING_COLUMNS} FROM findings WHERE fault_locus_entity_id = $1 ORDER BY created_ns DESC, id DESC LIMIT $2"
            ))
            .bind(entity)
            .bind(limit)
            .fetch_all(pool)
            .await?;
            let mut out = Vec::with_capacity(rows.len());
            for row in &rows {
                out.push(finding_row!(row));
            }
            Ok(out)
        })
    }

    /// Record a counterfactual outcome and the tier it earns.
    pub async fn update_finding_proof(
        &self,
        id: &str,
        counterfactual: &Value,
        tier: &str,
        now_ns: i64,
    ) -> Result<(), StoreError> {
        with_pool!(self, write, |pool, pg| {
            sqlx::query("UPDATE findings SET counterfactual = $1, causal_proof_tier = $2, updated_ns = $3 WHERE id = $4")
                .bind(json_text(counterfactual))
                .bind(tier)
                .bind(now_ns)
                .bind(id)
                .execute(pool)
                .await?;
            Ok(())
        })
    }
}

/// The node an envelope speaks for.
fn node_of(identity: &str, key_name: Option<&str>) -> String {
    let v: Value = serde_json::from_str(identity).unwrap_or(Value::Null);
    ["host", "source_node"]
        .iter()
        .find_map(|k| v.get(*k).and_then(Value::as_str).map(str::to_string))
        .or_else(|| key_name.map(str::to_string))
        .unwrap_or_else(|| "unknown".into())
}

/// Claim codes of a stored envelope (its bytes verified at ingest).
fn claim_codes(body: &[u8]) -> Vec<String> {
    #[derive(serde::Deserialize)]
    struct Claims {
        #[serde(default)]
        claims: Vec<Code>,
    }
    #[derive(serde::Deserialize)]
    struct Code {
        code: String,
    }
    serde_json::from_slice::<Claims>(body)
        .map(|c| c.claims.into_iter().map(|c| c.code).collect())
        .unwrap_or_default()
}
