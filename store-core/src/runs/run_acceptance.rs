//! What one run has accumulated toward seed 001's acceptance metrics, kept
//! in its state ([`crate::runs::supervisor::RunState`]). The metrics
//! themselves — the per-run summary and the process's counters — are
//! [`crate::runs::acceptance`]; this record sits below both so that the run
//! core and the metrics do not import each other.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// What a run has accumulated (kept in its state).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunAcceptance {
    /// ns from the run's start to its first discriminating envelope.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_discriminating_after_ns: Option<i64>,
    /// Ledger moves out of a judgement its envelopes caused.
    #[serde(default)]
    pub retractions: u32,
    /// It reopened a settled question.
    #[serde(default)]
    pub repeated_investigation: bool,
    /// Unknowns with an empty owner or probe in its envelopes.
    #[serde(default)]
    pub unknowns_without_owner_or_probe: u32,
    /// Advances that cited an expired or unknown handoff.
    #[serde(default)]
    pub stale_handoffs: u32,
    /// Estimated tokens of free text in its steps.
    #[serde(default)]
    pub narration_tokens: u64,
}
