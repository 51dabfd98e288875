//! Bounded aggregation of decoded records over one capture window.
//!
//! Pure: records in, summaries out; no kernel, no clock. Memory is bounded by
//! [`Limits`] whatever the event rate: at most `max_flows` flows (events for
//! flows beyond the cap are still counted, and counted again as `untracked`,
//! which makes the surface `truncated`), at most `max_samples` raw events kept
//! per surface (the rest are counted, `sample_truncated`), at most
//! `max_transitions_per_flow` transitions per flow. Counts are exact even when
//! summaries are capped.
//!
//! Two inputs, one summary. **Per-event** (the debug mode): every event is a
//! record and is folded here. **Aggregated** (the recording mode): the kernel
//! folds events into per-socket flows and sends only flow records (a flow that
//! reached CLOSE, and the live flows read from its map at window end), rare
//! records (resets, a flow leaving ESTABLISHED, a flow's first retransmit), a
//! uniform sample of the rest, and the events no kernel flow took (`UNAGG`).
//! Invariants in that mode: each kernel flow becomes exactly one [`Flow`]
//! (never merged with another), rare and sampled records are kept as evidence
//! but never counted a second time, `UNAGG` records are counted exactly once;
//! after [`TcpAggregate::finish_kernel`] every event the programs saw is
//! either in a flow's counts or in `untracked` (map evicted or full, a flow
//! record lost), and rare records are capped apart from the sample, so the
//! sample's cap can never hide a reset.
//!
//! Flows are joined by the socket (an opaque in-host key from the kernel; a
//! client socket has port 0 in its first `CLOSE -> SYN_SENT` transition) and,
//! for events without a socket (a RST answering a SYN to a closed port), by
//! `(netns, local, remote)`. A state change on a socket whose flow reached
//! `CLOSE` opens a new flow (the socket reconnected, or its memory now holds
//! another socket); a reset after `CLOSE` stays on the flow.

use std::collections::HashMap;

use sha2::{Digest, Sha256};

use crate::flow_record::{TCP_FLOW_SIZE, TcpFlowRecord};
use crate::record::{
    Endpoint, RecordError, TCP_RARE, TCP_UNAGG, TcpEvent, TcpEventKind, TcpSockState, TcpState,
};

/// Caps in force for one window. Each trades memory for detail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Most flows summarized (default 1024; more are counted as untracked).
    pub max_flows: usize,
    /// Most raw events kept per surface (default 256).
    pub max_samples: usize,
    /// Most state transitions kept per flow (default 16).
    pub max_transitions_per_flow: usize,
    /// Most tasks listed in the off-CPU surface (default 512).
    pub max_tasks: usize,
    /// Most D-state episodes kept (default 256).
    pub max_episodes: usize,
    /// Most rare records (resets, flows leaving ESTABLISHED, first
    /// retransmits) kept per surface in the aggregated mode (default 4096;
    /// apart from `max_samples`, so the sample never crowds them out).
    pub max_rare: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_flows: 1024,
            max_samples: 256,
            max_transitions_per_flow: 16,
            max_tasks: 512,
            max_episodes: 256,
            max_rare: 4096,
        }
    }
}

/// Which surface a TCP event kind feeds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TcpSurface {
    /// `ebpf:tcp_retransmits`.
    Retransmits,
    /// `ebpf:tcp_resets`.
    Resets,
    /// `ebpf:tcp_lifecycle`.
    Lifecycle,
}

impl TcpSurface {
    /// Every TCP surface.
    pub const ALL: [TcpSurface; 3] = [
        TcpSurface::Retransmits,
        TcpSurface::Resets,
        TcpSurface::Lifecycle,
    ];

    /// The surface id.
    pub fn id(self) -> &'static str {
        match self {
            TcpSurface::Retransmits => "ebpf:tcp_retransmits",
            TcpSurface::Resets => "ebpf:tcp_resets",
            TcpSurface::Lifecycle => "ebpf:tcp_lifecycle",
        }
    }

    /// The surface an event kind feeds.
    pub fn of(kind: TcpEventKind) -> TcpSurface {
        match kind {
            TcpEventKind::Retransmit => TcpSurface::Retransmits,
            TcpEventKind::ReceiveReset | TcpEventKind::SendReset => TcpSurface::Resets,
            TcpEventKind::StateChange => TcpSurface::Lifecycle,
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// SHA-256 and length of the raw records a surface was built from.
#[derive(Debug, Clone, Default)]
pub struct RawDigest {
    hasher: Sha256,
    /// Raw bytes consumed.
    pub bytes: u64,
}

impl RawDigest {
    /// Feed one raw record.
    pub fn update(&mut self, raw: &[u8]) {
        self.hasher.update(raw);
        self.bytes += raw.len() as u64;
    }

    /// `sha256:<hex>` of everything fed, or `None` when nothing was.
    pub fn digest(&self) -> Option<String> {
        (self.bytes > 0).then(|| format!("sha256:{}", hex::encode(self.hasher.clone().finalize())))
    }
}

/// One state transition of a flow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transition {
    /// CLOCK_MONOTONIC ns.
    pub ts_ns: u64,
    /// Old state.
    pub from: TcpState,
    /// New state.
    pub to: TcpState,
}

/// A reset seen on a flow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResetDirection {
    /// This host sent the RST (`local` is its sender).
    Sent,
    /// This socket received the RST (`remote` is its sender).
    Received,
}

impl ResetDirection {
    /// Wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            ResetDirection::Sent => "sent",
            ResetDirection::Received => "received",
        }
    }
}

/// Everything seen on one flow (one socket lifetime, or one sockless tuple).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Flow {
    /// Local endpoint (latest complete one seen).
    pub local: Endpoint,
    /// Remote endpoint.
    pub remote: Endpoint,
    /// Netns inode, when known.
    pub netns_ino: Option<u32>,
    /// Netns cookie, when known.
    pub netns_cookie: Option<u64>,
    /// Socket cookie, when the kernel had generated one.
    pub sock_cookie: Option<u64>,
    /// The flow's events carried a socket.
    pub has_sock: bool,
    /// Retransmits.
    pub retransmits: u64,
    /// Retransmits in `TCP_CA_Loss` (the RTO timer fired).
    pub rtos: u64,
    /// Retransmits in `TCP_CA_Recovery` (fast retransmit).
    pub fast_retransmits: u64,
    /// Retransmits in Open/Disorder/CWR (tail loss probes among them).
    pub other_retransmits: u64,
    /// `tcp_sock.bytes_acked` at CLOSE (aggregated mode; a flow still open
    /// at window end has none).
    pub bytes_acked: Option<u64>,
    /// `tcp_sock.bytes_received` at CLOSE.
    pub bytes_received: Option<u64>,
    /// The counts come from the kernel's aggregate (aggregated mode).
    pub kernel_aggregate: bool,
    /// RSTs this host sent on it.
    pub resets_sent: u64,
    /// RSTs this socket received.
    pub resets_received: u64,
    /// Last send-reset reason (kernel name).
    pub last_reset_reason: Option<i32>,
    /// State changes seen (all of them are counted here).
    pub state_changes: u64,
    /// First and last event, CLOCK_MONOTONIC ns.
    pub first_ns: u64,
    /// Last event.
    pub last_ns: u64,
    /// Transitions kept (capped).
    pub transitions: Vec<Transition>,
    /// Transitions beyond the cap.
    pub transitions_dropped: u64,
    closed: bool,
    tuple_indexed: bool,
}

impl Flow {
    fn new(e: &TcpEvent) -> Flow {
        Flow {
            local: e.local,
            remote: e.remote,
            netns_ino: e.netns_ino,
            netns_cookie: e.netns_cookie,
            sock_cookie: e.sock_cookie,
            has_sock: e.has_sock,
            retransmits: 0,
            rtos: 0,
            fast_retransmits: 0,
            other_retransmits: 0,
            bytes_acked: None,
            bytes_received: None,
            kernel_aggregate: false,
            resets_sent: 0,
            resets_received: 0,
            last_reset_reason: None,
            state_changes: 0,
            first_ns: e.ts_ns,
            last_ns: e.ts_ns,
            transitions: Vec::new(),
            transitions_dropped: 0,
            closed: false,
            tuple_indexed: false,
        }
    }

    /// Whether the flow saw an event of this surface.
    pub fn feeds(&self, s: TcpSurface) -> bool {
        match s {
            TcpSurface::Retransmits => self.retransmits > 0,
            TcpSurface::Resets => self.resets_sent + self.resets_received > 0,
            TcpSurface::Lifecycle => self.state_changes > 0,
        }
    }

    /// Whether both endpoints' ports are known.
    fn complete(e: &TcpEvent) -> bool {
        e.local.port != 0 && e.remote.port != 0
    }
}

type TupleKey = (Option<u32>, Endpoint, Endpoint);

/// A multiplicative hasher for socket keys (kernel addresses: distinct, not
/// attacker-chosen), cheaper per event than SipHash.
#[derive(Debug, Default, Clone, Copy)]
struct SockKeyHasher(u64);

impl std::hash::Hasher for SockKeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 =
                (self.0.rotate_left(5) ^ u64::from(*b)).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0.rotate_left(5) ^ v).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

type SockMap = HashMap<u64, usize, std::hash::BuildHasherDefault<SockKeyHasher>>;

/// Per-window TCP aggregation, bounded by [`Limits`].
#[derive(Debug, Clone)]
pub struct TcpAggregate {
    limits: Limits,
    flows: Vec<Flow>,
    by_sock: SockMap,
    by_tuple: HashMap<TupleKey, usize>,
    /// Events per kind (exact), index = `TcpEventKind::ALL` order.
    pub seen: [u64; 4],
    /// Events per surface that could not be attributed to a flow (cap).
    pub untracked: [u64; 3],
    /// Raw events kept per surface.
    pub samples: [Vec<TcpEvent>; 3],
    /// Events per surface not kept in the sample.
    pub samples_dropped: [u64; 3],
    /// Raw digest per surface.
    pub raw: [RawDigest; 3],
    /// Records that failed to decode.
    pub undecodable: u64,
    /// Records the address filter refused.
    pub filtered_out: u64,
    /// `LAYOUT_*` bits seen.
    pub layouts: u8,
    /// Aggregated mode: rare records kept per surface (capped by `max_rare`).
    pub rare: [Vec<TcpEvent>; 3],
    /// Rare records not kept (the cap).
    pub rare_dropped: [u64; 3],
    /// Aggregated mode: the kernel's sampling and loss counts, set by
    /// [`TcpAggregate::finish_kernel`].
    pub sampling: Option<Sampling>,
    aggregated: bool,
    /// Per-kind events attributed to a flow or counted from an `UNAGG`
    /// record, before the address filter (to check against the kernel).
    attributed: [u64; 4],
    tuples: HashMap<u64, (Endpoint, Endpoint)>,
    filter_addr: Option<std::net::IpAddr>,
}

/// What the aggregated mode sent and refused in one window (kernel counts).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Sampling {
    /// Each ordinary event was sampled with probability 1/`one_in` (0: none).
    pub one_in: u32,
    /// Rare records the programs chose, per kind (`TcpEventKind::ALL` order).
    pub rare: [u64; 4],
    /// Sampled records the programs chose, per kind.
    pub sampled: [u64; 4],
    /// Event records refused by a full ring, per kind.
    pub lost: [u64; 4],
    /// Flow records sent at CLOSE.
    pub flow_records: u64,
    /// Flow records refused by a full ring.
    pub flow_records_lost: u64,
    /// Events the flow map could not take (sent as `UNAGG` records instead).
    pub flow_map_refused: u64,
    /// Live flows read from the map at window end.
    pub flows_read_at_end: u64,
}

fn kind_index(k: TcpEventKind) -> usize {
    TcpEventKind::ALL.iter().position(|x| *x == k).unwrap_or(0)
}

impl TcpAggregate {
    /// An empty aggregate. `filter_addr` keeps only events with that address
    /// at either end (the port filter runs in the kernel).
    pub fn new(limits: Limits, filter_addr: Option<std::net::IpAddr>) -> TcpAggregate {
        TcpAggregate {
            limits,
            flows: Vec::new(),
            by_sock: SockMap::default(),
            by_tuple: HashMap::new(),
            seen: [0; 4],
            untracked: [0; 3],
            samples: Default::default(),
            samples_dropped: [0; 3],
            raw: Default::default(),
            undecodable: 0,
            filtered_out: 0,
            layouts: 0,
            rare: Default::default(),
            rare_dropped: [0; 3],
            sampling: None,
            aggregated: false,
            attributed: [0; 4],
            tuples: HashMap::new(),
            filter_addr,
        }
    }

    /// An empty aggregate for the aggregated mode (kernel flows, rare and
    /// sampled records; see the module docs).
    pub fn aggregated(limits: Limits, filter_addr: Option<std::net::IpAddr>) -> TcpAggregate {
        TcpAggregate {
            aggregated: true,
            ..TcpAggregate::new(limits, filter_addr)
        }
    }

    /// Whether this aggregate folds kernel flows (the aggregated mode).
    pub fn is_aggregated(&self) -> bool {
        self.aggregated
    }

    /// Kept events of a surface: rare records first, then the sample.
    pub fn events(&self, s: TcpSurface) -> impl Iterator<Item = &TcpEvent> {
        self.rare[s.index()]
            .iter()
            .chain(self.samples[s.index()].iter())
    }

    fn accepts(&self, local: &Endpoint, remote: &Endpoint) -> bool {
        self.filter_addr
            .is_none_or(|a| local.addr == a || remote.addr == a)
    }

    /// Add one kernel flow aggregate (`struct pstack_tcp_flow`): a flow
    /// record from the ring, or a live entry read from the map.
    pub fn add_flow_raw(&mut self, raw: &[u8]) -> Result<(), RecordError> {
        let r = match TcpFlowRecord::parse(raw) {
            Ok(r) => r,
            Err(e) => {
                self.undecodable += 1;
                return Err(e);
            }
        };
        let counts = [
            r.retransmits,
            r.resets_received,
            r.resets_sent,
            r.state_changes,
        ];
        for (a, c) in self.attributed.iter_mut().zip(counts) {
            *a += c;
        }
        let tuple = r.tuple.or_else(|| self.tuples.get(&r.sk_key).copied());
        let unknown = Endpoint {
            addr: std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED),
            port: 0,
        };
        let (local, remote) = tuple.or(r.partial_tuple).unwrap_or((unknown, unknown));
        if !self.accepts(&local, &remote) {
            self.filtered_out += 1;
            return Ok(());
        }
        for (j, c) in counts.into_iter().enumerate() {
            self.seen[j] += c;
        }
        if r.left_established_at_end {
            // The rare "left ESTABLISHED" event this flow record stands for
            // (the kernel sent no separate record): no on-CPU task is known.
            let surface = TcpSurface::Lifecycle.index();
            let ts_ns = r
                .transitions
                .last()
                .filter(|_| r.state_changes as usize <= r.transitions.len())
                .map_or(r.last_ns, |t| t.0);
            let e = TcpEvent {
                ts_ns,
                kind: TcpEventKind::StateChange,
                sock_cookie: r.sock_cookie,
                netns_cookie: r.netns_cookie,
                netns_ino: r.netns_ino,
                local,
                remote,
                family: if local.addr.is_ipv6() { 10 } else { 2 },
                state: TcpState(1),
                new_state: Some(TcpState(7)),
                detail: None,
                layout: 0,
                has_sock: true,
                pid: 0,
                comm: crate::record::Comm::default(),
                sk_key: r.sk_key,
            };
            if self.rare[surface].len() < self.limits.max_rare {
                self.rare[surface].push(e);
            } else {
                self.rare_dropped[surface] += 1;
            }
        }
        let surfaces = [
            (TcpSurface::Retransmits, r.retransmits),
            (TcpSurface::Resets, r.resets_sent + r.resets_received),
            (TcpSurface::Lifecycle, r.state_changes),
        ];
        for (sf, c) in surfaces {
            if c > 0 {
                self.raw[sf.index()].update(raw);
            }
        }
        if self.flows.len() >= self.limits.max_flows {
            for (sf, c) in surfaces {
                self.untracked[sf.index()] += c;
            }
            return Ok(());
        }
        let max_tr = self.limits.max_transitions_per_flow;
        let transitions: Vec<Transition> = r
            .transitions
            .iter()
            .take(max_tr)
            .map(|&(ts_ns, from, to)| Transition { ts_ns, from, to })
            .collect();
        let flow = Flow {
            local,
            remote,
            netns_ino: r.netns_ino,
            netns_cookie: r.netns_cookie,
            sock_cookie: r.sock_cookie,
            has_sock: true,
            retransmits: r.retransmits,
            rtos: r.rtos,
            fast_retransmits: r.recovery,
            other_retransmits: r.other_retransmits,
            bytes_acked: r.bytes_acked,
            bytes_received: r.bytes_received,
            kernel_aggregate: true,
            resets_sent: r.resets_sent,
            resets_received: r.resets_received,
            last_reset_reason: r.last_reset_reason,
            state_changes: r.state_changes,
            first_ns: r.first_ns,
            last_ns: r.last_ns,
            transitions_dropped: r.state_changes.saturating_sub(transitions.len() as u64),
            transitions,
            closed: r.state == TcpState(7),
            tuple_indexed: tuple.is_some(),
        };
        self.flows.push(flow);
        let i = self.flows.len() - 1;
        if r.sk_key != 0 {
            self.by_sock.insert(r.sk_key, i);
        }
        if tuple.is_some() {
            self.by_tuple.insert((r.netns_ino, local, remote), i);
        }
        Ok(())
    }

    /// Aggregated mode, at window end: the kernel's counts over the window.
    /// Events the programs saw but no flow and no `UNAGG` record accounts for
    /// (an LRU eviction, a full map, a lost flow record) become `untracked`,
    /// which truncates their surface.
    pub fn finish_kernel(&mut self, seen: [u64; 4], sampling: Sampling) {
        for (j, kind) in TcpEventKind::ALL.into_iter().enumerate() {
            let missing = seen[j].saturating_sub(self.attributed[j]);
            self.untracked[TcpSurface::of(kind).index()] += missing;
        }
        self.sampling = Some(sampling);
    }

    /// The flows summarized (at most `max_flows`), in first-seen order.
    pub fn flows(&self) -> &[Flow] {
        &self.flows
    }

    /// The limits in force.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// Events seen of one kind.
    pub fn seen(&self, k: TcpEventKind) -> u64 {
        self.seen[kind_index(k)]
    }

    /// Decode and add one raw record; the decoded event when it passed the filter.
    pub fn add_raw(&mut self, raw: &[u8]) -> Result<Option<TcpEvent>, RecordError> {
        if raw.len() == TCP_FLOW_SIZE {
            self.add_flow_raw(raw)?;
            return Ok(None);
        }
        let e = match TcpEvent::parse(raw) {
            Ok(e) => e,
            Err(err) => {
                self.undecodable += 1;
                return Err(err);
            }
        };
        if let Some(a) = self.filter_addr
            && e.local.addr != a
            && e.remote.addr != a
        {
            self.filtered_out += 1;
            return Ok(None);
        }
        if self.aggregated {
            self.add_aggregated(&e, raw);
        } else {
            self.raw[TcpSurface::of(e.kind).index()].update(raw);
            let ca = TcpSockState::parse(raw).ok().and_then(|s| s.ca_state);
            self.add_with_ca(&e, ca);
        }
        Ok(Some(e))
    }

    /// Aggregated mode: keep a rare or sampled record as evidence; count an
    /// `UNAGG` one. (The address filter has already run.)
    fn add_aggregated(&mut self, e: &TcpEvent, raw: &[u8]) {
        let flags = raw.get(77).copied().unwrap_or(0);
        let surface = TcpSurface::of(e.kind).index();
        self.raw[surface].update(raw);
        self.layouts |= e.layout;
        if e.sk_key != 0 && Flow::complete(e) && self.tuples.len() < self.limits.max_flows {
            self.tuples.insert(e.sk_key, (e.local, e.remote));
        }
        if flags & TCP_UNAGG != 0 {
            self.attributed[kind_index(e.kind)] += 1;
            self.seen[kind_index(e.kind)] += 1;
            self.fold(e, None);
        }
        if flags & TCP_RARE != 0 {
            if self.rare[surface].len() < self.limits.max_rare {
                self.rare[surface].push(e.clone());
            } else {
                self.rare_dropped[surface] += 1;
            }
        } else if self.samples[surface].len() < self.limits.max_samples {
            self.samples[surface].push(e.clone());
        } else {
            self.samples_dropped[surface] += 1;
        }
    }

    /// Add one decoded event (per-event mode).
    pub fn add(&mut self, e: &TcpEvent) {
        self.add_with_ca(e, None);
    }

    /// [`TcpAggregate::add`] with the retransmit's `icsk_ca_state` (from the
    /// same record), which splits retransmits into RTOs, fast retransmits and
    /// the rest.
    pub fn add_with_ca(&mut self, e: &TcpEvent, ca_state: Option<u8>) {
        let surface = TcpSurface::of(e.kind).index();
        self.seen[kind_index(e.kind)] += 1;
        self.layouts |= e.layout;
        if self.samples[surface].len() < self.limits.max_samples {
            self.samples[surface].push(e.clone());
        } else {
            self.samples_dropped[surface] += 1;
        }
        self.fold(e, ca_state);
    }

    fn fold(&mut self, e: &TcpEvent, ca_state: Option<u8>) {
        let surface = TcpSurface::of(e.kind).index();
        let Some(idx) = self.flow_index(e) else {
            self.untracked[surface] += 1;
            return;
        };
        let max_tr = self.limits.max_transitions_per_flow;
        let f = &mut self.flows[idx];
        f.last_ns = f.last_ns.max(e.ts_ns);
        let index_tuple =
            Flow::complete(e) && (!f.tuple_indexed || f.local != e.local || f.remote != e.remote);
        if Flow::complete(e) {
            f.local = e.local;
            f.remote = e.remote;
            f.tuple_indexed = true;
        }
        if f.sock_cookie.is_none() {
            f.sock_cookie = e.sock_cookie;
        }
        if f.netns_ino.is_none() {
            f.netns_ino = e.netns_ino;
            f.netns_cookie = e.netns_cookie;
        }
        match e.kind {
            TcpEventKind::Retransmit => {
                f.retransmits += 1;
                match ca_state {
                    Some(crate::record::TCP_CA_LOSS) => f.rtos += 1,
                    Some(3) => f.fast_retransmits += 1,
                    _ => f.other_retransmits += 1,
                }
            }
            TcpEventKind::SendReset => {
                f.resets_sent += 1;
                f.last_reset_reason = e.detail;
            }
            TcpEventKind::ReceiveReset => f.resets_received += 1,
            TcpEventKind::StateChange => {
                f.state_changes += 1;
                let to = e.new_state.unwrap_or(TcpState(0));
                if f.transitions.len() < max_tr {
                    f.transitions.push(Transition {
                        ts_ns: e.ts_ns,
                        from: e.state,
                        to,
                    });
                } else {
                    f.transitions_dropped += 1;
                }
                if to == TcpState(7) {
                    f.closed = true;
                }
            }
        }
        if index_tuple {
            self.by_tuple.insert((e.netns_ino, e.local, e.remote), idx);
        }
    }

    fn flow_index(&mut self, e: &TcpEvent) -> Option<usize> {
        // A state change on a socket whose flow reached CLOSE is a new socket
        // at the same address: a client reconnecting from CLOSE, or the slab
        // handing the freed memory to another socket (a server's child starts
        // in SYN_RECV). Only a reset can follow CLOSE on the same flow.
        let reopening = e.kind == TcpEventKind::StateChange;
        let existing = if e.sk_key != 0 {
            self.by_sock.get(&e.sk_key).copied()
        } else {
            self.by_tuple
                .get(&(e.netns_ino, e.local, e.remote))
                .copied()
        };
        if let Some(i) = existing
            && !(reopening && self.flows[i].closed)
        {
            return Some(i);
        }
        if self.flows.len() >= self.limits.max_flows {
            return None;
        }
        self.flows.push(Flow::new(e));
        let i = self.flows.len() - 1;
        if e.sk_key != 0 {
            self.by_sock.insert(e.sk_key, i);
        }
        Some(i)
    }

    /// Whether a cap cut this surface's per-flow summaries (counts stay exact).
    pub fn truncated(&self, s: TcpSurface) -> bool {
        self.untracked[s.index()] > 0
    }

    /// Events of this surface untracked by the flow table.
    pub fn untracked(&self, s: TcpSurface) -> u64 {
        self.untracked[s.index()]
    }

    /// Kept raw events of this surface.
    pub fn samples(&self, s: TcpSurface) -> &[TcpEvent] {
        &self.samples[s.index()]
    }

    /// Raw events of this surface not kept.
    pub fn samples_dropped(&self, s: TcpSurface) -> u64 {
        self.samples_dropped[s.index()]
    }

    /// Raw digest of this surface.
    pub fn raw(&self, s: TcpSurface) -> &RawDigest {
        &self.raw[s.index()]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{IpAddr, Ipv4Addr};

    fn ep(port: u16) -> Endpoint {
        Endpoint {
            addr: IpAddr::V4(Ipv4Addr::LOCALHOST),
            port,
        }
    }

    fn ev(kind: TcpEventKind, sk: u64, lport: u16, rport: u16, from: u8, to: u8) -> TcpEvent {
        TcpEvent {
            ts_ns: 1,
            kind,
            sock_cookie: None,
            netns_cookie: None,
            netns_ino: Some(1),
            local: ep(lport),
            remote: ep(rport),
            family: 2,
            state: TcpState(from),
            new_state: (kind == TcpEventKind::StateChange).then_some(TcpState(to)),
            detail: None,
            layout: 0,
            has_sock: sk != 0,
            pid: 0,
            comm: crate::record::Comm::default(),
            sk_key: sk,
        }
    }

    #[test]
    fn client_socket_joins_its_portless_syn_sent_transition() {
        let mut a = TcpAggregate::new(Limits::default(), None);
        a.add(&ev(TcpEventKind::StateChange, 0xa, 0, 80, 7, 2)); // CLOSE -> SYN_SENT, no port yet
        a.add(&ev(TcpEventKind::StateChange, 0xa, 5555, 80, 2, 1));
        a.add(&ev(TcpEventKind::StateChange, 0xa, 5555, 80, 1, 4));
        a.add(&ev(TcpEventKind::StateChange, 0xa, 5555, 80, 4, 7));
        assert_eq!(a.flows().len(), 1);
        let f = &a.flows()[0];
        assert_eq!(f.local.port, 5555);
        let seq: Vec<u8> = f.transitions.iter().map(|t| t.to.0).collect();
        assert_eq!(seq, vec![2, 1, 4, 7]);
    }

    #[test]
    fn reset_after_close_stays_on_the_flow_but_a_reopen_starts_a_new_one() {
        let mut a = TcpAggregate::new(Limits::default(), None);
        a.add(&ev(TcpEventKind::StateChange, 0xa, 5555, 80, 1, 7));
        a.add(&ev(TcpEventKind::SendReset, 0xa, 5555, 80, 7, 0)); // linger-0 close: CLOSE then RST
        assert_eq!(a.flows().len(), 1);
        assert_eq!(a.flows()[0].resets_sent, 1);
        a.add(&ev(TcpEventKind::StateChange, 0xa, 0, 81, 7, 2)); // the socket memory reused
        assert_eq!(a.flows().len(), 2);
    }

    #[test]
    fn an_accepted_child_in_reused_memory_is_a_new_flow() {
        let mut a = TcpAggregate::new(Limits::default(), None);
        // Two short accepted connections whose sockets land at the same address.
        for rport in [40001, 40002] {
            a.add(&ev(TcpEventKind::StateChange, 0xb, 10505, rport, 10, 3)); // LISTEN -> SYN_RECV
            a.add(&ev(TcpEventKind::StateChange, 0xb, 10505, rport, 3, 1));
            a.add(&ev(TcpEventKind::StateChange, 0xb, 10505, rport, 1, 8)); // CLOSE_WAIT
            a.add(&ev(TcpEventKind::StateChange, 0xb, 10505, rport, 8, 9)); // LAST_ACK
            a.add(&ev(TcpEventKind::StateChange, 0xb, 10505, rport, 9, 7)); // CLOSE
        }
        assert_eq!(a.flows().len(), 2, "{:?}", a.flows());
        assert_eq!(a.flows()[0].remote.port, 40001);
        assert_eq!(a.flows()[1].remote.port, 40002);
        assert_eq!(a.flows()[1].transitions.len(), 5);
    }

    #[test]
    fn a_closed_sockets_memory_reused_by_a_server_child_is_a_new_flow() {
        let mut a = TcpAggregate::new(Limits::default(), None);
        a.add(&ev(TcpEventKind::StateChange, 0xa, 5555, 80, 4, 7)); // client done
        a.add(&ev(TcpEventKind::StateChange, 0xa, 80, 6000, 3, 1)); // a child at that address
        assert_eq!(a.flows().len(), 2, "not merged into the closed client flow");
        assert_eq!(a.flows()[0].local.port, 5555);
        assert_eq!(a.flows()[1].local.port, 80);
    }

    /// A `struct pstack_tcp_flow` image: one socket at `sk` with ports
    /// `lport -> 80`, `state_changes` transitions, `retransmits` retransmits.
    fn flow_raw(sk: u64, lport: u16, state_changes: u32, retransmits: u32) -> Vec<u8> {
        let mut b = vec![0u8; TCP_FLOW_SIZE];
        b[32..40].copy_from_slice(&sk.to_le_bytes());
        b[60..64].copy_from_slice(&retransmits.to_le_bytes());
        b[68..72].copy_from_slice(&retransmits.to_le_bytes()); // all fast
        b[88..92].copy_from_slice(&state_changes.to_le_bytes());
        b[92..94].copy_from_slice(&lport.to_le_bytes());
        b[94..96].copy_from_slice(&80u16.to_le_bytes());
        b[96] = 2;
        b[97] = crate::flow_record::FLOW_TUPLE;
        b[98] = 7;
        b[104..108].copy_from_slice(&[127, 0, 0, 1]);
        b[120..124].copy_from_slice(&[127, 0, 0, 1]);
        b
    }

    #[test]
    fn aggregated_counts_come_from_kernel_flows_and_what_no_flow_took_is_untracked() {
        let mut a = TcpAggregate::aggregated(Limits::default(), None);
        a.add_raw(&flow_raw(0xa, 5000, 5, 2)).expect("flow");
        a.add_raw(&flow_raw(0xb, 5001, 4, 0)).expect("flow");
        assert_eq!(a.flows().len(), 2);
        assert_eq!(a.flows()[0].retransmits, 2);
        assert_eq!(a.flows()[0].fast_retransmits, 2);
        assert!(a.flows()[0].kernel_aggregate);
        assert_eq!(a.seen(TcpEventKind::StateChange), 9);
        // The kernel saw 12 state changes and 2 retransmits: 3 state changes
        // are in no flow (an evicted entry, a lost flow record).
        a.finish_kernel([2, 0, 0, 12], Sampling::default());
        assert_eq!(a.untracked(TcpSurface::Lifecycle), 3);
        assert!(a.truncated(TcpSurface::Lifecycle));
        assert!(!a.truncated(TcpSurface::Retransmits));
    }

    #[test]
    fn flow_cap_bounds_memory_and_counts_untracked() {
        let limits = Limits {
            max_flows: 4,
            max_samples: 3,
            ..Limits::default()
        };
        let mut a = TcpAggregate::new(limits, None);
        for i in 0..100u16 {
            a.add(&ev(
                TcpEventKind::Retransmit,
                0x1000 + u64::from(i),
                1000 + i,
                80,
                1,
                0,
            ));
        }
        assert_eq!(a.flows().len(), 4);
        assert_eq!(a.seen(TcpEventKind::Retransmit), 100, "counts stay exact");
        assert_eq!(a.untracked(TcpSurface::Retransmits), 96);
        assert!(a.truncated(TcpSurface::Retransmits));
        assert!(!a.truncated(TcpSurface::Resets));
        assert_eq!(a.samples(TcpSurface::Retransmits).len(), 3);
        assert_eq!(a.samples_dropped(TcpSurface::Retransmits), 97);
    }

    #[test]
    fn transition_cap_per_flow() {
        let limits = Limits {
            max_transitions_per_flow: 2,
            ..Limits::default()
        };
        let mut a = TcpAggregate::new(limits, None);
        for _ in 0..5 {
            a.add(&ev(TcpEventKind::StateChange, 0xb, 1, 2, 1, 4));
        }
        assert_eq!(a.flows()[0].transitions.len(), 2);
        assert_eq!(a.flows()[0].transitions_dropped, 3);
        assert_eq!(a.flows()[0].state_changes, 5);
    }

    #[test]
    fn sockless_resets_join_by_tuple() {
        let mut a = TcpAggregate::new(Limits::default(), None);
        a.add(&ev(TcpEventKind::SendReset, 0, 9, 40000, 0, 0));
        a.add(&ev(TcpEventKind::SendReset, 0, 9, 40000, 0, 0));
        assert_eq!(a.flows().len(), 1);
        assert_eq!(a.flows()[0].resets_sent, 2);
        assert!(!a.flows()[0].has_sock);
    }

    #[test]
    fn raw_digest_is_absent_until_bytes_arrive() {
        let mut d = RawDigest::default();
        assert_eq!(d.digest(), None);
        d.update(b"abc");
        assert_eq!(
            d.digest().unwrap(),
            "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(d.bytes, 3);
    }
}
