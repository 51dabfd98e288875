//! Alertmanager's webhook payload (version 4), taken as Alertmanager sends
//! it, and the incidents it opens or joins.
//!
//! Rules (pure): one incident per notification group — dedup key
//! `alertmanager:<groupKey>` — so the same group posted twice (Alertmanager
//! re-notifies every `repeat_interval`) joins one incident. Project is the
//! group's common `project` label, else the receiver name; environment is
//! the common `environment` (or `env`) label, else `unknown`. Firing alerts
//! open or join; resolved alerts are recorded against the active incident
//! and close nothing.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::Value;

use crate::analysis::ledger::FieldError;
use crate::db::gate::NewIncident;

/// The webhook body (fields this store reads; the rest is accepted as is).
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Message {
    /// `"4"`.
    pub version: String,
    /// Identifies the notification group.
    pub group_key: String,
    /// `firing` or `resolved`.
    pub status: String,
    /// Receiver name.
    pub receiver: String,
    /// Labels common to every alert.
    #[serde(default)]
    pub common_labels: BTreeMap<String, String>,
    /// Annotations common to every alert.
    #[serde(default)]
    pub common_annotations: BTreeMap<String, String>,
    /// The alerts.
    #[serde(default)]
    pub alerts: Vec<Alert>,
}

/// One alert.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Alert {
    /// `firing` or `resolved`.
    pub status: String,
    /// Labels.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// RFC 3339.
    #[serde(default)]
    pub starts_at: Option<String>,
    /// RFC 3339 (`0001-01-01T00:00:00Z` while firing).
    #[serde(default)]
    pub ends_at: Option<String>,
    /// Alertmanager's fingerprint of the label set.
    #[serde(default)]
    pub fingerprint: Option<String>,
}

/// One alert to record.
#[derive(Debug, Clone)]
pub struct AlertRecord {
    /// Fingerprint (Alertmanager's, else the sorted label set).
    pub fingerprint: String,
    /// `firing` / `resolved`.
    pub status: String,
    /// Starts at.
    pub starts_at: Option<String>,
    /// Ends at.
    pub ends_at: Option<String>,
    /// Labels (JSON).
    pub labels: Value,
}

/// The incident a group maps to, and its alerts.
#[derive(Debug, Clone)]
pub struct GroupIncident {
    /// The incident to open or join.
    pub incident: NewIncident,
    /// Whether any alert fires (else: join only, never open).
    pub firing: bool,
    /// Alerts to record.
    pub alerts: Vec<AlertRecord>,
}

/// Map a message to its incident.
pub fn incidents_of(m: &Message) -> Result<Vec<GroupIncident>, FieldError> {
    if m.version != "4" {
        return Err(FieldError::new(
            "version",
            format!(
                "Alertmanager webhook payload version {:?}; this store reads version \"4\"",
                m.version
            ),
        ));
    }
    if m.group_key.trim().is_empty() || m.group_key.len() > 4096 {
        return Err(FieldError::new("groupKey", "required, at most 4096 bytes"));
    }
    for (i, a) in m.alerts.iter().enumerate() {
        if a.status != "firing" && a.status != "resolved" {
            return Err(FieldError::new(
                format!("alerts[{i}].status"),
                "firing or resolved",
            ));
        }
    }
    let cl = &m.common_labels;
    let project = cl
        .get("project")
        .cloned()
        .unwrap_or_else(|| m.receiver.clone());
    let environment = cl
        .get("environment")
        .or_else(|| cl.get("env"))
        .cloned()
        .unwrap_or_else(|| "unknown".into());
    let title = m
        .common_annotations
        .get("summary")
        .or_else(|| cl.get("alertname"))
        .cloned()
        .unwrap_or_else(|| m.group_key.clone());
    let alerts: Vec<AlertRecord> = m
        .alerts
        .iter()
        .map(|a| AlertRecord {
            fingerprint: a.fingerprint.clone().unwrap_or_else(|| {
                a.labels
                    .iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect::<Vec<_>>()
                    .join(",")
            }),
            status: a.status.clone(),
            starts_at: a.starts_at.clone(),
            ends_at: a.ends_at.clone(),
            labels: serde_json::to_value(&a.labels).unwrap_or(Value::Null),
        })
        .collect();
    let firing = m.status == "firing" || m.alerts.iter().any(|a| a.status == "firing");
    Ok(vec![GroupIncident {
        incident: NewIncident {
            project_id: project.chars().take(1024).collect(),
            environment: environment.chars().take(1024).collect(),
            dedup_key: format!("alertmanager:{}", m.group_key),
            title: title.chars().take(1024).collect(),
            fault_locus_entity_id: cl.get("service").cloned(),
        },
        firing,
        alerts,
    }])
}
