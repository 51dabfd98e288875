//! Seed 001's acceptance metrics (AC1), measured by the store: per run (in
//! the run's state, its JSON and its report) and across runs (Prometheus
//! counters on `/metrics`). The definitions, exactly:
//!
//! 1. **Time to first discriminating observation**: from the run's start to
//!    the first envelope the run records that moves a standing hypothesis of
//!    its subject's ledger to `confirmed` or `falsified`
//!    ([`super::hypotheses::Move::discriminates`]). Histogram
//!    `pstack_store_run_first_discriminating_observation_seconds`, observed
//!    once per run that has one.
//! 2. **Retractions**: ledger moves out of `confirmed` or `falsified` caused
//!    by an envelope a run recorded ([`super::hypotheses::Move::retracts`]):
//!    a conclusion the evidence later withdrew.
//!    `pstack_store_hypothesis_retractions_total`.
//! 3. **Repeated investigations**: a run that binds its subject while
//!    another run of the same graph on that subject ended `success` or
//!    `failed` (a settled question) within [`REPEAT_WINDOW_NS`].
//!    `pstack_store_repeated_investigations_total`.
//! 4. **Unknowns without owner or probe**: unknowns with an empty (or
//!    blank) `owner` or `probe` in envelopes offered to ingest, per missing
//!    field (`missing="owner"|"probe"`; an unknown missing both counts under
//!    each). Ingest refuses such envelopes (rules `unknown_incomplete`,
//!    `unknown_without_probe`), so none is stored or open; the counter says
//!    how many collectors still send. Per run: such unknowns in the
//!    envelopes the run recorded (envelopes stored before the rule).
//!    `pstack_store_unknowns_without_owner_or_probe_total`.
//! 5. **Stale handoffs**: advances citing a handoff that is expired
//!    (`reason="expired"`, refused `410`) or that the store does not hold
//!    (`reason="unbound"`, refused `422`). `pstack_store_stale_handoffs_total`.
//! 6. **Transitions per agent-hour**: steps entered by runs (every
//!    `run/entered` event: advances the supervisor permitted and check
//!    routes) over the time the runs' agents were at them (from a run's
//!    start to its latest step). `pstack_store_run_transitions_total` and
//!    `pstack_store_run_agent_seconds_total`; the rate is
//!    `3600 * rate(transitions) / rate(agent_seconds)`. Per run: transitions
//!    × 3600 / max(agent seconds, 1).
//! 7. **Narration tokens**: the free text of run steps (`command`,
//!    `stdout`), estimated as the bundle estimates
//!    ([`crate::bundle::estimate_tokens`]: 4 bytes of compact JSON per
//!    token, rounded up). `pstack_store_run_narration_tokens_total`.
//!
//! Invariants: counters only grow and are per process (sum them across
//! replicas); a step that loses its run's revision race counts nothing; no
//! label carries a caller's string.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use pstack_exposition::{Exposition, Family, HistogramSample};
use serde::Serialize;

use super::supervisor::{EventKind, RunState};

/// How far back a settled run on the same subject and graph makes a new
/// one a repeated investigation.
pub const REPEAT_WINDOW_NS: i64 = 24 * 3600 * 1_000_000_000;

/// The histogram's buckets, seconds.
pub const FIRST_DISCRIMINATING_BUCKETS_S: [f64; 9] =
    [5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0];

/// The seven, for one run (exact; the report buckets and rounds them).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AcceptanceSummary {
    /// Seconds from the start to the first discriminating envelope.
    pub first_discriminating_observation_seconds: Option<f64>,
    /// Retractions.
    pub retractions: u32,
    /// A repeated investigation.
    pub repeated_investigation: bool,
    /// Unknowns without owner or probe.
    pub unknowns_without_owner_or_probe: u32,
    /// Stale or unbound handoffs cited.
    pub stale_handoffs: u32,
    /// Steps entered.
    pub transitions: u32,
    /// Seconds from the start to the latest step.
    pub agent_seconds: f64,
    /// transitions × 3600 / max(agent seconds, 1).
    pub transitions_per_agent_hour: f64,
    /// Estimated narration tokens.
    pub narration_tokens: u64,
}

/// Steps a run entered.
pub fn transitions(state: &RunState) -> u32 {
    let n = state
        .events
        .iter()
        .filter(|e| e.kind == EventKind::Entered)
        .count();
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// The summary of a run that started at `created_ns` and last stepped at
/// `last_step_ns`.
pub fn summarize(state: &RunState, created_ns: i64, last_step_ns: i64) -> AcceptanceSummary {
    let a = &state.acceptance;
    let agent_seconds = (last_step_ns.saturating_sub(created_ns)).max(0) as f64 / 1e9;
    let transitions = transitions(state);
    AcceptanceSummary {
        first_discriminating_observation_seconds: a
            .first_discriminating_after_ns
            .map(|ns| ns as f64 / 1e9),
        retractions: a.retractions,
        repeated_investigation: a.repeated_investigation,
        unknowns_without_owner_or_probe: a.unknowns_without_owner_or_probe,
        stale_handoffs: a.stale_handoffs,
        transitions,
        agent_seconds,
        transitions_per_agent_hour: f64::from(transitions) * 3600.0 / agent_seconds.max(1.0),
        narration_tokens: a.narration_tokens,
    }
}

/// Estimated tokens of a step's free text.
pub fn narration_tokens(texts: &[Option<&str>]) -> u64 {
    texts
        .iter()
        .flatten()
        .map(|t| crate::bundle::estimate_tokens(&serde_json::Value::String((*t).to_string())))
        .map(|n| u64::try_from(n).unwrap_or(u64::MAX))
        .sum()
}

/// Which field an ingest refusal says an unknown lacks (`owner` or
/// `probe`), from the validator's rule and its message (the message format
/// is the envelope crate's; a test pins it).
pub fn unknown_missing(reason: &crate::ingest::Reason) -> Option<&'static str> {
    match reason.rule.as_str() {
        "unknown_without_probe" => Some("probe"),
        "unknown_incomplete" if reason.message.ends_with("has an empty owner") => Some("owner"),
        _ => None,
    }
}

/// Unknowns of an envelope with a blank owner or probe.
pub fn unknowns_without_owner_or_probe(env: &pstack_envelope::Envelope) -> u32 {
    let n = env
        .unknowns
        .iter()
        .filter(|u| u.owner.trim().is_empty() || u.probe.trim().is_empty())
        .count();
    u32::try_from(n).unwrap_or(u32::MAX)
}

#[derive(Debug, Default)]
struct Histogram {
    counts: [u64; FIRST_DISCRIMINATING_BUCKETS_S.len()],
    count: u64,
    sum: f64,
}

/// The AC1 counters of this process.
#[derive(Debug, Default)]
pub struct AcceptanceMetrics {
    first_discriminating: Mutex<Histogram>,
    retractions: AtomicU64,
    repeated: AtomicU64,
    missing_owner: AtomicU64,
    missing_probe: AtomicU64,
    stale_expired: AtomicU64,
    stale_unbound: AtomicU64,
    transitions: AtomicU64,
    agent_ns: AtomicU64,
    narration_tokens: AtomicU64,
}

/// Why a handoff was stale.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StaleHandoff {
    /// Past its expiry.
    Expired,
    /// Not a stored envelope.
    Unbound,
}

impl AcceptanceMetrics {
    /// A run's first discriminating envelope, `seconds` after its start.
    pub fn observe_first_discriminating(&self, seconds: f64) {
        let mut h = self
            .first_discriminating
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        for (i, le) in FIRST_DISCRIMINATING_BUCKETS_S.iter().enumerate() {
            if seconds <= *le {
                h.counts[i] += 1;
            }
        }
        h.count += 1;
        h.sum += seconds;
    }

    /// Retractions.
    pub fn add_retractions(&self, n: u64) {
        self.retractions.fetch_add(n, Ordering::Relaxed);
    }

    /// A repeated investigation.
    pub fn add_repeated(&self) {
        self.repeated.fetch_add(1, Ordering::Relaxed);
    }

    /// An unknown lacking `missing` (`owner` or `probe`) was offered.
    pub fn add_unknown_missing(&self, missing: &str) {
        match missing {
            "owner" => &self.missing_owner,
            _ => &self.missing_probe,
        }
        .fetch_add(1, Ordering::Relaxed);
    }

    /// A stale handoff was cited.
    pub fn add_stale_handoff(&self, why: StaleHandoff) {
        match why {
            StaleHandoff::Expired => &self.stale_expired,
            StaleHandoff::Unbound => &self.stale_unbound,
        }
        .fetch_add(1, Ordering::Relaxed);
    }

    /// One applied step: transitions it entered, ns since the run's
    /// previous step, its narration tokens.
    pub fn add_step(&self, transitions: u64, agent_ns: i64, narration_tokens: u64) {
        self.transitions.fetch_add(transitions, Ordering::Relaxed);
        self.agent_ns
            .fetch_add(u64::try_from(agent_ns).unwrap_or(0), Ordering::Relaxed);
        self.narration_tokens
            .fetch_add(narration_tokens, Ordering::Relaxed);
    }

    /// Add the AC1 families to the store's `/metrics`.
    pub fn write_metrics(&self, e: &mut Exposition) {
        let n = |a: &AtomicU64| a.load(Ordering::Relaxed);
        {
            let h = self
                .first_discriminating
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            e.histogram(
                FIRST_DISCRIMINATING,
                &[],
                HistogramSample {
                    bounds: &FIRST_DISCRIMINATING_BUCKETS_S,
                    cumulative: &h.counts,
                    count: h.count,
                    sum: h.sum,
                },
            );
        }
        e.sample(RETRACTIONS, &[], n(&self.retractions));
        e.sample(REPEATED, &[], n(&self.repeated));
        e.sample(
            UNKNOWNS_WITHOUT_OWNER_OR_PROBE,
            &[("missing", "owner")],
            n(&self.missing_owner),
        );
        e.sample(
            UNKNOWNS_WITHOUT_OWNER_OR_PROBE,
            &[("missing", "probe")],
            n(&self.missing_probe),
        );
        e.sample(
            STALE_HANDOFFS,
            &[("reason", "expired")],
            n(&self.stale_expired),
        );
        e.sample(
            STALE_HANDOFFS,
            &[("reason", "unbound")],
            n(&self.stale_unbound),
        );
        e.sample(TRANSITIONS, &[], n(&self.transitions));
        e.sample(AGENT_SECONDS, &[], n(&self.agent_ns) as f64 / 1e9);
        e.sample(NARRATION_TOKENS, &[], n(&self.narration_tokens));
    }
}

const FIRST_DISCRIMINATING: Family = Family::histogram(
    "pstack_store_run_first_discriminating_observation_seconds",
    "Seconds from a supervised run's start to the first envelope that moved a standing hypothesis (AC1).",
);
const RETRACTIONS: Family = Family::counter(
    "pstack_store_hypothesis_retractions_total",
    "Hypothesis judgements (confirmed, falsified) later withdrawn by evidence (AC1).",
);
const REPEATED: Family = Family::counter(
    "pstack_store_repeated_investigations_total",
    "Runs that bound a subject another run of the same graph settled within 24 h (AC1).",
);
const UNKNOWNS_WITHOUT_OWNER_OR_PROBE: Family = Family::counter(
    "pstack_store_unknowns_without_owner_or_probe_total",
    "Unknowns offered to ingest without an owner or a probe, by missing field (AC1).",
);
const STALE_HANDOFFS: Family = Family::counter(
    "pstack_store_stale_handoffs_total",
    "Run advances citing an expired or unknown handoff, by reason (AC1).",
);
const TRANSITIONS: Family = Family::counter(
    "pstack_store_run_transitions_total",
    "Steps entered by supervised runs (AC1 transitions per agent-hour, numerator).",
);
const AGENT_SECONDS: Family = Family::counter(
    "pstack_store_run_agent_seconds_total",
    "Seconds supervised runs spent from one step to the next (AC1 transitions per agent-hour, denominator).",
);
const NARRATION_TOKENS: Family = Family::counter(
    "pstack_store_run_narration_tokens_total",
    "Estimated tokens of free text (command, stdout) in run steps, 4 bytes per token (AC1).",
);

#[cfg(test)]
mod tests {
    use super::*;
    use pstack_envelope::EnvelopeError;

    /// The validator's messages are what [`unknown_missing`] reads: pin them.
    #[test]
    fn ingest_refusals_name_the_missing_field() {
        let reason = |e: EnvelopeError| crate::ingest::Reason {
            rule: e.rule().to_string(),
            message: e.to_string(),
        };
        let field = |f: &str| EnvelopeError::UnknownIncomplete {
            unknown: "u1".into(),
            field: f.into(),
        };
        assert_eq!(unknown_missing(&reason(field("owner"))), Some("owner"));
        assert_eq!(unknown_missing(&reason(field("question"))), None);
        assert_eq!(unknown_missing(&reason(field("blocks"))), None);
        assert_eq!(
            unknown_missing(&reason(EnvelopeError::UnknownWithoutProbe {
                unknown: "owner".into()
            })),
            Some("probe")
        );
    }

    #[test]
    fn narration_is_estimated_like_the_bundle() {
        assert_eq!(narration_tokens(&[None, None]), 0);
        // "abcdef" is 8 bytes of JSON: 2 tokens; "" is 2 bytes: 1.
        assert_eq!(narration_tokens(&[Some("abcdef"), Some("")]), 3);
    }

    #[test]
    fn the_histogram_is_cumulative() {
        let m = AcceptanceMetrics::default();
        m.observe_first_discriminating(5.0);
        m.observe_first_discriminating(61.0);
        let mut e = Exposition::new();
        m.write_metrics(&mut e);
        let out = e.render();
        for line in [
            "pstack_store_run_first_discriminating_observation_seconds_bucket{le=\"5\"} 1",
            "pstack_store_run_first_discriminating_observation_seconds_bucket{le=\"60\"} 1",
            "pstack_store_run_first_discriminating_observation_seconds_bucket{le=\"120\"} 2",
            "pstack_store_run_first_discriminating_observation_seconds_bucket{le=\"+Inf\"} 2",
            "pstack_store_run_first_discriminating_observation_seconds_count 2",
        ] {
            assert!(out.contains(line), "{line}\n{out}");
        }
    }
}
