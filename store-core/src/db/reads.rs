//! Reads of stored envelopes: the exact bytes, subject histories, the
//! fleet's unknowns.
//!
//! Invariants:
//! - Bytes are returned exactly as stored (never re-serialized), so a read
//!   envelope's digest still verifies.
//! - A history is keyset-paged on (wall time, digest), newest first; a query
//!   is validated into a [`HistoryQuery`] ([`history_query`]) before it
//!   reaches SQL, and names only identity fields of its subject kind.
//! - Reads use the reader pool; nothing here writes.

use std::collections::BTreeMap;

use serde::Serialize;
use sqlx::Row;

use super::{Backend, Bind, Pools, Store, StoreError, parse_identity};
use crate::ident::{format_ns, identity_fields, locator_field, subject_key};

/// One row of a subject history.
#[derive(Debug, Clone, Serialize)]
pub struct EnvelopeSummary {
    /// Envelope digest.
    pub digest: String,
    /// Subject key.
    pub subject_key: String,
    /// Subject kind.
    pub kind: String,
    /// Flattened identity fields.
    pub identity: serde_json::Value,
    /// Capture wall time (RFC 3339, ms).
    pub wall_time: String,
    /// Capture wall time, ns.
    pub wall_ns: i64,
    /// When the store received it (RFC 3339, ms).
    pub received_at: String,
    /// Completeness.
    pub completeness: String,
    /// Key that shipped it.
    pub key_id: String,
    /// Stored bytes.
    pub size: i64,
}

/// A history query, already validated.
#[derive(Debug, Clone, Default)]
pub struct HistoryQuery {
    /// Exact subject key (used when the full identity is known).
    pub subject_key: Option<String>,
    /// Kind.
    pub kind: String,
    /// Locator value (required without `subject_key`).
    pub locator: String,
    /// PID (process/thread).
    pub pid: Option<i64>,
    /// Other identity fields to match exactly.
    pub filters: Vec<(String, String)>,
    /// Keyset cursor: strictly older than (wall_ns, digest).
    pub before: Option<(i64, String)>,
    /// Page size.
    pub limit: i64,
}

/// One unknown in the fleet view.
#[derive(Debug, Clone, Serialize)]
pub struct FleetUnknown {
    /// Envelope that carries it.
    pub digest: String,
    /// Subject key.
    pub subject_key: String,
    /// Subject kind.
    pub kind: String,
    /// Flattened identity.
    pub identity: serde_json::Value,
    /// Capture time of that envelope.
    pub wall_time: String,
    /// Whether it is still open (carried by the subject's newest envelope).
    pub open: bool,
    /// The question.
    pub question: String,
    /// The transition it blocks.
    pub blocks: String,
    /// Who answers it.
    pub owner: String,
    /// The probe that answers it.
    pub probe: String,
    /// Surface whose failure raised it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub surface: Option<String>,
}

/// Validate history query parameters into a [`HistoryQuery`]. `params` are the
/// identity fields given (everything but `kind`, `limit`, `before`).
pub fn history_query(
    kind: &str,
    params: &BTreeMap<String, String>,
    before: Option<(i64, String)>,
    limit: i64,
) -> Result<HistoryQuery, String> {
    let fields = identity_fields(kind).ok_or_else(|| format!("unknown subject kind {kind:?}"))?;
    for name in params.keys() {
        if !fields.contains(&name.as_str()) {
            return Err(format!(
                "{name:?} is not an identity field of a {kind} subject (fields: {})",
                fields.join(", ")
            ));
        }
    }
    let locator = locator_field(kind).unwrap_or("host");
    let Some(loc) = params.get(locator) else {
        return Err(format!("a {kind} history needs {locator}="));
    };
    let pid = match params.get("pid") {
        Some(p) => Some(
            p.parse::<i64>()
                .map_err(|_| format!("pid {p:?} is not an integer"))?,
        ),
        None if matches!(kind, "process" | "thread") => {
            return Err(format!(
                "a {kind} history needs pid= (a host alone names no process)"
            ));
        }
        None => None,
    };
    let required: Vec<&str> = fields.iter().copied().filter(|f| *f != "net_ns").collect();
    let full = required.iter().all(|f| params.contains_key(*f))
        && (kind != "network_stream" || params.contains_key("net_ns"));
    let subject_key = full.then(|| {
        let map: BTreeMap<&str, &str> = params
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        subject_key(kind, &serde_json::to_string(&map).unwrap_or_default())
    });
    let filters = params
        .iter()
        .filter(|(k, _)| k.as_str() != locator && k.as_str() != "pid")
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    Ok(HistoryQuery {
        subject_key,
        kind: kind.to_string(),
        locator: loc.clone(),
        pid,
        filters,
        before,
        limit,
    })
}

impl Store {
    /// The exact stored bytes of an envelope.
    pub async fn envelope_bytes(&self, digest: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let row: Option<(Vec<u8>, i64)> = with_pool!(self, read, |pool, pg| {
            sqlx::query_as("SELECT body, body_codec FROM envelopes WHERE digest = $1")
                .bind(digest)
                .fetch_optional(pool)
                .await?
        });
        row.map(|(body, codec)| super::body::decode(digest, codec, body))
            .transpose()
    }

    /// A stored envelope, parsed.
    pub async fn envelope(
        &self,
        digest: &str,
    ) -> Result<Option<pstack_envelope::Envelope>, StoreError> {
        let Some(bytes) = self.envelope_bytes(digest).await? else {
            return Ok(None);
        };
        pstack_envelope::parse(&bytes)
            .map(|(e, _)| Some(e))
            .map_err(|e| StoreError::Corrupt {
                digest: digest.into(),
                reason: e.to_string(),
            })
    }

    /// Number of stored envelopes (exact; scans on large stores).
    pub async fn count_envelopes(&self) -> Result<i64, StoreError> {
        with_pool!(self, read, |pool, pg| {
            Ok(
                sqlx::query_scalar::<_, i64>("SELECT COUNT(*) FROM envelopes")
                    .fetch_one(pool)
                    .await?,
            )
        })
    }

    /// Digests stored, sorted (for tests and tools).
    pub async fn all_digests(&self) -> Result<Vec<String>, StoreError> {
        with_pool!(self, read, |pool, pg| {
            Ok(
                sqlx::query_scalar::<_, String>("SELECT digest FROM envelopes ORDER BY digest")
                    .fetch_all(pool)
                    .await?,
            )
        })
    }

    /// One page of a subject history, newest first.
    pub async fn history(&self, q: &HistoryQuery) -> Result<Vec<EnvelopeSummary>, StoreError> {
        // There is no index on subject_key (a random key would dirty one more
        // index page per envelope at ingest): an exact subject is found
        // through the (kind, locator, pid, wall_ns) index, narrowed by key.
        let mut q = q.clone();
        if let Some(key) = &q.subject_key
            && q.locator.is_empty()
        {
            let row: Option<(String, String)> = with_pool!(self, read, |pool, pg| {
                sqlx::query_as("SELECT kind, identity FROM subjects WHERE subject_key = $1")
                    .bind(key.as_str())
                    .fetch_optional(pool)
                    .await?
            });
            let Some((kind, identity)) = row else {
                return Ok(Vec::new());
            };
            let fields: BTreeMap<String, String> =
                serde_json::from_str(&identity).unwrap_or_default();
            q.locator = locator_field(&kind)
                .and_then(|l| fields.get(l).cloned())
                .unwrap_or_default();
            q.pid = fields.get("pid").and_then(|p| p.parse().ok());
            q.kind = kind;
        }
        let mut binds: Vec<Bind<'_>> = Vec::new();
        let mut sql = String::from(
            "SELECT digest, subject_key, kind, identity, wall_ns, received_ns, completeness, key_id, size
             FROM envelopes WHERE ",
        );
        let pg = self.backend() == Backend::Postgres;
        binds.push(Bind::Str(q.kind.clone()));
        binds.push(Bind::Str(q.locator.clone()));
        sql.push_str("kind = $1 AND locator = $2");
        match q.pid {
            Some(pid) => {
                binds.push(Bind::I64(pid));
                sql.push_str(&format!(" AND pid = ${}", binds.len()));
            }
            None => sql.push_str(" AND pid IS NULL"),
        }
        if let Some(key) = &q.subject_key {
            binds.push(Bind::Str(key.clone()));
            sql.push_str(&format!(" AND subject_key = ${}", binds.len()));
        } else {
            for (field, value) in &q.filters {
                if pg {
                    binds.push(Bind::Str(field.clone()));
                    sql.push_str(&format!(" AND (identity::jsonb ->> ${})", binds.len()));
                } else {
                    binds.push(Bind::Str(format!("$.\"{field}\"")));
                    sql.push_str(&format!(" AND json_extract(identity, ${})", binds.len()));
                }
                binds.push(Bind::Str(value.clone()));
                sql.push_str(&format!(" = ${}", binds.len()));
            }
        }
        if let Some((wall, digest)) = &q.before {
            binds.push(Bind::I64(*wall));
            let w = binds.len();
            binds.push(Bind::Str(digest.clone()));
            let d = binds.len();
            sql.push_str(&format!(
                " AND (wall_ns < ${w} OR (wall_ns = ${w} AND digest < ${d}))"
            ));
        }
        binds.push(Bind::I64(q.limit));
        sql.push_str(&format!(
            " ORDER BY wall_ns DESC, digest DESC LIMIT ${}",
            binds.len()
        ));
        with_pool!(self, read, |pool, pg| {
            let rows = bind_all!(sqlx::query(&sql), &binds).fetch_all(pool).await?;
            rows.iter()
                .map(|r| {
                    let wall_ns: i64 = r.try_get(4)?;
                    let received_ns: i64 = r.try_get(5)?;
                    Ok(EnvelopeSummary {
                        digest: r.try_get(0)?,
                        subject_key: r.try_get(1)?,
                        kind: r.try_get(2)?,
                        identity: parse_identity(&r.try_get::<String, _>(3)?),
                        wall_time: format_ns(wall_ns),
                        wall_ns,
                        received_at: format_ns(received_ns),
                        completeness: r.try_get(6)?,
                        key_id: r.try_get(7)?,
                        size: r.try_get(8)?,
                    })
                })
                .collect::<Result<Vec<_>, StoreError>>()
        })
    }

    /// Unknowns across the fleet: `open_only` gives those carried by each
    /// subject's newest envelope; otherwise every unknown ever stored, marked.
    pub async fn unknowns(
        &self,
        open_only: bool,
        owner: Option<&str>,
        limit: i64,
        offset: i64,
    ) -> Result<Vec<FleetUnknown>, StoreError> {
        let mut binds = Vec::new();
        let mut sql = if open_only {
            String::from(
                "SELECT u.digest, s.subject_key, s.kind, s.identity, s.latest_wall_ns, 1,
                        u.question, u.blocks, u.owner, u.probe, u.surface
                 FROM subjects s JOIN unknowns u ON u.digest = s.latest_digest WHERE 1 = 1",
            )
        } else {
            String::from(
                "SELECT u.digest, e.subject_key, e.kind, e.identity, e.wall_ns,
                        CASE WHEN s.subject_key IS NULL THEN 0 ELSE 1 END,
                        u.question, u.blocks, u.owner, u.probe, u.surface
                 FROM unknowns u JOIN envelopes e ON e.digest = u.digest
                 LEFT JOIN subjects s ON s.latest_digest = u.digest WHERE 1 = 1",
            )
        };
        if let Some(owner) = owner {
            binds.push(Bind::Str(owner.to_string()));
            sql.push_str(&format!(" AND u.owner = ${}", binds.len()));
        }
        let order = if open_only {
            "s.latest_wall_ns"
        } else {
            "e.wall_ns"
        };
        binds.push(Bind::I64(limit));
        binds.push(Bind::I64(offset));
        sql.push_str(&format!(
            " ORDER BY {order} DESC, u.digest, u.ord LIMIT ${} OFFSET ${}",
            binds.len() - 1,
            binds.len()
        ));
        with_pool!(self, read, |pool, pg| {
            let rows = bind_all!(sqlx::query(&sql), &binds).fetch_all(pool).await?;
            rows.iter()
                .map(|r| {
                    Ok(FleetUnknown {
                        digest: r.try_get(0)?,
                        subject_key: r.try_get(1)?,
                        kind: r.try_get(2)?,
                        identity: parse_identity(&r.try_get::<String, _>(3)?),
                        wall_time: format_ns(r.try_get(4)?),
                        open: r.try_get::<i32, _>(5)? != 0,
                        question: r.try_get(6)?,
                        blocks: r.try_get(7)?,
                        owner: r.try_get(8)?,
                        probe: r.try_get(9)?,
                        surface: r.try_get(10)?,
                    })
                })
                .collect::<Result<Vec<_>, StoreError>>()
        })
    }

    // ---- API keys ----
}
