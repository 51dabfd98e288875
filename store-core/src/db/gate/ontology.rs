//! The ontology: the current state of each service target, as the change
//! ledger set it, and the compare-and-swap of a proposal's expected state
//! against it.
//!
//! Invariants:
//! - An older change (by effective time) never overwrites a newer one; a
//!   field a change does not carry keeps its value ([`ontology_upsert`]).
//! - An unknown state never satisfies a CAS: a field the target does not
//!   record reads as `null` and mismatches ([`cas_mismatches`]).

use serde_json::Value;
use sqlx::Row;

use super::parse_json;
use crate::analysis::ledger::NewChange;
use crate::db::{Pools, Store, StoreError};

/// Ontology node key of a service target.
pub fn service_node_key(environment: &str, service: &str) -> String {
    format!("service:{environment}/{service}")
}

/// The current state of one target, as the change ledger set it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct OntologyNode {
    /// Node key.
    pub node_key: String,
    /// `service`.
    pub kind: String,
    /// Environment.
    pub environment: String,
    /// Service name.
    pub name: String,
    /// Live version.
    pub version: Option<String>,
    /// Live commit.
    pub commit_sha: Option<String>,
    /// Live config digest.
    pub config_digest: Option<String>,
    /// Feature-flag values (JSON object).
    pub flags: Value,
    /// The change that last set it.
    pub last_change_id: String,
    /// That change's effective time, ns.
    pub changed_ns: i64,
}

impl Store {
    /// One ontology node.
    pub async fn ontology_node(&self, key: &str) -> Result<Option<OntologyNode>, StoreError> {
        with_pool!(self, read, |pool, pg| {
            let row = sqlx::query(
                "SELECT node_key, kind, environment, name, version, commit_sha, config_digest,
                        flags, last_change_id, changed_ns
                 FROM ontology_nodes WHERE node_key = $1",
            )
            .bind(key)
            .fetch_optional(pool)
            .await?;
            match row {
                None => Ok(None),
                Some(r) => Ok(Some(OntologyNode {
                    node_key: r.try_get("node_key")?,
                    kind: r.try_get("kind")?,
                    environment: r.try_get("environment")?,
                    name: r.try_get("name")?,
                    version: r.try_get("version")?,
                    commit_sha: r.try_get("commit_sha")?,
                    config_digest: r.try_get("config_digest")?,
                    flags: parse_json(&r.try_get::<String, _>("flags")?),
                    last_change_id: r.try_get("last_change_id")?,
                    changed_ns: r.try_get("changed_ns")?,
                })),
            }
        })
    }
}

/// Each field of `expected` that differs from `current`: (field, expected,
/// actual). A field the target does not record reads as `null`, so it
/// mismatches: an unknown state never satisfies a CAS.
pub fn cas_mismatches(expected: &Value, current: &Value) -> Vec<(String, Value, Value)> {
    let mut out = Vec::new();
    if let Some(map) = expected.as_object() {
        for (k, want) in map {
            if k == "flags"
                && let Some(flags) = want.as_object()
            {
                // Flag by flag: only the named flags must hold.
                for (name, want) in flags {
                    let have = current
                        .get("flags")
                        .and_then(|f| f.get(name))
                        .cloned()
                        .unwrap_or(Value::Null);
                    if have.is_null() || &have != want {
                        out.push((format!("flags.{name}"), want.clone(), have));
                    }
                }
                continue;
            }
            let have = current.get(k).cloned().unwrap_or(Value::Null);
            if have.is_null() || &have != want {
                out.push((k.clone(), want.clone(), have));
            }
        }
    }
    out
}

/// The ontology upsert a service change implies: (node key, SQL) for the
/// change's transaction, or `None` for host changes. Fields the change does
/// not carry keep their value, flags merge one by one; an older change (by
/// effective time) never overwrites a newer one. Binds: node key,
/// environment, service, version, commit, config digest, change id,
/// effective ns, now ns, flags (JSON object text).
pub(in crate::db) fn ontology_upsert(c: &NewChange, pg: bool) -> Option<(String, String)> {
    let service = c.service.as_deref()?;
    if !crate::analysis::ledger::SERVICE_KINDS.contains(&c.kind.as_str()) {
        return None;
    }
    let merge = if pg {
        "(ontology_nodes.flags::jsonb || excluded.flags::jsonb)::text"
    } else {
        "json_patch(ontology_nodes.flags, excluded.flags)"
    };
    Some((
        service_node_key(&c.environment, service),
        format!(
            "INSERT INTO ontology_nodes (node_key, kind, environment, name, version, commit_sha,
                config_digest, last_change_id, changed_ns, updated_ns, flags)
             VALUES ($1, 'service', $2, $3, $4, $5, $6, $7, $8, $9, $10)
             ON CONFLICT (node_key) DO UPDATE SET
                version = COALESCE(excluded.version, ontology_nodes.version),
                commit_sha = COALESCE(excluded.commit_sha, ontology_nodes.commit_sha),
                config_digest = COALESCE(excluded.config_digest, ontology_nodes.config_digest),
                flags = {merge},
                last_change_id = excluded.last_change_id,
                changed_ns = excluded.changed_ns,
                updated_ns = excluded.updated_ns
             WHERE excluded.changed_ns >= ontology_nodes.changed_ns"
        ),
    ))
}
