//! Evidence provenance at the gate: the tier the gate acts on never rests on
//! evidence written by the key asking it to act.
//!
//! A finding's `causalProofTier` is derived by the server, but from records
//! callers wrote: the contributing change and the spans its cohorts were
//! judged on (`cohort_rate_isolated`), or the eval runs of a verified pairing
//! (`counterfactual_verified`). A key that can write those records can forge
//! the tier; the scopes (`crate::keys`) keep a node's `ingest` key out, and
//! this rule keeps out a key that holds both the writing scopes and the one
//! that acts (a `legacy` key, or `telemetry` + `analysis`).
//!
//! Invariants:
//! - **The rule.** A tier above `corroborated_candidate` counts at the gate
//!   only when the records it rests on — its *measurement* — have at least
//!   one known writer and none of them is the acting key (the proposing
//!   key at `propose`; the claiming key at `claim` of an autonomous grant).
//!   Measurement of `cohort_rate_isolated`: the contributing change and
//!   every span of its service (any version; for host changes every
//!   envelope) in the window the finding was judged on. Measurement of
//!   `counterfactual_verified`: the pairing's eval runs and the change that
//!   fixes the broken state.
//! - **The demotion.** A tier failing the rule falls to the next tier whose
//!   measurement passes (a self-attested counterfactual over an independent
//!   cohort is `cohort_rate_isolated`), else to `corroborated_candidate`:
//!   the most the store grants a caller's own assertions (as a
//!   `touched_same_code_path` link the caller merely asserts). Per the
//!   matrix, `rollback_deploy` and `toggle_feature_flag` then need a human
//!   (`human_approved_write`); `apply_config` and `promote_agent_prompt`
//!   too; `open_code_pr` stays `autonomous_write` (a PR is reviewed before
//!   it merges, and corroboration already earns it).
//! - **Unknown writers fail closed.** Span aggregates stored before schema
//!   v6 have no recorded writer: a measurement with no known writer does
//!   not count.
//! - The finding keeps its tier (it is the analysis, not the decision); the
//!   proposal records the tier the gate acted on and the answer says why it
//!   differs.
//! - [`gate_tier`] is pure; [`evidence`] reads the writers from the store.

use std::collections::BTreeSet;

use serde::Serialize;

use crate::analysis::proof::CausalProofTier;
use crate::analysis::verdict::Verdict;
use crate::db::analysis::FindingRow;
use crate::db::{Store, StoreError};

/// Who asks the gate to act.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Actor<'a> {
    /// The key proposing the action.
    Proposer(&'a str),
    /// The key claiming an autonomous grant.
    Claimer(&'a str),
}

impl Actor<'_> {
    fn key(&self) -> &str {
        match self {
            Actor::Proposer(k) | Actor::Claimer(k) => k,
        }
    }

    fn role(&self) -> &'static str {
        match self {
            Actor::Proposer(_) => "proposing",
            Actor::Claimer(_) => "claiming",
        }
    }
}

/// The records one tier rests on, and who wrote them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Measurement {
    /// What the records are, for the reason (e.g. "change chg_… and the
    /// spans of checkout-api from … to …").
    pub what: String,
    /// Key ids of every writer (empty: none recorded).
    pub writers: BTreeSet<String>,
}

/// What a finding's tier rests on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TierEvidence {
    /// The finding's stored tier.
    pub finding_tier: CausalProofTier,
    /// The cohort measurement, when the finding's change verdict isolates
    /// the change (`isolated_to_new_version`).
    pub cohort: Option<Measurement>,
    /// The counterfactual measurement, when a pairing verified.
    pub counterfactual: Option<Measurement>,
}

/// Why the gate acts on a lower tier than the finding's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Demotion {
    /// Stable code: `self_attested_evidence`.
    pub code: &'static str,
    /// The finding's tier.
    pub finding_tier: &'static str,
    /// The tier the gate acts on.
    pub gate_tier: &'static str,
    /// In words, naming the records and the key.
    pub reason: String,
}

/// The tier the gate acts on, and why it is lower, if it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GateTier {
    /// The tier for the policy matrix.
    pub tier: CausalProofTier,
    /// Set when `tier` is below the finding's.
    pub demotion: Option<Demotion>,
}

/// Why one measurement does not count for `actor`, or None when it does.
fn objection(m: Option<&Measurement>, actor: Actor<'_>) -> Option<String> {
    let m = m?;
    if m.writers.is_empty() {
        return Some(format!("{} has no recorded writer", m.what));
    }
    if m.writers.contains(actor.key()) {
        let others = m.writers.len() - 1;
        return Some(format!(
            "key {} (the {} key) wrote {}{}",
            actor.key(),
            actor.role(),
            if others == 0 { "all of " } else { "part of " },
            m.what
        ));
    }
    None
}

/// The tier the gate may act on for `actor` (the rule in the module doc).
pub fn gate_tier(e: &TierEvidence, actor: Actor<'_>) -> GateTier {
    use CausalProofTier::{CohortRateIsolated, CorroboratedCandidate, CounterfactualVerified};
    let counts = |m: Option<&Measurement>| m.is_some() && objection(m, actor).is_none();
    let mut why = Vec::new();
    let tier = match e.finding_tier {
        CounterfactualVerified if counts(e.counterfactual.as_ref()) => CounterfactualVerified,
        CounterfactualVerified => {
            why.extend(objection(e.counterfactual.as_ref(), actor));
            if e.counterfactual.is_none() {
                why.push("no verified pairing is recorded on the finding".into());
            }
            if counts(e.cohort.as_ref()) {
                CohortRateIsolated
            } else {
                why.extend(objection(e.cohort.as_ref(), actor));
                CorroboratedCandidate
            }
        }
        CohortRateIsolated if counts(e.cohort.as_ref()) => CohortRateIsolated,
        CohortRateIsolated => {
            why.extend(objection(e.cohort.as_ref(), actor));
            if e.cohort.is_none() {
                why.push("the finding names no change isolated by its cohorts".into());
            }
            CorroboratedCandidate
        }
        other => other,
    };
    let demotion = (tier != e.finding_tier).then(|| Demotion {
        code: "self_attested_evidence",
        finding_tier: e.finding_tier.as_str(),
        gate_tier: tier.as_str(),
        reason: format!(
            "{} does not count at the gate: {}; a tier the gate acts on may rest on nothing the acting key wrote, so it acts on {}",
            e.finding_tier.as_str(),
            why.join("; "),
            tier.as_str()
        ),
    });
    GateTier { tier, demotion }
}

/// Read what `f`'s tier rests on, and who wrote it.
pub async fn evidence(store: &Store, f: &FindingRow) -> Result<TierEvidence, StoreError> {
    let finding_tier =
        CausalProofTier::parse(&f.causal_proof_tier).unwrap_or(CausalProofTier::UnverifiedLocus);
    let change = match &f.contributing_change_id {
        Some(id) => store.change(id).await?,
        None => None,
    };
    let mut cohort = None;
    if let Some(c) = &change
        && f.change_verdict.as_deref() == Some(Verdict::IsolatedToNewVersion.as_str())
    {
        // The window the finding's blast radius was judged on: the change
        // to the finding, and the equally long baseline before it.
        let window = f.created_ns.saturating_sub(c.at_ns).max(0);
        let end = c.at_ns.saturating_add(window);
        let mut writers = BTreeSet::from([c.key_id.clone()]);
        let what = if c.is_host_change() {
            let start = c
                .node_times()
                .values()
                .map(|t| t - (end - t).max(0))
                .min()
                .unwrap_or(c.at_ns)
                .min(c.at_ns.saturating_sub(window));
            writers.extend(store.envelope_writers(start, end).await?.into_keys());
            format!(
                "change {} and the envelopes from {} to {}",
                c.id,
                crate::ident::format_ns(start),
                crate::ident::format_ns(end)
            )
        } else {
            let start = c.at_ns.saturating_sub(window);
            let service = c.service.as_deref().unwrap_or_default();
            writers.extend(
                store
                    .span_writers(&c.environment, service, start, end)
                    .await?
                    .into_keys(),
            );
            format!(
                "change {} and the spans of {service:?} from {} to {}",
                c.id,
                crate::ident::format_ns(start),
                crate::ident::format_ns(end)
            )
        };
        cohort = Some(Measurement { what, writers });
    }
    let mut counterfactual = None;
    if let Some(cf) = &f.counterfactual
        && cf["verified"] == serde_json::Value::Bool(true)
    {
        let mut runs: Vec<String> = Vec::new();
        if let Some(id) = cf["failingRunId"].as_str() {
            runs.push(id.to_string());
        }
        if let Some(ids) = cf["passingRunIds"].as_array() {
            runs.extend(ids.iter().filter_map(|v| v.as_str().map(str::to_string)));
        }
        runs.sort();
        runs.dedup();
        let mut writers = BTreeSet::new();
        for id in &runs {
            writers.extend(store.eval_run_writer(id).await?);
        }
        let mut what = format!("eval runs {}", runs.join(", "));
        if let Some(c) = &change {
            writers.insert(c.key_id.clone());
            what = format!("change {} and {what}", c.id);
        }
        counterfactual = Some(Measurement { what, writers });
    }
    Ok(TierEvidence {
        finding_tier,
        cohort,
        counterfactual,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use CausalProofTier as T;

    fn m(writers: &[&str]) -> Option<Measurement> {
        Some(Measurement {
            what: "the records".into(),
            writers: writers.iter().map(|w| w.to_string()).collect(),
        })
    }

    fn tier(finding: T, cohort: Option<Measurement>, cf: Option<Measurement>, a: Actor) -> T {
        gate_tier(
            &TierEvidence {
                finding_tier: finding,
                cohort,
                counterfactual: cf,
            },
            a,
        )
        .tier
    }

    // Every row: (finding tier, cohort writers, counterfactual writers,
    // actor) → the tier the gate acts on.
    #[test]
    fn table() {
        let p = Actor::Proposer("k_agent");
        let rows = [
            // Independent evidence: the finding's tier stands.
            (
                T::CohortRateIsolated,
                m(&["k_ci", "k_otel"]),
                None,
                T::CohortRateIsolated,
            ),
            (
                T::CounterfactualVerified,
                None,
                m(&["k_eval"]),
                T::CounterfactualVerified,
            ),
            // All written by the actor (the forged sequence).
            (
                T::CohortRateIsolated,
                m(&["k_agent"]),
                None,
                T::CorroboratedCandidate,
            ),
            (
                T::CounterfactualVerified,
                None,
                m(&["k_agent"]),
                T::CorroboratedCandidate,
            ),
            // Part written by the actor (a real deploy, forged spans).
            (
                T::CohortRateIsolated,
                m(&["k_ci", "k_agent"]),
                None,
                T::CorroboratedCandidate,
            ),
            (
                T::CounterfactualVerified,
                None,
                m(&["k_eval", "k_agent"]),
                T::CorroboratedCandidate,
            ),
            // A forged pairing over an independent cohort: the cohort stands.
            (
                T::CounterfactualVerified,
                m(&["k_ci", "k_otel"]),
                m(&["k_agent"]),
                T::CohortRateIsolated,
            ),
            // No recorded writer (pre-v6 spans) or no measurement: fail closed.
            (
                T::CohortRateIsolated,
                m(&[]),
                None,
                T::CorroboratedCandidate,
            ),
            (T::CohortRateIsolated, None, None, T::CorroboratedCandidate),
            (
                T::CounterfactualVerified,
                None,
                None,
                T::CorroboratedCandidate,
            ),
            // Lower tiers are never touched (nor raised).
            (
                T::CorroboratedCandidate,
                m(&["k_agent"]),
                None,
                T::CorroboratedCandidate,
            ),
            (
                T::UnverifiedLocus,
                m(&["k_agent"]),
                m(&["k_agent"]),
                T::UnverifiedLocus,
            ),
        ];
        for (finding, cohort, cf, want) in rows {
            assert_eq!(
                tier(finding, cohort.clone(), cf.clone(), p),
                want,
                "{finding:?} cohort={cohort:?} cf={cf:?}"
            );
        }
        // The claimer is held to the same rule.
        assert_eq!(
            tier(
                T::CohortRateIsolated,
                m(&["k_ci", "k_exec"]),
                None,
                Actor::Claimer("k_exec")
            ),
            T::CorroboratedCandidate
        );
    }

    #[test]
    fn a_demotion_names_the_key_and_the_records() {
        let g = gate_tier(
            &TierEvidence {
                finding_tier: T::CohortRateIsolated,
                cohort: m(&["k_agent"]),
                counterfactual: None,
            },
            Actor::Proposer("k_agent"),
        );
        let d = g.demotion.expect("demoted");
        assert_eq!(d.code, "self_attested_evidence");
        assert_eq!(d.finding_tier, "cohort_rate_isolated");
        assert_eq!(d.gate_tier, "corroborated_candidate");
        assert!(
            d.reason
                .contains("key k_agent (the proposing key) wrote all of the records"),
            "{}",
            d.reason
        );
        let kept = gate_tier(
            &TierEvidence {
                finding_tier: T::CohortRateIsolated,
                cohort: m(&["k_ci"]),
                counterfactual: None,
            },
            Actor::Proposer("k_agent"),
        );
        assert_eq!(kept.demotion, None);
    }
}
