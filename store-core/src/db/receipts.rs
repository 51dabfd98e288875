//! Storage of receipts (the rules are [`crate::receipts`]).
//!
//! Invariants:
//! - A receipt is recorded only after [`crate::receipts`] judged it against
//!   the stored evidence and the subject's earlier receipts, in the same
//!   write transaction as that read.
//! - Cited evidence is permanent: `receipt_evidence.digest` references
//!   `envelopes.digest ON DELETE RESTRICT`, and retention never selects a
//!   cited envelope.

use std::collections::BTreeMap;

use serde::Serialize;
use sqlx::Row;

use super::{Pools, Store, StoreError};
use crate::ident::format_ns;
use crate::receipts::{
    self, EvidenceFacts, PriorReceipt, ReceiptContext, ReceiptKind, ReceiptRefusal, ReceiptRequest,
};

/// A recorded receipt.
#[derive(Debug, Clone, Serialize)]
pub struct ReceiptRecord {
    /// Row id.
    pub id: i64,
    /// Kind.
    pub kind: ReceiptKind,
    /// Subject key.
    pub subject_key: String,
    /// Change id.
    pub change: String,
    /// Revision, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,
    /// Effective time of the change (REALIZED).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub realized_at: Option<String>,
    /// Soak (SOAKED).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub soak_ms: Option<i64>,
    /// Note.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// Evidence digests.
    pub evidence: Vec<String>,
    /// Key that recorded it.
    pub key_id: String,
    /// When.
    pub created_at: String,
}

/// (cited, problem) pairs whose envelope diff is empty.
fn unchanged_pairs(
    cited: &[String],
    problem: &[String],
    bodies: &BTreeMap<String, Vec<u8>>,
) -> Result<Vec<(String, String)>, StoreError> {
    let parse = |d: &String| -> Result<Option<pstack_envelope::Envelope>, StoreError> {
        match bodies.get(d) {
            None => Ok(None),
            Some(b) => pstack_envelope::parse(b)
                .map(|(e, _)| Some(e))
                .map_err(|e| StoreError::Corrupt {
                    digest: d.clone(),
                    reason: e.to_string(),
                }),
        }
    };
    let mut out = Vec::new();
    for c in cited {
        let Some(after) = parse(c)? else { continue };
        for p in problem {
            let Some(before) = parse(p)? else { continue };
            if let Ok(d) = pstack_envelope::diff(&before, &after)
                && d.is_empty()
            {
                out.push((c.clone(), p.clone()));
            }
        }
    }
    Ok(out)
}

impl Store {
    /// Check a receipt against every rule and record it, atomically.
    pub async fn record_receipt(
        &self,
        req: &ReceiptRequest,
        key_id: &str,
        now_ns: i64,
    ) -> Result<ReceiptRecord, StoreError> {
        let realized_ns = receipts::check_request(req)?;
        let mut evidence: Vec<String> = Vec::new();
        for d in &req.evidence {
            if !evidence.contains(d) {
                evidence.push(d.clone());
            }
        }
        let req = ReceiptRequest {
            evidence,
            ..req.clone()
        };
        let result = with_pool!(self, write, |pool, pg| {
            let mut tx = begin_write!(pool, pg);
            let mut ctx = ReceiptContext::default();
            for d in &req.evidence {
                let row = sqlx::query(
                    "SELECT subject_key, wall_ns, completeness,
                            (SELECT COUNT(*) FROM unknowns u WHERE u.digest = e.digest)
                     FROM envelopes e WHERE digest = $1",
                )
                .bind(d.as_str())
                .fetch_optional(&mut *tx)
                .await?;
                ctx.evidence.push(match row {
                    Some(r) => Some(EvidenceFacts {
                        digest: d.clone(),
                        subject_key: r.try_get(0)?,
                        wall_ns: r.try_get(1)?,
                        completeness: r.try_get(2)?,
                        open_unknowns: usize::try_from(r.try_get::<i64, _>(3)?).unwrap_or(0),
                    }),
                    None => None,
                });
            }
            let subject = receipts::subject_of(&ctx).unwrap_or_default().to_string();
            let prior_rows = sqlx::query(
                "SELECT id, kind, realized_ns FROM receipts WHERE subject_key = $1 AND change_id = $2",
            )
            .bind(subject.as_str())
            .bind(req.change.as_str())
            .fetch_all(&mut *tx)
            .await?;
            for r in &prior_rows {
                let id: i64 = r.try_get(0)?;
                let kind = ReceiptKind::parse(&r.try_get::<String, _>(1)?);
                let cited: Vec<String> = sqlx::query_scalar(
                    "SELECT digest FROM receipt_evidence WHERE receipt_id = $1 ORDER BY digest",
                )
                .bind(id)
                .fetch_all(&mut *tx)
                .await?;
                if let Some(kind) = kind {
                    ctx.prior.push(PriorReceipt {
                        kind,
                        realized_ns: r.try_get(2)?,
                        evidence: cited,
                    });
                }
            }
            let problem: Vec<String> = ctx
                .prior
                .iter()
                .find(|p| p.kind == ReceiptKind::SourceFixed)
                .map(|p| p.evidence.clone())
                .unwrap_or_default();
            for d in &problem {
                let w: Option<i64> =
                    sqlx::query_scalar("SELECT wall_ns FROM envelopes WHERE digest = $1")
                        .bind(d.as_str())
                        .fetch_optional(&mut *tx)
                        .await?;
                ctx.problem_wall_ns.extend(w);
            }
            ctx.latest_of_subject =
                sqlx::query_scalar("SELECT latest_digest FROM subjects WHERE subject_key = $1")
                    .bind(subject.as_str())
                    .fetch_optional(&mut *tx)
                    .await?;
            if req.kind == ReceiptKind::Verified && ctx.evidence.iter().all(Option::is_some) {
                let mut bodies: BTreeMap<String, Vec<u8>> = BTreeMap::new();
                for d in req.evidence.iter().chain(&problem) {
                    if bodies.contains_key(d) {
                        continue;
                    }
                    let b: Option<(Vec<u8>, i64)> =
                        sqlx::query_as("SELECT body, body_codec FROM envelopes WHERE digest = $1")
                            .bind(d.as_str())
                            .fetch_optional(&mut *tx)
                            .await?;
                    if let Some((b, codec)) = b {
                        bodies.insert(d.clone(), super::body::decode(d, codec, b)?);
                    }
                }
                ctx.unchanged_against_problem = unchanged_pairs(&req.evidence, &problem, &bodies)?;
            }
            receipts::check(&req, &ctx)?;
            let id: i64 = sqlx::query_scalar(
                "INSERT INTO receipts (subject_key, change_id, kind, revision, realized_ns, soak_ms, note, key_id, created_ns)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) RETURNING id",
            )
            .bind(subject.as_str())
            .bind(req.change.as_str())
            .bind(req.kind.as_str())
            .bind(req.revision.as_deref())
            .bind(realized_ns)
            .bind(req.soak_ms.map(|s| i64::try_from(s).unwrap_or(i64::MAX)))
            .bind(req.note.as_deref())
            .bind(key_id)
            .bind(now_ns)
            .fetch_one(&mut *tx)
            .await?;
            for d in &req.evidence {
                sqlx::query("INSERT INTO receipt_evidence (receipt_id, digest) VALUES ($1, $2)")
                    .bind(id)
                    .bind(d.as_str())
                    .execute(&mut *tx)
                    .await?;
            }
            tx.commit().await?;
            Ok::<ReceiptRecord, StoreError>(ReceiptRecord {
                id,
                kind: req.kind,
                subject_key: subject,
                change: req.change.clone(),
                revision: req.revision.clone(),
                realized_at: realized_ns.map(format_ns),
                soak_ms: req.soak_ms.map(|s| i64::try_from(s).unwrap_or(i64::MAX)),
                note: req.note.clone(),
                evidence: req.evidence.clone(),
                key_id: key_id.to_string(),
                created_at: format_ns(now_ns),
            })
        });
        match result {
            // Two identical receipts raced; the unique constraint decided.
            Err(e) if e.is_unique_violation() => {
                Err(ReceiptRefusal::AlreadyRecorded { kind: req.kind }.into())
            }
            other => other,
        }
    }

    /// Receipts of a subject, oldest first.
    pub async fn receipts(&self, subject: &str) -> Result<Vec<ReceiptRecord>, StoreError> {
        with_pool!(self, read, |pool, pg| {
            let rows = sqlx::query(
                "SELECT id, kind, subject_key, change_id, revision, realized_ns, soak_ms, note, key_id, created_ns
                 FROM receipts WHERE subject_key = $1 ORDER BY id",
            )
            .bind(subject)
            .fetch_all(pool)
            .await?;
            let mut out = Vec::with_capacity(rows.len());
            for r in &rows {
                let id: i64 = r.try_get(0)?;
                let evidence: Vec<String> = sqlx::query_scalar(
                    "SELECT digest FROM receipt_evidence WHERE receipt_id = $1 ORDER BY digest",
                )
                .bind(id)
                .fetch_all(pool)
                .await?;
                let Some(kind) = ReceiptKind::parse(&r.try_get::<String, _>(1)?) else {
                    continue;
                };
                out.push(ReceiptRecord {
                    id,
                    kind,
                    subject_key: r.try_get(2)?,
                    change: r.try_get(3)?,
                    revision: r.try_get(4)?,
                    realized_at: r.try_get::<Option<i64>, _>(5)?.map(format_ns),
                    soak_ms: r.try_get(6)?,
                    note: r.try_get(7)?,
                    evidence,
                    key_id: r.try_get(8)?,
                    created_at: format_ns(r.try_get(9)?),
                });
            }
            Ok(out)
        })
    }

    // ---- retention ----
}
