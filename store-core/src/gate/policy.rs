//! The remediation policy (seed 000, "Policy matrix and statuses"): which
//! autonomy an action earns from a finding's server-derived proof tier, how a
//! caller may only lower it, the proposal statuses, and the gate's windows.
//!
//! Pure: no I/O, no clock. Every rule here is a total function of its
//! inputs, so the table tests can enumerate every cell.

use serde::{Deserialize, Serialize};

use crate::analysis::proof::CausalProofTier;

/// A grant must be claimed within this long of being minted (`grantExpiresAt`).
pub const GRANT_CLAIM_WINDOW_NS: i64 = 5 * 60 * 1_000_000_000;
/// A claimed grant must be completed or failed within this long of the claim.
pub const EXECUTION_WINDOW_NS: i64 = 5 * 60 * 1_000_000_000;
/// The circuit breaker's window.
pub const BREAKER_WINDOW_NS: i64 = 60 * 60 * 1_000_000_000;
/// Live proposals of one action kind per finding fingerprint allowed in the
/// window; the next one is blocked.
pub const BREAKER_LIMIT: i64 = 3;

/// The five remediation actions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// Roll a deploy back.
    RollbackDeploy,
    /// Flip a feature flag.
    ToggleFeatureFlag,
    /// Open a pull request with a code fix.
    OpenCodePr,
    /// Apply (revert) a configuration.
    ApplyConfig,
    /// Promote an agent prompt version.
    PromoteAgentPrompt,
}

impl Action {
    /// Every action.
    pub const ALL: [Action; 5] = [
        Action::RollbackDeploy,
        Action::ToggleFeatureFlag,
        Action::OpenCodePr,
        Action::ApplyConfig,
        Action::PromoteAgentPrompt,
    ];

    /// Wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Action::RollbackDeploy => "rollback_deploy",
            Action::ToggleFeatureFlag => "toggle_feature_flag",
            Action::OpenCodePr => "open_code_pr",
            Action::ApplyConfig => "apply_config",
            Action::PromoteAgentPrompt => "promote_agent_prompt",
        }
    }

    /// Parse a wire name.
    pub fn parse(s: &str) -> Option<Action> {
        Action::ALL.into_iter().find(|a| a.as_str() == s)
    }
}

/// Autonomy levels, ordered from least to most autonomous;
/// `BlockedByPolicy` sits outside the order (nothing lifts or lowers it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Autonomy {
    /// The policy forbids the action at this tier.
    BlockedByPolicy,
    /// Look, don't touch.
    ReadOnly,
    /// Suggest only.
    SuggestedAction,
    /// A human approves before a grant is minted.
    HumanApprovedWrite,
    /// A grant is minted at once.
    AutonomousWrite,
}

impl Autonomy {
    /// Every level.
    pub const ALL: [Autonomy; 5] = [
        Autonomy::BlockedByPolicy,
        Autonomy::ReadOnly,
        Autonomy::SuggestedAction,
        Autonomy::HumanApprovedWrite,
        Autonomy::AutonomousWrite,
    ];

    /// Wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Autonomy::BlockedByPolicy => "blocked_by_policy",
            Autonomy::ReadOnly => "read_only",
            Autonomy::SuggestedAction => "suggested_action",
            Autonomy::HumanApprovedWrite => "human_approved_write",
            Autonomy::AutonomousWrite => "autonomous_write",
        }
    }

    /// Parse a wire name.
    pub fn parse(s: &str) -> Option<Autonomy> {
        Autonomy::ALL.into_iter().find(|a| a.as_str() == s)
    }

    fn rank(self) -> u8 {
        match self {
            Autonomy::BlockedByPolicy => 0,
            Autonomy::ReadOnly => 1,
            Autonomy::SuggestedAction => 2,
            Autonomy::HumanApprovedWrite => 3,
            Autonomy::AutonomousWrite => 4,
        }
    }
}

/// The seed's matrix: the autonomy `action` earns at `tier`.
pub fn matrix(action: Action, tier: CausalProofTier) -> Autonomy {
    use Autonomy::{
        AutonomousWrite as Auto, BlockedByPolicy as Blocked, HumanApprovedWrite as Human,
    };
    use CausalProofTier::*;
    match (action, tier) {
        (_, CounterfactualVerified) => Auto,
        (Action::RollbackDeploy | Action::ToggleFeatureFlag, CohortRateIsolated) => Auto,
        (Action::RollbackDeploy | Action::ToggleFeatureFlag, CorroboratedCandidate) => Human,
        (Action::RollbackDeploy | Action::ToggleFeatureFlag, UnverifiedLocus) => Blocked,
        (Action::OpenCodePr, CohortRateIsolated | CorroboratedCandidate) => Auto,
        (Action::OpenCodePr, UnverifiedLocus) => Human,
        (Action::ApplyConfig | Action::PromoteAgentPrompt, CohortRateIsolated) => Human,
        (Action::ApplyConfig | Action::PromoteAgentPrompt, CorroboratedCandidate) => Human,
        (Action::ApplyConfig | Action::PromoteAgentPrompt, UnverifiedLocus) => Blocked,
    }
}

/// The policy decision with the caller's request applied: a request can
/// only lower the matrix's answer, never raise it, and nothing un-blocks a
/// blocked action. Requesting `blocked_by_policy` is not a level and is
/// refused by the caller's validation, not here.
pub fn effective_autonomy(
    action: Action,
    tier: CausalProofTier,
    requested: Option<Autonomy>,
) -> Autonomy {
    let policy = matrix(action, tier);
    match requested {
        _ if policy == Autonomy::BlockedByPolicy => policy,
        Some(r) if r != Autonomy::BlockedByPolicy && r.rank() < policy.rank() => r,
        _ => policy,
    }
}

/// The eight statuses a proposal can reach (`proposed` exists in the schema
/// only and is never emitted).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Parked for a human.
    PendingHumanApproval,
    /// A grant is out, unclaimed.
    GrantIssued,
    /// A runner claimed the grant and is executing.
    ClaimedExecuting,
    /// The runner reported success.
    Completed,
    /// The runner reported failure.
    FailedExecution,
    /// The claiming runner reported nothing within the execution window.
    ExecutionTimedOut,
    /// The grant was not claimed within its window.
    Expired,
    /// Blocked by policy, or rejected by a human.
    Rejected,
}

impl Status {
    /// Every reachable status.
    pub const ALL: [Status; 8] = [
        Status::PendingHumanApproval,
        Status::GrantIssued,
        Status::ClaimedExecuting,
        Status::Completed,
        Status::FailedExecution,
        Status::ExecutionTimedOut,
        Status::Expired,
        Status::Rejected,
    ];

    /// Wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::PendingHumanApproval => "pending_human_approval",
            Status::GrantIssued => "grant_issued",
            Status::ClaimedExecuting => "claimed_executing",
            Status::Completed => "completed",
            Status::FailedExecution => "failed_execution",
            Status::ExecutionTimedOut => "execution_timed_out",
            Status::Expired => "expired",
            Status::Rejected => "rejected",
        }
    }

    /// Parse a wire name.
    pub fn parse(s: &str) -> Option<Status> {
        Status::ALL.into_iter().find(|x| x.as_str() == s)
    }

    /// Whether a proposal in this status holds a circuit-breaker slot.
    pub fn counts_for_breaker(self) -> bool {
        !matches!(self, Status::Rejected | Status::Expired)
    }
}

/// The status a new proposal starts in, given its effective autonomy.
pub fn initial_status(effective: Autonomy) -> Status {
    match effective {
        Autonomy::BlockedByPolicy => Status::Rejected,
        Autonomy::AutonomousWrite => Status::GrantIssued,
        Autonomy::HumanApprovedWrite | Autonomy::SuggestedAction | Autonomy::ReadOnly => {
            Status::PendingHumanApproval
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lowering_never_raises_and_never_unblocks() {
        for a in Action::ALL {
            for t in [
                CausalProofTier::UnverifiedLocus,
                CausalProofTier::CorroboratedCandidate,
                CausalProofTier::CohortRateIsolated,
                CausalProofTier::CounterfactualVerified,
            ] {
                let policy = matrix(a, t);
                for r in Autonomy::ALL {
                    let e = effective_autonomy(a, t, Some(r));
                    assert!(e.rank() <= policy.rank(), "{a:?} {t:?} {r:?}");
                    if policy == Autonomy::BlockedByPolicy {
                        assert_eq!(e, policy);
                    }
                }
            }
        }
    }
}
