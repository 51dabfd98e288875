//! Findings rules, pure: the causal proof tier, the recurrence fingerprint,
//! and the counterfactual pairing check (seed 000, scenarios 3-4).
//!
//! Invariants:
//! - `causalProofTier` is derived here from what the server verified (the
//!   contributing change's verdict, a verified counterfactual, code-path
//!   overlap); nothing a client sends enters it.
//! - `relationshipCertainty` (link provenance) and `causalProofTier` (proof
//!   strength) are separate values and never derived from each other.
//! - Code-path overlap alone never exceeds `corroborated_candidate`.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::verdict::Verdict;

/// How sure the store is that two graph nodes are linked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum RelationshipCertainty {
    /// Shared trace/span id or exact `code.filepath` match.
    Exact,
    /// Derived from correlated data.
    Inferred,
    /// A guess.
    Heuristic,
}

/// How strongly a candidate change is proven to cause the symptom.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CausalProofTier {
    /// Nothing beyond the locus.
    UnverifiedLocus,
    /// Corroborated, not isolated.
    CorroboratedCandidate,
    /// The cohort rates isolate the change.
    CohortRateIsolated,
    /// A paired baseline-fail / candidate-pass replay.
    CounterfactualVerified,
}

impl CausalProofTier {
    /// Wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            CausalProofTier::UnverifiedLocus => "unverified_locus",
            CausalProofTier::CorroboratedCandidate => "corroborated_candidate",
            CausalProofTier::CohortRateIsolated => "cohort_rate_isolated",
            CausalProofTier::CounterfactualVerified => "counterfactual_verified",
        }
    }

    /// Parse a wire name.
    pub fn parse(s: &str) -> Option<CausalProofTier> {
        [
            CausalProofTier::UnverifiedLocus,
            CausalProofTier::CorroboratedCandidate,
            CausalProofTier::CohortRateIsolated,
            CausalProofTier::CounterfactualVerified,
        ]
        .into_iter()
        .find(|t| t.as_str() == s)
    }
}

/// The seed's causal-chain relations.
pub const RELATIONS: &[&str] = &[
    "degraded_after_change",
    "isolated_to_version_cohort",
    "touched_same_code_path",
    "contended_on_shared_resource",
    "induced_shared_resource_contention",
    "originated_fault_in_span",
    "verified_by_counterfactual",
    "mitigated_by_change",
    "remediated_by_agent_run",
];

/// What the server verified about a finding.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProofFacts {
    /// The contributing change's blast-radius verdict, if a change is named.
    pub change_verdict: Option<Verdict>,
    /// A counterfactual pairing verified by [`check_counterfactual`].
    pub counterfactual_verified: bool,
    /// The change's touched paths overlap a failing stack frame, or the chain
    /// asserts `touched_same_code_path`.
    pub code_path_overlap: bool,
}

/// The tier the evidence earns.
pub fn derive_tier(f: &ProofFacts) -> CausalProofTier {
    if f.counterfactual_verified {
        return CausalProofTier::CounterfactualVerified;
    }
    match f.change_verdict {
        Some(Verdict::IsolatedToNewVersion) => CausalProofTier::CohortRateIsolated,
        Some(
            Verdict::SequentialPostCutoverRegression
            | Verdict::SharedDegradationNewVersionAggressor,
        ) => CausalProofTier::CorroboratedCandidate,
        // Overlap alone: capped here, whatever else the client claims.
        _ if f.code_path_overlap => CausalProofTier::CorroboratedCandidate,
        _ => CausalProofTier::UnverifiedLocus,
    }
}

/// The fields of a recurrence fingerprint.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FingerprintInput {
    /// The service (graph node) where the failure originated.
    pub originating_node_id: String,
    /// The operation, normalized (ids and numbers replaced).
    pub normalized_operation: String,
    /// Exception type or error class.
    pub error_signature: String,
    /// The downstream node it failed on, if any.
    #[serde(default)]
    pub downstream_target_node_id: String,
}

/// Replace digit runs and hex ids in an operation name with `{n}`, so
/// `GET /orders/123` and `GET /orders/456` share a fingerprint.
pub fn normalize_operation(op: &str) -> String {
    op.split('/')
        .map(|seg| {
            let looks_like_id = !seg.is_empty()
                && (seg.bytes().all(|b| b.is_ascii_digit())
                    || (seg.len() >= 8 && seg.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-')));
            if looks_like_id { "{n}" } else { seg }
        })
        .collect::<Vec<_>>()
        .join("/")
}

/// `fp_` + sha256 over environment and the four fields, unit-separated.
pub fn fingerprint(environment: &str, f: &FingerprintInput) -> String {
    let mut h = Sha256::new();
    for part in [
        environment,
        &f.originating_node_id,
        &normalize_operation(&f.normalized_operation),
        &f.error_signature,
        &f.downstream_target_node_id,
    ] {
        h.update(part.as_bytes());
        h.update([0x1f]);
    }
    format!("fp_{}", hex::encode(&h.finalize()[..16]))
}

/// An eval run as the pairing check reads it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EvalRun {
    /// Id.
    pub id: String,
    /// The eval case.
    pub eval_case_id: String,
    /// Hash of the input payload.
    pub input_payload_hash: String,
    /// Passed.
    pub passed: bool,
    /// Service version it ran against.
    pub service_version: Option<String>,
    /// Commit it ran against.
    pub commit_sha: Option<String>,
    /// Agent version it ran against.
    pub candidate_agent_version: Option<String>,
    /// Fingerprint of the failure it produced.
    pub failure_fingerprint: Option<String>,
}

/// The broken state a baseline must reproduce: the finding's fingerprint
/// and its contributing change's version, commit and agent version.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BrokenState {
    /// The finding's recurrence fingerprint.
    pub fingerprint: String,
    /// The contributing change's `version` (None: no change named, or the
    /// change records none).
    pub service_version: Option<String>,
    /// The contributing change's `commitSha`.
    pub commit_sha: Option<String>,
    /// The contributing change's `candidateAgentVersion`.
    pub candidate_agent_version: Option<String>,
}

/// Why a pairing does not verify.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize)]
#[serde(tag = "code", content = "message", rename_all = "snake_case")]
pub enum CounterfactualRefusal {
    /// The baseline run passed: it reproduces nothing.
    #[error("baseline run {0} passed; a baseline must fail against the broken state")]
    BaselinePassed(String),
    /// The baseline's failure is not the finding's.
    #[error("baseline run {run} failure fingerprint {got:?} is not the finding's {want}")]
    FailureFingerprintMismatch {
        run: String,
        got: Option<String>,
        want: String,
    },
    /// The baseline ran against another version than the broken one, or
    /// does not say which it ran against.
    #[error("baseline run {run} ran against {field} {got:?}, not the broken {want:?}")]
    NotBrokenState {
        run: String,
        field: &'static str,
        got: Option<String>,
        want: String,
    },
    /// The broken state itself is not pinned down: the finding names no
    /// contributing change, or that change does not record this field.
    #[error(
        "the broken {field} is unknown: name a contributingChangeId whose change records {field}, so a baseline can be held to it"
    )]
    BrokenStateUnknown { field: &'static str },
    /// `requiredTrials` below 1.
    #[error("requiredTrials must be at least 1")]
    NoTrialsRequired,
    /// Fewer passing runs than required.
    #[error("{got} passing runs of the same case and payload; {want} required")]
    TooFewPasses { got: usize, want: usize },
    /// A candidate run failed.
    #[error("candidate run {0} did not pass")]
    CandidateFailed(String),
    /// A candidate run is of another case.
    #[error("candidate run {run} is eval case {got:?}, the baseline is {want:?}")]
    CaseMismatch {
        run: String,
        got: String,
        want: String,
    },
    /// A candidate run had another payload.
    #[error("candidate run {run} input payload hash {got:?} differs from the baseline's {want:?}")]
    PayloadMismatch {
        run: String,
        got: String,
        want: String,
    },
    /// A candidate ran against the broken version itself.
    #[error("candidate run {0} ran against the broken version; it is no remediation")]
    CandidateIsBroken(String),
}

/// The seed's pairing: a failing baseline against the broken state with the
/// finding's failure fingerprint, and `required_trials` distinct passing runs
/// of the same case and payload against another (candidate) state.
pub fn check_counterfactual(
    broken: &BrokenState,
    failing: &EvalRun,
    passing: &[EvalRun],
    required_trials: usize,
) -> Result<(), CounterfactualRefusal> {
    if required_trials < 1 {
        return Err(CounterfactualRefusal::NoTrialsRequired);
    }
    if failing.passed {
        return Err(CounterfactualRefusal::BaselinePassed(failing.id.clone()));
    }
    if failing.failure_fingerprint.as_deref() != Some(broken.fingerprint.as_str()) {
        return Err(CounterfactualRefusal::FailureFingerprintMismatch {
            run: failing.id.clone(),
            got: failing.failure_fingerprint.clone(),
            want: broken.fingerprint.clone(),
        });
    }
    // Each of the three is required on both sides and compared exactly: a
    // baseline that does not say what it ran against proves nothing.
    for (field, want, got) in [
        (
            "serviceVersion",
            &broken.service_version,
            &failing.service_version,
        ),
        ("commitSha", &broken.commit_sha, &failing.commit_sha),
        (
            "candidateAgentVersion",
            &broken.candidate_agent_version,
            &failing.candidate_agent_version,
        ),
    ] {
        let Some(want) = want else {
            return Err(CounterfactualRefusal::BrokenStateUnknown { field });
        };
        if got.as_deref() != Some(want.as_str()) {
            return Err(CounterfactualRefusal::NotBrokenState {
                run: failing.id.clone(),
                field,
                got: got.clone(),
                want: want.clone(),
            });
        }
    }
    let mut seen = std::collections::BTreeSet::new();
    for run in passing {
        if !seen.insert(run.id.as_str()) {
            continue;
        }
        if !run.passed {
            return Err(CounterfactualRefusal::CandidateFailed(run.id.clone()));
        }
        if run.eval_case_id != failing.eval_case_id {
            return Err(CounterfactualRefusal::CaseMismatch {
                run: run.id.clone(),
                got: run.eval_case_id.clone(),
                want: failing.eval_case_id.clone(),
            });
        }
        if run.input_payload_hash != failing.input_payload_hash {
            return Err(CounterfactualRefusal::PayloadMismatch {
                run: run.id.clone(),
                got: run.input_payload_hash.clone(),
                want: failing.input_payload_hash.clone(),
            });
        }
        let same = |a: &Option<String>, b: &Option<String>| a.is_some() && a == b;
        if same(&run.service_version, &failing.service_version)
            && same(&run.commit_sha, &failing.commit_sha)
            && run.candidate_agent_version == failing.candidate_agent_version
        {
            return Err(CounterfactualRefusal::CandidateIsBroken(run.id.clone()));
        }
    }
    if seen.len() < required_trials {
        return Err(CounterfactualRefusal::TooFewPasses {
            got: seen.len(),
            want: required_trials,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tier_table() {
        use CausalProofTier as T;
        use Verdict as V;
        let rows = [
            (None, false, false, T::UnverifiedLocus),
            (None, false, true, T::CorroboratedCandidate),
            (
                Some(V::NoRegressionDetected),
                false,
                true,
                T::CorroboratedCandidate,
            ),
            (
                Some(V::InsufficientSample),
                false,
                false,
                T::UnverifiedLocus,
            ),
            (
                Some(V::SharedDegradationExternalCause),
                false,
                false,
                T::UnverifiedLocus,
            ),
            (
                Some(V::IsolatedToNewVersion),
                false,
                false,
                T::CohortRateIsolated,
            ),
            (
                Some(V::IsolatedToNewVersion),
                false,
                true,
                T::CohortRateIsolated,
            ),
            (
                Some(V::SequentialPostCutoverRegression),
                false,
                false,
                T::CorroboratedCandidate,
            ),
            (
                Some(V::SharedDegradationNewVersionAggressor),
                false,
                false,
                T::CorroboratedCandidate,
            ),
            (None, true, false, T::CounterfactualVerified),
            (
                Some(V::NoRegressionDetected),
                true,
                false,
                T::CounterfactualVerified,
            ),
        ];
        for (v, cf, overlap, want) in rows {
            let got = derive_tier(&ProofFacts {
                change_verdict: v,
                counterfactual_verified: cf,
                code_path_overlap: overlap,
            });
            assert_eq!(got, want, "{v:?} cf={cf} overlap={overlap}");
        }
    }

    #[test]
    fn fingerprint_ignores_ids_in_the_operation() {
        let f = |op: &str| {
            fingerprint(
                "prod",
                &FingerprintInput {
                    originating_node_id: "checkout-api".into(),
                    normalized_operation: op.into(),
                    error_signature: "TimeoutError".into(),
                    downstream_target_node_id: String::new(),
                },
            )
        };
        assert_eq!(f("GET /orders/123"), f("GET /orders/456"));
        assert_ne!(f("GET /orders/123"), f("GET /carts/123"));
    }

    fn run(id: &str, passed: bool, payload: &str) -> EvalRun {
        EvalRun {
            id: id.into(),
            eval_case_id: "case-1".into(),
            input_payload_hash: payload.into(),
            passed,
            service_version: Some(if passed { "2.4.2" } else { "2.4.1" }.into()),
            commit_sha: Some(if passed { "9c4d" } else { "8f3a" }.into()),
            candidate_agent_version: Some("agent-7".into()),
            failure_fingerprint: (!passed).then(|| "fp_x".into()),
        }
    }

    fn broken() -> BrokenState {
        BrokenState {
            fingerprint: "fp_x".into(),
            service_version: Some("2.4.1".into()),
            commit_sha: Some("8f3a".into()),
            candidate_agent_version: Some("agent-7".into()),
        }
    }

    // Regression (issue 28): the baseline's serviceVersion, commitSha and
    // candidateAgentVersion were compared only when both sides gave them
    // (the agent version never), so any failing run with the finding's
    // fingerprint was a baseline.
    #[test]
    fn the_baseline_must_name_each_broken_field_exactly() {
        type Set = fn(&mut EvalRun, Option<String>);
        type Pin = fn(&mut BrokenState, Option<String>);
        let fields: [(&str, Set, Pin); 3] = [
            (
                "serviceVersion",
                |r, v| r.service_version = v,
                |b, v| b.service_version = v,
            ),
            (
                "commitSha",
                |r, v| r.commit_sha = v,
                |b, v| b.commit_sha = v,
            ),
            (
                "candidateAgentVersion",
                |r, v| r.candidate_agent_version = v,
                |b, v| b.candidate_agent_version = v,
            ),
        ];
        let pass = [run("p", true, "h")];
        assert_eq!(
            check_counterfactual(&broken(), &run("f", false, "h"), &pass, 1),
            Ok(())
        );
        for (field, set, pin) in fields {
            for got in [None, Some("other".to_string())] {
                let mut baseline = run("f", false, "h");
                set(&mut baseline, got.clone());
                assert_eq!(
                    check_counterfactual(&broken(), &baseline, &pass, 1),
                    Err(CounterfactualRefusal::NotBrokenState {
                        run: "f".into(),
                        field,
                        got,
                        want: match field {
                            "serviceVersion" => "2.4.1",
                            "commitSha" => "8f3a",
                            _ => "agent-7",
                        }
                        .into(),
                    }),
                    "{field}"
                );
            }
            // The broken side unknown: nothing to hold the baseline to.
            let mut b = broken();
            pin(&mut b, None);
            assert_eq!(
                check_counterfactual(&b, &run("f", false, "h"), &pass, 1),
                Err(CounterfactualRefusal::BrokenStateUnknown { field }),
                "{field}"
            );
        }
    }

    #[test]
    fn counterfactual_table() {
        let broken = broken();
        let ok = check_counterfactual(&broken, &run("f", false, "h"), &[run("p", true, "h")], 1);
        assert_eq!(ok, Ok(()));
        // A passing "baseline": nothing was reproduced.
        assert!(matches!(
            check_counterfactual(&broken, &run("f", true, "h"), &[run("p", true, "h")], 1),
            Err(CounterfactualRefusal::BaselinePassed(_))
        ));
        assert!(matches!(
            check_counterfactual(
                &broken,
                &run("f", false, "h"),
                &[run("p", true, "other")],
                1
            ),
            Err(CounterfactualRefusal::PayloadMismatch { .. })
        ));
        // K = 2 needs two distinct passing runs; the same id twice is one.
        assert!(matches!(
            check_counterfactual(
                &broken,
                &run("f", false, "h"),
                &[run("p", true, "h"), run("p", true, "h")],
                2
            ),
            Err(CounterfactualRefusal::TooFewPasses { got: 1, want: 2 })
        ));
        assert_eq!(
            check_counterfactual(
                &broken,
                &run("f", false, "h"),
                &[run("p", true, "h"), run("q", true, "h")],
                2
            ),
            Ok(())
        );
        let mut wrong_fp = run("f", false, "h");
        wrong_fp.failure_fingerprint = Some("fp_other".into());
        assert!(matches!(
            check_counterfactual(&broken, &wrong_fp, &[run("p", true, "h")], 1),
            Err(CounterfactualRefusal::FailureFingerprintMismatch { .. })
        ));
        let mut wrong_version = run("f", false, "h");
        wrong_version.service_version = Some("2.4.0".into());
        assert!(matches!(
            check_counterfactual(&broken, &wrong_version, &[run("p", true, "h")], 1),
            Err(CounterfactualRefusal::NotBrokenState { .. })
        ));
        assert_eq!(
            check_counterfactual(&broken, &run("f", false, "h"), &[run("p", true, "h")], 0),
            Err(CounterfactualRefusal::NoTrialsRequired)
        );
    }
}
