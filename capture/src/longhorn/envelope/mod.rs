//! The sealed `storage_transfer` envelope of one Longhorn capture: a pure
//! function of its typed readings ([`Readings`]).
//!
//! Invariants:
//! - **Links are digests.** `streams` lists each stream envelope's digest,
//!   flow id, role and completeness; stream facts are not copied (except the
//!   control channel's socket options, named as such, that the #13703
//!   hypothesis rests on).
//! - **Its own clock and bounds**, never its first stream's.
//! - **Completeness from what it links**: a linked stream that is not
//!   `complete`, or a stream universe cut by a cap, makes the transfer
//!   `bounded` at best; a failed manager read makes it `partial`.
//! - **The manager's word is the manager's** (`longhorn_manager_reports_*`),
//!   read at window start *and* end with wall-clock times. `[]` is never an
//!   answer to "how did the rebuild end": entries exist only while the
//!   replica is WO (engine `pkg/sync/sync.go` v1.9.0 l.790–830) and on
//!   failure the manager removes the replica, records a `FailedRebuilding`
//!   Event and sets `RebuildFailed`/`failedAt` (manager
//!   `controller/engine_controller.go` v1.9.0 l.1870–1899). So the terminal
//!   unknown stays open unless `complete`/`error` was read.
//! - **Identity re-read at the end**: engine, replicas and instance managers
//!   from the end read are compared with the start read.

use std::net::{IpAddr, SocketAddr};

use pstack_envelope::facts::{StreamLink, streams as streams_facts};
use pstack_envelope::surface_id::storage_transfer::STREAMS;
use pstack_envelope::{
    Bounds, Claim, ClaimCode, ClaimKind, Clock, Envelope, EnvelopeBuilder, NextTransition, Scope,
    StatusCause, Subject, Surface, SurfaceStatus, Termination, TransferIdentity, Universe, Unknown,
    sha256_digest,
};
use serde_json::{Map, Value, json};

use super::client::{API_DEADLINE, ApiRead, MAX_API_BYTES};
use super::flows::{DataConn, FlowRole, classify, data_conn_ends, group_data_connections};
use super::hubble::{HUBBLE_DEADLINE, HubbleRead, hubble_facts};
use super::kube::{EVENTS_DEADLINE, EventsRead, kubectl_events};
use super::model::{ModelError, RebuildEntry, Volume, parse_error_addrs, parse_volume};
use super::topology::{NodeSeen, Topology, check_flags, node_roles, resolve};
use crate::request::LonghornRequest;
use crate::transport::{self, CaptureResult, Plan, TransportError};

/// A flow captured but outside the replicas' port blocks.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Excluded {
    /// Flow id.
    pub flow_id: String,
    /// Local end.
    pub src: String,
    /// Remote end.
    pub dst: String,
}

/// Everything the transfer envelope is built from.
#[derive(Debug, Clone)]
pub struct Readings {
    /// Linked stream envelopes (exclusions already removed).
    pub streams: CaptureResult,
    /// Flows excluded as another volume's.
    pub excluded: Vec<Excluded>,
    /// Manager read at window start.
    pub start: Option<ApiRead>,
    /// Manager read at window end.
    pub end: Option<ApiRead>,
    /// Instance-manager reads (name, read).
    pub ims: Vec<(String, ApiRead)>,
    /// The topology (resolved from the start read and the IM reads).
    pub topology: Option<Topology>,
    /// Whether flows are matched to parties by pod IP (false: ports only).
    pub by_ip: bool,
    /// Hubble.
    pub hubble: Option<HubbleRead>,
    /// Kubernetes Events of the volume, the engine and the target replica, read when
    /// the rebuild's entry was gone at the end and a Kubernetes API is
    /// configured (None: not read).
    pub events: Option<Vec<EventsRead>>,
    /// The rebuild's Engine Events its watcher saw (pstackd's Events watch).
    pub signals: Vec<super::kube::Event>,
    /// The watcher's verdict on the rebuild's end (None: no watcher verdict).
    pub verdict: Option<super::Verdict>,
    /// `GET /v1/settings` at window start (None: not read).
    pub settings: Option<ApiRead>,
    /// The network the flows were selected on (None: no topology).
    pub selected_on: Option<super::topology::SelectedOn>,
    /// The capture's own clock.
    pub clock: Clock,
}

/// A stream's endpoints.
pub fn endpoints(e: &Envelope) -> Option<(SocketAddr, SocketAddr)> {
    match &e.subject {
        Subject::NetworkStream(s) => Some((s.src.parse().ok()?, s.dst.parse().ok()?)),
        _ => None,
    }
}

/// Why a read is not a usable document: status, errno, message.
type Unread = (SurfaceStatus, Option<i32>, String);

/// The target replica whose `rebuildStatus` entry was read at window start
/// and is gone from a good end read (`[]` after the rebuild was seen).
pub fn entry_gone(
    topo: Option<&Topology>,
    start: Option<&ApiRead>,
    end: Option<&ApiRead>,
) -> Option<String> {
    let t = topo?.target.as_ref()?.name.clone();
    let has = |r: Option<&ApiRead>| -> Option<bool> {
        let (v, _) = volume_of(r?).ok()?;
        Some(v.rebuild.iter().any(|e| e.replica == t))
    };
    (has(start)? && !has(end)?).then_some(t)
}

/// A read manager document, or why not (v2 volumes are `unsupported`).
fn volume_of(r: &ApiRead) -> Result<(Volume, &[u8]), Unread> {
    let body = r
        .result
        .as_ref()
        .map_err(|f| (f.status, f.errno, f.message.clone()))?;
    let v = parse_volume(body)
        .map_err(|e: ModelError| (SurfaceStatus::Error, None, format!("GET {}: {e}", r.url)))?;
    if v.data_engine == "v2" || v.replicas.iter().any(|r| r.data_engine == "v2") {
        return Err((
            SurfaceStatus::Unsupported,
            None,
            format!(
                "volume {} uses the v2 data engine (SPDK NVMe-oF/TCP between spdk_tgt processes, ports 20001-30000): its rebuild is not the v1 sync-agent model this capture reads",
                v.name
            ),
        ));
    }
    Ok((v, body.as_slice()))
}

fn failed(
    id: &str,
    authority: String,
    r: &ApiRead,
    e: (SurfaceStatus, Option<i32>, String),
) -> Surface {
    let mut facts = Map::new();
    facts.insert("read_at".into(), json!(r.at));
    let cause = StatusCause {
        errno: e.1,
        message: e.2,
    };
    let deadline_ms = API_DEADLINE.as_millis() as u64;
    Surface::unread(id, authority, deadline_ms, r.elapsed_us, e.0, cause).with_facts(facts)
}

fn volume_facts(v: &Volume, r: &ApiRead, stripped_v1: bool) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert("read_at".into(), json!(r.at));
    m.insert("url".into(), json!(r.url));
    if stripped_v1 {
        m.insert(
            "base_url_note".into(),
            json!("the base URL ended in /v1; it was not doubled"),
        );
    }
    m.insert("shape".into(), json!(v.shape));
    m.insert("state".into(), json!(v.state));
    m.insert("robustness".into(), json!(v.robustness));
    m.insert("data_engine".into(), json!(v.data_engine));
    m.insert(
        "rebuild_status".into(),
        Value::Array(
            v.rebuild
                .iter()
                .map(|e| {
                    json!({
                        "replica": e.replica,
                        "from_replicas": e.from,
                        "from_field": e.from_field,
                        "state": e.state.as_str(),
                        "progress": e.progress,
                        "is_rebuilding": e.is_rebuilding,
                        "error": e.error,
                    })
                })
                .collect(),
        ),
    );
    m.insert(
        "replicas".into(),
        Value::Array(
            v.replicas
                .iter()
                .map(|r| {
                    json!({"name": r.name, "host_id": r.host_id, "address": r.address,
                           "instance_manager": r.instance_manager, "mode": r.mode,
                           "failed_at": r.failed_at, "data_engine": r.data_engine})
                })
                .collect(),
        ),
    );
    m.insert(
        "controllers".into(),
        Value::Array(
            v.controllers
                .iter()
                .map(|c| json!({"name": c.name, "host_id": c.host_id, "address": c.address, "instance_manager": c.instance_manager}))
                .collect(),
        ),
    );
    m
}

struct Out {
    surfaces: Vec<Surface>,
    claims: Vec<Claim>,
    unknowns: Vec<Unknown>,
}

impl Out {
    fn claim(
        &mut self,
        kind: ClaimKind,
        code: ClaimCode,
        statement: String,
        surfaces: &[&str],
        falsifier: Option<String>,
    ) {
        let id = format!("c{}", self.claims.len() + 1);
        self.claims.push(Claim {
            id,
            kind,
            code: code.into(),
            statement,
            surfaces: surfaces.iter().map(|s| s.to_string()).collect(),
            scope: Scope::Existential,
            falsifier,
        });
    }
    fn unknown(&mut self, question: String, blocks: &str, probe: String, surface: Option<&str>) {
        let id = format!("u{}", self.unknowns.len() + 1);
        self.unknowns.push(Unknown {
            id,
            question,
            blocks: blocks.into(),
            owner: "cluster operator".into(),
            probe,
            surface: surface.map(str::to_string),
        });
    }
    fn ok(&self, id: &str) -> bool {
        self.surfaces
            .iter()
            .any(|s| s.id == id && s.status == SurfaceStatus::Ok)
    }
}

/// Build the sealed `storage_transfer` envelope.
pub fn transfer_envelope(
    a: &LonghornRequest,
    plan: &Plan,
    r: &Readings,
) -> Result<Envelope, TransportError> {
    let streams = &r.streams;
    let linked: Vec<&Envelope> = streams
        .flows
        .iter()
        .chain(streams.no_match.iter())
        .collect();
    let stripped_v1 = a
        .longhorn_api
        .as_deref()
        .and_then(|u| super::client::parse_base_url(u).ok())
        .is_some_and(|b| b.stripped_v1);
    let mut o = Out {
        surfaces: Vec::new(),
        claims: Vec::new(),
        unknowns: Vec::new(),
    };
    let topo = r.topology.as_ref();
    let cx = Cx { a, plan, r, topo };
    let target_name = topo.and_then(|t| t.target.as_ref()).map(|p| p.name.clone());
    let volumes = manager_reads(r, stripped_v1, &mut o);
    let roles = flow_roles(r, topo);
    let (capped, short_roles) = streams_surface(cx, &roles, &linked, &mut o);
    let faulted = streams_claims(cx, &roles, &short_roles, &mut o);
    let read = StreamsRead { capped, faulted };
    let role_str = topology_section(cx, &volumes, &target_name, &mut o);
    let (terminal, seen_start) = manager_reports(cx, &volumes, &roles, &target_name, &mut o);
    settings_section(r, &mut o);
    engine_events(cx, &roles, &mut o);
    let verdict_closes = verdict_section(cx, &mut o);
    terminal_unknown(
        cx,
        &volumes,
        &target_name,
        seen_start,
        terminal,
        verdict_closes,
        &mut o,
    );
    control_channel(&roles, topo, &mut o);
    hubble_section(cx, &mut o);
    seal(cx, &linked, &read, &role_str, &target_name, o)
}

/// Manager reads, start and end.
fn manager_reads(r: &Readings, stripped_v1: bool, o: &mut Out) -> [Option<Volume>; 2] {
    let mut volumes: [Option<Volume>; 2] = [None, None];
    for (i, (id, read)) in [
        ("longhorn/manager/start", &r.start),
        ("longhorn/manager/end", &r.end),
    ]
    .into_iter()
    .enumerate()
    {
        let Some(read) = read else { continue };
        let auth = format!("http:GET {}", read.url);
        match volume_of(read) {
            Ok((v, body)) => {
                o.surfaces.push(Surface::read(
                    id,
                    auth,
                    API_DEADLINE.as_millis() as u64,
                    read.elapsed_us,
                    Some((sha256_digest(body), body.len() as u64)),
                    volume_facts(&v, read, stripped_v1),
                ));
                volumes[i] = Some(v);
            }
            Err(e) => o.surfaces.push(failed(id, auth, read, e)),
        }
    }
    for (im, read) in &r.ims {
        let id = format!("longhorn/instancemanager/{im}");
        let auth = format!("http:GET {}", read.url);
        match read
            .result
            .as_ref()
            .map_err(|f| (f.status, f.errno, f.message.clone()))
            .and_then(|b| {
                super::model::parse_instance_manager(b)
                    .map(|blocks| (blocks, b))
                    .map_err(|e| (SurfaceStatus::Error, None, e.to_string()))
            }) {
            Ok((blocks, body)) => {
                let mut facts = Map::new();
                facts.insert("read_at".into(), json!(read.at));
                facts.insert("port_blocks".into(), json!(blocks));
                o.surfaces.push(Surface {
                    id,
                    authority: auth,
                    status: SurfaceStatus::Ok,
                    cause: None,
                    deadline_ms: API_DEADLINE.as_millis() as u64,
                    elapsed_us: read.elapsed_us,
                    digest: Some(sha256_digest(body)),
                    bytes: body.len() as u64,
                    truncated: false,
                    facts,
                });
            }
            Err(e) => o.surfaces.push(failed(&id, auth, read, e)),
        }
    }
    volumes
}

/// Flows: roles.
fn flow_roles<'a>(r: &'a Readings, topo: Option<&Topology>) -> Vec<(&'a Envelope, FlowRole)> {
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
fn streams_surface<'a>(
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
        super::flows::classify_source(t, x, y, r.by_ip).1
    };
    let links: Vec<Value> = linked
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
            let link = StreamLink {
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
            };
            serde_json::to_value(link).unwrap_or(Value::Null)
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
    sfacts.insert(streams_facts::LINKS.into(), Value::Array(links));
    sfacts.insert("stream_count".into(), json!(streams.flows.len()));
    sfacts.insert(
        streams_facts::NET_NS.into(),
        json!(streams.net_ns.to_string()),
    );
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
fn streams_claims(
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

/// Topology, role, identity.
fn topology_section(
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
            let same = |x: &Option<super::topology::Party>, y: &Option<super::topology::Party>| {
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
        let part = |p: &Option<super::topology::Party>| {
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

/// What the manager reports, and what it no longer reports.
fn manager_reports(
    cx: Cx,
    volumes: &[Option<Volume>; 2],
    roles: &[(&Envelope, FlowRole)],
    target_name: &Option<String>,
    o: &mut Out,
) -> (bool, Option<RebuildEntry>) {
    let Cx { a, r, .. } = cx;
    let streams = &r.streams;
    let role_of = |digest: &str| role_in(roles, digest);
    let mut terminal = false;
    let seen_start = volumes[0].as_ref().and_then(|v| {
        let t = target_name.as_deref()?;
        v.rebuild.iter().find(|e| e.replica == t).cloned()
    });
    for (i, sid) in ["longhorn/manager/start", "longhorn/manager/end"]
        .iter()
        .enumerate()
    {
        let Some(v) = &volumes[i] else { continue };
        let at = [&r.start, &r.end][i]
            .as_ref()
            .map(|x| x.at.clone())
            .unwrap_or_default();
        let when = if i == 0 { "window start" } else { "window end" };
        let entries: Vec<String> = v
            .rebuild
            .iter()
            .map(|e| {
                format!(
                    "{} from {} state {:?} progress {} (isRebuilding {:?}){}",
                    e.replica,
                    if e.from.is_empty() {
                        "?".into()
                    } else {
                        e.from.join("+")
                    },
                    e.state.as_str(),
                    e.progress
                        .map(|p| p.to_string())
                        .unwrap_or_else(|| "?".into()),
                    e.is_rebuilding,
                    if e.error.is_empty() {
                        String::new()
                    } else {
                        format!(", error {:?}", e.error)
                    }
                )
            })
            .collect();
        o.claim(
            ClaimKind::Fact,
            ClaimCode::LonghornManagerReportsRebuild,
            format!(
                "at {when} ({at}) the Longhorn manager reports for volume {} (state {}, robustness {}): {}",
                a.volume,
                v.state,
                v.robustness,
                if entries.is_empty() { "rebuildStatus [] (no replica is in WO mode now)".to_string() } else { entries.join("; ") }
            ),
            &[sid],
            None,
        );
        for e in &v.rebuild {
            if e.state.terminal() {
                terminal = true;
            }
            if e.error.is_empty() {
                continue;
            }
            let addrs = parse_error_addrs(&e.error);
            for (x, y) in &addrs.pairs {
                let hit = streams.flows.iter().find(|s| {
                    endpoints(s)
                        .is_some_and(|(l, rm)| (l == *x && rm == *y) || (l == *y && rm == *x))
                });
                let cause = addrs.cause.clone().unwrap_or_else(|| "an error".into());
                match hit {
                    Some(s) => {
                        let flow = match &s.subject {
                            Subject::NetworkStream(n) => n.flow_id.clone(),
                            _ => String::new(),
                        };
                        o.claim(
                            ClaimKind::Fact,
                            ClaimCode::LonghornErrorNamesStream,
                            format!(
                                "Longhorn reports {cause} on {x}→{y} (replica {}, {when}); this is flow {flow}, role {}, stream envelope {}",
                                e.replica,
                                role_of(&s.digest).map(FlowRole::as_str).unwrap_or("?"),
                                s.digest
                            ),
                            &[sid, STREAMS],
                            None,
                        );
                    }
                    None => o.claim(
                        ClaimKind::Fact,
                        ClaimCode::LonghornErrorNamesUnlinkedConnection,
                        format!(
                            "Longhorn reports {cause} on {x}→{y} (replica {}, {when}); no stream linked here has that address pair (it closed before the window, or is captured on the other node)",
                            e.replica
                        ),
                        &[sid, STREAMS],
                        None,
                    ),
                }
            }
        }
    }
    (terminal, seen_start)
}

/// The Longhorn settings that bound each failure.
fn settings_section(r: &Readings, o: &mut Out) {
    if let Some(read) = &r.settings {
        let parsed = read
            .result
            .as_ref()
            .map_err(|f| (f.status, f.errno, f.message.clone()))
            .and_then(|b| {
                super::model::parse_settings(b)
                    .map(|m| (m, b))
                    .map_err(|e| (SurfaceStatus::Error, None, format!("GET {}: {e}", read.url)))
            });
        match parsed {
            Ok((all, body)) => {
                let mut facts = Map::new();
                facts.insert("read_at".into(), json!(read.at));
                let mut said = Vec::new();
                for name in super::model::BOUNDING_SETTINGS {
                    let v = all.get(name);
                    facts.insert(name.into(), json!(v));
                    said.push(match v {
                        Some(v) => format!("{name} {v:?}"),
                        None => format!("{name} not set on this manager"),
                    });
                }
                o.surfaces.push(Surface::read(
                    "longhorn/settings",
                    format!("longhorn-manager:GET {}", read.url),
                    API_DEADLINE.as_millis() as u64,
                    read.elapsed_us,
                    Some((sha256_digest(body), body.len() as u64)),
                    facts,
                ));
                o.claim(
                    ClaimKind::Fact,
                    ClaimCode::LonghornSettingsBoundFailures,
                    format!(
                        "the settings that bound a rebuild's failure: {} (engine-replica-timeout: seconds before the engine marks a replica ERR; replica-file-sync-http-client-timeout: seconds of the sync agents' HTTP transfer; long-grpc-timeout: seconds of FilesSync; replica-rebuild-concurrent-sync-limit: sources per rebuild from v1.11; storage-network: \"\" is the pod network)",
                        said.join(", ")
                    ),
                    &["longhorn/settings"],
                    None,
                );
            }
            Err(e) => o.surfaces.push(failed(
                "longhorn/settings",
                format!("longhorn-manager:GET {}", read.url),
                read,
                e,
            )),
        }
    }
}

/// The rebuild's Engine Events seen by the watcher, and its verdict.
/// Formats: longhorn-manager v1.9.0 `controller/engine_controller.go`
/// l.1860 (Rebuilding), l.1874 (FailedRebuilding), l.1916 (Rebuilt),
/// l.1793/1827 (snapshot purge), l.855 (Faulted).
fn engine_events(cx: Cx, roles: &[(&Envelope, FlowRole)], o: &mut Out) {
    let Cx { r, .. } = cx;
    let streams = &r.streams;
    let role_of = |digest: &str| role_in(roles, digest);
    if !r.signals.is_empty() {
        let mut facts = Map::new();
        facts.insert("events".into(), json!(r.signals));
        facts.insert("source".into(), json!("pstackd's Engine Events watch"));
        o.surfaces.push(Surface {
            id: "kubernetes/events/watch".into(),
            authority: format!(
                "k8s:WATCH /api/v1/namespaces/{}/events?fieldSelector=involvedObject.kind=Engine",
                super::kube::NAMESPACE
            ),
            status: SurfaceStatus::Ok,
            cause: None,
            deadline_ms: super::kube::WATCH_SESSION.as_millis() as u64,
            elapsed_us: 0,
            digest: None,
            bytes: 0,
            truncated: false,
            facts,
        });
    }
    for ev in &r.signals {
        let addrs = parse_error_addrs(&ev.message);
        o.claim(
            ClaimKind::Fact,
            ClaimCode::LonghornEngineEvent,
            format!(
                "Kubernetes Event {} ({}) on {} {} at {}: {:?}",
                ev.reason, ev.event_type, ev.kind, ev.name, ev.last, ev.message
            ),
            &["kubernetes/events/watch"],
            None,
        );
        let failure = matches!(
            ev.reason.as_str(),
            "FailedRebuilding" | "TimeoutSnapshotPurge" | "FailedStartingSnapshotPurge" | "Faulted"
        );
        if !failure {
            continue;
        }
        // The address pairs and endpoints it names, linked to flows.
        let cause = addrs.cause.clone().unwrap_or_else(|| "an error".into());
        let mut named: Vec<(Option<SocketAddr>, SocketAddr)> =
            addrs.pairs.iter().map(|(a, b)| (Some(*a), *b)).collect();
        named.extend(addrs.endpoints.iter().map(|b| (None, *b)));
        for (x, y) in named {
            let hits: Vec<&Envelope> = streams
                .flows
                .iter()
                .filter(|s| {
                    endpoints(s).is_some_and(|(l, rm)| match x {
                        Some(x) => (l == x && rm == y) || (l == y && rm == x),
                        None => rm == y,
                    })
                })
                .collect();
            let what = match x {
                Some(x) => format!("{x}→{y}"),
                None => format!("a connection to {y}"),
            };
            // Flows that lived inside the window between the two sock_diag
            // samples (a dial that timed out on a dropped SYN is one).
            let transient: Vec<&crate::transport::TransientFlow> = streams
                .short_lived
                .iter()
                .flatten()
                .filter(|f| match x {
                    Some(x) => (f.local == x && f.remote == y) || (f.local == y && f.remote == x),
                    None => f.remote == y,
                })
                .collect();
            for f in &transient {
                o.claim(
                    ClaimKind::Fact,
                    ClaimCode::LonghornErrorNamesShortLivedFlow,
                    format!(
                        "the {} Event names {cause} on {what}; this is the short-lived flow {}→{} seen by eBPF inside the window (states {}; {} retransmit(s), {} RST sent, {} RST received{})",
                        ev.reason,
                        f.local,
                        f.remote,
                        if f.transitions.is_empty() { "?".to_string() } else { f.transitions.join(" ") },
                        f.retransmits,
                        f.resets_sent,
                        f.resets_received,
                        if !f.transitions.is_empty() && !f.transitions.iter().any(|t| t.contains(">ESTABLISHED")) {
                            "; it never reached ESTABLISHED"
                        } else {
                            ""
                        }
                    ),
                    &["kubernetes/events/watch", STREAMS],
                    None,
                );
            }
            if hits.is_empty() {
                if x.is_some() && transient.is_empty() {
                    o.claim(
                        ClaimKind::Fact,
                        ClaimCode::LonghornErrorNamesUnlinkedConnection,
                        format!(
                            "the {} Event names {cause} on {what}; no stream linked here has that address pair (it closed before the window, or is captured on the other node)",
                            ev.reason
                        ),
                        &["kubernetes/events/watch", STREAMS],
                        None,
                    );
                }
                continue;
            }
            for s in hits {
                let (flow, state) = match &s.subject {
                    Subject::NetworkStream(n) => (
                        n.flow_id.clone(),
                        s.surfaces
                            .iter()
                            .find(|x| x.id == "tcp/end")
                            .and_then(|x| x.facts.get("state"))
                            .and_then(Value::as_str)
                            .unwrap_or("?")
                            .to_string(),
                    ),
                    _ => (String::new(), String::new()),
                };
                o.claim(
                    ClaimKind::Fact,
                    ClaimCode::LonghornErrorNamesStream,
                    format!(
                        "the {} Event names {cause} on {what}; this is flow {flow} (last state {state}), role {}, stream envelope {}",
                        ev.reason,
                        role_of(&s.digest).map(FlowRole::as_str).unwrap_or("?"),
                        s.digest
                    ),
                    &["kubernetes/events/watch", STREAMS],
                    None,
                );
            }
        }
    }
}

/// The watcher's verdict on the rebuild; whether it closes the terminal question.
fn verdict_section(cx: Cx, o: &mut Out) -> bool {
    let Cx { r, topo, .. } = cx;
    let verdict_closes = r
        .verdict
        .as_ref()
        .is_some_and(|v| v.outcome != "unresolved" && !v.outcome.is_empty());
    if let Some(v) = &r.verdict {
        let (code, statement) = if v.outcome.starts_with("failed") {
            (
                ClaimCode::LonghornRebuildFailed,
                format!(
                    "the rebuild failed ({}) at step {}{}: {:?}",
                    v.basis,
                    v.step,
                    if v.before_file_sync {
                        ", before file sync (no rebuildStatus entry was in_progress)"
                    } else {
                        ""
                    },
                    v.error
                ),
            )
        } else if v.outcome == "complete" {
            (
                ClaimCode::LonghornRebuildComplete,
                format!("the rebuild completed ({})", v.basis),
            )
        } else if v.outcome == "removed" {
            (
                ClaimCode::LonghornRebuildRemoved,
                format!(
                    "the rebuild ended without a FailedRebuilding Event because the replica or volume was removed on purpose ({}): not a failure",
                    v.basis
                ),
            )
        } else {
            (
                ClaimCode::LonghornRebuildUnresolved,
                format!("the rebuild's outcome is not known: {}", v.basis),
            )
        };
        let mut on: Vec<&str> = vec!["longhorn/manager/end"];
        if !r.signals.is_empty() {
            on.push("kubernetes/events/watch");
        }
        on.retain(|s| o.ok(s) || o.surfaces.iter().any(|x| x.id == *s));
        o.claim(ClaimKind::Fact, code, statement, &on, None);
        // Per source (v1.11+): the texts that name it — by its replica
        // address `tcp://IP:P` or its sync agent `IP:P+2` (the 4-tuple's
        // server end).
        let names = |text: &str, p: &super::topology::Party| {
            let (Some(ip), Some(b)) = (p.data_ip(), p.block) else {
                return false;
            };
            let ip = match ip {
                IpAddr::V6(_) => format!("[{ip}]"),
                IpAddr::V4(_) => ip.to_string(),
            };
            text.contains(&format!("tcp://{ip}:{} ", b.start))
                || text.contains(&format!("->{ip}:{}:", b.start.saturating_add(2)))
                || text.contains(&format!("->{ip}:{} ", b.start.saturating_add(2)))
        };
        let per_source: Vec<String> = topo
            .map(|t| {
                t.sources()
                    .map(|p| {
                        let resets = v.retry_errors.iter().filter(|e| names(e, p)).count();
                        let failed = !v.error.is_empty() && names(&v.error, p);
                        format!(
                            "{} {}{}",
                            p.name,
                            if failed {
                                "named by the failure"
                            } else {
                                "not named by a failure"
                            },
                            if resets > 0 {
                                format!(", {resets} retried reset(s)")
                            } else {
                                String::new()
                            }
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        if v.retries > 0 {
            o.claim(
                ClaimKind::Fact,
                ClaimCode::LonghornRebuildRetries,
                format!(
                    "the rebuild survived {} reset(s): each was followed by the file's next attempt (the entry stayed in_progress; from v1.11 each file is retried up to 3 times), so none is the rebuild's end, which is judged by its final state ({}); per source: {}; texts: {:?}",
                    v.retries,
                    v.outcome,
                    if per_source.is_empty() { "no source known".to_string() } else { per_source.join("; ") },
                    v.retry_errors
                ),
                &on,
                None,
            );
        } else if per_source.len() > 1 {
            o.claim(
                ClaimKind::Fact,
                ClaimCode::LonghornRebuildSources,
                format!(
                    "the rebuild had {} sources (fromReplicaList): {}",
                    per_source.len(),
                    per_source.join("; ")
                ),
                &on,
                None,
            );
        }
    }
    verdict_closes
}

/// `[]` (or no entry for the target) after the target's rebuild was seen.
fn terminal_unknown(
    cx: Cx,
    volumes: &[Option<Volume>; 2],
    target_name: &Option<String>,
    seen_start: Option<RebuildEntry>,
    terminal: bool,
    verdict_closes: bool,
    o: &mut Out,
) {
    let Cx { a, r, .. } = cx;
    let replica_probe = |r: &str| {
        format!(
            "kubectl -n longhorn-system get replicas.longhorn.io {r} -o jsonpath='{{.status.conditions[?(@.type==\"RebuildFailed\")]}} {{.spec.failedAt}}'; kubectl -n longhorn-system get events --field-selector involvedObject.kind=Engine,involvedObject.name={e},reason=FailedRebuilding",
            e = a.engine
        )
    };
    let kubectl = format!(
        "kubectl -n longhorn-system get volumes.longhorn.io {v} -o jsonpath='{{.status.state}} {{.status.robustness}}'; kubectl -n longhorn-system get engines.longhorn.io {e} -o jsonpath='{{.status.rebuildStatus}}'; kubectl -n longhorn-system get events --field-selector involvedObject.kind=Engine,involvedObject.name={e},reason=FailedRebuilding",
        v = a.volume,
        e = a.engine
    );
    let gone = seen_start.is_some()
        && volumes[1].as_ref().is_some_and(|v| {
            !v.rebuild
                .iter()
                .any(|e| Some(&e.replica) == target_name.as_ref())
        });
    if gone {
        let t = target_name.clone().unwrap_or_default();
        let failed_at = volumes[1]
            .as_ref()
            .and_then(|v| v.replicas.iter().find(|r| r.name == t))
            .map(|r| (r.mode.clone(), r.failed_at.clone()));
        o.claim(
            ClaimKind::Fact,
            ClaimCode::LonghornRebuildEntryGone,
            format!(
                "the rebuild of replica {t} reported at window start is gone from rebuildStatus at window end{}: the entry exists only while the replica is WO, so this is not an outcome",
                match &failed_at {
                    Some((m, f)) if !f.is_empty() => format!(" (the replica is now mode {m:?}, failedAt {f})"),
                    Some((m, _)) => format!(" (the replica is now mode {m:?}, no failedAt)"),
                    None => " (the replica is no longer listed)".into(),
                }
            ),
            &["longhorn/manager/start", "longhorn/manager/end"],
            None,
        );
        // The Events, read through the Kubernetes API, or the command to read them.
        let mut events_read = false;
        for read in r.events.iter().flatten() {
            let id = format!("kubernetes/events/{}", read.object);
            let auth = format!("k8s:GET {}", read.url);
            match &read.result {
                Ok((events, body)) => {
                    events_read = true;
                    let failed_rebuilding: Vec<_> = events
                        .iter()
                        .filter(|e| e.reason == "FailedRebuilding")
                        .collect();
                    let mut facts = Map::new();
                    facts.insert("read_at".into(), json!(read.at));
                    facts.insert("object".into(), json!(read.object));
                    facts.insert("events".into(), json!(events));
                    o.surfaces.push(Surface::read(
                        id.clone(),
                        auth,
                        EVENTS_DEADLINE.as_millis() as u64,
                        read.elapsed_us,
                        Some((sha256_digest(body), body.len() as u64)),
                        facts,
                    ));
                    for e in &failed_rebuilding {
                        let pairs: Vec<String> = parse_error_addrs(&e.message)
                            .pairs
                            .iter()
                            .map(|(x, y)| format!("{x}→{y}"))
                            .collect();
                        o.claim(
                            ClaimKind::Fact,
                            ClaimCode::LonghornFailedRebuildingEvent,
                            format!(
                                "Kubernetes Event FailedRebuilding ({}) on {} {} at {} (count {}, from {}): {:?}{}",
                                e.event_type,
                                e.kind,
                                e.name,
                                e.last,
                                e.count,
                                e.component,
                                e.message,
                                if pairs.is_empty() {
                                    String::new()
                                } else {
                                    format!("; it names {}", pairs.join(", "))
                                }
                            ),
                            &[id.as_str(), "longhorn/manager/end"],
                            None,
                        );
                    }
                    if failed_rebuilding.is_empty() {
                        o.claim(
                            ClaimKind::Fact,
                            ClaimCode::KubernetesEventsWithoutFailedRebuilding,
                            format!(
                                "the Kubernetes API lists {} Event(s) for {} in {} at {} and none is FailedRebuilding (Events expire, by default after an hour)",
                                events.len(),
                                read.object,
                                super::kube::NAMESPACE,
                                read.at
                            ),
                            &[id.as_str()],
                            None,
                        );
                    }
                }
                Err(f) => o.surfaces.push(Surface {
                    id,
                    authority: auth,
                    status: f.status,
                    cause: Some(StatusCause {
                        errno: f.errno,
                        message: f.message.clone(),
                    }),
                    deadline_ms: EVENTS_DEADLINE.as_millis() as u64,
                    elapsed_us: read.elapsed_us,
                    digest: None,
                    bytes: 0,
                    truncated: false,
                    facts: {
                        let mut m = Map::new();
                        m.insert("read_at".into(), json!(read.at));
                        m.insert("object".into(), json!(read.object));
                        m
                    },
                }),
            }
        }
        let all_events_read = events_read && r.events.iter().flatten().all(|x| x.result.is_ok());
        let probe = if all_events_read {
            replica_probe(&t)
        } else {
            format!(
                "{}; {}; {}; {}",
                replica_probe(&t),
                kubectl_events(&a.volume),
                kubectl_events(&a.engine),
                kubectl_events(&t)
            )
        };
        if !verdict_closes {
            o.unknown(
            format!(
                "did the rebuild of replica {t} complete or fail, and with what error? (its rebuildStatus entry is gone)"
            ),
            "CLASSIFY_TRANSFER_TERMINAL",
            probe,
            Some("longhorn/manager/end"),
        );
        }
    } else if !terminal && !verdict_closes {
        let surface = ["longhorn/manager/end", "longhorn/manager/start"]
            .into_iter()
            .find(|s| o.surfaces.iter().any(|x| x.id == *s));
        o.unknown(
            format!(
                "what rebuild terminal state does Longhorn report for engine {}?",
                a.engine
            ),
            "CLASSIFY_TRANSFER_TERMINAL",
            match &target_name {
                Some(t) => format!("{kubectl}; {}", replica_probe(t)),
                None => kubectl.clone(),
            },
            surface,
        );
    }
}

/// #13703: an idle gRPC channel's keepalive against its user timeout,
/// judged on the side that aborts: grpc-go sets TCP_USER_TIMEOUT (20 s)
/// only on the server's accepted socket (`internal/transport/http2_server.go`);
/// Longhorn's replica client sets none. So for sync_control (T→S:P_S+2,
/// `FileSend`) it is S's sync agent's socket, and for files_sync
/// (E→T:P_T+2, `FilesSync`, idle for the whole rebuild) T's.
fn control_channel(roles: &[(&Envelope, FlowRole)], topo: Option<&Topology>, o: &mut Out) {
    let mut ctl_opts = Vec::new();
    for (e, role) in roles {
        if *role != FlowRole::SyncControl && *role != FlowRole::FilesSync {
            continue;
        }
        let Some(so) = e
            .surfaces
            .iter()
            .find(|s| s.id == "tcp/sockopt" && s.status == SurfaceStatus::Ok)
        else {
            continue;
        };
        let g = |k: &str| so.facts.get(k).and_then(Value::as_i64).unwrap_or(0);
        let server = if *role == FlowRole::SyncControl {
            topo.and_then(|t| t.source.as_ref())
        } else {
            topo.and_then(|t| t.target.as_ref())
        }
        .and_then(|p| p.block)
        .map(|b| b.start.saturating_add(2));
        let local_port = endpoints(e).map(|(l, _)| l.port());
        let o_ = ChannelSockopts {
            keepalive: so
                .facts
                .get("keepalive")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            user_timeout_ms: g("user_timeout_ms"),
            keepidle_s: g("keepidle_s"),
            keepintvl_s: g("keepintvl_s"),
            server_side: server.is_some() && server == local_port,
        };
        ctl_opts.push((e, *role, o_, idle_hazard(&o_)));
    }
    if !ctl_opts.is_empty() {
        let mut f = Map::new();
        f.insert(
            "idle_channel_sockopts".into(),
            Value::Array(
                ctl_opts
                    .iter()
                    .map(|(e, role, s, h)| json!({"digest": e.digest, "role": role.as_str(), "server_side": s.server_side, "keepalive": s.keepalive, "user_timeout_ms": s.user_timeout_ms, "keepidle_s": s.keepidle_s, "keepintvl_s": s.keepintvl_s, "hazard": h.as_str()}))
                    .collect(),
            ),
        );
        o.surfaces.push(Surface {
            id: "longhorn/control_channel".into(),
            authority:
                "pstack: tcp/sockopt of the linked sync_control and files_sync stream envelopes"
                    .into(),
            status: SurfaceStatus::Ok,
            cause: None,
            deadline_ms: transport::SURFACE_DEADLINE_MS,
            elapsed_us: 0,
            digest: None,
            bytes: 0,
            truncated: false,
            facts: f,
        });
    }
    for (e, role, s, h) in &ctl_opts {
        let (ut, idle, intvl) = (s.user_timeout_ms, s.keepidle_s, s.keepintvl_s);
        let (server, channel) = if *role == FlowRole::SyncControl {
            ("the source's sync agent (S:P_S+2)", "FileSend")
        } else {
            ("the target's sync agent (T:P_T+2)", "FilesSync")
        };
        match h {
            IdleHazard::Hazardous => o.claim(
                ClaimKind::Hypothesis,
                ClaimCode::ControlChannelUserTimeoutBelowKeepaliveRetry,
                format!(
                    "the idle {channel} channel's server side here, {server} (stream {}, role {}), sends its first keepalive probe after {idle} s idle and the next {intvl} s later, but TCP_USER_TIMEOUT is {ut} ms: one unanswered probe (a single lost ACK) outlives the user timeout and this side's kernel aborts the channel (ETIMEDOUT) and resets it; the gRPC client at the other end reads `connection reset by peer` and the rebuild fails — the #13703 pattern (grpc-go sets 20 s TCP_USER_TIMEOUT on accepted connections, Go's listener keepalive is 15 s; longhorn-engine app/cmd/sync_agent.go v1.9.0 uses a plain net.Listen)",
                    e.digest,
                    role.as_str()
                ),
                &["longhorn/control_channel"],
                Some(format!(
                    "the channel survives an unanswered keepalive probe for longer than {ut} ms (drop the peer's ACKs for {} s: it stays ESTABLISHED), or the reset that ended it was received from the peer (eBPF tcp_receive_reset) rather than raised by this side's timer",
                    idle + intvl
                )),
            ),
            IdleHazard::PostFixOsKeepalive => o.claim(
                ClaimKind::Fact,
                ClaimCode::ControlChannelKeepaliveNotHazardous,
                format!(
                    "the idle {channel} channel's server side here (stream {}) keeps the OS keepalive ({idle} s idle, {intvl} s interval) with TCP_USER_TIMEOUT {ut} ms: the first probe comes only after {idle} s idle, so the #13703 abort needs an unanswered probe after that long — the settings of upstream's fix (longhorn-engine master \"preserve OS TCP keepalive settings\"), not the 15 s/20 s hazard",
                    e.digest
                ),
                &["longhorn/control_channel"],
                None,
            ),
            IdleHazard::ClientSide => o.claim(
                ClaimKind::Fact,
                ClaimCode::ControlChannelClientSide,
                format!(
                    "stream {} is the gRPC client's end of the idle {channel} channel (keepalive {}, TCP_USER_TIMEOUT {ut} ms): grpc-go sets its user timeout only on the server's accepted socket, so a #13703 abort would be raised by {server}, not here — capture on that node to read its socket options",
                    e.digest, s.keepalive
                ),
                &["longhorn/control_channel"],
                None,
            ),
            IdleHazard::NoUserTimeout | IdleHazard::NoKeepalive | IdleHazard::Safe => {}
        }
    }
}

/// Hubble.
fn hubble_section(cx: Cx, o: &mut Out) {
    let Cx { plan, r, topo, .. } = cx;
    let hubble_probe = format!(
        "hubble observe --ip {} --since 30m -o jsonpb   # all verdicts; run on the other node too",
        plan.filter.peer
    );
    let mut hubble_answered = false;
    if let Some(h) = &r.hubble {
        let auth = format!("exec:{}", h.command);
        match h.result.clone().and_then(|out| {
            hubble_facts(&out)
                .map(|f| (f, out))
                .map_err(|m| super::client::ApiFailure {
                    status: SurfaceStatus::Error,
                    errno: None,
                    message: m,
                })
        }) {
            Ok((mut facts, out)) => {
                // Each connection labelled by its role in the rebuild.
                if let (Some(t), Some(Value::Array(conns))) = (topo, facts.get_mut("connections")) {
                    for c in conns {
                        let end = |ip: &str, port: &str| -> Option<SocketAddr> {
                            let ip: IpAddr = c.get(ip)?.as_str()?.parse().ok()?;
                            let port = u16::try_from(c.get(port)?.as_u64()?).ok()?;
                            Some(SocketAddr::new(ip, port))
                        };
                        if let (Some(x), Some(y)) = (
                            end("source", "source_port"),
                            end("destination", "destination_port"),
                        ) {
                            let role = classify(t, x, y, r.by_ip);
                            c["role"] = json!(role.as_str());
                        }
                    }
                }
                let dropped = facts["dropped_flows"].as_u64().unwrap_or(0);
                let verdicts = facts["verdicts"].to_string();
                let reasons = facts["reasons"].to_string();
                o.surfaces.push(Surface::read(
                    "cilium/hubble",
                    auth,
                    HUBBLE_DEADLINE.as_millis() as u64,
                    h.elapsed_us,
                    Some((sha256_digest(&out), out.len() as u64)),
                    facts,
                ));
                if dropped > 0 {
                    o.claim(ClaimKind::Fact, ClaimCode::HubbleReportsDrops, format!("Hubble reports {dropped} DROPPED flow(s) involving {} over the window ({reasons}); all verdicts: {verdicts}", plan.filter.peer), &["cilium/hubble"], None);
                } else {
                    o.claim(ClaimKind::Fact, ClaimCode::HubbleReportsNoDrops, format!("Hubble reports no DROPPED flow involving {} over the window (verdicts: {verdicts}); this does not clear the network: a packet FORWARDED on this node may still never reach the other one — compare with the other node's capture, and Multus storage-network traffic is invisible to Cilium", plan.filter.peer), &["cilium/hubble"], None);
                }
                hubble_answered = true;
            }
            Err(f) => o.surfaces.push(Surface {
                id: "cilium/hubble".into(),
                authority: auth,
                status: f.status,
                cause: Some(StatusCause {
                    errno: f.errno,
                    message: f.message,
                }),
                deadline_ms: HUBBLE_DEADLINE.as_millis() as u64,
                elapsed_us: h.elapsed_us,
                digest: None,
                bytes: 0,
                truncated: false,
                facts: Map::new(),
            }),
        }
    }
    if !hubble_answered {
        let has = o.surfaces.iter().any(|s| s.id == "cilium/hubble");
        o.unknown(
            format!(
                "what did Cilium do with the packets between this node and {} (every verdict, per connection)?",
                plan.filter.peer
            ),
            "EXCLUDE_POLICY_DROP",
            hubble_probe,
            has.then_some("cilium/hubble"),
        );
    }
}

/// The transfer's identity, selector, next transition and bounds; seal.
fn seal(
    cx: Cx,
    linked: &[&Envelope],
    read: &StreamsRead,
    role_str: &str,
    target_name: &Option<String>,
    o: Out,
) -> Result<Envelope, TransportError> {
    let Cx { a, plan, r, topo } = cx;
    let streams = &r.streams;
    let (capped, faulted) = (read.capped, &read.faulted);
    let transfer_id = a.transfer.clone().unwrap_or_else(|| match &target_name {
        // The same on every capture point: the store joins S, T and E on it.
        Some(t) => format!("{}/{t}", a.volume),
        None => {
            let mut ids: Vec<String> = streams
                .flows
                .iter()
                .filter_map(|e| match &e.subject {
                    Subject::NetworkStream(s) => Some(s.flow_id.clone()),
                    _ => None,
                })
                .collect();
            ids.sort();
            let d =
                sha256_digest(format!("{}|{}|{}", a.volume, a.engine, ids.join(",")).as_bytes());
            format!("derived-{}", &d[7..23])
        }
    });
    let node = |flag: &str, p: Option<&super::topology::Party>| {
        if !flag.is_empty() {
            flag.to_string()
        } else {
            p.map(|p| p.node.clone())
                .filter(|n| !n.is_empty())
                .unwrap_or_else(|| "unknown".into())
        }
    };
    let selector = format!(
        "longhorn volume={} engine={} role={role_str} {}",
        a.volume,
        a.engine,
        plan.filter.selector()
    );
    let next = if faulted.is_empty() {
        NextTransition {
            action: "READ_ENGINE_TERMINAL".into(),
            success_receipt:
                "the rebuild's terminal evidence (RebuildFailed condition, failedAt, FailedRebuilding Event), bound to this transfer"
                    .into(),
            abort_conditions: vec!["the rebuild was restarted under a new replica".into()],
        }
    } else {
        NextTransition {
            action: "CAPTURE_PEER_SIDE".into(),
            success_receipt: format!(
                "a storage_transfer envelope of transfer {transfer_id} captured on the other party's node, linking the same flows"
            ),
            abort_conditions: vec!["the rebuild was restarted under a new replica".into()],
        }
    };
    let mut builder = EnvelopeBuilder::new(
        Subject::StorageTransfer(TransferIdentity {
            volume: a.volume.clone(),
            engine: a.engine.clone(),
            source_node: node(&a.source_node, topo.and_then(|t| t.source.as_ref())),
            target_node: node(&a.target_node, topo.and_then(|t| t.target.as_ref())),
            transfer_id,
        }),
        pstack_envelope::Collector {
            name: "pstackctl capture longhorn".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            source_commit: transport::SOURCE_COMMIT.into(),
            trigger: plan.trigger.clone(),
        },
        r.clock.clone(),
        Universe {
            selector: selector.clone(),
            selector_digest: sha256_digest(selector.as_bytes()),
            expected_count: linked.len() as u64,
            observed_count: linked.len() as u64,
            termination: if capped {
                Termination::Cap
            } else {
                Termination::Exhausted
            },
        },
        Bounds {
            surface_deadline_ms: API_DEADLINE.as_millis() as u64,
            bundle_deadline_ms: r.clock.bundle_deadline_ms,
            max_threads: plan.max_flows as u64,
            max_bytes_per_surface: MAX_API_BYTES as u64,
            leak_budget: 0,
            caps: Default::default(),
        },
    );
    // Every cap this capture enforced beyond the five named ones (issue 17:
    // bounds list every cap in force).
    builder
        .cap("max_api_bytes", super::client::MAX_API_BYTES as u64)?
        .cap(
            "api_deadline_ms",
            super::client::API_DEADLINE.as_millis() as u64,
        )?
        .cap("max_api_reads", u64::from(super::MAX_API_READS))?
        .cap("max_flows", plan.max_flows as u64)?;
    if a.hubble_server.is_some() {
        builder
            .cap(
                "hubble_deadline_ms",
                super::hubble::HUBBLE_DEADLINE.as_millis() as u64,
            )?
            .cap(
                "hubble_max_output_bytes",
                super::client::MAX_API_BYTES as u64,
            )?
            .cap(
                "hubble_lookback_ms",
                (plan.window.as_secs().max(1) + 5) * 1000,
            )?;
    }
    for x in o.surfaces {
        builder.surface(x)?;
    }
    for c in o.claims {
        builder.claim(c)?;
    }
    for u in o.unknowns {
        builder.unknown(u)?;
    }
    Ok(builder.seal(next)?)
}

/// The inputs every section of [`transfer_envelope`] reads.
#[derive(Clone, Copy)]
struct Cx<'a> {
    a: &'a LonghornRequest,
    plan: &'a Plan,
    r: &'a Readings,
    topo: Option<&'a Topology>,
}

/// What the streams section hands to the seal.
struct StreamsRead {
    /// A linked stream hit a cap.
    capped: bool,
    /// The linked streams that carry transport fault facts, with their role.
    faulted: Vec<String>,
}

/// The role a linked flow was given.
fn role_in(roles: &[(&Envelope, FlowRole)], digest: &str) -> Option<FlowRole> {
    roles
        .iter()
        .find(|(e, _)| e.digest == digest)
        .map(|(_, r)| *r)
}

/// Linux's default `net.ipv4.tcp_keepalive_time`: what a socket keeps when
/// the listener leaves the OS keepalive in place (upstream's #13703 fix).
pub const OS_DEFAULT_KEEPIDLE_S: i64 = 7200;

/// The socket options of one end of an idle gRPC channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChannelSockopts {
    /// SO_KEEPALIVE.
    pub keepalive: bool,
    /// TCP_USER_TIMEOUT (0: none).
    pub user_timeout_ms: i64,
    /// TCP_KEEPIDLE.
    pub keepidle_s: i64,
    /// TCP_KEEPINTVL.
    pub keepintvl_s: i64,
    /// This end is the gRPC server's accepted socket (its local port is the
    /// sync agent's P+2).
    pub server_side: bool,
}

/// What the #13703 check says of one end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdleHazard {
    /// The client's end: the abort would come from the server's side.
    ClientSide,
    /// No user timeout: nothing aborts an unanswered probe early.
    NoUserTimeout,
    /// No keepalive: an idle channel sends nothing to go unanswered.
    NoKeepalive,
    /// The OS keepalive (first probe after [`OS_DEFAULT_KEEPIDLE_S`] or
    /// later): upstream's fix; not the hazard.
    PostFixOsKeepalive,
    /// One unanswered probe outlives the user timeout.
    Hazardous,
    /// The user timeout outlasts a probe and its retry.
    Safe,
}

impl IdleHazard {
    /// Wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            IdleHazard::ClientSide => "client_side",
            IdleHazard::NoUserTimeout => "no_user_timeout",
            IdleHazard::NoKeepalive => "no_keepalive",
            IdleHazard::PostFixOsKeepalive => "post_fix_os_keepalive",
            IdleHazard::Hazardous => "hazardous",
            IdleHazard::Safe => "safe",
        }
    }
}

/// The #13703 rule, a pure function of one end's socket options.
pub fn idle_hazard(s: &ChannelSockopts) -> IdleHazard {
    if !s.server_side {
        IdleHazard::ClientSide
    } else if s.user_timeout_ms <= 0 {
        IdleHazard::NoUserTimeout
    } else if !s.keepalive || s.keepidle_s <= 0 {
        IdleHazard::NoKeepalive
    } else if s.keepidle_s >= OS_DEFAULT_KEEPIDLE_S {
        IdleHazard::PostFixOsKeepalive
    } else if s.user_timeout_ms < (s.keepidle_s + s.keepintvl_s.max(1)) * 1000 {
        IdleHazard::Hazardous
    } else {
        IdleHazard::Safe
    }
}

#[cfg(test)]
mod hazard_tests {
    use super::*;

    #[test]
    fn the_13703_rule_judges_the_server_side_and_knows_the_fix() {
        let s = |server_side, keepalive, ut, idle, intvl| ChannelSockopts {
            keepalive,
            user_timeout_ms: ut,
            keepidle_s: idle,
            keepintvl_s: intvl,
            server_side,
        };
        let rows = [
            (
                "grpc-go server, Go 15 s keepalive: #13703",
                s(true, true, 20_000, 15, 15),
                IdleHazard::Hazardous,
            ),
            (
                "just below a probe and its retry",
                s(true, true, 29_999, 15, 15),
                IdleHazard::Hazardous,
            ),
            (
                "at a probe and its retry",
                s(true, true, 30_000, 15, 15),
                IdleHazard::Safe,
            ),
            ("above", s(true, true, 30_001, 15, 15), IdleHazard::Safe),
            (
                "the client's end, same options",
                s(false, true, 20_000, 15, 15),
                IdleHazard::ClientSide,
            ),
            (
                "Longhorn's client: no options",
                s(false, false, 0, 0, 0),
                IdleHazard::ClientSide,
            ),
            (
                "no user timeout",
                s(true, true, 0, 15, 15),
                IdleHazard::NoUserTimeout,
            ),
            (
                "no keepalive",
                s(true, false, 20_000, 15, 15),
                IdleHazard::NoKeepalive,
            ),
            (
                "just below the OS default idle",
                s(true, true, 20_000, OS_DEFAULT_KEEPIDLE_S - 1, 75),
                IdleHazard::Hazardous,
            ),
            (
                "upstream's fix: the OS keepalive",
                s(true, true, 20_000, OS_DEFAULT_KEEPIDLE_S, 75),
                IdleHazard::PostFixOsKeepalive,
            ),
        ];
        for (name, o, want) in rows {
            assert_eq!(idle_hazard(&o), want, "{name}");
        }
    }
}
