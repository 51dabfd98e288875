//! The facts the store reads, typed: the keys of each surface's facts and
//! the structs both sides use — engines write them into a surface, the store
//! reads a surface's facts back as them.
//!
//! Invariants:
//! - **One spelling.** A fact key or member the store reads is a field or a
//!   constant here; renaming one is a change to this file that the engine
//!   that writes it and the store that reads it both follow. Where the
//!   engine writes a richer struct of another crate (the kernel's
//!   `tcp_info`, the per-flow deltas), the struct here is the store's view
//!   of it, and a test in the engine's crate checks that everything the
//!   view names is written (`FIELDS`).
//! - **Same bytes.** A struct writes exactly the members and value forms the
//!   engine wrote before it existed (numbers the engine writes as decimal
//!   strings stay strings: [`Scalar`]), so digests do not move.
//! - **Read leniently.** The store keeps envelopes of older and newer
//!   engines: a member that is absent, null or of another type reads as
//!   `None` (and a link that is not one is skipped), so one odd member never
//!   hides the rest of a surface. Nothing here refuses an envelope; sealing
//!   and verification do that.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{Map, Value};

use crate::ClaimKind;

/// Facts of a socket surface (`tcp/start`, `tcp/end`): [`SocketFacts`].
pub mod socket {
    /// `tcp_info` counter deltas end − start (`tcp/end` only).
    pub const DELTA: &str = "delta";
    /// The socket's `tcp_info` (null when the kernel gave none).
    pub const TCP_INFO: &str = "tcp_info";
    /// Bytes in the receive queue.
    pub const RQUEUE: &str = "rqueue";
    /// Bytes in the send queue.
    pub const WQUEUE: &str = "wqueue";
    /// The socket's pending timer.
    pub const TIMER: &str = "timer";
}

/// Facts of the `ebpf/tcp` surface: [`EbpfTcpCounts`].
pub mod ebpf_tcp {
    /// Retransmits of the cookie in the window.
    pub const RETRANSMITS: &str = "retransmits";
    /// RSTs this side sent.
    pub const RESETS_SENT: &str = "resets_sent";
    /// RSTs received from the peer.
    pub const RESETS_RECEIVED: &str = "resets_received";
}

/// Facts of the `ebpf/flight_recorder` surface: [`FlightRecorderFacts`].
pub mod flight_recorder {
    /// The flow's counters over what the recorder holds ([`FlightTotals`](super::FlightTotals)).
    pub const TOTALS: &str = "totals";
    /// How far before the last event the record reaches, ns.
    pub const REACHED_BACK_BEFORE_LAST_NS: &str = "reached_back_before_last_ns";
}

/// Facts of the `streams` surface of a storage transfer: [`StreamsFacts`].
pub mod streams {
    /// The linked stream envelopes ([`StreamLink`](super::StreamLink)).
    pub const LINKS: &str = "links";
    /// The network namespace the streams were read in.
    pub const NET_NS: &str = "net_ns";
}

/// A number as an engine writes it into facts: a JSON integer when exact,
/// else a decimal string (the kernel's u64 counters, deltas beyond 2^53).
/// Read and written in the form it came in (any JSON number is kept as it
/// was written).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Scalar {
    /// A JSON number.
    Number(serde_json::Number),
    /// A decimal string (or a name, such as a TCP state).
    Text(String),
}

impl Scalar {
    /// An integer.
    pub fn int(n: i64) -> Scalar {
        Scalar::Number(n.into())
    }
}

/// A typed view of one surface's facts.
pub trait Facts: Serialize + DeserializeOwned + Default {
    /// Read a surface's facts as this view (leniently; see the module).
    fn read(facts: &Map<String, Value>) -> Self {
        Self::deserialize(facts).unwrap_or_default()
    }

    /// The members present, nulls left out: what the store shows.
    fn present(&self) -> Map<String, Value> {
        match serde_json::to_value(self) {
            Ok(Value::Object(mut m)) => {
                m.retain(|_, v| !v.is_null());
                m
            }
            _ => Map::new(),
        }
    }

    /// Write the members present into a surface's facts (an engine's side).
    fn write_into(&self, facts: &mut Map<String, Value>) {
        facts.extend(self.present());
    }
}

/// A view whose every member is optional and read leniently: the struct,
/// its [`Facts`] impl and `FIELDS`, the members as written in facts (the
/// engines' tests check their output against it).
macro_rules! fact_view {
    ($(#[doc = $doc:literal])* pub struct $name:ident {
        $($(#[doc = $fdoc:literal])* $field:ident: $ty:ty,)+
    }) => {
        $(#[doc = $doc])*
        #[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
        pub struct $name {
            $(
                $(#[doc = $fdoc])*
                #[serde(default, deserialize_with = "lenient", skip_serializing_if = "Option::is_none")]
                pub $field: Option<$ty>,
            )+
        }

        impl Facts for $name {}

        impl $name {
            /// Every member, as written in facts.
            pub const FIELDS: &'static [&'static str] = &[$(stringify!($field)),+];
        }
    };
}

fact_view! {
    /// The eBPF TCP counters of one flow in a capture window (`ebpf/tcp`).
    pub struct EbpfTcpCounts {
        /// Retransmits of the cookie in the window.
        retransmits: u64,
        /// RSTs this side sent.
        resets_sent: u64,
        /// RSTs received from the peer.
        resets_received: u64,
    }
}

/// A flow's counts over what pstackd's flight recorder holds (the `totals`
/// of `ebpf/flight_recorder`). Members in the order the recorder always
/// wrote them; `last_state` is written as null when unknown.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlightTotals {
    /// Retransmits sent by this end (RTO and fast retransmits alike).
    #[serde(
        default,
        deserialize_with = "lenient",
        skip_serializing_if = "Option::is_none"
    )]
    pub retransmits: Option<u64>,
    /// The subset of `retransmits` sent in `TCP_CA_Loss` (RTO timer).
    #[serde(
        default,
        deserialize_with = "lenient",
        skip_serializing_if = "Option::is_none"
    )]
    pub rto_retransmits: Option<u64>,
    /// RSTs this end received from the peer.
    #[serde(
        default,
        deserialize_with = "lenient",
        skip_serializing_if = "Option::is_none"
    )]
    pub resets_received: Option<u64>,
    /// RSTs this end sent.
    #[serde(
        default,
        deserialize_with = "lenient",
        skip_serializing_if = "Option::is_none"
    )]
    pub resets_sent: Option<u64>,
    /// State changes.
    #[serde(
        default,
        deserialize_with = "lenient",
        skip_serializing_if = "Option::is_none"
    )]
    pub state_changes: Option<u64>,
    /// Records while the peer advertised a zero receive window.
    #[serde(
        default,
        deserialize_with = "lenient",
        skip_serializing_if = "Option::is_none"
    )]
    pub zero_window_events: Option<u64>,
    /// Last state known (kernel name without `TCP_`).
    #[serde(default, deserialize_with = "lenient")]
    pub last_state: Option<String>,
}

impl Facts for FlightTotals {}

/// What the store reads of `ebpf/flight_recorder`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlightRecorderFacts {
    /// The flow's counts.
    #[serde(
        default,
        deserialize_with = "lenient_object",
        skip_serializing_if = "Option::is_none"
    )]
    pub totals: Option<FlightTotals>,
    /// How far before the last event the record reaches, ns.
    #[serde(
        default,
        deserialize_with = "lenient",
        skip_serializing_if = "Option::is_none"
    )]
    pub reached_back_before_last_ns: Option<u64>,
}

impl Facts for FlightRecorderFacts {}

fact_view! {
    /// The store's view of a socket's `tcp_info` (the engine writes the whole
    /// kernel struct, u64 counters as decimal strings, plus `state_name`).
    pub struct TcpInfoView {
        /// The TCP state's name (`ESTABLISHED`, …).
        state_name: Scalar,
        /// Retransmission timeout, µs.
        rto_us: Scalar,
        /// Peer's advertised window.
        snd_wnd: Scalar,
        /// Our advertised window.
        rcv_wnd: Scalar,
        /// Retransmitted segments over the socket's life.
        total_retrans: Scalar,
        /// Bytes acknowledged by the peer.
        bytes_acked: Scalar,
        /// Bytes received.
        bytes_received: Scalar,
    }
}

fact_view! {
    /// The store's view of a flow's `tcp_info` deltas end − start (the engine
    /// writes more counters than these).
    pub struct TcpDelta {
        /// Retransmitted segments.
        total_retrans: Scalar,
        /// RTO expirations.
        total_rto: Scalar,
        /// Bytes acknowledged.
        bytes_acked: Scalar,
        /// Bytes received.
        bytes_received: Scalar,
        /// Bytes retransmitted.
        bytes_retrans: Scalar,
        /// Segments sent.
        segs_out: Scalar,
        /// Segments received.
        segs_in: Scalar,
    }
}

/// What the store reads of a socket surface (`tcp/start`, `tcp/end`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SocketFacts {
    /// The socket's `tcp_info`.
    #[serde(
        default,
        deserialize_with = "lenient_object",
        skip_serializing_if = "Option::is_none"
    )]
    pub tcp_info: Option<TcpInfoView>,
    /// Deltas end − start (`tcp/end` only).
    #[serde(
        default,
        deserialize_with = "lenient_object",
        skip_serializing_if = "Option::is_none"
    )]
    pub delta: Option<TcpDelta>,
    /// Bytes in the receive queue.
    #[serde(
        default,
        deserialize_with = "lenient",
        skip_serializing_if = "Option::is_none"
    )]
    pub rqueue: Option<Scalar>,
    /// Bytes in the send queue.
    #[serde(
        default,
        deserialize_with = "lenient",
        skip_serializing_if = "Option::is_none"
    )]
    pub wqueue: Option<Scalar>,
    /// The pending timer.
    #[serde(
        default,
        deserialize_with = "lenient",
        skip_serializing_if = "Option::is_none"
    )]
    pub timer: Option<Scalar>,
}

impl Facts for SocketFacts {}

/// What a storage transfer's `streams` surface says of its streams.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamsFacts {
    /// The linked stream envelopes (an item that is not a link is skipped).
    #[serde(default, deserialize_with = "links")]
    pub links: Vec<StreamLink>,
    /// The network namespace the streams were read in.
    #[serde(
        default,
        deserialize_with = "lenient",
        skip_serializing_if = "Option::is_none"
    )]
    pub net_ns: Option<String>,
}

impl Facts for StreamsFacts {}

/// One stream envelope a storage transfer links (an item of `links`).
///
/// Read leniently: an optional member of the wrong type reads as absent,
/// so one odd member does not hide the rest of the link.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamLink {
    /// The stream envelope's digest.
    pub digest: String,
    /// Its subject kind.
    #[serde(default, deserialize_with = "lenient")]
    pub kind: Option<String>,
    /// Its socket cookie (flow id).
    #[serde(default, deserialize_with = "lenient")]
    pub flow_id: Option<String>,
    /// Its local endpoint.
    #[serde(default, deserialize_with = "lenient")]
    pub src: Option<String>,
    /// Its remote endpoint.
    #[serde(default, deserialize_with = "lenient")]
    pub dst: Option<String>,
    /// The flow's role in the transfer.
    #[serde(default, deserialize_with = "lenient")]
    pub role: Option<String>,
    /// The replica it was read from, when known.
    #[serde(default, deserialize_with = "lenient")]
    pub source_replica: Option<String>,
    /// Its completeness.
    #[serde(default, deserialize_with = "lenient")]
    pub completeness: Option<String>,
    /// Its claims as `kind:code` ([`StreamLink::claim`]).
    #[serde(default, deserialize_with = "lenient_strings")]
    pub claims: Vec<String>,
}

impl StreamLink {
    /// One claim of a linked stream as the link lists it.
    pub fn claim(kind: ClaimKind, code: &str) -> String {
        format!("{}:{code}", kind.as_str())
    }

    /// The listed claims split into kind and code (unparseable items
    /// skipped).
    pub fn claims(&self) -> impl Iterator<Item = (ClaimKind, &str)> {
        self.claims.iter().filter_map(|c| {
            let (kind, code) = c.split_once(':')?;
            let kind = match kind {
                "fact" => ClaimKind::Fact,
                "inference" => ClaimKind::Inference,
                "hypothesis" => ClaimKind::Hypothesis,
                _ => return None,
            };
            Some((kind, code))
        })
    }
}

/// A member of another shape (or null) reads as absent.
fn lenient<'de, D: Deserializer<'de>, T: DeserializeOwned>(d: D) -> Result<Option<T>, D::Error> {
    Ok(T::deserialize(Value::deserialize(d)?).ok())
}

/// A member that should be an object reads as absent when it is anything
/// else (serde would otherwise read an array positionally into a struct).
fn lenient_object<'de, D: Deserializer<'de>, T: DeserializeOwned>(
    d: D,
) -> Result<Option<T>, D::Error> {
    Ok(match Value::deserialize(d)? {
        v @ Value::Object(_) => T::deserialize(v).ok(),
        _ => None,
    })
}

fn lenient_strings<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    Ok(match Value::deserialize(d)? {
        Value::Array(items) => items
            .into_iter()
            .filter_map(|v| match v {
                Value::String(s) => Some(s),
                _ => None,
            })
            .collect(),
        _ => Vec::new(),
    })
}

fn links<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<StreamLink>, D::Error> {
    Ok(match Value::deserialize(d)? {
        Value::Array(items) => items
            .into_iter()
            .filter_map(|v| StreamLink::deserialize(v).ok())
            .collect(),
        _ => Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn map(v: Value) -> Map<String, Value> {
        match v {
            Value::Object(m) => m,
            _ => panic!("not an object"),
        }
    }

    /// `FIELDS` names every member of its struct, in order: the engines'
    /// tests check their output against it.
    #[test]
    fn fields_name_every_member() {
        let s = |n: i64| Some(Scalar::int(n));
        let info = TcpInfoView {
            state_name: Some(Scalar::Text("ESTABLISHED".into())),
            rto_us: s(1),
            snd_wnd: s(2),
            rcv_wnd: s(3),
            total_retrans: s(4),
            bytes_acked: s(5),
            bytes_received: s(6),
        };
        let keys: Vec<String> = info.present().keys().cloned().collect();
        let mut want: Vec<String> = TcpInfoView::FIELDS.iter().map(|f| f.to_string()).collect();
        want.sort();
        assert_eq!(keys, want);
        let delta = TcpDelta {
            total_retrans: s(1),
            total_rto: s(2),
            bytes_acked: s(3),
            bytes_received: s(4),
            bytes_retrans: s(5),
            segs_out: s(6),
            segs_in: s(7),
        };
        let keys: Vec<String> = delta.present().keys().cloned().collect();
        let mut want: Vec<String> = TcpDelta::FIELDS.iter().map(|f| f.to_string()).collect();
        want.sort();
        assert_eq!(keys, want);
    }

    /// Values keep their form (number or decimal string) through a read and
    /// a write; odd members read as absent without hiding the rest.
    #[test]
    fn facts_read_leniently_and_write_back_in_their_form() {
        let end = map(json!({
            "tcp_info": {"state_name": "ESTABLISHED", "rto_us": 204000, "bytes_acked": "18446744073709551615",
                         "snd_wnd": true, "pmtu": 1500},
            "delta": {"total_retrans": -2, "segs_out": "9007199254740993", "dsack_dups": 1},
            "rqueue": 0, "wqueue": 12, "timer": "on", "inode": "77",
        }));
        let read = SocketFacts::read(&end);
        let info = read.tcp_info.clone().unwrap();
        assert_eq!(
            info.bytes_acked,
            Some(Scalar::Text("18446744073709551615".into()))
        );
        assert_eq!(info.snd_wnd, None, "a bool is not a window");
        assert_eq!(
            Value::Object(info.present()),
            json!({"state_name": "ESTABLISHED", "rto_us": 204000, "bytes_acked": "18446744073709551615"})
        );
        assert_eq!(
            Value::Object(read.delta.clone().unwrap().present()),
            json!({"total_retrans": -2, "segs_out": "9007199254740993"})
        );
        assert_eq!(read.timer, Some(Scalar::Text("on".into())));
        // A surface whose tcp_info is null (the kernel gave none).
        let none = SocketFacts::read(&map(json!({"tcp_info": null, "rqueue": 1})));
        assert_eq!((none.tcp_info, none.rqueue), (None, Some(Scalar::int(1))));
        // Not an object at all: nothing, not an error.
        assert_eq!(
            FlightRecorderFacts::read(&map(json!({"totals": [1, 2]}))),
            FlightRecorderFacts::default()
        );
    }

    #[test]
    fn flight_totals_write_what_the_recorder_always_wrote() {
        let t = FlightTotals {
            retransmits: Some(9),
            rto_retransmits: Some(2),
            resets_received: Some(0),
            resets_sent: Some(1),
            state_changes: Some(3),
            zero_window_events: Some(0),
            last_state: None,
        };
        // Every counter, and an unknown last state as null.
        assert_eq!(
            serde_json::to_value(&t).unwrap(),
            json!({"retransmits": 9, "rto_retransmits": 2, "resets_received": 0, "resets_sent": 1,
                   "state_changes": 3, "zero_window_events": 0, "last_state": null})
        );
        // What the store shows leaves the null out.
        assert!(!t.present().contains_key("last_state"));
        let back = FlightTotals::read(&map(serde_json::to_value(&t).unwrap()));
        assert_eq!(back, t);
    }

    #[test]
    fn streams_skip_what_is_not_a_link() {
        let s = StreamsFacts::read(&map(json!({
            "links": [{"digest": "sha256:a"}, {"digest": 1}, "x", {"digest": "sha256:b", "src": 7}],
            "net_ns": "net:[4026531840]",
            "stream_count": 2,
        })));
        let digests: Vec<&str> = s.links.iter().map(|l| l.digest.as_str()).collect();
        assert_eq!(digests, ["sha256:a", "sha256:b"]);
        assert_eq!(s.links[1].src, None);
        assert_eq!(s.net_ns.as_deref(), Some("net:[4026531840]"));
        let mut written = Map::new();
        s.write_into(&mut written);
        assert_eq!(written["links"].as_array().unwrap().len(), 2);
    }

    #[test]
    fn a_stream_link_reads_leniently_and_writes_nulls() {
        let link: StreamLink = serde_json::from_value(serde_json::json!({
            "digest": "sha256:ab", "src": 7, "dst": "10.0.0.2:1",
            "claims": ["fact:rst_sent_by_local", 3, "nokind", "guess:x", "inference:reset_by_peer_inferred"],
        }))
        .unwrap();
        assert_eq!(link.src, None);
        assert_eq!(link.dst.as_deref(), Some("10.0.0.2:1"));
        let got: Vec<_> = link.claims().collect();
        assert_eq!(
            got,
            [
                (ClaimKind::Fact, "rst_sent_by_local"),
                (ClaimKind::Inference, "reset_by_peer_inferred")
            ]
        );
        // A link without a string digest is no link.
        assert!(serde_json::from_value::<StreamLink>(serde_json::json!({"digest": 1})).is_err());
        // Absent optionals are written as null, as the engine always did.
        let v = serde_json::to_value(StreamLink {
            digest: "d".into(),
            kind: None,
            flow_id: None,
            src: None,
            dst: None,
            role: None,
            source_replica: None,
            completeness: Some("complete".into()),
            claims: vec![],
        })
        .unwrap();
        assert_eq!(v["flow_id"], Value::Null);
        assert_eq!(v.as_object().unwrap().len(), 9);
    }
}
