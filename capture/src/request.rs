//! The one typed capture request: what `pstackctl` builds from its arguments
//! and what `pstackd` accepts as the body of `POST /v1/captures`.
//!
//! Invariants:
//! - **Closed world.** [`CaptureRequest`] is tagged by `kind` (`process`,
//!   `thread`, `host`, `transport`, `longhorn`, `tcp_trace`); an unknown kind
//!   or an unknown member of any kind is refused while parsing, with the JSON
//!   path of the member ([`RequestError::Malformed`]).
//! - **Validated once, here.** [`CaptureRequest::validate`] turns a request
//!   into a [`ValidRequest`] — the plan an engine runs — and is the only
//!   place any field is checked: the CLI and the daemon call the same
//!   function with the same limits ([`ProcessLimits`] are the caller's caps
//!   for process captures; the window limits of every kind are constants of
//!   this module). Every refusal names the field ([`RequestError::field`]).
//! - **Nothing runs on a refused request.** Validation reads nothing from the
//!   host; a netns that cannot be opened is refused by the engine before it
//!   spawns or reads anything (see `transport`).
//! - The legacy process body (`{"subject": {"pid": N}, ...}`, no `kind`) is
//!   still accepted by [`parse`] and means the same as the tagged form.

use std::net::IpAddr;
use std::time::Duration;

use crate::process::{self, SurfaceSelection, Target};
use crate::{longhorn, tcp_trace, transport};

// The rules this module validates with, named where callers have always
// found them: the refusal a `validate` returns is part of its signature.
pub use crate::validation::{
    DEFAULT_RING_BYTES, MAX_FLOWS, PROCESS_WINDOW, ProcessLimits, RING_BYTES, RequestError,
    TRACE_WINDOW, TRANSPORT_WINDOW, flag_of, invalid, invalid_window, window,
};

// The request is a wire type (`POST /v1/captures`): defined in
// `pstackd_api::request`, validated here. Re-exported so the engines and
// their callers name it where they always have.
pub use pstackd_api::request::{
    CaptureRequest, DEFAULT_MAX_FLOWS, DEFAULT_TRACE_WINDOW_MS, DEFAULT_TRANSPORT_WINDOW_MS,
    HostRequest, LegacyBody, LonghornRequest, ProcessRequest, RequestedCaps, RequestedDeadlines,
    SubjectSelector, TcpTraceRequest, ThreadRequest, TransportRequest,
};

/// A validated request: the plan one engine runs.
#[derive(Debug, Clone)]
pub enum ValidRequest {
    /// process, thread or host.
    Process(process::ProcessPlan),
    /// transport.
    Transport(transport::Plan),
    /// longhorn.
    Longhorn(Box<longhorn::LonghornPlan>),
    /// tcp_trace.
    TcpTrace(tcp_trace::TracePlan),
}

impl ValidRequest {
    /// The engine's name: `process` (process, thread and host captures),
    /// `transport`, `longhorn` or `tcp_trace`.
    pub fn kind(&self) -> &'static str {
        match self {
            ValidRequest::Process(_) => "process",
            ValidRequest::Transport(_) => "transport",
            ValidRequest::Longhorn(_) => "longhorn",
            ValidRequest::TcpTrace(_) => "tcp_trace",
        }
    }

    /// The longest this request can run: the process bundle deadline, or a
    /// window plus what the engine may spend around it (helper samples,
    /// API and Hubble reads, each under its own deadline).
    pub fn run_deadline(&self) -> Duration {
        match self {
            ValidRequest::Process(r) => r.deadlines().bundle,
            ValidRequest::Transport(p) => p.window + transport::RUN_OVERHEAD,
            ValidRequest::Longhorn(p) => longhorn::run_deadline(p),
            ValidRequest::TcpTrace(p) => p.window + tcp_trace::RUN_OVERHEAD,
        }
    }
}

/// The tagged request a legacy body means.
pub fn legacy_request(body: LegacyBody) -> Result<CaptureRequest, RequestError> {
    let s = &body.subject;
    Ok(match (s.pid, s.tid, s.host) {
        (Some(pid), None, None) => CaptureRequest::Process(ProcessRequest {
            pid,
            deadlines: body.deadlines,
            caps: body.caps,
            window_ms: body.window_ms,
            surfaces: body.surfaces,
        }),
        (None, Some(tid), None) => CaptureRequest::Thread(ThreadRequest {
            tid,
            deadlines: body.deadlines,
            caps: body.caps,
            window_ms: body.window_ms,
            surfaces: body.surfaces,
        }),
        (None, None, Some(true)) => {
            if body.window_ms.is_some() {
                return Err(RequestError::OutOfRange {
                    param: "window_ms",
                    reason: "needs a pid or tid subject, not host".into(),
                });
            }
            CaptureRequest::Host(HostRequest {
                deadlines: body.deadlines,
                caps: body.caps,
                surfaces: body.surfaces,
            })
        }
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
    })
}

fn malformed(e: serde_path_to_error::Error<serde_json::Error>) -> RequestError {
    RequestError::Malformed {
        path: e.path().to_string(),
        message: e.inner().to_string(),
    }
}

/// Parse a request body: the tagged form (a top-level `kind`), or the
/// legacy process body.
pub fn parse(body: &[u8]) -> Result<CaptureRequest, RequestError> {
    let value: serde_json::Value =
        serde_json::from_slice(body).map_err(|e| RequestError::Malformed {
            path: ".".into(),
            message: e.to_string(),
        })?;
    let tagged = value.as_object().is_some_and(|o| o.contains_key("kind"));
    if tagged {
        let kind = value.get("kind").cloned().unwrap_or_default();
        let known = [
            "process",
            "thread",
            "host",
            "transport",
            "longhorn",
            "tcp_trace",
        ];
        if !kind.as_str().is_some_and(|k| known.contains(&k)) {
            return Err(RequestError::Malformed {
                path: "kind".into(),
                message: format!("unknown kind {kind}; expected one of {}", known.join(", ")),
            });
        }
        serde_path_to_error::deserialize(value).map_err(malformed)
    } else {
        let legacy: LegacyBody = serde_path_to_error::deserialize(value).map_err(malformed)?;
        legacy_request(legacy)
    }
}

/// Validate a process/thread/host capture against `limits` into the plan the
/// process engine runs (what [`CaptureRequest::validate`] does for those
/// kinds; the CLI calls it with its own flags as the limits). The only
/// place a [`process::ProcessPlan`] is built: every guarantee its type
/// documents is checked here, once.
pub fn process_plan(
    target: Target,
    deadlines: &RequestedDeadlines,
    caps: &RequestedCaps,
    window_ms: Option<u64>,
    surfaces: &Option<Vec<String>>,
    limits: &ProcessLimits,
) -> Result<process::ProcessPlan, RequestError> {
    match target {
        Target::Process { pid: 0 } => {
            return Err(RequestError::BadSelector("pid 0 is not a process".into()));
        }
        Target::Thread { tid: 0 } => {
            return Err(RequestError::BadSelector("tid 0 is not a thread".into()));
        }
        _ => {}
    }
    if window_ms.is_some() && target == Target::Host {
        return Err(RequestError::OutOfRange {
            param: "window_ms",
            reason:
                "an off-CPU window needs a process or thread subject (--pid or --tid), not --host"
                    .into(),
        });
    }
    if let Some(w) = window_ms {
        let max = u64::try_from(PROCESS_WINDOW.1.as_millis()).unwrap_or(u64::MAX);
        if Duration::from_millis(w) < PROCESS_WINDOW.0 || w > max {
            return Err(RequestError::OutOfRange {
                param: "window_ms",
                reason: format!("must be between 1 and {max}"),
            });
        }
    }
    let bundle = deadlines.bundle_ms.unwrap_or(
        limits
            .bundle_deadline_ms
            .saturating_add(window_ms.unwrap_or(0)),
    );
    if bundle == 0 || bundle > limits.max_bundle_deadline_ms {
        return Err(RequestError::OutOfRange {
            param: "deadlines.bundle_ms",
            reason: format!("must be between 1 and {}", limits.max_bundle_deadline_ms),
        });
    }
    let surface = deadlines
        .surface_ms
        .unwrap_or(limits.surface_deadline_ms.min(bundle));
    if surface == 0 || surface > bundle {
        return Err(RequestError::OutOfRange {
            param: "deadlines.surface_ms",
            reason: format!("must be between 1 and the bundle deadline ({bundle})"),
        });
    }
    if let Some(w) = window_ms
        && w >= bundle
    {
        return Err(RequestError::OutOfRange {
            param: "window_ms",
            reason: format!("must be shorter than the bundle deadline ({bundle} ms)"),
        });
    }
    let max_threads = caps.max_threads.unwrap_or(limits.max_threads);
    if max_threads == 0 || max_threads > limits.max_threads {
        return Err(RequestError::OutOfRange {
            param: "caps.max_threads",
            reason: format!("must be between 1 and {}", limits.max_threads),
        });
    }
    // What one helper frame can carry bounds every caller's limit (and so
    // the default) too.
    let max_bytes_limit = limits
        .max_bytes_per_surface
        .min(pstack_helper::protocol::MAX_SURFACE_BYTES);
    let max_bytes = caps.max_bytes_per_surface.unwrap_or(max_bytes_limit);
    if max_bytes == 0 || max_bytes > max_bytes_limit {
        return Err(RequestError::OutOfRange {
            param: "caps.max_bytes_per_surface",
            reason: format!("must be between 1 and {max_bytes_limit}"),
        });
    }
    let surfaces = match surfaces {
        None => SurfaceSelection::all(),
        Some(names) => {
            SurfaceSelection::parse(names).map_err(|e| RequestError::BadSurfaces(e.to_string()))?
        }
    };
    // Resolved against the target and window here, so a misfit is refused
    // before any work starts and the engine reads the selection as given.
    let surfaces = surfaces
        .resolve(&target, window_ms.is_some())
        .map_err(|e| RequestError::BadSurfaces(e.to_string()))?;
    Ok(process::ProcessPlan {
        target,
        surfaces,
        deadlines: process::Deadlines {
            surface: Duration::from_millis(surface),
            bundle: Duration::from_millis(bundle),
        },
        max_threads,
        max_bytes_per_surface: max_bytes,
        max_fds: limits.max_fds,
        window: window_ms.map(Duration::from_millis),
        trigger: None,
    })
}

/// Validation of a capture request (a wire type of `pstackd_api`): the
/// plan the engine of its kind runs.
pub trait Validate {
    /// Validate every field, once; the plan the engine of this kind runs.
    fn validate(&self, limits: &ProcessLimits) -> Result<ValidRequest, RequestError>;
}

impl Validate for CaptureRequest {
    fn validate(&self, limits: &ProcessLimits) -> Result<ValidRequest, RequestError> {
        Ok(match self {
            CaptureRequest::Process(r) => ValidRequest::Process(process_plan(
                Target::Process { pid: r.pid },
                &r.deadlines,
                &r.caps,
                r.window_ms,
                &r.surfaces,
                limits,
            )?),
            CaptureRequest::Thread(r) => ValidRequest::Process(process_plan(
                Target::Thread { tid: r.tid },
                &r.deadlines,
                &r.caps,
                r.window_ms,
                &r.surfaces,
                limits,
            )?),
            CaptureRequest::Host(r) => ValidRequest::Process(process_plan(
                Target::Host,
                &r.deadlines,
                &r.caps,
                None,
                &r.surfaces,
                limits,
            )?),
            CaptureRequest::Transport(r) => {
                network_window_fits(r.window_ms, limits)?;
                ValidRequest::Transport(r.plan()?)
            }
            CaptureRequest::Longhorn(r) => {
                network_window_fits(r.window_ms, limits)?;
                ValidRequest::Longhorn(Box::new(r.plan()?))
            }
            CaptureRequest::TcpTrace(r) => {
                network_window_fits(r.window_ms, limits)?;
                ValidRequest::TcpTrace(r.plan()?)
            }
        })
    }
}

/// A network capture's window is capped by the caller's
/// `max_bundle_deadline_ms`, as a process capture's bundle deadline is: it
/// is how long one request may hold a capture slot. The engines' fixed
/// overhead around the window (`transport::RUN_OVERHEAD`, the Longhorn API
/// and Hubble deadlines, `tcp_trace::RUN_OVERHEAD`) is bounded by constants
/// and not charged, so the default 30 s transport window fits the default
/// 30 s cap. Refused naming `window_ms`, before anything runs.
fn network_window_fits(window_ms: u64, limits: &ProcessLimits) -> Result<(), RequestError> {
    if window_ms > limits.max_bundle_deadline_ms {
        return Err(RequestError::OutOfRange {
            param: "window_ms",
            reason: format!(
                "{window_ms} exceeds max_bundle_deadline_ms ({} ms), the longest a capture may run here",
                limits.max_bundle_deadline_ms
            ),
        });
    }
    Ok(())
}

/// A transport request's plan and flow selection.
pub trait PlanTransport {
    /// Validate into a transport plan.
    fn plan(&self) -> Result<transport::Plan, RequestError>;
    /// The flow selection of this request.
    fn flows(&self) -> transport::FlowSelection;
}

impl PlanTransport for TransportRequest {
    fn plan(&self) -> Result<transport::Plan, RequestError> {
        transport::Plan::from_selection(&self.flows(), self.ebpf)
    }

    fn flows(&self) -> transport::FlowSelection {
        transport::FlowSelection::from(self)
    }
}

/// A Longhorn request's plan and flow selection.
pub trait PlanLonghorn {
    /// Validate into a Longhorn plan.
    fn plan(&self) -> Result<longhorn::LonghornPlan, RequestError>;
    /// The flow selection of this request.
    fn flows(&self) -> transport::FlowSelection;
}

impl PlanLonghorn for LonghornRequest {
    fn plan(&self) -> Result<longhorn::LonghornPlan, RequestError> {
        longhorn::plan(self)
    }

    fn flows(&self) -> transport::FlowSelection {
        transport::FlowSelection::from(self)
    }
}

/// A `tcp_trace` request's plan.
pub trait PlanTrace {
    /// Validate into a trace plan.
    fn plan(&self) -> Result<tcp_trace::TracePlan, RequestError>;
}

impl PlanTrace for TcpTraceRequest {
    fn plan(&self) -> Result<tcp_trace::TracePlan, RequestError> {
        let window = window(self.window_ms, TRACE_WINDOW)?;
        let addr =
            match &self.addr {
                None => None,
                Some(a) => Some(a.trim().parse::<IpAddr>().map_err(|_| {
                    invalid("addr", format!("{a:?} is not an IPv4 or IPv6 address"))
                })?),
            };
        if self.port == Some(0) {
            return Err(invalid("port", "port 0 is not a port (use 1–65535)"));
        }
        let ring_bytes = self.ring_bytes.unwrap_or(DEFAULT_RING_BYTES);
        if !ring_bytes.is_power_of_two() || ring_bytes < RING_BYTES.0 || ring_bytes > RING_BYTES.1 {
            return Err(invalid(
                "ring_bytes",
                format!(
                    "{ring_bytes} is not a power of two in {}–{}",
                    RING_BYTES.0, RING_BYTES.1
                ),
            ));
        }
        Ok(tcp_trace::TracePlan {
            window,
            port: self.port,
            addr,
            ring_bytes,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> ProcessLimits {
        ProcessLimits {
            surface_deadline_ms: 250,
            bundle_deadline_ms: 2000,
            max_bundle_deadline_ms: 60_000,
            max_threads: 10_000,
            max_bytes_per_surface: 65_536,
            max_fds: 1024,
        }
    }

    fn check(text: &str) -> Result<ValidRequest, RequestError> {
        parse(text.as_bytes())?.validate(&limits())
    }

    #[test]
    fn legacy_and_tagged_process_bodies_mean_the_same() {
        let a = parse(br#"{"subject":{"pid":7},"window_ms":500}"#).unwrap();
        let b = parse(br#"{"kind":"process","pid":7,"window_ms":500}"#).unwrap();
        assert_eq!(a, b);
        assert!(matches!(
            parse(br#"{"subject":{"host":true}}"#).unwrap(),
            CaptureRequest::Host(_)
        ));
    }

    #[test]
    fn unknown_kinds_and_members_are_refused_with_their_path() {
        let e = parse(br#"{"kind":"transprot","peer":"10.0.0.2"}"#).unwrap_err();
        assert_eq!(e.field().as_deref(), Some("kind"), "{e}");
        let e = parse(br#"{"kind":"transport","peer":"10.0.0.2","windw_ms":5}"#).unwrap_err();
        assert_eq!(e.code(), "malformed_request");
        assert!(e.to_string().contains("windw_ms"), "{e}");
        let e = parse(br#"{"kind":"tcp_trace","port":"x"}"#).unwrap_err();
        assert_eq!(e.code(), "malformed_request");
    }

    #[test]
    fn every_transport_refusal_names_its_field() {
        for (body, field) in [
            (r#"{"kind":"transport","peer":"not-an-address"}"#, "peer"),
            (r#"{"kind":"transport","peer":"10.0.0.2:0"}"#, "peer"),
            (
                r#"{"kind":"transport","peer":"10.0.0.2","window_ms":3600001}"#,
                "window_ms",
            ),
            (
                r#"{"kind":"transport","peer":"10.0.0.2","window_ms":99}"#,
                "window_ms",
            ),
            (
                r#"{"kind":"transport","peer":"10.0.0.2","max_flows":0}"#,
                "max_flows",
            ),
            (
                r#"{"kind":"transport","peer":"10.0.0.2","ports":"5-1"}"#,
                "ports",
            ),
            (
                r#"{"kind":"transport","peer":"10.0.0.2","local":"fd00::1"}"#,
                "local",
            ),
            (
                r#"{"kind":"transport","peer":"10.0.0.2","netns":"a","netns_pid":1}"#,
                "netns",
            ),
            (
                r#"{"kind":"longhorn","peer":"10.0.0.2","volume":"v/1","engine":"e","source_node":"a","target_node":"b"}"#,
                "volume",
            ),
            (
                r#"{"kind":"longhorn","peer":"10.0.0.2:80","volume":"v","engine":"e","source_node":"a","target_node":"b"}"#,
                "peer",
            ),
            (r#"{"kind":"tcp_trace","addr":"nope"}"#, "addr"),
            (r#"{"kind":"tcp_trace","window_ms":0}"#, "window_ms"),
            (r#"{"kind":"tcp_trace","ring_bytes":1000}"#, "ring_bytes"),
        ] {
            let e = check(body).unwrap_err();
            assert_eq!(e.field().as_deref(), Some(field), "{body}: {e}");
        }
        assert!(matches!(
            check(r#"{"kind":"transport","peer":"10.0.0.2:10001","window_ms":500}"#).unwrap(),
            ValidRequest::Transport(p) if p.window == Duration::from_millis(500)
        ));
    }

    #[test]
    fn the_cli_flag_is_named_in_the_message() {
        let e = check(r#"{"kind":"transport","peer":"10.0.0.2:70000"}"#).unwrap_err();
        assert!(e.to_string().starts_with("invalid --peer"), "{e}");
        let e = check(r#"{"kind":"transport","peer":"10.0.0.2","window_ms":1}"#).unwrap_err();
        assert!(e.to_string().starts_with("invalid --window:"), "{e}");
    }

    #[test]
    fn process_deadlines_and_caps_are_bounded_by_the_limits() {
        let e = check(r#"{"subject":{"pid":1},"deadlines":{"bundle_ms":99999999}}"#).unwrap_err();
        assert_eq!(e.code(), "out_of_range");
        let e = check(r#"{"kind":"thread","tid":0}"#).unwrap_err();
        assert_eq!(e.code(), "bad_selector");
        let e = check(r#"{"subject":{"host":true},"window_ms":5}"#).unwrap_err();
        assert_eq!(e.field().as_deref(), Some("window_ms"));
    }

    /// A caller's limit above what one helper frame carries does not widen
    /// the plan: at the protocol's cap it passes, one byte above it is
    /// refused naming the cap.
    #[test]
    fn bytes_per_surface_never_exceed_what_the_helper_carries() {
        let wide = ProcessLimits {
            max_bytes_per_surface: u64::MAX,
            ..limits()
        };
        let cap = pstack_helper::protocol::MAX_SURFACE_BYTES;
        let ask = |bytes: u64| {
            parse(
                format!(
                    r#"{{"kind":"process","pid":7,"caps":{{"max_bytes_per_surface":{bytes}}}}}"#
                )
                .as_bytes(),
            )
            .unwrap()
            .validate(&wide)
        };
        match ask(cap).unwrap() {
            ValidRequest::Process(p) => assert_eq!(p.max_bytes_per_surface(), cap),
            other => panic!("{other:?}"),
        }
        let e = ask(cap + 1).unwrap_err();
        assert_eq!(e.field().as_deref(), Some("caps.max_bytes_per_surface"));
        assert!(e.to_string().contains(&cap.to_string()), "{e}");
        // Nothing asked: the default is the cap, not the wider limit.
        match parse(br#"{"kind":"process","pid":7}"#)
            .unwrap()
            .validate(&wide)
            .unwrap()
        {
            ValidRequest::Process(p) => assert_eq!(p.max_bytes_per_surface(), cap),
            other => panic!("{other:?}"),
        }
    }

    /// A network window longer than `max_bundle_deadline_ms` is refused for
    /// every network kind, naming `window_ms` and the limit; at the limit it
    /// passes.
    #[test]
    fn network_windows_are_capped_by_the_bundle_deadline_limit() {
        for kind in [
            r#""kind":"transport","peer":"10.0.0.2""#,
            r#""kind":"longhorn","peer":"10.0.0.2","volume":"v","engine":"e","source_node":"a","target_node":"b""#,
            r#""kind":"tcp_trace""#,
        ] {
            let e = check(&format!("{{{kind},\"window_ms\":60001}}")).unwrap_err();
            assert_eq!(e.code(), "out_of_range", "{kind}: {e}");
            assert_eq!(e.field().as_deref(), Some("window_ms"), "{kind}");
            assert!(e.to_string().contains("max_bundle_deadline_ms"), "{e}");
            check(&format!("{{{kind},\"window_ms\":60000}}"))
                .unwrap_or_else(|e| panic!("{kind}: at the limit: {e}"));
        }
    }
}
