//! The rules every capture request is checked by, below the engines: the
//! refusal type, the window and flow bounds, and the caller's caps. The
//! engines validate their own parts with these; [`crate::request`], above
//! the engines, turns a whole request into the plan one engine runs.
//!
//! Invariants:
//! - This module depends on no engine: an engine and the request that
//!   names it never import each other in a circle.
//! - Every refusal names the request field it is about
//!   ([`RequestError::field`]) and has a stable code ([`RequestError::code`]).
//! - A bound is a constant here, in one place; the CLI, the daemon and the
//!   engines read the same one.

use std::time::Duration;

/// Shortest and longest off-CPU window of a process/thread capture (it
/// holds a capture slot and the subject's helpers for that long).
pub const PROCESS_WINDOW: (Duration, Duration) =
    (Duration::from_millis(1), Duration::from_secs(600));
/// Shortest and longest transport/Longhorn sampling window.
pub const TRANSPORT_WINDOW: (Duration, Duration) =
    (Duration::from_millis(100), Duration::from_secs(3600));
/// Shortest and longest `tcp_trace` window.
pub const TRACE_WINDOW: (Duration, Duration) =
    (Duration::from_millis(1), Duration::from_secs(3600));
/// Largest `max_flows`.
pub const MAX_FLOWS: usize = 4096;
/// Default `tcp_trace` ring buffer.
pub const DEFAULT_RING_BYTES: u32 = 256 * 1024;
/// Ring buffer bounds of `tcp_trace` (a power of two in between).
pub const RING_BYTES: (u32, u32) = (4096, 1 << 30);

/// The caller's caps and defaults for process/thread/host captures (a
/// caller of the daemon can narrow them, never widen them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessLimits {
    /// Default per-surface deadline, ms.
    pub surface_deadline_ms: u64,
    /// Default bundle deadline, ms (a window is added to it).
    pub bundle_deadline_ms: u64,
    /// Largest bundle deadline accepted, ms.
    pub max_bundle_deadline_ms: u64,
    /// Default and largest `max_threads`.
    pub max_threads: u64,
    /// Default and largest `max_bytes_per_surface`.
    pub max_bytes_per_surface: u64,
    /// Most file descriptors read.
    pub max_fds: u64,
}

/// Why a request was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    /// Not JSON, wrong types, an unknown kind or member.
    #[error("malformed capture request at {path}: {message}")]
    Malformed {
        /// JSON path of the problem.
        path: String,
        /// The parser's diagnostic.
        message: String,
    },
    /// The legacy selector does not name exactly one subject.
    #[error("bad subject selector: {0}")]
    BadSelector(String),
    /// A surface name that names no family, or one that does not fit the subject.
    #[error("bad surface list: {0}")]
    BadSurfaces(String),
    /// A deadline or cap out of range.
    #[error("{param} {reason}")]
    OutOfRange {
        /// Which field.
        param: &'static str,
        /// Why.
        reason: String,
    },
    /// A field's value is not acceptable (an address, a name, a window).
    #[error("invalid --{}: {reason}", flag_of(param))]
    InvalidParameter {
        /// The request field (snake_case; the CLI flag is its kebab-case).
        param: &'static str,
        /// Why.
        reason: String,
    },
}

/// The CLI flag of a request field.
pub fn flag_of(field: &str) -> String {
    match field {
        "window_ms" => "window".into(),
        f => f.replace('_', "-"),
    }
}

impl RequestError {
    /// Stable code for an API error body.
    pub fn code(&self) -> &'static str {
        match self {
            RequestError::Malformed { .. } => "malformed_request",
            RequestError::BadSelector(_) => "bad_selector",
            RequestError::BadSurfaces(_) => "bad_surfaces",
            RequestError::OutOfRange { .. } => "out_of_range",
            RequestError::InvalidParameter { .. } => "invalid_parameter",
        }
    }

    /// The request field refused, where one is.
    pub fn field(&self) -> Option<String> {
        match self {
            RequestError::Malformed { path, .. } => Some(path.clone()),
            RequestError::BadSelector(_) => Some("subject".into()),
            RequestError::BadSurfaces(_) => Some("surfaces".into()),
            RequestError::OutOfRange { param, .. }
            | RequestError::InvalidParameter { param, .. } => Some((*param).into()),
        }
    }
}

/// A refused window (e.g. a duration without a unit), naming `window_ms`.
pub fn invalid_window(reason: impl Into<String>) -> RequestError {
    invalid("window_ms", reason)
}

pub fn invalid(param: &'static str, reason: impl Into<String>) -> RequestError {
    RequestError::InvalidParameter {
        param,
        reason: reason.into(),
    }
}

/// A window in ms within `bounds`, or the refusal naming `window_ms`.
pub fn window(ms: u64, bounds: (Duration, Duration)) -> Result<Duration, RequestError> {
    let d = Duration::from_millis(ms);
    if d < bounds.0 || d > bounds.1 {
        return Err(invalid(
            "window_ms",
            format!(
                "{} is outside {}–{}",
                pstack_units::format_duration(d),
                pstack_units::format_duration(bounds.0),
                pstack_units::format_duration(bounds.1)
            ),
        ));
    }
    Ok(d)
}
