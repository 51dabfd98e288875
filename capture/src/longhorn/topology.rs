//! Who takes part in a rebuild, from the manager's own documents: the
//! engine's node (E), the source replica (S), the target replica (T), their
//! instance managers and port blocks — and the request's flags checked
//! against them (a disagreement is a fact, never silently accepted).
//!
//! Port layout (v1 data engine): the instance manager hands out ports from
//! `--port-range 10000-20000` (longhorn-instance-manager `app/cmd/start.go`
//! v1.9.0 l.60–61; `20001-30000` is `--spdk-port-range`, v2); a v1 replica
//! takes `DefaultReplicaPortCountV1 = 10` ports, an engine 1
//! (longhorn-manager `engineapi/instance_manager.go` v1.9.0 l.33–36): P =
//! replica gRPC, P+1 = data server, P+2 = sync-agent gRPC, P+3…P+9 = ssync
//! receivers (`--sync-agent-port-count`, longhorn-engine
//! `app/cmd/replica.go` v1.9.0 l.196–199).
//!
//! Pure: no I/O.

use std::collections::BTreeMap;
use std::net::IpAddr;

use serde::Serialize;

use super::model::{PortBlock, RebuildEntry, RebuildState, Volume, address_ip};

/// A party's role in the rebuild.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PartyRole {
    /// The engine's node (E): live writes and `FilesSync`.
    Engine,
    /// The healthy replica sending the files (S).
    Source,
    /// The rebuilding replica (T).
    Target,
}

impl PartyRole {
    /// snake_case name.
    pub fn as_str(self) -> &'static str {
        match self {
            PartyRole::Engine => "engine",
            PartyRole::Source => "source",
            PartyRole::Target => "target",
        }
    }
}

/// One party as the manager names it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Party {
    /// Role.
    pub role: PartyRole,
    /// Replica or engine object name.
    pub name: String,
    /// Node (`hostId`).
    pub node: String,
    /// Pod IP (`address`), parsed.
    pub address: Option<IpAddr>,
    /// Instance manager pod.
    pub instance_manager: String,
    /// Port block, once read from the instance manager.
    pub block: Option<PortBlock>,
}

/// The rebuild's topology.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Topology {
    /// Engine node.
    pub engine: Option<Party>,
    /// Source replica (the first of `fromReplica`/`fromReplicaList`).
    pub source: Option<Party>,
    /// Target replica.
    pub target: Option<Party>,
    /// Every source the manager names (v1.11+ may list several).
    pub sources_named: Vec<String>,
    /// How the target was chosen.
    pub target_basis: &'static str,
    /// Volume `dataEngine`.
    pub data_engine: String,
}

impl Topology {
    /// The parties that are known.
    pub fn parties(&self) -> impl Iterator<Item = &Party> {
        [&self.engine, &self.source, &self.target]
            .into_iter()
            .flatten()
    }
    /// Instance managers whose port blocks are wanted (S and T).
    pub fn replica_ims(&self) -> Vec<String> {
        let mut v: Vec<String> = [&self.source, &self.target]
            .into_iter()
            .flatten()
            .map(|p| p.instance_manager.clone())
            .filter(|s| !s.is_empty())
            .collect();
        v.dedup();
        v
    }
    /// Fill S and T port blocks from instance-manager reads (by replica name).
    pub fn set_blocks(&mut self, blocks: &BTreeMap<String, PortBlock>) {
        for p in [&mut self.source, &mut self.target].into_iter().flatten() {
            if let Some(b) = blocks.get(&p.name) {
                p.block = Some(*b);
            }
        }
    }
    /// The port span covering S's and T's blocks (narrows the capture).
    pub fn covering_ports(&self) -> Option<(u16, u16)> {
        let blocks: Vec<PortBlock> = [&self.source, &self.target]
            .into_iter()
            .flatten()
            .filter_map(|p| p.block)
            .collect();
        if blocks.len() < 2 {
            return None;
        }
        Some((
            blocks.iter().map(|b| b.start).min()?,
            blocks.iter().map(|b| b.end).max()?,
        ))
    }
}

fn party(role: PartyRole, i: &super::model::Instance) -> Party {
    Party {
        role,
        name: i.name.clone(),
        node: i.host_id.clone(),
        address: address_ip(&i.address),
        instance_manager: i.instance_manager.clone(),
        block: None,
    }
}

/// The entry a rebuild is read from: the first in progress, else the first.
pub fn current_entry(v: &Volume) -> Option<&RebuildEntry> {
    v.rebuild
        .iter()
        .find(|r| r.state == RebuildState::InProgress)
        .or_else(|| v.rebuild.first())
}

/// Resolve E, S and T from a volume document. `want_target` pins the target
/// replica (the one seen at window start, when re-reading at the end).
pub fn resolve(v: &Volume, want_target: Option<&str>) -> Topology {
    let entry = match want_target {
        Some(t) => v.rebuild.iter().find(|r| r.replica == t),
        None => current_entry(v),
    };
    let find = |name: &str| v.replicas.iter().find(|r| r.name == name);
    let (target, target_basis) = if let Some(e) = entry {
        (find(&e.replica), "rebuildStatus[].replica")
    } else if let Some(t) = want_target {
        (find(t), "the target seen earlier")
    } else if let Some(r) = v.replicas.iter().find(|r| r.mode == "WO") {
        (Some(r), "the replica in mode WO (no rebuildStatus entry)")
    } else {
        (None, "none: no rebuildStatus entry and no WO replica")
    };
    let sources_named: Vec<String> = entry.map(|e| e.from.clone()).unwrap_or_default();
    let source = sources_named.first().and_then(|s| {
        find(s).or_else(|| {
            // `fromReplica` falls back to the raw address when no replica matched.
            let ip = address_ip(s)?;
            v.replicas
                .iter()
                .find(|r| address_ip(&r.address) == Some(ip))
        })
    });
    Topology {
        engine: v.controllers.first().map(|c| party(PartyRole::Engine, c)),
        source: source.map(|r| party(PartyRole::Source, r)),
        target: target.map(|r| party(PartyRole::Target, r)),
        sources_named,
        target_basis,
        data_engine: v.data_engine.clone(),
    }
}

/// A flag that disagrees with the manager.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Mismatch {
    /// The flag.
    pub flag: &'static str,
    /// What the flag said.
    pub given: String,
    /// What the manager says.
    pub longhorn: String,
}

/// Check `--source-node`, `--target-node` and `--peer` against the topology.
/// Empty node flags mean "from Longhorn" and are not checked.
pub fn check_flags(
    t: &Topology,
    source_node: &str,
    target_node: &str,
    peer: IpAddr,
) -> Vec<Mismatch> {
    let mut out = Vec::new();
    for (flag, given, p) in [
        ("source_node", source_node, &t.source),
        ("target_node", target_node, &t.target),
    ] {
        if let Some(p) = p
            && !given.is_empty()
            && !p.node.is_empty()
            && given != p.node
        {
            out.push(Mismatch {
                flag,
                given: given.to_string(),
                longhorn: format!("{} {} is on node {}", p.role.as_str(), p.name, p.node),
            });
        }
    }
    let ips: Vec<String> = t
        .parties()
        .filter_map(|p| p.address.map(|a| format!("{} {a}", p.role.as_str())))
        .collect();
    if !ips.is_empty() && !t.parties().any(|p| p.address == Some(peer)) {
        out.push(Mismatch {
            flag: "peer",
            given: peer.to_string(),
            longhorn: format!(
                "no party has this pod IP ({}); a storage network (Replica CR .status.storageIP) would explain it",
                ips.join(", ")
            ),
        });
    }
    out
}

/// Which party this capture's node plays: the party whose pod IP is a local
/// address of the captured flows, else inferred from the peer.
pub fn capture_role(
    t: &Topology,
    local_ips: &[IpAddr],
    peer: IpAddr,
) -> (Option<PartyRole>, String) {
    for p in t.parties() {
        if let Some(a) = p.address
            && local_ips.contains(&a)
        {
            return (
                Some(p.role),
                format!(
                    "the flows' local address {a} is the {} pod IP",
                    p.role.as_str()
                ),
            );
        }
    }
    let peer_is = |p: &Option<Party>| p.as_ref().is_some_and(|p| p.address == Some(peer));
    if peer_is(&t.source) && !peer_is(&t.target) {
        return (
            Some(PartyRole::Target),
            format!(
                "the peer {peer} is the source replica's pod IP and no local address matched (a target-side capture)"
            ),
        );
    }
    (
        None,
        format!(
            "no flow's local address is a party's pod IP and the peer {peer} does not decide it"
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::longhorn::model::parse_volume;

    #[test]
    fn source_named_by_address_falls_back_to_the_replica_with_that_ip() {
        let v = parse_volume(
            br#"{"replicas":[{"name":"r-s","hostId":"n1","address":"10.0.0.1","instanceManagerName":"im-1","mode":"RW"},
                             {"name":"r-t","hostId":"n2","address":"10.0.0.2","instanceManagerName":"im-2","mode":"WO"}],
                 "controllers":[{"name":"e-0","hostId":"n3","address":"10.0.0.3"}],
                 "rebuildStatus":[{"replica":"r-t","fromReplica":"tcp://10.0.0.1:10000","state":"in_progress"}]}"#,
        )
        .unwrap();
        let t = resolve(&v, None);
        assert_eq!(t.source.as_ref().unwrap().name, "r-s");
        assert_eq!(t.target.as_ref().unwrap().node, "n2");
        assert_eq!(t.engine.as_ref().unwrap().node, "n3");
        let m = check_flags(&t, "n1", "n9", "10.0.0.1".parse().unwrap());
        assert_eq!(m.len(), 1);
        assert_eq!(m[0].flag, "target_node");
        let m = check_flags(&t, "", "", "192.168.5.5".parse().unwrap());
        assert_eq!(m[0].flag, "peer");
        let (r, _) = capture_role(
            &t,
            &["10.0.0.2".parse().unwrap()],
            "10.0.0.1".parse().unwrap(),
        );
        assert_eq!(r, Some(PartyRole::Target));
        let (r, _) = capture_role(&t, &[], "10.0.0.1".parse().unwrap());
        assert_eq!(r, Some(PartyRole::Target));
        let (r, _) = capture_role(&t, &[], "10.0.0.2".parse().unwrap());
        assert_eq!(r, None, "peer T: source or engine, not decided");
    }
}
