//! Asynchronous captures: the `202` answer of `POST /v1/captures?async=true`,
//! where one stands (`GET /v1/captures/{id}`) and the NDJSON lines of
//! `GET /v1/captures/{id}/events`.

use pstack_envelope::SurfaceStatus;
use serde::{Deserialize, Serialize};

use crate::error::ErrorDetail;

/// The body of `202 Accepted`: where to follow the capture.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CaptureStarted {
    /// The capture's id (128 bits, hex).
    pub id: String,
    /// The request's kind (`process`, `transport`, …).
    pub kind: String,
    /// Always `running`.
    pub state: String,
    /// `/v1/captures/{id}`.
    pub status: String,
    /// `/v1/captures/{id}/events`.
    pub events: String,
}

/// `GET /v1/captures/{id}`: where an asynchronous capture stands.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CaptureStatus {
    /// The capture's id.
    pub id: String,
    /// The request's kind.
    pub kind: String,
    /// Running, or how it ended.
    pub state: CaptureState,
    /// When it was admitted, ms since the Unix epoch.
    pub started_unix_ms: u64,
    /// How long it has run (or ran), ms.
    pub elapsed_ms: u64,
    /// Every phase so far, in order.
    pub phases: Vec<PhaseStatus>,
    /// Lines in its event log.
    pub lines: u64,
    /// Live lines not kept (the log's byte cap).
    pub live_lines_dropped: u64,
    /// How it ended; `null` while it runs.
    pub outcome: Option<CaptureOutcome>,
    /// `/v1/captures/{id}/events`.
    pub events: String,
}

/// The state of an asynchronous capture.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CaptureState {
    /// Still running.
    Running,
    /// Every envelope is spooled.
    Succeeded,
    /// It failed with the error a synchronous request would have got.
    Failed,
}

/// One phase of a capture.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PhaseStatus {
    /// What it does.
    pub what: String,
    /// Its expected length, ms.
    pub expected_ms: u64,
    /// It ended.
    pub done: bool,
}

/// How a capture ended (the `done` or `failed` line of its log).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum CaptureOutcome {
    /// It succeeded.
    Succeeded {
        /// Every envelope's digest, in order.
        digests: Vec<String>,
        /// As [`CaptureEvent::Done`]'s.
        spool_status: String,
        /// `tcp_trace`: why the eBPF session could not start.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        trace_refused: Option<SurfaceStatus>,
    },
    /// It failed.
    Failed {
        /// The HTTP status a synchronous request would have got.
        status: u16,
        /// That request's error.
        error: ErrorDetail,
    },
}

/// One line of `GET /v1/captures/{id}/events`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum CaptureEvent {
    /// A phase started, expected to last about `expected_ms`.
    Phase {
        /// What is happening.
        what: String,
        /// Its expected length, ms.
        expected_ms: u64,
    },
    /// The current phase ended.
    PhaseDone,
    /// Something the operator should read.
    Note {
        /// The note.
        text: String,
    },
    /// A line of a `tcp_trace`'s live output.
    Trace {
        /// The line.
        line: TraceLine,
    },
    /// Live lines not kept (the capture's log reached its byte cap).
    Dropped {
        /// How many.
        lines: u64,
    },
    /// An envelope, durably spooled.
    Envelope {
        /// Its digest.
        digest: String,
        /// Its compact JSON, exactly as spooled.
        envelope: String,
    },
    /// The capture finished; every envelope is spooled.
    Done {
        /// Every envelope's digest, in order.
        digests: Vec<String>,
        /// `spooled`, `spooled_may_be_dropped` or `already_spooled` (as the
        /// `x-pstack-spool-status` header of a 200).
        spool_status: String,
        /// `tcp_trace`: why the eBPF session could not start.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        trace_refused: Option<SurfaceStatus>,
    },
    /// The capture failed: the error a synchronous request would have got.
    Failed {
        /// HTTP status it maps to.
        status: u16,
        /// The error code.
        code: String,
        /// The message.
        message: String,
        /// The request field at fault.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        field: Option<String>,
    },
}

impl CaptureEvent {
    /// `done` or `failed`: the last line of a capture's log.
    pub fn is_final(&self) -> bool {
        matches!(
            self,
            CaptureEvent::Done { .. } | CaptureEvent::Failed { .. }
        )
    }
}

/// One line of a trace's live output, as the engine produces it: exactly
/// what `pstackctl trace tcp` renders, whether the window ran in pstackctl
/// or in pstackd (which streams these lines as [`CaptureEvent::Trace`]).
/// Text and JSON renderings travel pre-encoded so both paths print the same
/// bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "line", rename_all = "snake_case", deny_unknown_fields)]
pub enum TraceLine {
    /// The session is attached; events follow.
    Watching {
        /// The window, ms.
        window_ms: u64,
        /// The port filter.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        port: Option<u16>,
        /// The address filter.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        addr: Option<String>,
    },
    /// One event.
    Event {
        /// The text line (`+  0.123s reset sent …`).
        text: String,
        /// The event's JSON object, encoded.
        json: String,
    },
    /// The window ended.
    Summary {
        /// The end-of-window summary lines.
        lines: Vec<String>,
        /// The window's surfaces, encoded as a JSON array.
        surfaces: String,
    },
    /// The session could not start; the envelope's surfaces carry the reason.
    Refused {
        /// The typed reason.
        status: SurfaceStatus,
        /// The session's error.
        message: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_capture_status_reads_back_in_each_state() {
        let running = r#"{"id":"ab","kind":"tcp_trace","state":"running","started_unix_ms":1,
            "elapsed_ms":2,"phases":[{"what":"watching TCP","expected_ms":5000,"done":false}],
            "lines":1,"live_lines_dropped":0,"outcome":null,"events":"/v1/captures/ab/events"}"#;
        let s: CaptureStatus = serde_json::from_str(running).unwrap();
        assert_eq!(s.state, CaptureState::Running);
        assert_eq!(s.outcome, None);
        let failed = running.replace("\"running\"", "\"failed\"").replace(
            "null",
            r#"{"status":503,"error":{"code":"helper_unavailable","message":"m","field":"x"}}"#,
        );
        let s: CaptureStatus = serde_json::from_str(&failed).unwrap();
        let Some(CaptureOutcome::Failed { status, error }) = &s.outcome else {
            panic!("{s:?}");
        };
        assert_eq!((*status, error.code.as_str()), (503, "helper_unavailable"));
        assert_eq!(error.field.as_deref(), Some("x"));
        let done = running.replace(
            "null",
            r#"{"digests":["sha256:00"],"spool_status":"spooled"}"#,
        );
        let s: CaptureStatus = serde_json::from_str(&done).unwrap();
        assert!(
            matches!(s.outcome, Some(CaptureOutcome::Succeeded { ref digests, .. }) if digests.len() == 1)
        );
        // A member the contract does not name is refused, not ignored.
        let extra = running.replace("\"lines\":1", "\"lines\":1,\"extra\":0");
        assert!(serde_json::from_str::<CaptureStatus>(&extra).is_err());
    }
}
