//! The life of a grant after its proposal, as pure functions of typed
//! readings: an operator's [`approve`] (mints the grant of a parked
//! proposal) and a runner's [`grant`] (`claim`, `complete` or `fail` a
//! grant) → a plan or a typed [`Refusal`]; and the answers to what the
//! store's guarded transitions return ([`claim_answer`], [`finish_answer`],
//! [`approve_answer`]).
//!
//! The routes (`pstack_store::http::gate`, `POST
//! /internal/remediations/{id}/grant` and `…/approve`) load — the
//! proposal, and for a claim its writer, the finding's tier evidence and
//! the cited envelope's facts — then decide here, then persist the plan
//! through one conditional `UPDATE` (`crate::db::gate`), then answer.
//!
//! Invariants:
//! - Refusals come in one fixed order. Grant: `runnerId`, the proposal, its
//!   grant, the token, then the operation (claim: the claiming key, then
//!   the pre-mutation envelope; complete/fail: the claiming runner).
//!   Approve: the callback, the proposal, its status, the pre-mutation
//!   envelope.
//! - An autonomous grant (no operator decided it) is claimed only by a key
//!   that neither proposed it nor wrote the evidence its tier rests on
//!   ([`provenance`]); an approved grant had its second party in the
//!   operator.
//! - An envelope past its freshness never authorizes: approving or
//!   claiming a host-subject grant judges the cited envelope again, by the
//!   store's one rule ([`admission::pre_mutation_envelope`]).
//! - The windows are the policy's ([`policy::GRANT_CLAIM_WINDOW_NS`],
//!   [`policy::EXECUTION_WINDOW_NS`]), set here in the plan; the storage
//!   only guards them. Whether a window has passed is decided by the
//!   storage inside its transition (the row moves to `expired` or
//!   `execution_timed_out` in the same statement), so it is an answer
//!   here, not a refusal.
//! - Nothing here reads a clock, a database or the network: `now_ns`, the
//!   gate keys and every stored fact are inputs.

use serde_json::{Value, json};

use super::admission::{self, text_field};
use super::keys::GateKeys;
use super::policy::{self, Action, Autonomy};
use super::provenance::{self, TierEvidence};
use super::watchdog;
use crate::analysis::ledger::rfc3339;
use crate::db::gate::{ClaimOutcome, ProposalRow, Transition};
use crate::runs::freshness::{EnvelopeFacts, Freshness};

/// How a refusal is answered (the route maps it to an HTTP status).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefusalKind {
    /// A precondition (a field, the evidence) is missing: 422.
    Precondition,
    /// The caller may not do this: 403.
    Forbidden,
    /// No such proposal: 404.
    NotFound,
    /// The proposal's current state does not allow it: 409.
    Conflict,
    /// A window passed: 410.
    Gone,
}

/// Why a grant operation or an approval is refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct Refusal {
    /// How it is answered.
    pub kind: RefusalKind,
    /// Stable code, e.g. `invalid_grant_token`.
    pub code: &'static str,
    /// What is wrong, for a human.
    pub message: String,
    /// The request field at fault, if one is.
    pub field: Option<String>,
    /// Structured detail (the demotion, the state mismatches), if any.
    pub detail: Option<Value>,
}

fn refuse(
    kind: RefusalKind,
    code: &'static str,
    message: impl Into<String>,
    field: Option<&str>,
) -> Refusal {
    Refusal {
        kind,
        code,
        message: message.into(),
        field: field.map(str::to_string),
        detail: None,
    }
}

impl From<admission::Refusal> for Refusal {
    fn from(r: admission::Refusal) -> Refusal {
        Refusal {
            kind: RefusalKind::Precondition,
            code: r.code,
            message: r.message,
            field: Some(r.field),
            detail: None,
        }
    }
}

/// `proposal_not_found` (404).
pub fn not_found(id: &str) -> Refusal {
    refuse(
        RefusalKind::NotFound,
        "proposal_not_found",
        format!("no remediation proposal {id}"),
        None,
    )
}

/// `invalid_status` (409): the proposal's status does not allow `wanted`.
pub fn status_conflict(p: &ProposalRow, wanted: &str) -> Refusal {
    refuse(
        RefusalKind::Conflict,
        "invalid_status",
        format!("proposal {} is {}; {wanted}", p.id, p.status),
        None,
    )
}

fn already_granted() -> Refusal {
    refuse(
        RefusalKind::Conflict,
        "already_granted",
        "the proposal already has a grant; reject it and propose again if the token was lost",
        None,
    )
}

fn not_claiming_runner() -> Refusal {
    refuse(
        RefusalKind::Forbidden,
        "not_claiming_runner",
        "only the runner that claimed the grant completes or fails it",
        Some("runnerId"),
    )
}

/// A stored time as the answers show it: RFC 3339 text, or `null`.
fn opt_time(ns: Option<i64>) -> Value {
    ns.map_or(Value::Null, |n| json!(rfc3339(n)))
}

/// The envelope rule on a stored proposal, for a host-subject target.
fn judge_envelope(
    p: &ProposalRow,
    envelope: Option<&EnvelopeFacts>,
    freshness: &Freshness,
    now_ns: i64,
) -> Result<(), Refusal> {
    let Some(subject) = p.target_key.strip_prefix("subject:") else {
        return Ok(());
    };
    admission::pre_mutation_envelope(
        p.pre_mutation_envelope.as_deref(),
        envelope,
        subject,
        freshness,
        now_ns,
    )
    .map_err(Refusal::from)
}

// ---- grant: claim, complete, fail ----

/// The operation that claims a grant.
pub const CLAIM: &str = "claim";

/// What the route read for one grant operation.
#[derive(Debug)]
pub struct GrantReadings<'a> {
    /// The proposal id in the path.
    pub id: &'a str,
    /// `operation` as sent.
    pub operation: &'a str,
    /// `grantToken` as sent.
    pub grant_token: &'a str,
    /// `runnerId` as sent.
    pub runner_id: &'a str,
    /// The calling key.
    pub key_id: &'a str,
    /// The proposal, if stored.
    pub proposal: Option<&'a ProposalRow>,
    /// The key that proposed it, if known (read for a claim).
    pub proposer: Option<&'a str>,
    /// The tier evidence of its finding, if the finding is stored (read
    /// for a claim).
    pub tier_evidence: Option<&'a TierEvidence>,
    /// The facts of its cited envelope, if stored (read for a claim).
    pub envelope: Option<&'a EnvelopeFacts>,
    /// The gate keys (the token is checked against the stored hash).
    pub keys: &'a GateKeys,
    /// The freshness rule of the store.
    pub freshness: &'a Freshness,
    /// Now, ns (the gate's clock).
    pub now_ns: i64,
}

/// What to persist for an admitted grant operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GrantPlan<'a> {
    /// Claim: the CAS of the expected state and the move to
    /// `claimed_executing`, guarded by the grant's hash and window.
    Claim {
        /// The stored hash the token matched.
        grant_hash: &'a str,
        /// The claiming runner.
        runner_id: &'a str,
        /// When the execution window closes.
        execution_deadline_ns: i64,
    },
    /// Complete or fail a claimed grant; completion arms the watchdog.
    Finish {
        /// `complete` (true) or `fail`.
        success: bool,
        /// The reporting runner.
        runner_id: &'a str,
        /// The watchdog checkpoints' offsets from now.
        checkpoints: &'static [i64],
    },
}

/// Admit or refuse one grant operation.
pub fn grant<'a>(r: GrantReadings<'a>) -> Result<GrantPlan<'a>, Refusal> {
    text_field("runnerId", r.runner_id)?;
    let Some(p) = r.proposal else {
        return Err(not_found(r.id));
    };
    let Some(hash) = p.grant_hash.as_deref() else {
        return Err(status_conflict(p, "no grant was issued for it"));
    };
    if !r.keys.token_matches(r.grant_token, hash) {
        return Err(refuse(
            RefusalKind::Forbidden,
            "invalid_grant_token",
            "this is not the proposal's grant token",
            Some("grantToken"),
        ));
    }
    match r.operation {
        CLAIM => {
            check_claimer(&r, p)?;
            if p.status == "grant_issued" {
                judge_envelope(p, r.envelope, r.freshness, r.now_ns)?;
            }
            Ok(GrantPlan::Claim {
                grant_hash: hash,
                runner_id: r.runner_id,
                execution_deadline_ns: r.now_ns + policy::EXECUTION_WINDOW_NS,
            })
        }
        op @ ("complete" | "fail") => {
            if p.status == "claimed_executing" && p.runner_id.as_deref() != Some(r.runner_id) {
                return Err(not_claiming_runner());
            }
            Ok(GrantPlan::Finish {
                success: op == "complete",
                runner_id: r.runner_id,
                checkpoints: &watchdog::CHECKPOINTS_NS,
            })
        }
        other => Err(refuse(
            RefusalKind::Precondition,
            "invalid_grant_request",
            format!("operation {other:?} is claim, complete or fail"),
            Some("operation"),
        )),
    }
}

/// The claiming key of an autonomous grant: not the proposer, and not a
/// writer of the evidence its autonomy rests on.
fn check_claimer(r: &GrantReadings<'_>, p: &ProposalRow) -> Result<(), Refusal> {
    if p.decided_by.is_some() {
        return Ok(());
    }
    if r.proposer == Some(r.key_id) {
        return Err(refuse(
            RefusalKind::Forbidden,
            "claimer_is_proposer",
            format!(
                "key {} proposed this autonomous grant; another key (scope runner) executes it, or an operator approves the proposal first",
                r.key_id
            ),
            None,
        ));
    }
    let Some(evidence) = r.tier_evidence else {
        return Ok(());
    };
    let gated = provenance::gate_tier(evidence, provenance::Actor::Claimer(r.key_id));
    let (Some(action), Some(d)) = (Action::parse(&p.action), &gated.demotion) else {
        return Ok(());
    };
    let requested = p.requested_autonomy.as_deref().and_then(Autonomy::parse);
    if policy::effective_autonomy(action, gated.tier, requested) == Autonomy::AutonomousWrite {
        return Ok(());
    }
    Err(Refusal {
        detail: Some(json!(d)),
        ..refuse(
            RefusalKind::Forbidden,
            "self_attested_evidence",
            format!(
                "this grant was issued autonomously; for the claiming key it is not: {} (claim with a key that wrote none of that evidence, or have an operator approve)",
                d.reason
            ),
            None,
        )
    })
}

/// The answer to what the storage's claim did.
pub fn claim_answer(id: &str, outcome: ClaimOutcome) -> Result<ProposalRow, Refusal> {
    match outcome {
        ClaimOutcome::Claimed(p) => Ok(p),
        ClaimOutcome::Expired(p) => Err(refuse(
            RefusalKind::Gone,
            "grant_expired",
            format!("the grant expired at {}", opt_time(p.grant_expires_ns)),
            None,
        )),
        ClaimOutcome::Conflict(p) => Err(
            if ["claimed_executing", "completed", "failed_execution"].contains(&p.status.as_str()) {
                refuse(
                    RefusalKind::Conflict,
                    "grant_already_claimed",
                    format!(
                        "the grant was claimed (proposal is {}); a grant is single-use",
                        p.status
                    ),
                    None,
                )
            } else {
                status_conflict(&p, "only a grant_issued proposal can be claimed")
            },
        ),
        ClaimOutcome::Mismatch(m) => {
            let detail: Vec<Value> = m
                .iter()
                .map(|(f, e, a)| json!({"field": f, "expected": e, "actual": a}))
                .collect();
            let first = m.first().map(|x| x.0.as_str()).unwrap_or_default();
            Err(Refusal {
                detail: Some(json!(detail)),
                ..refuse(
                    RefusalKind::Conflict,
                    "expected_state_mismatch",
                    "the target's current state is not expectedCurrentState; propose again against what is live",
                    Some(&format!("expectedCurrentState.{first}")),
                )
            })
        }
        ClaimOutcome::NotFound => Err(not_found(id)),
    }
}

/// The answer to what the storage's complete/fail did.
pub fn finish_answer(id: &str, outcome: Transition) -> Result<ProposalRow, Refusal> {
    match outcome {
        Transition::Done(p) => Ok(p),
        Transition::Refused(p) if p.status == "execution_timed_out" => Err(refuse(
            RefusalKind::Gone,
            "execution_timed_out",
            "the 5-minute execution window after the claim passed",
            None,
        )),
        Transition::Refused(p) if p.status == "claimed_executing" => Err(not_claiming_runner()),
        Transition::Refused(p) => Err(status_conflict(
            &p,
            "only a claimed grant can be completed or failed",
        )),
        Transition::NotFound => Err(not_found(id)),
    }
}

// ---- approve ----

/// What the route read for one approval.
#[derive(Debug)]
pub struct ApproveReadings<'a, C> {
    /// The proposal id in the path.
    pub id: &'a str,
    /// The callback of the request, validated by the route (URL parsing is
    /// the HTTP client's), or why it is refused.
    pub callback: Result<Option<C>, admission::Refusal>,
    /// The proposal, if stored.
    pub proposal: Option<&'a ProposalRow>,
    /// The facts of its cited envelope, if stored.
    pub envelope: Option<&'a EnvelopeFacts>,
    /// The freshness rule of the store.
    pub freshness: &'a Freshness,
    /// Now, ns (the gate's clock).
    pub now_ns: i64,
}

/// Where the minted grant is sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GrantDelivery<'a, C> {
    /// The request's callback (it wins over a stored one).
    Requested(C),
    /// The callback sealed at propose time.
    Stored(&'a str),
    /// Nowhere: the token is in the answer only.
    None,
}

/// What to persist for an admitted approval.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApprovePlan<'a, C> {
    /// When the minted grant's claim window closes.
    pub grant_expires_ns: i64,
    /// Where the grant goes.
    pub delivery: GrantDelivery<'a, C>,
}

/// Admit or refuse one approval.
pub fn approve<'a, C>(r: ApproveReadings<'a, C>) -> Result<ApprovePlan<'a, C>, Refusal> {
    let callback = r.callback?;
    let Some(p) = r.proposal else {
        return Err(not_found(r.id));
    };
    if p.status == "grant_issued" {
        return Err(already_granted());
    }
    if p.status != "pending_human_approval" {
        return Err(approve_conflict(p));
    }
    judge_envelope(p, r.envelope, r.freshness, r.now_ns)?;
    let delivery = match (callback, p.callback_sealed.as_deref()) {
        (Some(cb), _) => GrantDelivery::Requested(cb),
        (None, Some(sealed)) => GrantDelivery::Stored(sealed),
        (None, None) => GrantDelivery::None,
    };
    Ok(ApprovePlan {
        grant_expires_ns: r.now_ns + policy::GRANT_CLAIM_WINDOW_NS,
        delivery,
    })
}

fn approve_conflict(p: &ProposalRow) -> Refusal {
    status_conflict(p, "only a pending_human_approval proposal can be approved")
}

/// The answer to what the storage's approval did (a concurrent decision
/// can move the row between the reading and the transition).
pub fn approve_answer(id: &str, outcome: Transition) -> Result<ProposalRow, Refusal> {
    match outcome {
        Transition::Done(p) => Ok(p),
        Transition::Refused(p) if p.status == "grant_issued" => Err(already_granted()),
        Transition::Refused(p) => Err(approve_conflict(&p)),
        Transition::NotFound => Err(not_found(id)),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use pstack_envelope::Completeness;

    use super::*;
    use crate::analysis::proof::CausalProofTier;
    use crate::gate::provenance::Measurement;

    const NOW: i64 = 1_800_000_000_000_000_000;
    const TOKEN: &str = "rgt_token";
    const SUBJECT: &str = "process:abc";
    const DIGEST: &str = "sha256:aa";
    const RUNNER: &str = "runner-1";
    const CLAIMER: &str = "key_runner";
    const PROPOSER: &str = "key_proposer";

    /// Everything a route would read for an admissible claim of an
    /// autonomous grant on a service target.
    struct World {
        keys: GateKeys,
        proposal: ProposalRow,
        evidence: TierEvidence,
        envelope: EnvelopeFacts,
        freshness: Freshness,
    }

    fn world() -> World {
        let keys = GateKeys::from_master(&[7; 32]);
        let proposal = ProposalRow {
            id: "rem_1".into(),
            incident_id: "inc_1".into(),
            finding_id: "fnd_1".into(),
            action: "rollback_deploy".into(),
            target: json!({"service": "checkout", "environment": "prod"}),
            target_key: "service:prod:checkout".into(),
            expected_state: json!({"version": "2.4.1"}),
            requested_autonomy: None,
            effective_autonomy: "autonomous_write".into(),
            causal_proof_tier: "cohort_rate_isolated".into(),
            fingerprint: "fp".into(),
            status: "grant_issued".into(),
            idempotency_key: "k".into(),
            pre_mutation_envelope: None,
            grant_hash: Some(keys.token_hash(TOKEN)),
            grant_issued_ns: Some(NOW - 1),
            grant_expires_ns: Some(NOW - 1 + policy::GRANT_CLAIM_WINDOW_NS),
            runner_id: None,
            claimed_ns: None,
            execution_deadline_ns: None,
            finished_ns: None,
            outcome: None,
            callback_sealed: None,
            callback_host: None,
            callback_delivery: None,
            recovery_status: None,
            causal_verification_status: None,
            decided_by: None,
            created_ns: NOW - 1,
            updated_ns: NOW - 1,
        };
        World {
            keys,
            proposal,
            evidence: TierEvidence {
                finding_tier: CausalProofTier::CohortRateIsolated,
                cohort: Some(Measurement {
                    what: "change chg_1".into(),
                    writers: BTreeSet::from(["key_other".to_string()]),
                }),
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
        }
    }

    /// The proposal as a host-subject grant citing the world's envelope.
    fn on_subject(p: &ProposalRow) -> ProposalRow {
        ProposalRow {
            target: json!({"subject": SUBJECT}),
            target_key: format!("subject:{SUBJECT}"),
            expected_state: json!({"envelopeDigest": DIGEST}),
            pre_mutation_envelope: Some(DIGEST.into()),
            ..p.clone()
        }
    }

    fn with_status(p: &ProposalRow, status: &str) -> ProposalRow {
        ProposalRow {
            status: status.into(),
            ..p.clone()
        }
    }

    /// One grant request; `edit` changes the readings from the admissible
    /// default (a claim of the world's grant by another key).
    fn run<'a>(
        w: &'a World,
        edit: impl FnOnce(&mut GrantReadings<'a>),
    ) -> Result<GrantPlan<'a>, Refusal> {
        let mut r = GrantReadings {
            id: "rem_1",
            operation: CLAIM,
            grant_token: TOKEN,
            runner_id: RUNNER,
            key_id: CLAIMER,
            proposal: Some(&w.proposal),
            proposer: Some(PROPOSER),
            tier_evidence: Some(&w.evidence),
            envelope: None,
            keys: &w.keys,
            freshness: &w.freshness,
            now_ns: NOW,
        };
        edit(&mut r);
        grant(r)
    }

    /// (kind, code, field) of a refusal.
    fn refused<T: std::fmt::Debug>(r: Result<T, Refusal>) -> Expected {
        match r {
            Err(e) => (e.kind, e.code, e.field),
            Ok(p) => panic!("admitted: {p:?}"),
        }
    }

    use RefusalKind::{Conflict, Forbidden, Gone, NotFound, Precondition};

    /// (kind, code, field) expected of a refusal.
    type Expected = (RefusalKind, &'static str, Option<String>);

    fn some(f: &str) -> Option<String> {
        Some(f.to_string())
    }

    #[test]
    fn each_grant_refusal_names_its_kind_code_and_field() {
        let w = world();
        let pending = ProposalRow {
            grant_hash: None,
            ..with_status(&w.proposal, "pending_human_approval")
        };
        let subject = on_subject(&w.proposal);
        let claimed = ProposalRow {
            runner_id: Some("runner-0".into()),
            ..with_status(&w.proposal, "claimed_executing")
        };
        let stale = EnvelopeFacts {
            wall_ns: NOW - w.freshness.of("process"),
            ..w.envelope.clone()
        };
        let own_cohort = TierEvidence {
            cohort: Some(Measurement {
                what: "change chg_1".into(),
                writers: BTreeSet::from([CLAIMER.to_string()]),
            }),
            ..w.evidence.clone()
        };
        type Edit<'a> = Box<dyn FnOnce(&mut GrantReadings<'a>) + 'a>;
        let cases: Vec<(&str, Edit<'_>, Expected)> = vec![
            (
                "blank runner",
                Box::new(|r| r.runner_id = " "),
                (Precondition, "invalid_field", some("runnerId")),
            ),
            (
                "no proposal",
                Box::new(|r| r.proposal = None),
                (NotFound, "proposal_not_found", None),
            ),
            (
                "no grant issued",
                Box::new(|r| r.proposal = Some(&pending)),
                (Conflict, "invalid_status", None),
            ),
            (
                "wrong token",
                Box::new(|r| r.grant_token = "rgt_other"),
                (Forbidden, "invalid_grant_token", some("grantToken")),
            ),
            (
                "claim by the proposing key",
                Box::new(|r| r.proposer = Some(CLAIMER)),
                (Forbidden, "claimer_is_proposer", None),
            ),
            (
                "claim resting on the claimer's own evidence",
                Box::new(|r| r.tier_evidence = Some(&own_cohort)),
                (Forbidden, "self_attested_evidence", None),
            ),
            (
                "subject grant citing no envelope",
                Box::new(|r| {
                    r.proposal = Some(&subject);
                    r.envelope = None;
                }),
                (
                    Precondition,
                    "pre_mutation_envelope_unknown",
                    some("preMutationEnvelope"),
                ),
            ),
            (
                "subject grant, envelope stale",
                Box::new(|r| {
                    r.proposal = Some(&subject);
                    r.envelope = Some(&stale);
                }),
                (
                    Precondition,
                    "pre_mutation_envelope_stale",
                    some("preMutationEnvelope"),
                ),
            ),
            (
                "complete by another runner",
                Box::new(|r| {
                    r.operation = "complete";
                    r.proposal = Some(&claimed);
                }),
                (Forbidden, "not_claiming_runner", some("runnerId")),
            ),
            (
                "fail by another runner",
                Box::new(|r| {
                    r.operation = "fail";
                    r.proposal = Some(&claimed);
                }),
                (Forbidden, "not_claiming_runner", some("runnerId")),
            ),
            (
                "unknown operation",
                Box::new(|r| r.operation = "renew"),
                (Precondition, "invalid_grant_request", some("operation")),
            ),
        ];
        for (name, edit, expected) in cases {
            let (kind, code, field) = expected;
            assert_eq!(refused(run(&w, edit)), (kind, code, field), "{name}");
        }
        // A subject grant whose row names no envelope at all.
        let uncited = ProposalRow {
            pre_mutation_envelope: None,
            ..subject.clone()
        };
        assert_eq!(
            refused(run(&w, |r| r.proposal = Some(&uncited))).1,
            "pre_mutation_envelope_required"
        );
    }

    #[test]
    fn grant_refusals_say_what_the_route_always_said() {
        let w = world();
        let pending = ProposalRow {
            grant_hash: None,
            ..with_status(&w.proposal, "pending_human_approval")
        };
        let e = run(&w, |r| r.proposal = Some(&pending)).expect_err("no grant");
        assert_eq!(
            e.message,
            "proposal rem_1 is pending_human_approval; no grant was issued for it"
        );
        let e = run(&w, |r| r.proposal = None).expect_err("absent");
        assert_eq!(e.message, "no remediation proposal rem_1");
        let e = run(&w, |r| r.proposer = Some(CLAIMER)).expect_err("proposer");
        assert_eq!(
            e.message,
            "key key_runner proposed this autonomous grant; another key (scope runner) executes it, or an operator approves the proposal first"
        );
        let e = run(&w, |r| r.operation = "renew").expect_err("operation");
        assert_eq!(e.message, "operation \"renew\" is claim, complete or fail");
        let own = TierEvidence {
            cohort: None,
            ..w.evidence.clone()
        };
        let e = run(&w, |r| r.tier_evidence = Some(&own)).expect_err("self-attested");
        let detail = e.detail.expect("the demotion is the detail");
        assert_eq!(detail["code"], "self_attested_evidence");
        assert_eq!(detail["gateTier"], "corroborated_candidate");
        assert!(
            e.message.starts_with(
                "this grant was issued autonomously; for the claiming key it is not: "
            ),
            "{}",
            e.message
        );
    }

    #[test]
    fn grant_refusals_come_in_one_order() {
        let w = world();
        let pending = ProposalRow {
            grant_hash: None,
            ..with_status(&w.proposal, "pending_human_approval")
        };
        let subject = on_subject(&w.proposal);
        // A blank runner before an absent proposal.
        let r = run(&w, |r| {
            r.runner_id = "";
            r.proposal = None;
        });
        assert_eq!(refused(r).1, "invalid_field");
        // No grant before a wrong token.
        let r = run(&w, |r| {
            r.proposal = Some(&pending);
            r.grant_token = "x";
        });
        assert_eq!(refused(r).1, "invalid_status");
        // A wrong token before an unknown operation.
        let r = run(&w, |r| {
            r.grant_token = "x";
            r.operation = "renew";
        });
        assert_eq!(refused(r).1, "invalid_grant_token");
        // The claiming key before the envelope.
        let r = run(&w, |r| {
            r.proposal = Some(&subject);
            r.proposer = Some(CLAIMER);
        });
        assert_eq!(refused(r).1, "claimer_is_proposer");
    }

    #[test]
    fn admitted_grant_operations_plan_their_transition() {
        let w = world();
        let hash = w.keys.token_hash(TOKEN);
        // A claim by another key, on evidence it did not write.
        assert_eq!(
            run(&w, |_| {}),
            Ok(GrantPlan::Claim {
                grant_hash: &hash,
                runner_id: RUNNER,
                execution_deadline_ns: NOW + policy::EXECUTION_WINDOW_NS,
            })
        );
        // An approved grant: an operator was the second party, so the
        // proposing key may claim it, and its own evidence does not matter.
        let approved = ProposalRow {
            decided_by: Some("user:ops".into()),
            ..w.proposal.clone()
        };
        let own = TierEvidence {
            cohort: None,
            ..w.evidence.clone()
        };
        assert!(
            run(&w, |r| {
                r.proposal = Some(&approved);
                r.proposer = Some(CLAIMER);
                r.tier_evidence = Some(&own);
            })
            .is_ok()
        );
        // The finding is gone: nothing to rest on, nothing to refuse.
        assert!(run(&w, |r| r.tier_evidence = None).is_ok());
        // Demoted but still autonomous (open_code_pr is autonomous at the
        // lower tier too): the claim stands.
        let pr = ProposalRow {
            action: "open_code_pr".into(),
            ..w.proposal.clone()
        };
        assert_eq!(
            policy::effective_autonomy(
                Action::OpenCodePr,
                CausalProofTier::CorroboratedCandidate,
                None
            ),
            Autonomy::AutonomousWrite,
            "the case below needs an action still autonomous when demoted"
        );
        assert!(
            run(&w, |r| {
                r.proposal = Some(&pr);
                r.tier_evidence = Some(&own);
            })
            .is_ok()
        );
        // The caller asked for less than autonomous at propose time: a
        // demotion leaves it below autonomous, so the claim is refused.
        let asked_less = ProposalRow {
            requested_autonomy: Some("human_approved_write".into()),
            ..pr.clone()
        };
        assert_eq!(
            refused(run(&w, |r| {
                r.proposal = Some(&asked_less);
                r.tier_evidence = Some(&own);
            }))
            .1,
            "self_attested_evidence"
        );
        // A claim of a grant no longer issued is the storage's to answer
        // (grant_already_claimed, expired): the envelope is not judged.
        let subject_claimed = with_status(&on_subject(&w.proposal), "claimed_executing");
        assert!(run(&w, |r| r.proposal = Some(&subject_claimed)).is_ok());
        // Complete and fail by the claiming runner.
        let claimed = ProposalRow {
            runner_id: Some(RUNNER.into()),
            ..with_status(&w.proposal, "claimed_executing")
        };
        for (op, success) in [("complete", true), ("fail", false)] {
            assert_eq!(
                run(&w, |r| {
                    r.operation = op;
                    r.proposal = Some(&claimed);
                }),
                Ok(GrantPlan::Finish {
                    success,
                    runner_id: RUNNER,
                    checkpoints: &watchdog::CHECKPOINTS_NS,
                }),
                "{op}"
            );
        }
        // Completing an unclaimed grant is the storage's to refuse.
        assert!(run(&w, |r| r.operation = "complete").is_ok());
    }

    #[test]
    fn runner_id_at_and_above_1024_bytes() {
        let w = world();
        let at = "r".repeat(1024);
        let above = "r".repeat(1025);
        assert!(run(&w, |r| r.runner_id = &at).is_ok());
        assert_eq!(
            refused(run(&w, |r| r.runner_id = &above)),
            (Precondition, "invalid_field", some("runnerId"))
        );
    }

    #[test]
    fn a_claimed_envelope_just_below_at_and_above_its_freshness() {
        let w = world();
        let subject = on_subject(&w.proposal);
        let expires = w.freshness.expires_ns("process", w.envelope.wall_ns);
        let at = |now: i64| {
            run(&w, |r| {
                r.proposal = Some(&subject);
                r.envelope = Some(&w.envelope);
                r.now_ns = now;
            })
        };
        assert!(at(expires - 1).is_ok(), "fresh one ns before expiry");
        assert_eq!(refused(at(expires)).1, "pre_mutation_envelope_stale");
        assert_eq!(refused(at(expires + 1)).1, "pre_mutation_envelope_stale");
    }

    #[test]
    fn claim_answers() {
        let w = world();
        let p = w.proposal.clone();
        assert_eq!(
            claim_answer("rem_1", ClaimOutcome::Claimed(p.clone())),
            Ok(p.clone())
        );
        let e = claim_answer("rem_1", ClaimOutcome::Expired(with_status(&p, "expired")))
            .expect_err("expired");
        assert_eq!((e.kind, e.code), (Gone, "grant_expired"));
        let expires = p.grant_expires_ns.expect("issued");
        assert_eq!(
            e.message,
            format!("the grant expired at \"{}\"", rfc3339(expires))
        );
        for s in ["claimed_executing", "completed", "failed_execution"] {
            let e = claim_answer("rem_1", ClaimOutcome::Conflict(with_status(&p, s))).expect_err(s);
            assert_eq!((e.kind, e.code), (Conflict, "grant_already_claimed"), "{s}");
            assert_eq!(
                e.message,
                format!("the grant was claimed (proposal is {s}); a grant is single-use")
            );
        }
        let e = claim_answer("rem_1", ClaimOutcome::Conflict(with_status(&p, "rejected")))
            .expect_err("rejected");
        assert_eq!(
            (e.kind, e.code, e.message.as_str()),
            (
                Conflict,
                "invalid_status",
                "proposal rem_1 is rejected; only a grant_issued proposal can be claimed"
            )
        );
        let e = claim_answer(
            "rem_1",
            ClaimOutcome::Mismatch(vec![
                ("version".into(), json!("2.4.1"), json!("2.5.0")),
                ("flags.x".into(), json!(true), Value::Null),
            ]),
        )
        .expect_err("mismatch");
        assert_eq!(
            (e.kind, e.code, e.field.as_deref()),
            (
                Conflict,
                "expected_state_mismatch",
                Some("expectedCurrentState.version")
            )
        );
        assert_eq!(
            e.detail,
            Some(json!([
                {"field": "version", "expected": "2.4.1", "actual": "2.5.0"},
                {"field": "flags.x", "expected": true, "actual": null},
            ]))
        );
        assert_eq!(
            refused(claim_answer("rem_1", ClaimOutcome::NotFound)),
            (NotFound, "proposal_not_found", None)
        );
    }

    #[test]
    fn finish_answers() {
        let w = world();
        let p = w.proposal.clone();
        assert_eq!(
            finish_answer("rem_1", Transition::Done(p.clone())),
            Ok(p.clone())
        );
        assert_eq!(
            refused(finish_answer(
                "rem_1",
                Transition::Refused(with_status(&p, "execution_timed_out"))
            )),
            (Gone, "execution_timed_out", None)
        );
        assert_eq!(
            refused(finish_answer(
                "rem_1",
                Transition::Refused(with_status(&p, "claimed_executing"))
            )),
            (Forbidden, "not_claiming_runner", some("runnerId"))
        );
        let e = finish_answer("rem_1", Transition::Refused(p.clone())).expect_err("unclaimed");
        assert_eq!(
            (e.code, e.message.as_str()),
            (
                "invalid_status",
                "proposal rem_1 is grant_issued; only a claimed grant can be completed or failed"
            )
        );
        assert_eq!(
            refused(finish_answer("rem_1", Transition::NotFound)),
            (NotFound, "proposal_not_found", None)
        );
    }

    // ---- approve ----

    /// A parked proposal (no grant yet) with a sealed callback.
    fn parked(w: &World) -> ProposalRow {
        ProposalRow {
            grant_hash: None,
            grant_issued_ns: None,
            grant_expires_ns: None,
            callback_sealed: Some("sealed".into()),
            ..with_status(&w.proposal, "pending_human_approval")
        }
    }

    fn approve_run<'a>(
        w: &'a World,
        p: Option<&'a ProposalRow>,
        edit: impl FnOnce(&mut ApproveReadings<'a, &'static str>),
    ) -> Result<ApprovePlan<'a, &'static str>, Refusal> {
        let mut r = ApproveReadings {
            id: "rem_1",
            callback: Ok(None),
            proposal: p,
            envelope: None,
            freshness: &w.freshness,
            now_ns: NOW,
        };
        edit(&mut r);
        approve(r)
    }

    fn bad_callback() -> admission::Refusal {
        admission::Refusal {
            code: "invalid_webhook",
            message: "secret needs webhookUrl".into(),
            field: "secret".into(),
        }
    }

    #[test]
    fn each_approve_refusal_names_its_kind_code_and_field() {
        let w = world();
        let p = parked(&w);
        let issued = w.proposal.clone();
        let rejected = with_status(&p, "rejected");
        let subject = on_subject(&p);
        let stale = EnvelopeFacts {
            wall_ns: NOW - w.freshness.of("process"),
            ..w.envelope.clone()
        };
        let cases: Vec<(&str, Option<&ProposalRow>, Option<&EnvelopeFacts>, bool, _)> = vec![
            (
                "callback refused",
                Some(&p),
                None,
                true,
                (Precondition, "invalid_webhook", some("secret")),
            ),
            (
                "no proposal",
                None,
                None,
                false,
                (NotFound, "proposal_not_found", None),
            ),
            (
                "already granted",
                Some(&issued),
                None,
                false,
                (Conflict, "already_granted", None),
            ),
            (
                "not pending",
                Some(&rejected),
                None,
                false,
                (Conflict, "invalid_status", None),
            ),
            (
                "subject envelope not stored",
                Some(&subject),
                None,
                false,
                (
                    Precondition,
                    "pre_mutation_envelope_unknown",
                    some("preMutationEnvelope"),
                ),
            ),
            (
                "subject envelope stale",
                Some(&subject),
                Some(&stale),
                false,
                (
                    Precondition,
                    "pre_mutation_envelope_stale",
                    some("preMutationEnvelope"),
                ),
            ),
        ];
        for (name, proposal, envelope, bad, expected) in cases {
            let r = approve_run(&w, proposal, |r| {
                r.envelope = envelope;
                if bad {
                    r.callback = Err(bad_callback());
                }
            });
            assert_eq!(refused(r), expected, "{name}");
        }
        let e = approve_run(&w, Some(&rejected), |_| {}).expect_err("rejected");
        assert_eq!(
            e.message,
            "proposal rem_1 is rejected; only a pending_human_approval proposal can be approved"
        );
        let e = approve_run(&w, Some(&issued), |_| {}).expect_err("granted");
        assert_eq!(
            e.message,
            "the proposal already has a grant; reject it and propose again if the token was lost"
        );
    }

    #[test]
    fn approve_refusals_come_in_one_order() {
        let w = world();
        let issued = w.proposal.clone();
        // The callback before the proposal is even looked at.
        let r = approve_run(&w, None, |r| r.callback = Err(bad_callback()));
        assert_eq!(refused(r).1, "invalid_webhook");
        // Already granted before the envelope.
        let subject_issued = on_subject(&issued);
        assert_eq!(
            refused(approve_run(&w, Some(&subject_issued), |_| {})).1,
            "already_granted"
        );
    }

    #[test]
    fn an_approved_envelope_just_below_at_and_above_its_freshness() {
        let w = world();
        let subject = on_subject(&parked(&w));
        let expires = w.freshness.expires_ns("process", w.envelope.wall_ns);
        let at = |now: i64| {
            approve_run(&w, Some(&subject), |r| {
                r.envelope = Some(&w.envelope);
                r.now_ns = now;
            })
        };
        assert!(at(expires - 1).is_ok(), "fresh one ns before expiry");
        assert_eq!(refused(at(expires)).1, "pre_mutation_envelope_stale");
        assert_eq!(refused(at(expires + 1)).1, "pre_mutation_envelope_stale");
    }

    #[test]
    fn an_approval_mints_a_grant_for_the_claim_window_and_picks_its_callback() {
        let w = world();
        let p = parked(&w);
        let unsealed = ProposalRow {
            callback_sealed: None,
            ..p.clone()
        };
        assert_eq!(
            approve_run(&w, Some(&p), |r| r.callback = Ok(Some("cb"))),
            Ok(ApprovePlan {
                grant_expires_ns: NOW + policy::GRANT_CLAIM_WINDOW_NS,
                delivery: GrantDelivery::Requested("cb"),
            })
        );
        assert_eq!(
            approve_run(&w, Some(&p), |_| {}).map(|a| a.delivery),
            Ok(GrantDelivery::Stored("sealed"))
        );
        assert_eq!(
            approve_run(&w, Some(&unsealed), |_| {}).map(|a| a.delivery),
            Ok(GrantDelivery::None)
        );
    }

    #[test]
    fn approve_answers() {
        let w = world();
        let p = parked(&w);
        assert_eq!(
            approve_answer("rem_1", Transition::Done(p.clone())),
            Ok(p.clone())
        );
        assert_eq!(
            refused(approve_answer(
                "rem_1",
                Transition::Refused(with_status(&p, "grant_issued"))
            )),
            (Conflict, "already_granted", None)
        );
        assert_eq!(
            refused(approve_answer(
                "rem_1",
                Transition::Refused(with_status(&p, "rejected"))
            )),
            (Conflict, "invalid_status", None)
        );
        assert_eq!(
            refused(approve_answer("rem_1", Transition::NotFound)),
            (NotFound, "proposal_not_found", None)
        );
    }
}
