//! Storage of human operators and their sessions (see `crate::operators`).
//!
//! Invariants: only argon2id PHC strings and SHA-256 hashes of session ids
//! are stored; an expired session never authenticates (checked in the
//! query) and is deleted when next presented.

use super::{Pools, Store, StoreError};

/// A live session: (username, CSRF token).
pub type SessionInfo = (String, String);

impl Store {
    /// Create an operator; `false` if the name exists.
    pub async fn create_operator(
        &self,
        username: &str,
        password_hash: &str,
        now_ns: i64,
    ) -> Result<bool, StoreError> {
        let r = with_pool!(self, write, |pool, pg| {
            sqlx::query(
                "INSERT INTO operators (username, password_hash, created_ns) VALUES ($1, $2, $3)",
            )
            .bind(username)
            .bind(password_hash)
            .bind(now_ns)
            .execute(pool)
            .await
            .map(|_| ())
            .map_err(StoreError::from)
        });
        match r {
            Ok(()) => Ok(true),
            Err(e) if e.is_unique_violation() => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// An operator's PHC string.
    pub async fn operator_hash(&self, username: &str) -> Result<Option<String>, StoreError> {
        with_pool!(self, read, |pool, pg| {
            Ok(
                sqlx::query_scalar("SELECT password_hash FROM operators WHERE username = $1")
                    .bind(username)
                    .fetch_optional(pool)
                    .await?,
            )
        })
    }

    /// Store a session.
    pub async fn create_session(
        &self,
        id_hash: &str,
        username: &str,
        csrf: &str,
        now_ns: i64,
        expires_ns: i64,
    ) -> Result<(), StoreError> {
        with_pool!(self, write, |pool, pg| {
            sqlx::query(
                "INSERT INTO operator_sessions (id_hash, username, csrf_token, created_ns, expires_ns)
                 VALUES ($1, $2, $3, $4, $5)",
            )
            .bind(id_hash)
            .bind(username)
            .bind(csrf)
            .bind(now_ns)
            .bind(expires_ns)
            .execute(pool)
            .await?;
            Ok(())
        })
    }

    /// The live session with this id hash.
    pub async fn session(
        &self,
        id_hash: &str,
        now_ns: i64,
    ) -> Result<Option<SessionInfo>, StoreError> {
        with_pool!(self, read, |pool, pg| {
            Ok(sqlx::query_as(
                "SELECT username, csrf_token FROM operator_sessions WHERE id_hash = $1 AND expires_ns > $2",
            )
            .bind(id_hash)
            .bind(now_ns)
            .fetch_optional(pool)
            .await?)
        })
    }

    /// End a session (logout), and drop every expired one.
    pub async fn delete_session(&self, id_hash: &str, now_ns: i64) -> Result<(), StoreError> {
        with_pool!(self, write, |pool, pg| {
            sqlx::query("DELETE FROM operator_sessions WHERE id_hash = $1 OR expires_ns <= $2")
                .bind(id_hash)
                .bind(now_ns)
                .execute(pool)
                .await?;
            Ok(())
        })
    }
}
