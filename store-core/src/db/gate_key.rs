//! Storage of the gate key's fingerprint (see `crate::gate::shared_key`).
//!
//! Invariants: the table holds at most one row (`id = 1`); the first
//! recorder wins atomically (`INSERT … ON CONFLICT DO NOTHING`, then the row
//! is read back), so two replicas starting together with different keys
//! cannot both record theirs. Only an explicit [`Store::replace_gate_key_fingerprint`]
//! (`pstack-store gate-key adopt`) changes a recorded fingerprint.

use super::{Pools, Store, StoreError};

/// The recorded fingerprint and when it was recorded (ns since the epoch).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedGateKey {
    /// The fingerprint (`crate::gate::keys::GateKeys::fingerprint`).
    pub fingerprint: String,
    /// When the first replica recorded it.
    pub recorded_ns: i64,
}

impl Store {
    /// The recorded gate key fingerprint, if any.
    pub async fn gate_key_fingerprint(&self) -> Result<Option<RecordedGateKey>, StoreError> {
        with_pool!(self, read, |pool, pg| {
            let row: Option<(String, i64)> =
                sqlx::query_as("SELECT fingerprint, recorded_ns FROM gate_key WHERE id = 1")
                    .fetch_optional(pool)
                    .await?;
            Ok(row.map(|(fingerprint, recorded_ns)| RecordedGateKey {
                fingerprint,
                recorded_ns,
            }))
        })
    }

    /// Record `fingerprint` unless one is recorded: whether this call
    /// recorded it, and the recorded one after (ours if we were first, else
    /// the other replica's).
    pub async fn record_gate_key_fingerprint(
        &self,
        fingerprint: &str,
        now_ns: i64,
    ) -> Result<(bool, RecordedGateKey), StoreError> {
        with_pool!(self, write, |pool, pg| {
            let inserted = sqlx::query(
                "INSERT INTO gate_key (id, fingerprint, recorded_ns) VALUES (1, $1, $2)
                 ON CONFLICT (id) DO NOTHING",
            )
            .bind(fingerprint)
            .bind(now_ns)
            .execute(pool)
            .await?
            .rows_affected()
                == 1;
            let (fingerprint, recorded_ns): (String, i64) =
                sqlx::query_as("SELECT fingerprint, recorded_ns FROM gate_key WHERE id = 1")
                    .fetch_one(pool)
                    .await?;
            Ok((
                inserted,
                RecordedGateKey {
                    fingerprint,
                    recorded_ns,
                },
            ))
        })
    }

    /// Record `fingerprint` in place of whatever is recorded (a deliberate
    /// key replacement); the fingerprint it replaced, if any.
    pub async fn replace_gate_key_fingerprint(
        &self,
        fingerprint: &str,
        now_ns: i64,
    ) -> Result<Option<String>, StoreError> {
        let before = self.gate_key_fingerprint().await?;
        with_pool!(self, write, |pool, pg| {
            sqlx::query(
                "INSERT INTO gate_key (id, fingerprint, recorded_ns) VALUES (1, $1, $2)
                 ON CONFLICT (id) DO UPDATE SET fingerprint = excluded.fingerprint,
                                                recorded_ns = excluded.recorded_ns",
            )
            .bind(fingerprint)
            .bind(now_ns)
            .execute(pool)
            .await?;
            Ok(before.map(|b| b.fingerprint))
        })
    }
}
