//! The run supervisor (seed 003): a run follows its declared step graph and
//! every proposal, advance, observation and conclusion is checked against
//! it. Pure: state in, state out; the caller supplies `now` where a
//! freshness is judged, and the core never reads a clock.
//!
//! Invariants:
//! - A tool deviation is always `block`: a refused call is never turned
//!   into a permission by proposing it again.
//! - A control-flow deviation refuses the transition; the escalation
//!   policy decides whether the run also ends.
//! - An ended run stays ended: anything done to it is refused and recorded
//!   (`run/after-end`) without resurrecting it.
//! - Nothing of what was attempted (tool string, command, output,
//!   arguments) is kept: records and events carry classes, step ids,
//!   sequence numbers, codes from a closed set and fixed messages.
//! - pstack's rule for MUTATE: entering a step that requires a fresh
//!   pre-mutation capture needs the latest capture of the run's subject
//!   recorded since the last mutation to pass the store's one pre-mutation
//!   rule ([`super::freshness`]: `complete` or `bounded`, observed no later
//!   than `now`, unexpired at `now`); a refusal is an `out-of-order-step`
//!   whose event code and [`Decided::refusal`] say why (the completeness, the
//!   staleness, the absence). A capture of another subject satisfies
//!   nothing; leaving for a step that requires a post-mutation capture needs
//!   one of the same subject observed at or after the mutation.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use pstack_envelope::Completeness;

use super::deviation::{
    CapabilityClass, Deviation, DeviationClass, Escalation, Response, capability_class_of,
    count_by_class, count_by_step,
};
use super::freshness::{EnvelopeFacts, PreMutationRefusal, judge_pre_mutation_until};
use super::graph::{Requirement, StepGraph, Terminal};
use super::run_acceptance::RunAcceptance;

/// Running or ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum RunStatus {
    /// Steps may still be taken.
    Running,
    /// Nothing more happens.
    Ended,
}

/// How an ended run ended (the supervisor's own words; `outcomeOf` maps
/// them to the report's four).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum InternalOutcome {
    /// Reached a success terminal.
    Success,
    /// Reached a failed terminal.
    Failed,
    /// A wall-clock allowance ran out (stated by the edge).
    TimedOut,
    /// An edge budget ran out.
    BudgetExhausted,
    /// Reached the author's escalate terminal.
    Escalated,
    /// The escalation policy ended it.
    Aborted,
    /// More deviations than `maxTotal`.
    DeviationLimit,
    /// A person stopped it.
    AbortedByHuman,
}

/// Event kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum EventKind {
    /// The run began.
    Started,
    /// A step was entered.
    Entered,
    /// A proposal was permitted.
    Permitted,
    /// A check was evaluated.
    Checked,
    /// A deviation was recorded.
    Deviation,
    /// The escalation policy ended the run.
    Escalated,
    /// The run ended on a terminal.
    Ended,
}

/// One event. `code` is a key of the failure-class table
/// ([`super::report::failure_class_for`]); `message` is built from fixed
/// text and class names only.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Event {
    /// What happened.
    pub kind: EventKind,
    /// Reason code.
    pub code: String,
    /// The step it happened at.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<String>,
    /// Human-readable, payload-free.
    pub message: String,
}

/// A sealed envelope recorded by a CAPTURE step. Only its identity: the
/// digest, the subject key and kind, its completeness, and when its
/// freshness lapses.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Capture {
    /// SHA-256 digest of the sealed envelope.
    pub digest: String,
    /// The subject key (identity, not payload).
    pub subject: String,
    /// The subject kind (`thread`, `process`, …).
    #[serde(default)]
    pub kind: String,
    /// Its completeness (`None`: recorded before the store kept it, which
    /// authorizes nothing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<String>")]
    pub completeness: Option<Completeness>,
    /// ns since the epoch when it was observed (the envelope's wall time).
    pub wall_ns: i64,
    /// ns since the epoch from which it is stale (wall time + the kind's
    /// freshness when it was recorded).
    pub expires_ns: i64,
    /// The number of mutations before it was recorded.
    #[serde(default)]
    pub epoch: u32,
}

/// The state of a run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunState {
    /// Running or ended.
    pub status: RunStatus,
    /// The step the run is on.
    pub current: String,
    /// How it ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<InternalOutcome>,
    /// Deviations, in sequence order.
    pub deviations: Vec<Deviation>,
    /// Events, in order.
    pub events: Vec<Event>,
    /// The operator's policy.
    pub escalation: Escalation,
    /// Whether leaving a step with a check requires the check.
    pub evaluate_postconditions: bool,
    /// The current step's check was evaluated in this visit.
    pub checked: bool,
    /// Times each edge `"from->to"` was taken.
    pub edge_counts: BTreeMap<String, u32>,
    /// The run's subject key (bound by the first capture, or at start).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject: Option<String>,
    /// Captures, in order.
    pub captures: Vec<Capture>,
    /// Mutation steps entered.
    pub mutations: u32,
    /// `now` of the last advance into a mutation step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_mutation_ns: Option<i64>,
    /// Seed 001's acceptance metrics, as far as this run goes.
    #[serde(default)]
    pub acceptance: RunAcceptance,
}

impl RunState {
    /// Ended on a terminal the author wrote (the local account's
    /// `complete`).
    pub fn complete(&self, graph: &StepGraph) -> bool {
        self.status == RunStatus::Ended
            && graph
                .steps
                .get(&self.current)
                .is_some_and(|s| s.terminal.is_some())
    }
}

/// Options of [`start_run`].
#[derive(Debug, Clone, Default)]
pub struct StartOptions {
    /// Who runs it (checked, not stored in the core).
    pub agent_identity: String,
    /// The operator's policy (default: [`Escalation::default`]).
    pub escalation: Option<Escalation>,
    /// Require checks before leaving a step that has one.
    pub evaluate_postconditions: bool,
    /// The subject key, if known at start.
    pub subject: Option<String>,
}

/// Why a run could not start.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Refusal {
    /// `run/input-missing`, `run/no-entry`, ….
    pub code: &'static str,
    /// The offending field.
    pub field: String,
    /// What is wrong.
    pub message: String,
}

/// Permit or block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    /// Go ahead.
    Permit,
    /// Do not.
    Block,
}

/// The answer to a step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Decided {
    /// The new state.
    pub state: RunState,
    /// Permit or block.
    pub verdict: Verdict,
    /// The events this step added.
    pub events: Vec<Event>,
    /// Why a mutation step was refused (the pre-mutation rule's typed
    /// error), when that is why the step was blocked.
    #[serde(skip)]
    pub refusal: Option<PreMutationRefusal>,
}

/// What an `observe` reports.
#[derive(Debug, Clone, Default)]
pub struct Observation {
    /// The step's exit code.
    pub exit_code: Option<i32>,
    /// The step's output (compared, never kept).
    pub stdout: Option<String>,
    /// A sealed envelope the step captured, resolved by the edge.
    pub capture: Option<Capture>,
}

fn event(kind: EventKind, code: &str, at: Option<&str>, message: String) -> Event {
    Event {
        kind,
        code: code.to_string(),
        at: at.map(str::to_string),
        message,
    }
}

/// Start a run at the graph's entry.
pub fn start_run(graph: &StepGraph, opts: StartOptions) -> Result<RunState, Vec<Refusal>> {
    let mut refusals = Vec::new();
    if let Err(e) = graph.validate() {
        refusals.push(Refusal {
            code: "run/no-entry",
            field: format!("graph.{}", e.field),
            message: e.message,
        });
    }
    let id = opts.agent_identity.trim();
    if id.is_empty() || id.len() > 128 {
        refusals.push(Refusal {
            code: "run/input-missing",
            field: "agentIdentity".into(),
            message: "required, at most 128 bytes".into(),
        });
    }
    if let Some(e) = &opts.escalation
        && e.max_total == 0
    {
        refusals.push(Refusal {
            code: "run/input-type",
            field: "escalation.maxTotal".into(),
            message: "must be at least 1".into(),
        });
    }
    if !refusals.is_empty() {
        return Err(refusals);
    }
    let mut state = RunState {
        status: RunStatus::Running,
        current: graph.entry.clone(),
        outcome: None,
        deviations: Vec::new(),
        events: Vec::new(),
        escalation: opts.escalation.unwrap_or_default(),
        evaluate_postconditions: opts.evaluate_postconditions,
        checked: false,
        edge_counts: BTreeMap::new(),
        subject: opts.subject,
        captures: Vec::new(),
        mutations: 0,
        last_mutation_ns: None,
        acceptance: RunAcceptance::default(),
    };
    state.events.push(event(
        EventKind::Started,
        "run/started",
        Some(&graph.entry),
        "run started".into(),
    ));
    Ok(state)
}

struct Step {
    state: RunState,
    events: Vec<Event>,
    refusal: Option<PreMutationRefusal>,
}

impl Step {
    fn new(state: RunState) -> Step {
        Step {
            state,
            events: Vec::new(),
            refusal: None,
        }
    }

    fn push(&mut self, e: Event) {
        self.state.events.push(e.clone());
        self.events.push(e);
    }

    fn done(self, verdict: Verdict) -> Decided {
        Decided {
            state: self.state,
            verdict,
            events: self.events,
            refusal: self.refusal,
        }
    }

    fn end(&mut self, outcome: InternalOutcome) {
        self.state.status = RunStatus::Ended;
        self.state.outcome = Some(outcome);
    }

    /// Record a deviation and apply the escalation policy (never to an
    /// ended run).
    fn deviate(&mut self, class: DeviationClass, code: &str, capability: Option<CapabilityClass>) {
        self.deviate_because(class, code, capability, "");
    }

    /// [`Step::deviate`] with a payload-free `why` (closed-set words and
    /// numbers only) appended to the event's message.
    fn deviate_because(
        &mut self,
        class: DeviationClass,
        code: &str,
        capability: Option<CapabilityClass>,
        why: &str,
    ) {
        let at = self.state.current.clone();
        let sequence = u32::try_from(self.state.deviations.len()).unwrap_or(u32::MAX);
        self.state.deviations.push(Deviation {
            class,
            step_id: at.clone(),
            sequence,
            capability_class: capability,
        });
        self.push(event(
            EventKind::Deviation,
            code,
            Some(&at),
            format!("deviation: {}{why}", class.as_str()),
        ));
        if self.state.status == RunStatus::Ended {
            return;
        }
        let total = self.state.deviations.len();
        if total > self.state.escalation.max_total as usize {
            self.end(InternalOutcome::DeviationLimit);
            self.push(event(
                EventKind::Escalated,
                "run/deviation-limit",
                Some(&at),
                format!(
                    "run ended: {total} deviations exceed maxTotal {} (last: {})",
                    self.state.escalation.max_total,
                    class.as_str()
                ),
            ));
            return;
        }
        if class == DeviationClass::BudgetExhausted {
            // The budget is the operator's declared allowance for the edge:
            // the run ends whatever the response (seed 003's fixture cycles
            // a permissive run and sees the class exactly once).
            self.end(InternalOutcome::BudgetExhausted);
            self.push(event(
                EventKind::Escalated,
                "run/escalated-budget-exhausted",
                Some(&at),
                "run ended: budget-exhausted".into(),
            ));
            return;
        }
        if self.state.escalation.response(class) == Response::Abort {
            self.end(InternalOutcome::Aborted);
            let code = format!("run/escalated-{}", class.as_str());
            self.push(event(
                EventKind::Escalated,
                &code,
                Some(&at),
                format!("run ended: {} (escalation policy: abort)", class.as_str()),
            ));
        }
    }

    /// Enter a step (the transition was already checked).
    fn enter(&mut self, graph: &StepGraph, to: &str) {
        let key = format!("{}->{}", self.state.current, to);
        *self.state.edge_counts.entry(key).or_insert(0) += 1;
        self.state.current = to.to_string();
        self.state.checked = false;
        self.push(event(
            EventKind::Entered,
            "run/entered",
            Some(to),
            "entered step".into(),
        ));
        let Some(step) = graph.steps.get(to) else {
            return;
        };
        if step.mutates {
            self.state.mutations += 1;
        }
        if let Some(t) = step.terminal {
            self.end(match t {
                Terminal::Success => InternalOutcome::Success,
                Terminal::Failed => InternalOutcome::Failed,
                Terminal::Escalate => InternalOutcome::Escalated,
            });
            self.push(event(
                EventKind::Ended,
                "run/ended",
                Some(to),
                "run ended on a terminal".into(),
            ));
        }
    }

    /// An ended run refuses everything and records it.
    fn refuse_after_end(mut self) -> Decided {
        self.deviate(DeviationClass::OutOfOrderStep, "run/after-end", None);
        self.done(Verdict::Block)
    }
}

/// Record a deviation directly (an edge that detected one itself). On an
/// ended run it is recorded and the run stays ended.
pub fn record_deviation(state: RunState, class: DeviationClass) -> Decided {
    let mut s = Step::new(state);
    let code = format!("run/{}", class.as_str());
    s.deviate(class, &code, None);
    s.done(Verdict::Block)
}

/// The agent proposes to use a tool.
pub fn propose(graph: &StepGraph, state: RunState, tool: &str) -> Decided {
    let mut s = Step::new(state);
    if s.state.status == RunStatus::Ended {
        return s.refuse_after_end();
    }
    let capability = capability_class_of(Some(tool));
    let here = graph.steps.get(&s.state.current);
    if here.is_some_and(|st| st.tools.iter().any(|t| t == tool)) {
        let at = s.state.current.clone();
        s.push(event(
            EventKind::Permitted,
            "run/permitted",
            Some(&at),
            "tool permitted".into(),
        ));
        return s.done(Verdict::Permit);
    }
    let class = if graph.declares(tool) {
        DeviationClass::OutOfScopeTool
    } else {
        DeviationClass::UndeclaredTool
    };
    let code = format!("run/{}", class.as_str());
    s.deviate(class, &code, capability);
    s.done(Verdict::Block)
}

/// Reduce a command line to the tool it uses (`cli:<program>`), or `None`
/// when it cannot be attributed (shell syntax, substitutions, quoting, a
/// path or an odd program name).
pub fn attribute_command(command: &str) -> Option<String> {
    const SHELL: &[char] = &[
        '$', '`', ';', '|', '&', '>', '<', '(', ')', '{', '}', '\'', '"', '\\', '\n', '\r',
    ];
    if command.contains(SHELL) {
        return None;
    }
    let program = command.split_whitespace().next()?;
    if program.len() > 64
        || !program
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
    {
        return None;
    }
    Some(format!("cli:{program}"))
}

/// The agent proposes a command line: attributed to its program and judged
/// like a tool; an unattributable command is blocked as undeclared with no
/// capability class and nothing of itself kept.
pub fn propose_command(graph: &StepGraph, state: RunState, command: &str) -> Decided {
    if state.status == RunStatus::Ended {
        return Step::new(state).refuse_after_end();
    }
    match attribute_command(command) {
        Some(tool) => propose(graph, state, &tool),
        None => {
            let mut s = Step::new(state);
            s.deviate(
                DeviationClass::UndeclaredTool,
                "run/unanalyzable-command",
                None,
            );
            s.done(Verdict::Block)
        }
    }
}

/// The pre-mutation rule on the latest capture of the run's subject since
/// the last mutation (an earlier, better one does not outvote what the
/// subject looks like now).
fn pre_mutation(state: &RunState, now_ns: i64) -> Result<(), PreMutationRefusal> {
    let Some(subject) = &state.subject else {
        return Err(PreMutationRefusal::Missing);
    };
    let Some(latest) = state
        .captures
        .iter()
        .rfind(|c| &c.subject == subject && c.epoch == state.mutations)
    else {
        return Err(PreMutationRefusal::Missing);
    };
    let Some(completeness) = latest.completeness else {
        return Err(PreMutationRefusal::Missing);
    };
    let facts = EnvelopeFacts {
        digest: latest.digest.clone(),
        subject_key: latest.subject.clone(),
        kind: latest.kind.clone(),
        wall_ns: latest.wall_ns,
        completeness,
    };
    judge_pre_mutation_until(&facts, subject, latest.expires_ns, now_ns)
}

/// The event code of a refused mutation.
pub fn refusal_code(r: &PreMutationRefusal) -> &'static str {
    match r {
        PreMutationRefusal::Missing => "run/pre-mutation-missing",
        PreMutationRefusal::Incomplete { .. } => "run/pre-mutation-incomplete",
        PreMutationRefusal::Stale { .. } => "run/pre-mutation-stale",
        PreMutationRefusal::WrongSubject { .. } | PreMutationRefusal::NotBefore { .. } => {
            "run/pre-mutation-refused"
        }
    }
}

fn post_mutation_met(state: &RunState) -> bool {
    let Some(subject) = &state.subject else {
        return false;
    };
    match state.last_mutation_ns {
        Some(at) => state
            .captures
            .iter()
            .any(|c| &c.subject == subject && c.epoch == state.mutations && c.wall_ns >= at),
        None => false,
    }
}

/// The agent moves to step `to`. `now_ns` judges evidence freshness.
pub fn advance(graph: &StepGraph, state: RunState, to: &str, now_ns: i64) -> Decided {
    let mut s = Step::new(state);
    if s.state.status == RunStatus::Ended {
        return s.refuse_after_end();
    }
    let Some(here) = graph.steps.get(&s.state.current) else {
        s.deviate(
            DeviationClass::OutOfOrderStep,
            "run/out-of-order-step",
            None,
        );
        return s.done(Verdict::Block);
    };
    if !here.next.iter().any(|n| n == to) {
        s.deviate(
            DeviationClass::OutOfOrderStep,
            "run/out-of-order-step",
            None,
        );
        return s.done(Verdict::Block);
    }
    if s.state.evaluate_postconditions && here.assert.is_some() && !s.state.checked {
        s.deviate(
            DeviationClass::UncheckedAdvance,
            "run/unchecked-advance",
            None,
        );
        return s.done(Verdict::Block);
    }
    let key = format!("{}->{}", s.state.current, to);
    if let Some(budget) = graph.budgets.get(&key)
        && s.state.edge_counts.get(&key).copied().unwrap_or(0) >= *budget
    {
        s.deviate(
            DeviationClass::BudgetExhausted,
            "run/budget-exhausted",
            None,
        );
        return s.done(Verdict::Block);
    }
    match graph.steps.get(to).and_then(|t| t.requires) {
        Some(Requirement::FreshPreMutationCapture) => {
            if let Err(refusal) = pre_mutation(&s.state, now_ns) {
                let why = match &refusal {
                    PreMutationRefusal::Incomplete { completeness, .. } => {
                        format!(" (pre-mutation envelope is {})", completeness.as_str())
                    }
                    PreMutationRefusal::Stale { .. } => {
                        " (pre-mutation envelope is stale)".to_string()
                    }
                    PreMutationRefusal::Missing => {
                        " (no pre-mutation envelope of the subject)".to_string()
                    }
                    _ => " (pre-mutation envelope refused)".to_string(),
                };
                s.deviate_because(
                    DeviationClass::OutOfOrderStep,
                    refusal_code(&refusal),
                    None,
                    &why,
                );
                s.refusal = Some(refusal);
                return s.done(Verdict::Block);
            }
        }
        Some(Requirement::PostMutationCapture) if !post_mutation_met(&s.state) => {
            s.deviate(
                DeviationClass::OutOfOrderStep,
                "run/out-of-order-step",
                None,
            );
            return s.done(Verdict::Block);
        }
        _ => {}
    }
    s.enter(graph, to);
    if graph.steps.get(to).is_some_and(|t| t.mutates) {
        s.state.last_mutation_ns = Some(now_ns);
    }
    s.done(Verdict::Permit)
}

/// The agent reports what its step observed.
pub fn observe(graph: &StepGraph, state: RunState, obs: Observation) -> Decided {
    let mut s = Step::new(state);
    if s.state.status == RunStatus::Ended {
        return s.refuse_after_end();
    }
    let at = s.state.current.clone();
    let Some(here) = graph.steps.get(&at) else {
        return s.done(Verdict::Block);
    };
    if let Some(mut capture) = obs.capture {
        if !here.captures {
            s.deviate(
                DeviationClass::OutOfOrderStep,
                "run/out-of-order-step",
                None,
            );
            return s.done(Verdict::Block);
        }
        if s.state.subject.is_none() {
            s.state.subject = Some(capture.subject.clone());
        }
        capture.epoch = s.state.mutations;
        s.state.captures.push(capture);
    }
    let Some(check) = &here.assert else {
        s.state.checked = true;
        return s.done(Verdict::Permit);
    };
    let evaluable = (check.exit_code.is_none() || obs.exit_code.is_some())
        && (check.stdout_equals.is_none() || obs.stdout.is_some());
    let passed = evaluable
        && check
            .exit_code
            .is_none_or(|want| obs.exit_code == Some(want))
        && check
            .stdout_equals
            .as_deref()
            .is_none_or(|want| obs.stdout.as_deref().map(str::trim) == Some(want));
    s.state.checked = true;
    if passed {
        s.push(event(
            EventKind::Checked,
            "run/expectation-passed",
            Some(&at),
            "check passed".into(),
        ));
        if let Some(next) = &here.on_pass {
            s.enter(graph, next);
        }
        return s.done(Verdict::Permit);
    }
    let code = if evaluable {
        "run/expectation-failed"
    } else {
        "run/expectation-unevaluable"
    };
    s.push(event(
        EventKind::Checked,
        code,
        Some(&at),
        "check failed".into(),
    ));
    match &here.on_fail {
        // The author anticipated this failure: routing it is the procedure.
        Some(route) => {
            s.enter(graph, route);
            s.done(Verdict::Permit)
        }
        None => {
            s.deviate(
                DeviationClass::UnroutedFailure,
                "run/unrouted-failure",
                None,
            );
            s.done(Verdict::Block)
        }
    }
}

/// The agent says it is done.
pub fn conclude(graph: &StepGraph, state: RunState) -> Decided {
    let mut s = Step::new(state);
    if s.state.status == RunStatus::Ended {
        // Already ended (on a terminal or by escalation): nothing to add.
        return s.done(Verdict::Permit);
    }
    let on_terminal = graph
        .steps
        .get(&s.state.current)
        .is_some_and(|st| st.terminal.is_some());
    if on_terminal {
        return s.done(Verdict::Permit);
    }
    s.deviate(
        DeviationClass::TerminalNotReached,
        "run/terminal-not-reached",
        None,
    );
    s.done(Verdict::Block)
}

/// The operator's own account of a run (stays on their machine; never
/// emitted).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LocalAccount {
    /// Ended on a terminal the author wrote.
    pub complete: bool,
    /// Count and breakdowns.
    pub deviations: DeviationSummary,
    /// What a reader should bear in mind.
    pub caveats: Vec<String>,
}

/// Deviation count and breakdowns.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviationSummary {
    /// How many.
    pub count: usize,
    /// Per class.
    pub by_class: BTreeMap<DeviationClass, u32>,
    /// Per step.
    pub by_step: BTreeMap<String, u32>,
}

/// The local account of a run.
pub fn local_account(graph: &StepGraph, state: &RunState) -> LocalAccount {
    let mut caveats = Vec::new();
    if !state.deviations.is_empty() {
        caveats.push(
            "deviations were recorded: the step graph may not match reality at the steps counted"
                .to_string(),
        );
    }
    if state.status == RunStatus::Running {
        caveats.push("the run has not ended".to_string());
    }
    LocalAccount {
        complete: state.complete(graph),
        deviations: DeviationSummary {
            count: state.deviations.len(),
            by_class: count_by_class(&state.deviations),
            by_step: count_by_step(&state.deviations),
        },
        caveats,
    }
}
