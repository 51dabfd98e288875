//! A flow's flight record sealed as a `network_stream` envelope: what
//! pstackd's flight recorder held about a flow when a watch rule fired on
//! it (a reset ends a stream, so there is nothing left to capture live).
//!
//! Invariants:
//! - **Only what the recorder saw.** Facts are the recorder's per-second
//!   buckets and totals for this flow; the envelope says how far back they
//!   reach (`reached_back_before_last_ns`) and, when the recorder's horizon or
//!   start cut the flow's past, names that as an unknown with its probe.
//! - **Claim rules are a pure function of the history** ([`claims_of`]),
//!   table-tested below; the codes are the transport engine's
//!   (`rst_received_from_peer`, `rst_sent_by_local`, `flow_retransmits`,
//!   `flow_rto_timeouts`, `peer_zero_window`) so the store joins and judges
//!   recorded and live ends alike.
//! - Kernel events lost in a full ring cannot be attributed to a flow; when
//!   any were lost while the flow was recorded, that is an unknown too.

use std::time::Duration;

use pstack_ebpf::{FlightStats, FlowHistory, FlowIncident};
use pstack_envelope::{
    Bounds, BuildError, Claim, ClaimCode, ClaimKind, Clock, Collector, Envelope, EnvelopeBuilder,
    NextTransition, Scope, StreamIdentity, Subject, Surface, SurfaceStatus, Termination, Trigger,
    Universe, Unknown, sha256_digest,
};
use serde_json::{Map, Value};

use super::SOURCE_COMMIT;
use crate::clock::{monotonic_ns, wall_time_of};

/// Surface id of the flight record.
pub const FLIGHT_SURFACE: &str = pstack_envelope::surface_id::network_stream::FLIGHT_RECORDER;

/// What the recorder had when the rule fired.
#[derive(Debug, Clone)]
pub struct RecordedFlow {
    /// The flow's history.
    pub history: FlowHistory,
    /// The incident that fired the rule.
    pub incident: FlowIncident,
    /// The recorder's counters at that time.
    pub stats: FlightStats,
    /// The recorder's horizon.
    pub horizon: Duration,
    /// The recorder's max_flows.
    pub max_flows: usize,
}

fn claim(code: ClaimCode, statement: String) -> Claim {
    Claim {
        id: code.as_str().replace('_', "-"),
        kind: ClaimKind::Fact,
        code: code.into(),
        statement,
        surfaces: vec![FLIGHT_SURFACE.into()],
        scope: Scope::Existential,
        falsifier: None,
    }
}

/// The facts a flow's history supports (pure; table-tested).
pub fn claims_of(h: &FlowHistory, incident: &FlowIncident) -> Vec<Claim> {
    let (l, r) = (h.flow.local, h.flow.remote);
    let t = &h.totals;
    let mut out = Vec::new();
    let received = t.resets_received > 0
        || matches!(
            incident,
            FlowIncident::Reset {
                received_from_peer: true,
                ..
            }
        );
    let sent = t.resets_sent > 0
        || matches!(
            incident,
            FlowIncident::Reset {
                received_from_peer: false,
                ..
            }
        );
    if received {
        out.push(claim(
            ClaimCode::RstReceivedFromPeer,
            format!("RST received from {r} (the remote endpoint sent it) on flow {l} -> {r}"),
        ));
    }
    if sent {
        out.push(claim(
            ClaimCode::RstSentByLocal,
            format!("this host ({l}) sent a RST to {r}"),
        ));
    }
    let span_s = h.last_seen_ns.saturating_sub(h.reached_back_ns) as f64 / 1e9;
    if t.retransmits > 0 {
        out.push(claim(
            ClaimCode::FlowRetransmits,
            format!(
                "{l} retransmitted {} segments to {r} in the {span_s:.1} s recorded before the last event",
                t.retransmits
            ),
        ));
    }
    if t.rto_retransmits > 0 {
        out.push(claim(
            ClaimCode::FlowRtoTimeouts,
            format!(
                "{} of those retransmits were sent by the retransmission timer (socket in loss recovery): the peer did not acknowledge for a whole RTO",
                t.rto_retransmits
            ),
        ));
    }
    if t.zero_window_events > 0 {
        out.push(claim(
            ClaimCode::PeerZeroWindow,
            format!(
                "{r} advertised a zero receive window to {l} at {} recorded events",
                t.zero_window_events
            ),
        ));
    }
    out
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The flight record as surface facts (integers within 2^53: the socket
/// cookie, which need not be, is carried as a decimal string).
fn facts_of(rec: &RecordedFlow) -> Map<String, Value> {
    let mut v = serde_json::to_value(&rec.history).unwrap_or(Value::Null);
    if let Some(o) = v.as_object_mut() {
        if let Some(c) = rec.history.sock_cookie {
            o.insert("sock_cookie".into(), Value::String(c.to_string()));
        }
        o.insert(
            "incident".into(),
            serde_json::to_value(&rec.incident).unwrap_or(Value::Null),
        );
        o.insert("horizon_seconds".into(), rec.horizon.as_secs().into());
        o.insert(
            "recorder".into(),
            serde_json::to_value(&rec.stats).unwrap_or(Value::Null),
        );
    }
    match v {
        Value::Object(m) => m,
        _ => Map::new(),
    }
}

/// Seal `rec` with `trigger` in the collector.
pub fn seal(rec: &RecordedFlow, trigger: Trigger) -> Result<Envelope, BuildError> {
    let h = &rec.history;
    let now = monotonic_ns();
    let started = h.reached_back_ns.min(now);
    let flow_id = match h.sock_cookie {
        Some(c) => c.to_string(),
        // No record carried the cookie: a stable id of the 4-tuple in its
        // namespace, marked as such.
        None => format!(
            "tuple-{}",
            &sha256_digest(format!("{:?}", h.flow).as_bytes())["sha256:".len()..][..16]
        ),
    };
    let selector = format!(
        "flight_recorder flow {} -> {} netns {}",
        h.flow.local,
        h.flow.remote,
        h.flow.netns_ino.map_or("?".into(), |n| n.to_string())
    );
    let surface = Surface {
        id: FLIGHT_SURFACE.into(),
        authority: "ebpf:tracepoint/tcp/* (pstackd flight recorder)".into(),
        status: SurfaceStatus::Ok,
        cause: None,
        deadline_ms: 1000,
        elapsed_us: 0,
        digest: None,
        bytes: 0,
        truncated: h.truncated,
        facts: facts_of(rec),
    };
    let mut unknowns = Vec::new();
    // The flow's past is cut when the horizon dropped its oldest records, or
    // when its opening (a transition out of CLOSE/LISTEN/SYN_*) was never
    // recorded: it began before the recorder (or its reach) did.
    let opened = h
        .transitions
        .iter()
        .any(|(_, from, _)| matches!(from.as_str(), "CLOSE" | "LISTEN" | "SYN_SENT" | "SYN_RECV"));
    let cut_by_recorder = h.reached_back_ns > h.first_seen_ns || !opened;
    if cut_by_recorder {
        unknowns.push(Unknown {
            id: "u-before-reach".into(),
            question: format!(
                "what did flow {} -> {} do more than {:.1} s before its last event (the recorder's reach)?",
                h.flow.local,
                h.flow.remote,
                h.last_seen_ns.saturating_sub(h.reached_back_ns) as f64 / 1e9
            ),
            blocks: "CLASSIFY_STREAM_FAULT".into(),
            owner: "node operator".into(),
            probe: "raise [flight_recorder] seconds in pstackd.toml (and restart pstackd) so the next fault is recorded further back".into(),
            surface: Some(FLIGHT_SURFACE.into()),
        });
    }
    if rec.stats.events_lost > 0 {
        unknowns.push(Unknown {
            id: "u-lost-events".into(),
            question: format!(
                "did any of the {} TCP records the kernel could not queue belong to this flow?",
                rec.stats.events_lost
            ),
            blocks: "CLASSIFY_STREAM_FAULT".into(),
            owner: "node operator".into(),
            probe: "narrow the watched ports of the tcp_reset/tcp_rto rules so fewer flows are recorded".into(),
            surface: Some(FLIGHT_SURFACE.into()),
        });
    }
    let horizon_ms = ms(rec.horizon);
    let mut builder = EnvelopeBuilder::new(
        Subject::NetworkStream(StreamIdentity {
            dst: h.flow.remote.to_string(),
            flow_id,
            net_ns: h.flow.netns_ino.map(|n| n.to_string()),
            protocol: "tcp".into(),
            src: h.flow.local.to_string(),
        }),
        Collector {
            name: "pstackd flight recorder".into(),
            source_commit: SOURCE_COMMIT.into(),
            trigger: Some(trigger),
            version: env!("CARGO_PKG_VERSION").into(),
        },
        Clock {
            bundle_deadline_ms: horizon_ms,
            monotonic_end_ns: now.to_string(),
            monotonic_start_ns: started.to_string(),
            wall_time: wall_time_of(started),
        },
        Universe {
            selector_digest: sha256_digest(selector.as_bytes()),
            selector,
            expected_count: 1,
            observed_count: 1,
            termination: Termination::Exhausted,
        },
        Bounds {
            surface_deadline_ms: 1000,
            bundle_deadline_ms: horizon_ms,
            max_threads: rec.max_flows as u64,
            max_bytes_per_surface: 0,
            leak_budget: 0,
            caps: [
                ("max_flows".to_string(), rec.max_flows as u64),
                ("horizon_seconds".to_string(), rec.horizon.as_secs()),
                (
                    "max_transitions_per_flow".to_string(),
                    pstack_ebpf::flight::MAX_TRANSITIONS as u64,
                ),
            ]
            .into_iter()
            .collect(),
        },
    );
    builder.surface(surface)?;
    for c in claims_of(h, &rec.incident) {
        builder.claim(c)?;
    }
    for u in unknowns {
        builder.unknown(u)?;
    }
    builder.seal(NextTransition {
        action: "CAPTURE_PEER_SIDE".into(),
        success_receipt: format!(
            "the flight record (or a transport capture) of {} -> {} from the peer's node, joined in the store as the other end",
            h.flow.remote, h.flow.local
        ),
        abort_conditions: vec!["the peer node runs no pstackd watching these ports".into()],
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use pstack_ebpf::{FlowKey, FlowTotals};

    fn history(t: FlowTotals) -> FlowHistory {
        FlowHistory {
            flow: FlowKey {
                netns_ino: Some(4026531840),
                local: "10.0.0.1:40000".parse().unwrap(),
                remote: "10.0.0.2:10001".parse().unwrap(),
            },
            sock_cookie: Some(77),
            first_seen_ns: 1_000_000_000,
            last_seen_ns: 11_000_000_000,
            reached_back_ns: 1_000_000_000,
            recorder_started_ns: 500_000_000,
            totals: t,
            buckets: Vec::new(),
            transitions: Vec::new(),
            truncated: false,
        }
    }

    fn reset(received: bool) -> FlowIncident {
        FlowIncident::Reset {
            flow: history(FlowTotals::default()).flow,
            received_from_peer: received,
            at_ns: 11_000_000_000,
        }
    }

    fn codes(t: FlowTotals, i: FlowIncident) -> Vec<String> {
        claims_of(&history(t), &i)
            .into_iter()
            .map(|c| c.code)
            .collect()
    }

    #[test]
    fn claim_rules() {
        let table: Vec<(&str, FlowTotals, FlowIncident, Vec<&str>)> = vec![
            (
                "reset received after retransmits",
                FlowTotals {
                    retransmits: 9,
                    resets_received: 1,
                    ..Default::default()
                },
                reset(true),
                vec!["rst_received_from_peer", "flow_retransmits"],
            ),
            (
                "reset sent, nothing else",
                FlowTotals {
                    resets_sent: 1,
                    ..Default::default()
                },
                reset(false),
                vec!["rst_sent_by_local"],
            ),
            (
                "rto and zero window, no reset yet",
                FlowTotals {
                    retransmits: 3,
                    rto_retransmits: 2,
                    zero_window_events: 4,
                    ..Default::default()
                },
                FlowIncident::Rto {
                    flow: history(FlowTotals::default()).flow,
                    at_ns: 1,
                },
                vec!["flow_retransmits", "flow_rto_timeouts", "peer_zero_window"],
            ),
            (
                "near miss: an RTO incident with no counts claims nothing",
                FlowTotals::default(),
                FlowIncident::Rto {
                    flow: history(FlowTotals::default()).flow,
                    at_ns: 1,
                },
                vec![],
            ),
        ];
        for (what, t, i, want) in table {
            assert_eq!(codes(t, i), want, "{what}");
        }
    }

    #[test]
    fn a_recorded_flow_seals_and_verifies_with_its_trigger() {
        let rec = RecordedFlow {
            history: history(FlowTotals {
                retransmits: 9,
                resets_received: 1,
                ..Default::default()
            }),
            incident: reset(true),
            stats: FlightStats::default(),
            horizon: Duration::from_secs(60),
            max_flows: 4096,
        };
        let trigger = Trigger {
            condition: [("flow".to_string(), "x".to_string())].into(),
            fired_at: "2026-12-04T10:00:00.000Z".into(),
            kind: "tcp_reset".into(),
            rule: "resets".into(),
        };
        let env = seal(&rec, trigger).unwrap();
        let bytes = serde_json::to_vec(&env).unwrap();
        let back = pstack_envelope::verify(&bytes).expect("verifies");
        assert_eq!(back.collector.trigger.unwrap().rule, "resets");
        let s = back
            .surfaces
            .iter()
            .find(|s| s.id == FLIGHT_SURFACE)
            .unwrap();
        assert_eq!(s.facts["totals"]["retransmits"], 9);
        assert_eq!(s.facts["sock_cookie"], "77");
        assert_eq!(s.facts["reached_back_before_last_ns"], 10_000_000_000u64);
    }
}
