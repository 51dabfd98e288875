//! The transport engine: one sealed `network_stream` envelope per TCP
//! flow to a peer, sampled over a window, inside the right network namespace.
//!
//! What a capture does, in order:
//! 1. Validates the request (peer `ADDR[:PORT]`, optional local, window,
//!    default port range) — every bad parameter is a typed
//!    [`RequestError::InvalidParameter`] naming it ([`Plan::from_selection`],
//!    called by the request's `validate` in `crate::request`, above this engine).
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

mod assembly;
mod facts;
mod flow_envelope;
mod netns_view;
mod plan;
mod readings;
pub mod recorded;
pub mod rules;
mod window;
/// The ids of the surfaces a flow envelope can carry: claims bind these,
/// never a string written elsewhere.
pub use pstack_envelope::surface_id::network_stream as surface_id;

pub use self::facts::*;
pub use self::netns_view::*;
pub use self::plan::*;
pub use self::readings::*;
use self::surface_id as sid;
pub use self::window::*;
use pstack_envelope::facts::{EbpfTcpCounts, Facts as _, socket as socket_facts};

use crate::Progress;
use crate::clock::monotonic_ns;
use crate::validation::{self, MAX_FLOWS, RequestError, TRANSPORT_WINDOW, invalid};
use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use crate::process::{CaptureError, LeakBudget, NetHelper, NetHelperFailure, SupervisorConfig};
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

pub use crate::process::SOURCE_COMMIT;

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
        let w = |ms| validation::window(ms, TRANSPORT_WINDOW);
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
