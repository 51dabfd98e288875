//! The change ledger's wire types and their validation (pure).
//!
//! Invariants: a change is validated whole before anything is stored; every
//! refusal names the offending field. Service changes (`deploy`, `rollback`,
//! `feature_flag`, `config`, `agent_prompt`) need `service`; host changes
//! (`kernel`, `node_image`, `cni`, `storage`, `sysctl`) need `nodes`.

use serde::{Deserialize, Serialize};

use crate::ident::{format_ns, wall_time_ns};

/// Service-level change kinds.
pub const SERVICE_KINDS: &[&str] = &[
    "deploy",
    "rollback",
    "feature_flag",
    "config",
    "agent_prompt",
];
/// Host-level change kinds.
pub const HOST_KINDS: &[&str] = &["kernel", "node_image", "cni", "storage", "sysctl"];

/// A node a host change reached.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ChangeNode {
    /// Node name (as the node's envelopes name their host).
    pub node: String,
    /// When the node got the change (RFC 3339 UTC); default the change's `at`.
    #[serde(default)]
    pub at: Option<String>,
}

/// Body of `POST /v1/changes`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ChangeRequest {
    /// e.g. `prod`.
    pub environment: Option<String>,
    /// One of [`SERVICE_KINDS`] or [`HOST_KINDS`].
    pub kind: Option<String>,
    /// `service.name` of the changed service.
    pub service: Option<String>,
    /// New `service.version`.
    pub version: Option<String>,
    /// Version it replaces.
    pub previous_version: Option<String>,
    /// New commit.
    pub commit_sha: Option<String>,
    /// Commit it replaces.
    pub previous_commit_sha: Option<String>,
    /// The agent version running in the changed state (for an
    /// `agent_prompt` change, the new one): the broken
    /// `candidateAgentVersion` a counterfactual baseline must match.
    pub candidate_agent_version: Option<String>,
    /// `obs.config.digest`.
    pub config_digest: Option<String>,
    /// One line for humans.
    pub summary: Option<String>,
    /// Paths the change touched.
    #[serde(default)]
    pub touched_paths: Vec<String>,
    /// When (RFC 3339 UTC); default now.
    pub at: Option<String>,
    /// Host changes: the nodes it reached.
    #[serde(default)]
    pub nodes: Vec<ChangeNode>,
    /// Service changes: feature-flag values it set (`{"name": value}`,
    /// value a string, boolean or number).
    #[serde(default)]
    pub flags: std::collections::BTreeMap<String, serde_json::Value>,
}

/// A refusal naming its field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct FieldError {
    /// camelCase field path.
    pub field: String,
    /// What is wrong.
    pub message: String,
}

impl FieldError {
    /// New refusal.
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> FieldError {
        FieldError {
            field: field.into(),
            message: message.into(),
        }
    }
}

/// A validated change, ready to store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewChange {
    /// Environment.
    pub environment: String,
    /// Kind.
    pub kind: String,
    /// Service.
    pub service: Option<String>,
    /// Version.
    pub version: Option<String>,
    /// Previous version.
    pub previous_version: Option<String>,
    /// Commit.
    pub commit_sha: Option<String>,
    /// Previous commit.
    pub previous_commit_sha: Option<String>,
    /// Agent version in the changed state.
    pub candidate_agent_version: Option<String>,
    /// Config digest.
    pub config_digest: Option<String>,
    /// Summary.
    pub summary: Option<String>,
    /// Touched paths.
    pub touched_paths: Vec<String>,
    /// When, ns.
    pub at_ns: i64,
    /// (node, ns) for host changes.
    pub nodes: Vec<(String, i64)>,
    /// Feature-flag values set (service changes).
    pub flags: std::collections::BTreeMap<String, serde_json::Value>,
}

const MAX_TEXT: usize = 1024;
const MAX_PATHS: usize = 10_000;
const MAX_NODES: usize = 100_000;

fn text(field: &str, v: Option<String>, required: bool) -> Result<Option<String>, FieldError> {
    match v.map(|s| s.trim().to_string()).filter(|s| !s.is_empty()) {
        None if required => Err(FieldError::new(field, "required")),
        Some(s) if s.len() > MAX_TEXT => Err(FieldError::new(
            field,
            format!("longer than {MAX_TEXT} bytes"),
        )),
        other => Ok(other),
    }
}

/// Parse an RFC 3339 UTC time (`YYYY-MM-DDTHH:MM:SS[.f]Z`).
pub fn parse_time(field: &str, s: &str) -> Result<i64, FieldError> {
    wall_time_ns(s).ok_or_else(|| {
        FieldError::new(
            field,
            format!("{s:?} is not RFC 3339 UTC (e.g. 2026-12-03T10:00:00Z)"),
        )
    })
}

/// Validate a change request.
pub fn validate(req: ChangeRequest, now_ns: i64) -> Result<NewChange, FieldError> {
    let environment = text("environment", req.environment, true)?.unwrap_or_default();
    let kind = text("kind", req.kind, true)?.unwrap_or_default();
    let host = HOST_KINDS.contains(&kind.as_str());
    if !host && !SERVICE_KINDS.contains(&kind.as_str()) {
        return Err(FieldError::new(
            "kind",
            format!(
                "{kind:?} is not one of {}",
                [SERVICE_KINDS, HOST_KINDS].concat().join(", ")
            ),
        ));
    }
    let service = text("service", req.service, !host)?;
    let at_ns = match req.at.as_deref() {
        None => now_ns,
        Some(s) => parse_time("at", s)?,
    };
    if host && req.nodes.is_empty() {
        return Err(FieldError::new(
            "nodes",
            format!("a {kind} change names the nodes it reached"),
        ));
    }
    if !host && !req.nodes.is_empty() {
        return Err(FieldError::new(
            "nodes",
            format!("only host changes ({}) carry nodes", HOST_KINDS.join(", ")),
        ));
    }
    if req.nodes.len() > MAX_NODES {
        return Err(FieldError::new(
            "nodes",
            format!("more than {MAX_NODES} nodes"),
        ));
    }
    let mut nodes = Vec::with_capacity(req.nodes.len());
    let mut seen = std::collections::BTreeSet::new();
    for (i, n) in req.nodes.into_iter().enumerate() {
        let name = text(&format!("nodes[{i}].node"), Some(n.node), true)?.unwrap_or_default();
        if !seen.insert(name.clone()) {
            return Err(FieldError::new(
                format!("nodes[{i}].node"),
                format!("{name:?} is listed twice"),
            ));
        }
        let at = match n.at.as_deref() {
            None => at_ns,
            Some(s) => parse_time(&format!("nodes[{i}].at"), s)?,
        };
        nodes.push((name, at));
    }
    if req.touched_paths.len() > MAX_PATHS {
        return Err(FieldError::new(
            "touchedPaths",
            format!("more than {MAX_PATHS} paths"),
        ));
    }
    let mut touched_paths = Vec::with_capacity(req.touched_paths.len());
    for (i, p) in req.touched_paths.into_iter().enumerate() {
        if let Some(p) = text(&format!("touchedPaths[{i}]"), Some(p), false)? {
            touched_paths.push(p);
        }
    }
    if host && !req.flags.is_empty() {
        return Err(FieldError::new(
            "flags",
            "only service changes carry feature-flag values",
        ));
    }
    for (name, v) in &req.flags {
        let field = format!("flags.{name}");
        if name.trim().is_empty() || name.len() > 256 {
            return Err(FieldError::new(field, "a flag name of 1-256 bytes"));
        }
        let ok = match v {
            serde_json::Value::String(s) => s.len() <= MAX_TEXT,
            serde_json::Value::Bool(_) | serde_json::Value::Number(_) => true,
            _ => false,
        };
        if !ok {
            return Err(FieldError::new(
                field,
                "a flag value is a string (at most 1024 bytes), boolean or number",
            ));
        }
    }
    Ok(NewChange {
        flags: req.flags,
        environment,
        kind,
        service,
        version: text("version", req.version, false)?,
        previous_version: text("previousVersion", req.previous_version, false)?,
        commit_sha: text("commitSha", req.commit_sha, false)?,
        previous_commit_sha: text("previousCommitSha", req.previous_commit_sha, false)?,
        candidate_agent_version: text("candidateAgentVersion", req.candidate_agent_version, false)?,
        config_digest: text("configDigest", req.config_digest, false)?,
        summary: text("summary", req.summary, false)?,
        touched_paths,
        at_ns,
        nodes,
    })
}

/// A stored change as the API returns it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ChangeRecord {
    /// `chg_…`.
    pub id: String,
    /// Environment.
    pub environment: String,
    /// Kind.
    pub kind: String,
    /// Service.
    pub service: Option<String>,
    /// Version.
    pub version: Option<String>,
    /// Previous version.
    pub previous_version: Option<String>,
    /// Commit.
    pub commit_sha: Option<String>,
    /// Previous commit.
    pub previous_commit_sha: Option<String>,
    /// Agent version in the changed state.
    pub candidate_agent_version: Option<String>,
    /// Config digest.
    pub config_digest: Option<String>,
    /// Summary.
    pub summary: Option<String>,
    /// Touched paths.
    pub touched_paths: Vec<String>,
    /// The API key that recorded it (its provenance).
    pub key_id: String,
    /// When (RFC 3339).
    pub at: String,
    /// When, ns.
    #[serde(skip)]
    pub at_ns: i64,
    /// Nodes reached (host changes).
    pub nodes: Vec<ChangeNode>,
    /// Feature-flag values the change set (service changes).
    #[serde(default)]
    pub flags: std::collections::BTreeMap<String, serde_json::Value>,
}

impl ChangeRecord {
    /// Whether this is a host change (judged over node cohorts).
    pub fn is_host_change(&self) -> bool {
        HOST_KINDS.contains(&self.kind.as_str())
    }

    /// (node, ns) of every node reached.
    pub fn node_times(&self) -> std::collections::BTreeMap<String, i64> {
        self.nodes
            .iter()
            .map(|n| {
                (
                    n.node.clone(),
                    n.at.as_deref().and_then(wall_time_ns).unwrap_or(self.at_ns),
                )
            })
            .collect()
    }
}

/// Format ns as the API's RFC 3339.
pub fn rfc3339(ns: i64) -> String {
    format_ns(ns)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn deploy() -> ChangeRequest {
        ChangeRequest {
            environment: Some("prod".into()),
            kind: Some("deploy".into()),
            service: Some("checkout-api".into()),
            version: Some("2.4.1".into()),
            ..Default::default()
        }
    }

    #[test]
    fn refusals_name_their_field() {
        let field = |r: ChangeRequest| validate(r, 0).unwrap_err().field;
        assert_eq!(
            field(ChangeRequest {
                service: None,
                ..deploy()
            }),
            "service"
        );
        assert_eq!(
            field(ChangeRequest {
                environment: Some(" ".into()),
                ..deploy()
            }),
            "environment"
        );
        assert_eq!(
            field(ChangeRequest {
                kind: Some("yolo".into()),
                ..deploy()
            }),
            "kind"
        );
        assert_eq!(
            field(ChangeRequest {
                at: Some("yesterday".into()),
                ..deploy()
            }),
            "at"
        );
        let kernel = ChangeRequest {
            kind: Some("kernel".into()),
            service: None,
            ..deploy()
        };
        assert_eq!(field(kernel.clone()), "nodes");
        let twice = ChangeRequest {
            nodes: vec![
                ChangeNode {
                    node: "n1".into(),
                    at: None,
                },
                ChangeNode {
                    node: "n1".into(),
                    at: None,
                },
            ],
            ..kernel.clone()
        };
        assert_eq!(field(twice), "nodes[1].node");
        let ok = validate(
            ChangeRequest {
                nodes: vec![ChangeNode {
                    node: "n1".into(),
                    at: Some("2026-12-03T10:00:00Z".into()),
                }],
                ..kernel
            },
            7,
        )
        .unwrap();
        assert_eq!(ok.nodes[0].0, "n1");
        assert_eq!(ok.at_ns, 7);
    }
}
