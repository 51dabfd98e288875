//! The envelope reads the fleet verdicts need: envelopes of a window with
//! their node and claim codes, envelopes carrying a claim, digests not
//! stored, and who shipped them.
//!
//! Invariants:
//! - Reads only, capped: a list cut by its cap says so.
//! - Claim codes come from what ingest read out of bytes it verified: the
//!   `claim_codes` column, or for rows stored before it (schema v11) their
//!   raw body. No compressed body is read here.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use crate::analysis::fleet::NodeEnvelope;
use crate::db::{Bind, Pools, Store, StoreError, placeholders};

/// (digest, wall_ns, kind, identity, key name, claim codes column, body of
/// a row without that column).
type NodeRow = (
    String,
    i64,
    String,
    String,
    Option<String>,
    Option<String>,
    Option<Vec<u8>>,
);
/// (digest, wall_ns, identity, key name, claim codes column, body of a row
/// without that column).
type ClaimRow = (
    String,
    i64,
    String,
    Option<String>,
    Option<String>,
    Option<Vec<u8>>,
);

/// A row's claim codes: from `claim_codes`, or for a row stored before that
/// column (its body raw, schema v11) from the body.
fn row_codes(column: Option<&str>, legacy_body: Option<&[u8]>) -> Vec<String> {
    match (column, legacy_body) {
        (Some(c), _) => crate::db::body::parse_claim_codes(c),
        (None, Some(body)) => claim_codes(body),
        (None, None) => Vec::new(),
    }
}

impl Store {
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
                "SELECT e.digest, e.wall_ns, e.kind, e.identity, k.name, e.claim_codes,
                        CASE WHEN e.claim_codes IS NULL THEN e.body END
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
                |(digest, wall_ns, kind, identity, key_name, column, body)| NodeEnvelope {
                    node: node_of(&identity, key_name.as_deref()),
                    codes: row_codes(column.as_deref(), body.as_deref()),
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
        // A cheap byte prefilter in SQL; the parsed claims decide. The
        // code as a JSON string: it is how both the `claim_codes` column
        // and a (legacy, raw) body hold it, compact or not. Bodies are read
        // only for rows stored before that column.
        let needle = serde_json::to_string(code).unwrap_or_default();
        let rows: Vec<ClaimRow> = with_pool!(self, read, |pool, pg| {
            let sql = if pg {
                "SELECT e.digest, e.wall_ns, e.identity, k.name, e.claim_codes,
                        CASE WHEN e.claim_codes IS NULL THEN e.body END
                 FROM envelopes e LEFT JOIN api_keys k ON k.id = e.key_id
                 WHERE e.wall_ns >= $1
                   AND (position($2 in e.claim_codes) > 0
                        OR (e.claim_codes IS NULL
                            AND position(convert_to($2, 'UTF8') in e.body) > 0))
                 ORDER BY e.wall_ns, e.digest LIMIT $3"
            } else {
                "SELECT e.digest, e.wall_ns, e.identity, k.name, e.claim_codes,
                        CASE WHEN e.claim_codes IS NULL THEN e.body END
                 FROM envelopes e LEFT JOIN api_keys k ON k.id = e.key_id
                 WHERE e.wall_ns >= $1
                   AND (instr(e.claim_codes, $2) > 0
                        OR (e.claim_codes IS NULL AND instr(e.body, CAST($2 AS BLOB)) > 0))
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
                .filter(|r| {
                    row_codes(r.4.as_deref(), r.5.as_deref())
                        .iter()
                        .any(|c| c == code)
                })
                .map(|(digest, wall_ns, identity, key_name, _, _)| {
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
                placeholders(
                    self.backend() == crate::db::Backend::Postgres,
                    1,
                    chunk.len()
                )
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

/// Claim codes of a raw stored envelope (its bytes verified at ingest).
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
