//! The TCP watch rules' source: pstackd's flight recorder of the flows on
//! the watched ports, and what a reset or RTO on one of them captures.
//!
//! Invariants:
//! - **One recorder, only while needed.** It runs while at least one
//!   `tcp_reset`/`tcp_rto` rule exists, filtering in the kernel on the
//!   smallest port range covering every such rule (each rule then matches
//!   its own range); it is restarted when that range or its configuration
//!   changes and dropped (programs detached) when no TCP rule is left.
//! - **A failed start says why and is retried, not hammered**: the reason
//!   (no BTF, no privilege, eBPF disabled) makes the TCP rules
//!   `unavailable`; the same start is retried at most every
//!   [`RETRY_EVERY`].
//! - **Snapshots at the incident.** A reset's history is taken at the poll
//!   that saw the reset, before anything else can expire it; incidents wait
//!   for the engine in a bounded queue ([`MAX_PENDING`]), overflow counted.
//! - The recorder is polled from the blocking pool only (it drains a ring
//!   buffer); nothing here blocks on a lock held by the async side.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use pstack_capture::transport::recorded::{self, RecordedFlow};
use pstack_capture::transport::{FlowSelection, Plan};
use pstack_collectors::net::netns::{self, NetnsTarget};
use pstack_ebpf::{FlightConfig, FlightRecorder, FlightStats, FlowIncident};
use pstack_exposition::{Exposition, Family};
use serde_json::{Value, json};

use super::rules::{Condition, RuleKind};
use super::{Action, Firing};
use crate::config::{EbpfDaemonConfig, FlightRecorderConfig};
use crate::spool::Spool;

/// A failed recorder start is retried at most this often.
pub const RETRY_EVERY: Duration = Duration::from_secs(30);
/// Incidents waiting for the engine.
pub const MAX_PENDING: usize = 8192;

/// What a flow firing captures.
#[derive(Debug, Clone)]
pub enum FlowAction {
    /// What the recorder held about a flow that was reset (`None`: it no
    /// longer held it; the capture then fails saying so).
    Recorded(Option<Box<RecordedFlow>>),
    /// A live transport window on a flow still open.
    Live(Box<Plan>),
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct RecorderKey {
    ports: (u16, u16),
    btf_path: PathBuf,
    seconds: u64,
    max_flows: usize,
}

/// The flight recorder as the watch engine holds it.
#[derive(Default)]
pub struct FlowWatch {
    recorder: Option<FlightRecorder>,
    key: Option<RecorderKey>,
    failure: Option<(RecorderKey, String, Instant)>,
    pending: Vec<(FlowIncident, Option<Box<RecordedFlow>>)>,
    pending_dropped: u64,
    last_stats: Option<FlightStats>,
    restarts: u64,
}

impl std::fmt::Debug for FlowWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FlowWatch")
            .field("running", &self.recorder.is_some())
            .field("key", &self.key)
            .field("pending", &self.pending.len())
            .finish_non_exhaustive()
    }
}

/// The range covering every rule's ports.
pub fn hull(ports: &[(u16, u16)]) -> Option<(u16, u16)> {
    let lo = ports.iter().map(|p| p.0).min()?;
    let hi = ports.iter().map(|p| p.1).max()?;
    Some((lo, hi))
}

impl FlowWatch {
    /// Whether the recorder is attached.
    pub fn is_running(&self) -> bool {
        self.recorder.is_some()
    }

    /// Make sure the recorder runs for the TCP rules' `ports` (or say why it
    /// cannot). Blocking (loads eBPF programs): call on the blocking pool.
    pub fn ensure(
        &mut self,
        ports: &[(u16, u16)],
        ebpf: &EbpfDaemonConfig,
        cfg: &FlightRecorderConfig,
    ) -> Result<(), String> {
        let Some(range) = hull(ports) else {
            if self.recorder.take().is_some() {
                tracing::info!("no TCP watch rule left: flight recorder stopped");
            }
            self.key = None;
            self.failure = None;
            return Ok(());
        };
        if !ebpf.enabled {
            self.recorder = None;
            return Err(
                "ebpf.enabled = false: the TCP rules read the flight recorder's eBPF programs"
                    .into(),
            );
        }
        let key = RecorderKey {
            ports: range,
            btf_path: ebpf.btf_path.clone(),
            seconds: cfg.seconds,
            max_flows: cfg.max_flows,
        };
        if self.recorder.is_some() && self.key.as_ref() == Some(&key) {
            return Ok(());
        }
        if let Some((k, reason, at)) = &self.failure
            && *k == key
            && at.elapsed() < RETRY_EVERY
        {
            return Err(reason.clone());
        }
        if self.recorder.take().is_some() {
            self.restarts += 1;
        }
        let started = FlightRecorder::start(FlightConfig {
            ports: range,
            horizon: Duration::from_secs(cfg.seconds),
            max_flows: cfg.max_flows,
            btf_path: ebpf.btf_path.clone(),
            ..FlightConfig::default()
        });
        // The load parsed the kernel's BTF: hand the freed heap back (as
        // pstackd's own eBPF load does), or idle RSS triples.
        crate::ebpf::release_freed_heap();
        match started {
            Ok(r) => {
                tracing::info!(
                    ports = format!("{}-{}", range.0, range.1),
                    seconds = cfg.seconds,
                    "flight recorder attached"
                );
                self.recorder = Some(r);
                self.key = Some(key);
                self.failure = None;
                Ok(())
            }
            Err(e) => {
                let reason = format!("the flight recorder cannot start: {e}");
                tracing::warn!(%reason, "TCP watch rules unavailable");
                self.key = None;
                self.failure = Some((key, reason.clone(), Instant::now()));
                Err(reason)
            }
        }
    }

    /// Drain the recorder; snapshot the history of every flow an incident
    /// happened on. Blocking (reads the ring): call on the blocking pool.
    pub fn poll(&mut self) {
        let Some(rec) = self.recorder.as_mut() else {
            return;
        };
        let incidents = rec.poll();
        let stats = rec.stats();
        let (horizon, max_flows) = self.key.as_ref().map_or((Duration::from_secs(60), 0), |k| {
            (Duration::from_secs(k.seconds), k.max_flows)
        });
        for inc in incidents {
            if self.pending.len() >= MAX_PENDING {
                self.pending_dropped += 1;
                continue;
            }
            let snapshot = rec.history(inc.flow()).map(|history| {
                Box::new(RecordedFlow {
                    history,
                    incident: inc.clone(),
                    stats: stats.clone(),
                    horizon,
                    max_flows,
                })
            });
            self.pending.push((inc, snapshot));
        }
        self.last_stats = Some(stats);
    }

    /// Firings of the flow rules (`(name, kind, condition, window)`) for the
    /// incidents polled since the last call.
    pub fn firings(
        &mut self,
        rules: &[(String, RuleKind, Condition, Duration)],
        at: Instant,
    ) -> Vec<Firing> {
        let now_ns = pstack_capture::clock::monotonic_ns();
        let mut out = Vec::new();
        for (inc, snapshot) in self.pending.drain(..) {
            let flow = inc.flow();
            for (name, kind, condition, window) in rules {
                let (ports, wanted) = match condition {
                    Condition::TcpReset { ports } => {
                        (*ports, matches!(inc, FlowIncident::Reset { .. }))
                    }
                    Condition::TcpRto { ports } => {
                        (*ports, matches!(inc, FlowIncident::Rto { .. }))
                    }
                    _ => continue,
                };
                let in_range = |p: u16| (ports.0..=ports.1).contains(&p);
                if !wanted || !(in_range(flow.local.port()) || in_range(flow.remote.port())) {
                    continue;
                }
                let mut c = BTreeMap::new();
                c.insert("flow".into(), format!("{} -> {}", flow.local, flow.remote));
                c.insert(
                    "netns_ino".into(),
                    flow.netns_ino.map_or("unknown".into(), |n| n.to_string()),
                );
                c.insert("ports".into(), format!("{}-{}", ports.0, ports.1));
                if let FlowIncident::Reset {
                    received_from_peer, ..
                } = &inc
                {
                    c.insert(
                        "reset".into(),
                        if *received_from_peer {
                            "received_from_peer".into()
                        } else {
                            "sent_by_local".into()
                        },
                    );
                }
                if let Some(s) = &snapshot {
                    let h = &s.history;
                    c.insert(
                        "retransmits_recorded".into(),
                        h.totals.retransmits.to_string(),
                    );
                    c.insert(
                        "rto_retransmits_recorded".into(),
                        h.totals.rto_retransmits.to_string(),
                    );
                    c.insert(
                        "recorded_ms".into(),
                        (h.last_seen_ns.saturating_sub(h.reached_back_ns) / 1_000_000).to_string(),
                    );
                }
                let fault_at = at
                    .checked_sub(Duration::from_nanos(now_ns.saturating_sub(inc.at_ns())))
                    .unwrap_or(at);
                let action = match (kind, &inc) {
                    (RuleKind::TcpRto, _) => {
                        match live_plan(flow.netns_ino, flow.local, flow.remote, *window) {
                            Some(plan) => FlowAction::Live(Box::new(plan)),
                            // Nobody left in that namespace to enter: what was recorded.
                            None => FlowAction::Recorded(snapshot.clone()),
                        }
                    }
                    _ => FlowAction::Recorded(snapshot.clone()),
                };
                out.push(Firing {
                    rule: name.clone(),
                    kind: *kind,
                    subject: format!(
                        "flow:{}:{}>{}",
                        flow.netns_ino.map_or("?".into(), |n| n.to_string()),
                        flow.local,
                        flow.remote
                    ),
                    condition: c,
                    fault_at,
                    action: Action::Flow(action),
                });
            }
        }
        out
    }

    /// The `flight_recorder` member of the watch status.
    pub fn status_json(&self) -> Value {
        let state = match (&self.recorder, &self.failure) {
            (Some(_), _) => "running",
            (None, Some(_)) => "unavailable",
            (None, None) => "off",
        };
        json!({
            "state": state,
            "reason": self.failure.as_ref().map(|f| f.1.clone()),
            "ports": self.key.as_ref().map(|k| format!("{}-{}", k.ports.0, k.ports.1)),
            "seconds": self.key.as_ref().map(|k| k.seconds),
            "stats": self.last_stats,
            "incidents_dropped": self.pending_dropped,
            "restarts": self.restarts,
        })
    }

    /// Add the recorder's families to `/metrics`.
    pub fn write_metrics(&self, e: &mut Exposition) {
        let s = self.last_stats.clone().unwrap_or_default();
        e.sample(RECORDER_FLOWS, &[], s.flows);
        e.sample(RECORDER_EVICTED, &[], s.flows_evicted);
        e.sample(RECORDER_RECORDS, &[("outcome", "folded")], s.events_folded);
        e.sample(RECORDER_RECORDS, &[("outcome", "lost")], s.events_lost);
        e.sample(
            RECORDER_INCIDENTS_DROPPED,
            &[],
            self.pending_dropped + s.incidents_dropped,
        );
    }
}

const RECORDER_FLOWS: Family = Family::gauge(
    "pstackd_flight_recorder_flows",
    "Flows the flight recorder holds.",
);
const RECORDER_EVICTED: Family = Family::counter(
    "pstackd_flight_recorder_flows_evicted_total",
    "Flows evicted at flight_recorder.max_flows.",
);
const RECORDER_RECORDS: Family = Family::counter(
    "pstackd_flight_recorder_records_total",
    "TCP records of the watched ports, by outcome.",
);
const RECORDER_INCIDENTS_DROPPED: Family = Family::counter(
    "pstackd_flight_recorder_incidents_dropped_total",
    "Resets/RTOs not handed to the rules (queue full).",
);

/// Inode of a `/proc/.../ns/net` file.
fn netns_inode(path: &str) -> Option<u64> {
    std::fs::metadata(path).ok().map(|m| m.ino())
}

/// Where to capture a flow seen in namespace `ino`: pstackd's own, a named
/// namespace (`/run/netns`, as `ip netns` and CNI plugins make them), or the
/// first process found in it.
pub fn netns_target(ino: Option<u32>) -> Option<NetnsTarget> {
    let ino = u64::from(ino?);
    if netns::current_inode().ok() == Some(ino) {
        return Some(NetnsTarget::Current);
    }
    if let Ok(named) = std::fs::read_dir("/run/netns") {
        for e in named.flatten() {
            if e.metadata().is_ok_and(|m| m.ino() == ino)
                && let Some(name) = e.file_name().to_str()
            {
                return Some(NetnsTarget::Named(name.to_string()));
            }
        }
    }
    let procs = std::fs::read_dir("/proc").ok()?;
    procs
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .find(|pid| netns_inode(&format!("/proc/{pid}/ns/net")) == Some(ino))
        .map(NetnsTarget::Pid)
}

/// A live transport window on exactly this flow, validated like an
/// operator's request (`Plan::from_selection`): both ends pinned, so no
/// port range applies. `None` when nobody is left in the flow's namespace
/// to enter, or (logged) when the selection is refused.
fn live_plan(
    netns: Option<u32>,
    local: SocketAddr,
    remote: SocketAddr,
    window: Duration,
) -> Option<Plan> {
    let (netns_pid, netns) = match netns_target(netns)? {
        NetnsTarget::Current => (None, None),
        NetnsTarget::Named(name) => (None, Some(name)),
        NetnsTarget::Pid(pid) => (Some(pid), None),
    };
    let selection = FlowSelection {
        peer: remote.to_string(),
        local: Some(local.to_string()),
        netns_pid,
        netns,
        window_ms: u64::try_from(window.as_millis()).unwrap_or(u64::MAX),
        ports: None,
        max_flows: 4,
        wait: false,
    };
    Plan::from_selection(&selection, true)
        .inspect_err(|e| tracing::warn!(error = %e, "no live window on the flow: refused"))
        .ok()
}

/// Seal a recorded flow with its trigger and spool it; its digest.
pub fn seal_recorded(
    rec: &Option<Box<RecordedFlow>>,
    trigger: pstack_envelope::Trigger,
    spool: &Spool,
) -> Result<Vec<String>, String> {
    let rec = rec.as_ref().ok_or(
        "the flight recorder no longer held the flow when the rule fired (evicted at max_flows)",
    )?;
    let env =
        recorded::seal(rec, trigger).map_err(|e| format!("sealing the flight record: {e}"))?;
    let bytes = serde_json::to_vec(&env).map_err(|e| format!("encoding: {e}"))?;
    spool
        .put(&env.digest, &bytes)
        .map_err(|e| format!("spooling: {e}"))?;
    Ok(vec![env.digest])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_recorder_covers_every_rules_ports() {
        assert_eq!(hull(&[]), None);
        assert_eq!(
            hull(&[(10_000, 20_000), (9500, 9500)]),
            Some((9500, 20_000))
        );
    }

    #[test]
    fn own_namespace_is_current_and_unknown_is_none() {
        let ino = netns::current_inode().unwrap() as u32;
        assert_eq!(netns_target(Some(ino)), Some(NetnsTarget::Current));
        assert_eq!(netns_target(None), None);
        assert_eq!(netns_target(Some(1)), None, "no process lives in inode 1");
    }
}
