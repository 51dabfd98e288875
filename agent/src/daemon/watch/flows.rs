//! The TCP watch rules' source: the flight recorder of flows on the
//! watched ports. (Being wired: until the recorder lands the TCP rules are
//! `unavailable` with this reason.)

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::Firing;
use super::rules::{Condition, RuleKind};
use crate::daemon::config::{EbpfDaemonConfig, FlightRecorderConfig};
use crate::daemon::spool::Spool;

/// What a flow firing captures.
#[derive(Debug, Clone)]
pub enum FlowAction {
    /// What the recorder held about a flow that ended.
    Recorded(RecordedFlow),
    /// A live transport window on a flow still open.
    Live(pstack_capture::transport::Plan),
}

/// A flow's recorded history, to be sealed.
#[derive(Debug, Clone)]
pub struct RecordedFlow {}

/// The flight recorder as the watch engine holds it.
#[derive(Debug, Default)]
pub struct FlowWatch {}

impl FlowWatch {
    /// Make sure the recorder runs for `ports` (or say why it cannot).
    pub fn ensure(
        &mut self,
        ports: &[(u16, u16)],
        _ebpf: &EbpfDaemonConfig,
        _cfg: &FlightRecorderConfig,
    ) -> Result<(), String> {
        if ports.is_empty() {
            return Ok(());
        }
        Err("the flight recorder is not built into this pstackd yet".into())
    }

    /// Drain the recorder.
    pub fn poll(&mut self) {}

    /// Firings of the flow rules since the last call.
    pub fn firings(
        &mut self,
        _rules: &[(String, RuleKind, Condition, Duration)],
        _at: Instant,
    ) -> Vec<Firing> {
        Vec::new()
    }

    /// Status member.
    pub fn status_json(&self) -> Value {
        json!({"state": "off"})
    }

    /// Prometheus lines.
    pub fn prometheus(&self) -> String {
        String::new()
    }
}

/// Seal and spool a recorded flow.
pub fn seal_recorded(
    _rec: &RecordedFlow,
    _trigger: pstack_envelope::Trigger,
    _spool: &Spool,
) -> Result<Vec<String>, String> {
    Err("not built".into())
}
