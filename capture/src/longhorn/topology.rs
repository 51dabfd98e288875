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
    /// The Replica CR's `status.storageIP`, read only when the
    /// `storage-network` setting is non-empty (None: the pod network).
    pub storage_ip: Option<IpAddr>,
}

impl Party {
    /// The address its data path uses: the storage IP when one was read,
    /// else the pod IP.
    pub fn data_ip(&self) -> Option<IpAddr> {
        self.storage_ip.or(self.address)
    }
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
    /// The sources after the first (`fromReplicaList`, v1.11+, up to
    /// `replica-rebuild-concurrent-sync-limit`), resolved like `source`:
    /// each has its own port block, flows and role.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub more_sources: Vec<Party>,
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
            .chain(self.more_sources.iter())
    }
    /// Every source (the first, then the others of `fromReplicaList`).
    pub fn sources(&self) -> impl Iterator<Item = &Party> {
        self.source.iter().chain(self.more_sources.iter())
    }
    /// The replicas: every source, then the target.
    pub fn replicas(&self) -> impl Iterator<Item = &Party> {
        self.sources().chain(self.target.iter())
    }
    /// Instance managers whose port blocks are wanted (every source and T).
    pub fn replica_ims(&self) -> Vec<String> {
        let mut v: Vec<String> = self
            .replicas()
            .map(|p| p.instance_manager.clone())
            .filter(|s| !s.is_empty())
            .collect();
        v.sort();
        v.dedup();
        v
    }
    /// Fill the replicas' port blocks from instance-manager reads (by replica name).
    pub fn set_blocks(&mut self, blocks: &BTreeMap<String, PortBlock>) {
        for p in [&mut self.source, &mut self.target]
            .into_iter()
            .flatten()
            .chain(self.more_sources.iter_mut())
        {
            if let Some(b) = blocks.get(&p.name) {
                p.block = Some(*b);
            }
        }
    }
    /// The port span covering the replicas' blocks (narrows the capture).
    pub fn covering_ports(&self) -> Option<(u16, u16)> {
        let blocks: Vec<PortBlock> = self.replicas().filter_map(|p| p.block).collect();
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
        storage_ip: None,
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
    let named = |s: &String| {
        find(s).or_else(|| {
            // `fromReplica` falls back to the raw address when no replica matched.
            let ip = address_ip(s)?;
            v.replicas
                .iter()
                .find(|r| address_ip(&r.address) == Some(ip))
        })
    };
    let mut sources = sources_named.iter().filter_map(named);
    let source = sources.next();
    let mut more_sources: Vec<Party> = Vec::new();
    for r in sources {
        if Some(r.name.as_str()) != source.map(|s| s.name.as_str())
            && !more_sources.iter().any(|p| p.name == r.name)
        {
            more_sources.push(party(PartyRole::Source, r));
        }
    }
    Topology {
        engine: v.controllers.first().map(|c| party(PartyRole::Engine, c)),
        more_sources,
        source: source.map(|r| party(PartyRole::Source, r)),
        target: target.map(|r| party(PartyRole::Target, r)),
        sources_named,
        target_basis,
        data_engine: v.data_engine.clone(),
    }
}

/// The network a capture selects its flows on (the envelope's
/// `longhorn_flows_selected_on`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SelectedOn {
    /// `storage_network` or `pod_network`.
    pub network: &'static str,
    /// The `storage-network` setting as read ("" = the pod network; None:
    /// not read).
    pub setting: Option<String>,
    /// The addresses selected on, per party: `role name ip`.
    pub addresses: Vec<String>,
    /// Why this network.
    pub basis: String,
}

/// Choose the network flows are selected on, and set each replica party's
/// storage IP from its Replica CR read (`storage`: replica name → the read's
/// storage IP, or why it could not be read). Pure.
///
/// The storage network is chosen only when the `storage-network` setting is
/// non-empty and both S's and T's Replica CRs give a storage IP (when T's or
/// S's is missing, selecting on one network for one end and the other for
/// the other would match nothing: the pod network is kept and the reason
/// said). The engine has no Replica CR: its address stays its pod IP.
pub fn select_network(
    t: &mut Topology,
    setting: Option<&str>,
    storage: &BTreeMap<String, Result<Option<IpAddr>, String>>,
) -> SelectedOn {
    let pod = |t: &Topology, basis: String| SelectedOn {
        network: "pod_network",
        setting: setting.map(str::to_string),
        addresses: t
            .parties()
            .filter_map(|p| {
                p.address
                    .map(|a| format!("{} {} {a}", p.role.as_str(), p.name))
            })
            .collect(),
        basis,
    };
    let Some(net) = setting.map(str::trim).filter(|s| !s.is_empty()) else {
        let basis = match setting {
            Some(_) => {
                "the storage-network setting is empty: replicas use their pod IPs".to_string()
            }
            None => "the storage-network setting was not read: pod IPs assumed".to_string(),
        };
        return pod(t, basis);
    };
    let mut missing = Vec::new();
    let mut found = Vec::new();
    for p in t.replicas() {
        match storage.get(&p.name) {
            Some(Ok(Some(ip))) => found.push((p.name.clone(), *ip)),
            Some(Ok(None)) => missing.push(format!("{}: no status.storageIP", p.name)),
            Some(Err(e)) => missing.push(format!("{}: {e}", p.name)),
            None => missing.push(format!("{}: Replica CR not read", p.name)),
        }
    }
    if found.is_empty() || !missing.is_empty() || t.source.is_none() || t.target.is_none() {
        if t.source.is_none() || t.target.is_none() {
            missing.push("the source or target replica is not known yet".into());
        }
        return pod(
            t,
            format!(
                "storage-network is {net:?} but the replicas' storage IPs are not all known ({}): flows selected on pod IPs, which under a storage network carry no rebuild traffic",
                missing.join("; ")
            ),
        );
    }
    for p in [&mut t.source, &mut t.target]
        .into_iter()
        .flatten()
        .chain(t.more_sources.iter_mut())
    {
        p.storage_ip = found.iter().find(|(n, _)| *n == p.name).map(|(_, ip)| *ip);
    }
    SelectedOn {
        network: "storage_network",
        setting: Some(net.to_string()),
        addresses: t
            .replicas()
            .filter_map(|p| {
                p.storage_ip
                    .map(|a| format!("{} {} {a}", p.role.as_str(), p.name))
            })
            .collect(),
        basis: format!(
            "storage-network is {net:?}: flows selected on the Replica CRs' status.storageIP (the pod IPs carry no rebuild traffic)"
        ),
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
    if !ips.is_empty()
        && !t
            .parties()
            .any(|p| p.address == Some(peer) || p.storage_ip == Some(peer))
    {
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

/// The part(s) one node plays in a rebuild, decided once by [`node_roles`]
/// and used by both the capture's self-label (`capture_role` fact) and
/// pstackd's window label, so the two never disagree.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NodeRoles {
    /// Every part this node holds, sorted (an all-in-one instance manager
    /// puts E and T, or E and S, in one pod: one node, one IP, two parts).
    pub roles: Vec<PartyRole>,
    /// Why: which name or address decided it.
    pub basis: String,
}

impl NodeRoles {
    /// The part the node acts in for capture: the target first, then the
    /// source, then the engine. T's side sees the control channel it opens
    /// and the bulk streams it receives, S's side the streams it sends; E's
    /// own flows (FilesSync, live writes) go to T and S and are seen there too.
    pub fn acting(&self) -> Option<PartyRole> {
        [PartyRole::Target, PartyRole::Source, PartyRole::Engine]
            .into_iter()
            .find(|r| self.roles.contains(r))
    }
    /// Every part, `+`-joined (`engine+target`), or `unknown`.
    pub fn label(&self) -> String {
        if self.roles.is_empty() {
            return "unknown".into();
        }
        let v: Vec<&str> = self.roles.iter().map(|r| r.as_str()).collect();
        v.join("+")
    }
}

/// How a node knows itself: its Kubernetes node name (pstackd: `--node` /
/// `NODE_NAME`) and/or its local addresses (the capture: the local ends of
/// the flows it saw), and the peer it captured towards.
#[derive(Debug, Clone, Copy, Default)]
pub struct NodeSeen<'a> {
    /// Node name; empty when unknown.
    pub node: &'a str,
    /// Local addresses.
    pub local_ips: &'a [IpAddr],
    /// The peer the capture selected on, when there was one.
    pub peer: Option<IpAddr>,
}

/// The part(s) this node plays: every party whose node name is this node's
/// or whose pod or storage IP is a local address. With neither, the peer
/// decides only the unambiguous case (peer = S's address and not T's: a
/// target-side capture). Pure; table-tested.
pub fn node_roles(t: &Topology, seen: NodeSeen<'_>) -> NodeRoles {
    let mut roles = Vec::new();
    let mut why = Vec::new();
    for p in t.parties() {
        let by_node = !seen.node.is_empty() && p.node == seen.node;
        let by_ip = [p.storage_ip, p.address]
            .into_iter()
            .flatten()
            .find(|a| seen.local_ips.contains(a));
        if !(by_node || by_ip.is_some()) {
            continue;
        }
        if !roles.contains(&p.role) {
            roles.push(p.role);
        }
        why.push(match by_ip {
            Some(a) => format!("local address {a} is the {} {}'s", p.role.as_str(), p.name),
            None => format!(
                "node {} holds the {} {}",
                seen.node,
                p.role.as_str(),
                p.name
            ),
        });
    }
    if !roles.is_empty() {
        roles.sort();
        return NodeRoles {
            roles,
            basis: why.join("; "),
        };
    }
    let peer_is = |p: &Option<Party>, peer: IpAddr| {
        p.as_ref()
            .is_some_and(|p| p.data_ip() == Some(peer) || p.address == Some(peer))
    };
    if let Some(peer) = seen.peer
        && peer_is(&t.source, peer)
        && !peer_is(&t.target, peer)
    {
        return NodeRoles {
            roles: vec![PartyRole::Target],
            basis: format!(
                "the peer {peer} is the source replica's address and no local address or node name matched (a target-side capture)"
            ),
        };
    }
    NodeRoles {
        roles: Vec::new(),
        basis: "no party is on this node name or local address, and the peer does not decide it"
            .into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::longhorn::model::parse_volume;

    #[test]
    fn the_storage_network_is_selected_only_with_the_setting_and_both_storage_ips() {
        let v = parse_volume(
            br#"{"replicas":[{"name":"r-s","hostId":"n1","address":"10.0.0.1","instanceManagerName":"im-1","mode":"RW"},
                             {"name":"r-t","hostId":"n2","address":"10.0.0.2","instanceManagerName":"im-2","mode":"WO"}],
                 "controllers":[{"name":"e-0","hostId":"n3","address":"10.0.0.3"}],
                 "rebuildStatus":[{"replica":"r-t","fromReplica":"r-s","state":"in_progress"}]}"#,
        )
        .unwrap();
        let ip = |s: &str| -> IpAddr { s.parse().unwrap() };
        let both: BTreeMap<String, Result<Option<IpAddr>, String>> = [
            ("r-s".to_string(), Ok(Some(ip("10.9.0.1")))),
            ("r-t".to_string(), Ok(Some(ip("10.9.0.2")))),
        ]
        .into();
        let mut one = both.clone();
        one.insert("r-t".into(), Ok(None));
        let mut failed = both.clone();
        failed.insert("r-s".into(), Err("timeout".into()));
        let net = "kube-system/demo-192-168-0-0";
        // (setting, storage reads, network, S's data IP)
        let table: [(Option<&str>, &BTreeMap<_, _>, &str, &str); 6] = [
            (None, &both, "pod_network", "10.0.0.1"),
            (Some(""), &both, "pod_network", "10.0.0.1"),
            (Some("  "), &both, "pod_network", "10.0.0.1"),
            (Some(net), &one, "pod_network", "10.0.0.1"),
            (Some(net), &failed, "pod_network", "10.0.0.1"),
            (Some(net), &both, "storage_network", "10.9.0.1"),
        ];
        for (setting, reads, want, s_ip) in table {
            let mut t = resolve(&v, None);
            let sel = select_network(&mut t, setting, reads);
            assert_eq!(sel.network, want, "{setting:?} {reads:?}: {sel:?}");
            assert_eq!(t.source.as_ref().unwrap().data_ip(), Some(ip(s_ip)));
            assert_eq!(t.engine.as_ref().unwrap().data_ip(), Some(ip("10.0.0.3")));
        }
        let mut t = resolve(&v, None);
        let sel = select_network(&mut t, Some(net), &both);
        assert_eq!(
            sel.addresses,
            ["source r-s 10.9.0.1", "target r-t 10.9.0.2"]
        );
        // The peer flag may be a storage IP.
        assert!(check_flags(&t, "", "", ip("10.9.0.1")).is_empty());
        // No source named yet: the pod network, with the reason.
        let v0 = parse_volume(
            br#"{"replicas":[{"name":"r-t","hostId":"n2","address":"10.0.0.2","mode":"WO"}],"rebuildStatus":[]}"#,
        )
        .unwrap();
        let mut t = resolve(&v0, None);
        let sel = select_network(&mut t, Some(net), &both);
        assert_eq!(sel.network, "pod_network");
        assert!(sel.basis.contains("not known yet"), "{}", sel.basis);
    }

    #[test]
    fn every_source_of_from_replica_list_is_resolved_once() {
        let v = parse_volume(
            br#"{"replicas":[{"name":"r-s","hostId":"n1","address":"10.0.0.1","instanceManagerName":"im-1","mode":"RW"},
                             {"name":"r-s2","hostId":"n1","address":"10.0.0.1","instanceManagerName":"im-1b","mode":"RW"},
                             {"name":"r-t","hostId":"n2","address":"10.0.0.2","instanceManagerName":"im-2","mode":"WO"}],
                 "rebuildStatus":[{"replica":"r-t","fromReplicaList":["r-s","r-s2","r-s","r-s2","r-gone"],"state":"in_progress"}]}"#,
        )
        .unwrap();
        let t = resolve(&v, None);
        assert_eq!(t.source.as_ref().unwrap().name, "r-s");
        let more: Vec<&str> = t.more_sources.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(
            more,
            ["r-s2"],
            "a repeat and an unknown name are not sources"
        );
        assert_eq!(t.replica_ims(), ["im-1", "im-1b", "im-2"]);
        assert_eq!(t.sources_named.len(), 5);
    }

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
    }

    /// One node's part(s), as both the capture and pstackd label it.
    #[test]
    fn node_roles_table() {
        let ip = |s: &str| -> IpAddr { s.parse().unwrap() };
        let vol = |e_ip: &str, e_node: &str| {
            let doc = format!(
                r#"{{"replicas":[{{"name":"r-s","hostId":"n1","address":"10.0.0.1","instanceManagerName":"im-1","mode":"RW"}},
                                 {{"name":"r-t","hostId":"n2","address":"10.0.0.2","instanceManagerName":"im-2","mode":"WO"}}],
                     "controllers":[{{"name":"e-0","hostId":"{e_node}","address":"{e_ip}"}}],
                     "rebuildStatus":[{{"replica":"r-t","fromReplica":"r-s","state":"in_progress"}}]}}"#
            );
            resolve(&parse_volume(doc.as_bytes()).unwrap(), None)
        };
        let apart = vol("10.0.0.3", "n3");
        let e_with_t = vol("10.0.0.2", "n2");
        let e_with_s = vol("10.0.0.1", "n1");
        use PartyRole::{Engine as E, Source as S, Target as T};
        /// name, topology, node name, local IPs, peer, roles, acting role.
        type Case<'a> = (
            &'a str,
            &'a Topology,
            &'a str,
            Vec<IpAddr>,
            Option<IpAddr>,
            Vec<PartyRole>,
            Option<PartyRole>,
        );
        let cases: Vec<Case<'_>> = vec![
            ("T by name", &apart, "n2", vec![], None, vec![T], Some(T)),
            (
                "T by ip",
                &apart,
                "",
                vec![ip("10.0.0.2")],
                None,
                vec![T],
                Some(T),
            ),
            ("S by name", &apart, "n1", vec![], None, vec![S], Some(S)),
            (
                "E by ip",
                &apart,
                "",
                vec![ip("10.0.0.3")],
                None,
                vec![E],
                Some(E),
            ),
            (
                "no part",
                &apart,
                "n9",
                vec![ip("10.0.0.9")],
                None,
                vec![],
                None,
            ),
            (
                "peer S decides T",
                &apart,
                "",
                vec![],
                Some(ip("10.0.0.1")),
                vec![T],
                Some(T),
            ),
            (
                "peer T decides nothing",
                &apart,
                "",
                vec![],
                Some(ip("10.0.0.2")),
                vec![],
                None,
            ),
            (
                "E=T by ip",
                &e_with_t,
                "",
                vec![ip("10.0.0.2")],
                None,
                vec![E, T],
                Some(T),
            ),
            (
                "E=T by name",
                &e_with_t,
                "n2",
                vec![],
                None,
                vec![E, T],
                Some(T),
            ),
            (
                "E=S by ip",
                &e_with_s,
                "",
                vec![ip("10.0.0.1")],
                None,
                vec![E, S],
                Some(S),
            ),
            (
                "E=S by name",
                &e_with_s,
                "n1",
                vec![],
                None,
                vec![E, S],
                Some(S),
            ),
            (
                "a name match is not overridden by the peer",
                &apart,
                "n3",
                vec![],
                Some(ip("10.0.0.1")),
                vec![E],
                Some(E),
            ),
        ];
        for (name, t, node, ips, peer, roles, acting) in cases {
            let r = node_roles(
                t,
                NodeSeen {
                    node,
                    local_ips: &ips,
                    peer,
                },
            );
            assert_eq!(r.roles, roles, "{name}: {}", r.basis);
            assert_eq!(r.acting(), acting, "{name}");
        }
        let r = node_roles(
            &e_with_t,
            NodeSeen {
                node: "n2",
                ..Default::default()
            },
        );
        assert_eq!(r.label(), "engine+target");
        assert_eq!(
            NodeRoles {
                roles: vec![],
                basis: String::new()
            }
            .label(),
            "unknown"
        );
    }
}
