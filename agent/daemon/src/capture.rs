//! The capture request accepted on `POST /v1/captures`: the daemon's limits
//! and the bridge to the one request validator of `pstack-capture`.
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

use pstack_capture::request::{self, ProcessLimits, ValidRequest, Validate};

pub use pstack_capture::request::RequestError;

use super::config::Config;

/// The daemon's caps and defaults for process/thread/host captures.
pub fn limits(config: &Config) -> ProcessLimits {
    let c = &config.capture;
    ProcessLimits {
        surface_deadline_ms: c.surface_deadline_ms,
        bundle_deadline_ms: c.bundle_deadline_ms,
        max_bundle_deadline_ms: config.max_bundle_deadline_ms,
        max_threads: c.max_threads,
        max_bytes_per_surface: c.max_bytes_per_surface,
        max_fds: pstack_capture::process::DEFAULT_MAX_FDS,
    }
}

/// The daemon's caps and defaults for a host snapshot: every thread of the
/// host is its universe, so it has its own thread and per-surface caps
/// (`capture.host_max_*`), which a caller may narrow like the others.
pub fn host_limits(config: &Config) -> ProcessLimits {
    ProcessLimits {
        max_threads: config.capture.host_max_threads,
        max_bytes_per_surface: config.capture.host_max_bytes_per_surface,
        ..limits(config)
    }
}

/// Parse and validate a request body (the one validator of
/// `pstack_capture::request`) with the daemon's limits for its kind.
pub fn parse_request(body: &[u8], config: &Config) -> Result<ValidRequest, RequestError> {
    let request = request::parse(body)?;
    let limits = match request {
        request::CaptureRequest::Host(_) => host_limits(config),
        _ => limits(config),
    };
    request.validate(&limits)
}

#[cfg(test)]
mod tests {
    use super::*;

    use pstack_capture::process;
    use std::time::Duration;

    fn parse(text: &str) -> Result<process::ProcessPlan, RequestError> {
        match parse_request(text.as_bytes(), &Config::default())? {
            ValidRequest::Process(r) => Ok(r),
            other => panic!("not a process request: {other:?}"),
        }
    }

    #[test]
    fn selectors_are_closed_and_exclusive() {
        assert!(matches!(
            parse(r#"{"subject":{"pid":1}}"#).unwrap().target(),
            process::Target::Process { pid: 1 }
        ));
        assert!(matches!(
            parse(r#"{"subject":{"host":true}}"#).unwrap().target(),
            process::Target::Host
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
        let d = ok.deadlines();
        assert_eq!(d.bundle, Duration::from_millis(100));
        assert!(d.surface <= d.bundle);
    }
}
