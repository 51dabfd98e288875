//! Storage of API keys.
//!
//! Invariants:
//! - Only a key's hash is stored; the plaintext exists only in the
//!   [`crate::keys::NewKey`] returned once by [`Store::create_key`].
//! - A presented key is checked by its id, then its hash compared in
//!   constant time ([`crate::keys::hashes_equal`]); a revoked key stays
//!   recognised as revoked (never as unknown).
//! - A key holds at least one scope.

use serde::Serialize;
use sqlx::Row;

use super::{Pools, Store, StoreError};
use crate::ident::format_ns;
use crate::keys;

/// An API key as listed (never its hash).
#[derive(Debug, Clone, Serialize)]
pub struct KeyInfo {
    /// Public id.
    pub id: String,
    /// Name given at creation.
    pub name: String,
    /// Created at (RFC 3339).
    pub created_at: String,
    /// Revoked at, if revoked.
    pub revoked_at: Option<String>,
    /// What it may do (`legacy`: every scope; see [`crate::keys::Scope`]).
    pub scopes: Vec<&'static str>,
}

/// Outcome of authenticating a presented key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyCheck {
    /// Valid and live: the key id and its scopes.
    Valid(String, keys::ScopeSet),
    /// Matches a revoked key.
    Revoked(String),
    /// Matches nothing.
    Unknown,
}

impl Store {
    /// Create a key holding `scopes`; returns its id and the plaintext
    /// (shown once).
    pub async fn create_key(
        &self,
        name: &str,
        scopes: &keys::ScopeSet,
    ) -> Result<keys::NewKey, StoreError> {
        if scopes.is_empty() {
            return Err(StoreError::NoScopes);
        }
        let key = keys::generate()?;
        with_pool!(self, write, |pool, pg| {
            sqlx::query(
                "INSERT INTO api_keys (id, name, key_hash, created_ns, scopes) VALUES ($1, $2, $3, $4, $5)",
            )
            .bind(key.id.as_str())
            .bind(name)
            .bind(key.hash.as_str())
            .bind(crate::now_ns())
            .bind(scopes.to_stored())
            .execute(pool)
            .await?;
            Ok::<(), StoreError>(())
        })?;
        Ok(key)
    }

    /// Every key, oldest first.
    pub async fn list_keys(&self) -> Result<Vec<KeyInfo>, StoreError> {
        with_pool!(self, read, |pool, pg| {
            let rows = sqlx::query(
                "SELECT id, name, created_ns, revoked_ns, scopes FROM api_keys ORDER BY created_ns, id",
            )
            .fetch_all(pool)
            .await?;
            rows.iter()
                .map(|r| {
                    Ok(KeyInfo {
                        id: r.try_get(0)?,
                        name: r.try_get(1)?,
                        created_at: format_ns(r.try_get(2)?),
                        revoked_at: r.try_get::<Option<i64>, _>(3)?.map(format_ns),
                        scopes: keys::ScopeSet::from_stored(&r.try_get::<String, _>(4)?)
                            .0
                            .names(),
                    })
                })
                .collect::<Result<Vec<_>, StoreError>>()
        })
    }

    /// Revoke a key (idempotent); effective on the next request.
    pub async fn revoke_key(&self, id: &str) -> Result<(), StoreError> {
        let n = with_pool!(self, write, |pool, pg| {
            sqlx::query("UPDATE api_keys SET revoked_ns = COALESCE(revoked_ns, $1) WHERE id = $2")
                .bind(crate::now_ns())
                .bind(id)
                .execute(pool)
                .await?
                .rows_affected()
        });
        if n == 0 {
            return Err(StoreError::NoSuchKey(id.into()));
        }
        Ok(())
    }

    /// Replace a key's scopes (narrow a `legacy` key, or widen one);
    /// effective on its next request. Returns (before, after).
    pub async fn set_key_scopes(
        &self,
        id: &str,
        scopes: &keys::ScopeSet,
    ) -> Result<(keys::ScopeSet, keys::ScopeSet), StoreError> {
        if scopes.is_empty() {
            return Err(StoreError::NoScopes);
        }
        let before: Option<String> = with_pool!(self, write, |pool, pg| {
            let mut tx = begin_write!(pool, pg);
            let before: Option<String> =
                sqlx::query_scalar("SELECT scopes FROM api_keys WHERE id = $1")
                    .bind(id)
                    .fetch_optional(&mut *tx)
                    .await?;
            sqlx::query("UPDATE api_keys SET scopes = $1 WHERE id = $2")
                .bind(scopes.to_stored())
                .bind(id)
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
            before
        });
        let Some(before) = before else {
            return Err(StoreError::NoSuchKey(id.into()));
        };
        Ok((keys::ScopeSet::from_stored(&before).0, scopes.clone()))
    }

    /// Check a presented key: valid ones come back with their scopes.
    pub async fn check_key(&self, presented: &str) -> Result<KeyCheck, StoreError> {
        let Ok(id) = keys::parse_id(presented) else {
            return Ok(KeyCheck::Unknown);
        };
        let row: Option<(String, Option<i64>, String)> = with_pool!(self, read, |pool, pg| {
            sqlx::query_as("SELECT key_hash, revoked_ns, scopes FROM api_keys WHERE id = $1")
                .bind(id)
                .fetch_optional(pool)
                .await?
        });
        let Some((hash, revoked, scopes)) = row else {
            return Ok(KeyCheck::Unknown);
        };
        if !keys::hashes_equal(&keys::hash_key(presented), &hash) {
            return Ok(KeyCheck::Unknown);
        }
        Ok(match revoked {
            Some(_) => KeyCheck::Revoked(id.to_string()),
            None => {
                let (set, unknown) = keys::ScopeSet::from_stored(&scopes);
                if !unknown.is_empty() {
                    tracing::warn!(key_id = id, unknown = ?unknown, "stored key scopes this store does not know grant nothing");
                }
                KeyCheck::Valid(id.to_string(), set)
            }
        })
    }

    // ---- receipts ----
}
