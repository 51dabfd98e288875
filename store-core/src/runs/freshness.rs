//! The one freshness rule of the store: how long an envelope of each subject
//! kind stays fresh enough to act on, and what a pre-mutation envelope must
//! be. Supervised runs (the MUTATE step), the remediation gate (propose,
//! approve, claim of a host-subject action) and handoff expiry all judge
//! through this module; none keeps a window of its own.
//!
//! Invariants:
//! - One table, one per subject kind of the envelope model (pstack's choice;
//!   seed 001 asks for an expiry without naming one). The faster a subject's
//!   state changes, the shorter: a thread 60 s, a network stream 60 s, a
//!   process 120 s, a storage transfer 300 s, a host (a node) 600 s — the
//!   reasons are in `store/docs/runs.md`. Operators override per kind
//!   (`--freshness` / `PSTACK_STORE_FRESHNESS`, e.g. `process=30s,host=15m`).
//! - An envelope observed at `wall` is fresh while `now < wall + freshness`
//!   (its `expiresAt`); at `wall + freshness` it is stale. A handoff, a run
//!   capture and a gate envelope expire at the same instant.
//! - A pre-mutation envelope is of the same subject, `complete` or
//!   `bounded`, observed no later than now, and fresh; `partial` (a surface
//!   did not succeed) and `identity_race` (the identity changed between the
//!   reads) never authorize a mutation, however fresh.
//! - Pure: `now` is the caller's; nothing here reads a clock.

use std::collections::BTreeMap;

use pstack_envelope::Completeness;

/// Subject kinds of the envelope model (`pstack_envelope::Subject::kind`).
pub const KINDS: [&str; 5] = [
    "thread",
    "process",
    "network_stream",
    "storage_transfer",
    "host",
];

const S: i64 = 1_000_000_000;

/// The defaults, with the reason each is that long (also in the docs).
pub const DEFAULTS: [(&str, i64, &str); 5] = [
    (
        "thread",
        60 * S,
        "a thread's state, wait channel and stack change within milliseconds",
    ),
    (
        "process",
        120 * S,
        "the identity is stable but the threads' states change; two minutes covers one capture-decide-act cycle",
    ),
    (
        "network_stream",
        60 * S,
        "TCP state (queues, window, retransmits) changes every round trip",
    ),
    (
        "storage_transfer",
        300 * S,
        "a replica rebuild progresses over minutes; its engine state changes slowly",
    ),
    (
        "host",
        600 * S,
        "a node's boot, mounts and cgroup layout change rarely (the gate's former 10 min for host subjects)",
    ),
];

/// Freshness per subject kind, ns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Freshness {
    per_kind: BTreeMap<String, i64>,
}

impl Default for Freshness {
    fn default() -> Freshness {
        let per_kind = DEFAULTS
            .iter()
            .map(|(k, v, _)| (k.to_string(), *v))
            .collect();
        Freshness { per_kind }
    }
}

/// A bad freshness setting.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("PSTACK_STORE_FRESHNESS: {0}")]
pub struct FreshnessError(String);

/// What the store knows of one stored envelope, enough to judge it as a
/// pre-mutation envelope.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvelopeFacts {
    /// Its digest.
    pub digest: String,
    /// Its subject key.
    pub subject_key: String,
    /// Its subject kind (`thread`, `process`, …).
    pub kind: String,
    /// When it was observed (the envelope's wall time), ns.
    pub wall_ns: i64,
    /// Its completeness.
    pub completeness: Completeness,
}

/// Why an envelope does not authorize a mutation. `code()` is the
/// store's error code, the same for runs and the gate.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PreMutationRefusal {
    /// Nothing to judge: no envelope of the subject was cited or recorded.
    #[error(
        "no sealed envelope of the subject was captured since the last mutation; capture it first"
    )]
    Missing,
    /// An envelope of another subject.
    #[error("envelope {digest} is of subject {found:?}, not {expected:?}")]
    WrongSubject {
        /// The envelope.
        digest: String,
        /// Its subject.
        found: String,
        /// The subject to be mutated.
        expected: String,
    },
    /// `partial` or `identity_race`.
    #[error(
        "envelope {digest} is {}; a pre-mutation envelope is complete or bounded — capture the subject again",
        completeness.as_str()
    )]
    Incomplete {
        /// The envelope.
        digest: String,
        /// What it is.
        completeness: Completeness,
    },
    /// Observed after the moment of the decision.
    #[error("envelope {digest} was captured after this request")]
    NotBefore {
        /// The envelope.
        digest: String,
    },
    /// Past its freshness.
    #[error(
        "envelope {digest} of a {kind} was captured {} s ago; a {kind} envelope authorizes for {} s — capture the subject again",
        age_ns / S,
        freshness_ns / S
    )]
    Stale {
        /// The envelope.
        digest: String,
        /// Its subject kind.
        kind: String,
        /// now − wall, ns.
        age_ns: i64,
        /// The kind's freshness, ns.
        freshness_ns: i64,
    },
}

impl PreMutationRefusal {
    /// The error code (the gate's `422` codes; a run's refusal carries it).
    pub fn code(&self) -> &'static str {
        match self {
            PreMutationRefusal::Missing => "pre_mutation_envelope_required",
            PreMutationRefusal::WrongSubject { .. } => "pre_mutation_envelope_wrong_subject",
            PreMutationRefusal::Incomplete { .. } => "pre_mutation_envelope_incomplete",
            PreMutationRefusal::NotBefore { .. } => "pre_mutation_envelope_not_before",
            PreMutationRefusal::Stale { .. } => "pre_mutation_envelope_stale",
        }
    }

    /// The completeness it names, if that is why.
    pub fn completeness(&self) -> Option<Completeness> {
        match self {
            PreMutationRefusal::Incomplete { completeness, .. } => Some(*completeness),
            _ => None,
        }
    }
}

impl Freshness {
    /// ns an envelope of `kind` stays fresh; an unknown kind gets the
    /// shortest (an unfamiliar subject is not a stable one).
    pub fn of(&self, kind: &str) -> i64 {
        self.per_kind
            .get(kind)
            .copied()
            .unwrap_or_else(|| self.per_kind.values().copied().min().unwrap_or(60 * S))
    }

    /// When an envelope of `kind` observed at `wall_ns` expires (the first
    /// instant it is no longer fresh).
    pub fn expires_ns(&self, kind: &str, wall_ns: i64) -> i64 {
        wall_ns.saturating_add(self.of(kind))
    }

    /// Whether an envelope of `kind` observed at `wall_ns` is fresh at `now`.
    pub fn is_fresh(&self, kind: &str, wall_ns: i64, now_ns: i64) -> bool {
        now_ns < self.expires_ns(kind, wall_ns)
    }

    /// The pre-mutation rule with this table's expiry for `env`'s kind
    /// ([`judge_pre_mutation_until`]).
    pub fn judge_pre_mutation(
        &self,
        env: &EnvelopeFacts,
        subject: &str,
        now_ns: i64,
    ) -> Result<(), PreMutationRefusal> {
        judge_pre_mutation_until(
            env,
            subject,
            self.expires_ns(&env.kind, env.wall_ns),
            now_ns,
        )
    }

    /// Apply `kind=duration,…` overrides (durations as pstack's CLIs write
    /// them: `30s`, `15m`, `2h`).
    pub fn with_overrides(mut self, spec: &str) -> Result<Freshness, FreshnessError> {
        for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (kind, dur) = part
                .split_once('=')
                .ok_or_else(|| FreshnessError(format!("{part:?} is not kind=duration")))?;
            let kind = kind.trim();
            if !KINDS.contains(&kind) {
                return Err(FreshnessError(format!(
                    "unknown subject kind {kind:?} (one of {})",
                    KINDS.join(", ")
                )));
            }
            let ns = pstack_cli::parse_duration(dur.trim())
                .map_err(|e| FreshnessError(e.to_string()))
                .and_then(|d| {
                    i64::try_from(d.as_nanos())
                        .ok()
                        .filter(|n| *n > 0)
                        .ok_or_else(|| FreshnessError(format!("{dur:?} must be above zero")))
                })?;
            self.per_kind.insert(kind.to_string(), ns);
        }
        Ok(self)
    }
}

/// The pre-mutation rule: `env`, which expires at `expires_ns` (its wall
/// time + its kind's freshness, [`Freshness::expires_ns`]), may authorize
/// mutating `subject` at `now_ns`, or the first reason it may not (subject,
/// completeness, time order, freshness — in that order). A run judges its
/// capture with the expiry fixed when the capture was recorded; the gate
/// with the table at the moment of the request.
pub fn judge_pre_mutation_until(
    env: &EnvelopeFacts,
    subject: &str,
    expires_ns: i64,
    now_ns: i64,
) -> Result<(), PreMutationRefusal> {
    if env.subject_key != subject {
        return Err(PreMutationRefusal::WrongSubject {
            digest: env.digest.clone(),
            found: env.subject_key.clone(),
            expected: subject.to_string(),
        });
    }
    if !matches!(
        env.completeness,
        Completeness::Complete | Completeness::Bounded
    ) {
        return Err(PreMutationRefusal::Incomplete {
            digest: env.digest.clone(),
            completeness: env.completeness,
        });
    }
    if env.wall_ns > now_ns {
        return Err(PreMutationRefusal::NotBefore {
            digest: env.digest.clone(),
        });
    }
    if now_ns >= expires_ns {
        return Err(PreMutationRefusal::Stale {
            digest: env.digest.clone(),
            kind: env.kind.clone(),
            age_ns: now_ns - env.wall_ns,
            freshness_ns: expires_ns - env.wall_ns,
        });
    }
    Ok(())
}

/// Completeness from its wire name (as stored).
pub fn completeness_from_wire(s: &str) -> Option<Completeness> {
    [
        Completeness::Complete,
        Completeness::Bounded,
        Completeness::Partial,
        Completeness::IdentityRace,
    ]
    .into_iter()
    .find(|c| c.as_str() == s)
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
        assert!(Freshness::default().with_overrides("process=0s").is_err());
        assert!(Freshness::default().with_overrides("process").is_err());
    }

    fn facts(kind: &str, wall_ns: i64, completeness: Completeness) -> EnvelopeFacts {
        EnvelopeFacts {
            digest: "sha256:e".into(),
            subject_key: "sha256:s".into(),
            kind: kind.into(),
            wall_ns,
            completeness,
        }
    }

    /// Every kind, at, just below and just above its threshold: fresh while
    /// the age is below the freshness, stale from it on.
    #[test]
    fn each_kind_is_judged_at_just_below_and_just_above_its_threshold() {
        let f = Freshness::default();
        let wall = 1_796_000_000 * S;
        for (kind, fresh, reason) in DEFAULTS {
            assert!(!reason.is_empty());
            for (age, ok) in [(fresh - 1, true), (fresh, false), (fresh + 1, false)] {
                let got = f.judge_pre_mutation(
                    &facts(kind, wall, Completeness::Complete),
                    "sha256:s",
                    wall + age,
                );
                assert_eq!(got.is_ok(), ok, "{kind} at age {age}: {got:?}");
                if !ok {
                    assert_eq!(got.unwrap_err().code(), "pre_mutation_envelope_stale");
                }
                assert_eq!(f.is_fresh(kind, wall, wall + age), ok);
            }
        }
    }

    #[test]
    fn only_complete_or_bounded_of_the_same_subject_observed_before_now_authorize() {
        let f = Freshness::default();
        let wall = 1_796_000_000 * S;
        let now = wall + S;
        for (c, ok) in [
            (Completeness::Complete, true),
            (Completeness::Bounded, true),
            (Completeness::Partial, false),
            (Completeness::IdentityRace, false),
        ] {
            let got = f.judge_pre_mutation(&facts("thread", wall, c), "sha256:s", now);
            assert_eq!(got.is_ok(), ok, "{c:?}");
            if let Err(e) = got {
                assert_eq!(e.code(), "pre_mutation_envelope_incomplete");
                assert_eq!(e.completeness(), Some(c));
                assert!(e.to_string().contains(c.as_str()), "{e}");
            }
        }
        // Completeness is judged before freshness: a stale identity race
        // is refused for the race.
        let e = f
            .judge_pre_mutation(
                &facts("thread", wall, Completeness::IdentityRace),
                "sha256:s",
                wall + 3600 * S,
            )
            .unwrap_err();
        assert_eq!(e.code(), "pre_mutation_envelope_incomplete");
        let e = f
            .judge_pre_mutation(
                &facts("thread", wall, Completeness::Complete),
                "sha256:o",
                now,
            )
            .unwrap_err();
        assert_eq!(e.code(), "pre_mutation_envelope_wrong_subject");
        let e = f
            .judge_pre_mutation(
                &facts("thread", now + 1, Completeness::Complete),
                "sha256:s",
                now,
            )
            .unwrap_err();
        assert_eq!(e.code(), "pre_mutation_envelope_not_before");
    }

    #[test]
    fn wire_names_round_trip() {
        for c in [
            Completeness::Complete,
            Completeness::Bounded,
            Completeness::Partial,
            Completeness::IdentityRace,
        ] {
            assert_eq!(completeness_from_wire(c.as_str()), Some(c));
        }
        assert_eq!(completeness_from_wire("whole"), None);
    }
}
