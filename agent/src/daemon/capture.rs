//! The capture request accepted on `POST /v1/captures`, its validation, and
//! the bridge to the (synchronous) capture supervisor.
//!
//! Invariants:
//! - **Closed world.** Unknown members anywhere in the request are refused
//!   (400 naming the member); the subject selector names exactly one of
//!   `pid`, `tid` or `host`; ids are positive; deadlines are positive and at
//!   most the configured maxima; caps are positive and at most the defaults
//!   configured for the daemon (a caller can narrow a capture, never widen it).
//! - **Deadlines always.** A request without deadlines gets the configured
//!   defaults; the supervisor never sees a capture without one.
//! - The supervisor runs on the blocking pool (`spawn_blocking`); the number
//!   running at once is bounded by the caller (`max_concurrent_captures`).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::config::Config;
use crate::supervisor;

/// Which subject to capture. Exactly one member.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubjectSelector {
    /// A process (thread group id).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    /// One thread.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tid: Option<u32>,
    /// Every process on the host (must be `true`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<bool>,
}

/// Requested deadlines (each optional: the daemon's defaults fill in).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RequestedDeadlines {
    /// Per-surface deadline, ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub surface_ms: Option<u64>,
    /// Whole-capture deadline, ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bundle_ms: Option<u64>,
}

/// Requested caps (each optional; at most the daemon's configured values).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RequestedCaps {
    /// Most threads read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_threads: Option<u64>,
    /// Most raw bytes per surface.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_bytes_per_surface: Option<u64>,
}

/// Body of `POST /v1/captures`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CaptureRequestBody {
    /// What to capture.
    pub subject: SubjectSelector,
    /// Deadlines.
    #[serde(default)]
    pub deadlines: RequestedDeadlines,
    /// Caps.
    #[serde(default)]
    pub caps: RequestedCaps,
    /// Off-CPU observation window (eBPF), ms, for a pid/tid subject. It runs
    /// inside the bundle deadline, which must exceed it (when `bundle_ms` is
    /// not given, the window is added to the configured default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_ms: Option<u64>,
    /// Surface families to read (e.g. `["task/*/stack", "proc/fd"]`); absent:
    /// every surface. Thread states are always read; a window implies
    /// `ebpf:offcpu`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub surfaces: Option<Vec<String>>,
}

/// Why a request body was refused (HTTP 400).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    /// Not JSON, wrong types, or unknown members.
    #[error("malformed capture request at {path}: {message}")]
    Malformed {
        /// JSON path of the problem.
        path: String,
        /// The parser's diagnostic.
        message: String,
    },
    /// The selector does not name exactly one subject.
    #[error("bad subject selector: {0}")]
    BadSelector(String),
    /// A surface name that names no family, or one that does not fit the subject.
    #[error("bad surface list: {0}")]
    BadSurfaces(String),
    /// A deadline or cap out of range.
    #[error("{param} {reason}")]
    OutOfRange {
        /// Which.
        param: &'static str,
        /// Why.
        reason: String,
    },
}

impl RequestError {
    /// Stable code for the response body.
    pub fn code(&self) -> &'static str {
        match self {
            RequestError::Malformed { .. } => "malformed_request",
            RequestError::BadSelector(_) => "bad_selector",
            RequestError::BadSurfaces(_) => "bad_surfaces",
            RequestError::OutOfRange { .. } => "out_of_range",
        }
    }
}

/// Parse and validate a request body into a supervisor request.
pub fn parse_request(
    body: &[u8],
    config: &Config,
) -> Result<supervisor::CaptureRequest, RequestError> {
    let de = &mut serde_json::Deserializer::from_slice(body);
    let req: CaptureRequestBody =
        serde_path_to_error::deserialize(de).map_err(|e| RequestError::Malformed {
            path: e.path().to_string(),
            message: e.inner().to_string(),
        })?;
    validate(&req, config)
}

/// Validate a parsed request against the configuration.
pub fn validate(
    req: &CaptureRequestBody,
    config: &Config,
) -> Result<supervisor::CaptureRequest, RequestError> {
    let s = &req.subject;
    let target = match (s.pid, s.tid, s.host) {
        (Some(pid), None, None) => {
            if pid == 0 {
                return Err(RequestError::BadSelector("pid 0 is not a process".into()));
            }
            supervisor::Target::Process { pid }
        }
        (None, Some(tid), None) => {
            if tid == 0 {
                return Err(RequestError::BadSelector("tid 0 is not a thread".into()));
            }
            supervisor::Target::Thread { tid }
        }
        (None, None, Some(true)) => supervisor::Target::Host,
        (None, None, Some(false)) => {
            return Err(RequestError::BadSelector(
                "host must be true when given".into(),
            ));
        }
        (None, None, None) => {
            return Err(RequestError::BadSelector(
                "name one subject: {\"pid\": N}, {\"tid\": N} or {\"host\": true}".into(),
            ));
        }
        _ => {
            return Err(RequestError::BadSelector(
                "name exactly one of pid, tid, host".into(),
            ));
        }
    };
    let c = &config.capture;
    if let Some(w) = req.window_ms {
        if matches!(target, supervisor::Target::Host) {
            return Err(RequestError::OutOfRange {
                param: "window_ms",
                reason: "needs a pid or tid subject, not host".into(),
            });
        }
        let max = u64::try_from(supervisor::MAX_WINDOW.as_millis()).unwrap_or(u64::MAX);
        if w == 0 || w > max {
            return Err(RequestError::OutOfRange {
                param: "window_ms",
                reason: format!("must be between 1 and {max}"),
            });
        }
    }
    let bundle = req.deadlines.bundle_ms.unwrap_or(
        c.bundle_deadline_ms
            .saturating_add(req.window_ms.unwrap_or(0)),
    );
    if bundle == 0 || bundle > config.max_bundle_deadline_ms {
        return Err(RequestError::OutOfRange {
            param: "deadlines.bundle_ms",
            reason: format!("must be between 1 and {}", config.max_bundle_deadline_ms),
        });
    }
    let surface = req
        .deadlines
        .surface_ms
        .unwrap_or(c.surface_deadline_ms.min(bundle));
    if surface == 0 || surface > bundle {
        return Err(RequestError::OutOfRange {
            param: "deadlines.surface_ms",
            reason: format!("must be between 1 and the bundle deadline ({bundle})"),
        });
    }
    if let Some(w) = req.window_ms
        && w >= bundle
    {
        return Err(RequestError::OutOfRange {
            param: "window_ms",
            reason: format!("must be shorter than the bundle deadline ({bundle} ms)"),
        });
    }
    let max_threads = req.caps.max_threads.unwrap_or(c.max_threads);
    if max_threads == 0 || max_threads > c.max_threads {
        return Err(RequestError::OutOfRange {
            param: "caps.max_threads",
            reason: format!("must be between 1 and {}", c.max_threads),
        });
    }
    let max_bytes = req
        .caps
        .max_bytes_per_surface
        .unwrap_or(c.max_bytes_per_surface);
    if max_bytes == 0 || max_bytes > c.max_bytes_per_surface {
        return Err(RequestError::OutOfRange {
            param: "caps.max_bytes_per_surface",
            reason: format!("must be between 1 and {}", c.max_bytes_per_surface),
        });
    }
    let surfaces = match &req.surfaces {
        None => supervisor::SurfaceSelection::all(),
        Some(names) => supervisor::SurfaceSelection::parse(names)
            .map_err(|e| RequestError::BadSurfaces(e.to_string()))?,
    };
    // Checked here too so a misfit is a 400 before any work starts.
    surfaces
        .resolve(&target, req.window_ms.is_some())
        .map_err(|e| RequestError::BadSurfaces(e.to_string()))?;
    Ok(supervisor::CaptureRequest {
        target,
        surfaces,
        deadlines: Some(supervisor::Deadlines {
            surface: Duration::from_millis(surface),
            bundle: Duration::from_millis(bundle),
        }),
        max_threads,
        max_bytes_per_surface: max_bytes,
        window: req.window_ms.map(Duration::from_millis),
        ..supervisor::CaptureRequest::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<supervisor::CaptureRequest, RequestError> {
        parse_request(text.as_bytes(), &Config::default())
    }

    #[test]
    fn selectors_are_closed_and_exclusive() {
        assert!(matches!(
            parse(r#"{"subject":{"pid":1}}"#).unwrap().target,
            supervisor::Target::Process { pid: 1 }
        ));
        assert!(matches!(
            parse(r#"{"subject":{"host":true}}"#).unwrap().target,
            supervisor::Target::Host
        ));
        for bad in [
            r#"{"subject":{}}"#,
            r#"{"subject":{"pid":1,"tid":2}}"#,
            r#"{"subject":{"pid":0}}"#,
            r#"{"subject":{"host":false}}"#,
        ] {
            assert_eq!(parse(bad).unwrap_err().code(), "bad_selector", "{bad}");
        }
    }

    #[test]
    fn unknown_members_and_wrong_types_name_their_path() {
        let e = parse(r#"{"subject":{"pid":1},"surfacez":[]}"#).unwrap_err();
        assert_eq!(e.code(), "malformed_request");
        assert!(e.to_string().contains("surfacez"), "{e}");
        let e = parse(r#"{"subject":{"pid":"abc"}}"#).unwrap_err();
        assert!(e.to_string().contains("subject.pid"), "{e}");
        let e = parse(r#"{"subject":{"pid":-1}}"#).unwrap_err();
        assert_eq!(e.code(), "malformed_request");
        assert_eq!(parse("not json").unwrap_err().code(), "malformed_request");
    }

    #[test]
    fn deadlines_and_caps_are_bounded_by_config() {
        let e = parse(r#"{"subject":{"pid":1},"deadlines":{"bundle_ms":99999999}}"#).unwrap_err();
        assert_eq!(e.code(), "out_of_range");
        let e = parse(r#"{"subject":{"pid":1},"deadlines":{"bundle_ms":100,"surface_ms":200}}"#)
            .unwrap_err();
        assert_eq!(e.code(), "out_of_range");
        let e = parse(r#"{"subject":{"pid":1},"caps":{"max_threads":0}}"#).unwrap_err();
        assert_eq!(e.code(), "out_of_range");
        let ok = parse(r#"{"subject":{"pid":1},"deadlines":{"bundle_ms":100}}"#).unwrap();
        let d = ok.deadlines.unwrap();
        assert_eq!(d.bundle, Duration::from_millis(100));
        assert!(d.surface <= d.bundle);
    }
}
