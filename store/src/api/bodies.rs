//! The request bodies a write route and the MCP tool that calls it share:
//! the route decodes the body into this type, the tool's input schema is
//! generated from it (schemars), so the two cannot drift.

use pstack_store_core::analysis::proof::{FingerprintInput, RelationshipCertainty};
use serde::Deserialize;
use serde_json::Value;

#[derive(Debug, Clone, Deserialize, serde::Serialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct Link {
    pub(crate) subject: String,
    pub(crate) relation: String,
    pub(crate) object: String,
    #[serde(default)]
    pub(crate) relationship_certainty: Option<RelationshipCertainty>,
}

#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct CounterfactualRequest {
    pub(crate) failing_run_id: String,
    pub(crate) passing_run_ids: Vec<String>,
    pub(crate) required_trials: usize,
}

/// The body of `POST /internal/findings` (also the input of the MCP tool
/// `record_investigation_finding`, whose schema is generated from it).
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct FindingRequest {
    pub(crate) environment: String,
    #[serde(default)]
    pub(crate) incident_id: Option<String>,
    pub(crate) fault_locus_entity_id: String,
    pub(crate) causal_chain: Vec<Link>,
    #[serde(default)]
    pub(crate) cited_evidence_ids: Vec<String>,
    #[serde(default)]
    pub(crate) contributing_change_id: Option<String>,
    #[serde(default)]
    pub(crate) counterfactual: Option<CounterfactualRequest>,
    #[serde(default)]
    pub(crate) fingerprint_input: Option<FingerprintInput>,
    pub(crate) idempotency_key: String,
    /// Accepted and ignored: the server derives the tier.
    #[serde(default)]
    pub(crate) causal_proof_tier: Option<Value>,
}

/// `POST /internal/incidents` body (also the MCP `open_incident` input).
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct IncidentRequest {
    /// Project.
    pub project: String,
    /// Environment.
    pub environment: String,
    /// One active incident per (project, environment, dedupKey).
    pub dedup_key: String,
    /// Title.
    pub title: String,
    /// The entity at fault, if known.
    #[serde(default)]
    pub fault_locus_entity_id: Option<String>,
}

/// The body of `POST /internal/remediations/propose` (also the input of the
/// MCP tool `propose_remediation_action`, whose schema is generated from it).
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct ProposeRequest {
    pub(crate) incident_id: String,
    pub(crate) finding_id: String,
    pub(crate) action: String,
    pub(crate) target: Value,
    pub(crate) expected_current_state: Value,
    #[serde(default)]
    pub(crate) requested_autonomy: Option<String>,
    pub(crate) idempotency_key: String,
    #[serde(default)]
    pub(crate) pre_mutation_envelope: Option<String>,
    #[serde(default)]
    pub(crate) webhook_url: Option<String>,
    /// HMAC secret of the grant delivery (seed 000: `webhookSecret`;
    /// `secret`, the HTTP body's older name, is accepted as an alias).
    #[serde(default, alias = "secret")]
    pub(crate) webhook_secret: Option<String>,
    #[serde(default)]
    pub(crate) runner_id: Option<String>,
    #[serde(default)]
    pub(crate) fencing_token: Option<i64>,
}
