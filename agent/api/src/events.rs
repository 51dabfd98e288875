//! Asynchronous captures: the `202` answer of `POST /v1/captures?async=true`
//! and the NDJSON lines of `GET /v1/captures/{id}/events`.

use pstack_envelope::SurfaceStatus;
use serde::{Deserialize, Serialize};

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
