//! Findings' storage: insert a finding with its cited evidence, read it by
//! id, idempotency key, fingerprint or locus, update its proof.
//!
//! Invariants:
//! - A finding and its cited evidence are written in one transaction; one
//!   idempotency key, one finding.
//! - `finding_evidence.digest` references `envelopes.digest ON DELETE
//!   RESTRICT`, and retention skips cited envelopes.
//! - Ids are `fnd_` + 16 random hex digits ([`super::new_id`]).

use std::collections::BTreeSet;

use serde_json::Value;
use sqlx::Row;

use super::{json_text, parse_json};
use crate::db::{Pools, Store, StoreError};

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

impl Store {
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
