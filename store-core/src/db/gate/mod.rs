//! Storage of the remediation gate, one concern a file: `incidents`
//! (incidents and runner leases), `ontology` (the current state of
//! targets and the CAS against it), `proposals` (the proposal row, its
//! reads, the insert under the fence and the breaker), `grants` (the
//! guarded transitions: approve, reject, claim, complete, fail, expire) and
//! `watchdog` (checkpoints and receipts). Each opens with its invariants;
//! the types are re-exported here, where their callers name them.
//!
//! Invariant shared by all: every write that races another is one
//! conditional statement or one transaction, so exactly one of two racing
//! writers changes a row.

use serde_json::Value;

mod grants;
mod incidents;
mod ontology;
mod proposals;
mod watchdog;

pub use grants::{ClaimOutcome, Finish, Transition};
pub use incidents::{Fence, FenceRefusal, IncidentRow, LeaseOutcome, NewIncident, fence_check};
pub(in crate::db) use ontology::ontology_upsert;
pub use ontology::{OntologyNode, cas_mismatches, service_node_key};
pub use proposals::{ProposalFilter, ProposalRow, ProposeOutcome};
pub use watchdog::{CheckpointRow, DueCheckpoint, GateReceipt};

/// A stored JSON text column as a value (`null` if it does not parse).
fn parse_json(s: &str) -> Value {
    serde_json::from_str(s).unwrap_or(Value::Null)
}
