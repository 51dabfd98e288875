//! TCP flight recorder: the last `horizon` (default 60 s) of per-flow TCP
//! aggregates for flows on a watched port range, so that a flow that is reset
//! can be sealed with what it did before it died.
//!
//! Two parts:
//! - [`FlowBook`] is pure: typed records ([`TcpRecord`]) in, per-flow
//!   per-second [`FlowBucket`]s, [`FlowHistory`]s and [`FlowIncident`]s out.
//!   No kernel, no clock: the caller passes "now" to [`FlowBook::expire`].
//! - [`FlightRecorder`] (`recorder.rs`) owns its own [`EbpfSession`](crate::EbpfSession) (TCP programs in record
//!   mode, the port range filtered in the kernel) and feeds the book on
//!   [`FlightRecorder::poll`], which never blocks.
//!
//! Invariants (the book):
//! - **Bounded.** At most `max_flows` flows; a new flow beyond that evicts
//!   the least recently seen one, counted in `flows_evicted`. Each flow holds
//!   at most `horizon_secs + 2` buckets and [`MAX_TRANSITIONS`] transitions
//!   (older ones dropped, `truncated` set). Client sockets whose first
//!   transition (`CLOSE -> SYN_SENT`) has no local port yet wait in a pending
//!   table of at most `max_flows` sockets, one record each. Incidents waiting
//!   for the next poll are at most [`MAX_INCIDENTS`] (more are counted in
//!   `incidents_dropped`). Nothing grows with the event rate.
//! - **Horizon.** [`FlowBook::expire`] drops every bucket whose second ended
//!   at or before `cutoff = max(now - horizon, started)`, transitions older
//!   than the cutoff, and forgets flows with no bucket left.
//! - **Honest reach.** A history says how far back its knowledge reaches:
//!   `reached_back_ns = max(first event on the flow, cutoff, recorder start)`;
//!   from there to `last_seen_ns` every record the kernel delivered for the
//!   flow is in the buckets (records lost in a full ring are counted in
//!   [`FlightStats::events_lost`], not attributable to a flow).
//! - **Accounted.** Every record is folded into a flow, or counted as
//!   undecodable or unattributed; totals are the sums of the buckets held.
//!
//! Flows are keyed by `(netns inode, local, remote)`: each end of a
//! connection is its own flow, seen from its own namespace. A flow whose
//! last state was `CLOSE` and that starts again from `CLOSE` (4-tuple reused)
//! starts a new history.

mod recorder;

pub use recorder::FlightRecorder;

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Serialize, Serializer};

use crate::error::EbpfError;
use crate::host;
use crate::record::{TcpEvent, TcpEventKind, TcpRecord, TcpState};

/// Transitions kept per flow (the most recent ones).
pub const MAX_TRANSITIONS: usize = 32;
/// Incidents held between two polls.
pub const MAX_INCIDENTS: usize = 4096;

const NS_PER_SEC: u64 = 1_000_000_000;
const TCP_CLOSE: TcpState = TcpState(7);
const TCP_SYN_SENT: TcpState = TcpState(2);

/// What the flight recorder watches and keeps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlightConfig {
    /// Watched ports, inclusive (a flow is watched when either end's port is
    /// in it). Default 10000-20000 (Longhorn v1's instance-manager range).
    pub ports: (u16, u16),
    /// How much history is kept per flow (default 60 s; 1 s ..= 1 h).
    pub horizon: Duration,
    /// Most flows held (default 4096); the least recently seen is evicted.
    pub max_flows: usize,
    /// Kernel BTF (default `/sys/kernel/btf/vmlinux`).
    pub btf_path: PathBuf,
    /// tracefs mount point (default `/sys/kernel/tracing`).
    pub tracefs: PathBuf,
}

impl Default for FlightConfig {
    fn default() -> Self {
        FlightConfig {
            ports: (10000, 20000),
            horizon: Duration::from_secs(60),
            max_flows: 4096,
            btf_path: PathBuf::from(host::KERNEL_BTF),
            tracefs: PathBuf::from(host::TRACEFS),
        }
    }
}

impl FlightConfig {
    /// Check every value, naming the parameter that is wrong.
    pub fn validate(&self) -> Result<(), EbpfError> {
        let bad =
            |param: &'static str, reason: String| Err(EbpfError::InvalidConfig { param, reason });
        let (lo, hi) = self.ports;
        if lo == 0 || lo > hi {
            return bad(
                "flight.ports",
                format!("{lo}-{hi} is not a range of ports (1 <= lo <= hi)"),
            );
        }
        if self.horizon < Duration::from_secs(1) || self.horizon > Duration::from_secs(3600) {
            return bad(
                "flight.horizon",
                format!("{:?} not in 1s..=1h", self.horizon),
            );
        }
        if self.max_flows == 0 || self.max_flows > 1_000_000 {
            return bad(
                "flight.max_flows",
                format!("{} not in 1..=1000000", self.max_flows),
            );
        }
        Ok(())
    }
}

/// One end of a connection, seen from its namespace.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct FlowKey {
    /// Inode of the socket's network namespace, when known.
    pub netns_ino: Option<u32>,
    /// This end.
    pub local: SocketAddr,
    /// The peer.
    pub remote: SocketAddr,
}

impl FlowKey {
    /// The flow of an event (local = the event's local endpoint).
    pub fn of(e: &TcpEvent) -> FlowKey {
        FlowKey {
            netns_ino: e.netns_ino,
            local: SocketAddr::new(e.local.addr, e.local.port),
            remote: SocketAddr::new(e.remote.addr, e.remote.port),
        }
    }
}

/// Something a poll saw that a watch rule may act on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum FlowIncident {
    /// A RST on the flow: received from the peer (`tcp_receive_reset`) or
    /// sent by this host (`tcp_send_reset`). Every reset is reported.
    Reset {
        /// The flow (for a sent RST, `local` is its sender).
        flow: FlowKey,
        /// The peer sent it (this end received it).
        received_from_peer: bool,
        /// CLOCK_MONOTONIC ns.
        at_ns: u64,
    },
    /// A retransmit sent by the RTO timer (socket in `TCP_CA_Loss`). At most
    /// one per flow per poll (the first); the history counts them all.
    Rto {
        /// The flow.
        flow: FlowKey,
        /// CLOCK_MONOTONIC ns.
        at_ns: u64,
    },
}

impl FlowIncident {
    /// The flow it happened on.
    pub fn flow(&self) -> &FlowKey {
        match self {
            FlowIncident::Reset { flow, .. } | FlowIncident::Rto { flow, .. } => flow,
        }
    }

    /// When, CLOCK_MONOTONIC ns.
    pub fn at_ns(&self) -> u64 {
        match self {
            FlowIncident::Reset { at_ns, .. } | FlowIncident::Rto { at_ns, .. } => *at_ns,
        }
    }
}

/// Counts over the buckets a history holds (written into envelopes as
/// [`pstack_envelope::facts::FlightTotals`], through [`FlowTotals::facts`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FlowTotals {
    /// Retransmits sent by this end (RTO and fast retransmits alike).
    pub retransmits: u64,
    /// The subset of `retransmits` sent in `TCP_CA_Loss` (RTO timer).
    pub rto_retransmits: u64,
    /// RSTs this end received from the peer.
    pub resets_received: u64,
    /// RSTs this end sent.
    pub resets_sent: u64,
    /// State changes.
    pub state_changes: u64,
    /// Records of this end, in a synchronized state (ESTABLISHED, FIN_WAIT1/2,
    /// CLOSE_WAIT, LAST_ACK, CLOSING), whose socket had `snd_wnd == 0`: the
    /// peer advertised a zero receive window. (This end's own advertised
    /// window is in the buckets' `rcv_wnd_min`.)
    pub zero_window_events: u64,
    /// Last state known (kernel name without `TCP_`).
    pub last_state: Option<String>,
}

impl FlowTotals {
    /// These counts as the facts the store reads (`ebpf/flight_recorder`'s
    /// `totals`): the recorder writes them through that type.
    pub fn facts(&self) -> pstack_envelope::facts::FlightTotals {
        pstack_envelope::facts::FlightTotals {
            retransmits: Some(self.retransmits),
            rto_retransmits: Some(self.rto_retransmits),
            resets_received: Some(self.resets_received),
            resets_sent: Some(self.resets_sent),
            state_changes: Some(self.state_changes),
            zero_window_events: Some(self.zero_window_events),
            last_state: self.last_state.clone(),
        }
    }
}

/// One second of a flow that had records.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FlowBucket {
    /// Start of the second, CLOCK_MONOTONIC ns (a multiple of 1e9).
    pub second_start_ns: u64,
    /// Retransmits.
    pub retransmits: u64,
    /// RTO retransmits (subset of `retransmits`).
    pub rto_retransmits: u64,
    /// RSTs received.
    pub resets_received: u64,
    /// RSTs sent.
    pub resets_sent: u64,
    /// State changes.
    pub state_changes: u64,
    /// Zero-window records (see [`FlowTotals::zero_window_events`]).
    pub zero_window_events: u64,
    /// Smallest `snd_wnd` seen (the peer's advertised window, bytes).
    pub snd_wnd_min: Option<u64>,
    /// Smallest `rcv_wnd` seen (this end's advertised window, bytes).
    pub rcv_wnd_min: Option<u64>,
}

/// What the recorder holds about one flow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlowHistory {
    /// The flow.
    pub flow: FlowKey,
    /// Socket cookie, when a record carried one.
    pub sock_cookie: Option<u64>,
    /// First record on the flow, CLOCK_MONOTONIC ns (may be older than the buckets held).
    pub first_seen_ns: u64,
    /// Last record.
    pub last_seen_ns: u64,
    /// How far back the knowledge of this flow reaches:
    /// `max(first_seen_ns, now - horizon at the last expiry, recorder start)`.
    pub reached_back_ns: u64,
    /// When the recorder started.
    pub recorder_started_ns: u64,
    /// Sums over `buckets`.
    pub totals: FlowTotals,
    /// One per second that had records, oldest first.
    pub buckets: Vec<FlowBucket>,
    /// `(at_ns, from, to)`, the most recent [`MAX_TRANSITIONS`], oldest first.
    pub transitions: Vec<(u64, String, String)>,
    /// Something about the flow was dropped by a cap (transitions or buckets);
    /// not set by horizon expiry, which `reached_back_ns` states.
    pub truncated: bool,
}

/// Serialized as an envelope surface's facts: integers as u64, every time
/// both as CLOCK_MONOTONIC ns (`*_ns`) and as an offset before the flow's
/// last record (`*_before_last_ns`).
impl Serialize for FlowHistory {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct Bucket<'a> {
            #[serde(flatten)]
            b: BucketFacts<'a>,
            before_last_ns: u64,
        }
        struct BucketFacts<'a>(&'a FlowBucket);
        impl Serialize for BucketFacts<'_> {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                use serde::ser::SerializeMap;
                let b = self.0;
                let mut m = s.serialize_map(None)?;
                m.serialize_entry("second_start_ns", &b.second_start_ns)?;
                m.serialize_entry("retransmits", &b.retransmits)?;
                m.serialize_entry("rto_retransmits", &b.rto_retransmits)?;
                m.serialize_entry("resets_received", &b.resets_received)?;
                m.serialize_entry("resets_sent", &b.resets_sent)?;
                m.serialize_entry("state_changes", &b.state_changes)?;
                m.serialize_entry("zero_window_events", &b.zero_window_events)?;
                m.serialize_entry("snd_wnd_min", &b.snd_wnd_min)?;
                m.serialize_entry("rcv_wnd_min", &b.rcv_wnd_min)?;
                m.end()
            }
        }
        #[derive(Serialize)]
        struct Transition<'a> {
            at_ns: u64,
            before_last_ns: u64,
            from: &'a str,
            to: &'a str,
        }
        #[derive(Serialize)]
        struct View<'a> {
            flow: &'a FlowKey,
            sock_cookie: Option<u64>,
            first_seen_ns: u64,
            last_seen_ns: u64,
            reached_back_ns: u64,
            reached_back_before_last_ns: u64,
            recorder_started_ns: u64,
            totals: pstack_envelope::facts::FlightTotals,
            buckets: Vec<Bucket<'a>>,
            transitions: Vec<Transition<'a>>,
            truncated: bool,
        }
        let last = self.last_seen_ns;
        View {
            flow: &self.flow,
            sock_cookie: self.sock_cookie,
            first_seen_ns: self.first_seen_ns,
            last_seen_ns: last,
            reached_back_ns: self.reached_back_ns,
            reached_back_before_last_ns: last.saturating_sub(self.reached_back_ns),
            recorder_started_ns: self.recorder_started_ns,
            totals: self.totals.facts(),
            buckets: self
                .buckets
                .iter()
                .map(|b| Bucket {
                    b: BucketFacts(b),
                    before_last_ns: last.saturating_sub(b.second_start_ns),
                })
                .collect(),
            transitions: self
                .transitions
                .iter()
                .map(|(at, from, to)| Transition {
                    at_ns: *at,
                    before_last_ns: last.saturating_sub(*at),
                    from,
                    to,
                })
                .collect(),
            truncated: self.truncated,
        }
        .serialize(s)
    }
}

/// Counters of a [`FlowBook`] / [`FlightRecorder`], cumulative.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct FlightStats {
    /// Flows held now.
    pub flows: u64,
    /// Flows evicted because `max_flows` were held.
    pub flows_evicted: u64,
    /// Flows forgotten because their last record left the horizon.
    pub flows_expired: u64,
    /// Records folded into a flow.
    pub events_folded: u64,
    /// Records that could not be put on a flow's buckets: a port still 0
    /// and no socket to join later, a pending client socket that never got
    /// a port, or a record older than every bucket of a flow at its bucket
    /// cap (only when expiry has not run for longer than the horizon).
    pub events_unattributed: u64,
    /// Records that failed to decode.
    pub events_undecodable: u64,
    /// Records the kernel programs made (after the in-kernel port filter).
    pub kernel_events: u64,
    /// Records lost in the kernel (ring buffer full): never folded.
    pub events_lost: u64,
    /// Incidents not kept because [`MAX_INCIDENTS`] were waiting.
    pub incidents_dropped: u64,
    /// When the recorder started, CLOCK_MONOTONIC ns.
    pub started_at_ns: u64,
}

#[derive(Debug, Clone)]
struct FlowState {
    sock_cookie: Option<u64>,
    first_seen_ns: u64,
    last_seen_ns: u64,
    last_state: Option<TcpState>,
    buckets: VecDeque<FlowBucket>,
    transitions: VecDeque<(u64, TcpState, TcpState)>,
    truncated: bool,
    closed: bool,
    lru_sec: u64,
}

impl FlowState {
    fn new(ts: u64) -> FlowState {
        FlowState {
            sock_cookie: None,
            first_seen_ns: ts,
            last_seen_ns: ts,
            last_state: None,
            buckets: VecDeque::new(),
            transitions: VecDeque::new(),
            truncated: false,
            closed: false,
            lru_sec: ts / NS_PER_SEC,
        }
    }

    /// The bucket of `ts`'s second, made if needed; `None` when the cap is
    /// reached and that second is older than every bucket held.
    fn bucket(&mut self, ts: u64, max_buckets: usize) -> Option<&mut FlowBucket> {
        let start = ts / NS_PER_SEC * NS_PER_SEC;
        // Records arrive nearly in order (one ring, timestamps taken per CPU):
        // search from the newest bucket.
        let pos = self
            .buckets
            .iter()
            .rposition(|b| b.second_start_ns <= start);
        let fresh = FlowBucket {
            second_start_ns: start,
            ..FlowBucket::default()
        };
        let idx = match pos {
            Some(i) if self.buckets[i].second_start_ns == start => i,
            Some(i) => {
                self.buckets.insert(i + 1, fresh);
                i + 1
            }
            None => {
                self.buckets.push_front(fresh);
                0
            }
        };
        if self.buckets.len() > max_buckets {
            // Only when expiry has not run over a long stretch of records.
            self.buckets.pop_front();
            self.truncated = true;
            return idx.checked_sub(1).and_then(|i| self.buckets.get_mut(i));
        }
        self.buckets.get_mut(idx)
    }
}

/// `ESTABLISHED`, `FIN_WAIT1`, `FIN_WAIT2`, `CLOSE_WAIT`, `LAST_ACK`, `CLOSING`:
/// the windows are the connection's, not a handshake's zero.
fn synchronized(s: TcpState) -> bool {
    matches!(s.0, 1 | 4 | 5 | 8 | 9 | 11)
}

fn min_opt(cur: Option<u64>, v: Option<u32>) -> Option<u64> {
    match (cur, v) {
        (Some(c), Some(v)) => Some(c.min(u64::from(v))),
        (None, Some(v)) => Some(u64::from(v)),
        (c, None) => c,
    }
}

/// The pure per-flow folding of the flight recorder (see the module docs).
#[derive(Debug, Clone)]
pub struct FlowBook {
    horizon_ns: u64,
    max_flows: usize,
    max_buckets: usize,
    started_ns: u64,
    cutoff_ns: u64,
    flows: HashMap<FlowKey, FlowState>,
    lru: BTreeSet<(u64, FlowKey)>,
    pending: HashMap<u64, TcpRecord>,
    incidents: Vec<FlowIncident>,
    rto_reported: HashSet<FlowKey>,
    stats: FlightStats,
}

impl FlowBook {
    /// An empty book keeping `horizon` of history for at most `max_flows`
    /// flows; nothing older than `started_ns` (the recorder's start) exists.
    pub fn new(horizon: Duration, max_flows: usize, started_ns: u64) -> FlowBook {
        let horizon_ns = u64::try_from(horizon.as_nanos()).unwrap_or(u64::MAX);
        FlowBook {
            horizon_ns,
            max_flows: max_flows.max(1),
            max_buckets: usize::try_from(horizon_ns / NS_PER_SEC)
                .unwrap_or(usize::MAX)
                .saturating_add(2),
            started_ns,
            cutoff_ns: started_ns,
            flows: HashMap::new(),
            lru: BTreeSet::new(),
            pending: HashMap::new(),
            incidents: Vec::new(),
            rto_reported: HashSet::new(),
            stats: FlightStats {
                started_at_ns: started_ns,
                ..FlightStats::default()
            },
        }
    }

    /// Decode one raw ring-buffer record and fold it (an undecodable one is counted).
    pub fn fold_raw(&mut self, raw: &[u8]) {
        match TcpRecord::parse(raw) {
            Ok(r) => self.fold(&r),
            Err(_) => self.stats.events_undecodable += 1,
        }
    }

    /// Fold one record into its flow's bucket of that second.
    pub fn fold(&mut self, r: &TcpRecord) {
        let e = &r.event;
        if e.local.port == 0 || e.remote.port == 0 {
            // A client's CLOSE -> SYN_SENT comes before its port is bound:
            // hold it until the socket's next record names the flow.
            let joinable = e.sk_key != 0
                && e.kind == TcpEventKind::StateChange
                && e.new_state == Some(TCP_SYN_SENT);
            if joinable
                && (self.pending.len() < self.max_flows || self.pending.contains_key(&e.sk_key))
            {
                if self.pending.insert(e.sk_key, r.clone()).is_some() {
                    self.stats.events_unattributed += 1;
                }
            } else {
                self.stats.events_unattributed += 1;
            }
            return;
        }
        if e.sk_key != 0
            && let Some(first) = self.pending.remove(&e.sk_key)
        {
            self.fold_keyed(FlowKey::of(e), &first);
        }
        self.fold_keyed(FlowKey::of(e), r);
    }

    fn fold_keyed(&mut self, key: FlowKey, r: &TcpRecord) {
        let e = &r.event;
        let reopening = e.kind == TcpEventKind::StateChange && e.state == TCP_CLOSE;
        let restart = reopening && self.flows.get(&key).is_some_and(|f| f.closed);
        if restart && let Some(old) = self.flows.remove(&key) {
            self.lru.remove(&(old.lru_sec, key.clone()));
        }
        if !self.flows.contains_key(&key) {
            if self.flows.len() >= self.max_flows
                && let Some(victim) = self.lru.pop_first()
            {
                self.flows.remove(&victim.1);
                self.stats.flows_evicted += 1;
            }
            let f = FlowState::new(e.ts_ns);
            self.lru.insert((f.lru_sec, key.clone()));
            self.flows.insert(key.clone(), f);
        }
        let max_buckets = self.max_buckets;
        let Some(f) = self.flows.get_mut(&key) else {
            return;
        };
        let sec = e.ts_ns / NS_PER_SEC;
        if sec > f.lru_sec {
            self.lru.remove(&(f.lru_sec, key.clone()));
            f.lru_sec = sec;
            self.lru.insert((sec, key.clone()));
        }
        f.first_seen_ns = f.first_seen_ns.min(e.ts_ns);
        f.last_seen_ns = f.last_seen_ns.max(e.ts_ns);
        if f.sock_cookie.is_none() {
            f.sock_cookie = e.sock_cookie;
        }
        let zero_window = r.sock.snd_wnd == Some(0) && synchronized(e.state);
        let rto = e.kind == TcpEventKind::Retransmit && r.sock.rto;
        let mut scratch = FlowBucket::default();
        let (b, in_bucket) = match f.bucket(e.ts_ns, max_buckets) {
            Some(b) => (b, true),
            None => (&mut scratch, false),
        };
        b.snd_wnd_min = min_opt(b.snd_wnd_min, r.sock.snd_wnd);
        b.rcv_wnd_min = min_opt(b.rcv_wnd_min, r.sock.rcv_wnd);
        b.zero_window_events += u64::from(zero_window);
        match e.kind {
            TcpEventKind::Retransmit => {
                b.retransmits += 1;
                b.rto_retransmits += u64::from(rto);
            }
            TcpEventKind::ReceiveReset => b.resets_received += 1,
            TcpEventKind::SendReset => b.resets_sent += 1,
            TcpEventKind::StateChange => b.state_changes += 1,
        }
        let incident = match e.kind {
            TcpEventKind::Retransmit if rto && !self.rto_reported.contains(&key) => {
                Some(FlowIncident::Rto {
                    flow: key.clone(),
                    at_ns: e.ts_ns,
                })
            }
            TcpEventKind::ReceiveReset | TcpEventKind::SendReset => Some(FlowIncident::Reset {
                flow: key.clone(),
                received_from_peer: e.kind == TcpEventKind::ReceiveReset,
                at_ns: e.ts_ns,
            }),
            TcpEventKind::StateChange => {
                let to = e.new_state.unwrap_or(TcpState(0));
                if f.transitions.len() >= MAX_TRANSITIONS {
                    f.transitions.pop_front();
                    f.truncated = true;
                }
                f.transitions.push_back((e.ts_ns, e.state, to));
                f.last_state = Some(to);
                f.closed = to == TCP_CLOSE;
                None
            }
            _ => None,
        };
        if e.kind != TcpEventKind::StateChange && f.last_state.is_none() {
            f.last_state = Some(e.state);
        }
        if in_bucket {
            self.stats.events_folded += 1;
        } else {
            self.stats.events_unattributed += 1;
        }
        if let Some(i) = incident {
            if self.incidents.len() < MAX_INCIDENTS {
                if matches!(i, FlowIncident::Rto { .. }) {
                    self.rto_reported.insert(key);
                }
                self.incidents.push(i);
            } else {
                self.stats.incidents_dropped += 1;
            }
        }
    }

    /// Drop what is older than the horizon at `now_ns` (see the module docs).
    pub fn expire(&mut self, now_ns: u64) {
        let cutoff = now_ns
            .saturating_sub(self.horizon_ns)
            .max(self.started_ns)
            .max(self.cutoff_ns);
        self.cutoff_ns = cutoff;
        // Flows whose newest bucket ended by the cutoff.
        while let Some((sec, _)) = self.lru.first() {
            if (sec + 1).saturating_mul(NS_PER_SEC) > cutoff {
                break;
            }
            if let Some((_, key)) = self.lru.pop_first() {
                self.flows.remove(&key);
                self.stats.flows_expired += 1;
            }
        }
        for f in self.flows.values_mut() {
            while f
                .buckets
                .front()
                .is_some_and(|b| b.second_start_ns + NS_PER_SEC <= cutoff)
            {
                f.buckets.pop_front();
            }
            while f.transitions.front().is_some_and(|t| t.0 < cutoff) {
                f.transitions.pop_front();
            }
        }
        let before = self.pending.len();
        self.pending.retain(|_, r| r.event.ts_ns >= cutoff);
        self.stats.events_unattributed += (before - self.pending.len()) as u64;
    }

    /// Incidents since the last call (resets; the first RTO per flow).
    pub fn take_incidents(&mut self) -> Vec<FlowIncident> {
        self.rto_reported.clear();
        std::mem::take(&mut self.incidents)
    }

    /// What the book holds about one flow.
    pub fn history(&self, key: &FlowKey) -> Option<FlowHistory> {
        let f = self.flows.get(key)?;
        let mut t = FlowTotals {
            last_state: f.last_state.map(|s| s.name()),
            ..FlowTotals::default()
        };
        for b in &f.buckets {
            t.retransmits += b.retransmits;
            t.rto_retransmits += b.rto_retransmits;
            t.resets_received += b.resets_received;
            t.resets_sent += b.resets_sent;
            t.state_changes += b.state_changes;
            t.zero_window_events += b.zero_window_events;
        }
        Some(FlowHistory {
            flow: key.clone(),
            sock_cookie: f.sock_cookie,
            first_seen_ns: f.first_seen_ns,
            last_seen_ns: f.last_seen_ns,
            reached_back_ns: f.first_seen_ns.max(self.cutoff_ns).max(self.started_ns),
            recorder_started_ns: self.started_ns,
            totals: t,
            buckets: f.buckets.iter().cloned().collect(),
            transitions: f
                .transitions
                .iter()
                .map(|(at, from, to)| (*at, from.name(), to.name()))
                .collect(),
            truncated: f.truncated,
        })
    }

    /// The flows held, in key order.
    pub fn keys(&self) -> Vec<FlowKey> {
        let mut k: Vec<FlowKey> = self.flows.keys().cloned().collect();
        k.sort();
        k
    }

    /// Flows held.
    pub fn flows(&self) -> usize {
        self.flows.len()
    }

    /// Counters (the kernel ones are zero: the book never sees the kernel).
    pub fn stats(&self) -> FlightStats {
        FlightStats {
            flows: self.flows.len() as u64,
            ..self.stats.clone()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{Comm, Endpoint, TcpSockState};
    use std::net::{IpAddr, Ipv4Addr};

    const S: u64 = NS_PER_SEC;
    const NS: u32 = 4026531999;

    fn ep(port: u16) -> Endpoint {
        Endpoint {
            addr: IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)),
            port,
        }
    }

    /// A record on local port `l` to remote 15000 at `ts` ns.
    fn rec(kind: TcpEventKind, ts: u64, l: u16) -> TcpRecord {
        TcpRecord {
            event: TcpEvent {
                ts_ns: ts,
                kind,
                sock_cookie: Some(99),
                netns_cookie: None,
                netns_ino: Some(NS),
                local: ep(l),
                remote: ep(15000),
                family: 2,
                state: TcpState(1),
                new_state: (kind == TcpEventKind::StateChange).then_some(TcpState(4)),
                detail: None,
                layout: 0,
                has_sock: true,
                pid: 0,
                comm: Comm::default(),
                sk_key: 0x1000 + u64::from(l),
            },
            sock: TcpSockState {
                snd_wnd: Some(65535),
                rcv_wnd: Some(65535),
                ca_state: None,
                rto: false,
            },
        }
    }

    fn rto(ts: u64, l: u16) -> TcpRecord {
        let mut r = rec(TcpEventKind::Retransmit, ts, l);
        r.sock.ca_state = Some(4);
        r.sock.rto = true;
        r
    }

    fn state(ts: u64, l: u16, from: u8, to: u8) -> TcpRecord {
        let mut r = rec(TcpEventKind::StateChange, ts, l);
        r.event.state = TcpState(from);
        r.event.new_state = Some(TcpState(to));
        r
    }

    fn key(l: u16) -> FlowKey {
        FlowKey::of(&rec(TcpEventKind::Retransmit, 0, l).event)
    }

    fn book() -> FlowBook {
        FlowBook::new(Duration::from_secs(10), 8, 100 * S)
    }

    #[test]
    fn records_fold_into_per_second_buckets_and_totals_are_their_sums() {
        let mut b = book();
        // (record, expected bucket second) table.
        let table = [
            (rec(TcpEventKind::Retransmit, 100 * S + 10, 40000), 100),
            (
                rec(TcpEventKind::Retransmit, 100 * S + 999_999_999, 40000),
                100,
            ),
            (rto(101 * S + 5, 40000), 101),
            (rto(101 * S + 6, 40000), 101),
            (state(103 * S, 40000, 1, 4), 103),
            (rec(TcpEventKind::ReceiveReset, 103 * S + 1, 40000), 103),
        ];
        for (r, _) in &table {
            b.fold(r);
        }
        let h = b.history(&key(40000)).expect("flow");
        let secs: Vec<u64> = h.buckets.iter().map(|x| x.second_start_ns / S).collect();
        assert_eq!(
            secs,
            vec![100, 101, 103],
            "one bucket per second that had records"
        );
        assert_eq!(
            h.buckets
                .iter()
                .map(|x| (
                    x.retransmits,
                    x.rto_retransmits,
                    x.state_changes,
                    x.resets_received
                ))
                .collect::<Vec<_>>(),
            vec![(2, 0, 0, 0), (2, 2, 0, 0), (0, 0, 1, 1)]
        );
        assert_eq!(
            (
                h.totals.retransmits,
                h.totals.rto_retransmits,
                h.totals.resets_received
            ),
            (4, 2, 1)
        );
        assert_eq!(h.totals.resets_sent, 0);
        assert_eq!(h.totals.last_state.as_deref(), Some("FIN_WAIT1"));
        assert_eq!(
            (h.first_seen_ns, h.last_seen_ns),
            (100 * S + 10, 103 * S + 1)
        );
        assert_eq!(h.sock_cookie, Some(99));
        assert_eq!(
            h.transitions,
            vec![(103 * S, "ESTABLISHED".into(), "FIN_WAIT1".into())]
        );
        assert_eq!(b.stats().events_folded, table.len() as u64);
    }

    #[test]
    fn incidents_are_every_reset_with_its_direction_and_the_first_rto_per_flow_per_poll() {
        let mut b = book();
        b.fold(&rto(100 * S, 40000));
        b.fold(&rto(100 * S + 1, 40000));
        b.fold(&rec(TcpEventKind::Retransmit, 100 * S + 2, 40001)); // fast retransmit: no incident
        b.fold(&rec(TcpEventKind::ReceiveReset, 100 * S + 3, 40000));
        b.fold(&rec(TcpEventKind::SendReset, 100 * S + 4, 40001));
        assert_eq!(
            b.take_incidents(),
            vec![
                FlowIncident::Rto {
                    flow: key(40000),
                    at_ns: 100 * S
                },
                FlowIncident::Reset {
                    flow: key(40000),
                    received_from_peer: true,
                    at_ns: 100 * S + 3
                },
                FlowIncident::Reset {
                    flow: key(40001),
                    received_from_peer: false,
                    at_ns: 100 * S + 4
                },
            ]
        );
        assert!(b.take_incidents().is_empty(), "taken once");
        b.fold(&rto(101 * S, 40000));
        assert_eq!(
            b.take_incidents(),
            vec![FlowIncident::Rto {
                flow: key(40000),
                at_ns: 101 * S
            }],
            "a later poll reports the flow's RTO again"
        );
        assert_eq!(b.history(&key(40000)).unwrap().totals.rto_retransmits, 3);
    }

    #[test]
    fn zero_window_counts_only_synchronized_states_where_the_peer_advertised_zero() {
        let mut b = book();
        // (state, snd_wnd, rcv_wnd, counted)
        let table = [
            (1u8, Some(0u32), Some(100u32), true), // ESTABLISHED, peer window 0
            (8, Some(0), Some(7), true),           // CLOSE_WAIT
            (2, Some(0), Some(0), false),          // SYN_SENT: no window yet
            (1, Some(10), Some(0), false),         // our own window 0 is not the peer's
            (1, None, None, false),                // no window read (no full socket)
        ];
        for (i, (st, snd, rcv, _)) in table.iter().enumerate() {
            let mut r = rec(TcpEventKind::Retransmit, 100 * S + i as u64, 40000);
            r.event.state = TcpState(*st);
            r.sock.snd_wnd = *snd;
            r.sock.rcv_wnd = *rcv;
            b.fold(&r);
        }
        let h = b.history(&key(40000)).unwrap();
        let want = table.iter().filter(|t| t.3).count() as u64;
        assert_eq!(h.totals.zero_window_events, want);
        assert_eq!(h.buckets[0].snd_wnd_min, Some(0));
        assert_eq!(h.buckets[0].rcv_wnd_min, Some(0));
    }

    #[test]
    fn horizon_expiry_drops_old_buckets_forgets_idle_flows_and_states_the_reach() {
        let mut b = book(); // horizon 10 s, started at 100 s
        b.fold(&rec(TcpEventKind::Retransmit, 101 * S, 40000));
        b.fold(&rec(TcpEventKind::Retransmit, 105 * S, 40000));
        b.fold(&rec(TcpEventKind::Retransmit, 114 * S, 40000));
        b.fold(&rec(TcpEventKind::Retransmit, 102 * S, 40001)); // idle afterwards
        b.expire(110 * S);
        let h = b.history(&key(40000)).unwrap();
        assert_eq!(
            h.reached_back_ns,
            101 * S,
            "first record, newer than start and cutoff"
        );
        b.expire(115 * S + S / 2); // cutoff 105.5 s
        let h = b.history(&key(40000)).unwrap();
        let secs: Vec<u64> = h.buckets.iter().map(|x| x.second_start_ns / S).collect();
        assert_eq!(
            secs,
            vec![105, 114],
            "the 105 s bucket still reaches past the cutoff"
        );
        assert_eq!(h.totals.retransmits, 2, "totals follow the buckets held");
        assert_eq!(
            h.reached_back_ns,
            105 * S + S / 2,
            "cutoff: older records are gone"
        );
        assert_eq!(h.first_seen_ns, 101 * S);
        assert!(
            !h.truncated,
            "expiry is stated by the reach, not as truncation"
        );
        assert!(
            b.history(&key(40001)).is_none(),
            "idle past the horizon: forgotten"
        );
        assert_eq!(b.stats().flows_expired, 1);
        assert_eq!(b.flows(), 1);
        // The cutoff never moves back, and the recorder start bounds it.
        b.expire(50 * S);
        assert_eq!(
            b.history(&key(40000)).unwrap().reached_back_ns,
            105 * S + S / 2
        );
        let fresh = book();
        let mut fresh = fresh;
        fresh.fold(&rec(TcpEventKind::Retransmit, 90 * S, 40000)); // stamped before start
        assert_eq!(fresh.history(&key(40000)).unwrap().reached_back_ns, 100 * S);
    }

    #[test]
    fn max_flows_evicts_the_least_recently_seen_and_counts_it() {
        let mut b = FlowBook::new(Duration::from_secs(60), 3, 0);
        for (i, l) in [40000u16, 40001, 40002].into_iter().enumerate() {
            b.fold(&rec(TcpEventKind::Retransmit, (i as u64 + 1) * S, l));
        }
        b.fold(&rec(TcpEventKind::Retransmit, 5 * S, 40000)); // 40001 is now the oldest
        b.fold(&rec(TcpEventKind::Retransmit, 6 * S, 40003));
        assert_eq!(b.flows(), 3);
        assert!(
            b.history(&key(40001)).is_none(),
            "least recently seen evicted"
        );
        for l in [40000, 40002, 40003] {
            assert!(b.history(&key(l)).is_some(), "{l} kept");
        }
        assert_eq!(b.stats().flows_evicted, 1);
        for i in 0..100u16 {
            b.fold(&rec(TcpEventKind::Retransmit, 7 * S, 41000 + i));
        }
        assert_eq!(b.flows(), 3, "bounded whatever the number of flows");
        assert_eq!(b.stats().flows_evicted, 101);
    }

    #[test]
    fn a_client_syn_sent_without_a_port_joins_its_flow_and_strays_are_counted() {
        let mut b = book();
        let mut syn = state(100 * S, 0, 7, 2); // CLOSE -> SYN_SENT, port not bound yet
        syn.event.sk_key = 0x1000 + 40000;
        b.fold(&syn);
        assert_eq!(b.flows(), 0, "held until the socket names its flow");
        b.fold(&state(100 * S + 5, 40000, 2, 1)); // SYN_SENT -> ESTABLISHED
        let h = b.history(&key(40000)).unwrap();
        assert_eq!(h.first_seen_ns, 100 * S, "the first transition joined");
        assert_eq!(
            h.transitions
                .iter()
                .map(|t| t.2.as_str())
                .collect::<Vec<_>>(),
            vec!["SYN_SENT", "ESTABLISHED"]
        );
        // A listener's transition (remote port 0) cannot join a flow: counted.
        let mut listen = state(101 * S, 15000, 7, 10);
        listen.event.remote = ep(0);
        b.fold(&listen);
        // A SYN_SENT that never gets a port expires with the horizon: counted.
        let mut lost = state(101 * S, 0, 7, 2);
        lost.event.sk_key = 0xdead;
        b.fold(&lost);
        assert_eq!(b.stats().events_unattributed, 1);
        b.expire(200 * S);
        assert_eq!(b.stats().events_unattributed, 2);
    }

    #[test]
    fn a_reused_four_tuple_after_close_starts_a_new_history() {
        let mut b = book();
        b.fold(&rec(TcpEventKind::Retransmit, 100 * S, 40000));
        b.fold(&state(101 * S, 40000, 1, 7));
        b.fold(&state(102 * S, 40000, 7, 2));
        let h = b.history(&key(40000)).unwrap();
        assert_eq!(h.first_seen_ns, 102 * S);
        assert_eq!(
            h.totals.retransmits, 0,
            "the old connection's counts are not the new one's"
        );
        assert_eq!(b.flows(), 1);
    }

    #[test]
    fn transitions_keep_the_most_recent_and_say_truncated() {
        let mut b = book();
        for i in 0..(MAX_TRANSITIONS as u64 + 5) {
            b.fold(&state(100 * S + i, 40000, 1, 4));
        }
        let h = b.history(&key(40000)).unwrap();
        assert_eq!(h.transitions.len(), MAX_TRANSITIONS);
        assert_eq!(h.transitions[0].0, 100 * S + 5, "oldest dropped");
        assert!(h.truncated);
        assert_eq!(
            h.totals.state_changes,
            MAX_TRANSITIONS as u64 + 5,
            "counts stay exact"
        );
    }

    #[test]
    fn out_of_order_records_land_in_their_own_second_and_buckets_are_capped() {
        let mut b = FlowBook::new(Duration::from_secs(3), 4, 0); // at most 5 buckets
        for s in [5u64, 3, 4, 1] {
            b.fold(&rec(TcpEventKind::Retransmit, s * S, 40000));
        }
        let secs = |b: &FlowBook| -> Vec<u64> {
            b.history(&key(40000))
                .unwrap()
                .buckets
                .iter()
                .map(|x| x.second_start_ns / S)
                .collect()
        };
        assert_eq!(secs(&b), vec![1, 3, 4, 5]);
        assert!(!b.history(&key(40000)).unwrap().truncated);
        b.fold(&rec(TcpEventKind::Retransmit, 6 * S, 40000));
        b.fold(&rec(TcpEventKind::Retransmit, 7 * S, 40000)); // no expiry ran: cap
        assert_eq!(secs(&b), vec![3, 4, 5, 6, 7]);
        b.fold(&rec(TcpEventKind::Retransmit, 0, 40000)); // older than all, at the cap
        assert_eq!(secs(&b), vec![3, 4, 5, 6, 7]);
        let h = b.history(&key(40000)).unwrap();
        assert!(h.truncated);
        assert_eq!(b.stats().events_folded, 6);
        assert_eq!(
            b.stats().events_unattributed,
            1,
            "the record no bucket could hold"
        );
    }

    #[test]
    fn incidents_beyond_the_cap_are_counted() {
        let mut b = FlowBook::new(Duration::from_secs(60), 10, 0);
        for i in 0..(MAX_INCIDENTS as u64 + 3) {
            b.fold(&rec(TcpEventKind::SendReset, i, 40000));
        }
        assert_eq!(b.take_incidents().len(), MAX_INCIDENTS);
        assert_eq!(b.stats().incidents_dropped, 3);
    }

    #[test]
    fn history_serializes_times_as_monotonic_ns_and_offsets_before_the_last_record() {
        let mut b = book();
        b.fold(&rec(TcpEventKind::Retransmit, 101 * S, 40000));
        b.fold(&state(104 * S, 40000, 1, 7));
        let j = serde_json::to_value(b.history(&key(40000)).unwrap()).unwrap();
        assert_eq!(j["flow"]["local"], "10.0.0.1:40000");
        assert_eq!(j["flow"]["netns_ino"], NS);
        assert_eq!(j["last_seen_ns"], 104 * S);
        assert_eq!(j["reached_back_ns"], 101 * S);
        assert_eq!(j["reached_back_before_last_ns"], 3 * S);
        assert_eq!(j["buckets"][0]["second_start_ns"], 101 * S);
        assert_eq!(j["buckets"][0]["before_last_ns"], 3 * S);
        assert_eq!(j["buckets"][0]["retransmits"], 1);
        assert_eq!(j["buckets"][0]["snd_wnd_min"], 65535);
        assert_eq!(j["transitions"][0]["before_last_ns"], 0);
        assert_eq!(j["transitions"][0]["to"], "CLOSE");
        assert_eq!(j["totals"]["last_state"], "CLOSE");
        let inc = serde_json::to_value(FlowIncident::Rto {
            flow: key(1),
            at_ns: 5,
        })
        .unwrap();
        assert_eq!(inc["kind"], "rto");
    }

    #[test]
    fn recorder_and_book_are_send_for_a_daemon_task() {
        fn send<T: Send>() {}
        send::<FlightRecorder>();
        send::<FlowBook>();
        send::<FlowHistory>();
    }

    #[test]
    fn config_is_validated_naming_the_field() {
        assert!(FlightConfig::default().validate().is_ok());
        for (cfg, param) in [
            (
                FlightConfig {
                    ports: (20000, 10000),
                    ..FlightConfig::default()
                },
                "flight.ports",
            ),
            (
                FlightConfig {
                    ports: (0, 10),
                    ..FlightConfig::default()
                },
                "flight.ports",
            ),
            (
                FlightConfig {
                    horizon: Duration::ZERO,
                    ..FlightConfig::default()
                },
                "flight.horizon",
            ),
            (
                FlightConfig {
                    max_flows: 0,
                    ..FlightConfig::default()
                },
                "flight.max_flows",
            ),
        ] {
            match cfg.validate() {
                Err(EbpfError::InvalidConfig { param: p, .. }) => assert_eq!(p, param),
                other => panic!("{param}: {other:?}"),
            }
        }
        let one = FlightConfig {
            ports: (15000, 15000),
            ..FlightConfig::default()
        };
        assert!(one.validate().is_ok(), "one port is a range");
    }
}
