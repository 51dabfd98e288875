//! Both ends of a transfer, the pure part: what the store indexes of an
//! envelope to find the envelope of the other end, and what a joined pair
//! says side by side. Storage is `db::transfers`; routes are
//! `http_transfers`.
//!
//! Invariants:
//! - **Two bases, nothing looser.** `mirrored_4tuple`: two `network_stream`
//!   envelopes of different sockets whose endpoints mirror each other (one's
//!   local is the other's remote and back, same protocol) and whose capture
//!   windows overlap or lie within the join window. `transfer_id`: two
//!   `storage_transfer` envelopes with the same transfer id shipped by
//!   different nodes (API keys). Nothing is joined on an address alone, a
//!   port alone, or a time alone.
//! - **Arrival order does not matter.** A transfer's id and its sides are
//!   functions of the joined subjects (mirrored) or of the transfer id, never
//!   of which envelope came first, so either order yields the same row.
//! - **Verdicts come from facts, never from a guess.** Which side sent the
//!   RST is named only from a `rst_sent_by_local` fact on that side or a
//!   `rst_received_from_peer` fact on the other; which side's receive window
//!   was zero only from `local_zero_window` on that side or
//!   `peer_zero_window` on the other. Inferences (e.g.
//!   `reset_by_peer_inferred`) are listed but decide nothing; where no side
//!   states a fact the verdict is `unknown`.
//! - Counters are copied as the envelope carries them (numbers or the
//!   decimal strings of u64 values), never recomputed or rounded.

use std::time::Duration;

use pstack_envelope::facts::{
    EbpfTcpCounts, Facts as _, FlightRecorderFacts, SocketFacts, StreamsFacts, TcpInfoView,
    flight_recorder, socket,
};
use pstack_envelope::{
    ClaimCode, ClaimKind, Clock, Envelope, Subject, SurfaceStatus, sha256_digest,
};
use serde::Serialize;
use serde_json::{Map, Value};

/// How far apart two capture windows may lie and still be joined, by default.
pub const DEFAULT_JOIN_WINDOW: Duration = Duration::from_secs(120);

/// Surface ids the view reads.
mod sid {
    pub use pstack_envelope::surface_id::network_stream::{
        EBPF_TCP, FLIGHT_RECORDER, TCP_END, TCP_START,
    };
    pub use pstack_envelope::surface_id::storage_transfer::STREAMS;
}

/// Why two envelopes were joined.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Basis {
    /// Two stream ends whose 4-tuples mirror each other within the window.
    #[serde(rename = "mirrored_4tuple")]
    Mirrored4tuple,
    /// Two storage transfers with the same transfer id.
    TransferId,
}

impl Basis {
    /// Wire and column name.
    pub fn as_str(self) -> &'static str {
        match self {
            Basis::Mirrored4tuple => "mirrored_4tuple",
            Basis::TransferId => "transfer_id",
        }
    }

    /// From the column.
    pub fn parse(s: &str) -> Option<Basis> {
        match s {
            "mirrored_4tuple" => Some(Basis::Mirrored4tuple),
            "transfer_id" => Some(Basis::TransferId),
            _ => None,
        }
    }
}

/// What the store indexes of one envelope to find its other end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JoinCandidate {
    /// The basis it can be joined on.
    pub basis: Basis,
    /// This end's view: `proto local remote` (mirrored) or the transfer id.
    pub near: String,
    /// What the other end's `near` must be: `proto remote local`, or the
    /// same transfer id.
    pub far: String,
    /// Capture window start, ns since the epoch.
    pub start_ns: i64,
    /// Capture window end, ns since the epoch.
    pub end_ns: i64,
}

impl JoinCandidate {
    /// The key that serializes concurrent linkers of one would-be transfer
    /// (the same for both ends).
    pub fn lock_key(&self) -> String {
        let (a, b) = if self.near <= self.far {
            (&self.near, &self.far)
        } else {
            (&self.far, &self.near)
        };
        format!("{}\n{a}\n{b}", self.basis.as_str())
    }
}

/// The join index of an envelope, if its kind can be joined. `wall_ns` is its
/// capture start (already validated at ingest).
pub fn candidate(subject: &Subject, clock: &Clock, wall_ns: i64) -> Option<JoinCandidate> {
    let span = window_ns(clock);
    match subject {
        Subject::NetworkStream(s) => Some(JoinCandidate {
            basis: Basis::Mirrored4tuple,
            near: format!("{} {} {}", s.protocol, endpoint(&s.src), endpoint(&s.dst)),
            far: format!("{} {} {}", s.protocol, endpoint(&s.dst), endpoint(&s.src)),
            start_ns: wall_ns,
            end_ns: wall_ns.saturating_add(span),
        }),
        Subject::StorageTransfer(t) => Some(JoinCandidate {
            basis: Basis::TransferId,
            near: t.transfer_id.clone(),
            far: t.transfer_id.clone(),
            start_ns: wall_ns,
            end_ns: wall_ns.saturating_add(span),
        }),
        _ => None,
    }
}

/// An endpoint in one canonical spelling, so two views compare equal: an
/// IPv4-mapped IPv6 address (a dual-stack socket's view of an IPv4 peer) as
/// IPv4, IPv6 compressed. Text that is not `ADDR:PORT` is kept as it is.
fn endpoint(s: &str) -> String {
    match s.parse::<std::net::SocketAddr>() {
        Ok(a) => match a.ip() {
            std::net::IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => std::net::SocketAddr::new(v4.into(), a.port()).to_string(),
                None => a.to_string(),
            },
            std::net::IpAddr::V4(_) => a.to_string(),
        },
        Err(_) => s.to_string(),
    }
}

/// Length of the capture window (monotonic end − start), 0 when unreadable.
fn window_ns(clock: &Clock) -> i64 {
    let a = clock.monotonic_start_ns.parse::<u64>().ok();
    let b = clock.monotonic_end_ns.parse::<u64>().ok();
    match (a, b) {
        (Some(a), Some(b)) if b >= a => i64::try_from(b - a).unwrap_or(i64::MAX),
        _ => 0,
    }
}

/// A transfer id: `trf_` + 16 hex digits of the digest of basis and join key
/// (deterministic: both arrival orders derive the same id).
pub fn transfer_id(basis: Basis, join_key: &str) -> String {
    let d = sha256_digest(format!("{}\n{join_key}", basis.as_str()).as_bytes());
    format!("trf_{}", &d["sha256:".len().."sha256:".len() + 16])
}

/// Whether `s` has the shape of a transfer id.
pub fn is_transfer_id(s: &str) -> bool {
    s.strip_prefix("trf_").is_some_and(|h| {
        h.len() == 16
            && h.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

/// The join key of a mirrored pair: the two subject keys, sorted.
pub fn mirrored_join_key(a: &str, b: &str) -> String {
    if a <= b {
        format!("{a}|{b}")
    } else {
        format!("{b}|{a}")
    }
}

/// One stated fact relevant to a verdict.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Stated {
    /// Claim code (`rst_sent_by_local`, …).
    pub code: String,
    /// `fact` or `inference`.
    pub kind: &'static str,
    /// The envelope that states it.
    pub envelope: String,
    /// For a storage transfer: the linked stream envelope the code came from.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub via_stream: Option<String>,
}

/// Verdict-bearing claim codes.
const RST_SENT: &str = ClaimCode::RstSentByLocal.as_str();
const RST_RECEIVED: &str = ClaimCode::RstReceivedFromPeer.as_str();
const LOCAL_ZERO: &str = ClaimCode::LocalZeroWindow.as_str();
const PEER_ZERO: &str = ClaimCode::PeerZeroWindow.as_str();
/// Whether a code is listed on an end (facts decide, inferences are shown).
fn listed(code: &str) -> bool {
    matches!(
        ClaimCode::parse(code),
        Some(
            ClaimCode::RstSentByLocal
                | ClaimCode::RstReceivedFromPeer
                | ClaimCode::LocalZeroWindow
                | ClaimCode::PeerZeroWindow
                | ClaimCode::ResetByPeerInferred
                | ClaimCode::FlowRetransmits
                | ClaimCode::FlowRtoTimeouts
        )
    )
}

/// What one envelope says about its end of the transfer.
#[derive(Debug, Clone, Serialize)]
pub struct EndView {
    /// Envelope digest.
    pub envelope: String,
    /// Subject kind.
    pub kind: &'static str,
    /// Capture start (RFC 3339).
    pub wall_time: String,
    /// Completeness.
    pub completeness: &'static str,
    /// Network namespace of the view, when stated.
    pub netns: Option<String>,
    /// Local endpoint(s).
    pub local: Vec<String>,
    /// Remote endpoint(s).
    pub remote: Vec<String>,
    /// Socket cookie(s) (flow ids).
    pub flow_ids: Vec<String>,
    /// Counters as the envelope carries them, by source surface.
    pub counters: Map<String, Value>,
    /// The verdict-relevant claims it makes.
    pub stated: Vec<Stated>,
    /// The watch rule that fired the capture (`collector.trigger`), absent
    /// for an operator's capture.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fired_by: Option<Value>,
    /// Storage transfer only: its capture role, as it states it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    /// Storage transfer only: the stream envelopes it links.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub linked_streams: Vec<String>,
}

fn surface<'a>(env: &'a Envelope, id: &str) -> Option<&'a Map<String, Value>> {
    env.surfaces
        .iter()
        .find(|s| s.id == id && matches!(s.status, SurfaceStatus::Ok | SurfaceStatus::Truncated))
        .map(|s| &s.facts)
}

fn push_unique(v: &mut Vec<String>, s: &str) {
    if !v.iter().any(|x| x == s) {
        v.push(s.to_string());
    }
}

/// The end view of one envelope.
pub fn end_view(env: &Envelope, wall_time: String) -> EndView {
    let mut view =
        EndView {
            envelope: env.digest.clone(),
            kind: env.subject.kind(),
            wall_time,
            completeness: env.completeness.as_str(),
            netns: None,
            local: Vec::new(),
            remote: Vec::new(),
            flow_ids: Vec::new(),
            counters: Map::new(),
            stated: Vec::new(),
            fired_by: env.collector.trigger.as_ref().map(
                |t| serde_json::json!({"rule": t.rule, "kind": t.kind, "fired_at": t.fired_at}),
            ),
            role: None,
            linked_streams: Vec::new(),
        };
    for c in &env.claims {
        let kind = match c.kind {
            ClaimKind::Fact => "fact",
            ClaimKind::Inference => "inference",
            ClaimKind::Hypothesis => continue,
        };
        if listed(&c.code) {
            view.stated.push(Stated {
                code: c.code.clone(),
                kind,
                envelope: env.digest.clone(),
                via_stream: None,
            });
        }
    }
    match &env.subject {
        Subject::NetworkStream(s) => {
            view.netns = s.net_ns.clone();
            view.local.push(s.src.clone());
            view.remote.push(s.dst.clone());
            view.flow_ids.push(s.flow_id.clone());
            // Each surface read through the type its engine writes
            // (`pstack_envelope::facts`); the view shows the members present.
            if let Some(end) = surface(env, sid::TCP_END) {
                let end = SocketFacts::read(end);
                if let Some(d) = end.delta.map(|d| d.present())
                    && !d.is_empty()
                {
                    view.counters.insert("tcp_delta".into(), Value::Object(d));
                }
                if let Some(info) = end.tcp_info {
                    let mut i = info.present();
                    for (k, v) in [
                        (socket::RQUEUE, end.rqueue),
                        (socket::WQUEUE, end.wqueue),
                        (socket::TIMER, end.timer),
                    ] {
                        if let Some(v) = v.and_then(|v| serde_json::to_value(v).ok()) {
                            i.insert(k.into(), v);
                        }
                    }
                    view.counters
                        .insert("tcp_info_end".into(), Value::Object(i));
                }
            } else if let Some(start) = surface(env, sid::TCP_START)
                && let Some(info) = SocketFacts::read(start).tcp_info
            {
                // At the start the byte counters say nothing yet.
                let info = TcpInfoView {
                    bytes_acked: None,
                    bytes_received: None,
                    ..info
                };
                view.counters
                    .insert("tcp_info_start".into(), Value::Object(info.present()));
            }
            if let Some(r) = surface(env, sid::FLIGHT_RECORDER) {
                let r = FlightRecorderFacts::read(r);
                let mut f = r.totals.map(|t| t.present()).unwrap_or_default();
                if let Some(ns) = r.reached_back_before_last_ns {
                    f.insert(
                        flight_recorder::REACHED_BACK_BEFORE_LAST_NS.into(),
                        ns.into(),
                    );
                }
                view.counters
                    .insert("flight_recorder".into(), Value::Object(f));
            }
            if let Some(e) = surface(env, sid::EBPF_TCP) {
                let e = EbpfTcpCounts::read(e).present();
                if !e.is_empty() {
                    view.counters.insert("ebpf".into(), Value::Object(e));
                }
            }
        }
        Subject::StorageTransfer(_) => {
            view.role = role_of(env);
            if let Some(s) = surface(env, sid::STREAMS) {
                let s = StreamsFacts::read(s);
                if let Some(ns) = s.net_ns {
                    view.netns = Some(ns);
                }
                for link in &s.links {
                    let d = link.digest.as_str();
                    push_unique(&mut view.linked_streams, d);
                    for (v, into) in [(&link.src, &mut view.local), (&link.dst, &mut view.remote)] {
                        if let Some(v) = v {
                            push_unique(into, v);
                        }
                    }
                    if let Some(f) = &link.flow_id {
                        push_unique(&mut view.flow_ids, f);
                    }
                    // The transfer envelope lists each stream's claims as
                    // `kind:code`.
                    for (kind, code) in link.claims() {
                        let kind = match kind {
                            ClaimKind::Fact => "fact",
                            ClaimKind::Inference => "inference",
                            ClaimKind::Hypothesis => continue,
                        };
                        if listed(code) {
                            view.stated.push(Stated {
                                code: code.to_string(),
                                kind,
                                envelope: env.digest.clone(),
                                via_stream: Some(d.to_string()),
                            });
                        }
                    }
                }
            }
        }
        _ => {}
    }
    view
}

/// The capture role a storage transfer envelope states (`role=` of its
/// universe selector, as the Longhorn engine writes it).
fn role_of(env: &Envelope) -> Option<String> {
    env.universe
        .selector
        .split_whitespace()
        .find_map(|t| t.strip_prefix("role="))
        .filter(|r| !r.is_empty() && *r != "unknown")
        .map(str::to_string)
}

/// One side of a transfer.
#[derive(Debug, Clone, Serialize)]
pub struct SideView {
    /// `a`, `b`, … (ordered by the side's key, not by arrival).
    pub side: String,
    /// The node(s) that shipped its envelopes (API key names).
    pub nodes: Vec<String>,
    /// Network namespace(s) of its view.
    pub netns: Vec<String>,
    /// Local endpoint(s).
    pub local: Vec<String>,
    /// Remote endpoint(s).
    pub remote: Vec<String>,
    /// Storage transfer: the capture role(s) its envelopes state.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub roles: Vec<String>,
    /// Its envelopes, oldest capture first (the newest ones when the side
    /// has more than the store reads per view).
    pub ends: Vec<EndView>,
    /// How many envelopes the side has in the store; more than `ends` holds
    /// when the view was cut, and then the verdicts rest on `ends` only.
    pub ends_total: u64,
}

impl SideView {
    /// Assemble a side from its ends (and the names of the nodes that
    /// shipped them).
    pub fn new(side: String, ends: Vec<EndView>, nodes: Vec<String>) -> SideView {
        let ends_total = ends.len() as u64;
        let mut s = SideView {
            ends_total,
            side,
            nodes: Vec::new(),
            netns: Vec::new(),
            local: Vec::new(),
            remote: Vec::new(),
            roles: Vec::new(),
            ends,
        };
        for n in &nodes {
            push_unique(&mut s.nodes, n);
        }
        for e in &s.ends {
            if let Some(n) = &e.netns {
                push_unique(&mut s.netns, n);
            }
            for l in &e.local {
                push_unique(&mut s.local, l);
            }
            for r in &e.remote {
                push_unique(&mut s.remote, r);
            }
            if let Some(r) = &e.role {
                push_unique(&mut s.roles, r);
            }
        }
        s
    }

    fn states(&self, code: &str) -> Vec<&Stated> {
        self.ends
            .iter()
            .flat_map(|e| e.stated.iter())
            .filter(|s| s.kind == "fact" && s.code == code)
            .collect()
    }
}

/// A verdict: which side(s), and the facts it rests on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Verdict {
    /// `a`, `b`, … when one side; `both` (every side, of two); `unknown`
    /// when no side states a fact that decides it.
    pub side: String,
    /// Every side the facts name (empty when unknown).
    pub sides: Vec<String>,
    /// The facts, each with the side that states it.
    pub because: Vec<Because>,
}

/// One fact behind a verdict.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Because {
    /// The side whose envelope states it.
    pub stated_by: String,
    /// The claim code.
    pub code: String,
    /// The envelope.
    pub envelope: String,
    /// The linked stream the code came from (storage transfers).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub via_stream: Option<String>,
}

/// The verdicts over a transfer's sides.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Verdicts {
    /// Which side sent the RST.
    pub rst_sent_by: Verdict,
    /// Which side's receive window was zero.
    pub zero_window_on: Verdict,
}

/// Decide who did `self_code` on their own side, or who the other side says
/// did it (`peer_code`: only attributable with exactly two sides).
fn decide(sides: &[SideView], self_code: &str, peer_code: &str) -> Verdict {
    let mut named: Vec<String> = Vec::new();
    let mut because = Vec::new();
    for (i, s) in sides.iter().enumerate() {
        for st in s.states(self_code) {
            push_unique(&mut named, &s.side);
            because.push(Because {
                stated_by: s.side.clone(),
                code: st.code.clone(),
                envelope: st.envelope.clone(),
                via_stream: st.via_stream.clone(),
            });
        }
        if sides.len() == 2 {
            let other = &sides[1 - i];
            for st in s.states(peer_code) {
                push_unique(&mut named, &other.side);
                because.push(Because {
                    stated_by: s.side.clone(),
                    code: st.code.clone(),
                    envelope: st.envelope.clone(),
                    via_stream: st.via_stream.clone(),
                });
            }
        }
    }
    named.sort();
    let side = match named.len() {
        0 => "unknown".to_string(),
        1 => named[0].clone(),
        n if n == sides.len() => "both".to_string(),
        _ => named.join(","),
    };
    Verdict {
        side,
        sides: named,
        because,
    }
}

/// The verdicts over `sides` (see the module invariants).
pub fn verdicts(sides: &[SideView]) -> Verdicts {
    Verdicts {
        rst_sent_by: decide(sides, RST_SENT, RST_RECEIVED),
        zero_window_on: decide(sides, LOCAL_ZERO, PEER_ZERO),
    }
}

/// A transfer as served: both ends side by side.
#[derive(Debug, Clone, Serialize)]
pub struct TransferView {
    /// `trf_…`.
    pub id: String,
    /// `mirrored_4tuple` or `transfer_id`.
    pub basis: Basis,
    /// The joined subject keys (mirrored) or the transfer id.
    pub join_key: String,
    /// When the store first linked it (RFC 3339).
    pub linked_at: String,
    /// The sides, `a` first.
    pub sides: Vec<SideView>,
    /// Who sent the RST, whose window was zero.
    pub verdicts: Verdicts,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn end(side_codes: &[(&str, &str)]) -> EndView {
        EndView {
            envelope: "sha256:e".into(),
            kind: "network_stream",
            wall_time: String::new(),
            completeness: "complete",
            netns: None,
            local: vec![],
            remote: vec![],
            flow_ids: vec![],
            counters: Map::new(),
            stated: side_codes
                .iter()
                .map(|(kind, code)| Stated {
                    code: code.to_string(),
                    kind: if *kind == "fact" { "fact" } else { "inference" },
                    envelope: "sha256:e".into(),
                    via_stream: None,
                })
                .collect(),
            fired_by: None,
            role: None,
            linked_streams: vec![],
        }
    }

    fn sides(a: &[(&str, &str)], b: &[(&str, &str)]) -> Vec<SideView> {
        vec![
            SideView::new("a".into(), vec![end(a)], vec![]),
            SideView::new("b".into(), vec![end(b)], vec![]),
        ]
    }

    #[test]
    fn rst_is_attributed_from_either_sides_fact() {
        let v = verdicts(&sides(&[("fact", RST_SENT)], &[]));
        assert_eq!(v.rst_sent_by.side, "a");
        let v = verdicts(&sides(&[("fact", RST_RECEIVED)], &[]));
        assert_eq!(v.rst_sent_by.side, "b", "a received it: b sent it");
        let v = verdicts(&sides(&[("fact", RST_SENT)], &[("fact", RST_SENT)]));
        assert_eq!(v.rst_sent_by.side, "both");
    }

    #[test]
    fn an_inference_or_silence_decides_nothing() {
        let v = verdicts(&sides(&[("inference", "reset_by_peer_inferred")], &[]));
        assert_eq!(v.rst_sent_by.side, "unknown");
        assert!(v.rst_sent_by.because.is_empty());
        assert_eq!(v.zero_window_on.side, "unknown");
    }

    #[test]
    fn zero_window_side_from_local_or_peer_fact() {
        let v = verdicts(&sides(&[], &[("fact", PEER_ZERO)]));
        assert_eq!(v.zero_window_on.side, "a", "b saw a's window at zero");
        let v = verdicts(&sides(&[], &[("fact", LOCAL_ZERO)]));
        assert_eq!(v.zero_window_on.side, "b");
    }

    #[test]
    fn endpoints_compare_in_one_spelling() {
        assert_eq!(endpoint("[::ffff:10.0.0.1]:40000"), "10.0.0.1:40000");
        assert_eq!(endpoint("[fd00:0:0::2]:10001"), "[fd00::2]:10001");
        assert_eq!(endpoint("10.0.0.2:10001"), "10.0.0.2:10001");
        assert_eq!(endpoint("not an endpoint"), "not an endpoint");
    }

    #[test]
    fn basis_wire_names_match_the_columns() {
        for b in [Basis::Mirrored4tuple, Basis::TransferId] {
            assert_eq!(serde_json::to_value(b).unwrap(), b.as_str());
            assert_eq!(Basis::parse(b.as_str()), Some(b));
        }
    }

    #[test]
    fn transfer_ids_are_deterministic_and_checked() {
        let k = mirrored_join_key("sha256:b", "sha256:a");
        assert_eq!(k, mirrored_join_key("sha256:a", "sha256:b"));
        let id = transfer_id(Basis::Mirrored4tuple, &k);
        assert!(is_transfer_id(&id), "{id}");
        assert_ne!(id, transfer_id(Basis::TransferId, &k));
        for bad in ["trf_", "trf_0123456789abcdeg", "x", "trf_0123456789ABCDEF"] {
            assert!(!is_transfer_id(bad), "{bad}");
        }
    }
}
