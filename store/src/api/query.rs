//! The query parameters of the store's read routes as types, shared by the
//! routes and the MCP tools that call them: a route accepts exactly its
//! type's parameters ([`QueryParams::PARAMS`], refused by name otherwise),
//! and the tool's input schema is generated (schemars) from the same type,
//! so the two cannot drift. Values are validated by the route (ranges,
//! time formats, enums) with its own typed errors.
//!
//! Invariants: every type's `PARAMS` is exactly its serialized field names
//! (a test compares them with the generated schema); optional parameters
//! are skipped when absent, so [`QueryParams::to_query`] renders only what
//! the caller set.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A read route's query type.
pub trait QueryParams: Serialize {
    /// The parameter names the route accepts (the documented ones, in the
    /// input schema).
    const PARAMS: &'static [&'static str];
    /// Older names the route still accepts for some of them (kept for the
    /// clients written against them; absent from the schema).
    const ALIASES: &'static [&'static str] = &[];

    /// The pairs to put in the route's query string, in field order.
    fn to_query(&self) -> Vec<(String, String)> {
        match serde_json::to_value(self) {
            Ok(serde_json::Value::Object(m)) => m
                .into_iter()
                .map(|(k, v)| {
                    let v = match v {
                        serde_json::Value::String(s) => s,
                        other => other.to_string(),
                    };
                    (k, v)
                })
                .collect(),
            _ => Vec::new(),
        }
    }
}

/// `GET /v1/changes` (tool `list_recent_changes`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ChangesQuery {
    /// Environment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub environment: Option<String>,
    /// Service (`service.name`). `service` is accepted as an alias.
    #[serde(default, alias = "service", skip_serializing_if = "Option::is_none")]
    pub service_name: Option<String>,
    /// Only changes at or after this time (RFC 3339, or a window like `24h`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<String>,
    /// At most this many (1-1000, default 100).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
}

impl QueryParams for ChangesQuery {
    const PARAMS: &'static [&'static str] = &["environment", "serviceName", "since", "limit"];
    const ALIASES: &'static [&'static str] = &["service"];
}

/// `GET /internal/changes/{id}/blast-radius` (tool `get_change_blast_radius`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BlastQuery {
    /// Smallest sample that supports a verdict.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_sample: Option<u32>,
    /// Window around the change, like `30m`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<String>,
    /// Fleet metric (`resets`, `rto_timeouts`, `d_state_episodes`, `rebuild_failures`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metric: Option<String>,
}

impl QueryParams for BlastQuery {
    const PARAMS: &'static [&'static str] = &["minSample", "window", "metric"];
}

/// `GET /internal/findings` (tool `search_similar_findings`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FindingsQuery {
    /// Recurrence fingerprint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fingerprint: Option<String>,
    /// Fault locus entity id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fault_locus_entity_id: Option<String>,
    /// At most this many (1-1000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
}

impl QueryParams for FindingsQuery {
    const PARAMS: &'static [&'static str] = &["fingerprint", "faultLocusEntityId", "limit"];
}

/// `GET /internal/incidents` (tool `list_incidents`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct IncidentsQuery {
    /// Environment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub environment: Option<String>,
    /// `open`, `leased`, `resolved`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
    /// At most this many (1-1000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
}

impl QueryParams for IncidentsQuery {
    const PARAMS: &'static [&'static str] = &["environment", "status", "limit"];
}

/// `GET /internal/bundles` (tool `get_evidence_bundle`): exactly one
/// anchor (`incident`, `change` or `finding`; the route refuses none or
/// two).
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BundleQuery {
    /// What the bundle is for: `triage_incident` (the default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub intent: Option<String>,
    /// Anchor: the incident (`inc_…`) the bundle is about.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub incident: Option<String>,
    /// Anchor: a change (`chg_…`), the first candidate; its service is the
    /// fault locus.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub change: Option<String>,
    /// Anchor: a finding (`fnd_…`), with its incident if it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finding: Option<String>,
    /// Token budget (100-1000000, default 4000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget_tokens: Option<u32>,
}

impl QueryParams for BundleQuery {
    const PARAMS: &'static [&'static str] =
        &["intent", "incident", "change", "finding", "budgetTokens"];
}

/// `GET /v1/diff` (tool `diff_envelopes`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DiffQuery {
    /// Digest of the earlier envelope.
    pub before: String,
    /// Digest of the later envelope of the same subject.
    pub after: String,
}

impl QueryParams for DiffQuery {
    const PARAMS: &'static [&'static str] = &["before", "after"];
}

/// `GET /v1/unknowns` (tool `list_open_unknowns`, which asks `open=true`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct UnknownsQuery {
    /// Only open unknowns (`true`, the default) or closed ones (`false`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub open: Option<bool>,
    /// Owner.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// At most this many (1-1000, default 100).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
    /// Skip this many.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offset: Option<u32>,
}

impl QueryParams for UnknownsQuery {
    const PARAMS: &'static [&'static str] = &["open", "owner", "limit", "offset"];
}

#[cfg(test)]
mod tests {
    use super::*;

    fn properties<T: JsonSchema>() -> Vec<String> {
        let schema = serde_json::to_value(schemars::schema_for!(T)).unwrap();
        let mut p: Vec<String> = schema["properties"]
            .as_object()
            .unwrap()
            .keys()
            .cloned()
            .collect();
        p.sort();
        p
    }

    fn params<T: QueryParams>() -> Vec<String> {
        let mut p: Vec<String> = T::PARAMS.iter().map(|s| s.to_string()).collect();
        p.sort();
        p
    }

    #[test]
    fn each_routes_accepted_parameters_are_its_types_fields() {
        assert_eq!(params::<ChangesQuery>(), properties::<ChangesQuery>());
        assert_eq!(params::<BlastQuery>(), properties::<BlastQuery>());
        assert_eq!(params::<FindingsQuery>(), properties::<FindingsQuery>());
        assert_eq!(params::<IncidentsQuery>(), properties::<IncidentsQuery>());
        assert_eq!(params::<BundleQuery>(), properties::<BundleQuery>());
        assert_eq!(params::<DiffQuery>(), properties::<DiffQuery>());
        assert_eq!(params::<UnknownsQuery>(), properties::<UnknownsQuery>());
    }

    #[test]
    fn only_set_parameters_are_rendered() {
        let q = ChangesQuery {
            service_name: Some("checkout".into()),
            limit: Some(5),
            ..Default::default()
        };
        assert_eq!(
            q.to_query(),
            vec![
                ("limit".to_string(), "5".to_string()),
                ("serviceName".to_string(), "checkout".to_string())
            ]
        );
        let u = UnknownsQuery {
            open: Some(true),
            ..Default::default()
        };
        assert_eq!(u.to_query(), vec![("open".to_string(), "true".to_string())]);
    }
}
