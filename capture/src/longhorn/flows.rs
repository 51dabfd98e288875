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

use std::net::{IpAddr, SocketAddr};

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

/// One `ssync_data` connection as seen in the window, oriented: `client`
/// is S's ephemeral end, `server` T's receiver (P_T+3…+9).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DataConn {
    /// Flow id or envelope digest (how the operator finds the member).
    pub id: String,
    /// S's end.
    pub client: SocketAddr,
    /// T's receiver.
    pub server: SocketAddr,
    /// First and last event, CLOCK_MONOTONIC ns, when eBPF saw it (None: a
    /// sock_diag sample only, lifetime unknown).
    pub span_ns: Option<(u64, u64)>,
    /// Retransmits, RSTs sent and received, when eBPF counted them.
    pub counters: Option<[u64; 3]>,
}

/// The parallel connections of one file's transfer, read as one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DataConnectionGroup {
    /// T's receiver `ip:port` (one per file).
    pub receiver: SocketAddr,
    /// S's address (the sender).
    pub sender_ip: IpAddr,
    /// Member ids, in first-seen order.
    pub members: Vec<String>,
    /// Members whose lifetime eBPF saw.
    pub members_timed: usize,
    /// Sums over the members eBPF counted (the others' are unknown).
    pub retransmits: u64,
    /// RSTs this host sent, summed.
    pub resets_sent: u64,
    /// RSTs received, summed.
    pub resets_received: u64,
    /// First to last event over the timed members, ns.
    pub span_ns: Option<(u64, u64)>,
}

/// Orient a `ssync_data` flow: (S's end, T's receiver), None for any other
/// flow.
pub fn data_conn_ends(
    t: &Topology,
    x: SocketAddr,
    y: SocketAddr,
    by_ip: bool,
) -> Option<(SocketAddr, SocketAddr)> {
    if at(&t.target, y, 3, 9, by_ip) {
        Some((x, y))
    } else if at(&t.target, x, 3, 9, by_ip) {
        Some((y, x))
    } else {
        None
    }
}

/// Group the data connections of one file's transfer.
///
/// How upstream opens them: T's sync agent starts one ssync receiver per
/// file on the next free port of P_T+3…+9 (longhorn-engine
/// `pkg/sync/rpc/server.go` `launchReceiver`/`nextPort`, v1.9.0 l.161,
/// l.397); S's `FileSend` runs `sparse.SyncFile` towards that one
/// `host:port`, whose `syncContent` starts `numSyncWorkers` (4,
/// `defaultSyncWorkerCount`; `const WorkerCount = 4` in older releases)
/// workers sharing one HTTP client on `client.remote` (longhorn/sparse-tools
/// `sparse/client.go` `syncContent`): up to 4 concurrent requests, so up to
/// 4 kept-alive TCP connections from S's IP to the same receiver, all
/// closed when the file ends (the receiver exits on `close`).
///
/// Key: (S's IP, T's receiver `ip:port`). Ports cycle over 7 receivers, so
/// a later file may reuse a port: within a key, a timed member that starts
/// after every earlier member of the group has ended begins a new group.
/// Untimed members (sock_diag samples only) join the key's first group.
/// Pure; table-tested.
pub fn group_data_connections(conns: &[DataConn]) -> Vec<DataConnectionGroup> {
    let mut order: Vec<&DataConn> = conns.iter().collect();
    // Timed members by start, untimed last (stable: input order kept).
    order.sort_by_key(|c| c.span_ns.map_or((1, 0), |(a, _)| (0, a)));
    let mut groups: Vec<DataConnectionGroup> = Vec::new();
    for c in order {
        let key = (c.client.ip(), c.server);
        let same = |g: &DataConnectionGroup| (g.sender_ip, g.receiver) == key;
        let found = match c.span_ns {
            // The latest group of this key, if this member overlaps it.
            Some((start, _)) => groups
                .iter()
                .rposition(same)
                .filter(|&i| groups[i].span_ns.is_none_or(|(_, end)| start <= end)),
            None => groups.iter().position(same),
        };
        let i = found.unwrap_or_else(|| {
            groups.push(DataConnectionGroup {
                receiver: c.server,
                sender_ip: c.client.ip(),
                members: Vec::new(),
                members_timed: 0,
                retransmits: 0,
                resets_sent: 0,
                resets_received: 0,
                span_ns: None,
            });
            groups.len() - 1
        });
        let g = &mut groups[i];
        g.members.push(c.id.clone());
        if let Some((a, b)) = c.span_ns {
            g.members_timed += 1;
            g.span_ns = Some(g.span_ns.map_or((a, b), |(x, y)| (x.min(a), y.max(b))));
        }
        if let Some([r, s, v]) = c.counters {
            g.retransmits += r;
            g.resets_sent += s;
            g.resets_received += v;
        }
    }
    groups
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

    /// The parallel connections of one file are one group; another file,
    /// another sender or a later file on a reused port are not.
    #[test]
    fn data_connections_of_one_file_are_one_group() {
        let a = |s: &str| s.parse::<SocketAddr>().unwrap();
        let c =
            |id: &str, client: &str, server: &str, span: Option<(u64, u64)>, rst: u64| DataConn {
                id: id.into(),
                client: a(client),
                server: a(server),
                span_ns: span,
                counters: span.map(|_| [1, 0, rst]),
            };
        // (case, connections, groups as (receiver, member ids), resets_received per group)
        type Case = (
            &'static str,
            Vec<DataConn>,
            Vec<(&'static str, Vec<&'static str>)>,
            Vec<u64>,
        );
        let cases: Vec<Case> = vec![
            ("none", vec![], vec![], vec![]),
            (
                "one file, 4 workers",
                vec![
                    c("a", "10.0.0.1:41001", "10.0.0.2:10013", Some((10, 90)), 0),
                    c("b", "10.0.0.1:41002", "10.0.0.2:10013", Some((11, 91)), 1),
                    c("c", "10.0.0.1:41003", "10.0.0.2:10013", Some((12, 92)), 0),
                    c("d", "10.0.0.1:41004", "10.0.0.2:10013", Some((13, 93)), 1),
                ],
                vec![("10.0.0.2:10013", vec!["a", "b", "c", "d"])],
                vec![2],
            ),
            (
                "two files, two receivers",
                vec![
                    c("a", "10.0.0.1:41001", "10.0.0.2:10013", Some((10, 90)), 0),
                    c("b", "10.0.0.1:41002", "10.0.0.2:10014", Some((11, 91)), 0),
                    c("c", "10.0.0.1:41003", "10.0.0.2:10013", Some((12, 92)), 0),
                ],
                vec![
                    ("10.0.0.2:10013", vec!["a", "c"]),
                    ("10.0.0.2:10014", vec!["b"]),
                ],
                vec![0, 0],
            ),
            (
                "two sources to one receiver port are not one transfer",
                vec![
                    c("a", "10.0.0.1:41001", "10.0.0.2:10013", Some((10, 90)), 0),
                    c("b", "10.0.0.5:41001", "10.0.0.2:10013", Some((11, 91)), 0),
                ],
                vec![("10.0.0.2:10013", vec!["a"]), ("10.0.0.2:10013", vec!["b"])],
                vec![0, 0],
            ),
            (
                "a reused port after the file ended is the next file",
                vec![
                    c("a", "10.0.0.1:41001", "10.0.0.2:10013", Some((10, 50)), 0),
                    c("b", "10.0.0.1:41002", "10.0.0.2:10013", Some((51, 60)), 0),
                    c("c", "10.0.0.1:41003", "10.0.0.2:10013", Some((55, 70)), 1),
                ],
                vec![
                    ("10.0.0.2:10013", vec!["a"]),
                    ("10.0.0.2:10013", vec!["b", "c"]),
                ],
                vec![0, 1],
            ),
            (
                "starting at the group's last end is still the same file",
                vec![
                    c("a", "10.0.0.1:41001", "10.0.0.2:10013", Some((10, 50)), 0),
                    c("b", "10.0.0.1:41002", "10.0.0.2:10013", Some((50, 60)), 0),
                ],
                vec![("10.0.0.2:10013", vec!["a", "b"])],
                vec![0],
            ),
            (
                "an untimed sample joins its key's first group",
                vec![
                    c("s", "10.0.0.1:41009", "10.0.0.2:10013", None, 0),
                    c("a", "10.0.0.1:41001", "10.0.0.2:10013", Some((10, 50)), 0),
                ],
                vec![("10.0.0.2:10013", vec!["a", "s"])],
                vec![0],
            ),
        ];
        for (name, conns, want, resets) in cases {
            let g = group_data_connections(&conns);
            let got: Vec<(SocketAddr, Vec<&str>)> = g
                .iter()
                .map(|g| (g.receiver, g.members.iter().map(String::as_str).collect()))
                .collect();
            let want: Vec<(SocketAddr, Vec<&str>)> =
                want.into_iter().map(|(r, m)| (a(r), m)).collect();
            assert_eq!(got, want, "{name}");
            assert_eq!(
                g.iter().map(|g| g.resets_received).collect::<Vec<_>>(),
                resets,
                "{name}"
            );
        }
        let g = group_data_connections(&[
            c("a", "10.0.0.1:41001", "10.0.0.2:10013", Some((10, 90)), 0),
            c("b", "10.0.0.1:41002", "10.0.0.2:10013", Some((5, 95)), 0),
        ]);
        assert_eq!(g[0].span_ns, Some((5, 95)));
        assert_eq!((g[0].members_timed, g[0].retransmits), (2, 2));
    }

    #[test]
    fn a_data_connection_is_oriented_towards_the_receiver() {
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
        let (s, r) = (a("10.0.0.1:41001"), a("10.0.0.2:10013"));
        assert_eq!(data_conn_ends(&t, s, r, true), Some((s, r)));
        assert_eq!(data_conn_ends(&t, r, s, true), Some((s, r)));
        assert_eq!(
            data_conn_ends(&t, s, a("10.0.0.2:10012"), true),
            None,
            "P_T+2 is FilesSync"
        );
        assert_eq!(
            data_conn_ends(&t, s, a("10.0.0.2:10020"), true),
            None,
            "outside T's block"
        );
    }
}
