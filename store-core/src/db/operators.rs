//! Storage of human operators and their sessions (see `crate::operators`).
//!
//! Invariants: only argon2id PHC strings and SHA-256 hashes of session ids
//! and of CSRF tokens are stored; an expired session, or one of a disabled
//! operator, never authenticates (checked in the query); an expired session
//! is deleted when next presented. Disabling an operator, changing their
//! password and revoking their sessions each delete every session of that
//! operator in the same transaction as the change.

use super::{Pools, Store, StoreError};

/// A live session: (username, SHA-256 of its CSRF token).
pub type SessionInfo = (String, String);

/// What became of a change to a named operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OperatorChange {
    /// Done; this many sessions were ended.
    Done {
        /// Sessions deleted.
        sessions_ended: u64,
    },
    /// No operator has that name.
    NoSuchOperator,
}

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
        Ok(self.operator_login(username).await?.map(|(h, _)| h))
    }

    /// An operator's PHC string and whether they are disabled.
    pub async fn operator_login(
        &self,
        username: &str,
    ) -> Result<Option<(String, bool)>, StoreError> {
        let row: Option<(String, Option<i64>)> = with_pool!(self, read, |pool, pg| {
            sqlx::query_as("SELECT password_hash, disabled_ns FROM operators WHERE username = $1")
                .bind(username)
                .fetch_optional(pool)
                .await?
        });
        Ok(row.map(|(h, d)| (h, d.is_some())))
    }

    /// Disable (`disabled`) or re-enable an operator. Disabling ends every
    /// session of theirs.
    pub async fn set_operator_disabled(
        &self,
        username: &str,
        disabled: bool,
        now_ns: i64,
    ) -> Result<OperatorChange, StoreError> {
        with_pool!(self, write, |pool, pg| {
            let mut tx = pool.begin().await?;
            let found = sqlx::query(
                "UPDATE operators SET disabled_ns = CASE WHEN $2 THEN COALESCE(disabled_ns, $3) END
                 WHERE username = $1",
            )
            .bind(username)
            .bind(disabled)
            .bind(now_ns)
            .execute(&mut *tx)
            .await?
            .rows_affected();
            if found == 0 {
                return Ok(OperatorChange::NoSuchOperator);
            }
            let ended = if disabled {
                sqlx::query("DELETE FROM operator_sessions WHERE username = $1")
                    .bind(username)
                    .execute(&mut *tx)
                    .await?
                    .rows_affected()
            } else {
                0
            };
            tx.commit().await?;
            Ok(OperatorChange::Done {
                sessions_ended: ended,
            })
        })
    }

    /// Replace an operator's password hash and end every session of theirs.
    pub async fn set_operator_password(
        &self,
        username: &str,
        password_hash: &str,
    ) -> Result<OperatorChange, StoreError> {
        with_pool!(self, write, |pool, pg| {
            let mut tx = pool.begin().await?;
            let found = sqlx::query("UPDATE operators SET password_hash = $2 WHERE username = $1")
                .bind(username)
                .bind(password_hash)
                .execute(&mut *tx)
                .await?
                .rows_affected();
            if found == 0 {
                return Ok(OperatorChange::NoSuchOperator);
            }
            let ended = sqlx::query("DELETE FROM operator_sessions WHERE username = $1")
                .bind(username)
                .execute(&mut *tx)
                .await?
                .rows_affected();
            tx.commit().await?;
            Ok(OperatorChange::Done {
                sessions_ended: ended,
            })
        })
    }

    /// End every session of an operator.
    pub async fn revoke_operator_sessions(
        &self,
        username: &str,
    ) -> Result<OperatorChange, StoreError> {
        with_pool!(self, write, |pool, pg| {
            let mut tx = pool.begin().await?;
            let found: Option<String> =
                sqlx::query_scalar("SELECT username FROM operators WHERE username = $1")
                    .bind(username)
                    .fetch_optional(&mut *tx)
                    .await?;
            if found.is_none() {
                return Ok(OperatorChange::NoSuchOperator);
            }
            let ended = sqlx::query("DELETE FROM operator_sessions WHERE username = $1")
                .bind(username)
                .execute(&mut *tx)
                .await?
                .rows_affected();
            tx.commit().await?;
            Ok(OperatorChange::Done {
                sessions_ended: ended,
            })
        })
    }

    /// Operators: (name, created ns, disabled ns, live sessions).
    pub async fn list_operators(
        &self,
        now_ns: i64,
    ) -> Result<Vec<(String, i64, Option<i64>, i64)>, StoreError> {
        with_pool!(self, read, |pool, pg| {
            Ok(sqlx::query_as(
                "SELECT o.username, o.created_ns, o.disabled_ns,
                        (SELECT COUNT(*) FROM operator_sessions s
                          WHERE s.username = o.username AND s.expires_ns > $1)
                 FROM operators o ORDER BY o.username",
            )
            .bind(now_ns)
            .fetch_all(pool)
            .await?)
        })
    }

    /// Store a session (its id and CSRF token only as hashes).
    pub async fn create_session(
        &self,
        id_hash: &str,
        username: &str,
        csrf_hash: &str,
        now_ns: i64,
        expires_ns: i64,
    ) -> Result<(), StoreError> {
        with_pool!(self, write, |pool, pg| {
            sqlx::query(
                "INSERT INTO operator_sessions (id_hash, username, csrf_hash, created_ns, expires_ns)
                 VALUES ($1, $2, $3, $4, $5)",
            )
            .bind(id_hash)
            .bind(username)
            .bind(csrf_hash)
            .bind(now_ns)
            .bind(expires_ns)
            .execute(pool)
            .await?;
            Ok(())
        })
    }

    /// The live session with this id hash, if its operator is enabled.
    pub async fn session(
        &self,
        id_hash: &str,
        now_ns: i64,
    ) -> Result<Option<SessionInfo>, StoreError> {
        with_pool!(self, read, |pool, pg| {
            Ok(sqlx::query_as(
                "SELECT s.username, s.csrf_hash FROM operator_sessions s
                 JOIN operators o ON o.username = s.username
                 WHERE s.id_hash = $1 AND s.expires_ns > $2 AND o.disabled_ns IS NULL",
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
