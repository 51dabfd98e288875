//! How long an envelope of each subject kind stays fresh enough to act on
//! (the expiry of a handoff, and the freshness of a pre-mutation capture).
//!
//! Defaults (pstack's choice; seed 001 asks for an expiry without naming
//! one): the faster a subject's state changes, the shorter — a thread 60 s,
//! a process 120 s, a network stream 60 s, a storage transfer 300 s, a host
//! 600 s. Operators override per kind (`PSTACK_STORE_FRESHNESS`, e.g.
//! `process=30s,host=15m`). Pure: `now` is the caller's.

use std::collections::BTreeMap;

/// Subject kinds the store indexes.
pub const KINDS: [&str; 5] = [
    "thread",
    "process",
    "network_stream",
    "storage_transfer",
    "host",
];

/// Freshness per subject kind, ns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Freshness {
    per_kind: BTreeMap<String, i64>,
}

const S: i64 = 1_000_000_000;

impl Default for Freshness {
    fn default() -> Freshness {
        let per_kind = [
            ("thread", 60 * S),
            ("process", 120 * S),
            ("network_stream", 60 * S),
            ("storage_transfer", 300 * S),
            ("host", 600 * S),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        Freshness { per_kind }
    }
}

/// A bad freshness setting.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("PSTACK_STORE_FRESHNESS: {0}")]
pub struct FreshnessError(String);

impl Freshness {
    /// ns an envelope of `kind` stays fresh; an unknown kind gets the
    /// shortest (an unfamiliar subject is not a stable one).
    pub fn of(&self, kind: &str) -> i64 {
        self.per_kind
            .get(kind)
            .copied()
            .unwrap_or_else(|| self.per_kind.values().copied().min().unwrap_or(60 * S))
    }

    /// When an envelope of `kind` observed at `wall_ns` expires.
    pub fn expires_ns(&self, kind: &str, wall_ns: i64) -> i64 {
        wall_ns.saturating_add(self.of(kind))
    }

    /// Apply `kind=duration,…` overrides (durations `30s`, `15m`, `2h`).
    pub fn with_overrides(mut self, spec: &str) -> Result<Freshness, FreshnessError> {
        for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (kind, dur) = part
                .split_once('=')
                .ok_or_else(|| FreshnessError(format!("{part:?} is not kind=duration")))?;
            if !KINDS.contains(&kind) {
                return Err(FreshnessError(format!(
                    "unknown subject kind {kind:?} (one of {})",
                    KINDS.join(", ")
                )));
            }
            let ns = crate::http_analysis::parse_window(dur)
                .filter(|n| *n > 0)
                .ok_or_else(|| FreshnessError(format!("{dur:?} is not a duration like 30s")))?;
            self.per_kind.insert(kind.to_string(), ns);
        }
        Ok(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_overrides_and_refusals() {
        let f = Freshness::default();
        assert_eq!(f.of("process"), 120 * S);
        assert_eq!(f.of("martian"), 60 * S);
        let f = f.with_overrides("process=30s, host=15m").unwrap();
        assert_eq!((f.of("process"), f.of("host")), (30 * S, 900 * S));
        assert!(Freshness::default().with_overrides("pod=1m").is_err());
        assert!(Freshness::default().with_overrides("process=soon").is_err());
        assert!(Freshness::default().with_overrides("process").is_err());
    }
}
