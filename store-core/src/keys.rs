//! API keys: how nodes authenticate to the store.
//!
//! A key reads `psk_<id>_<secret>`: `id` is 16 lowercase hex digits (8 random
//! bytes) that name the key in listings, logs and the `key_id` recorded on
//! every envelope; `secret` is 64 hex digits (32 random bytes from the kernel's
//! CSPRNG). The store keeps only `sha256(whole key)`, never the key.
//!
//! Why SHA-256 and not a password hash (argon2, scrypt): slow hashes defend
//! *low-entropy* secrets against offline guessing. A 256-bit random secret
//! cannot be guessed whatever the hash speed, so a fast hash loses nothing and
//! keeps per-request authentication cheap (one indexed lookup, one hash, one
//! constant-time compare). A stolen database therefore yields no usable key.
//!
//! The plaintext key is shown once, by `pstack-store keys create`, and is never
//! logged. Revocation is immediate: every request looks its key up afresh.
//!
//! **Scopes.** Every key holds a set of [`Scope`]s matching who holds it, and
//! every route needs exactly one of them (the table is in `openapi.json`,
//! each operation's `security`): `ingest` for the nodes (envelopes only),
//! `telemetry` for CI/CD and collectors (changes, OTLP spans, alerts),
//! `analysis` for the investigating agent (findings, evals, incidents,
//! proposals, receipts, runs), `runner` for executors (claim, complete or
//! fail a grant), `read` for every read. A key made before scopes existed
//! holds `legacy` — every scope, as before — until an operator narrows it
//! (`pstack-store keys scope ID --scope …`). Scope changes, like revocation,
//! take effect on the key's next request. Scopes are orthogonal: none
//! implies another (an agent's key is `analysis` *and* `read`).

use sha2::{Digest, Sha256};

/// Prefix of every key.
pub const KEY_PREFIX: &str = "psk_";

/// A freshly generated key: the plaintext (shown once) and what is stored.
#[derive(Debug)]
pub struct NewKey {
    /// Public id.
    pub id: String,
    /// The full key, `psk_<id>_<secret>`. Give it to the node; never store it.
    pub plaintext: String,
    /// Hex SHA-256 of `plaintext`.
    pub hash: String,
}

/// What a key may do. Wire and storage name: [`Scope::as_str`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Scope {
    /// `POST /v1/envelopes`: what every node holds.
    Ingest,
    /// Changes (`POST /v1/changes`), OTLP spans (`POST /v1/traces`) and
    /// Alertmanager alerts: CI/CD and collectors.
    Telemetry,
    /// Findings, eval runs, counterfactuals, incidents and leases,
    /// proposals, the watchdog, receipts, graphs and runs: the
    /// investigating agent.
    Analysis,
    /// Claim, complete or fail a grant it was handed: executors.
    Runner,
    /// Every `GET` of evidence and analysis (and the MCP read tools).
    Read,
    /// Every scope: a key made before scopes existed, until narrowed.
    Legacy,
}

impl Scope {
    /// Every scope, in the order help texts list them.
    pub const ALL: [Scope; 6] = [
        Scope::Ingest,
        Scope::Telemetry,
        Scope::Analysis,
        Scope::Runner,
        Scope::Read,
        Scope::Legacy,
    ];

    /// Wire and storage name.
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Ingest => "ingest",
            Scope::Telemetry => "telemetry",
            Scope::Analysis => "analysis",
            Scope::Runner => "runner",
            Scope::Read => "read",
            Scope::Legacy => "legacy",
        }
    }

    /// Parse a wire name.
    pub fn parse(s: &str) -> Option<Scope> {
        Scope::ALL.into_iter().find(|x| x.as_str() == s)
    }

    /// Who holds it, for help texts and refusals.
    pub fn holder(self) -> &'static str {
        match self {
            Scope::Ingest => "nodes shipping envelopes (POST /v1/envelopes)",
            Scope::Telemetry => {
                "CI/CD and collectors (POST /v1/changes, POST /v1/traces, Alertmanager alerts)"
            }
            Scope::Analysis => {
                "the investigating agent (findings, evals, incidents, proposals, receipts, runs)"
            }
            Scope::Runner => "executors (claim, complete or fail a grant)",
            Scope::Read => "dashboards and agents (every GET)",
            Scope::Legacy => "every scope: keys made before scopes existed",
        }
    }
}

impl std::fmt::Display for Scope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One line per scope: `name — holder`, for `--help` and refusals.
pub fn scopes_help() -> String {
    Scope::ALL
        .iter()
        .map(|s| format!("  {:<9} {}", s.as_str(), s.holder()))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The scopes of one key (never empty once stored).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ScopeSet(std::collections::BTreeSet<Scope>);

impl ScopeSet {
    /// These scopes.
    pub fn of(scopes: impl IntoIterator<Item = Scope>) -> ScopeSet {
        ScopeSet(scopes.into_iter().collect())
    }

    /// `legacy`: every scope.
    pub fn legacy() -> ScopeSet {
        ScopeSet::of([Scope::Legacy])
    }

    /// Whether a route needing `need` admits this key.
    pub fn allows(&self, need: Scope) -> bool {
        self.0.contains(&Scope::Legacy) || self.0.contains(&need)
    }

    /// No scope at all.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The scopes, in [`Scope`] order.
    pub fn iter(&self) -> impl Iterator<Item = Scope> + '_ {
        self.0.iter().copied()
    }

    /// Names, in [`Scope`] order.
    pub fn names(&self) -> Vec<&'static str> {
        self.iter().map(Scope::as_str).collect()
    }

    /// Storage form: names separated by single spaces (as OAuth's `scope`).
    pub fn to_stored(&self) -> String {
        self.names().join(" ")
    }

    /// Read the storage form. An unknown name (a database edited by hand,
    /// or written by a newer store) grants nothing: it is returned apart so
    /// the caller can say so, and never widens the set.
    pub fn from_stored(s: &str) -> (ScopeSet, Vec<String>) {
        let mut set = ScopeSet::default();
        let mut unknown = Vec::new();
        for name in s.split_ascii_whitespace() {
            match Scope::parse(name) {
                Some(x) => {
                    set.0.insert(x);
                }
                None => unknown.push(name.to_string()),
            }
        }
        (set, unknown)
    }
}

impl std::fmt::Display for ScopeSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.0.is_empty() {
            return f.write_str("(none)");
        }
        f.write_str(&self.names().join(","))
    }
}

/// Why a key could not be generated or parsed.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// The kernel's random source failed.
    #[error("cannot read random bytes: {0}")]
    Random(String),
    /// A presented key is not of the form `psk_<16 hex>_<64 hex>`.
    #[error("malformed API key (expected psk_<16 hex>_<64 hex>)")]
    Malformed,
}

/// Generate a new key.
pub fn generate() -> Result<NewKey, KeyError> {
    let mut id = [0u8; 8];
    let mut secret = [0u8; 32];
    getrandom::fill(&mut id).map_err(|e| KeyError::Random(e.to_string()))?;
    getrandom::fill(&mut secret).map_err(|e| KeyError::Random(e.to_string()))?;
    let id = hex::encode(id);
    let plaintext = format!("{KEY_PREFIX}{id}_{}", hex::encode(secret));
    let hash = hash_key(&plaintext);
    Ok(NewKey {
        id,
        plaintext,
        hash,
    })
}

/// Hex SHA-256 of a presented key.
pub fn hash_key(plaintext: &str) -> String {
    hex::encode(Sha256::digest(plaintext.as_bytes()))
}

/// The public id of a presented key, if it has the right shape.
pub fn parse_id(plaintext: &str) -> Result<&str, KeyError> {
    let rest = plaintext
        .strip_prefix(KEY_PREFIX)
        .ok_or(KeyError::Malformed)?;
    let (id, secret) = rest.split_once('_').ok_or(KeyError::Malformed)?;
    let hex_of = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_hexdigit());
    if hex_of(id, 16) && hex_of(secret, 64) {
        Ok(id)
    } else {
        Err(KeyError::Malformed)
    }
}

/// Compare two hex hashes without an early exit on the first difference.
pub fn hashes_equal(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_keys_parse_and_differ() {
        let a = generate().unwrap();
        let b = generate().unwrap();
        assert_ne!(a.plaintext, b.plaintext);
        assert_eq!(parse_id(&a.plaintext).unwrap(), a.id);
        assert!(hashes_equal(&hash_key(&a.plaintext), &a.hash));
        assert!(!hashes_equal(&a.hash, &b.hash));
    }

    #[test]
    fn scopes_round_trip_and_legacy_allows_everything() {
        for s in Scope::ALL {
            assert_eq!(Scope::parse(s.as_str()), Some(s));
        }
        let set = ScopeSet::of([Scope::Read, Scope::Analysis]);
        assert_eq!(set.to_stored(), "analysis read");
        assert_eq!(
            ScopeSet::from_stored("analysis read"),
            (set.clone(), vec![])
        );
        assert!(set.allows(Scope::Read) && set.allows(Scope::Analysis));
        assert!(!set.allows(Scope::Telemetry) && !set.allows(Scope::Ingest));
        for s in Scope::ALL {
            assert!(ScopeSet::legacy().allows(s), "{s}");
        }
        // Unknown stored names grant nothing.
        let (set, unknown) = ScopeSet::from_stored("ingest admin");
        assert_eq!(set, ScopeSet::of([Scope::Ingest]));
        assert_eq!(unknown, vec!["admin".to_string()]);
        assert!(!ScopeSet::default().allows(Scope::Read));
    }

    #[test]
    fn malformed_keys_are_refused() {
        for bad in [
            "",
            "psk_",
            "psk_zz_zz",
            "Bearer x",
            &format!("psk_{}_{}", "a".repeat(16), "b".repeat(63)),
        ] {
            assert!(parse_id(bad).is_err(), "{bad}");
        }
    }
}
