//! The TCP-trace engine: TCP retransmits, resets and state changes from
//! pstack's eBPF programs over a window, sealed into a `host` envelope.
//!
//! Invariants:
//! - The kernel filters by port (either end); the address is matched in user
//!   space. Both are recorded in the universe selector.
//! - Nothing is silent: a lost event (ring buffer full) makes the surfaces
//!   `truncated` and the envelope `bounded`; a session that cannot start
//!   still yields an envelope whose surfaces carry the typed reason
//!   (`unsupported`, `permission_denied`).
//! - Attribution is honest: a reset's sender is claimed only from the
//!   `tcp:tcp_send_reset` / `tcp:tcp_receive_reset` events of its flow.

use std::net::IpAddr;
use std::time::Duration;

use pstack_ebpf::aggregate::TcpSurface;
use pstack_ebpf::{EbpfConfig, EbpfSession, TcpEvent, TcpEventKind, WindowReport};
use pstack_envelope::{
    Bounds, Claim, ClaimKind, Clock, Collector, Envelope, EnvelopeBuilder, HostIdentity,
    NextTransition, Scope, Subject, Surface, SurfaceStatus, Termination, Universe, Unknown,
    sha256_digest,
};

use crate::Progress;
use crate::clock::{monotonic_ns, wall_time_now};
use crate::process::SOURCE_COMMIT;

/// Most a trace spends around its window (loading and detaching programs).
pub const RUN_OVERHEAD: Duration = Duration::from_secs(10);

/// A validated trace request. Outside this crate it comes only from
/// `crate::request` (`PlanTrace::plan`): the fields are crate-private.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TracePlan {
    /// How long to watch.
    pub(crate) window: Duration,
    /// Only flows with this port at either end (kernel filter).
    pub(crate) port: Option<u16>,
    /// Only flows with this address at either end.
    pub(crate) addr: Option<IpAddr>,
    /// Ring buffer bytes.
    pub(crate) ring_bytes: u32,
}

impl TracePlan {
    /// How long to watch.
    pub fn window(&self) -> Duration {
        self.window
    }

    /// The eBPF session configuration of this plan. `live` wakes the reader
    /// every 100 ms (for printing events as they come).
    pub fn ebpf_config(&self, live: bool) -> EbpfConfig {
        let mut cfg = EbpfConfig {
            port: self.port,
            addr: self.addr,
            ring_bytes: self.ring_bytes,
            wakeup_bytes: u64::from(self.ring_bytes / 8),
            // `trace tcp` prints every event as it happens: the per-event mode.
            tcp_per_event: true,
            ..EbpfConfig::tcp()
        };
        if live {
            cfg.poll_interval = Duration::from_millis(100);
        }
        cfg
    }
}

/// Why a trace produced no envelope.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// Host identity could not be read.
    #[error("host identity: {0}")]
    Host(String),
    /// The ring buffer could not be read.
    #[error("reading the eBPF ring buffer: {0}")]
    Window(String),
    /// The envelope builder refused a surface, claim or unknown (a bug in
    /// this module).
    #[error("the trace envelope is invalid: {0}")]
    Sealing(#[from] pstack_envelope::BuildError),
}

/// What one trace produced.
#[derive(Debug)]
pub struct TraceResult {
    /// The sealed envelope.
    pub envelope: Envelope,
    /// The window, when the session started (`None`: it could not; the
    /// envelope's surfaces say why).
    pub report: Option<WindowReport>,
    /// Why the session could not start (`unsupported`, `permission_denied`, …).
    pub refused: Option<SurfaceStatus>,
}

/// One line of a trace's live output: the wire type of pstackd's event
/// stream, which the engine produces directly (see `pstackd_api::TraceLine`).
pub use pstackd_api::TraceLine;

/// The banner line of [`TraceLine::Watching`].
pub fn banner(window_ms: u64, port: Option<u16>, addr: Option<&str>) -> String {
    format!(
        "tracing TCP for {}{}{} (Ctrl-C to stop)",
        pstack_units::format_duration(Duration::from_millis(window_ms)),
        port.map(|p| format!(", port {p}")).unwrap_or_default(),
        addr.map(|x| format!(", addr {x}")).unwrap_or_default()
    )
}

/// Run one trace window to its end (no live output) and seal it.
pub fn capture(
    plan: &TracePlan,
    progress: &dyn Fn(Progress<'_>),
) -> Result<TraceResult, TraceError> {
    run(
        plan,
        false,
        std::future::pending::<()>(),
        progress,
        &mut |_| {},
    )
}

/// Run one trace window and seal it, handing every line of its live output
/// to `sink` as it happens (`live`: the reader wakes every 100 ms rather
/// than at the ring's wakeup backlog). `stop` ends the window early (Ctrl-C,
/// a reader gone); the window so far is still sealed.
pub fn run(
    plan: &TracePlan,
    live: bool,
    stop: impl std::future::Future,
    progress: &dyn Fn(Progress<'_>),
    sink: &mut dyn FnMut(TraceLine),
) -> Result<TraceResult, TraceError> {
    let cfg = plan.ebpf_config(live);
    let wall = wall_time_now();
    let t0 = monotonic_ns();
    let mut session = match EbpfSession::start(cfg.clone()) {
        Ok(s) => s,
        Err(e) => {
            sink(TraceLine::Refused {
                status: e.status(),
                message: e.to_string(),
            });
            let envelope = refused_envelope(plan, &cfg, wall, t0, &e)?;
            return Ok(TraceResult {
                envelope,
                report: None,
                refused: Some(e.status()),
            });
        }
    };
    progress(Progress::Phase {
        what: "watching TCP",
        expected: plan.window,
    });
    // `Watching` is sent from inside the window (the first poll of the stop
    // future comes after the session drained what was queued before it), so
    // traffic started on seeing it is counted. Event times are relative to it.
    let sink = std::cell::RefCell::new(sink);
    let start_ns = std::cell::Cell::new(monotonic_ns());
    let watching = TraceLine::Watching {
        window_ms: window_ms(plan.window),
        port: plan.port,
        addr: plan.addr.map(|a| a.to_string()),
    };
    // Sent once: at the stop future's first poll, or before the first event
    // if that comes first.
    let watching = std::cell::Cell::new(Some(watching));
    let announce = || {
        if let Some(w) = watching.take() {
            start_ns.set(monotonic_ns());
            (sink.borrow_mut())(w);
        }
    };
    let stop = async {
        announce();
        stop.await
    };
    let report = session
        .run_window_blocking_until(
            plan.window,
            |e| {
                announce();
                let start = start_ns.get();
                let meta = pstack_ebpf::WindowMeta {
                    start_ns: start,
                    end_ns: start,
                    window_ms: 0,
                };
                (sink.borrow_mut())(TraceLine::Event {
                    text: describe(e, start),
                    json: pstack_ebpf::surface::event_json(e, &meta).to_string(),
                })
            },
            stop,
        )
        .map_err(|e| TraceError::Window(e.to_string()))?;
    let sink = sink.into_inner();
    progress(Progress::PhaseDone);
    let surfaces = report.surfaces();
    let lost: u64 = report.tcp_ctx.lost.iter().sum();
    let seconds = report.meta.end_ns.saturating_sub(report.meta.start_ns) as f64 / 1e9;
    sink(TraceLine::Summary {
        lines: report
            .tcp
            .as_ref()
            .map(|agg| summary_lines(agg, seconds, lost))
            .unwrap_or_default(),
        surfaces: serde_json::to_string(&surfaces)
            .map_err(|e| TraceError::Window(e.to_string()))?,
    });
    let envelope = envelope(
        plan,
        &cfg,
        wall,
        report.meta.start_ns,
        report.meta.end_ns,
        surfaces,
        Some(&report),
    )?;
    Ok(TraceResult {
        envelope,
        report: Some(report),
        refused: None,
    })
}

/// One event as a text line, its time relative to `start_ns`.
pub fn describe(e: &TcpEvent, start_ns: u64) -> String {
    let t = e.ts_ns.saturating_sub(start_ns) as f64 / 1e9;
    // The task on CPU when the event fired: in softirq/timer context it is
    // not the socket's owner, so the label says so.
    let who = if e.pid == 0 {
        "on cpu: softirq, no task".to_string()
    } else {
        format!("on cpu: pid {} {}", e.pid, e.comm)
    };
    match e.kind {
        TcpEventKind::Retransmit => {
            format!(
                "+{t:8.3}s retransmit  {} -> {}  state {}  ({who})",
                e.local, e.remote, e.state
            )
        }
        TcpEventKind::SendReset => format!(
            "+{t:8.3}s reset sent  {} -> {}  this host reset the stream{}{}  ({who})",
            e.local,
            e.remote,
            e.detail
                .map(|r| format!(", reason {}", pstack_ebpf::record::reset_reason_name(r)))
                .unwrap_or_default(),
            if e.has_sock { "" } else { ", no socket" },
        ),
        TcpEventKind::ReceiveReset => format!(
            "+{t:8.3}s reset recv  {} <- {}  the peer reset the stream in state {}  ({who})",
            e.local, e.remote, e.state
        ),
        TcpEventKind::StateChange => format!(
            "+{t:8.3}s state       {} -> {}  {} -> {}",
            e.local,
            e.remote,
            e.state,
            e.new_state.map(|s| s.name()).unwrap_or_default()
        ),
    }
}

/// Per-flow lines listed under each total before `... and N more`.
const SUMMARY_FLOWS: usize = 20;

/// The end-of-window summary. Every total is followed by the lines that make
/// it up, each with its own count, and a remainder line for what is not
/// listed (flows past the list, or past the flow cap): the lines of a
/// section always add up to its total.
pub fn summary_lines(agg: &pstack_ebpf::TcpAggregate, seconds: f64, lost: u64) -> Vec<String> {
    let mut out = Vec::new();
    let retransmits = agg.seen(TcpEventKind::Retransmit);
    let sent = agg.seen(TcpEventKind::SendReset);
    let received = agg.seen(TcpEventKind::ReceiveReset);
    out.push(format!(
        "-- {retransmits} retransmits, {sent} resets sent, {received} resets received, {} state changes in {seconds:.1}s{}",
        agg.seen(TcpEventKind::StateChange),
        if lost > 0 {
            format!("; {lost} EVENTS LOST (ring buffer full): counts are a lower bound")
        } else {
            String::new()
        }
    ));
    let rest = |out: &mut Vec<String>, what: &str, flows: usize, events: u64| {
        if events > 0 {
            out.push(format!(
                "   ... {events} more {what} on {}",
                if flows > 0 {
                    format!("{flows} more flow(s) (see --json or --seal)")
                } else {
                    format!("flows past the {}-flow cap", agg.limits().max_flows)
                }
            ));
        }
    };
    let with_retransmits: Vec<_> = agg.flows().iter().filter(|f| f.retransmits > 0).collect();
    let mut listed = 0;
    for f in with_retransmits.iter().take(SUMMARY_FLOWS) {
        listed += f.retransmits;
        out.push(format!(
            "   retransmits {:>5}  {} -> {}",
            f.retransmits, f.local, f.remote
        ));
    }
    rest(
        &mut out,
        "retransmits",
        with_retransmits.len().saturating_sub(SUMMARY_FLOWS),
        retransmits.saturating_sub(listed),
    );
    let with_resets: Vec<_> = agg
        .flows()
        .iter()
        .filter(|f| f.feeds(TcpSurface::Resets))
        .collect();
    let mut listed = 0;
    for f in with_resets.iter().take(SUMMARY_FLOWS) {
        listed += f.resets_sent + f.resets_received;
        let who = match (f.resets_sent > 0, f.resets_received > 0) {
            (true, false) => "this host reset the peer",
            (false, true) => "the peer reset this host",
            _ => "both ends reset",
        };
        out.push(format!(
            "   resets      sent {:>3} received {:>3}  {} <-> {}  ({who})",
            f.resets_sent, f.resets_received, f.local, f.remote
        ));
    }
    rest(
        &mut out,
        "resets",
        with_resets.len().saturating_sub(SUMMARY_FLOWS),
        (sent + received).saturating_sub(listed),
    );
    out
}

/// The envelope of a session that could not start: every TCP surface
/// carries the reason.
pub fn refused_envelope(
    plan: &TracePlan,
    cfg: &EbpfConfig,
    wall: String,
    t0: u64,
    e: &pstack_ebpf::EbpfError,
) -> Result<Envelope, TraceError> {
    let ids = pstack_ebpf::surface::tcp_surface_ids();
    let elapsed = (monotonic_ns().saturating_sub(t0)) / 1000;
    let surfaces = pstack_ebpf::surface::failed_surfaces(e, &ids, window_ms(plan.window), elapsed);
    envelope(plan, cfg, wall, t0, monotonic_ns(), surfaces, None)
}

fn window_ms(w: Duration) -> u64 {
    u64::try_from(w.as_millis()).unwrap_or(u64::MAX)
}

fn host_identity() -> Result<HostIdentity, TraceError> {
    let host = nix::unistd::gethostname()
        .map_err(|e| TraceError::Host(format!("gethostname: {e}")))?
        .to_string_lossy()
        .into_owned();
    let boot_id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map_err(|e| TraceError::Host(format!("reading /proc/sys/kernel/random/boot_id: {e}")))?
        .trim()
        .to_string();
    Ok(HostIdentity { host, boot_id })
}

/// Seal a trace window (or the surfaces of a session that could not start)
/// into a `host` envelope.
pub fn envelope(
    a: &TracePlan,
    cfg: &EbpfConfig,
    wall: String,
    start_ns: u64,
    end_ns: u64,
    surfaces: Vec<Surface>,
    report: Option<&WindowReport>,
) -> Result<Envelope, TraceError> {
    let selector = format!(
        "ebpf:tcp port={} addr={}",
        a.port.map_or("*".to_string(), |p| p.to_string()),
        a.addr.map_or("*".to_string(), |x| x.to_string())
    );
    let flows = report
        .and_then(|r| r.tcp.as_ref())
        .map_or(0, |t| t.flows().len() as u64);
    let untracked: u64 = report
        .and_then(|r| r.tcp.as_ref())
        .map_or(0, |t| TcpSurface::ALL.iter().map(|s| t.untracked(*s)).sum());
    let mut claims = Vec::new();
    let mut unknowns = Vec::new();
    if let Some(agg) = report.and_then(|r| r.tcp.as_ref()) {
        for (i, f) in agg
            .flows()
            .iter()
            .filter(|f| f.retransmits > 0)
            .take(8)
            .enumerate()
        {
            claims.push(Claim {
                id: format!("retransmits-{i}"),
                kind: ClaimKind::Fact,
                code: pstack_envelope::ClaimCode::TcpRetransmitsObserved.into(),
                statement: format!(
                    "{} -> {} retransmitted {} times in the window",
                    f.local, f.remote, f.retransmits
                ),
                surfaces: vec![TcpSurface::Retransmits.id().into()],
                scope: Scope::Existential,
                falsifier: None,
            });
        }
        for (i, f) in agg
            .flows()
            .iter()
            .filter(|f| f.feeds(TcpSurface::Resets))
            .take(8)
            .enumerate()
        {
            let statement = if f.resets_sent > 0 {
                format!("{} (this host) sent a RST to {}", f.local, f.remote)
            } else {
                format!("{} (peer) sent a RST to {}", f.remote, f.local)
            };
            claims.push(Claim {
                id: format!("reset-{i}"),
                kind: ClaimKind::Fact,
                code: pstack_envelope::ClaimCode::TcpResetSender.into(),
                statement,
                surfaces: vec![TcpSurface::Resets.id().into()],
                scope: Scope::Existential,
                falsifier: None,
            });
        }
    }
    for s in &surfaces {
        if s.status != SurfaceStatus::Ok {
            unknowns.push(Unknown {
                id: format!("u-{}", s.id),
                question: format!("what did {} miss ({})?", s.id, s.status),
                blocks: "CLASSIFY_STREAM_FAULT".into(),
                owner: "node operator".into(),
                probe: match s.status {
                    SurfaceStatus::Truncated => crate::probes::trace_tcp_larger_ring(
                        a.window,
                        cfg.ring_bytes.saturating_mul(4).min(1 << 26),
                        a.port,
                    ),
                    _ => crate::probes::trace_tcp_privileged(
                        &crate::helpers::denial::Caller::current(),
                    ),
                },
                surface: Some(s.id.clone()),
            });
        }
    }
    let mut builder = EnvelopeBuilder::new(
        Subject::Host(host_identity()?),
        Collector {
            name: "pstack tcp_trace".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            source_commit: SOURCE_COMMIT.into(),
            trigger: None,
        },
        Clock {
            wall_time: wall,
            monotonic_start_ns: start_ns.to_string(),
            monotonic_end_ns: end_ns.to_string(),
            bundle_deadline_ms: window_ms(a.window).saturating_add(1000),
        },
        Universe {
            selector_digest: sha256_digest(selector.as_bytes()),
            selector,
            expected_count: flows + untracked,
            observed_count: flows,
            termination: if untracked > 0 {
                Termination::Cap
            } else {
                Termination::Exhausted
            },
        },
        Bounds {
            surface_deadline_ms: window_ms(a.window),
            bundle_deadline_ms: window_ms(a.window).saturating_add(1000),
            max_threads: cfg.limits.max_flows as u64,
            max_bytes_per_surface: u64::from(cfg.ring_bytes),
            leak_budget: 0,
            caps: [
                ("max_flows", cfg.limits.max_flows as u64),
                ("max_samples", cfg.limits.max_samples as u64),
                (
                    "max_transitions_per_flow",
                    cfg.limits.max_transitions_per_flow as u64,
                ),
                ("ring_bytes", u64::from(cfg.ring_bytes)),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect(),
        },
    );
    for s in surfaces {
        builder.surface(s)?;
    }
    for c in claims {
        builder.claim(c)?;
    }
    for u in unknowns {
        builder.unknown(u)?;
    }
    Ok(builder.seal(NextTransition {
        action: "CAPTURE_AGAIN".into(),
        success_receipt: "a sealed trace of the same selector whose surfaces are ok".into(),
        abort_conditions: vec!["host boot_id changes".into()],
    })?)
}

#[cfg(test)]
mod tests {
    //! The trace claim rules: for every code, events that produce it and a
    //! near miss that does not. No root: the aggregate is fed here.

    use super::*;
    use pstack_ebpf::record::{Comm, Endpoint, TcpState};
    use pstack_ebpf::{TcpAggregate, TcpEvent, TcpEventKind};

    fn event(kind: TcpEventKind, cookie: u64) -> TcpEvent {
        let ep = |port| Endpoint {
            addr: "127.0.0.1".parse().expect("addr"),
            port,
        };
        TcpEvent {
            ts_ns: 1_000_000_000,
            kind,
            sock_cookie: Some(cookie),
            netns_cookie: None,
            netns_ino: Some(1),
            local: ep(5000),
            remote: ep(40000),
            family: 2,
            state: TcpState(1),
            new_state: None,
            detail: None,
            layout: 0,
            has_sock: true,
            pid: 0,
            comm: Comm([0; 16]),
            sk_key: cookie,
        }
    }

    fn plan() -> TracePlan {
        TracePlan {
            window: Duration::from_secs(1),
            port: None,
            addr: None,
            ring_bytes: 1 << 18,
        }
    }

    fn sealed(events: &[TcpEvent]) -> Envelope {
        let mut agg = TcpAggregate::new(pstack_ebpf::Limits::default(), None);
        for e in events {
            agg.add(e);
        }
        let report = WindowReport {
            meta: pstack_ebpf::WindowMeta {
                start_ns: 1,
                end_ns: 2_000_000_000,
                window_ms: 1000,
            },
            tcp: Some(agg),
            tcp_ctx: Default::default(),
            offcpu: None,
            stale_discarded: 0,
            tcp_kernel: None,
        };
        let p = plan();
        envelope(
            &p,
            &p.ebpf_config(false),
            "2026-01-01T00:00:00.000Z".into(),
            1,
            2_000_000_000,
            report.surfaces(),
            Some(&report),
        )
        .expect("seals")
    }

    fn codes(e: &Envelope) -> Vec<&str> {
        e.claims.iter().map(|c| c.code.as_str()).collect()
    }

    #[test]
    fn every_trace_claim_code_has_events_that_produce_it_and_a_near_miss() {
        let table: [(&str, Vec<TcpEvent>, Vec<TcpEvent>); 2] = [
            (
                "tcp_retransmits_observed",
                vec![event(TcpEventKind::Retransmit, 7)],
                // A state change on the flow is not a retransmit.
                vec![event(TcpEventKind::StateChange, 7)],
            ),
            (
                "tcp_reset_sender",
                vec![event(TcpEventKind::ReceiveReset, 7)],
                vec![event(TcpEventKind::Retransmit, 7)],
            ),
        ];
        for (code, hit, miss) in table {
            let env = sealed(&hit);
            assert!(codes(&env).contains(&code), "{code}: {:?}", codes(&env));
            assert!(!codes(&sealed(&miss)).contains(&code), "{code}: near miss");
            for c in &env.claims {
                assert_eq!(c.kind, ClaimKind::Fact);
                for s in &c.surfaces {
                    assert!(env.surfaces.iter().any(|x| x.id == *s), "{s} not a surface");
                }
            }
        }
        // Who sent the RST is the event's direction, nothing else.
        let sent = sealed(&[event(TcpEventKind::SendReset, 7)]);
        let received = sealed(&[event(TcpEventKind::ReceiveReset, 7)]);
        let statement = |e: &Envelope| {
            e.claims
                .iter()
                .find(|c| c.code == "tcp_reset_sender")
                .map(|c| c.statement.clone())
                .unwrap()
        };
        assert!(
            statement(&sent).contains("(this host) sent"),
            "{}",
            statement(&sent)
        );
        assert!(
            statement(&received).contains("(peer) sent"),
            "{}",
            statement(&received)
        );
    }
}
