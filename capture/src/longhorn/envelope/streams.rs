//! The linked streams of a transfer: their roles, the streams surface
//! (links, short-lived streams, data connection groups) and its claims.
//! Sections of [`super::transfer_envelope`].

use pstack_envelope::facts::{Facts as _, StreamLink, StreamsFacts};
use pstack_envelope::surface_id::storage_transfer::STREAMS;
use pstack_envelope::{
    ClaimCode, ClaimKind, Envelope, Subject, Surface, SurfaceStatus, Termination, sha256_digest,
};
use serde_json::{Map, Value, json};

use super::{Cx, Out, Readings, endpoints, role_in};
use crate::longhorn::flows::{
    DataConn, FlowRole, classify, data_conn_ends, group_data_connections,
};
use crate::longhorn::topology::Topology;
use crate::transport;

/// Flows: roles.
pub(super) fn flow_roles<'a>(
    r: &'a Readings,
    topo: Option<&Topology>,
) -> Vec<(&'a Envelope, FlowRole)> {
    let streams = &r.streams;
    let mut roles: Vec<(&Envelope, FlowRole)> = Vec::new();
    for e in &streams.flows {
        let role = match (topo, endpoints(e)) {
            (Some(t), Some((x, y)))
                if t.source.as_ref().and_then(|p| p.block).is_some()
                    || t.target.as_ref().and_then(|p| p.block).is_some() =>
            {
                classify(t, x, y, r.by_ip)
            }
            _ => FlowRole::InBlock,
        };
        roles.push((e, role));
    }
    roles
}

/// Flows: the linked streams surface, short-lived streams, data connection groups.
pub(super) fn streams_surface<'a>(
    cx: Cx<'a>,
    roles: &[(&Envelope, FlowRole)],
    linked: &[&Envelope],
    o: &mut Out,
) -> (bool, Vec<(&'a transport::TransientFlow, FlowRole)>) {
    let Cx { plan, r, topo, .. } = cx;
    let streams = &r.streams;
    let role_of = |digest: &str| role_in(roles, digest);
    // Which source a flow belongs to (v1.11+ may name several).
    let source_of = |e: &Envelope| -> Option<String> {
        let t = topo?;
        let (x, y) = endpoints(e)?;
        crate::longhorn::flows::classify_source(t, x, y, r.by_ip).1
    };
    let links: Vec<StreamLink> = linked
        .iter()
        .map(|e| {
            let (flow, src, dst) = match &e.subject {
                Subject::NetworkStream(s) => (
                    Some(s.flow_id.clone()),
                    Some(s.src.clone()),
                    Some(s.dst.clone()),
                ),
                _ => (None, None, None),
            };
            StreamLink {
                digest: e.digest.clone(),
                kind: Some(e.subject.kind().into()),
                flow_id: flow,
                src,
                dst,
                role: role_of(&e.digest).map(|r| r.as_str().into()),
                source_replica: source_of(e),
                completeness: Some(e.completeness.as_str().into()),
                claims: e
                    .claims
                    .iter()
                    .map(|c| StreamLink::claim(c.kind, &c.code))
                    .collect(),
            }
        })
        .collect();
    let incomplete: Vec<&str> = linked
        .iter()
        .filter(|e| e.completeness != pstack_envelope::Completeness::Complete)
        .map(|e| e.digest.as_str())
        .collect();
    let capped = linked
        .iter()
        .any(|e| e.universe.termination != Termination::Exhausted);
    let joined: String = linked
        .iter()
        .map(|e| e.digest.as_str())
        .collect::<Vec<_>>()
        .join("\n");
    let mut sfacts = Map::new();
    // What the store reads, written through its type.
    StreamsFacts {
        links,
        net_ns: Some(streams.net_ns.to_string()),
    }
    .write_into(&mut sfacts);
    sfacts.insert("stream_count".into(), json!(streams.flows.len()));
    sfacts.insert("incomplete_links".into(), json!(incomplete));
    sfacts.insert("excluded_count".into(), json!(r.excluded.len()));
    sfacts.insert(
        "excluded_sample".into(),
        json!(r.excluded.iter().take(10).collect::<Vec<_>>()),
    );
    // Streams opened and closed inside the window, from eBPF (not linked:
    // they have no envelope of their own; listed with their role).
    let short_roles: Vec<(&transport::TransientFlow, FlowRole)> = streams
        .short_lived
        .iter()
        .flatten()
        .map(|f| {
            let role = match topo {
                Some(t)
                    if t.source.as_ref().and_then(|p| p.block).is_some()
                        || t.target.as_ref().and_then(|p| p.block).is_some() =>
                {
                    classify(t, f.local, f.remote, r.by_ip)
                }
                _ => FlowRole::InBlock,
            };
            (f, role)
        })
        .collect();
    // The parallel connections of one file (up to 4 sparse workers to one
    // receiver, see `flows::group_data_connections`), read as one transfer.
    if let Some(t) = topo {
        let mut conns: Vec<DataConn> = Vec::new();
        for (e, role) in roles {
            if let (FlowRole::SsyncData, Some((x, y))) = (role, endpoints(e))
                && let Some((client, server)) = data_conn_ends(t, x, y, r.by_ip)
            {
                conns.push(DataConn {
                    id: e.digest.clone(),
                    client,
                    server,
                    span_ns: None,
                    counters: None,
                });
            }
        }
        for (f, role) in &short_roles {
            if *role == FlowRole::SsyncData
                && let Some((client, server)) = data_conn_ends(t, f.local, f.remote, r.by_ip)
            {
                let span = f
                    .first_ns
                    .parse::<u64>()
                    .ok()
                    .zip(f.last_ns.parse::<u64>().ok());
                conns.push(DataConn {
                    id: f
                        .cookie
                        .clone()
                        .unwrap_or_else(|| format!("{}-{}@{}", f.local, f.remote, f.first_ns)),
                    client,
                    server,
                    span_ns: span,
                    counters: Some([f.retransmits, f.resets_sent, f.resets_received]),
                });
            }
        }
        let groups = group_data_connections(&conns);
        sfacts.insert("data_connection_group_count".into(), json!(groups.len()));
        sfacts.insert(
            "data_connection_groups".into(),
            json!(groups.iter().take(plan.max_flows).collect::<Vec<_>>()),
        );
    }
    match &streams.short_lived {
        None => {
            sfacts.insert(
                "short_lived_source".into(),
                json!("eBPF did not run: streams opened and closed inside the window are not seen"),
            );
        }
        Some(_) => {
            sfacts.insert(
                "short_lived_source".into(),
                json!("eBPF inet_sock_set_state: flows that closed inside the window and were in neither sock_diag sample; identity is the socket cookie when the kernel had one, else the 4-tuple and first event time"),
            );
            sfacts.insert("short_lived_count".into(), json!(short_roles.len()));
            sfacts.insert(
                "short_lived".into(),
                Value::Array(
                    short_roles
                        .iter()
                        .take(plan.max_flows)
                        .map(|(f, role)| {
                            let mut v = json!(f);
                            v["role"] = json!(role.as_str());
                            v
                        })
                        .collect(),
                ),
            );
        }
    }
    o.surfaces.insert(
        0,
        Surface {
            id: STREAMS.into(),
            authority: format!("pstack:network_stream envelopes, netns {}", streams.net_ns),
            status: SurfaceStatus::Ok,
            cause: None,
            deadline_ms: transport::SURFACE_DEADLINE_MS,
            elapsed_us: 0,
            digest: Some(sha256_digest(joined.as_bytes())),
            bytes: joined.len() as u64,
            // A linked stream that is not complete, or a cap: this transfer
            // cannot be complete either.
            truncated: !incomplete.is_empty() || capped,
            facts: sfacts,
        },
    );
    (capped, short_roles)
}

/// Flows: what the linked and short-lived streams say (returns the faulted ones).
pub(super) fn streams_claims(
    cx: Cx,
    roles: &[(&Envelope, FlowRole)],
    short_roles: &[(&transport::TransientFlow, FlowRole)],
    o: &mut Out,
) -> Vec<String> {
    let Cx { plan, r, .. } = cx;
    let streams = &r.streams;
    let role_of = |digest: &str| role_in(roles, digest);
    let faulted: Vec<String> = streams
        .flows
        .iter()
        .filter(|e| {
            e.claims
                .iter()
                .any(|c| c.code != "no_fault_observed" && c.kind == ClaimKind::Fact)
        })
        .map(|e| {
            format!(
                "{} ({})",
                e.digest,
                role_of(&e.digest).map(FlowRole::as_str).unwrap_or("?")
            )
        })
        .collect();
    if !short_roles.is_empty() {
        let mut by_role: std::collections::BTreeMap<&str, usize> = Default::default();
        for (_, role) in short_roles {
            *by_role.entry(role.as_str()).or_default() += 1;
        }
        let resets = short_roles
            .iter()
            .filter(|(f, _)| f.resets_sent + f.resets_received > 0)
            .count();
        o.claim(
            ClaimKind::Fact,
            ClaimCode::LonghornShortLivedStreams,
            format!(
                "eBPF saw {} stream(s) of the rebuild's port blocks close inside the window that neither sock_diag sample held ({}); {} of them carried a RST",
                short_roles.len(),
                by_role
                    .iter()
                    .map(|(r, n)| format!("{n} {r}"))
                    .collect::<Vec<_>>()
                    .join(", "),
                resets
            ),
            &[STREAMS],
            None,
        );
    }
    if streams.flows.is_empty() {
        o.claim(
            ClaimKind::Fact,
            ClaimCode::NoStreamLinked,
            format!(
                "no TCP flow to {} in the rebuild's port blocks matched in netns {}",
                plan.filter.peer, streams.net_ns
            ),
            &[STREAMS],
            None,
        );
    } else {
        o.claim(
            ClaimKind::Fact,
            ClaimCode::StreamsLinked,
            format!(
                "{} stream envelope(s) linked; {} carry transport fault facts: {}",
                streams.flows.len(),
                faulted.len(),
                faulted.join(", ")
            ),
            &[STREAMS],
            None,
        );
    }
    if !r.excluded.is_empty() {
        o.claim(
            ClaimKind::Fact,
            ClaimCode::LonghornFlowsExcluded,
            format!(
                "{} flow(s) to {} outside the source's and target's port blocks were excluded as other volumes' (not linked, not counted in this transfer)",
                r.excluded.len(),
                plan.filter.peer
            ),
            &[STREAMS],
            None,
        );
    }
    faulted
}
