//! Step graphs a supervised run follows (seed 003's runbook envelope, in
//! pstack's terms): named steps, the tools each step declares, the legal
//! successors, an optional check with its failure route, per-edge budgets
//! and terminals. pstack ships the investigation loop of seed 001 ("Agent
//! loop") as [`investigation_loop`]; operators may register their own.
//!
//! Invariants: a graph that passes [`StepGraph::validate`] has an entry
//! step, every successor / `onFail` / budget edge names a step that
//! exists, every terminal has no successors and declares no tools, and
//! every tool carries a capability class ([`super::deviation::capability_class_of`]).

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::deviation::capability_class_of;

/// How a terminal step ends the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Terminal {
    /// The procedure reached its goal.
    Success,
    /// The procedure's declared failing path.
    Failed,
    /// The author's hand-off to a person: where the procedure meant to end
    /// when its checks say it cannot go on. Not a deviation.
    Escalate,
}

/// What a step requires of the evidence before the run may enter it
/// (pstack's own rule for the agent loop, seed 001: "Before mutation
/// require one sealed bundle …; after mutation produce a second bundle for
/// the same subject").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Requirement {
    /// A sealed envelope of the run's subject, recorded since the last
    /// mutation and not expired at the moment of the advance.
    FreshPreMutationCapture,
    /// A sealed envelope of the run's subject recorded after the last
    /// mutation.
    PostMutationCapture,
}

/// The check a step's observation is held to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Assert {
    /// The exit code the step's command must return.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// The exact (trimmed) standard output the step must print.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdout_equals: Option<String>,
}

/// One step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Step {
    /// Tools this step may use (`cli:…`, `mcp:…`, `pstack:…`, `http:…`).
    #[serde(default)]
    pub tools: Vec<String>,
    /// Legal successors.
    #[serde(default)]
    pub next: Vec<String>,
    /// The check an observation of this step is held to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub assert: Option<Assert>,
    /// Where a failed check goes (an anticipated failure). Without it a
    /// failed check is an `unrouted-failure`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_fail: Option<String>,
    /// Where a passed check goes; without it the run stays and the agent
    /// advances.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_pass: Option<String>,
    /// This step ends the run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub terminal: Option<Terminal>,
    /// Observations in this step record envelopes (CAPTURE steps).
    #[serde(default)]
    pub captures: bool,
    /// Entering this step is a mutation.
    #[serde(default)]
    pub mutates: bool,
    /// What the evidence must show before the run may enter this step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requires: Option<Requirement>,
}

/// A declared step graph.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StepGraph {
    /// `publisher/slug`.
    pub name: String,
    /// The graph's version.
    pub version: String,
    /// The first step.
    pub entry: String,
    /// Steps by id.
    pub steps: BTreeMap<String, Step>,
    /// How often an edge `"from->to"` may be taken.
    #[serde(default)]
    pub budgets: BTreeMap<String, u32>,
}

/// Why a graph is not registrable. `field` names the offending place.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct GraphError {
    /// JSON path of the offending field.
    pub field: String,
    /// What is wrong.
    pub message: String,
}

fn gerr(field: impl Into<String>, message: impl Into<String>) -> GraphError {
    GraphError {
        field: field.into(),
        message: message.into(),
    }
}

/// Step ids and names: short, printable, no separators that would make
/// `"from->to"` ambiguous.
fn valid_id(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b':' || b == b'.')
        && !s.contains("->")
}

impl StepGraph {
    /// Check the graph's closed world (see the module invariants).
    pub fn validate(&self) -> Result<(), GraphError> {
        if self.name.is_empty()
            || self.name.len() > 128
            || !self.name.contains('/')
            || !self.name.split('/').all(valid_id)
        {
            return Err(gerr("name", "must be publisher/slug"));
        }
        if self.version.is_empty() || self.version.len() > 32 || !valid_id(&self.version) {
            return Err(gerr("version", "1-32 characters of [A-Za-z0-9_.:-]"));
        }
        if self.steps.is_empty() || self.steps.len() > 64 {
            return Err(gerr("steps", "1-64 steps"));
        }
        if !self.steps.contains_key(&self.entry) {
            return Err(gerr("entry", "names no step"));
        }
        for (id, step) in &self.steps {
            let at = |f: &str| format!("steps.{id}.{f}");
            if !valid_id(id) {
                return Err(gerr(format!("steps.{id}"), "bad step id"));
            }
            for n in step.next.iter().chain(&step.on_fail).chain(&step.on_pass) {
                if !self.steps.contains_key(n) {
                    return Err(gerr(at("next"), format!("names no step: {n}")));
                }
            }
            for (i, t) in step.tools.iter().enumerate() {
                if capability_class_of(Some(t)).is_none() || t.len() > 128 {
                    return Err(gerr(
                        format!("steps.{id}.tools[{i}]"),
                        "a tool is <class>:<name> with class cli, mcp, http or pstack",
                    ));
                }
            }
            if step.terminal.is_some() && (!step.next.is_empty() || !step.tools.is_empty()) {
                return Err(gerr(
                    at("terminal"),
                    "a terminal has no successors or tools",
                ));
            }
        }
        if !self.steps.values().any(|s| s.terminal.is_some()) {
            return Err(gerr("steps", "no terminal step"));
        }
        for edge in self.budgets.keys() {
            let ok = edge.split_once("->").is_some_and(|(f, t)| {
                self.steps
                    .get(f)
                    .is_some_and(|s| s.next.iter().any(|n| n == t))
            });
            if !ok {
                return Err(gerr(
                    format!("budgets.{edge}"),
                    "must be \"from->to\" over a declared edge",
                ));
            }
        }
        Ok(())
    }

    /// Is `tool` declared by any step?
    pub fn declares(&self, tool: &str) -> bool {
        self.steps
            .values()
            .any(|s| s.tools.iter().any(|t| t == tool))
    }
}

/// Step ids of the default graph.
pub mod loop_steps {
    /// CAPTURE.
    pub const CAPTURE: &str = "capture";
    /// BIND IDENTITY.
    pub const BIND_IDENTITY: &str = "bind-identity";
    /// CLASSIFY UNKNOWN.
    pub const CLASSIFY_UNKNOWN: &str = "classify-unknown";
    /// CHOOSE FALSIFIER.
    pub const CHOOSE_FALSIFIER: &str = "choose-falsifier";
    /// MUTATE.
    pub const MUTATE: &str = "mutate";
    /// CAPTURE AGAIN.
    pub const CAPTURE_AGAIN: &str = "capture-again";
    /// DIFF.
    pub const DIFF: &str = "diff";
    /// ISSUE RECEIPT.
    pub const ISSUE_RECEIPT: &str = "issue-receipt";
    /// Terminals.
    pub const END_SUCCESS: &str = "end:success";
    /// The diff showed the mutation did not do what the falsifier said.
    pub const END_FAILED: &str = "end:failed";
    /// Hand-off to a person.
    pub const END_ESCALATE: &str = "end:escalate";
}

/// The default graph: seed 001's agent loop, CAPTURE → BIND IDENTITY →
/// CLASSIFY UNKNOWN → CHOOSE FALSIFIER → MUTATE → CAPTURE AGAIN → DIFF →
/// ISSUE RECEIPT. CLASSIFY UNKNOWN may escalate (nothing safe to try);
/// DIFF's check (exit code 0 = the falsifier's prediction held) routes a
/// failure to `end:failed`, whose report carries `expectation_mismatch`
/// and whose run leaves a typed-failure receipt. DIFF may loop back to
/// CHOOSE FALSIFIER at most twice.
pub fn investigation_loop() -> StepGraph {
    use loop_steps::*;
    let step = |tools: &[&str], next: &[&str]| Step {
        tools: tools.iter().map(|s| s.to_string()).collect(),
        next: next.iter().map(|s| s.to_string()).collect(),
        ..Step::default()
    };
    let terminal = |t| Step {
        terminal: Some(t),
        ..Step::default()
    };
    let mut steps = BTreeMap::new();
    steps.insert(
        CAPTURE.into(),
        Step {
            captures: true,
            ..step(
                &["cli:pstackctl", "pstack:get_envelope_handoff"],
                &[BIND_IDENTITY],
            )
        },
    );
    steps.insert(
        BIND_IDENTITY.into(),
        step(&["pstack:get_envelope_handoff"], &[CLASSIFY_UNKNOWN]),
    );
    steps.insert(
        CLASSIFY_UNKNOWN.into(),
        step(
            &["pstack:list_open_unknowns", "pstack:get_evidence_bundle"],
            &[CHOOSE_FALSIFIER, END_ESCALATE],
        ),
    );
    steps.insert(
        CHOOSE_FALSIFIER.into(),
        step(
            &[
                "pstack:search_similar_findings",
                "pstack:get_change_blast_radius",
                "pstack:list_recent_changes",
            ],
            &[MUTATE, END_ESCALATE],
        ),
    );
    steps.insert(
        MUTATE.into(),
        Step {
            mutates: true,
            requires: Some(Requirement::FreshPreMutationCapture),
            ..step(
                &[
                    "pstack:propose_remediation_action",
                    "pstack:claim_remediation_grant",
                ],
                &[CAPTURE_AGAIN],
            )
        },
    );
    steps.insert(
        CAPTURE_AGAIN.into(),
        Step {
            captures: true,
            ..step(&["cli:pstackctl"], &[DIFF])
        },
    );
    steps.insert(
        DIFF.into(),
        Step {
            requires: Some(Requirement::PostMutationCapture),
            assert: Some(Assert {
                exit_code: Some(0),
                stdout_equals: None,
            }),
            on_fail: Some(END_FAILED.into()),
            ..step(
                &["pstack:diff_envelopes"],
                &[ISSUE_RECEIPT, CHOOSE_FALSIFIER],
            )
        },
    );
    steps.insert(
        ISSUE_RECEIPT.into(),
        step(&["pstack:record_investigation_finding"], &[END_SUCCESS]),
    );
    steps.insert(END_SUCCESS.into(), terminal(Terminal::Success));
    steps.insert(END_FAILED.into(), terminal(Terminal::Failed));
    steps.insert(END_ESCALATE.into(), terminal(Terminal::Escalate));
    let mut budgets = BTreeMap::new();
    budgets.insert(format!("{DIFF}->{CHOOSE_FALSIFIER}"), 2);
    StepGraph {
        name: "pstack/investigation-loop".into(),
        version: "1".into(),
        entry: CAPTURE.into(),
        steps,
        budgets,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_graph_is_valid() {
        investigation_loop().validate().unwrap();
    }

    #[test]
    fn a_graph_naming_a_missing_step_is_refused_with_the_field() {
        let mut g = investigation_loop();
        g.steps.get_mut("diff").unwrap().next.push("nowhere".into());
        assert_eq!(g.validate().unwrap_err().field, "steps.diff.next");
        let mut g = investigation_loop();
        g.budgets.insert("capture->mutate".into(), 1);
        assert_eq!(g.validate().unwrap_err().field, "budgets.capture->mutate");
        let mut g = investigation_loop();
        g.steps
            .get_mut("capture")
            .unwrap()
            .tools
            .push("Bearer sk-live-1".into());
        assert_eq!(g.validate().unwrap_err().field, "steps.capture.tools[2]");
    }
}
