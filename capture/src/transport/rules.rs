//! The transport claim rules: a pure function from one flow's typed
//! readings (its two `tcp_info` dumps and their deltas, the eBPF view of its
//! cookie, the netns-wide counters, links, route, conntrack and CPU load) to
//! the claims and unknowns of its envelope.
//!
//! Invariants (the module doc of `transport` states them for the envelope):
//! - A rule reads only [`FlowReadings`]; it never looks at the host, the
//!   clock or the raw bytes, so the table test in this module can drive every
//!   rule with a reading set that produces it and a near miss that does not.
//! - Facts bind the surfaces that show them, and only surfaces that were read
//!   (`ok` or `truncated`); netns-wide facts say so (`netns_*`); CPU load
//!   only ever binds a hypothesis with its falsifier.
//! - `fault` is true when any fact of a fault was claimed: the caller makes
//!   the universal `no_fault_observed` only when it is false.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use pstack_collectors::net::sockdiag::{self, TcpSocket};
use pstack_envelope::{Claim, ClaimCode, ClaimKind, Completeness, Scope, Unknown};

use super::surface_id as sid;
use super::{
    CONNTRACK_PRESSURE_PPM, CPU_PSI_HYPOTHESIS_CENTI, EbpfFlow, FAULT_COUNTERS,
    LOCAL_ABORT_COUNTERS, NetnsView, full_size,
};

/// Everything the claim rules of one flow read.
pub struct FlowReadings<'a> {
    /// The flow's socket cookie.
    pub cookie: u64,
    /// The socket at window start, if it existed.
    pub start: Option<&'a TcpSocket>,
    /// The socket at window end, if it still existed.
    pub end: Option<&'a TcpSocket>,
    /// `tcp_info` deltas end − start, when both ends have it.
    pub deltas: Option<&'a BTreeMap<&'static str, i128>>,
    /// Ids of the surfaces that were read (`ok` or `truncated`).
    pub ok: &'a [String],
    /// Whether the end dump was read at all (a missing socket in a read
    /// dump means it was released; in an unread one, nothing).
    pub end_dump_read: bool,
    /// The eBPF view of this cookie (`None`: no eBPF window ran).
    pub ebpf: Option<&'a EbpfFlow>,
    /// Whether the envelope has an `ebpf/tcp` surface (read or not).
    pub ebpf_surface: bool,
    /// The netns-wide readings.
    pub view: &'a NetnsView,
    /// The netns inode.
    pub net_ns: u64,
    /// The window.
    pub window: Duration,
    /// CLOCK_MONOTONIC ns → RFC 3339 wall time.
    pub wall_at: &'a dyn Fn(u64) -> String,
}

impl std::fmt::Debug for FlowReadings<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FlowReadings")
            .field("cookie", &self.cookie)
            .field("ok", &self.ok)
            .finish_non_exhaustive()
    }
}

/// What the rules concluded for one flow.
#[derive(Debug)]
pub struct FlowClaims {
    /// Claims, ids `c1`, `c2`, … in rule order.
    pub claims: Vec<Claim>,
    /// Unknowns raised by the rules.
    pub unknowns: Vec<Unknown>,
    /// Whether a fault fact was claimed.
    pub fault: bool,
}

/// Apply every transport claim rule to one flow's readings.
pub fn flow_claims(r: &FlowReadings<'_>) -> FlowClaims {
    let (start, end, deltas, view, cookie) = (r.start, r.end, r.deltas, r.view, r.cookie);
    let ebpf_flow = r.ebpf;
    let mut claims: Vec<Claim> = Vec::new();
    let mut unknowns: Vec<Unknown> = Vec::new();
    let ok = |id: &str| r.ok.iter().any(|x| x == id);
    let mut add = |kind: ClaimKind,
                   code: ClaimCode,
                   statement: String,
                   binds: &[&str],
                   falsifier: Option<String>| {
        let n = claims.len() + 1;
        claims.push(Claim {
            id: format!("c{n}"),
            kind,
            code: code.into(),
            statement,
            surfaces: binds.iter().map(|x| x.to_string()).collect(),
            scope: Scope::Existential,
            falsifier,
        });
    };
    let id_sock = start.or(end).expect("a flow is seen at one end at least");
    let remote = id_sock.remote;
    let local = id_sock.local;
    let mut fault = false;
    let mut stalled_locally = false;
    let mut mtu_hypothesis = false;
    let d = |k: &str| deltas.as_ref().and_then(|d| d.get(k).copied()).unwrap_or(0);

    // Retransmits and RTOs on this flow.
    if deltas.is_some() && d("total_retrans") > 0 {
        fault = true;
        add(
            ClaimKind::Fact,
            ClaimCode::FlowRetransmits,
            format!(
                "flow {local} -> {remote} retransmitted {} segments in the window ({} bytes; {} RTO timeouts)",
                d("total_retrans"),
                d("bytes_retrans"),
                d("total_rto")
            ),
            &[sid::TCP_START, sid::TCP_END],
            None,
        );
    }
    if deltas.is_some() && d("total_rto") > 0 {
        fault = true;
        add(
            ClaimKind::Fact,
            ClaimCode::FlowRtoTimeouts,
            format!(
                "the retransmission timer fired {} times on this flow in the window",
                d("total_rto")
            ),
            &[sid::TCP_START, sid::TCP_END],
            None,
        );
    }
    // Zero window (sender side): the peer advertises 0 and the probe timer runs.
    if let Some(x) = end
        && ok(sid::TCP_END)
    {
        let snd_wnd = x.info.as_ref().and_then(|i| i.snd_wnd);
        let probe = x.timer == sockdiag::SocketTimer::ZeroWindowProbe;
        let probes = x.info.as_ref().map(|i| i.probes).unwrap_or(0);
        if snd_wnd == Some(0) {
            fault = true;
            add(
                ClaimKind::Fact,
                ClaimCode::PeerZeroWindow,
                format!(
                    "at window end the peer {remote} advertises a zero receive window; pending timer: {} ({probes} unanswered probes, {} bytes unacknowledged in the send queue)",
                    x.timer.as_str(),
                    x.wqueue
                ),
                &[sid::TCP_END],
                None,
            );
        } else if probe && x.wqueue > 0 {
            stalled_locally = true;
            // The probe timer also runs when the window is open but nothing can
            // leave this host (the device refused the segment: a local send
            // failure, which TCP does not count as a retransmit).
            fault = true;
            add(
                ClaimKind::Fact,
                ClaimCode::SendStalledLocally,
                format!(
                    "at window end {} bytes wait in the send queue to {remote} with the peer's window open ({} bytes) and no segment in flight: the probe timer is pending ({probes} probes), so segments are not leaving this host",
                    x.wqueue,
                    snd_wnd
                        .map(|w| w.to_string())
                        .unwrap_or_else(|| "unknown".into())
                ),
                &[sid::TCP_END],
                None,
            );
        }
        // Receiver side: this end's own window is closed (application not reading).
        if x.info.as_ref().and_then(|i| i.rcv_wnd) == Some(0) {
            fault = true;
            add(
                ClaimKind::Fact,
                ClaimCode::LocalZeroWindow,
                format!(
                    "this end advertises a zero receive window to {remote}: {} bytes unread in its receive queue",
                    x.rqueue
                ),
                &[sid::TCP_END],
                None,
            );
        }
    }
    // Left ESTABLISHED during the window. "Released" needs an end dump
    // that was read and lacks the socket: a failed or timed-out end
    // sample says nothing about it.
    let state_end = end.map(|x| x.state);
    if let Some(a) = start
        && a.state == 1
        && ok(sid::TCP_START)
        && state_end != Some(1)
        && (state_end.is_some() || r.end_dump_read)
    {
        fault = true;
        let (what, binds): (String, Vec<&str>) = match state_end {
            Some(st) => (
                format!("is in {} at window end", sockdiag::state_name(st)),
                vec![sid::TCP_START, sid::TCP_END],
            ),
            None => (
                "was released before window end".into(),
                vec![sid::TCP_START],
            ),
        };
        add(
            ClaimKind::Fact,
            ClaimCode::FlowLeftEstablished,
            format!("flow {local} -> {remote} was ESTABLISHED at window start and {what}"),
            &binds,
            None,
        );
        // Who reset it: eBPF fact, else inference from counters, plus an unknown.
        match ebpf_flow {
            Some(f) if f.resets_received > 0 => add(
                ClaimKind::Fact,
                ClaimCode::RstReceivedFromPeer,
                format!(
                    "RST received from {remote} (the remote endpoint sent it) on flow cookie {cookie} at {}",
                    f.resets
                        .iter()
                        .find(|x| x.0 == "received")
                        .map(|x| format!("{} (monotonic {} ns)", (r.wall_at)(x.1), x.1))
                        .unwrap_or_else(|| format!(
                            "monotonic {} ns or earlier (event not in the sample)",
                            f.last_ns
                        ))
                ),
                &[sid::EBPF_TCP],
                None,
            ),
            Some(f) if f.resets_sent > 0 => add(
                ClaimKind::Fact,
                ClaimCode::RstSentByLocal,
                format!(
                    "this host ({local}) sent a RST to {remote} on flow cookie {cookie} (reason {})",
                    f.last_reset_reason
                        .clone()
                        .unwrap_or_else(|| "unknown".into())
                ),
                &[sid::EBPF_TCP],
                None,
            ),
            _ => {
                let c = |k: &str| view.counter_delta.get(k).copied().unwrap_or(0);
                let estab = c("Tcp.EstabResets");
                // A local abort sends its RST through tcp_send_active_reset and
                // counts a TCPAbortOn*; a RST for a segment to a dead socket counts
                // only OutRsts. So: closures by RST with no local abort were resets
                // received from the remote side.
                let aborts: i128 = LOCAL_ABORT_COUNTERS.iter().map(|k| c(k)).sum();
                if ok(sid::NETSTAT) && estab > 0 && aborts == 0 && state_end.is_none_or(|s| s == 7)
                {
                    add(
                        ClaimKind::Inference,
                        ClaimCode::ResetByPeerInferred,
                        format!(
                            "the flow was reset from the remote side ({remote}): it went from ESTABLISHED to CLOSE while Tcp.EstabResets rose by {estab} and no local abort was counted (TCPAbortOn* +0; Tcp.OutRsts +{})",
                            c("Tcp.OutRsts")
                        ),
                        &[sid::TCP_START, sid::NETSTAT],
                        None,
                    );
                }
                if ebpf_flow.is_none() {
                    unknowns.push(Unknown {
                        id: format!("u{}", unknowns.len() + 1),
                        question: format!("which endpoint sent the RST that ended flow {local} -> {remote}?"),
                        blocks: "ATTRIBUTE_RESET".into(),
                        owner: "node operator".into(),
                        probe: format!(
                            "{} during the next failure (or: bpftrace -e 'tracepoint:tcp:tcp_receive_reset, tracepoint:tcp:tcp_send_reset {{ printf(\"%s %d\\n\", probe, args->dport); }}')",
                            crate::probes::trace_tcp_addr(remote.ip())
                        ),
                        surface: r.ebpf_surface.then(|| sid::EBPF_TCP.to_string()),
                    });
                }
            }
        }
    } else if let Some(f) = ebpf_flow {
        if f.resets_received > 0 {
            fault = true;
            add(
                ClaimKind::Fact,
                ClaimCode::RstReceivedFromPeer,
                format!("RST received from {remote} on flow cookie {cookie}"),
                &[sid::EBPF_TCP],
                None,
            );
        }
        if f.resets_sent > 0 {
            fault = true;
            add(
                ClaimKind::Fact,
                ClaimCode::RstSentByLocal,
                format!("this host ({local}) sent a RST to {remote} on flow cookie {cookie}"),
                &[sid::EBPF_TCP],
                None,
            );
        }
    }

    // Netns-wide counters that moved (scoped to the netns, not this flow).
    if ok(sid::NETSTAT) {
        let moved: Vec<String> = FAULT_COUNTERS
            .iter()
            .filter_map(|k| {
                view.counter_delta
                    .get(*k)
                    .filter(|v| **v > 0)
                    .map(|v| format!("{k} +{v}"))
            })
            .collect();
        if !moved.is_empty() {
            fault = true;
            add(
                ClaimKind::Fact,
                ClaimCode::NetnsTcpFaultCountersMoved,
                format!(
                    "in netns {} (all flows, not only this one): {}",
                    r.net_ns,
                    moved.join(", ")
                ),
                &[sid::NETSTAT],
                None,
            );
        }
    }

    // MTU / PMTU.
    let mut mtus: Vec<(String, u32)> = Vec::new();
    if let (Some(n), Some(m)) = (&view.link_name, view.link_mtu) {
        mtus.push((format!("egress {n}"), m));
    }
    if let (Some(n), Some(m)) = (&view.peer_name, view.peer_mtu) {
        mtus.push((format!("veth peer {n}"), m));
    }
    if let Some(p) = view.route_pmtu {
        mtus.push(("route cached PMTU".into(), p));
    }
    if let Some(p) = end
        .or(start)
        .and_then(|x| x.info.as_ref())
        .map(|i| i.pmtu)
        .filter(|p| *p > 0)
    {
        mtus.push(("socket pmtu".into(), p));
    }
    // An IP packet cannot exceed 65535 bytes: a 65536-byte loopback MTU and a
    // 65535 socket PMTU agree.
    let min_mtu = mtus.iter().map(|(_, m)| (*m).min(65535)).min();
    let max_mtu = mtus.iter().map(|(_, m)| (*m).min(65535)).max();
    let mut mtu_binds: Vec<&str> = Vec::new();
    for id in [sid::LINK, sid::LINK_PEER, sid::ROUTE, sid::TCP_END] {
        if ok(id) {
            mtu_binds.push(id);
        }
    }
    if let (Some(lo), Some(hi)) = (min_mtu, max_mtu)
        && lo != hi
        && !mtu_binds.is_empty()
    {
        fault = true;
        let listing = mtus
            .iter()
            .map(|(n, m)| format!("{n} {m}"))
            .collect::<Vec<_>>()
            .join(", ");
        add(
            ClaimKind::Fact,
            ClaimCode::MtuMismatch,
            format!("MTUs on the path disagree: {listing}"),
            &mtu_binds,
            None,
        );
        let (mss, wire) = full_size(end.or(start), remote);
        if wire > lo {
            mtu_hypothesis = true;
            let stalled = (deltas.is_some() && d("total_retrans") > 0) || stalled_locally;
            add(
                ClaimKind::Hypothesis,
                ClaimCode::PmtuBlackHole,
                format!(
                    "full-size segments ({wire} bytes on the wire, {mss} bytes of payload) exceed the smallest MTU on the path ({lo}) and no PMTU was learned{}: they are dropped silently (ICMP fragmentation-needed not delivered)",
                    if stalled {
                        "; the flow is retransmitting or stalled"
                    } else {
                        ""
                    }
                ),
                &mtu_binds,
                Some(format!(
                    "full-size segments are acknowledged: tcp_info bytes_acked advances by more than {mss} bytes per segment while snd_mss stays {mss}, or the route to {} shows a cached PMTU of {lo} or less",
                    remote.ip()
                )),
            );
        }
    }

    // A stall: nothing acknowledged in the whole window while data waits.
    let pending = end.map(|x| x.wqueue).unwrap_or(0);
    let stalled = deltas.is_some()
        && d("bytes_acked") == 0
        && pending > 0
        && start.is_some_and(|x| x.state == 1)
        && state_end == Some(1);
    if stalled {
        fault = true;
        add(
            ClaimKind::Fact,
            ClaimCode::FlowStalled,
            format!(
                "flow {local} -> {remote} had 0 bytes acknowledged over the {} ms window while {pending} bytes waited in its send queue",
                r.window.as_millis()
            ),
            &[sid::TCP_START, sid::TCP_END],
            None,
        );
    }
    // Stalled in RTO with full-size segments and no MTU disagreement visible
    // here: a smaller MTU beyond the first hop whose ICMP never arrives looks
    // exactly like this.
    if stalled && !mtu_hypothesis && d("total_rto") > 0 {
        let (mss, wire) = full_size(end, remote);
        if wire > 1280 {
            add(
                ClaimKind::Hypothesis,
                ClaimCode::PmtuBlackHole,
                format!(
                    "the flow is stalled in retransmission timeouts (RTO fired {} times, 0 bytes acknowledged) sending full-size segments of {} bytes, and no MTU disagreement is visible from this host: a smaller MTU beyond the first hop whose ICMP fragmentation-needed never arrives would do this",
                    d("total_rto"),
                    wire
                ),
                &[sid::TCP_START, sid::TCP_END],
                Some(format!(
                    "full-size segments are acknowledged: `ping -M do -s {} {}` from this namespace is answered, or bytes_acked advances while snd_mss stays {mss}",
                    wire - if remote.is_ipv4() { 28 } else { 48 },
                    remote.ip()
                )),
            );
        }
    }

    // Link drops.
    if !view.link_drops.is_empty() {
        fault = true;
        let listing = view
            .link_drops
            .iter()
            .map(|(n, d)| format!("{n} +{d}"))
            .collect::<Vec<_>>()
            .join(", ");
        let binds: Vec<&str> = [sid::LINK, sid::LINK_PEER]
            .into_iter()
            .filter(|id| ok(id))
            .collect();
        add(
            ClaimKind::Fact,
            ClaimCode::LinkDrops,
            format!("interface drops/errors in the window: {listing}"),
            &binds,
            None,
        );
    }

    // Conntrack pressure.
    if let Some((count, max, ppm, sd)) = &view.conntrack {
        let dropped: i128 = ["drop", "early_drop", "insert_failed"]
            .iter()
            .filter_map(|k| sd.get(*k))
            .sum();
        if *ppm >= CONNTRACK_PRESSURE_PPM || dropped > 0 {
            fault = true;
            add(
                ClaimKind::Fact,
                ClaimCode::ConntrackPressure,
                format!(
                    "conntrack table in netns {} holds {count} of {max} entries ({}.{}%); drop+early_drop+insert_failed +{dropped} in the window",
                    r.net_ns,
                    ppm / 10_000,
                    ppm % 10_000 / 1000
                ),
                &[sid::CONNTRACK],
                None,
            );
        }
    }

    // CPU: hypothesis only.
    if let Some(l) = &view.load {
        let psi = l.psi_some_avg10_centi.unwrap_or(0);
        if psi >= CPU_PSI_HYPOTHESIS_CENTI || l.procs_running > 2 * l.cpus {
            add(
                ClaimKind::Hypothesis,
                ClaimCode::CpuStarvation,
                format!(
                    "CPU contention (PSI some avg10 {}.{:02}%, {} runnable on {} CPUs) delays the endpoints' processing of this flow",
                    psi / 100,
                    psi % 100,
                    l.procs_running,
                    l.cpus
                ),
                &[sid::HOST_CPU],
                Some("the flow's stall recurs while /proc/pressure/cpu some avg10 stays below 1%, or tcp_info shows the peer's window or the network (retransmits), not the application, limiting it".into()),
            );
        }
    }
    FlowClaims {
        claims,
        unknowns,
        fault,
    }
}

/// The universal `no_fault_observed`: made only when the rules claimed no
/// fault and nothing but hypotheses, in a `complete` envelope; it binds
/// every surface of the flow but CPU load (`binds`).
pub fn no_fault_claim(
    claims: &[Claim],
    fault: bool,
    completeness: Completeness,
    binds: Vec<String>,
    window: Duration,
    (local, remote): (SocketAddr, SocketAddr),
) -> Option<Claim> {
    let only_hypotheses = claims.iter().all(|c| c.kind == ClaimKind::Hypothesis);
    if fault || !only_hypotheses || completeness != Completeness::Complete {
        return None;
    }
    Some(Claim {
        id: format!("c{}", claims.len() + 1),
        kind: ClaimKind::Fact,
        code: ClaimCode::NoFaultObserved.into(),
        statement: format!(
            "over the {} ms window: no retransmit, RTO, reset, zero window, state change, MTU disagreement, interface drop, fault-counter movement or conntrack pressure on flow {local} -> {remote}",
            window.as_millis()
        ),
        surfaces: binds,
        scope: Scope::Universal,
        falsifier: None,
    })
}

#[cfg(test)]
mod tests {
    //! The claim-rule table: for every code, one reading set that must
    //! produce it and a near miss (one reading changed) that must not. No
    //! root, no kernel: readings are built here.

    use super::*;
    use pstack_collectors::net::TcpInfo;
    use pstack_collectors::net::load::LoadFacts;
    use pstack_collectors::net::sockdiag::SocketTimer;

    /// Owned readings of one flow, healthy until a fixture changes them.
    #[derive(Clone)]
    struct Fixture {
        start: Option<TcpSocket>,
        end: Option<TcpSocket>,
        deltas: BTreeMap<&'static str, i128>,
        ok: Vec<String>,
        end_dump_read: bool,
        ebpf: Option<EbpfFlow>,
        view: NetnsView,
    }

    fn socket(state: u8) -> TcpSocket {
        TcpSocket {
            local: "10.77.0.1:40000".parse().unwrap(),
            remote: "10.77.0.2:10001".parse().unwrap(),
            state,
            cookie: 7,
            inode: 1234,
            uid: 0,
            bound_if: 0,
            timer: SocketTimer::None,
            timer_expires_ms: 0,
            timer_retrans: 0,
            rqueue: 0,
            wqueue: 0,
            info: Some(TcpInfo {
                snd_wnd: Some(65535),
                rcv_wnd: Some(65535),
                snd_mss: 1448,
                pmtu: 1500,
                ..TcpInfo::default()
            }),
            mem: None,
            congestion: None,
            shutdown: None,
        }
    }

    fn healthy() -> Fixture {
        let mut view = NetnsView {
            link_mtu: Some(1500),
            link_name: Some("veth-a".into()),
            peer_mtu: Some(1500),
            peer_name: Some("veth-b".into()),
            conntrack: Some((10, 1000, 10_000, BTreeMap::new())),
            load: Some(LoadFacts {
                procs_running: 1,
                cpus: 4,
                psi_some_avg10_centi: Some(0),
                ..LoadFacts::default()
            }),
            ..NetnsView::default()
        };
        view.counter_delta.insert("Tcp.InSegs".into(), 100);
        Fixture {
            start: Some(socket(1)),
            end: Some(socket(1)),
            deltas: [
                ("total_retrans", 0),
                ("total_rto", 0),
                ("bytes_acked", 100_000),
                ("bytes_retrans", 0),
            ]
            .into_iter()
            .collect(),
            ok: [
                sid::TCP_START,
                sid::TCP_END,
                sid::NETSTAT,
                sid::LINK,
                sid::LINK_PEER,
                sid::ROUTE,
                sid::CONNTRACK,
                sid::HOST_CPU,
                sid::EBPF_TCP,
            ]
            .iter()
            .map(|s| s.to_string())
            .collect(),
            end_dump_read: true,
            ebpf: Some(EbpfFlow {
                cookie: 7,
                ..EbpfFlow::default()
            }),
            view,
        }
    }

    impl Fixture {
        fn claims(&self) -> FlowClaims {
            let wall = |ns: u64| format!("wall@{ns}");
            flow_claims(&FlowReadings {
                cookie: 7,
                start: self.start.as_ref(),
                end: self.end.as_ref(),
                deltas: Some(&self.deltas),
                ok: &self.ok,
                end_dump_read: self.end_dump_read,
                ebpf: self.ebpf.as_ref(),
                ebpf_surface: self.ebpf.is_some(),
                view: &self.view,
                net_ns: 4026531840,
                window: Duration::from_secs(2),
                wall_at: &wall,
            })
        }
        fn codes(&self) -> Vec<String> {
            self.claims().claims.into_iter().map(|c| c.code).collect()
        }
        fn end(&mut self) -> &mut TcpSocket {
            self.end.as_mut().unwrap()
        }
        fn end_info(&mut self) -> &mut TcpInfo {
            self.end().info.as_mut().unwrap()
        }
        fn not_read(mut self, id: &str) -> Fixture {
            self.ok.retain(|x| x != id);
            self
        }
    }

    fn with(f: impl FnOnce(&mut Fixture)) -> Fixture {
        let mut x = healthy();
        f(&mut x);
        x
    }

    /// For a code the rules claim: a reading set that produces it and a near
    /// miss that does not. The match is exhaustive: a new or renamed code is
    /// a build error here until it has a row or is named as no rule's.
    fn row(code: ClaimCode) -> Option<(Fixture, Fixture)> {
        let reset = |received: u64, sent: u64| {
            with(move |x| {
                x.end().state = 7;
                let e = x.ebpf.as_mut().unwrap();
                e.resets_received = received;
                e.resets_sent = sent;
            })
        };
        let released_by_rst = |aborts: i128| {
            with(move |x| {
                x.end = None;
                x.ebpf = None;
                x.ok.retain(|s| s != sid::EBPF_TCP);
                x.view.counter_delta.insert("Tcp.EstabResets".into(), 1);
                x.view
                    .counter_delta
                    .insert("TcpExt.TCPAbortOnData".into(), aborts);
            })
        };
        let mtus = |peer: u32, mss: u32| {
            with(move |x| {
                x.view.peer_mtu = Some(peer);
                x.end_info().snd_mss = mss;
                x.end_info().pmtu = 0;
            })
        };
        let stalled = |acked: i128| {
            with(move |x| {
                x.deltas.insert("bytes_acked", acked);
                x.end().wqueue = 4096;
            })
        };
        Some(match code {
            ClaimCode::FlowRetransmits => {
                (with(|x| _ = x.deltas.insert("total_retrans", 3)), healthy())
            }
            ClaimCode::FlowRtoTimeouts => (
                with(|x| _ = x.deltas.insert("total_rto", 1)),
                with(|x| _ = x.deltas.insert("total_retrans", 3)),
            ),
            ClaimCode::PeerZeroWindow => (
                with(|x| x.end_info().snd_wnd = Some(0)),
                with(|x| x.end_info().snd_wnd = Some(1)),
            ),
            ClaimCode::SendStalledLocally => (
                with(|x| {
                    x.end().timer = SocketTimer::ZeroWindowProbe;
                    x.end().wqueue = 4096;
                }),
                // The probe timer with nothing queued is not a stall.
                with(|x| x.end().timer = SocketTimer::ZeroWindowProbe),
            ),
            ClaimCode::LocalZeroWindow => (
                with(|x| {
                    x.end_info().rcv_wnd = Some(0);
                    x.end().rqueue = 65536;
                }),
                // The same socket, but tcp/end was not read: no fact.
                with(|x| x.end_info().rcv_wnd = Some(0)).not_read(sid::TCP_END),
            ),
            ClaimCode::FlowLeftEstablished => (
                with(|x| x.end().state = 7),
                // Gone at window end, but the end dump was never read.
                with(|x| {
                    x.end = None;
                    x.end_dump_read = false;
                }),
            ),
            ClaimCode::RstReceivedFromPeer => (reset(1, 0), reset(0, 1)),
            ClaimCode::RstSentByLocal => (reset(0, 1), reset(1, 0)),
            ClaimCode::ResetByPeerInferred => (
                released_by_rst(0),
                // A local abort was counted: the RST may be this host's.
                released_by_rst(1),
            ),
            ClaimCode::NetnsTcpFaultCountersMoved => (
                with(|x| {
                    _ = x
                        .view
                        .counter_delta
                        .insert("TcpExt.ListenOverflows".into(), 2)
                }),
                with(|x| {
                    _ = x
                        .view
                        .counter_delta
                        .insert("TcpExt.ListenOverflows".into(), 2)
                })
                .not_read(sid::NETSTAT),
            ),
            ClaimCode::MtuMismatch => (mtus(1400, 1448), healthy()),
            ClaimCode::PmtuBlackHole => (
                mtus(1400, 1448),
                // The MTUs disagree but full-size segments fit the smallest.
                mtus(1400, 1300),
            ),
            ClaimCode::FlowStalled => (stalled(0), stalled(1)),
            ClaimCode::LinkDrops => (
                with(|x| x.view.link_drops = vec![("veth-a".into(), 3)]),
                healthy(),
            ),
            ClaimCode::ConntrackPressure => (
                with(|x| x.view.conntrack = Some((950, 1000, 950_000, BTreeMap::new()))),
                with(|x| x.view.conntrack = Some((899, 1000, 899_999, BTreeMap::new()))),
            ),
            ClaimCode::CpuStarvation => (
                with(|x| x.view.load.as_mut().unwrap().psi_some_avg10_centi = Some(1000)),
                with(|x| x.view.load.as_mut().unwrap().psi_some_avg10_centi = Some(999)),
            ),
            // Not claimed by `flow_claims` (the universal `no_fault_observed` and
            // `no_matching_flow` are the envelope's; the rest are other engines').
            ClaimCode::ThreadsInStateRunning
            | ClaimCode::ThreadsInStateSleeping
            | ClaimCode::ThreadsInStateUninterruptible
            | ClaimCode::ThreadsInStateZombie
            | ClaimCode::ThreadsInStateStopped
            | ClaimCode::ThreadsInStateTracingStop
            | ClaimCode::ThreadsInStateDead
            | ClaimCode::ThreadsInStateIdle
            | ClaimCode::ThreadsInStateParked
            | ClaimCode::ThreadInDState
            | ClaimCode::FuseServerNotAnswering
            | ClaimCode::CgroupFrozen
            | ClaimCode::DStateFromCgroupFreezer
            | ClaimCode::NoThreadInDState
            | ClaimCode::OffcpuTimeInWindow
            | ClaimCode::DStateEpisode
            | ClaimCode::NoDStateEpisodeInWindow
            | ClaimCode::ThreadStateCounts
            | ClaimCode::TcpRetransmitsObserved
            | ClaimCode::TcpResetSender
            | ClaimCode::NoFaultObserved
            | ClaimCode::NoMatchingFlow
            | ClaimCode::LonghornShortLivedStreams
            | ClaimCode::NoStreamLinked
            | ClaimCode::StreamsLinked
            | ClaimCode::LonghornFlowsExcluded
            | ClaimCode::LonghornTopologyResolved
            | ClaimCode::LonghornFlowsSelectedOn
            | ClaimCode::LonghornFlagMismatch
            | ClaimCode::LonghornIdentityChanged
            | ClaimCode::LonghornManagerReportsRebuild
            | ClaimCode::LonghornErrorNamesStream
            | ClaimCode::LonghornErrorNamesUnlinkedConnection
            | ClaimCode::LonghornSettingsBoundFailures
            | ClaimCode::LonghornEngineEvent
            | ClaimCode::LonghornErrorNamesShortLivedFlow
            | ClaimCode::LonghornRebuildFailed
            | ClaimCode::LonghornRebuildComplete
            | ClaimCode::LonghornRebuildRemoved
            | ClaimCode::LonghornRebuildUnresolved
            | ClaimCode::LonghornRebuildRetries
            | ClaimCode::LonghornRebuildSources
            | ClaimCode::LonghornRebuildEntryGone
            | ClaimCode::LonghornFailedRebuildingEvent
            | ClaimCode::KubernetesEventsWithoutFailedRebuilding
            | ClaimCode::ControlChannelUserTimeoutBelowKeepaliveRetry
            | ClaimCode::ControlChannelKeepaliveNotHazardous
            | ClaimCode::ControlChannelClientSide
            | ClaimCode::HubbleReportsDrops
            | ClaimCode::HubbleReportsNoDrops => return None,
        })
    }

    #[test]
    fn every_claim_code_has_a_reading_set_that_produces_it_and_a_near_miss_that_does_not() {
        let mut rows = 0;
        for &code in ClaimCode::ALL {
            let Some((hit, miss)) = row(code) else {
                continue;
            };
            rows += 1;
            let got = hit.claims();
            let codes: Vec<&str> = got.claims.iter().map(|c| c.code.as_str()).collect();
            assert!(
                codes.contains(&code.as_str()),
                "{code}: not produced; got {codes:?}"
            );
            assert!(
                !miss.codes().iter().any(|c| *c == code),
                "{code}: the near miss produced it too: {:?}",
                miss.codes()
            );
            for c in got.claims.iter().chain(&miss.claims().claims) {
                // Every code a rule claims has a row of its own.
                assert!(
                    c.claim_code().and_then(row).is_some(),
                    "rule code {:?} has no table row",
                    c.code
                );
            }
            for c in &got.claims {
                assert!(
                    c.surfaces.iter().all(|s| hit.ok.contains(s)),
                    "{code}: claim {} binds a surface that was not read: {:?}",
                    c.code,
                    c.surfaces
                );
                assert_eq!(
                    c.kind == ClaimKind::Hypothesis,
                    c.falsifier.is_some(),
                    "{}: a hypothesis and only a hypothesis carries a falsifier",
                    c.code
                );
            }
        }
        assert_eq!(rows, 16, "transport rule codes with a row");
    }

    #[test]
    fn healthy_readings_claim_no_fault() {
        let got = healthy().claims();
        assert!(!got.fault);
        assert!(got.claims.is_empty(), "{:?}", got.claims);
        assert!(got.unknowns.is_empty());
    }

    #[test]
    fn no_fault_observed_only_without_a_fault_fact_in_a_complete_envelope() {
        let ends = (
            "10.77.0.1:40000".parse().unwrap(),
            "10.77.0.2:10001".parse().unwrap(),
        );
        let claim = |x: &Fixture, c: Completeness| {
            let got = x.claims();
            no_fault_claim(
                &got.claims,
                got.fault,
                c,
                x.ok.clone(),
                Duration::from_secs(2),
                ends,
            )
            .map(|c| (c.code, c.scope))
        };
        assert_eq!(
            claim(&healthy(), Completeness::Complete),
            Some((ClaimCode::NoFaultObserved.into(), Scope::Universal))
        );
        // Near misses: not complete; a fault fact; (a hypothesis alone is no fault).
        assert_eq!(claim(&healthy(), Completeness::Partial), None);
        assert_eq!(claim(&healthy(), Completeness::Bounded), None);
        let retrans = with(|x| _ = x.deltas.insert("total_retrans", 1));
        assert_eq!(claim(&retrans, Completeness::Complete), None);
        let cpu = with(|x| x.view.load.as_mut().unwrap().psi_some_avg10_centi = Some(5000));
        assert!(claim(&cpu, Completeness::Complete).is_some());
    }

    #[test]
    fn cpu_load_binds_only_a_hypothesis() {
        let got = with(|x| x.view.load.as_mut().unwrap().procs_running = 9).claims();
        let c = got
            .claims
            .iter()
            .find(|c| c.code == ClaimCode::CpuStarvation)
            .unwrap();
        assert_eq!(c.kind, ClaimKind::Hypothesis);
        assert_eq!(c.surfaces, [sid::HOST_CPU]);
        assert!(!got.fault, "a hypothesis is not a fault");
    }
}
