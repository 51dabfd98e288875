//! Topology, capture role and rebuild identity: a section of
//! [`super::transfer_envelope`].

use std::net::IpAddr;

use pstack_envelope::{ClaimCode, ClaimKind, Surface, SurfaceStatus};
use serde_json::{Map, Value, json};

use super::{Cx, Out, endpoints};
use crate::longhorn::client::API_DEADLINE;
use crate::longhorn::model::Volume;
use crate::longhorn::topology::{NodeSeen, check_flags, node_roles, resolve};

/// Topology, role, identity: the topology surface and its claims; returns the
/// role this capture plays.
pub(super) fn topology_section(
    cx: Cx,
    volumes: &[Option<Volume>; 2],
    target_name: &Option<String>,
    o: &mut Out,
) -> String {
    let Cx { a, plan, r, topo } = cx;
    let streams = &r.streams;
    let local_ips: Vec<IpAddr> = streams
        .flows
        .iter()
        .filter_map(endpoints)
        .map(|(l, _)| l.ip())
        .collect();
    let end_topo = volumes[1]
        .as_ref()
        .map(|v| resolve(v, target_name.as_deref()));
    let mut role_str = "unknown".to_string();
    if let Some(t) = topo {
        // The same function pstackd labels its window with (one node, one
        // decision): here the node knows itself by the flows' local ends.
        let roles = node_roles(
            t,
            NodeSeen {
                node: "",
                local_ips: &local_ips,
                peer: Some(plan.filter.peer),
            },
        );
        role_str = roles
            .acting()
            .map(|r| r.as_str().to_string())
            .unwrap_or_else(|| "unknown".into());
        let basis = roles.basis.clone();
        let mismatches = check_flags(t, &a.source_node, &a.target_node, plan.filter.peer);
        let first_seen = r
            .start
            .as_ref()
            .filter(|_| volumes[0].as_ref().is_some_and(|v| !v.rebuild.is_empty()))
            .map(|s| s.at.clone());
        let mut facts = Map::new();
        facts.insert("topology".into(), json!(t));
        facts.insert("capture_role".into(), json!(role_str));
        facts.insert("capture_role_basis".into(), json!(basis));
        facts.insert("capture_roles".into(), json!(roles.label()));
        facts.insert(
            "match_by".into(),
            json!(if r.by_ip {
                "pod_ip_and_port"
            } else {
                "port_only"
            }),
        );
        facts.insert("flag_mismatches".into(), json!(mismatches));
        if let Some(sel) = &r.selected_on {
            facts.insert("selected_on".into(), json!(sel));
        }
        // The join key of the three capture points (volume + target replica
        // + the first time this node saw the rebuild).
        facts.insert(
            "rebuild_identity".into(),
            json!({"volume": a.volume, "replica": target_name, "first_seen": first_seen}),
        );
        if let Some(e) = &end_topo {
            let same = |x: &Option<crate::longhorn::topology::Party>,
                        y: &Option<crate::longhorn::topology::Party>| {
                x.as_ref().map(|p| (&p.name, &p.instance_manager, &p.node))
                    == y.as_ref().map(|p| (&p.name, &p.instance_manager, &p.node))
            };
            let mut changed = Vec::new();
            if !same(&t.engine, &e.engine) {
                changed.push("engine");
            }
            if !same(&t.target, &e.target) {
                changed.push("target replica");
            }
            if e.source.is_some() && !same(&t.source, &e.source) {
                changed.push("source replica");
            }
            facts.insert("identity_changed_at_end".into(), json!(changed));
        }
        o.surfaces.push(Surface {
            id: "longhorn/topology".into(),
            authority: "pstack: derived from longhorn/manager/start and longhorn/instancemanager/*"
                .into(),
            status: SurfaceStatus::Ok,
            cause: None,
            deadline_ms: API_DEADLINE.as_millis() as u64,
            elapsed_us: 0,
            digest: None,
            bytes: 0,
            truncated: false,
            facts: facts.clone(),
        });
        let part = |p: &Option<crate::longhorn::topology::Party>| {
            p.as_ref()
                .map(|p| {
                    format!(
                        "{} on {} ({} in {}, ports {})",
                        p.name,
                        p.node,
                        p.address
                            .map(|a| a.to_string())
                            .unwrap_or_else(|| "?".into()),
                        p.instance_manager,
                        p.block
                            .map(|b| format!("{}-{}", b.start, b.end))
                            .unwrap_or_else(|| "?".into())
                    )
                })
                .unwrap_or_else(|| "unknown".into())
        };
        o.claim(
            ClaimKind::Fact,
            ClaimCode::LonghornTopologyResolved,
            format!(
                "the manager names engine {}, source {}, target {}; this capture plays the {role_str} role",
                part(&t.engine),
                part(&t.source),
                part(&t.target)
            ),
            &["longhorn/manager/start", "longhorn/topology"],
            None,
        );
        if let Some(sel) = &r.selected_on {
            o.claim(
                ClaimKind::Fact,
                ClaimCode::LonghornFlowsSelectedOn,
                format!(
                    "flows selected on the {} ({}): {}",
                    sel.network,
                    if sel.addresses.is_empty() {
                        "no address known".to_string()
                    } else {
                        sel.addresses.join(", ")
                    },
                    sel.basis
                ),
                &["longhorn/topology"],
                None,
            );
        }
        for m in &mismatches {
            o.claim(
                ClaimKind::Fact,
                ClaimCode::LonghornFlagMismatch,
                format!(
                    "--{} {} disagrees with the manager: {}",
                    m.flag.replace('_', "-"),
                    m.given,
                    m.longhorn
                ),
                &["longhorn/manager/start", "longhorn/topology"],
                None,
            );
            if m.flag == "peer"
                && let Some(p) = t.source.as_ref().or(t.target.as_ref())
            {
                o.unknown(
                    format!("is {} a storage-network address of a replica of volume {}?", m.given, a.volume),
                    "RESOLVE_STORAGE_NETWORK",
                    format!(
                        "kubectl -n longhorn-system get replicas.longhorn.io {} -o jsonpath='{{.status.storageIP}}:{{.status.port}}'; kubectl -n longhorn-system get settings.longhorn.io storage-network -o jsonpath='{{.value}}'",
                        p.name
                    ),
                    Some("longhorn/topology"),
                );
            }
        }
        if let Some(e) = &end_topo {
            let changed = facts["identity_changed_at_end"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            if !changed.is_empty() && o.ok("longhorn/manager/end") {
                o.claim(
                    ClaimKind::Fact,
                    ClaimCode::LonghornIdentityChanged,
                    format!(
                        "between window start and end the manager's {} changed (end: engine {:?}, target {:?})",
                        changed.iter().filter_map(Value::as_str).collect::<Vec<_>>().join(", "),
                        e.engine.as_ref().map(|p| &p.name),
                        e.target.as_ref().map(|p| &p.name)
                    ),
                    &["longhorn/manager/start", "longhorn/manager/end", "longhorn/topology"],
                    None,
                );
            }
        }
    }
    role_str
}
