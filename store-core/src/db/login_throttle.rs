//! Storage of the login throttle (policy and its reasons: `crate::login`).
//!
//! Invariants:
//! - One row per throttle key (`login_throttle`); every count changes by
//!   one atomic upsert that returns the new count, so replicas sharing one
//!   PostgreSQL database never lose or double an attempt, and the check and
//!   the charge are the same statement.
//! - A row whose window has passed counts as absent: the next upsert
//!   restarts it at 1.
//! - The table holds about `LoginLimits::max_entries` rows: every
//!   `evict_check_every` new rows (per process) it is counted, and past the
//!   bound the rows least worth keeping go (window passed, then fewest
//!   failures, oldest last failure first) down to 1/16 below it. Between
//!   checks it may overshoot by `evict_check_every` rows per replica.
//!   Nothing clears it. Both deletes walk an index (`window_start_ns`;
//!   `failures, last_ns`). SQLite at 100,000 rows on the shared dev VM: a
//!   sort of the whole table ~37 ms and a count 3–6 ms, each of which would
//!   have held the single writer on every new row; evicting 6,314 rows
//!   through the index ~230 ms with its commit, once per ~6,250 new rows.
//! - `operator_known_sources` holds, per operator, the sources of its
//!   successful logins (at most [`KNOWN_SOURCES_PER_OPERATOR`], newest
//!   kept); only a correct password writes it, so no failure can evict it.

use std::sync::atomic::{AtomicU64, Ordering};

use super::{Pools, Store, StoreError};
use crate::login::{
    ClientSource, LoginCharge, LoginLimits, ThrottleDimension, ThrottleKeys, ThrottleRefusal,
};

/// New throttle rows this process has made (paces the bound's check).
static NEW_ROWS: AtomicU64 = AtomicU64::new(0);

/// Sources remembered per operator.
pub const KNOWN_SOURCES_PER_OPERATOR: i64 = 16;

impl Store {
    /// Count one more attempt on `key`: (failures now, window start).
    async fn throttle_bump(
        &self,
        key: &str,
        limits: &LoginLimits,
        now_ns: i64,
    ) -> Result<(i64, i64), StoreError> {
        let expired_before = now_ns.saturating_sub(limits.window_ns);
        let row: (i64, i64) = with_pool!(self, write, |pool, pg| {
            sqlx::query_as(
                "INSERT INTO login_throttle (throttle_key, failures, window_start_ns, last_ns)
                 VALUES ($1, 1, $2, $2)
                 ON CONFLICT (throttle_key) DO UPDATE SET
                   failures = CASE WHEN login_throttle.window_start_ns <= $3 THEN 1
                                   ELSE login_throttle.failures + 1 END,
                   window_start_ns = CASE WHEN login_throttle.window_start_ns <= $3 THEN $2
                                          ELSE login_throttle.window_start_ns END,
                   last_ns = $2
                 RETURNING failures, window_start_ns",
            )
            .bind(key)
            .bind(now_ns)
            .bind(expired_before)
            .fetch_one(pool)
            .await?
        });
        if row.0 == 1 {
            // A new (or restarted) row: keep the table within its bound,
            // counting it only every `evict_check_every` new rows (a count
            // scans the table).
            let seen = NEW_ROWS.fetch_add(1, Ordering::Relaxed) + 1;
            if seen.is_multiple_of(limits.evict_check_every.max(1)) {
                self.evict_login_throttle(limits, now_ns).await?;
            }
        }
        Ok(row)
    }

    /// Bring the table back within `limits.max_entries`: first every row
    /// whose window has passed (it refuses nothing: the next attempt
    /// restarts it), then the fewest failures, oldest last failure first,
    /// down to 1/16 below the bound so the next checks find room.
    async fn evict_login_throttle(
        &self,
        limits: &LoginLimits,
        now_ns: i64,
    ) -> Result<(), StoreError> {
        let max = limits.max_entries.max(1);
        let n = self.login_throttle_rows().await?;
        if n <= max {
            return Ok(());
        }
        let expired_before = now_ns.saturating_sub(limits.window_ns);
        with_pool!(self, write, |pool, pg| {
            let expired = sqlx::query("DELETE FROM login_throttle WHERE window_start_ns <= $1")
                .bind(expired_before)
                .execute(pool)
                .await?
                .rows_affected();
            let over = n - i64::try_from(expired).unwrap_or(i64::MAX) - max;
            if over > 0 {
                // Walks the (failures, last_ns) index: no sort of the table.
                sqlx::query(
                    "DELETE FROM login_throttle WHERE throttle_key IN (
                       SELECT throttle_key FROM login_throttle
                       ORDER BY failures, last_ns
                       LIMIT $1)",
                )
                .bind(over + max / 16)
                .execute(pool)
                .await?;
            }
            Ok(())
        })
    }

    /// Rows in the throttle table.
    pub async fn login_throttle_rows(&self) -> Result<i64, StoreError> {
        with_pool!(self, write, |pool, pg| {
            Ok(sqlx::query_scalar("SELECT COUNT(*) FROM login_throttle")
                .fetch_one(pool)
                .await?)
        })
    }

    /// Failures counted on `key` in its current window (`None`: no row, or
    /// its window has passed).
    pub async fn login_throttle_failures(
        &self,
        key: &str,
        limits: &LoginLimits,
        now_ns: i64,
    ) -> Result<Option<i64>, StoreError> {
        with_pool!(self, write, |pool, pg| {
            Ok(sqlx::query_scalar(
                "SELECT failures FROM login_throttle WHERE throttle_key = $1 AND window_start_ns > $2",
            )
            .bind(key)
            .bind(now_ns.saturating_sub(limits.window_ns))
            .fetch_optional(pool)
            .await?)
        })
    }

    /// Whether `username` logged in successfully from `source` within
    /// `limits.known_source_ns`.
    pub async fn known_login_source(
        &self,
        username: &str,
        source: &ClientSource,
        limits: &LoginLimits,
        now_ns: i64,
    ) -> Result<bool, StoreError> {
        with_pool!(self, write, |pool, pg| {
            let n: Option<String> = sqlx::query_scalar(
                "SELECT source FROM operator_known_sources
                 WHERE username = $1 AND source = $2 AND last_success_ns > $3",
            )
            .bind(username)
            .bind(source.as_str())
            .bind(now_ns.saturating_sub(limits.known_source_ns))
            .fetch_optional(pool)
            .await?;
            Ok(n.is_some())
        })
    }

    /// Charge one login attempt of `username` from `source` before its
    /// password is verified; refused if a limit is past (see
    /// `crate::login`). Source first, then the name at the source, then the
    /// name from unknown sources; a refusal charges no later dimension.
    pub async fn charge_login(
        &self,
        username: &str,
        source: &ClientSource,
        limits: &LoginLimits,
        now_ns: i64,
    ) -> Result<LoginCharge, StoreError> {
        let keys = ThrottleKeys::new(username, source);
        let refuse = |dimension, limit, (_, start): (i64, i64)| LoginCharge {
            refused: Some(ThrottleRefusal {
                dimension,
                limit,
                retry_after_ns: (start + limits.window_ns - now_ns).max(1),
            }),
            name_charged: false,
        };
        let s = self.throttle_bump(&keys.source, limits, now_ns).await?;
        if s.0 > limits.source_failures {
            return Ok(refuse(ThrottleDimension::Source, limits.source_failures, s));
        }
        let p = self.throttle_bump(&keys.pair, limits, now_ns).await?;
        if p.0 > limits.pair_failures {
            return Ok(refuse(ThrottleDimension::Pair, limits.pair_failures, p));
        }
        if self
            .known_login_source(username, source, limits, now_ns)
            .await?
        {
            return Ok(LoginCharge {
                refused: None,
                name_charged: false,
            });
        }
        let n = self.throttle_bump(&keys.name, limits, now_ns).await?;
        if n.0 > limits.name_failures {
            return Ok(refuse(ThrottleDimension::Name, limits.name_failures, n));
        }
        Ok(LoginCharge {
            refused: None,
            name_charged: true,
        })
    }

    /// A correct password: refund the attempt's charge, forget the name's
    /// failures at this source, remember the source for the operator.
    pub async fn login_succeeded(
        &self,
        username: &str,
        source: &ClientSource,
        charge: &LoginCharge,
        now_ns: i64,
    ) -> Result<(), StoreError> {
        let keys = ThrottleKeys::new(username, source);
        let refund: Vec<&str> = if charge.name_charged {
            vec![keys.source.as_str(), keys.name.as_str()]
        } else {
            vec![keys.source.as_str()]
        };
        with_pool!(self, write, |pool, pg| {
            let mut tx = pool.begin().await?;
            for key in refund {
                sqlx::query(
                    "UPDATE login_throttle SET failures = failures - 1
                     WHERE throttle_key = $1 AND failures > 0",
                )
                .bind(key)
                .execute(&mut *tx)
                .await?;
            }
            sqlx::query("DELETE FROM login_throttle WHERE throttle_key = $1")
                .bind(&keys.pair)
                .execute(&mut *tx)
                .await?;
            sqlx::query(
                "INSERT INTO operator_known_sources (username, source, last_success_ns)
                 VALUES ($1, $2, $3)
                 ON CONFLICT (username, source) DO UPDATE SET last_success_ns = $3",
            )
            .bind(username)
            .bind(source.as_str())
            .bind(now_ns)
            .execute(&mut *tx)
            .await?;
            sqlx::query(
                "DELETE FROM operator_known_sources WHERE username = $1 AND source NOT IN (
                   SELECT source FROM operator_known_sources WHERE username = $1
                   ORDER BY last_success_ns DESC, source LIMIT $2)",
            )
            .bind(username)
            .bind(KNOWN_SOURCES_PER_OPERATOR)
            .execute(&mut *tx)
            .await?;
            tx.commit().await?;
            Ok(())
        })
    }
}
