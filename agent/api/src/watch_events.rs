//! The lines of `GET /v1/watch/events` (NDJSON): what the watch rules did,
//! as pstackd emits them and `pstackctl watch --follow` reads them.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// One watch event: when, and what happened.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WatchEvent {
    /// When pstackd emitted it (RFC 3339); for an `engine_event`, the
    /// Kubernetes Event's own last time. Absent on `lagged`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<String>,
    /// When pstackd saw a Kubernetes Event (the Events watch's lines).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at_seen: Option<String>,
    /// What happened.
    #[serde(flatten)]
    pub what: WatchEventKind,
}

impl WatchEvent {
    /// An event without a time yet (the emitter stamps it).
    pub fn new(what: WatchEventKind) -> WatchEvent {
        WatchEvent {
            at: None,
            at_seen: None,
            what,
        }
    }

    /// The same event stamped with `at`.
    pub fn at(mut self, at: String) -> WatchEvent {
        self.at = Some(at);
        self
    }

    /// The `event` member: `fired`, `captured`, …
    pub fn name(&self) -> &'static str {
        match &self.what {
            WatchEventKind::Fired { .. } => "fired",
            WatchEventKind::Suppressed { .. } => "suppressed",
            WatchEventKind::Started { .. } => "started",
            WatchEventKind::Captured { .. } => "captured",
            WatchEventKind::Failed { .. } => "failed",
            WatchEventKind::Degraded { .. } => "degraded",
            WatchEventKind::EventsWatchDegraded { .. } => "events_watch_degraded",
            WatchEventKind::EngineEvent { .. } => "engine_event",
            WatchEventKind::RebuildStarted { .. } => "rebuild_started",
            WatchEventKind::RebuildEnded { .. } => "rebuild_ended",
            WatchEventKind::Lagged { .. } => "lagged",
            WatchEventKind::Unknown => "unknown",
        }
    }
}

/// What a watch event says, tagged by its `event` member.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum WatchEventKind {
    /// A rule's condition held for a subject.
    Fired {
        /// The rule.
        rule: String,
        /// Its kind (`d_state`, `tcp_reset`, …).
        kind: String,
        /// The subject (`process:TGID:TID`, `flow:…`, `host`).
        subject: String,
        /// What held, as the rule's readings.
        condition: BTreeMap<String, String>,
    },
    /// A firing that did not capture, and why.
    Suppressed {
        /// The rule.
        rule: String,
        /// Its kind.
        kind: String,
        /// The subject.
        subject: String,
        /// A `SUPPRESS_*` reason (`rate_limit_rule`, `busy`, …).
        reason: String,
        /// More about it, when there is more.
        detail: Option<String>,
    },
    /// A capture started for a firing.
    Started {
        /// The rule.
        rule: String,
        /// Its kind.
        kind: String,
        /// The subject.
        subject: String,
    },
    /// The capture sealed and spooled its envelopes.
    Captured {
        /// The rule.
        rule: String,
        /// Its kind.
        kind: String,
        /// The subject.
        subject: String,
        /// The envelopes' digests.
        envelopes: Vec<String>,
        /// From the fault's first reading to the last envelope sealed, ms.
        fault_to_sealed_ms: u64,
    },
    /// The capture (or the window it needed) failed.
    Failed {
        /// The rule.
        rule: String,
        /// Its kind.
        kind: String,
        /// The subject.
        subject: String,
        /// Why.
        error: String,
    },
    /// The rule cannot read what it watches (e.g. the Longhorn manager).
    Degraded {
        /// The rule.
        rule: String,
        /// Its kind.
        kind: String,
        /// Why.
        reason: String,
    },
    /// The Kubernetes Events watch of a Longhorn rule failed.
    EventsWatchDegraded {
        /// The rule.
        rule: String,
        /// Its kind.
        kind: String,
        /// Why.
        reason: String,
    },
    /// A Longhorn engine's Kubernetes Event.
    EngineEvent {
        /// The rule.
        rule: String,
        /// Its kind.
        kind: String,
        /// The engine object.
        engine: String,
        /// The Event's reason.
        reason: String,
        /// The volume.
        volume: String,
        /// The Event's message (left out past 2 KiB).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        message: Option<String>,
    },
    /// A replica rebuild began.
    RebuildStarted {
        /// The rule.
        rule: String,
        /// Its kind.
        kind: String,
        /// The volume.
        volume: String,
        /// The replica being rebuilt.
        replica: String,
        /// The replicas it is rebuilt from.
        from: Vec<String>,
        /// What opened it (a poll or an Event).
        opened_by: String,
        /// This node.
        node: String,
        /// This node's part (`source`, `target`), or none.
        role: Option<String>,
        /// Why no capture window opened, when none did.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        why_no_window: Option<String>,
    },
    /// A replica rebuild ended.
    RebuildEnded {
        /// The rule.
        rule: String,
        /// Its kind.
        kind: String,
        /// The volume.
        volume: String,
        /// The replica.
        replica: String,
        /// How it ended (`outcome`, `failure`, `retries`, …).
        outcome: BTreeMap<String, String>,
    },
    /// The reader was too slow: events were dropped from its stream.
    Lagged {
        /// How many.
        missed: u64,
    },
    /// An event this build does not know (a newer pstackd).
    #[serde(other)]
    Unknown,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_event_reads_back_and_names_itself() {
        let lines = [
            r#"{"at":"T","event":"fired","rule":"r","kind":"d_state","subject":"host","condition":{"tid":"4"}}"#,
            r#"{"at":"T","event":"suppressed","rule":"r","kind":"d_state","subject":"host","reason":"busy","detail":null}"#,
            r#"{"at":"T","event":"captured","rule":"r","kind":"d_state","subject":"host","envelopes":["sha256:ab"],"fault_to_sealed_ms":812}"#,
            r#"{"at":"T","event":"rebuild_started","rule":"r","kind":"longhorn_rebuild","volume":"v","replica":"x","from":["y"],"opened_by":"poll","node":"n","role":null,"why_no_window":"no reading"}"#,
            r#"{"at":"T","at_seen":"U","event":"engine_event","rule":"r","kind":"longhorn_rebuild","engine":"e","reason":"Rebuilt","volume":"v"}"#,
            r#"{"event":"lagged","missed":3}"#,
        ];
        for line in lines {
            let e: WatchEvent =
                serde_json::from_str(line).unwrap_or_else(|e| panic!("{line}: {e}"));
            let back: serde_json::Value = serde_json::to_value(&e).unwrap();
            let sent: serde_json::Value = serde_json::from_str(line).unwrap();
            assert_eq!(back, sent, "{line}");
            assert_eq!(sent["event"], e.name());
        }
        let newer: WatchEvent =
            serde_json::from_str(r#"{"at":"T","event":"from_the_future","x":1}"#).unwrap();
        assert_eq!(newer.what, WatchEventKind::Unknown);
    }
}
