//! The change ledger's storage: a validated change and its nodes, and
//! the reads of changes.
//!
//! Invariants:
//! - A change and its nodes are written in one transaction, with the
//!   ontology upsert the change implies (`crate::db::gate::ontology_upsert`).
//! - Ids are `chg_` + 16 random hex digits ([`super::new_id`]).

use sqlx::Row;

use super::{json_column, new_id};
use crate::analysis::ledger::{ChangeNode, ChangeRecord, NewChange, rfc3339};
use crate::db::{Bind, Pools, Store, StoreError, values_rows};

impl Store {
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
            if let Some((node_key, sql)) = crate::db::gate::ontology_upsert(c, pg) {
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
}
