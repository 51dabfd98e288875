//! Admission of a remediation proposal, as a pure function of typed
//! readings: [`propose`] → a [`ProposePlan`] or a typed [`Refusal`].
//!
//! The route (`pstack_store::http::gate`, `POST /v1/remediations/propose`)
//! loads — the finding, the incident, the cited pre-mutation envelope's
//! facts, the finding's tier evidence — then calls [`propose`], then
//! persists the plan (minting the grant token, sealing the callback,
//! inserting under the fence and the circuit breaker) and answers.
//!
//! Invariants:
//! - Refusals come in one fixed order (action, requested autonomy, finding,
//!   incident, their match, target, expected state, pre-mutation envelope,
//!   callback), so one request always gets the same first refusal.
//! - The tier is the server's: the finding's, lowered when the evidence
//!   rests on the proposing key's own records ([`provenance::gate_tier`]);
//!   the caller's requested autonomy can only lower what the policy matrix
//!   allows ([`policy::effective_autonomy`]).
//! - A host-subject action cites a stored envelope of that subject, judged
//!   by the store's one freshness rule ([`Freshness::judge_pre_mutation`]).
//! - Nothing here reads a clock, a database or the network: `now_ns` and
//!   every stored fact are inputs.

use serde_json::Value;

use super::policy::{self, Action, Autonomy, Status};
use super::provenance::{self, Demotion, TierEvidence};
use crate::analysis::proof::CausalProofTier;
use crate::db::analysis::FindingRow;
use crate::db::gate::{IncidentRow, service_node_key};
use crate::runs::freshness::{EnvelopeFacts, Freshness};

/// Why a proposal is refused (HTTP 422 with `code`, `message`, `field`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {message} ({field})")]
pub struct Refusal {
    /// Stable code, e.g. `unknown_action`.
    pub code: &'static str,
    /// What is wrong, for a human.
    pub message: String,
    /// The request field at fault (`target.environment`, …).
    pub field: String,
}

fn refuse(code: &'static str, message: impl Into<String>, field: &str) -> Refusal {
    Refusal {
        code,
        message: message.into(),
        field: field.to_string(),
    }
}

/// A required text field: not blank, at most 1024 bytes.
pub fn text_field(field: &str, v: &str) -> Result<(), Refusal> {
    if v.trim().is_empty() || v.len() > 1024 {
        return Err(refuse(
            "invalid_field",
            "required, at most 1024 bytes",
            field,
        ));
    }
    Ok(())
}

/// A validated target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The graph node key (`subject:<key>` or the service node).
    pub key: String,
    /// The subject key, for a host-subject target.
    pub subject: Option<String>,
}

/// What the route read for one proposal.
#[derive(Debug)]
pub struct ProposeReadings<'a, C> {
    /// `action` as sent.
    pub action: &'a str,
    /// `requestedAutonomy` as sent.
    pub requested_autonomy: Option<&'a str>,
    /// `findingId` as sent, and the finding stored under it.
    pub finding_id: &'a str,
    /// The finding, if stored.
    pub finding: Option<&'a FindingRow>,
    /// `incidentId` as sent.
    pub incident_id: &'a str,
    /// The incident, if stored.
    pub incident: Option<&'a IncidentRow>,
    /// `target` as sent.
    pub target: &'a Value,
    /// `expectedCurrentState` as sent.
    pub expected_current_state: &'a Value,
    /// `preMutationEnvelope` as sent.
    pub pre_mutation_envelope: Option<&'a str>,
    /// The facts of that envelope, if stored.
    pub envelope: Option<&'a EnvelopeFacts>,
    /// The finding's tier evidence (with its writers), if the finding is stored.
    pub tier_evidence: Option<&'a TierEvidence>,
    /// The proposing key.
    pub key_id: &'a str,
    /// The callback, validated by the route (URL parsing is the HTTP
    /// client's), or why it is refused.
    pub callback: Result<Option<C>, Refusal>,
    /// The freshness rule of the store.
    pub freshness: &'a Freshness,
    /// Now, ns (the gate's clock).
    pub now_ns: i64,
}

/// What to persist for an admitted proposal.
#[derive(Debug, Clone, PartialEq)]
pub struct ProposePlan<C> {
    /// The incident's id.
    pub incident_id: String,
    /// The finding's id.
    pub finding_id: String,
    /// The finding's recurrence fingerprint (the circuit breaker's key).
    pub fingerprint: String,
    /// The action.
    pub action: Action,
    /// The autonomy the caller asked for, if any.
    pub requested: Option<Autonomy>,
    /// The target.
    pub target: Target,
    /// The tier the gate acts on.
    pub tier: CausalProofTier,
    /// Set when that tier is below the finding's (self-attested evidence).
    pub demotion: Option<Demotion>,
    /// The autonomy the policy allows.
    pub effective: Autonomy,
    /// The first status: `grant_issued` (mint a token now),
    /// `pending_human_approval` (seal the callback for later) or another.
    pub status: Status,
    /// The callback, if any.
    pub callback: Option<C>,
}

/// Admit or refuse one proposal.
pub fn propose<C>(r: ProposeReadings<'_, C>) -> Result<ProposePlan<C>, Refusal> {
    let Some(action) = Action::parse(r.action) else {
        return Err(refuse(
            "unknown_action",
            format!(
                "{:?} is not one of {}",
                r.action,
                Action::ALL.map(Action::as_str).join(", ")
            ),
            "action",
        ));
    };
    let requested = match r.requested_autonomy {
        None => None,
        Some(a) => match Autonomy::parse(a) {
            Some(a) if a != Autonomy::BlockedByPolicy => Some(a),
            _ => {
                return Err(refuse(
                    "invalid_requested_autonomy",
                    "requestedAutonomy is read_only, suggested_action, human_approved_write or autonomous_write",
                    "requestedAutonomy",
                ));
            }
        },
    };
    let (Some(finding), Some(evidence)) = (r.finding, r.tier_evidence) else {
        return Err(refuse(
            "unknown_finding",
            format!("no finding {}", r.finding_id),
            "findingId",
        ));
    };
    let Some(incident) = r.incident else {
        return Err(refuse(
            "unknown_incident",
            format!("no incident {}", r.incident_id),
            "incidentId",
        ));
    };
    if let Some(fi) = &finding.incident_id
        && fi != &incident.id
    {
        return Err(refuse(
            "finding_incident_mismatch",
            format!("finding {} belongs to incident {fi}", finding.id),
            "findingId",
        ));
    }
    let target = parse_target(r.target, &incident.environment)?;
    check_expected_state(r.expected_current_state, target.subject.is_some())?;
    match &target.subject {
        Some(subject) => {
            check_envelope(&r, subject)?;
            if let Some(d) = r.expected_current_state.get("envelopeDigest")
                && d.as_str() != r.pre_mutation_envelope
            {
                return Err(refuse(
                    "invalid_expected_state",
                    "envelopeDigest must be the preMutationEnvelope",
                    "expectedCurrentState.envelopeDigest",
                ));
            }
        }
        None if r.pre_mutation_envelope.is_some() => {
            return Err(refuse(
                "field_not_applicable",
                "preMutationEnvelope applies to host-subject targets",
                "preMutationEnvelope",
            ));
        }
        None => {}
    }
    let callback = r.callback?;
    // The tier is the server's, recorded on the finding; never the caller's,
    // and never one resting on the proposing key's own evidence.
    let gated = provenance::gate_tier(evidence, provenance::Actor::Proposer(r.key_id));
    let effective = policy::effective_autonomy(action, gated.tier, requested);
    Ok(ProposePlan {
        incident_id: incident.id.clone(),
        finding_id: finding.id.clone(),
        fingerprint: finding.fingerprint.clone(),
        action,
        requested,
        target,
        tier: gated.tier,
        demotion: gated.demotion,
        effective,
        status: policy::initial_status(effective),
        callback,
    })
}

/// `target`: `{service, environment}` (the incident's environment) or
/// `{subject}`.
pub fn parse_target(t: &Value, incident_env: &str) -> Result<Target, Refusal> {
    let Some(obj) = t.as_object() else {
        return Err(refuse(
            "invalid_target",
            "target is {service, environment} or {subject}",
            "target",
        ));
    };
    for k in obj.keys() {
        if !["service", "environment", "subject"].contains(&k.as_str()) {
            return Err(refuse(
                "invalid_target",
                format!("unknown target field {k:?}"),
                &format!("target.{k}"),
            ));
        }
    }
    let s = |k: &str| obj.get(k).and_then(Value::as_str);
    if let Some(subject) = s("subject") {
        text_field("target.subject", subject)?;
        return Ok(Target {
            key: format!("subject:{subject}"),
            subject: Some(subject.to_string()),
        });
    }
    match (s("service"), s("environment")) {
        (Some(svc), Some(env)) => {
            text_field("target.service", svc)?;
            if env != incident_env {
                return Err(refuse(
                    "invalid_target",
                    format!("target environment {env:?} is not the incident's ({incident_env:?})"),
                    "target.environment",
                ));
            }
            Ok(Target {
                key: service_node_key(env, svc),
                subject: None,
            })
        }
        (None, _) => Err(refuse(
            "invalid_target",
            "give target.service and target.environment, or target.subject",
            "target.service",
        )),
        (_, None) => Err(refuse(
            "invalid_target",
            "target.environment is required with target.service",
            "target.environment",
        )),
    }
}

const STATE_FIELDS: [&str; 3] = ["version", "commitSha", "configDigest"];

/// `expectedCurrentState`: `{envelopeDigest}` for a host subject, else
/// strings among [`STATE_FIELDS`] and a `flags` object.
pub fn check_expected_state(v: &Value, subject: bool) -> Result<(), Refusal> {
    let field = "expectedCurrentState";
    let Some(obj) = v.as_object() else {
        return Err(refuse("invalid_expected_state", "an object", field));
    };
    if subject {
        // A host subject's state is its newest sealed envelope: the cited
        // pre-mutation one (optionally restated as envelopeDigest).
        for (k, val) in obj {
            if k != "envelopeDigest" || !val.is_string() {
                return Err(refuse(
                    "invalid_expected_state",
                    "a host subject's expected state is {envelopeDigest} (the pre-mutation envelope)",
                    &format!("{field}.{k}"),
                ));
            }
        }
        return Ok(());
    }
    if obj.is_empty() {
        return Err(refuse(
            "invalid_expected_state",
            format!("name at least one of {}, flags", STATE_FIELDS.join(", ")),
            field,
        ));
    }
    for (k, val) in obj {
        if k == "flags" {
            let ok = val.as_object().is_some_and(|f| {
                !f.is_empty()
                    && f.values()
                        .all(|v| v.is_string() || v.is_boolean() || v.is_number())
            });
            if !ok {
                return Err(refuse(
                    "invalid_expected_state",
                    "flags is an object of flag name → string, boolean or number",
                    &format!("{field}.flags"),
                ));
            }
            continue;
        }
        if !STATE_FIELDS.contains(&k.as_str()) || !val.is_string() {
            return Err(refuse(
                "invalid_expected_state",
                format!(
                    "fields are strings among {}, and flags",
                    STATE_FIELDS.join(", ")
                ),
                &format!("{field}.{k}"),
            ));
        }
    }
    Ok(())
}

/// The pre-mutation envelope rule: a stored envelope of the same subject,
/// `complete` or `bounded`, captured before now and within its kind's
/// freshness — the store's one rule ([`crate::runs::freshness`]), shared
/// with supervised runs.
fn check_envelope<C>(r: &ProposeReadings<'_, C>, subject: &str) -> Result<(), Refusal> {
    pre_mutation_envelope(
        r.pre_mutation_envelope,
        r.envelope,
        subject,
        r.freshness,
        r.now_ns,
    )
}

/// The pre-mutation envelope rule on its readings: `digest` as cited,
/// `facts` of the envelope stored under it. Also judged when a grant is
/// approved or claimed ([`crate::gate::grant`]): an envelope past its
/// freshness never authorizes.
pub fn pre_mutation_envelope(
    digest: Option<&str>,
    facts: Option<&EnvelopeFacts>,
    subject: &str,
    freshness: &Freshness,
    now_ns: i64,
) -> Result<(), Refusal> {
    let field = "preMutationEnvelope";
    let Some(d) = digest else {
        return Err(refuse(
            "pre_mutation_envelope_required",
            format!(
                "an action on host subject {subject:?} cites the digest of a sealed envelope of that subject captured before it (preMutationEnvelope)"
            ),
            field,
        ));
    };
    let Some(facts) = facts else {
        return Err(refuse(
            "pre_mutation_envelope_unknown",
            format!("no stored envelope {d}"),
            field,
        ));
    };
    freshness
        .judge_pre_mutation(facts, subject, now_ns)
        .map_err(|e| refuse(e.code(), e.to_string(), field))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use pstack_envelope::Completeness;
    use serde_json::json;

    use super::*;
    use crate::gate::provenance::Measurement;

    const NOW: i64 = 1_800_000_000_000_000_000;
    const SUBJECT: &str = "process:abc";
    const DIGEST: &str = "sha256:aa";

    /// Everything a route would read for an admissible service proposal.
    struct World {
        finding: FindingRow,
        incident: IncidentRow,
        evidence: TierEvidence,
        envelope: EnvelopeFacts,
        freshness: Freshness,
        target: Value,
        state: Value,
    }

    fn world(tier: CausalProofTier) -> World {
        World {
            finding: FindingRow {
                id: "fnd_1".into(),
                environment: "prod".into(),
                incident_id: Some("inc_1".into()),
                fault_locus_entity_id: "svc".into(),
                causal_chain: json!([]),
                cited_evidence_ids: json!([]),
                contributing_change_id: None,
                change_verdict: None,
                counterfactual: None,
                fingerprint: "fp".into(),
                fingerprint_input: json!({}),
                causal_proof_tier: tier.as_str().into(),
                idempotency_key: "k".into(),
                created_ns: 0,
                updated_ns: 0,
            },
            incident: IncidentRow {
                id: "inc_1".into(),
                project_id: "p".into(),
                environment: "prod".into(),
                dedup_key: "d".into(),
                title: "t".into(),
                fault_locus_entity_id: None,
                status: "open".into(),
                lease_runner_id: None,
                lease_expires_ns: None,
                fencing_token: 0,
                alert_count: 1,
                created_ns: 0,
                updated_ns: 0,
            },
            evidence: TierEvidence {
                finding_tier: tier,
                cohort: None,
                counterfactual: None,
            },
            envelope: EnvelopeFacts {
                digest: DIGEST.into(),
                subject_key: SUBJECT.into(),
                kind: "process".into(),
                wall_ns: NOW - 1_000_000_000,
                completeness: Completeness::Complete,
            },
            freshness: Freshness::default(),
            target: json!({"service": "checkout", "environment": "prod"}),
            state: json!({"version": "2.4.1"}),
        }
    }

    /// One request; `edit` changes the readings from the admissible default.
    fn run<'a>(
        w: &'a World,
        edit: impl FnOnce(&mut ProposeReadings<'a, &'static str>),
    ) -> Result<ProposePlan<&'static str>, Refusal> {
        let mut r = ProposeReadings {
            action: "rollback_deploy",
            requested_autonomy: None,
            finding_id: "fnd_1",
            finding: Some(&w.finding),
            incident_id: "inc_1",
            incident: Some(&w.incident),
            target: &w.target,
            expected_current_state: &w.state,
            pre_mutation_envelope: None,
            envelope: None,
            tier_evidence: Some(&w.evidence),
            key_id: "key_proposer",
            callback: Ok(None),
            freshness: &w.freshness,
            now_ns: NOW,
        };
        edit(&mut r);
        propose(r)
    }

    fn refused(r: Result<ProposePlan<&'static str>, Refusal>) -> (&'static str, String) {
        match r {
            Err(e) => (e.code, e.field),
            Ok(p) => panic!("admitted: {p:?}"),
        }
    }

    #[test]
    fn each_refusal_names_its_code_and_field() {
        let w = world(CausalProofTier::CorroboratedCandidate);
        let other_incident = IncidentRow {
            id: "inc_2".into(),
            ..w.incident.clone()
        };
        let subject_target = json!({"subject": SUBJECT});
        let subject_state = json!({});
        let not_object = json!("checkout");
        let unknown_field = json!({"service": "a", "environment": "prod", "region": "eu"});
        let other_env = json!({"service": "a", "environment": "staging"});
        let service_only = json!({"service": "a"});
        let env_only = json!({"environment": "prod"});
        let blank_subject = json!({"subject": "  "});
        let empty_state = json!({});
        let bad_state_field = json!({"image": "x"});
        let number_state = json!({"version": 3});
        let empty_flags = json!({"flags": {}});
        let nested_flags = json!({"flags": {"a": {"b": 1}}});
        let subject_with_version = json!({"version": "1"});
        let other_digest_state = json!({"envelopeDigest": "sha256:bb"});
        let other_subject = EnvelopeFacts {
            subject_key: "process:other".into(),
            ..w.envelope.clone()
        };
        let partial = EnvelopeFacts {
            completeness: Completeness::Partial,
            ..w.envelope.clone()
        };
        let future = EnvelopeFacts {
            wall_ns: NOW + 1,
            ..w.envelope.clone()
        };
        type Edit<'a> = Box<dyn FnOnce(&mut ProposeReadings<'a, &'static str>) + 'a>;
        let cases: Vec<(&str, Edit<'_>, &str, &str)> = vec![
            (
                "unknown action",
                Box::new(|r| r.action = "reboot"),
                "unknown_action",
                "action",
            ),
            (
                "requested blocked",
                Box::new(|r| r.requested_autonomy = Some("blocked_by_policy")),
                "invalid_requested_autonomy",
                "requestedAutonomy",
            ),
            (
                "requested unknown",
                Box::new(|r| r.requested_autonomy = Some("yolo")),
                "invalid_requested_autonomy",
                "requestedAutonomy",
            ),
            (
                "no finding",
                Box::new(|r| {
                    r.finding = None;
                    r.tier_evidence = None;
                }),
                "unknown_finding",
                "findingId",
            ),
            (
                "no incident",
                Box::new(|r| r.incident = None),
                "unknown_incident",
                "incidentId",
            ),
            (
                "finding of another incident",
                Box::new(|r| r.incident = Some(&other_incident)),
                "finding_incident_mismatch",
                "findingId",
            ),
            (
                "target not an object",
                Box::new(|r| r.target = &not_object),
                "invalid_target",
                "target",
            ),
            (
                "unknown target field",
                Box::new(|r| r.target = &unknown_field),
                "invalid_target",
                "target.region",
            ),
            (
                "target in another environment",
                Box::new(|r| r.target = &other_env),
                "invalid_target",
                "target.environment",
            ),
            (
                "service without environment",
                Box::new(|r| r.target = &service_only),
                "invalid_target",
                "target.environment",
            ),
            (
                "environment without service",
                Box::new(|r| r.target = &env_only),
                "invalid_target",
                "target.service",
            ),
            (
                "blank subject",
                Box::new(|r| r.target = &blank_subject),
                "invalid_field",
                "target.subject",
            ),
            (
                "empty expected state",
                Box::new(|r| r.expected_current_state = &empty_state),
                "invalid_expected_state",
                "expectedCurrentState",
            ),
            (
                "unknown state field",
                Box::new(|r| r.expected_current_state = &bad_state_field),
                "invalid_expected_state",
                "expectedCurrentState.image",
            ),
            (
                "state field not a string",
                Box::new(|r| r.expected_current_state = &number_state),
                "invalid_expected_state",
                "expectedCurrentState.version",
            ),
            (
                "empty flags",
                Box::new(|r| r.expected_current_state = &empty_flags),
                "invalid_expected_state",
                "expectedCurrentState.flags",
            ),
            (
                "nested flag",
                Box::new(|r| r.expected_current_state = &nested_flags),
                "invalid_expected_state",
                "expectedCurrentState.flags",
            ),
            (
                "subject state with a version",
                Box::new(|r| {
                    r.target = &subject_target;
                    r.expected_current_state = &subject_with_version;
                }),
                "invalid_expected_state",
                "expectedCurrentState.version",
            ),
            (
                "subject without envelope",
                Box::new(|r| {
                    r.target = &subject_target;
                    r.expected_current_state = &subject_state;
                }),
                "pre_mutation_envelope_required",
                "preMutationEnvelope",
            ),
            (
                "subject envelope not stored",
                Box::new(|r| {
                    r.target = &subject_target;
                    r.expected_current_state = &subject_state;
                    r.pre_mutation_envelope = Some(DIGEST);
                }),
                "pre_mutation_envelope_unknown",
                "preMutationEnvelope",
            ),
            (
                "envelope of another subject",
                Box::new(|r| {
                    r.target = &subject_target;
                    r.expected_current_state = &subject_state;
                    r.pre_mutation_envelope = Some(DIGEST);
                    r.envelope = Some(&other_subject);
                }),
                "pre_mutation_envelope_wrong_subject",
                "preMutationEnvelope",
            ),
            (
                "partial envelope",
                Box::new(|r| {
                    r.target = &subject_target;
                    r.expected_current_state = &subject_state;
                    r.pre_mutation_envelope = Some(DIGEST);
                    r.envelope = Some(&partial);
                }),
                "pre_mutation_envelope_incomplete",
                "preMutationEnvelope",
            ),
            (
                "envelope from the future",
                Box::new(|r| {
                    r.target = &subject_target;
                    r.expected_current_state = &subject_state;
                    r.pre_mutation_envelope = Some(DIGEST);
                    r.envelope = Some(&future);
                }),
                "pre_mutation_envelope_not_before",
                "preMutationEnvelope",
            ),
            (
                "envelopeDigest not the cited one",
                Box::new(|r| {
                    r.target = &subject_target;
                    r.expected_current_state = &other_digest_state;
                    r.pre_mutation_envelope = Some(DIGEST);
                    r.envelope = Some(&w.envelope);
                }),
                "invalid_expected_state",
                "expectedCurrentState.envelopeDigest",
            ),
            (
                "envelope on a service target",
                Box::new(|r| r.pre_mutation_envelope = Some(DIGEST)),
                "field_not_applicable",
                "preMutationEnvelope",
            ),
            (
                "callback refused",
                Box::new(|r| r.callback = Err(refuse("invalid_webhook_url", "bad", "webhookUrl"))),
                "invalid_webhook_url",
                "webhookUrl",
            ),
        ];
        for (name, edit, code, field) in cases {
            assert_eq!(refused(run(&w, edit)), (code, field.to_string()), "{name}");
        }
    }

    #[test]
    fn refusals_come_in_one_order() {
        let w = world(CausalProofTier::CorroboratedCandidate);
        let bad_target = json!("x");
        // Unknown action and unknown finding and a bad target: the action first.
        let r = run(&w, |r| {
            r.action = "reboot";
            r.finding = None;
            r.target = &bad_target;
        });
        assert_eq!(refused(r).0, "unknown_action");
        // A bad target and a refused callback: the target first.
        let r = run(&w, |r| {
            r.target = &bad_target;
            r.callback = Err(refuse("invalid_webhook", "x", "webhookSecret"));
        });
        assert_eq!(refused(r).0, "invalid_target");
    }

    #[test]
    fn text_fields_at_and_above_1024_bytes() {
        let w = world(CausalProofTier::CorroboratedCandidate);
        let at = json!({"subject": "s".repeat(1024)});
        let above = json!({"subject": "s".repeat(1025)});
        let state = json!({});
        // At the limit the subject passes and the next rule (the envelope) speaks.
        let r = run(&w, |r| {
            r.target = &at;
            r.expected_current_state = &state;
        });
        assert_eq!(refused(r).0, "pre_mutation_envelope_required");
        let r = run(&w, |r| {
            r.target = &above;
            r.expected_current_state = &state;
        });
        assert_eq!(refused(r), ("invalid_field", "target.subject".to_string()));
    }

    #[test]
    fn pre_mutation_envelope_just_below_and_at_its_freshness() {
        let w = world(CausalProofTier::CohortRateIsolated);
        let target = json!({"subject": SUBJECT});
        let state = json!({"envelopeDigest": DIGEST});
        let expires = w.freshness.expires_ns("process", w.envelope.wall_ns);
        let at = |now: i64| {
            run(&w, |r| {
                r.target = &target;
                r.expected_current_state = &state;
                r.pre_mutation_envelope = Some(DIGEST);
                r.envelope = Some(&w.envelope);
                r.now_ns = now;
            })
        };
        let plan = at(expires - 1).expect("fresh one ns before expiry");
        assert_eq!(
            plan.target,
            Target {
                key: format!("subject:{SUBJECT}"),
                subject: Some(SUBJECT.into())
            }
        );
        assert_eq!(refused(at(expires)).0, "pre_mutation_envelope_stale");
        assert_eq!(refused(at(expires + 1)).0, "pre_mutation_envelope_stale");
        // Observed exactly now is before-or-at now: admitted.
        assert!(at(w.envelope.wall_ns).is_ok());
    }

    #[test]
    fn the_plan_is_the_policy_at_the_gate_tier() {
        use Autonomy::{AutonomousWrite, BlockedByPolicy, HumanApprovedWrite, SuggestedAction};
        use CausalProofTier::{CohortRateIsolated, CorroboratedCandidate, UnverifiedLocus};
        let writers = |k: &[&str]| Measurement {
            what: "change chg_1".into(),
            writers: k.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>(),
        };
        // (finding tier, cohort writers, action, requested) → (gate tier, demoted, effective, status)
        type Given<'a> = (
            CausalProofTier,
            Option<&'a [&'a str]>,
            &'a str,
            Option<&'a str>,
        );
        type Expected = (CausalProofTier, bool, Autonomy, Status);
        let table: Vec<(Given<'_>, Expected)> = vec![
            (
                (CorroboratedCandidate, None, "rollback_deploy", None),
                (
                    CorroboratedCandidate,
                    false,
                    HumanApprovedWrite,
                    Status::PendingHumanApproval,
                ),
            ),
            (
                (UnverifiedLocus, None, "rollback_deploy", None),
                (UnverifiedLocus, false, BlockedByPolicy, Status::Rejected),
            ),
            (
                (UnverifiedLocus, None, "open_code_pr", None),
                (
                    UnverifiedLocus,
                    false,
                    HumanApprovedWrite,
                    Status::PendingHumanApproval,
                ),
            ),
            (
                (
                    CohortRateIsolated,
                    Some(&["key_other"]),
                    "rollback_deploy",
                    None,
                ),
                (
                    CohortRateIsolated,
                    false,
                    AutonomousWrite,
                    Status::GrantIssued,
                ),
            ),
            (
                (
                    CohortRateIsolated,
                    Some(&["key_other"]),
                    "rollback_deploy",
                    Some("suggested_action"),
                ),
                (
                    CohortRateIsolated,
                    false,
                    SuggestedAction,
                    Status::PendingHumanApproval,
                ),
            ),
            // Requesting more than the policy gives changes nothing.
            (
                (
                    CorroboratedCandidate,
                    None,
                    "rollback_deploy",
                    Some("autonomous_write"),
                ),
                (
                    CorroboratedCandidate,
                    false,
                    HumanApprovedWrite,
                    Status::PendingHumanApproval,
                ),
            ),
            // The proposer's own cohort measurement does not count at the gate.
            (
                (
                    CohortRateIsolated,
                    Some(&["key_proposer"]),
                    "rollback_deploy",
                    None,
                ),
                (
                    CorroboratedCandidate,
                    true,
                    HumanApprovedWrite,
                    Status::PendingHumanApproval,
                ),
            ),
            (
                (CohortRateIsolated, None, "rollback_deploy", None),
                (
                    CorroboratedCandidate,
                    true,
                    HumanApprovedWrite,
                    Status::PendingHumanApproval,
                ),
            ),
        ];
        for ((finding_tier, cohort, action, requested), (tier, demoted, effective, status)) in table
        {
            let mut w = world(finding_tier);
            w.evidence.cohort = cohort.map(writers);
            let plan = run(&w, |r| {
                r.action = action;
                r.requested_autonomy = requested;
                r.callback = Ok(Some("cb"));
            })
            .unwrap_or_else(|e| panic!("{finding_tier:?} {action}: {e}"));
            let case = format!("{finding_tier:?} {cohort:?} {action} {requested:?}");
            assert_eq!(plan.tier, tier, "{case}");
            assert_eq!(plan.demotion.is_some(), demoted, "{case}");
            assert_eq!(plan.effective, effective, "{case}");
            assert_eq!(plan.status, status, "{case}");
            assert_eq!(plan.callback, Some("cb"), "{case}");
            assert_eq!(
                plan.target.key,
                service_node_key("prod", "checkout"),
                "{case}"
            );
        }
    }
}
