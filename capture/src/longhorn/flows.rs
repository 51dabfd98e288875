//! A TCP flow's role in a v1 rebuild, from its two endpoints and the
//! replicas' port blocks (see `topology` for the layout):
//!
//! | role | client → server | longhorn-engine |
//! |---|---|---|
//! | `sync_control` | T sync agent → S:P_S+2 | `FileSend` RPC, idle while a file streams (`pkg/sync/rpc/server.go` v1.9.0 l.342) |
//! | `ssync_data` | S sync agent → T:P_T+3…P_T+9 | one receiver per file (`launchReceiver`/`nextPort`, l.161, l.397) |
//! | `engine_data` | E → S or T :P, :P+1 | live writes (replica gRPC and data server) |
//! | `files_sync` | E → T:P_T+2 | the long `FilesSync` RPC |
//!
//! A flow with neither end in S's or T's block belongs to another volume and
//! is excluded (and counted). Pure: no I/O.

use std::net::SocketAddr;

use serde::Serialize;

use super::topology::{Party, Topology};

/// A flow's role in the rebuild.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FlowRole {
    /// T → S:P_S+2, the `FileSend` control channel.
    SyncControl,
    /// E (the engine or its IM proxy) → S:P_S+2: `SnapshotPurgeStatus` in
    /// source selection and the head `.meta` `FileSend` of `AddReplica`
    /// (engine `pkg/sync/sync.go` v1.9.0 l.439-495), not T's control channel.
    EngineSyncAgent,
    /// S → T:P_T+3…+9, a bulk file stream.
    SsyncData,
    /// E → replica :P/:P+1, live writes.
    EngineData,
    /// E → T:P_T+2, `FilesSync`.
    FilesSync,
    /// In S's or T's block, none of the above.
    InBlock,
    /// Neither end in S's or T's block: another volume's flow.
    Excluded,
}

impl FlowRole {
    /// snake_case name.
    pub fn as_str(self) -> &'static str {
        match self {
            FlowRole::SyncControl => "sync_control",
            FlowRole::EngineSyncAgent => "engine_sync_agent",
            FlowRole::SsyncData => "ssync_data",
            FlowRole::EngineData => "engine_data",
            FlowRole::FilesSync => "files_sync",
            FlowRole::InBlock => "in_block",
            FlowRole::Excluded => "excluded",
        }
    }
}

/// Whether `a` is `party`'s port at `offset..=offset_hi` from its block
/// start. With `by_ip`, the address must also be the party's data address
/// (its Replica CR storage IP under a storage network, else its pod IP;
/// without `by_ip` ports alone decide).
fn at(party: &Option<Party>, a: SocketAddr, lo: u16, hi: u16, by_ip: bool) -> bool {
    let Some(p) = party else { return false };
    let Some(b) = p.block else { return false };
    if by_ip && p.data_ip().is_some_and(|ip| ip != a.ip()) {
        return false;
    }
    let port = a.port();
    port >= b.start.saturating_add(lo) && port <= b.start.saturating_add(hi) && b.contains(port)
}

/// The role of the flow between `x` and `y` (either order). Every source
/// counts (v1.11+ `fromReplicaList`): S:P_S+2 and S's block of any of them.
pub fn classify(t: &Topology, x: SocketAddr, y: SocketAddr, by_ip: bool) -> FlowRole {
    classify_source(t, x, y, by_ip).0
}

/// [`classify`], and the source replica whose block the flow touches (None:
/// none, or a target-only role).
pub fn classify_source(
    t: &Topology,
    x: SocketAddr,
    y: SocketAddr,
    by_ip: bool,
) -> (FlowRole, Option<String>) {
    let either = |f: &dyn Fn(SocketAddr) -> bool| f(x) || f(y);
    let source_at = |lo: u16, hi: u16| {
        t.sources().find_map(|s| {
            let p = Some(s.clone());
            either(&|a| at(&p, a, lo, hi, by_ip)).then(|| (p, s.name.clone()))
        })
    };
    if let Some((s, name)) = source_at(2, 2) {
        // Decided by both ends: the other end is E's only when E has an
        // address of its own (on all-in-one instance managers E often shares
        // T's pod IP, and then the two cannot be told apart: sync_control).
        let other = if at(&s, x, 2, 2, by_ip) { y } else { x };
        let ip = |p: &Option<Party>| p.as_ref().and_then(Party::data_ip);
        let engine = ip(&t.engine);
        let role =
            if by_ip && engine.is_some() && engine == Some(other.ip()) && engine != ip(&t.target) {
                FlowRole::EngineSyncAgent
            } else {
                FlowRole::SyncControl
            };
        return (role, Some(name));
    }
    // The bulk stream's client end is a source's ephemeral port: which
    // source sent it is told by its address when the sources differ.
    let sender = || {
        t.sources()
            .filter(|s| s.data_ip().is_some_and(|ip| ip == x.ip() || ip == y.ip()))
            .map(|s| s.name.clone())
            .collect::<Vec<_>>()
    };
    if either(&|a| at(&t.target, a, 3, 9, by_ip)) {
        let s = sender();
        (FlowRole::SsyncData, (s.len() == 1).then(|| s[0].clone()))
    } else if either(&|a| at(&t.target, a, 2, 2, by_ip)) {
        (FlowRole::FilesSync, None)
    } else if either(&|a| at(&t.target, a, 0, 1, by_ip)) {
        (FlowRole::EngineData, None)
    } else if let Some((_, name)) = source_at(0, 1) {
        (FlowRole::EngineData, Some(name))
    } else if either(&|a| at(&t.target, a, 0, u16::MAX, by_ip)) {
        (FlowRole::InBlock, None)
    } else if let Some((_, name)) = source_at(0, u16::MAX) {
        (FlowRole::InBlock, Some(name))
    } else {
        (FlowRole::Excluded, None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::longhorn::model::PortBlock;
    use crate::longhorn::topology::PartyRole;

    fn p(role: PartyRole, ip: &str, start: u16) -> Option<Party> {
        Some(Party {
            role,
            name: role.as_str().into(),
            node: String::new(),
            address: Some(ip.parse().unwrap()),
            instance_manager: String::new(),
            storage_ip: None,
            block: Some(PortBlock {
                start,
                end: start + 9,
            }),
        })
    }

    #[test]
    fn roles_follow_the_port_blocks_and_other_volumes_are_excluded() {
        let t = Topology {
            engine: None,
            source: p(PartyRole::Source, "10.0.0.1", 10000),
            target: p(PartyRole::Target, "10.0.0.2", 10010),
            sources_named: vec![],
            more_sources: vec![],
            target_basis: "",
            data_engine: "v1".into(),
        };
        let a = |s: &str| s.parse::<SocketAddr>().unwrap();
        let table = [
            ("10.0.0.2:41000", "10.0.0.1:10002", FlowRole::SyncControl),
            ("10.0.0.1:41001", "10.0.0.2:10013", FlowRole::SsyncData),
            ("10.0.0.1:41001", "10.0.0.2:10019", FlowRole::SsyncData),
            ("10.0.0.3:41002", "10.0.0.2:10012", FlowRole::FilesSync),
            ("10.0.0.3:41003", "10.0.0.2:10010", FlowRole::EngineData),
            ("10.0.0.3:41003", "10.0.0.1:10001", FlowRole::EngineData),
            ("10.0.0.2:41004", "10.0.0.1:10005", FlowRole::InBlock),
            // Another volume's replica on T at 10020: not ours.
            ("10.0.0.1:41005", "10.0.0.2:10020", FlowRole::Excluded),
            // Our port number, but on the other node: another IM's block.
            ("10.0.0.2:41006", "10.0.0.1:10013", FlowRole::Excluded),
        ];
        for (x, y, want) in table {
            assert_eq!(classify(&t, a(x), a(y), true), want, "{x} -> {y}");
            assert_eq!(classify(&t, a(y), a(x), true), want, "{y} -> {x}");
        }
        // A storage network: pod IPs differ, ports alone decide.
        assert_eq!(
            classify(&t, a("192.168.9.2:41000"), a("192.168.9.1:10002"), false),
            FlowRole::SyncControl
        );
        // S:P_S+2 is decided by both ends: E's own address → E's sync-agent
        // calls; T's → T's control channel; E sharing T's IP → sync_control.
        let mut with_e = t.clone();
        with_e.engine = p(PartyRole::Engine, "10.0.0.3", 0);
        assert_eq!(
            classify(&with_e, a("10.0.0.3:41007"), a("10.0.0.1:10002"), true),
            FlowRole::EngineSyncAgent
        );
        assert_eq!(
            classify(&with_e, a("10.0.0.2:41000"), a("10.0.0.1:10002"), true),
            FlowRole::SyncControl
        );
        let mut shared = t.clone();
        shared.engine = p(PartyRole::Engine, "10.0.0.2", 0);
        assert_eq!(
            classify(&shared, a("10.0.0.2:41008"), a("10.0.0.1:10002"), true),
            FlowRole::SyncControl
        );
        assert_eq!(
            classify(&t, a("192.168.9.2:41000"), a("192.168.9.1:10002"), true),
            FlowRole::Excluded
        );
    }

    #[test]
    fn every_source_of_a_v1_11_rebuild_has_its_flows_and_name() {
        let named = |role, ip, start, name: &str| {
            p(role, ip, start).map(|mut x| {
                x.name = name.into();
                x
            })
        };
        let t = Topology {
            engine: None,
            source: named(PartyRole::Source, "10.0.0.1", 10000, "r-s1"),
            target: named(PartyRole::Target, "10.0.0.2", 10500, "r-t"),
            sources_named: vec!["r-s1".into(), "r-s2".into(), "r-s3".into()],
            more_sources: vec![
                named(PartyRole::Source, "10.0.0.1", 10200, "r-s2").unwrap(),
                named(PartyRole::Source, "10.0.0.4", 10300, "r-s3").unwrap(),
            ],
            target_basis: "",
            data_engine: "v1".into(),
        };
        let a = |s: &str| s.parse::<SocketAddr>().unwrap();
        let table: [(&str, &str, FlowRole, Option<&str>); 7] = [
            (
                "10.0.0.2:41000",
                "10.0.0.1:10002",
                FlowRole::SyncControl,
                Some("r-s1"),
            ),
            (
                "10.0.0.2:41001",
                "10.0.0.1:10202",
                FlowRole::SyncControl,
                Some("r-s2"),
            ),
            (
                "10.0.0.2:41002",
                "10.0.0.4:10302",
                FlowRole::SyncControl,
                Some("r-s3"),
            ),
            // Two sources share 10.0.0.1: the bulk stream's sender is not told.
            (
                "10.0.0.1:41003",
                "10.0.0.2:10503",
                FlowRole::SsyncData,
                None,
            ),
            (
                "10.0.0.4:41004",
                "10.0.0.2:10504",
                FlowRole::SsyncData,
                Some("r-s3"),
            ),
            (
                "10.0.0.2:41005",
                "10.0.0.4:10305",
                FlowRole::InBlock,
                Some("r-s3"),
            ),
            // The first source's IP at a port of no source's block.
            ("10.0.0.2:41006", "10.0.0.1:10302", FlowRole::Excluded, None),
        ];
        for (x, y, role, source) in table {
            let want = (role, source.map(str::to_string));
            assert_eq!(classify_source(&t, a(x), a(y), true), want, "{x} -> {y}");
            assert_eq!(classify_source(&t, a(y), a(x), true), want, "{y} -> {x}");
        }
        assert_eq!(t.covering_ports(), Some((10000, 10509)));
    }
}
