//! The transport engine: one sealed `network_stream` envelope per TCP
//! flow to a peer, sampled over a window, inside the right network namespace.
//!
//! What a capture does, in order:
//! 1. Validates the request (peer `ADDR[:PORT]`, optional local, window,
//!    default port range) — every bad parameter is a typed
//!    [`RequestError::InvalidParameter`] naming it ([`Plan::from_selection`],
//!    called by [`crate::request::CaptureRequest::validate`]).
//! 2. Opens the target netns (`--netns-pid` or `--netns`) up front: a PID that
//!    is gone is [`TransportError::Netns`] before anything is read.
//! 3. Has `pstack-helper --net` ([`NetHelper`]) — a separate, killable process
//!    that enters that netns from the open namespace file and confines itself
//!    (only `CAP_NET_ADMIN`, `no_new_privs`, seccomp allowing `socket` for
//!    `AF_NETLINK` only) — take a sample
//!    ([`pstack_collectors::net::sample::sample`]: sock_diag, every
//!    snmp/netstat counter, the route to the peer, the egress link and (for
//!    veth) its peer link, conntrack occupancy and CPU load); sleeps the
//!    window; has the same helper sample again. When eBPF is available its
//!    TCP window runs concurrently in this process and is joined to flows by
//!    socket cookie.
//! 4. Builds one envelope per flow (union of flows matched at start and at
//!    end, capped by `--max-flows`) and seals it.
//!
//! Invariants:
//! - **Facts are per flow, or say whose they are.** Per-flow claims bind the
//!   flow's own `tcp/start`/`tcp/end` surfaces; netns-wide counter deltas are
//!   claimed as `netns_*` facts, never as the flow's.
//! - **CPU load is a hypothesis surface.** `host/cpu` facts only ever bind a
//!   hypothesis (`cpu_starvation`), never a stream fact.
//! - **No fault → no fault claimed.** Absent every fault signature, the only
//!   claim is the universal `no_fault_observed`, and only in a `complete`
//!   envelope; otherwise there is no claim at all.
//! - **Exact numbers.** u64 counters (`bytes_acked`, link byte counters, …) are
//!   decimal strings; deltas are numbers only within ±(2^53−1).
//! - **Identity is the socket cookie.** A flow seen at both ends of the
//!   window has one cookie; a reconnect on the same 4-tuple is a new cookie and
//!   a separate envelope, never merged into the old one.
//! - **Bounds.** `max_threads` carries `--max-flows` (the universe cap);
//!   `max_bytes_per_surface` is 0 because raw bytes are digested, never kept.
//!   `leak_budget` is the net helpers' leak budget ([`NET_LEAK_BUDGET`] one-shot).
//!   Net reads run in the net helper, never in this process: each sample is
//!   one request with a deadline of [`SURFACE_DEADLINE_MS`]; a helper that
//!   misses it is SIGKILLed and reaped, and every surface of that sample is
//!   `timeout` (`timeout_unreaped_helper` if the kernel would not let it go:
//!   journaled, charged to the leak budget); the other end of the window
//!   gets a fresh helper. The socket options (`tcp/sockopt`: `pidfd_getfd`
//!   and `getsockopt`, which can wait on an owner stuck in execve) are read
//!   by `pstack-helper --sockopt` under its own narrow profile and the same
//!   deadline; a miss SIGKILLs it and the sockets not yet read are
//!   `timeout`. This process only finds the owners (`/proc/*/fd`).
//! - **Which side reset.** A RST is attributed only from eBPF events joined by
//!   socket cookie (`received` = the peer endpoint sent it, `sent` = this
//!   host). Without eBPF the capture states what it saw (the flow left
//!   ESTABLISHED for CLOSE, EstabResets/OutRsts deltas) as facts, the reset
//!   direction as an inference, and leaves an unknown with its probe.

pub mod recorded;
pub mod rules;
/// The ids of the surfaces a flow envelope can carry: claims bind these,
/// never a string written elsewhere.
pub use pstack_envelope::surface_id::network_stream as surface_id;

use self::surface_id as sid;
use pstack_envelope::facts::{ebpf_tcp, socket as socket_facts};

use crate::Progress;
use crate::clock::monotonic_ns;
use crate::request::{self, MAX_FLOWS, RequestError, TRANSPORT_WINDOW, invalid};
use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use crate::supervisor::{CaptureError, LeakBudget, NetHelper, NetHelperFailure, SupervisorConfig};
use pstack_collectors::net::conntrack::ConntrackError;
use pstack_collectors::net::load::LoadFacts;
use pstack_collectors::net::netns::{NetnsError, NetnsTarget};
use pstack_collectors::net::rtnl::{LinkFacts, RouteFacts};
use pstack_collectors::net::sample::{NetSample, Timed};
use pstack_collectors::net::sockdiag::{self, FlowFilter, PortRange, TcpDump, TcpSocket};
use pstack_collectors::net::sockopt::{self, SockOptError, SockOpts};
use pstack_collectors::net::{CountersError, TcpInfo, snmp};
use pstack_envelope::{
    Bounds, Claim, ClaimCode, ClaimKind, Clock, Collector, Completeness, Envelope, EnvelopeBuilder,
    HostIdentity, NextTransition, SCHEMA_ID, Scope, StatusCause, StreamIdentity, Subject, Surface,
    SurfaceStatus, Termination, Universe, Unknown, sha256_digest,
};
use pstack_helper::sockopt::SockoptTarget;
use serde_json::{Map, Value, json};

/// Longhorn v1's instance-manager data port range, the default port filter:
/// `--port-range 10000-20000` of longhorn-instance-manager
/// (`app/cmd/start.go`, v1.9.0); each replica owns ten ports of it.
/// 20001-30000 is the v2 data engine's `--spdk-port-range`, out of scope
/// (a v2 volume is refused by the Longhorn capture), so it is not matched.
pub const LONGHORN_PORTS: PortRange = PortRange {
    lo: 10000,
    hi: 20000,
};
/// Per-surface budget recorded in the envelope (net reads do not block on a task).
pub const SURFACE_DEADLINE_MS: u64 = 2000;
/// Conntrack fill (ppm of max) from which pressure is claimed.
pub const CONNTRACK_PRESSURE_PPM: u64 = 900_000;
/// PSI cpu `some avg10` (hundredths of a percent) from which CPU starvation is hypothesized.
pub const CPU_PSI_HYPOTHESIS_CENTI: u64 = 1000;
const MAX_SAFE: i128 = 9_007_199_254_740_991;

pub use crate::supervisor::SOURCE_COMMIT;

/// Which flows to capture and how long to watch them; the transport fields
/// shared by the `transport` and `longhorn` requests (see
/// [`crate::request::TransportRequest`]), before validation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlowSelection {
    /// Remote endpoint: ADDR or ADDR:PORT (IPv6 with a port in brackets: [fd00::2]:10001).
    pub peer: String,
    /// Local endpoint: ADDR or ADDR:PORT.
    pub local: Option<String>,
    /// Read the network namespace of this process.
    pub netns_pid: Option<u32>,
    /// Read this named network namespace (/run/netns/NAME).
    pub netns: Option<String>,
    /// Sampling window, ms.
    pub window_ms: u64,
    /// With no port pinned, match flows whose local or remote port is in this
    /// range `LO-HI` (Longhorn's instance-manager data ports when absent).
    pub ports: Option<String>,
    /// Most flows enveloped; more matching flows make every envelope `bounded`.
    pub max_flows: usize,
    /// Watch the whole window even when no flow matches at the first sample.
    pub wait: bool,
}

/// Why a capture could not run (as opposed to evidence it gathered).
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    /// A request field is invalid.
    #[error(transparent)]
    Invalid(#[from] RequestError),
    /// The target network namespace cannot be entered.
    #[error(transparent)]
    Netns(#[from] NetnsError),
    /// The net helper cannot be found (or its config built).
    #[error(transparent)]
    Helper(#[from] CaptureError),
    /// Host identity could not be read.
    #[error("host identity: {0}")]
    Host(String),
    /// An envelope was refused by the validator (a bug in this module).
    #[error("envelope refused: {0}")]
    Sealing(#[from] pstack_envelope::Rejection),
    /// The envelope builder refused a surface, claim or unknown (a bug in
    /// this module).
    #[error("envelope refused: {0}")]
    Building(#[from] pstack_envelope::BuildError),
}

/// `ADDR` or `ADDR:PORT` (`[v6]:PORT`); a port must be 1–65535.
pub fn parse_endpoint(param: &'static str, s: &str) -> Result<(IpAddr, Option<u16>), RequestError> {
    let s = s.trim();
    if let Ok(a) = s.parse::<IpAddr>() {
        return Ok((a, None));
    }
    if let Ok(sa) = s.parse::<SocketAddr>() {
        if sa.port() == 0 {
            return Err(invalid(param, "port 0 is not a port (use 1–65535)"));
        }
        return Ok((sa.ip(), Some(sa.port())));
    }
    // Say why: an address with an out-of-range port, or not an address at all.
    if let Some((host, port)) = s.rsplit_once(':') {
        let host = host.trim_start_matches('[').trim_end_matches(']');
        if host.parse::<IpAddr>().is_ok() {
            return Err(invalid(param, format!("port {port:?} is outside 1–65535")));
        }
    }
    Err(invalid(
        param,
        format!("{s:?} is not ADDR, ADDR:PORT or [IPv6]:PORT"),
    ))
}

/// `LO-HI` with 1 ≤ LO ≤ HI ≤ 65535.
pub fn parse_port_range(s: &str) -> Result<PortRange, RequestError> {
    let (lo, hi) = s
        .split_once('-')
        .ok_or_else(|| invalid("ports", format!("{s:?} is not LO-HI")))?;
    let p = |v: &str| -> Result<u16, RequestError> {
        match v.trim().parse::<u32>() {
            Ok(n) if (1..=65535).contains(&n) => Ok(n as u16),
            _ => Err(invalid("ports", format!("{v:?} is outside 1–65535"))),
        }
    };
    let (lo, hi) = (p(lo)?, p(hi)?);
    if lo > hi {
        return Err(invalid("ports", format!("{lo} > {hi}")));
    }
    Ok(PortRange { lo, hi })
}

/// What one capture covers.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Which flows.
    pub filter: FlowFilter,
    /// Which network namespace.
    pub target: NetnsTarget,
    /// Sampling window.
    pub window: Duration,
    /// Most flows enveloped.
    pub max_flows: usize,
    /// Whether to run the eBPF TCP window.
    pub ebpf: bool,
    /// Watch the whole window even when nothing matches at the first sample.
    pub wait: bool,
    /// The watch rule that started this capture (none for an operator's).
    pub trigger: Option<pstack_envelope::Trigger>,
}

impl Plan {
    /// What is being captured, for how long, where (the operator's line).
    pub fn describe(&self, what: &str) -> String {
        format!(
            "capturing {what}{} for {} in netns {} ...",
            self.filter.selector(),
            pstack_units::format_duration(self.window),
            self.target.path()
        )
    }

    /// Validate a flow selection into a plan.
    pub fn from_selection(a: &FlowSelection, ebpf: bool) -> Result<Plan, RequestError> {
        let (peer, peer_port) = parse_endpoint("peer", &a.peer)?;
        let (local, local_port) = match &a.local {
            Some(l) => {
                let (ip, port) = parse_endpoint("local", l)?;
                (Some(ip), port)
            }
            None => (None, None),
        };
        if let Some(l) = local
            && l.is_ipv4() != sockdiag::normalize(peer).is_ipv4()
        {
            return Err(invalid("local", "address family differs from --peer"));
        }
        if a.max_flows == 0 || a.max_flows > MAX_FLOWS {
            return Err(invalid("max_flows", format!("must be 1–{MAX_FLOWS}")));
        }
        let target = match (&a.netns_pid, &a.netns) {
            (Some(pid), None) => NetnsTarget::Pid(*pid),
            (None, Some(n)) => NetnsTarget::Named(n.clone()),
            (None, None) => NetnsTarget::Current,
            (Some(_), Some(_)) => {
                return Err(invalid("netns", "give --netns-pid or --netns, not both"));
            }
        };
        Ok(Plan {
            filter: FlowFilter {
                peer,
                peer_port,
                local,
                local_port,
                either_port_in: Some(match &a.ports {
                    Some(p) => parse_port_range(p)?,
                    None => LONGHORN_PORTS,
                }),
            },
            target,
            window: request::window(a.window_ms, TRANSPORT_WINDOW)?,
            max_flows: a.max_flows,
            ebpf,
            wait: a.wait,
            trigger: None,
        })
    }
}

/// What one end of the window produced: the net helper's sample, or why
/// there is none (the status every surface of that end gets).
type SampleRead = Result<NetSample, NetHelperFailure>;

/// Leak budget of a one-shot transport capture (unreaped net helpers
/// tolerated before samples are `skipped`).
pub const NET_LEAK_BUDGET: u64 = 4;

/// Default leak journal (`PSTACK_LEAK_JOURNAL` overrides), shared with
/// `pstackctl capture`.
pub const DEFAULT_LEAK_JOURNAL: &str = crate::supervisor::leak::DEFAULT_JOURNAL;

/// Most a capture spends around its window: two net-helper samples and the
/// socket-option read, each under [`SURFACE_DEADLINE_MS`], plus helper
/// spawn, kill and reap.
pub const RUN_OVERHEAD: Duration = Duration::from_secs(10);

/// Most descriptors examined when looking for sockets' owners.
pub const MAX_OWNER_SCAN_FDS: usize = 1_000_000;

/// TCP_USER_TIMEOUT / keepalive of every matched socket that has an owner,
/// by socket cookie. The owners are found here (a `/proc/*/fd` scan); the
/// options are read by `pstack-helper --sockopt` under one deadline of
/// [`SURFACE_DEADLINE_MS`] (`pidfd_getfd` can wait, killably, on an owner
/// stuck in execve: the helper is SIGKILLed and the sockets not yet read
/// are `timeout`).
fn read_flow_sockopts(
    dump: Option<&TcpDump>,
    config: &SupervisorConfig,
    budget: &LeakBudget,
    subject: &str,
) -> BTreeMap<u64, Timed<Result<SockOpts, SockOptError>>> {
    let mut out = BTreeMap::new();
    let Some(dump) = dump else {
        return out;
    };
    let wanted: std::collections::BTreeSet<u64> = dump
        .sockets
        .iter()
        .filter(|s| s.inode != 0)
        .map(|s| u64::from(s.inode))
        .collect();
    if wanted.is_empty() {
        return out;
    }
    let t = Instant::now();
    let scan = sockopt::find_owners(&wanted, MAX_OWNER_SCAN_FDS);
    let scan_us = t.elapsed().as_micros() as u64;
    let targets: Vec<SockoptTarget> = scan
        .owners
        .iter()
        .map(|(inode, (pid, fd))| SockoptTarget {
            inode: *inode,
            pid: *pid,
            fd: *fd,
        })
        .collect();
    let mut read = crate::supervisor::sockopt_helper::read_sockopts(
        &targets,
        config,
        budget,
        subject,
        Duration::from_millis(SURFACE_DEADLINE_MS),
    );
    for s in dump.sockets.iter().filter(|s| s.inode != 0) {
        let ino = u64::from(s.inode);
        let r = read.remove(&ino).unwrap_or(Timed {
            value: Err(SockOptError::NoOwner {
                inode: ino,
                truncated: scan.truncated,
            }),
            elapsed_us: 0,
        });
        out.insert(
            s.cookie,
            Timed {
                value: r.value,
                elapsed_us: r.elapsed_us + scan_us,
            },
        );
    }
    out
}

/// eBPF view of one flow for the window.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EbpfFlow {
    /// Socket cookie.
    pub cookie: u64,
    /// Retransmit events.
    pub retransmits: u64,
    /// RSTs this host sent on the flow.
    pub resets_sent: u64,
    /// RSTs the flow received (sent by the remote endpoint).
    pub resets_received: u64,
    /// Kernel reset reason name of the last RST sent, if any.
    pub last_reset_reason: Option<String>,
    /// State transitions (`FROM>TO@monotonic_ns`).
    pub transitions: Vec<String>,
    /// First and last event, CLOCK_MONOTONIC ns.
    pub first_ns: u64,
    /// Last event.
    pub last_ns: u64,
    /// Reset events kept in the window's sample: (`received`|`sent`,
    /// CLOCK_MONOTONIC ns, the endpoint that sent the RST).
    pub resets: Vec<(String, u64, String)>,
}

/// A flow eBPF saw close inside the window (a transition to CLOSE): the
/// short-lived streams a sock_diag sample at each end cannot see, such as
/// Longhorn's per-file bulk streams. Identity: the socket cookie when the
/// kernel had generated one (`skc_cookie` is made lazily, by sock_diag or a
/// BPF helper, so a socket nobody dumped has none), else the 4-tuple with
/// its first and last event times.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct TransientFlow {
    /// Socket cookie, when the kernel had one.
    pub cookie: Option<String>,
    /// This host's end.
    pub local: SocketAddr,
    /// The other end.
    pub remote: SocketAddr,
    /// Netns inode of the socket, when the event carried it.
    pub netns_ino: Option<u32>,
    /// Whether its opening (a SYN state → ESTABLISHED) was seen too.
    pub opened_in_window: bool,
    /// First and last event, CLOCK_MONOTONIC ns (decimal strings).
    pub first_ns: String,
    /// Last event.
    pub last_ns: String,
    /// State transitions (`FROM>TO@ns`).
    pub transitions: Vec<String>,
    /// Retransmits.
    pub retransmits: u64,
    /// RSTs this host sent.
    pub resets_sent: u64,
    /// RSTs received.
    pub resets_received: u64,
}

/// The eBPF side of a window.
#[derive(Debug, Clone)]
pub enum EbpfWindow {
    /// Not requested (`--no-ebpf`).
    NotRequested,
    /// Requested but this host cannot provide it.
    Unavailable {
        /// `unsupported`, `permission_denied` or `error`.
        status: SurfaceStatus,
        /// Why.
        message: String,
    },
    /// Events joined by socket cookie.
    Flows {
        /// Per-flow summaries.
        flows: Vec<EbpfFlow>,
        /// Digest of the raw records.
        digest: Option<String>,
        /// Raw bytes.
        bytes: u64,
        /// Whether a ring or cap dropped events.
        truncated: bool,
        /// Flows that closed inside the window (sock_diag's cookies not yet
        /// removed: see [`CaptureResult::short_lived`]).
        transient: Vec<TransientFlow>,
    },
}

/// Load the eBPF TCP programs (before the window starts), filtered to `peer`.
pub fn ebpf_start(peer: IpAddr) -> Result<pstack_ebpf::EbpfSession, EbpfWindow> {
    let mut cfg = pstack_ebpf::EbpfConfig::tcp();
    cfg.addr = Some(peer);
    pstack_ebpf::EbpfSession::start(cfg).map_err(|e| EbpfWindow::Unavailable {
        status: e.status(),
        message: e.to_string(),
    })
}

// Linux `TCP_*` states (include/net/tcp_states.h).
const TCP_ESTABLISHED: u8 = 1;
const TCP_SYN_SENT: u8 = 2;
const TCP_SYN_RECV: u8 = 3;
const TCP_CLOSE: u8 = 7;

/// Ends a capture's window before its length: set by whoever watches what
/// the window is about (pstackd's `longhorn_rebuild` rule ends a rebuild's
/// window when the rebuild ends). Cloning shares the signal.
#[derive(Debug, Clone, Default)]
pub struct WindowStop(std::sync::Arc<std::sync::atomic::AtomicBool>);

impl WindowStop {
    /// Slice in which a sleeping window notices the signal.
    pub const SLICE: Duration = Duration::from_millis(50);

    /// End the window now (or at once, when it has not started).
    pub fn stop(&self) {
        self.0.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Whether the window was ended.
    pub fn is_stopped(&self) -> bool {
        self.0.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Sleep `window`, or until stopped; whether it was stopped.
    pub fn sleep(&self, window: Duration) -> bool {
        let until = Instant::now() + window;
        loop {
            if self.is_stopped() {
                return true;
            }
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            std::thread::sleep(left.min(Self::SLICE));
        }
    }

    /// Resolves when stopped (polled every [`Self::SLICE`]).
    pub async fn stopped(self) {
        while !self.is_stopped() {
            tokio::time::sleep(Self::SLICE).await;
        }
    }
}

/// Run one eBPF window on a loaded session and join its flows by socket cookie.
pub fn ebpf_window(session: pstack_ebpf::EbpfSession, window: Duration) -> EbpfWindow {
    ebpf_window_until(session, window, &WindowStop::default())
}

/// [`ebpf_window`], ended early by `stop`.
pub fn ebpf_window_until(
    mut session: pstack_ebpf::EbpfSession,
    window: Duration,
    stop: &WindowStop,
) -> EbpfWindow {
    use pstack_ebpf::TcpSurface;
    let report = match session.run_window_blocking_until(window, |_| {}, stop.clone().stopped()) {
        Ok(r) => r,
        Err(e) => {
            return EbpfWindow::Unavailable {
                status: e.status(),
                message: e.to_string(),
            };
        }
    };
    let Some(agg) = report.tcp.as_ref() else {
        return EbpfWindow::Unavailable {
            status: SurfaceStatus::Unsupported,
            message: "the TCP programs are not loaded in this session".into(),
        };
    };
    let flows = agg
        .flows()
        .iter()
        .filter_map(|f| {
            Some(EbpfFlow {
                cookie: f.sock_cookie?,
                retransmits: f.retransmits,
                resets_sent: f.resets_sent,
                resets_received: f.resets_received,
                last_reset_reason: f
                    .last_reset_reason
                    .map(pstack_ebpf::record::reset_reason_name),
                transitions: f
                    .transitions
                    .iter()
                    .map(|t| format!("{}>{}@{}", t.from.name(), t.to.name(), t.ts_ns))
                    .collect(),
                first_ns: f.first_ns,
                last_ns: f.last_ns,
                resets: agg
                    .events(TcpSurface::Resets)
                    .filter(|e| e.sock_cookie.is_some() && e.sock_cookie == f.sock_cookie)
                    .map(|e| match e.kind {
                        pstack_ebpf::TcpEventKind::ReceiveReset => {
                            ("received".to_string(), e.ts_ns, e.remote.to_string())
                        }
                        _ => ("sent".to_string(), e.ts_ns, e.local.to_string()),
                    })
                    .collect(),
            })
        })
        .collect();
    let digests: Vec<String> = TcpSurface::ALL
        .iter()
        .filter_map(|s| agg.raw(*s).digest())
        .collect();
    let bytes: u64 = TcpSurface::ALL.iter().map(|s| agg.raw(*s).bytes).sum();
    let truncated = TcpSurface::ALL.iter().any(|s| agg.truncated(*s))
        || report.tcp_ctx.lost.iter().any(|l| *l > 0);
    let transient = agg
        .flows()
        .iter()
        .filter(|f| f.transitions.iter().any(|t| t.to.0 == TCP_CLOSE))
        .filter(|f| !f.local.addr.is_unspecified() && f.local.port != 0 && f.remote.port != 0)
        .map(|f| TransientFlow {
            cookie: f.sock_cookie.map(|c| c.to_string()),
            local: SocketAddr::new(f.local.addr, f.local.port),
            remote: SocketAddr::new(f.remote.addr, f.remote.port),
            netns_ino: f.netns_ino,
            opened_in_window: f.transitions.iter().any(|t| {
                t.to.0 == TCP_ESTABLISHED && matches!(t.from.0, TCP_SYN_SENT | TCP_SYN_RECV)
            }),
            first_ns: f.first_ns.to_string(),
            last_ns: f.last_ns.to_string(),
            transitions: f
                .transitions
                .iter()
                .map(|t| format!("{}>{}@{}", t.from.name(), t.to.name(), t.ts_ns))
                .collect(),
            retransmits: f.retransmits,
            resets_sent: f.resets_sent,
            resets_received: f.resets_received,
        })
        .collect();
    EbpfWindow::Flows {
        flows,
        digest: (!digests.is_empty()).then(|| sha256_digest(digests.join("\n").as_bytes())),
        bytes,
        truncated,
        transient,
    }
}

/// One capture's result: envelopes per flow, or the evidence that none matched.
#[derive(Debug, Clone)]
pub struct CaptureResult {
    /// Network namespace inode read.
    pub net_ns: u64,
    /// One sealed envelope per flow.
    pub flows: Vec<Envelope>,
    /// When no flow matched: a sealed `host` envelope saying so.
    pub no_match: Option<Envelope>,
    /// Flows of the selection that eBPF saw close inside the window and that
    /// neither sock_diag sample held (in this netns); None when eBPF did not
    /// run, so their absence is unknown rather than none.
    pub short_lived: Option<Vec<TransientFlow>>,
}

/// Run a capture with the net helper of `config` (its reap deadline and
/// spawn hook apply) under `budget`.
pub fn capture_with(
    plan: &Plan,
    config: &SupervisorConfig,
    budget: &LeakBudget,
    progress: &dyn Fn(Progress<'_>),
) -> Result<CaptureResult, TransportError> {
    capture_until(plan, config, budget, progress, &WindowStop::default())
}

/// [`capture_with`], whose window (sock_diag and eBPF alike) ends early
/// when `stop` is set; the envelopes then carry the shorter window they
/// really covered (their clocks), and say nothing about the rest.
pub fn capture_until(
    plan: &Plan,
    config: &SupervisorConfig,
    budget: &LeakBudget,
    progress: &dyn Fn(Progress<'_>),
    stop: &WindowStop,
) -> Result<CaptureResult, TransportError> {
    let host = pstack_collectors::procfs::read_host_facts()
        .map_err(|e| TransportError::Host(e.to_string()))?;
    let subject = format!(
        "transport {} netns {}",
        plan.filter.selector(),
        plan.target.path()
    );
    // The namespace file is opened here, before anything is spawned or read.
    let mut net = NetHelper::open(&plan.target, config, budget, &subject)?;
    let net_ns = net.net_ns();
    let deadline = Duration::from_millis(SURFACE_DEADLINE_MS);
    let wall = crate::clock::wall_time_now();
    let mono_start = monotonic_ns();
    // Programs are loaded before the first sample so the window covers it.
    let ebpf = plan.ebpf.then(|| {
        let window = plan.window;
        let stop = stop.clone();
        match ebpf_start(plan.filter.peer) {
            Ok(session) => std::thread::spawn(move || ebpf_window_until(session, window, &stop)),
            Err(unavailable) => std::thread::spawn(move || unavailable),
        }
    });
    let start = net.sample(&plan.filter, deadline).map(|r| r.sample);
    if let Err(f) = &start
        && let Some(e) = &f.unenterable
    {
        // As before the helper existed: a namespace that cannot be entered is
        // a usage-level error, not an envelope (nothing was read). A started
        // eBPF window thread is left to finish on its own (it only counts).
        return Err(TransportError::Netns((**e).clone()));
    }
    // Nothing to watch: the first sample read fine and matched no socket.
    // Unless asked to wait for one, the end sample follows at once (it
    // confirms the absence) instead of after the whole window.
    let stopped_early = !plan.wait
        && start
            .as_ref()
            .is_ok_and(|s| s.tcp.value.as_ref().is_ok_and(|d| d.sockets.is_empty()));
    let mut covered = plan.window;
    if stopped_early {
        progress(Progress::Note(&format!(
            "no TCP flow matches {} in netns {}: stopping now instead of watching {} (--wait watches the whole window)",
            plan.filter.selector(),
            plan.target.path(),
            pstack_units::format_duration(plan.window)
        )));
    } else {
        progress(Progress::Phase {
            what: "sampling TCP flows",
            expected: plan.window,
        });
        let slept = Instant::now();
        if stop.sleep(plan.window) {
            covered = slept.elapsed().min(plan.window);
            progress(Progress::Note("the window was ended early by its watcher"));
        }
        progress(Progress::PhaseDone);
    }
    let end = net.sample(&plan.filter, deadline).map(|r| r.sample);
    net.finish();
    let sockopts = read_flow_sockopts(
        end.as_ref().ok().and_then(|e| e.tcp.value.as_ref().ok()),
        config,
        budget,
        &subject,
    );
    let ebpf = match ebpf {
        None => EbpfWindow::NotRequested,
        // The window thread finishes on its own; a no-match envelope has no eBPF surfaces.
        Some(_) if stopped_early => EbpfWindow::NotRequested,
        Some(h) => h.join().unwrap_or(EbpfWindow::Unavailable {
            status: SurfaceStatus::Error,
            message: "eBPF window thread panicked".into(),
        }),
    };
    let mono_end = monotonic_ns();
    let raw = Raw {
        wall,
        mono_start,
        mono_end,
        start,
        end,
        sockopts,
        ebpf,
        stopped_early,
    };
    // A window ended early is described as the window it really was.
    let shortened;
    let plan = if covered < plan.window {
        shortened = Plan {
            window: covered,
            ..plan.clone()
        };
        &shortened
    } else {
        plan
    };
    let ctx = Ctx {
        plan,
        host: HostIdentity {
            host: host.host,
            boot_id: host.boot_id,
        },
        net_ns,
        leak_budget: budget.capacity(),
        raw: &raw,
    };
    ctx.build()
}

#[derive(Debug)]
struct Raw {
    wall: String,
    mono_start: u64,
    mono_end: u64,
    start: SampleRead,
    end: SampleRead,
    /// Socket options of the flows present at window end, by cookie.
    sockopts: BTreeMap<u64, Timed<Result<SockOpts, SockOptError>>>,
    ebpf: EbpfWindow,
    /// No flow matched the first sample and the window was not waited out.
    stopped_early: bool,
}

struct Ctx<'a> {
    plan: &'a Plan,
    host: HostIdentity,
    net_ns: u64,
    leak_budget: u64,
    raw: &'a Raw,
}

/// A surface that could not be read, and why.
struct Unread {
    status: SurfaceStatus,
    errno: Option<i32>,
    message: String,
    elapsed_us: u64,
}

impl Unread {
    fn of_helper(f: &NetHelperFailure) -> Unread {
        Unread {
            status: f.status,
            errno: f.cause.errno,
            message: f.cause.message.clone(),
            elapsed_us: f.elapsed_us,
        }
    }
}

/// The sock_diag dump of one end of the window, or why it is missing.
fn tcp_of(end: &SampleRead) -> Result<(&TcpDump, u64), Unread> {
    match end {
        Ok(s) => match &s.tcp.value {
            Ok(d) => Ok((d, s.tcp.elapsed_us)),
            Err(err) => Err(Unread {
                status: status_of_errno(err.errno()),
                errno: err.errno(),
                message: err.to_string(),
                elapsed_us: s.tcp.elapsed_us,
            }),
        },
        Err(f) => Err(Unread::of_helper(f)),
    }
}

/// A JSON number when exact, otherwise a decimal string.
pub fn num(v: i128) -> Value {
    if (-MAX_SAFE..=MAX_SAFE).contains(&v) {
        json!(v as i64)
    } else {
        json!(v.to_string())
    }
}

fn obj(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => Map::new(),
    }
}

/// tcp_info fields that are u64 in the uapi: always decimal strings.
const TCP_INFO_U64: [&str; 9] = [
    "pacing_rate",
    "bytes_acked",
    "bytes_received",
    "delivery_rate",
    "busy_time_us",
    "rwnd_limited_us",
    "sndbuf_limited_us",
    "bytes_sent",
    "bytes_retrans",
];

fn tcp_info_facts(i: &TcpInfo) -> Value {
    let mut m = obj(serde_json::to_value(i).unwrap_or(Value::Null));
    m.retain(|_, v| !v.is_null());
    for k in TCP_INFO_U64 {
        if let Some(v) = m.get_mut(k)
            && let Some(n) = v.as_u64()
        {
            *v = json!(n.to_string());
        }
    }
    m.insert("state_name".into(), json!(sockdiag::state_name(i.state)));
    Value::Object(m)
}

fn socket_facts(s: &TcpSocket) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert("state".into(), json!(sockdiag::state_name(s.state)));
    m.insert(socket_facts::TIMER.into(), json!(s.timer.as_str()));
    m.insert("timer_expires_ms".into(), json!(s.timer_expires_ms));
    m.insert("timer_retrans".into(), json!(s.timer_retrans));
    m.insert(socket_facts::RQUEUE.into(), json!(s.rqueue));
    m.insert(socket_facts::WQUEUE.into(), json!(s.wqueue));
    m.insert("uid".into(), json!(s.uid));
    m.insert("inode".into(), json!(s.inode.to_string()));
    if let Some(c) = &s.congestion {
        m.insert("congestion".into(), json!(c));
    }
    if let Some(sh) = s.shutdown {
        m.insert("shutdown".into(), json!(sh));
    }
    if let Some(mem) = s.mem {
        m.insert(
            "skmem".into(),
            serde_json::to_value(mem).unwrap_or(Value::Null),
        );
    }
    match &s.info {
        Some(i) => {
            m.insert(socket_facts::TCP_INFO.into(), tcp_info_facts(i));
        }
        None => {
            m.insert(socket_facts::TCP_INFO.into(), Value::Null);
        }
    }
    m
}

/// Per-flow deltas end − start of the cumulative tcp_info counters.
fn tcp_deltas(a: &TcpInfo, b: &TcpInfo) -> BTreeMap<&'static str, i128> {
    let mut d = BTreeMap::new();
    let mut put = |k: &'static str, x: Option<i128>, y: Option<i128>| {
        if let (Some(x), Some(y)) = (x, y) {
            d.insert(k, y - x);
        }
    };
    put(
        "total_retrans",
        Some(a.total_retrans.into()),
        Some(b.total_retrans.into()),
    );
    // Optional counters: only when both samples carry them (older kernels
    // send a shorter tcp_info).
    macro_rules! optional {
        ($($field:ident),+) => {
            $(put(
                stringify!($field),
                a.$field.map(i128::from),
                b.$field.map(i128::from),
            );)+
        };
    }
    optional!(
        total_rto,
        total_rto_recoveries,
        bytes_acked,
        bytes_received,
        bytes_retrans,
        segs_out,
        segs_in,
        data_segs_out,
        dsack_dups,
        rcv_ooopack
    );
    d
}

/// (payload MSS, on-wire size) of a full-size segment: the socket's PMTU when
/// it has one (options included), else MSS plus the bare IP and TCP headers.
fn full_size(sock: Option<&TcpSocket>, remote: SocketAddr) -> (u32, u32) {
    let info = sock.and_then(|x| x.info.as_ref());
    let mss = info.map(|i| i.snd_mss).unwrap_or(0);
    let hdr = if remote.is_ipv4() { 40 } else { 60 };
    let wire = info
        .map(|i| i.pmtu)
        .filter(|p| *p > 0 && *p < 65536)
        .unwrap_or(mss + hdr);
    (mss, wire)
}

/// Counters a local abort (a RST this host sends for its own flow) increments.
pub const LOCAL_ABORT_COUNTERS: [&str; 5] = [
    "TcpExt.TCPAbortOnData",
    "TcpExt.TCPAbortOnClose",
    "TcpExt.TCPAbortOnMemory",
    "TcpExt.TCPAbortOnLinger",
    "TcpExt.TCPAbortFailed",
];

/// Counters whose movement is a transport fault signature (netns-wide).
pub const FAULT_COUNTERS: [&str; 14] = [
    "Tcp.OutRsts",
    "Tcp.EstabResets",
    "Tcp.RetransSegs",
    "TcpExt.TCPTimeouts",
    "TcpExt.TCPAbortOnData",
    "TcpExt.TCPAbortOnTimeout",
    "TcpExt.TCPAbortOnClose",
    "TcpExt.TCPAbortOnMemory",
    "TcpExt.TCPAbortOnLinger",
    "TcpExt.TCPZeroWindowDrop",
    "TcpExt.TCPToZeroWindowAdv",
    "TcpExt.TCPWantZeroWindowAdv",
    "TcpExt.ListenDrops",
    "TcpExt.ListenOverflows",
];

fn surface(
    id: impl Into<String>,
    authority: impl Into<String>,
    elapsed_us: u64,
    raw: Option<(String, u64)>,
    facts: Map<String, Value>,
) -> Surface {
    let (digest, bytes) = match raw {
        Some((d, b)) => (Some(d), b),
        None => (None, 0),
    };
    Surface {
        id: id.into(),
        authority: authority.into(),
        status: SurfaceStatus::Ok,
        cause: None,
        deadline_ms: SURFACE_DEADLINE_MS,
        elapsed_us,
        digest,
        bytes,
        truncated: false,
        facts,
    }
}

fn failed(
    id: impl Into<String>,
    authority: impl Into<String>,
    elapsed_us: u64,
    status: SurfaceStatus,
    errno: Option<i32>,
    message: impl Into<String>,
) -> Surface {
    Surface {
        id: id.into(),
        authority: authority.into(),
        status,
        cause: Some(StatusCause {
            errno,
            message: message.into(),
        }),
        deadline_ms: SURFACE_DEADLINE_MS,
        elapsed_us,
        digest: None,
        bytes: 0,
        truncated: false,
        facts: Map::new(),
    }
}

fn status_of_errno(errno: Option<i32>) -> SurfaceStatus {
    match errno {
        Some(libc::EPERM) | Some(libc::EACCES) => SurfaceStatus::PermissionDenied,
        Some(libc::ENOENT) | Some(libc::EOPNOTSUPP) | Some(libc::EAFNOSUPPORT) => {
            SurfaceStatus::Unsupported
        }
        _ => SurfaceStatus::Error,
    }
}

fn link_stats_delta(a: &LinkFacts, b: &LinkFacts) -> Map<String, Value> {
    let mut m = Map::new();
    if let (Some(x), Some(y)) = (a.stats, b.stats) {
        let pairs: [(&str, u64, u64); 11] = [
            ("rx_packets", x.rx_packets, y.rx_packets),
            ("tx_packets", x.tx_packets, y.tx_packets),
            ("rx_bytes", x.rx_bytes, y.rx_bytes),
            ("tx_bytes", x.tx_bytes, y.tx_bytes),
            ("rx_errors", x.rx_errors, y.rx_errors),
            ("tx_errors", x.tx_errors, y.tx_errors),
            ("rx_dropped", x.rx_dropped, y.rx_dropped),
            ("tx_dropped", x.tx_dropped, y.tx_dropped),
            ("rx_over_errors", x.rx_over_errors, y.rx_over_errors),
            ("rx_missed_errors", x.rx_missed_errors, y.rx_missed_errors),
            (
                "tx_carrier_errors",
                x.tx_carrier_errors,
                y.tx_carrier_errors,
            ),
        ];
        for (k, a, b) in pairs {
            m.insert(k.into(), num(i128::from(b) - i128::from(a)));
        }
    }
    m
}

fn link_facts(l: &LinkFacts) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert("ifindex".into(), json!(l.index));
    m.insert("name".into(), json!(l.name));
    m.insert("mtu".into(), json!(l.mtu));
    m.insert("operstate".into(), json!(l.operstate));
    m.insert("kind".into(), json!(l.kind));
    if let Some(s) = l.stats {
        m.insert(
            "totals".into(),
            json!({
                "rx_dropped": s.rx_dropped.to_string(),
                "tx_dropped": s.tx_dropped.to_string(),
                "rx_errors": s.rx_errors.to_string(),
                "tx_errors": s.tx_errors.to_string(),
            }),
        );
    }
    m
}

fn drops_in(delta: &Map<String, Value>) -> i64 {
    [
        "rx_errors",
        "tx_errors",
        "rx_dropped",
        "tx_dropped",
        "rx_over_errors",
        "rx_missed_errors",
    ]
    .iter()
    .filter_map(|k| delta.get(*k).and_then(Value::as_i64))
    .sum()
}

/// What the node-wide (netns-wide) surfaces showed, for claims.
#[derive(Debug, Default, Clone)]
pub struct NetnsView {
    /// The netns-wide surfaces (shared by every flow's envelope).
    pub surfaces: Vec<Surface>,
    /// snmp/netstat counter deltas over the window, by `Group.Name`.
    pub counter_delta: BTreeMap<String, i128>,
    /// Egress link MTU.
    pub link_mtu: Option<u32>,
    /// Egress link name.
    pub link_name: Option<String>,
    /// veth peer MTU.
    pub peer_mtu: Option<u32>,
    /// veth peer name.
    pub peer_name: Option<String>,
    /// Route's cached PMTU.
    pub route_pmtu: Option<u32>,
    /// Route's MTU.
    pub route_mtu: Option<u32>,
    /// Interfaces whose drops/errors moved, with the sum of the deltas.
    pub link_drops: Vec<(String, i64)>,
    /// Conntrack (count, max, fill ppm, stat deltas).
    pub conntrack: Option<(u64, u64, u64, BTreeMap<String, i128>)>,
    /// CPU load at window end.
    pub load: Option<LoadFacts>,
}

/// The caps a transport capture enforces beyond the five named bounds: the
/// flow cap (also carried as `max_threads`), the owner scan's descriptor
/// cap, and the net helper's answer frame cap (a larger sample is refused,
/// never cut).
fn caps(max_flows: usize) -> std::collections::BTreeMap<String, u64> {
    [
        ("max_flows", max_flows as u64),
        ("max_owner_scan_fds", MAX_OWNER_SCAN_FDS as u64),
        (
            "max_net_frame_bytes",
            u64::from(pstack_helper::protocol::NET_MAX_FRAME),
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

impl Ctx<'_> {
    fn netns_view(&self) -> NetnsView {
        let mut v = NetnsView::default();
        let (s, e) = match (&self.raw.start, &self.raw.end) {
            (Ok(s), Ok(e)) => (s, e),
            (Err(f), _) | (_, Err(f)) => {
                // The net helper could not sample one end: every netns-wide
                // surface is missing that end, with the helper's status.
                let u = Unread::of_helper(f);
                for (id, auth) in [
                    (sid::NETSTAT, "procfs:/proc/thread-self/net/{snmp,netstat}"),
                    (sid::ROUTE, "rtnetlink:RTM_GETROUTE"),
                    (sid::LINK, "rtnetlink:RTM_GETLINK"),
                    (
                        sid::CONNTRACK,
                        "procfs:/proc/sys/net/netfilter/nf_conntrack_{count,max} + /proc/thread-self/net/stat/nf_conntrack",
                    ),
                    (
                        sid::HOST_CPU,
                        "procfs:/proc/loadavg + /proc/stat + /proc/pressure/cpu",
                    ),
                ] {
                    v.surfaces.push(failed(
                        id,
                        auth,
                        u.elapsed_us,
                        u.status,
                        u.errno,
                        u.message.clone(),
                    ));
                }
                return v;
            }
        };

        // Counters.
        let auth = "procfs:/proc/thread-self/net/{snmp,netstat}";
        match (&s.counters.value, &e.counters.value) {
            (Ok((a, ra)), Ok((b, rb))) => {
                let (delta, one_sided) = snmp::delta(a, b);
                let mut raw = ra.clone();
                raw.extend_from_slice(rb);
                let mut d = Map::new();
                let mut other = Map::new();
                for (k, x) in &delta {
                    if k.starts_with("Tcp.") || k.starts_with("TcpExt.") {
                        d.insert(k.clone(), num(*x));
                    } else if *x != 0 {
                        other.insert(k.clone(), num(*x));
                    }
                }
                let mut facts = Map::new();
                facts.insert("scope".into(), json!("netns"));
                facts.insert("tcp_delta".into(), Value::Object(d));
                facts.insert("other_nonzero_delta".into(), Value::Object(other));
                facts.insert("one_sided".into(), json!(one_sided));
                facts.insert("counters_read".into(), json!(b.len()));
                v.surfaces.push(surface(
                    sid::NETSTAT,
                    auth,
                    s.counters.elapsed_us + e.counters.elapsed_us,
                    Some((sha256_digest(&raw), raw.len() as u64)),
                    facts,
                ));
                v.counter_delta = delta;
            }
            (Err(err), _) | (_, Err(err)) => {
                let errno = match err {
                    CountersError::Io { errno, .. } => Some(*errno),
                    CountersError::Parse { .. } => None,
                };
                v.surfaces.push(failed(
                    sid::NETSTAT,
                    auth,
                    s.counters.elapsed_us + e.counters.elapsed_us,
                    status_of_errno(errno),
                    errno,
                    err.to_string(),
                ));
            }
        }

        // Route.
        let auth = format!("rtnetlink:RTM_GETROUTE dst {}", self.plan.filter.peer);
        match (&s.route.value, &e.route.value) {
            (Ok(a), Ok(b)) => {
                let f = |r: &RouteFacts| {
                    json!({
                        "oif": r.oif, "gateway": r.gateway.map(|g| g.to_string()),
                        "prefsrc": r.prefsrc.map(|g| g.to_string()), "table": r.table,
                        "mtu": r.mtu, "advmss": r.advmss, "cached_exception": r.cloned,
                        "expires_s": r.expires_s, "pmtu": r.pmtu(),
                    })
                };
                v.route_pmtu = b.value.pmtu().or(a.value.pmtu());
                v.route_mtu = b.value.mtu;
                let mut raw = a.raw.digest.clone();
                raw.push_str(&b.raw.digest);
                v.surfaces.push(surface(
                    sid::ROUTE,
                    auth,
                    s.route.elapsed_us + e.route.elapsed_us,
                    Some((b.raw.digest.clone(), b.raw.bytes)),
                    obj(json!({"start": f(&a.value), "end": f(&b.value), "start_digest": a.raw.digest})),
                ));
            }
            (Err(err), _) | (_, Err(err)) => v.surfaces.push(failed(
                sid::ROUTE,
                auth,
                s.route.elapsed_us + e.route.elapsed_us,
                status_of_errno(err.errno()),
                err.errno(),
                err.to_string(),
            )),
        }

        // Egress link and its veth peer.
        for (id, a, b, is_peer) in [
            (sid::LINK, &s.link, &e.link, false),
            (sid::LINK_PEER, &s.peer_link, &e.peer_link, true),
        ] {
            match (a, b) {
                (Some(a), Some(b)) => match (&a.value, &b.value) {
                    (Ok(x), Ok(y)) => {
                        let auth = format!(
                            "rtnetlink:RTM_GETLINK ifindex {}{}",
                            y.value.index,
                            if is_peer {
                                " (veth peer, IFLA_TARGET_NETNSID)"
                            } else {
                                ""
                            }
                        );
                        let delta = link_stats_delta(&x.value, &y.value);
                        let drops = drops_in(&delta);
                        if drops > 0 {
                            v.link_drops.push((y.value.name.clone(), drops));
                        }
                        if is_peer {
                            v.peer_mtu = y.value.mtu;
                            v.peer_name = Some(y.value.name.clone());
                        } else {
                            v.link_mtu = y.value.mtu;
                            v.link_name = Some(y.value.name.clone());
                        }
                        let mut facts = link_facts(&y.value);
                        facts.insert("mtu_at_start".into(), json!(x.value.mtu));
                        facts.insert("operstate_at_start".into(), json!(x.value.operstate));
                        facts.insert("delta".into(), Value::Object(delta));
                        v.surfaces.push(surface(
                            id,
                            auth,
                            a.elapsed_us + b.elapsed_us,
                            Some((y.raw.digest.clone(), y.raw.bytes)),
                            facts,
                        ));
                    }
                    (Err(err), _) | (_, Err(err)) => v.surfaces.push(failed(
                        id,
                        "rtnetlink:RTM_GETLINK",
                        a.elapsed_us + b.elapsed_us,
                        status_of_errno(err.errno()),
                        err.errno(),
                        err.to_string(),
                    )),
                },
                (None, None) => {}
                _ => v.surfaces.push(failed(
                    id,
                    "rtnetlink:RTM_GETLINK",
                    0,
                    SurfaceStatus::Vanished,
                    None,
                    "the egress link changed during the window (present at one end only)",
                )),
            }
        }

        // Conntrack.
        let auth = "procfs:/proc/sys/net/netfilter/nf_conntrack_{count,max} + /proc/thread-self/net/stat/nf_conntrack";
        let el = s.conntrack.elapsed_us + e.conntrack.elapsed_us;
        match (&s.conntrack.value, &e.conntrack.value) {
            (Ok((a, ra)), Ok((b, rb))) => {
                let mut raw = ra.clone();
                raw.extend_from_slice(rb);
                let mut sd = BTreeMap::new();
                for (k, y) in &b.stats {
                    let x = a.stats.get(k).copied().unwrap_or(0);
                    sd.insert(k.clone(), i128::from(*y) - i128::from(x));
                }
                let facts = obj(json!({
                    "loaded": true,
                    "count": b.count, "max": b.max, "fill_ppm": b.fill_ppm(),
                    "count_at_start": a.count,
                    "stat_delta": sd.iter().map(|(k, x)| (k.clone(), num(*x))).collect::<Map<_, _>>(),
                }));
                v.conntrack = Some((b.count, b.max, b.fill_ppm(), sd));
                v.surfaces.push(surface(
                    sid::CONNTRACK,
                    auth,
                    el,
                    Some((sha256_digest(&raw), raw.len() as u64)),
                    facts,
                ));
            }
            (Err(ConntrackError::NotLoaded(p)), Err(ConntrackError::NotLoaded(_))) => {
                // No conntrack in this kernel: there is no table to fill. An observation, not a gap.
                v.surfaces.push(surface(
                    sid::CONNTRACK,
                    auth,
                    el,
                    Some((sha256_digest(p.as_bytes()), 0)),
                    obj(json!({"loaded": false, "absent": p})),
                ));
            }
            (Err(err), _) | (_, Err(err)) => {
                let errno = match err {
                    ConntrackError::Io { errno, .. } => Some(*errno),
                    _ => None,
                };
                v.surfaces.push(failed(
                    sid::CONNTRACK,
                    auth,
                    el,
                    status_of_errno(errno),
                    errno,
                    err.to_string(),
                ));
            }
        }

        // CPU load: hypothesis-only.
        let auth = "procfs:/proc/loadavg + /proc/stat + /proc/pressure/cpu";
        match &e.load.value {
            Ok((l, raw)) => {
                let mut facts = obj(serde_json::to_value(l).unwrap_or(Value::Null));
                facts.insert("role".into(), json!("hypothesis_only"));
                v.load = Some(l.clone());
                v.surfaces.push(surface(
                    sid::HOST_CPU,
                    auth,
                    e.load.elapsed_us,
                    Some((sha256_digest(raw), raw.len() as u64)),
                    facts,
                ));
            }
            Err(m) => v.surfaces.push(failed(
                sid::HOST_CPU,
                auth,
                e.load.elapsed_us,
                SurfaceStatus::Error,
                None,
                m.clone(),
            )),
        }
        v
    }

    fn build(&self) -> Result<CaptureResult, TransportError> {
        let (s, e) = (tcp_of(&self.raw.start), tcp_of(&self.raw.end));
        let selector = format!("{} netns={}", self.plan.filter.selector(), self.net_ns);
        // Flows: union of matches at start and end, by cookie, in first-seen order.
        let mut order: Vec<u64> = Vec::new();
        let mut at_start: BTreeMap<u64, &TcpSocket> = BTreeMap::new();
        let mut at_end: BTreeMap<u64, &TcpSocket> = BTreeMap::new();
        if let Ok((d, _)) = &s {
            for x in &d.sockets {
                at_start.insert(x.cookie, x);
                order.push(x.cookie);
            }
        }
        if let Ok((d, _)) = &e {
            for x in &d.sockets {
                at_end.insert(x.cookie, x);
                if !at_start.contains_key(&x.cookie) {
                    order.push(x.cookie);
                }
            }
        }
        let tcp_failed = s.is_err() || e.is_err();
        let short_lived = self.short_lived(&order);
        if order.is_empty() {
            return Ok(CaptureResult {
                net_ns: self.net_ns,
                flows: Vec::new(),
                no_match: Some(self.no_match_envelope(&selector, tcp_failed)?),
                short_lived,
            });
        }
        let expected = order.len() as u64;
        let termination = if order.len() > self.plan.max_flows {
            Termination::Cap
        } else {
            Termination::Exhausted
        };
        order.truncate(self.plan.max_flows);
        let view = self.netns_view();
        let mut flows = Vec::new();
        for cookie in &order {
            let env = self.flow_envelope(
                *cookie,
                at_start.get(cookie).copied(),
                at_end.get(cookie).copied(),
                &view,
                &selector,
                expected,
                order.len() as u64,
                termination,
            )?;
            flows.push(env);
        }
        Ok(CaptureResult {
            net_ns: self.net_ns,
            flows,
            no_match: None,
            short_lived,
        })
    }

    /// eBPF's flows that closed inside the window, match the selection,
    /// belong to this netns (by inode; without one, by this end not being
    /// the peer) and are none of the sock_diag sockets `seen`.
    fn short_lived(&self, seen: &[u64]) -> Option<Vec<TransientFlow>> {
        let EbpfWindow::Flows { transient, .. } = &self.raw.ebpf else {
            return None;
        };
        Some(
            transient
                .iter()
                .filter(|f| {
                    f.cookie
                        .as_ref()
                        .and_then(|c| c.parse::<u64>().ok())
                        .is_none_or(|c| !seen.contains(&c))
                })
                .filter(|f| match f.netns_ino {
                    Some(ino) => u64::from(ino) == self.net_ns,
                    None => f.local.ip() != self.plan.filter.peer,
                })
                .filter(|f| self.plan.filter.matches_endpoints(f.local, f.remote))
                .cloned()
                .collect(),
        )
    }

    /// Wall time of a CLOCK_MONOTONIC instant inside the capture.
    fn wall_at(&self, mono_ns: u64) -> String {
        crate::clock::wall_time_of(mono_ns)
    }

    fn clock(&self) -> Clock {
        Clock {
            wall_time: self.raw.wall.clone(),
            monotonic_start_ns: self.raw.mono_start.to_string(),
            monotonic_end_ns: self.raw.mono_end.to_string(),
            bundle_deadline_ms: self.bundle_deadline_ms(),
        }
    }

    fn bundle_deadline_ms(&self) -> u64 {
        self.plan.window.as_millis() as u64 + 4 * SURFACE_DEADLINE_MS
    }

    fn bounds(&self) -> Bounds {
        Bounds {
            surface_deadline_ms: SURFACE_DEADLINE_MS,
            bundle_deadline_ms: self.bundle_deadline_ms(),
            max_threads: self.plan.max_flows as u64,
            max_bytes_per_surface: 0,
            leak_budget: self.leak_budget,
            caps: caps(self.plan.max_flows),
        }
    }

    fn collector(&self) -> Collector {
        Collector {
            name: "pstackctl capture transport".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            source_commit: SOURCE_COMMIT.into(),
            trigger: self.plan.trigger.clone(),
        }
    }

    fn no_match_envelope(
        &self,
        selector: &str,
        tcp_failed: bool,
    ) -> Result<Envelope, TransportError> {
        let mut surfaces = Vec::new();
        let mut claims = Vec::new();
        for (id, end) in [
            (sid::TCP_START, &self.raw.start),
            (sid::TCP_END, &self.raw.end),
        ] {
            match tcp_of(end) {
                Ok((d, elapsed_us)) => surfaces.push(surface(
                    id,
                    "netlink:NETLINK_SOCK_DIAG inet_diag tcp (AF_INET, AF_INET6)",
                    elapsed_us,
                    Some((d.raw.digest.clone(), d.raw.bytes)),
                    obj(json!({"matched": 0, "net_ns": self.net_ns.to_string()})),
                )),
                Err(u) => surfaces.push(failed(
                    id,
                    "netlink:NETLINK_SOCK_DIAG",
                    u.elapsed_us,
                    u.status,
                    u.errno,
                    u.message,
                )),
            }
        }
        let completeness = if tcp_failed {
            Completeness::Partial
        } else {
            claims.push(Claim {
                id: "c1".into(),
                kind: ClaimKind::Fact,
                code: ClaimCode::NoMatchingFlow.into(),
                statement: if self.raw.stopped_early {
                    format!(
                        "no TCP socket in netns {} matched `{}` at the first sample nor at the second, taken at once (the window was not waited out)",
                        self.net_ns,
                        self.plan.filter.selector()
                    )
                } else {
                    format!(
                        "no TCP socket in netns {} matched `{}` at window start or end",
                        self.net_ns,
                        self.plan.filter.selector()
                    )
                },
                surfaces: vec![sid::TCP_START.into(), sid::TCP_END.into()],
                scope: Scope::Universal,
                falsifier: None,
            });
            Completeness::Complete
        };
        let env = Envelope {
            schema: SCHEMA_ID.into(),
            completeness,
            subject: Subject::Host(self.host.clone()),
            collector: self.collector(),
            clock: self.clock(),
            universe: Universe {
                selector: selector.into(),
                selector_digest: sha256_digest(selector.as_bytes()),
                expected_count: 0,
                observed_count: 0,
                termination: Termination::Exhausted,
            },
            bounds: self.bounds(),
            surfaces,
            claims,
            unknowns: vec![Unknown {
                id: "u1".into(),
                question:
                    "is the stream in another network namespace (a pod's) or to another address?"
                        .into(),
                blocks: "CAPTURE_STREAM".into(),
                owner: "node operator".into(),
                probe: format!(
                    "ss -tin dst {} ; for p in $(pgrep -f longhorn-instance-manager); do nsenter -t $p -n ss -tin dst {}; done",
                    self.plan.filter.peer, self.plan.filter.peer
                ),
                surface: None,
            }],
            next_transition: NextTransition {
                action: "CAPTURE_IN_STREAM_NETNS".into(),
                success_receipt: "a network_stream envelope for a flow to the peer".into(),
                abort_conditions: vec!["the transfer has ended".into()],
            },
            digest: String::new(),
        };
        Ok(env.seal()?)
    }

    #[allow(
        clippy::too_many_arguments,
        reason = "one call site; the readings of one flow, named"
    )]
    fn flow_envelope(
        &self,
        cookie: u64,
        start: Option<&TcpSocket>,
        end: Option<&TcpSocket>,
        view: &NetnsView,
        selector: &str,
        expected: u64,
        observed: u64,
        termination: Termination,
    ) -> Result<Envelope, TransportError> {
        let id_sock = start.or(end).expect("a flow is seen at one end at least");
        let mut surfaces = Vec::new();
        let auth = format!(
            "netlink:NETLINK_SOCK_DIAG inet_diag tcp cookie {cookie} netns {}",
            self.net_ns
        );
        for (id, t, sock, absent_status, absent) in [
            (
                sid::TCP_START,
                &self.raw.start,
                start,
                SurfaceStatus::Skipped,
                "the flow did not exist at window start (opened during the window)",
            ),
            (
                sid::TCP_END,
                &self.raw.end,
                end,
                SurfaceStatus::Vanished,
                "the socket was gone at window end (closed and released during the window)",
            ),
        ] {
            match (tcp_of(t), sock) {
                (Ok((d, elapsed_us)), Some(x)) => surfaces.push(surface(
                    id,
                    auth.clone(),
                    elapsed_us,
                    Some((d.raw.digest.clone(), d.raw.bytes)),
                    socket_facts(x),
                )),
                (Ok((_, elapsed_us)), None) => surfaces.push(failed(
                    id,
                    auth.clone(),
                    elapsed_us,
                    absent_status,
                    None,
                    absent,
                )),
                (Err(u), _) => surfaces.push(failed(
                    id,
                    auth.clone(),
                    u.elapsed_us,
                    u.status,
                    u.errno,
                    u.message,
                )),
            }
        }
        let deltas = match (
            start.and_then(|x| x.info.as_ref()),
            end.and_then(|x| x.info.as_ref()),
        ) {
            (Some(a), Some(b)) => Some(tcp_deltas(a, b)),
            _ => None,
        };
        if let (Some(d), Some(sf)) = (&deltas, surfaces.iter_mut().find(|x| x.id == sid::TCP_END))
            && sf.status == SurfaceStatus::Ok
        {
            sf.facts.insert(
                socket_facts::DELTA.into(),
                Value::Object(d.iter().map(|(k, v)| (k.to_string(), num(*v))).collect()),
            );
        }
        if let Some(t) = self.raw.sockopts.get(&cookie) {
            let auth = "procfs:/proc/*/fd (owner) + pidfd_getfd + getsockopt(TCP_USER_TIMEOUT, SO_KEEPALIVE, TCP_KEEP*)";
            match &t.value {
                Ok(o) => {
                    let facts = obj(serde_json::to_value(o).unwrap_or(Value::Null));
                    let raw = serde_json::to_vec(o).unwrap_or_default();
                    surfaces.push(surface(
                        sid::TCP_SOCKOPT,
                        auth,
                        t.elapsed_us,
                        Some((sha256_digest(&raw), raw.len() as u64)),
                        facts,
                    ));
                }
                Err(err) => {
                    let (status, errno) = match err {
                        SockOptError::NoOwner { .. } => (SurfaceStatus::Skipped, None),
                        SockOptError::OwnerGone { .. } => (SurfaceStatus::Vanished, None),
                        SockOptError::PermissionDenied { errno, .. } => {
                            (SurfaceStatus::PermissionDenied, Some(*errno))
                        }
                        SockOptError::Unsupported { errno, .. } => {
                            (SurfaceStatus::Unsupported, Some(*errno))
                        }
                        SockOptError::Os { errno, .. } => (SurfaceStatus::Error, Some(*errno)),
                        SockOptError::Abandoned { .. } => (SurfaceStatus::Timeout, None),
                    };
                    surfaces.push(failed(
                        sid::TCP_SOCKOPT,
                        auth,
                        t.elapsed_us,
                        status,
                        errno,
                        err.to_string(),
                    ));
                }
            }
        }
        surfaces.extend(view.surfaces.iter().cloned());

        // eBPF.
        let ebpf_flow = match &self.raw.ebpf {
            EbpfWindow::NotRequested => None,
            EbpfWindow::Unavailable { status, message } => {
                surfaces.push(failed(
                    sid::EBPF_TCP,
                    "ebpf:tracepoint/tcp/{tcp_retransmit_skb,tcp_receive_reset,tcp_send_reset},sock/inet_sock_set_state",
                    0,
                    *status,
                    None,
                    message.clone(),
                ));
                None
            }
            EbpfWindow::Flows {
                flows,
                digest,
                bytes,
                truncated,
                ..
            } => {
                let f = flows
                    .iter()
                    .find(|f| f.cookie == cookie)
                    .cloned()
                    .unwrap_or(EbpfFlow {
                        cookie,
                        ..EbpfFlow::default()
                    });
                let mut sf = surface(
                    sid::EBPF_TCP,
                    "ebpf:tracepoint/tcp/{tcp_retransmit_skb,tcp_receive_reset,tcp_send_reset},sock/inet_sock_set_state",
                    self.plan.window.as_micros() as u64,
                    digest.clone().map(|d| (d, *bytes)),
                    obj(json!({
                        "cookie": cookie.to_string(),
                        (ebpf_tcp::RETRANSMITS): f.retransmits,
                        (ebpf_tcp::RESETS_SENT): f.resets_sent,
                        (ebpf_tcp::RESETS_RECEIVED): f.resets_received,
                        "last_reset_reason": f.last_reset_reason,
                        "transitions": f.transitions,
                        "resets": f.resets.iter().map(|(dir, ts, from)| json!({
                            "direction": dir,
                            "monotonic_ns": ts.to_string(),
                            "wall_time": self.wall_at(*ts),
                            "sent_by": from,
                        })).collect::<Vec<_>>(),
                        "first_event_ns": f.first_ns.to_string(),
                        "last_event_ns": f.last_ns.to_string(),
                    })),
                );
                if *truncated {
                    sf.status = SurfaceStatus::Truncated;
                    sf.truncated = true;
                }
                surfaces.push(sf);
                Some(f)
            }
        };

        let ok_ids: Vec<String> = surfaces
            .iter()
            .filter(|x| matches!(x.status, SurfaceStatus::Ok | SurfaceStatus::Truncated))
            .map(|x| x.id.clone())
            .collect();
        let wall_at = |ns: u64| self.wall_at(ns);
        let readings = rules::FlowReadings {
            cookie,
            start,
            end,
            deltas: deltas.as_ref(),
            ok: &ok_ids,
            end_dump_read: tcp_of(&self.raw.end).is_ok(),
            ebpf: ebpf_flow.as_ref(),
            ebpf_surface: surfaces.iter().any(|x| x.id == sid::EBPF_TCP),
            view,
            net_ns: self.net_ns,
            window: self.plan.window,
            wall_at: &wall_at,
        };
        let rules::FlowClaims {
            mut claims,
            mut unknowns,
            fault,
        } = rules::flow_claims(&readings);
        let (local, remote) = (id_sock.local, id_sock.remote);
        let has_sockopt = surfaces.iter().any(|x| x.id == sid::TCP_SOCKOPT);
        // CPU load may bind hypotheses only: the builder refuses a fact on it.
        let surface_ids: Vec<String> = surfaces
            .iter()
            .filter(|x| x.id != sid::HOST_CPU)
            .map(|x| x.id.clone())
            .collect();
        let mut builder = EnvelopeBuilder::new(
            Subject::NetworkStream(StreamIdentity {
                src: local.to_string(),
                dst: remote.to_string(),
                protocol: "tcp".into(),
                flow_id: cookie.to_string(),
                net_ns: Some(self.net_ns.to_string()),
            }),
            self.collector(),
            self.clock(),
            Universe {
                selector: selector.into(),
                selector_digest: sha256_digest(selector.as_bytes()),
                expected_count: expected,
                observed_count: observed,
                termination,
            },
            self.bounds(),
        );
        for x in surfaces {
            if x.id == sid::HOST_CPU {
                builder.hypothesis_surface(x)?;
            } else {
                builder.surface(x)?;
            }
        }
        let completeness = builder.completeness();
        if let Some(c) = rules::no_fault_claim(
            &claims,
            fault,
            completeness,
            surface_ids,
            self.plan.window,
            (local, remote),
        ) {
            claims.push(c);
        }
        if matches!(self.raw.ebpf, EbpfWindow::NotRequested)
            && !unknowns.iter().any(|u| u.blocks == "ATTRIBUTE_RESET")
            && fault
        {
            unknowns.push(Unknown {
                id: format!("u{}", unknowns.len() + 1),
                question: "did either endpoint send a RST on this flow during the window?".into(),
                blocks: "ATTRIBUTE_RESET".into(),
                owner: "node operator".into(),
                probe: "re-run without --no-ebpf (root, kernel BTF) so reset events are joined to the flow".into(),
                surface: None,
            });
        }
        if !ok_ids.iter().any(|x| x == sid::TCP_SOCKOPT) {
            let has = has_sockopt;
            unknowns.push(Unknown {
                id: format!("u{}", unknowns.len() + 1),
                question: "what are this socket's TCP_USER_TIMEOUT and keepalive settings (not read from its owner)?".into(),
                blocks: "EXPLAIN_TIMEOUT".into(),
                owner: "node operator".into(),
                probe: format!(
                    "find the owner: ss -tinpe src {local} dst {remote}; then inspect the owning process's setsockopt calls (strace -e setsockopt -p PID) or its configuration"
                ),
                surface: has.then(|| sid::TCP_SOCKOPT.to_string()),
            });
        }

        let next = if claims.iter().any(|c| c.kind == ClaimKind::Hypothesis) {
            NextTransition {
                action: "TEST_FALSIFIER".into(),
                success_receipt: "a second envelope of this flow after the falsifier's probe, with the hypothesis killed or standing".into(),
                abort_conditions: vec!["the flow's cookie changes (a new connection)".into()],
            }
        } else if fault {
            NextTransition {
                action: "CAPTURE_PEER_SIDE".into(),
                success_receipt: format!(
                    "a sealed envelope of the same flow captured on the node owning {remote}"
                ),
                abort_conditions: vec!["the transfer has finished or was cancelled".into()],
            }
        } else {
            NextTransition {
                action: "CAPTURE_DURING_FAILURE".into(),
                success_receipt: "an envelope of this flow whose window covers the failure".into(),
                abort_conditions: vec!["the flow's cookie changes (a new connection)".into()],
            }
        };
        for claim in claims {
            builder.claim(claim)?;
        }
        for u in unknowns {
            builder.unknown(u)?;
        }
        Ok(builder.seal(next)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_transport_limit_is_declared_in_bounds() {
        let c = caps(17);
        assert_eq!(c.get("max_flows"), Some(&17));
        assert_eq!(
            c.get("max_owner_scan_fds"),
            Some(&(MAX_OWNER_SCAN_FDS as u64))
        );
        assert_eq!(
            c.get("max_net_frame_bytes"),
            Some(&u64::from(pstack_helper::protocol::NET_MAX_FRAME))
        );
        assert!(c.keys().all(|k| pstack_envelope::is_cap_name(k)));
    }

    #[test]
    fn endpoints_ports_and_windows_are_validated() {
        assert_eq!(
            parse_endpoint("peer", "10.0.0.2").unwrap(),
            ("10.0.0.2".parse().unwrap(), None)
        );
        assert_eq!(
            parse_endpoint("peer", "10.0.0.2:10001").unwrap().1,
            Some(10001)
        );
        assert_eq!(
            parse_endpoint("peer", "[fd00::2]:10001").unwrap().1,
            Some(10001)
        );
        assert_eq!(parse_endpoint("peer", "fd00::2").unwrap().1, None);
        for bad in [
            "10.0.0.2:70000",
            "10.0.0.2:0",
            "host:1",
            "",
            "[fd00::2]:99999",
        ] {
            assert!(
                matches!(
                    parse_endpoint("peer", bad),
                    Err(RequestError::InvalidParameter { param: "peer", .. })
                ),
                "{bad:?}"
            );
        }
        let w = |ms| request::window(ms, TRANSPORT_WINDOW);
        assert_eq!(w(30_000).unwrap(), Duration::from_secs(30));
        assert_eq!(w(100).unwrap(), Duration::from_millis(100));
        for bad in [0, 99, 3_600_001] {
            assert!(w(bad).is_err(), "{bad:?}");
        }
        assert_eq!(parse_port_range("10000-20000").unwrap(), LONGHORN_PORTS);
        for bad in ["0-5", "5-1", "1-70000", "10000"] {
            assert!(parse_port_range(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn wide_values_become_strings() {
        assert_eq!(num(5), json!(5));
        assert_eq!(num(-1), json!(-1));
        assert_eq!(num(1 << 60), json!((1u64 << 60).to_string()));
        let i = TcpInfo {
            bytes_acked: Some(1 << 60),
            pacing_rate: Some(7),
            ..TcpInfo::default()
        };
        let f = tcp_info_facts(&i);
        assert_eq!(f["bytes_acked"], json!((1u64 << 60).to_string()));
        assert_eq!(f["pacing_rate"], json!("7"));
        assert!(
            f.get("total_rto").is_none(),
            "absent fields are left out, not zero"
        );
    }
}
