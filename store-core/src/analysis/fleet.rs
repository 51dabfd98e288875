//! Fleet blast radius, the pure part: node cohorts and their event rates per
//! node-hour from the claims of shipped envelopes (beyond seed 000: the same
//! verdicts over nodes instead of versions).
//!
//! Cohorts of a host change reaching nodes `R` (node `i` at `at_i`), judged
//! over `[start, end)` where `start` is the change's time:
//! - `new`: each node of `R` from its own `at_i` to `end`;
//! - `previous`: every other node seen in `[start, end)`, over that window;
//! - `preBaseline`: each node of `R` over the equally long stretch before its
//!   own `at_i` (each node before vs after).
//!
//! Exposure is observed node-hours: each clock hour (UTC) in which a node
//! shipped at least one envelope within its stretch counts one node-hour. A
//! silent node or hour is unobserved, not healthy, and a long window does
//! not dilute a rate with hours nobody watched. Events are matching claims,
//! counted once per envelope and code. Every cohort cites the digests it
//! counted events from.

use std::collections::{BTreeMap, BTreeSet};

use pstack_envelope::ClaimCode;
use serde::Serialize;

use super::verdict::CohortCounts;

/// Event families a fleet blast radius can judge.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FleetMetric {
    /// Stream resets: `rst_received_from_peer`, `rst_sent_by_local`, `reset_by_peer_inferred`.
    Resets,
    /// `flow_rto_timeouts`.
    RtoTimeouts,
    /// `thread_in_d_state`.
    DStateEpisodes,
    /// Storage-transfer (rebuild) envelopes whose flow left ESTABLISHED or was reset.
    RebuildFailures,
}

impl FleetMetric {
    /// From the `metric=` query value.
    pub fn parse(s: &str) -> Option<FleetMetric> {
        Some(match s {
            "resets" => FleetMetric::Resets,
            "rto_timeouts" => FleetMetric::RtoTimeouts,
            "d_state_episodes" => FleetMetric::DStateEpisodes,
            "rebuild_failures" => FleetMetric::RebuildFailures,
            _ => return None,
        })
    }

    /// Claim codes counted.
    pub fn codes(self) -> &'static [ClaimCode] {
        match self {
            FleetMetric::Resets => &[
                ClaimCode::RstReceivedFromPeer,
                ClaimCode::RstSentByLocal,
                ClaimCode::ResetByPeerInferred,
            ],
            FleetMetric::RtoTimeouts => &[ClaimCode::FlowRtoTimeouts],
            FleetMetric::DStateEpisodes => &[ClaimCode::ThreadInDState],
            FleetMetric::RebuildFailures => &[
                ClaimCode::FlowLeftEstablished,
                ClaimCode::RstReceivedFromPeer,
                ClaimCode::RstSentByLocal,
                ClaimCode::ResetByPeerInferred,
            ],
        }
    }

    /// Counts one event per envelope (rebuilds) instead of one per code.
    fn per_envelope(self) -> bool {
        matches!(self, FleetMetric::RebuildFailures)
    }

    /// Only envelopes of this subject kind count (rebuilds: storage transfers).
    fn subject_kind(self) -> Option<&'static str> {
        match self {
            FleetMetric::RebuildFailures => Some("storage_transfer"),
            _ => None,
        }
    }
}

/// One shipped envelope as the fleet rules read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeEnvelope {
    /// The node it came from.
    pub node: String,
    /// Its digest.
    pub digest: String,
    /// Capture wall time, ns.
    pub wall_ns: i64,
    /// Subject kind.
    pub kind: String,
    /// Claim codes it carries.
    pub codes: Vec<String>,
}

/// One cohort's numbers.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeCohort {
    /// Nodes observed.
    pub nodes: Vec<String>,
    /// Exposure, node-hours.
    pub node_hours: f64,
    /// Events.
    pub events: u64,
    /// Envelopes read.
    pub envelopes: u64,
    /// Digests of the envelopes that carried events.
    pub evidence_digests: Vec<String>,
}

impl NodeCohort {
    /// As verdict input (rate = events per node-hour).
    pub fn counts(&self) -> CohortCounts {
        CohortCounts {
            requests: self.node_hours,
            errors: self.events as f64,
            p95: None,
        }
    }
}

/// The three node cohorts.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeCohorts {
    /// Nodes that got the change, after it.
    pub new: NodeCohort,
    /// Nodes that did not, same window.
    pub previous: NodeCohort,
    /// Nodes that got it, before it.
    pub pre_baseline: NodeCohort,
}

const HOUR_NS: i64 = 3_600_000_000_000;

fn events_in(env: &NodeEnvelope, metric: FleetMetric) -> u64 {
    if metric.subject_kind().is_some_and(|k| k != env.kind) {
        return 0;
    }
    let codes: BTreeSet<ClaimCode> = env
        .codes
        .iter()
        .filter_map(|c| ClaimCode::parse(c))
        .filter(|c| metric.codes().contains(c))
        .collect();
    if metric.per_envelope() {
        u64::from(!codes.is_empty())
    } else {
        codes.len() as u64
    }
}

/// Build the cohorts. `reached` maps node → the time it got the change.
pub fn cohorts(
    envelopes: &[NodeEnvelope],
    reached: &BTreeMap<String, i64>,
    start_ns: i64,
    end_ns: i64,
    metric: FleetMetric,
) -> NodeCohorts {
    let mut out = NodeCohorts::default();
    // Per cohort: node → the clock hours in which it shipped an envelope.
    let mut observed: [BTreeMap<String, BTreeSet<i64>>; 3] = Default::default();
    for e in envelopes {
        let slot = match reached.get(&e.node) {
            Some(&at) => {
                let len = (end_ns - at).max(0);
                if (at..end_ns).contains(&e.wall_ns) {
                    0
                } else if (at - len..at).contains(&e.wall_ns) {
                    2
                } else {
                    continue;
                }
            }
            None if (start_ns..end_ns).contains(&e.wall_ns) => 1,
            None => continue,
        };
        let cohort = match slot {
            0 => &mut out.new,
            1 => &mut out.previous,
            _ => &mut out.pre_baseline,
        };
        observed[slot]
            .entry(e.node.clone())
            .or_default()
            .insert(e.wall_ns.div_euclid(HOUR_NS));
        cohort.envelopes += 1;
        let n = events_in(e, metric);
        if n > 0 {
            cohort.events += n;
            cohort.evidence_digests.push(e.digest.clone());
        }
    }
    for (slot, nodes) in observed.into_iter().enumerate() {
        let cohort = match slot {
            0 => &mut out.new,
            1 => &mut out.previous,
            _ => &mut out.pre_baseline,
        };
        cohort.node_hours = nodes.values().map(|h| h.len() as f64).sum();
        cohort.nodes = nodes.into_keys().collect();
        cohort.evidence_digests.sort();
        cohort.evidence_digests.dedup();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const H: i64 = 3_600_000_000_000;

    fn env(node: &str, hour: i64, codes: &[&str]) -> NodeEnvelope {
        NodeEnvelope {
            node: node.into(),
            digest: format!("sha256:{node}-{hour}"),
            wall_ns: hour * H + 1,
            kind: "network_stream".into(),
            codes: codes.iter().map(|c| c.to_string()).collect(),
        }
    }

    #[test]
    fn nodes_fall_into_their_cohorts_with_their_own_stretch() {
        let reached: BTreeMap<String, i64> =
            [("a".to_string(), 10 * H), ("b".to_string(), 12 * H)].into();
        let envs = vec![
            env("a", 11, &["rst_received_from_peer", "flow_rto_timeouts"]),
            env("a", 5, &[]),
            env("b", 13, &["rst_sent_by_local"]),
            env("b", 9, &["rst_sent_by_local"]),
            env("c", 15, &["rst_received_from_peer"]),
            env("c", 25, &["rst_received_from_peer"]), // after end: ignored
            env("silent-before", 3, &[]),              // before start, unchanged: ignored
        ];
        let c = cohorts(&envs, &reached, 10 * H, 20 * H, FleetMetric::Resets);
        assert_eq!(c.new.nodes, ["a", "b"]);
        assert_eq!(c.new.node_hours, 2.0); // one observed hour each
        assert_eq!(c.new.events, 2);
        assert_eq!(c.pre_baseline.nodes, ["a", "b"]); // a: [0,10), b: [4,12)
        assert_eq!(c.pre_baseline.events, 1);
        assert_eq!(c.pre_baseline.evidence_digests, ["sha256:b-9"]);
        assert_eq!(c.previous.nodes, ["c"]);
        assert_eq!(c.previous.node_hours, 1.0);
        assert_eq!(c.previous.events, 1);
        let rto = cohorts(&envs, &reached, 10 * H, 20 * H, FleetMetric::RtoTimeouts);
        assert_eq!(rto.new.events, 1);
        assert_eq!(rto.new.evidence_digests, ["sha256:a-11"]);
    }
}
