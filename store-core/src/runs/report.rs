//! The payload-free run report `runbook-run-report/v1` (seed 003, §14):
//! the one account of a run that may leave the operator's environment.
//!
//! Invariants: every field is an enum from a closed vocabulary, a count, a
//! bucket, an identifier of the graph, a hypothesis key (a hash) or an
//! envelope digest, or a day — there is no field a message could be
//! written into (a hypothesis's code, statement and falsifier stay in the
//! store's ledger); an unmapped reason code or a failed run
//! without a classifiable cause refuses to emit with a typed error rather
//! than filing it under something adjacent; assembly is pure (`now` is
//! passed in) and validation against the published schema happens at the
//! emitting edge ([`validate`]).

use serde::{Deserialize, Serialize};

use super::acceptance;
use super::hypotheses::HypothesisState;
use super::supervisor::{Event, InternalOutcome, RunState, RunStatus};

/// The published JSON Schema of the report.
pub const SCHEMA_JSON: &str = include_str!("../../schemas/runbook-run-report-v1.schema.json");

/// How a run ended, in §14's four words.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    /// Reached success.
    Success,
    /// Failed at a step.
    Failed,
    /// Stopped.
    Aborted,
    /// Not ended.
    Partial,
}

impl Outcome {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Success => "success",
            Outcome::Failed => "failed",
            Outcome::Aborted => "aborted",
            Outcome::Partial => "partial",
        }
    }
}

/// §14's failure classes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum FailureClass {
    /// The run was not set up to start.
    PreconditionUnmet,
    /// The environment lacked a capability.
    ToolMissing,
    /// The supervisor or runtime refused.
    PermissionDenied,
    /// The procedure did not do what it said.
    ExpectationMismatch,
    /// An allowance ran out.
    Timeout,
    /// A person stopped it.
    HumanAbort,
    /// What ran is not what was published.
    UpstreamChanged,
}

/// Who executed the run (stated by the operator; no default).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum ExecutorKind {
    /// A person.
    Human,
    /// A person with an agent.
    AgentAssisted,
    /// An agent alone.
    Autonomous,
}

/// Where it ran (stated by the operator; no default).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum EnvClass {
    /// A workstation.
    Local,
    /// CI.
    Ci,
    /// Staging.
    Staging,
    /// Production.
    Prod,
}

/// Bucketed duration, never exact.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum DurationBucket {
    /// < 60 s.
    #[serde(rename = "<1m")]
    UnderOneMinute,
    /// < 300 s.
    #[serde(rename = "1-5m")]
    OneToFive,
    /// < 1800 s.
    #[serde(rename = "5-30m")]
    FiveToThirty,
    /// Anything else, unknown included.
    #[serde(rename = ">30m")]
    OverThirty,
}

/// Profiles.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub enum Profile {
    /// P0.
    P0,
    /// P1.
    P1,
}

/// Runtime profiles.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub enum RuntimeProfile {
    /// R0.
    R0,
    /// R1.
    R1,
    /// R2.
    R2,
}

/// The report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunReportV1 {
    /// Always `runbook-run-report/v1`.
    pub report_schema: String,
    /// Always `v1`.
    pub schema_version: String,
    /// publisher/slug of the graph.
    pub runbook: String,
    /// Its version.
    pub version: String,
    /// `sha256:<hex>` of the graph's canonical JSON.
    pub content_hash: String,
    /// P0 or P1.
    pub profile: Profile,
    /// How it ended.
    pub outcome: Outcome,
    /// Where it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed_step_id: Option<String>,
    /// Why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_class: Option<FailureClass>,
    /// Who ran it.
    pub executor_kind: ExecutorKind,
    /// R0, R1, R2.
    pub runtime_profile: RuntimeProfile,
    /// How many deviations.
    pub deviation_count: u32,
    /// How long, bucketed.
    pub duration_bucket: DurationBucket,
    /// Where.
    pub env_class: EnvClass,
    /// The day (`YYYY-MM-DD`).
    pub reported_at: String,
    /// The hypotheses the run's envelopes moved in its subject's ledger.
    pub hypotheses: Vec<ReportHypothesis>,
    /// Seed 001's acceptance metrics for this run.
    pub acceptance: ReportAcceptance,
}

/// One hypothesis the run moved: its key, where the run left it, and the
/// run's envelopes that moved it, in order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReportHypothesis {
    /// `h:` + 16 hex digits.
    pub hypothesis: String,
    /// After the run's last move of it.
    pub state: HypothesisState,
    /// Digests of the envelopes that moved it.
    pub moved_by: Vec<String>,
}

/// The AC1 metrics of one run: counts, and durations bucketed as the
/// report's duration is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReportAcceptance {
    /// Start to first discriminating envelope, bucketed (absent: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_discriminating_observation_bucket: Option<DurationBucket>,
    /// Judgements its envelopes withdrew.
    pub retractions: u32,
    /// It reopened a settled question.
    pub repeated_investigation: bool,
    /// Unknowns without owner or probe in its envelopes.
    pub unknowns_without_owner_or_probe: u32,
    /// Expired or unknown handoffs it cited.
    pub stale_handoffs: u32,
    /// Steps it entered.
    pub transitions: u32,
    /// Steps entered per hour of agent time, rounded down.
    pub transitions_per_agent_hour: u32,
    /// Estimated tokens of free text in its steps.
    pub narration_tokens: u64,
}

/// Why a report was not emitted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReportError {
    /// A reason code with no row in the table.
    #[error(
        "{0} has no failure class: refusing to emit rather than choosing a bucket (a report that files an unknown cause under a plausible heading reads as evidence)"
    )]
    UnmappedReason(String),
    /// A failed run with no derivable cause.
    #[error(
        "this run failed{} and recorded no cause a failure class covers: supply failureClass (the person who was there knows)",
        .0.as_deref().map(|s| format!(" at {s}")).unwrap_or_default()
    )]
    UnclassifiableFailure(Option<String>),
    /// The assembled report does not validate (a bug, refused at the edge).
    #[error("the report does not validate against runbook-run-report/v1: {0}")]
    Invalid(String),
}

/// The code → failure-class table (seed 003, exactly). `Ok(None)`: not a
/// failure. `Err`: unmapped.
pub fn failure_class_for(code: &str) -> Result<Option<FailureClass>, ReportError> {
    use FailureClass::*;
    Ok(match code {
        "run/started"
        | "run/entered"
        | "run/permitted"
        | "run/authorized"
        | "run/approved"
        | "run/adjudicated"
        | "run/ended"
        | "run/expectation-passed"
        | "run/approval-required"
        | "run/nothing-to-adjudicate"
        | "run/deviation-limit"
        | "run/out-of-order-step"
        | "run/pre-mutation-missing"
        | "run/pre-mutation-incomplete"
        | "run/pre-mutation-stale"
        | "run/pre-mutation-refused"
        | "run/unchecked-advance"
        | "run/terminal-not-reached"
        | "run/after-end"
        | "run/escalated-undeclared-tool"
        | "run/escalated-out-of-scope-tool"
        | "run/escalated-out-of-order-step"
        | "run/escalated-unchecked-advance"
        | "run/escalated-budget-exhausted"
        | "run/escalated-unrouted-failure"
        | "run/escalated-terminal-not-reached" => None,
        "run/expectation-failed" | "run/expectation-unevaluable" | "run/unrouted-failure" => {
            Some(ExpectationMismatch)
        }
        "run/undeclared-tool"
        | "run/out-of-scope-tool"
        | "run/unanalyzable-command"
        | "runtime/coverage-insufficient"
        | "runtime/risk-above-ceiling"
        | "runtime/profile-too-low"
        | "runtime/autonomous-unsupervised" => Some(PermissionDenied),
        "runtime/capability-unavailable" => Some(ToolMissing),
        "run/input-missing" | "run/input-type" | "run/input-undeclared" | "run/no-entry" => {
            Some(PreconditionUnmet)
        }
        "run/budget-exhausted" | "run/wall-clock-exhausted" => Some(Timeout),
        "run/aborted-by-human" | "run/approval-denied" => Some(HumanAbort),
        "run/content-hash-mismatch" => Some(UpstreamChanged),
        other => return Err(ReportError::UnmappedReason(other.to_string())),
    })
}

/// Bucketed, never exact; unknown or non-finite is not short.
pub fn duration_bucket(seconds: Option<f64>) -> DurationBucket {
    match seconds {
        Some(s) if s.is_finite() && s < 60.0 => DurationBucket::UnderOneMinute,
        Some(s) if s.is_finite() && s < 300.0 => DurationBucket::OneToFive,
        Some(s) if s.is_finite() && s < 1800.0 => DurationBucket::FiveToThirty,
        _ => DurationBucket::OverThirty,
    }
}

/// How a run ended, in four words (shared by every consumer that states
/// it, so none disagrees).
pub fn outcome_of(state: &RunState) -> Outcome {
    if state.status != RunStatus::Ended {
        return Outcome::Partial;
    }
    match state.outcome {
        Some(InternalOutcome::Success) => Outcome::Success,
        Some(
            InternalOutcome::Failed | InternalOutcome::TimedOut | InternalOutcome::BudgetExhausted,
        ) => Outcome::Failed,
        _ => Outcome::Aborted,
    }
}

/// What the operator states and the supervisor cannot infer.
#[derive(Debug, Clone)]
pub struct ReportContext {
    /// publisher/slug.
    pub runbook: String,
    /// Version.
    pub version: String,
    /// `sha256:<hex>`.
    pub content_hash: String,
    /// P0/P1.
    pub profile: Profile,
    /// R0/R1/R2.
    pub runtime_profile: RuntimeProfile,
    /// No default.
    pub executor_kind: ExecutorKind,
    /// No default.
    pub env_class: EnvClass,
    /// The day.
    pub reported_at: String,
    /// Seconds the run took, if known.
    pub elapsed_seconds: Option<f64>,
    /// The operator's class for a failure the run did not explain.
    pub failure_class: Option<FailureClass>,
    /// Seconds from the run's start to its latest step (agent time).
    pub agent_seconds: Option<f64>,
    /// The ledger moves of the run's envelopes, grouped per hypothesis.
    pub hypotheses: Vec<ReportHypothesis>,
}

/// A failed step (if known) and its class (if derivable).
type Failure = (Option<String>, Option<FailureClass>);

/// The failed step and class: from the last event carrying a cause.
/// `Err` if any event's code is unmapped.
fn failure_of(
    state: &RunState,
    events: &[Event],
    outcome: Outcome,
) -> Result<Option<Failure>, ReportError> {
    // Every code is checked, not only the ones reached: an unmapped code
    // anywhere means the table has drifted from the supervisor.
    let mut classes = Vec::with_capacity(events.len());
    for e in events {
        classes.push(failure_class_for(&e.code)?);
    }
    if outcome == Outcome::Success {
        return Ok(None);
    }
    for (e, c) in events.iter().zip(classes).rev() {
        if let Some(c) = c {
            return Ok(Some((e.at.clone(), Some(c))));
        }
    }
    if outcome == Outcome::Partial || state.current.is_empty() {
        return Ok(None);
    }
    Ok(Some((Some(state.current.clone()), None)))
}

/// Assemble the report from what the run recorded.
pub fn build_run_report(state: &RunState, ctx: &ReportContext) -> Result<RunReportV1, ReportError> {
    let outcome = outcome_of(state);
    let derived = failure_of(state, &state.events, outcome)?;
    let failure = match (derived, ctx.failure_class) {
        (Some((step, _)), Some(c)) => Some((step, Some(c))),
        (d, _) => d,
    };
    if outcome == Outcome::Failed && failure.as_ref().and_then(|f| f.1).is_none() {
        return Err(ReportError::UnclassifiableFailure(
            failure.and_then(|f| f.0),
        ));
    }
    let (failed_step_id, failure_class) = failure.unwrap_or((None, None));
    let agent_ns = ctx.agent_seconds.map_or(0, |s| (s * 1e9) as i64);
    let summary = acceptance::summarize(state, 0, agent_ns);
    let acceptance = ReportAcceptance {
        first_discriminating_observation_bucket: summary
            .first_discriminating_observation_seconds
            .map(|s| duration_bucket(Some(s))),
        retractions: summary.retractions,
        repeated_investigation: summary.repeated_investigation,
        unknowns_without_owner_or_probe: summary.unknowns_without_owner_or_probe,
        stale_handoffs: summary.stale_handoffs,
        transitions: summary.transitions,
        transitions_per_agent_hour: summary
            .transitions_per_agent_hour
            .floor()
            .min(f64::from(u32::MAX)) as u32,
        narration_tokens: summary.narration_tokens,
    };
    Ok(RunReportV1 {
        report_schema: "runbook-run-report/v1".into(),
        schema_version: "v1".into(),
        runbook: ctx.runbook.clone(),
        version: ctx.version.clone(),
        content_hash: ctx.content_hash.clone(),
        profile: ctx.profile,
        outcome,
        failed_step_id,
        failure_class,
        executor_kind: ctx.executor_kind,
        runtime_profile: ctx.runtime_profile,
        deviation_count: u32::try_from(state.deviations.len()).unwrap_or(u32::MAX),
        duration_bucket: duration_bucket(ctx.elapsed_seconds),
        env_class: ctx.env_class,
        reported_at: ctx.reported_at.clone(),
        hypotheses: ctx.hypotheses.clone(),
        acceptance,
    })
}

/// Validate a serialized report against the published schema (the
/// emitting edge calls this on every report it returns).
pub fn validate(report: &serde_json::Value) -> Result<(), ReportError> {
    static VALIDATOR: std::sync::OnceLock<jsonschema::Validator> = std::sync::OnceLock::new();
    let v = VALIDATOR.get_or_init(|| {
        let schema: serde_json::Value =
            serde_json::from_str(SCHEMA_JSON).expect("the published schema is JSON");
        jsonschema::validator_for(&schema).expect("the published schema compiles")
    });
    let errors: Vec<String> = v
        .iter_errors(report)
        .map(|e| format!("{}: {}", e.instance_path(), e))
        .collect();
    if errors.is_empty() {
        Ok(())
    } else {
        Err(ReportError::Invalid(errors.join("; ")))
    }
}

/// Assemble, serialize and validate: what the edge emits.
pub fn emit(state: &RunState, ctx: &ReportContext) -> Result<serde_json::Value, ReportError> {
    let report = build_run_report(state, ctx)?;
    let value = serde_json::to_value(&report).map_err(|e| ReportError::Invalid(e.to_string()))?;
    validate(&value)?;
    Ok(value)
}
