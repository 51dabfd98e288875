//! The deviation taxonomy (seed 003): the seven classes, the payload-free
//! record, capability classes, escalation policy and the aggregates an
//! author reads.
//!
//! Invariants: a [`Deviation`] holds a class, a step id of the declared
//! graph, a sequence number and at most a capability class from a closed
//! set — never a tool string, argument, command, output or time; the
//! escalation policy is data the operator may override per class.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The seven deviation classes, exactly.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum DeviationClass {
    /// A tool no step declares.
    UndeclaredTool,
    /// A tool another step declares.
    OutOfScopeTool,
    /// A transition the graph does not have, or whose evidence requirement
    /// is unmet (pstack: MUTATE without a fresh pre-mutation capture).
    OutOfOrderStep,
    /// Leaving a step whose postconditions were not evaluated.
    UncheckedAdvance,
    /// An edge taken more often than its budget.
    BudgetExhausted,
    /// A failed check on a step with no failure route.
    UnroutedFailure,
    /// Concluding while not on a terminal.
    TerminalNotReached,
}

impl DeviationClass {
    /// Every class, in declaration order.
    pub const ALL: [DeviationClass; 7] = [
        DeviationClass::UndeclaredTool,
        DeviationClass::OutOfScopeTool,
        DeviationClass::OutOfOrderStep,
        DeviationClass::UncheckedAdvance,
        DeviationClass::BudgetExhausted,
        DeviationClass::UnroutedFailure,
        DeviationClass::TerminalNotReached,
    ];

    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            DeviationClass::UndeclaredTool => "undeclared-tool",
            DeviationClass::OutOfScopeTool => "out-of-scope-tool",
            DeviationClass::OutOfOrderStep => "out-of-order-step",
            DeviationClass::UncheckedAdvance => "unchecked-advance",
            DeviationClass::BudgetExhausted => "budget-exhausted",
            DeviationClass::UnroutedFailure => "unrouted-failure",
            DeviationClass::TerminalNotReached => "terminal-not-reached",
        }
    }

    /// Does this class break control flow (so by default ends the run)?
    pub fn is_control_flow(self) -> bool {
        !matches!(
            self,
            DeviationClass::UndeclaredTool | DeviationClass::OutOfScopeTool
        )
    }
}

/// Capability classes: the only thing of a tool a record keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum CapabilityClass {
    /// A command line program.
    Cli,
    /// An MCP tool.
    Mcp,
    /// An HTTP call.
    Http,
    /// One of pstack's own tools.
    Pstack,
}

/// `cli:kubectl` → `cli`, `mcp:github/create_issue` → `mcp`; anything
/// whose prefix is not a known class (`Bearer sk-live-1`) → `None`.
pub fn capability_class_of(tool: Option<&str>) -> Option<CapabilityClass> {
    let (prefix, rest) = tool?.split_once(':')?;
    if rest.is_empty() {
        return None;
    }
    match prefix {
        "cli" => Some(CapabilityClass::Cli),
        "mcp" => Some(CapabilityClass::Mcp),
        "http" => Some(CapabilityClass::Http),
        "pstack" => Some(CapabilityClass::Pstack),
        _ => None,
    }
}

/// One deviation: class, where, in which order, which kind of capability.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Deviation {
    /// The class.
    pub class: DeviationClass,
    /// The step the run was on.
    pub step_id: String,
    /// 0, 1, … per run; no clock.
    pub sequence: u32,
    /// The attempted tool's class, when it had one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capability_class: Option<CapabilityClass>,
}

/// What the supervisor does when a class occurs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Response {
    /// End the run (an `escalated` event names the class).
    Abort,
    /// Refuse the call or transition and keep the run going.
    BlockAndContinue,
}

/// The operator's escalation policy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Escalation {
    /// Response per class; a class not named takes the default.
    #[serde(default)]
    pub responses: BTreeMap<DeviationClass, Response>,
    /// The run ends once it has recorded more deviations than this.
    #[serde(default = "default_max_total")]
    pub max_total: u32,
}

/// The default `maxTotal` (seed 003 does not state its number; pstack
/// allows five blocked calls before it stops an agent that keeps trying).
pub const DEFAULT_MAX_TOTAL: u32 = 5;

fn default_max_total() -> u32 {
    DEFAULT_MAX_TOTAL
}

impl Default for Escalation {
    fn default() -> Escalation {
        Escalation {
            responses: BTreeMap::new(),
            max_total: DEFAULT_MAX_TOTAL,
        }
    }
}

impl Escalation {
    /// The default response: control-flow deviations end the run (every
    /// later authorization would otherwise be decided against the wrong
    /// step); the two tool classes block the call and continue (the call
    /// never runs, the step is still the right one).
    pub fn default_response(class: DeviationClass) -> Response {
        if class.is_control_flow() {
            Response::Abort
        } else {
            Response::BlockAndContinue
        }
    }

    /// The response for a class under this policy.
    pub fn response(&self, class: DeviationClass) -> Response {
        self.responses
            .get(&class)
            .copied()
            .unwrap_or_else(|| Escalation::default_response(class))
    }

    /// Every class `block-and-continue`, `maxTotal` as given.
    pub fn permissive(max_total: u32) -> Escalation {
        Escalation {
            responses: DeviationClass::ALL
                .iter()
                .map(|c| (*c, Response::BlockAndContinue))
                .collect(),
            max_total,
        }
    }
}

/// Deviations per class.
pub fn count_by_class(records: &[Deviation]) -> BTreeMap<DeviationClass, u32> {
    let mut m = BTreeMap::new();
    for r in records {
        *m.entry(r.class).or_insert(0) += 1;
    }
    m
}

/// Deviations per step.
pub fn count_by_step(records: &[Deviation]) -> BTreeMap<String, u32> {
    let mut m = BTreeMap::new();
    for r in records {
        *m.entry(r.step_id.clone()).or_insert(0) += 1;
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_capability_reduces_to_its_class_and_nothing_finer() {
        assert_eq!(
            capability_class_of(Some("cli:kubectl")),
            Some(CapabilityClass::Cli)
        );
        assert_eq!(
            capability_class_of(Some("mcp:github/create_issue")),
            Some(CapabilityClass::Mcp)
        );
        assert_eq!(capability_class_of(Some("Bearer sk-live-1")), None);
        assert_eq!(capability_class_of(Some("cli:")), None);
        assert_eq!(capability_class_of(None), None);
    }

    #[test]
    fn counts_by_class_and_by_step() {
        let d = |class, step: &str, sequence| Deviation {
            class,
            step_id: step.into(),
            sequence,
            capability_class: None,
        };
        let records = [
            d(DeviationClass::OutOfScopeTool, "s4", 0),
            d(DeviationClass::OutOfScopeTool, "s4", 1),
            d(DeviationClass::UndeclaredTool, "s1", 2),
        ];
        let by_class = count_by_class(&records);
        assert_eq!(by_class[&DeviationClass::OutOfScopeTool], 2);
        assert_eq!(by_class[&DeviationClass::UndeclaredTool], 1);
        assert_eq!(by_class.len(), 2);
        let by_step = count_by_step(&records);
        assert_eq!((by_step["s4"], by_step["s1"], by_step.len()), (2, 1, 2));
    }

    #[test]
    fn default_escalation_aborts_on_control_flow_only() {
        let e = Escalation::default();
        for c in DeviationClass::ALL {
            let want = if matches!(
                c,
                DeviationClass::UndeclaredTool | DeviationClass::OutOfScopeTool
            ) {
                Response::BlockAndContinue
            } else {
                Response::Abort
            };
            assert_eq!(e.response(c), want, "{}", c.as_str());
        }
    }
}
