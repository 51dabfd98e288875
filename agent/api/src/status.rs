//! `GET /v1/status` ([`DaemonStatus`]) and `GET /v1/watch` ([`WatchStatus`]).
//!
//! Kind-specific detail of a watch rule (its condition, a Longhorn rule's
//! manager and rebuilds) and the flight recorder's state are carried as JSON
//! values: they are printed whole by `--json` and read by no client field by
//! field.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::required;

/// The status document.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DaemonStatus {
    /// pstackd's crate version.
    pub version: String,
    /// Seconds since start.
    pub uptime_seconds: u64,
    /// Stopping: draining in-flight captures, refusing new ones.
    pub draining: bool,
    /// Capture slots and outcomes.
    pub captures: CaptureCounts,
    /// Helper processes and the leak budget.
    pub helpers: HelperStatus,
    /// The spool.
    pub spool: SpoolStatus,
    /// Shipping to the store.
    pub shipping: ShippingStatus,
    /// The eBPF programs.
    pub ebpf: EbpfStatus,
    /// Watch rules.
    pub watch: WatchStatus,
}

/// Capture slots and outcomes since start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CaptureCounts {
    /// Running now.
    pub in_flight: u64,
    /// `max_concurrent_captures`.
    pub max_concurrent: u64,
    /// Succeeded.
    pub ok_total: u64,
    /// Failed.
    pub failed_total: u64,
    /// Refused: every slot was busy.
    pub busy_total: u64,
}

/// Helper processes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HelperStatus {
    /// Helpers running now (one per capture in flight).
    pub live: u64,
    /// Helpers that could not be reaped (each holds a leak-budget slot).
    pub leaked: u64,
    /// The leak budget (0: no budget, captures refused).
    pub leak_budget: u64,
    /// Slots left.
    pub leak_budget_available: u64,
    /// The helper binary found, or why not.
    pub helper: HelperBinary,
}

/// Where the helper binary is, or why there is none.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum HelperBinary {
    /// `{"path": …}`.
    Found {
        /// Its path.
        path: String,
    },
    /// `{"error": …}`.
    Missing {
        /// Why it cannot be used.
        error: String,
    },
}

/// The spool's depth, limits and counters.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpoolStatus {
    /// Files held.
    pub files: u64,
    /// Bytes held.
    pub bytes: u64,
    /// File limit.
    pub max_files: u64,
    /// Byte limit.
    pub max_bytes: u64,
    /// Overflow policy (`drop_oldest`, `refuse_new`).
    pub overflow: String,
    /// Written since start.
    pub written_total: u64,
    /// Dropped since start.
    pub dropped_total: u64,
    /// Refused since start.
    pub refused_total: u64,
    /// Quarantined since start.
    pub quarantined_total: u64,
    /// Deleted after acknowledgement since start.
    pub acknowledged_total: u64,
    /// Found at start and kept.
    pub recovered_total: u64,
}

/// Shipping to the store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShippingStatus {
    /// A `shipper.url` is configured.
    pub enabled: bool,
    /// The collector URL (empty when off).
    pub collector: String,
    /// Age of the oldest spooled envelope, seconds (0: none).
    pub lag_seconds: u64,
    /// The last failure, until a batch succeeds.
    #[serde(deserialize_with = "required")]
    pub last_error: Option<String>,
    /// When `last_error` was set (unix seconds; 0: none).
    pub last_error_unix: u64,
    /// The last accepted batch (unix seconds; 0: none).
    pub last_success_unix: u64,
    /// Delay before the next attempt, ms.
    pub next_retry_ms: u64,
    /// Batches sent.
    pub batches_total: u64,
    /// Envelopes accepted by the store.
    pub accepted_total: u64,
    /// Envelopes the store already had.
    pub duplicate_total: u64,
    /// Envelopes the store refused.
    pub rejected_total: u64,
    /// Failed attempts by reason.
    pub failures_total: BTreeMap<String, u64>,
}

/// The eBPF programs pstackd keeps loaded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EbpfStatus {
    /// `running`, `off`, or the failure's surface status (`unsupported`,
    /// `permission_denied`, `error`).
    pub state: String,
    /// Why not running.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Programs and whether each is attached.
    pub programs: Vec<EbpfProgram>,
    /// TCP events seen, per kind.
    pub tcp_events: BTreeMap<String, u64>,
    /// TCP events lost (ring full), per kind.
    pub tcp_lost: BTreeMap<String, u64>,
    /// Off-CPU counters (`null`: not loaded).
    #[serde(deserialize_with = "required")]
    pub offcpu: Option<OffCpuStatus>,
    /// Ring buffer bytes per object.
    pub ring_bytes: u32,
    /// When these counts were read (unix seconds).
    pub as_of_unix: u64,
    /// Capture windows served by the daemon's session.
    pub windows_on_session_total: u64,
    /// Capture windows that loaded their own programs.
    pub windows_one_shot_total: u64,
}

/// One eBPF program.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EbpfProgram {
    /// Program (function) name.
    pub program: String,
    /// `category/name`.
    pub tracepoint: String,
    /// Attached now.
    pub attached: bool,
}

/// Off-CPU counters, cumulative.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct OffCpuStatus {
    /// Switch-outs of watched tasks.
    pub switches: u64,
    /// D episodes emitted.
    pub episodes: u64,
    /// Lost: ring buffer full.
    pub lost_ring: u64,
    /// Lost: START map full.
    pub lost_start: u64,
    /// Lost: TOTALS map full.
    pub lost_totals: u64,
    /// Processes watched.
    pub watched: u64,
}

/// Watch rules (`/v1/status`'s `watch`, and `GET /v1/watch`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WatchStatus {
    /// Every configured rule.
    pub rules: Vec<RuleStatus>,
    /// Watch-started captures running now.
    pub captures_running: u64,
    /// The last D-state scan (`null`: none yet).
    #[serde(deserialize_with = "required")]
    pub d_state_scan: Option<DStateScan>,
    /// The TCP flight recorder's state (detail: see docs/watch.md).
    pub flight_recorder: Value,
}

/// The last D-state scan.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct DStateScan {
    /// Threads read.
    pub threads: u64,
    /// Cut at the scan's cap.
    pub truncated: bool,
    /// How long it took, µs.
    pub took_us: u64,
}

/// Whether a rule can fire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RuleState {
    /// It can fire.
    Armed,
    /// Its source is configured but its last reading failed.
    Degraded,
    /// Its source is missing.
    Unavailable,
}

/// One watch rule.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RuleStatus {
    /// The rule's name.
    pub name: String,
    /// Its kind (`d_state`, `tcp_reset`, …).
    pub kind: String,
    /// Armed or why not.
    pub state: RuleState,
    /// Why degraded or unavailable (`null` when armed).
    #[serde(deserialize_with = "required")]
    pub reason: Option<String>,
    /// The condition's parameters (per kind).
    pub condition: Value,
    /// Length of the capture it starts, ms.
    pub window_ms: u64,
    /// Captures of one subject per hour.
    pub max_per_subject_per_hour: u32,
    /// Captures per hour.
    pub max_per_hour: u32,
    /// Times its condition held.
    pub fired_total: u64,
    /// Captures sealed.
    pub captured_total: u64,
    /// Captures failed.
    pub failed_total: u64,
    /// Firings suppressed (all reasons).
    pub suppressed_total: u64,
    /// Firings suppressed, by reason.
    pub suppressed: BTreeMap<String, u64>,
    /// When it last fired (RFC 3339).
    #[serde(deserialize_with = "required")]
    pub last_fired: Option<String>,
    /// The last envelope it sealed.
    #[serde(deserialize_with = "required")]
    pub last_envelope: Option<String>,
    /// Its last capture's error.
    #[serde(deserialize_with = "required")]
    pub last_error: Option<String>,
    /// A `longhorn_rebuild` rule's manager and rebuilds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub longhorn: Option<Value>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn document() -> Value {
        serde_json::json!({
            "version": "0.1.0", "uptime_seconds": 3, "draining": false,
            "captures": {"in_flight": 0, "max_concurrent": 4, "ok_total": 1,
                "failed_total": 0, "busy_total": 0},
            "helpers": {"live": 0, "leaked": 0, "leak_budget": 8,
                "leak_budget_available": 8, "helper": {"path": "/usr/libexec/pstack-helper"}},
            "spool": {"files": 0, "bytes": 0, "max_files": 10, "max_bytes": 100,
                "overflow": "drop_oldest", "written_total": 0, "dropped_total": 0,
                "refused_total": 0, "quarantined_total": 0, "acknowledged_total": 0,
                "recovered_total": 0},
            "shipping": {"enabled": false, "collector": "", "lag_seconds": 0,
                "last_error": null, "last_error_unix": 0, "last_success_unix": 0,
                "next_retry_ms": 0, "batches_total": 0, "accepted_total": 0,
                "duplicate_total": 0, "rejected_total": 0, "failures_total": {}},
            "ebpf": {"state": "off", "programs": [], "tcp_events": {}, "tcp_lost": {},
                "offcpu": null, "ring_bytes": 0, "as_of_unix": 0,
                "windows_on_session_total": 0, "windows_one_shot_total": 0},
            "watch": {"rules": [], "captures_running": 0, "d_state_scan": null,
                "flight_recorder": {"state": "off"}}
        })
    }

    #[test]
    fn a_whole_document_reads_and_writes_back_the_same() {
        let doc = document();
        let status: DaemonStatus = serde_json::from_value(doc.clone()).unwrap();
        assert_eq!(serde_json::to_value(&status).unwrap(), doc);
    }

    #[test]
    fn a_missing_field_is_an_error_not_a_zero_or_a_none() {
        for (section, field) in [
            ("captures", "ok_total"),
            ("shipping", "last_error"),
            ("ebpf", "offcpu"),
            ("watch", "d_state_scan"),
            ("spool", "dropped_total"),
        ] {
            let mut doc = document();
            doc[section].as_object_mut().unwrap().remove(field);
            let e = serde_json::from_value::<DaemonStatus>(doc).unwrap_err();
            assert!(e.to_string().contains(field), "{section}.{field}: {e}");
        }
        let mut doc = document();
        doc.as_object_mut().unwrap().remove("uptime_seconds");
        assert!(serde_json::from_value::<DaemonStatus>(doc).is_err());
    }
}
