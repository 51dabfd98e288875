//! One gate key for every replica on a database.
//!
//! A grant minted on one replica is checked on whichever replica the
//! runner's claim reaches (the token's keyed hash), and a callback sealed on
//! one is opened on whichever replica the operator approves on. Replicas
//! with different keys fail both silently and late: `403
//! invalid_grant_token` for a valid token, a callback that never opens.
//!
//! Invariants:
//! - The database records the fingerprint ([`GateKeys::fingerprint`]) of
//!   the first key a `serve` started with from a key file; the first
//!   recorder wins atomically (`crate::db::gate_key`).
//! - Every `serve` compares its key with the recorded one before it binds
//!   its port: a different key refuses to start, naming both fingerprints
//!   and the fix ([`SharedKeyError::Mismatch`]).
//! - A run without a key file (a random key of this run only) records
//!   nothing, and refuses to start when a fingerprint is recorded: the
//!   database holds grants and callbacks it could not honour.
//! - Only `pstack-store gate-key adopt` replaces a recorded fingerprint.

use super::keys::GateKeys;
use crate::db::{Store, StoreError};

/// Where this run's gate key came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeySource {
    /// `--gate-key-file`.
    File,
    /// A random key of this run only (no key file).
    Ephemeral,
}

/// How this run's key stands with the database's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyAgreement {
    /// No key was recorded; this run recorded its own.
    Recorded,
    /// The recorded key is this run's.
    Matches,
    /// An ephemeral key and nothing recorded: a single process may run so.
    Unrecorded,
}

/// Why a replica may not serve with its key.
#[derive(Debug, thiserror::Error)]
pub enum SharedKeyError {
    /// The database could not be read or written.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The key differs from the recorded one.
    #[error("{}", mismatch_message(recorded, ours, *ours_from))]
    Mismatch {
        /// The recorded fingerprint.
        recorded: String,
        /// This run's key's fingerprint.
        ours: String,
        /// Where this run's key came from.
        ours_from: KeySource,
    },
}

fn mismatch_message(recorded: &str, ours: &str, from: KeySource) -> String {
    let what = match from {
        KeySource::File => format!("this replica's gate key (--gate-key-file, fingerprint {ours})"),
        KeySource::Ephemeral => {
            format!("no --gate-key-file was given: this run's random gate key (fingerprint {ours})")
        }
    };
    format!(
        "{what} is not the key this database's grants and sealed webhook callbacks are made under \
         (fingerprint {recorded}, recorded by the first replica); refusing to start. Start every \
         replica with the same --gate-key-file (`pstack-store gate-key show --gate-key-file PATH` \
         prints a file's fingerprint). If the key was replaced on purpose: stop every replica, run \
         `pstack-store gate-key adopt --gate-key-file PATH` once, then start them with that file \
         (grants and stored callbacks made under the old key stop working)"
    )
}

/// Compare this run's key with the database's, recording it if none is
/// recorded and it comes from a file.
pub async fn check(
    store: &Store,
    keys: &GateKeys,
    from: KeySource,
    now_ns: i64,
) -> Result<KeyAgreement, SharedKeyError> {
    let ours = keys.fingerprint();
    let recorded = match from {
        KeySource::File => {
            let (inserted, r) = store.record_gate_key_fingerprint(ours, now_ns).await?;
            if inserted {
                return Ok(KeyAgreement::Recorded);
            }
            r
        }
        KeySource::Ephemeral => match store.gate_key_fingerprint().await? {
            Some(r) => r,
            None => return Ok(KeyAgreement::Unrecorded),
        },
    };
    if recorded.fingerprint == ours {
        Ok(KeyAgreement::Matches)
    } else {
        Err(SharedKeyError::Mismatch {
            recorded: recorded.fingerprint,
            ours: ours.to_string(),
            ours_from: from,
        })
    }
}
