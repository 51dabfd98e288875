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

use std::net::SocketAddr;

use pstack_envelope::{
    Bounds, Claim, ClaimCode, ClaimKind, Clock, Envelope, EnvelopeBuilder, NextTransition, Scope,
    StatusCause, Subject, Surface, SurfaceStatus, Termination, TransferIdentity, Universe, Unknown,
    sha256_digest,
};
use serde_json::{Map, Value, json};

use super::client::{API_DEADLINE, ApiRead, MAX_API_BYTES};
use super::flows::FlowRole;
use super::hubble::HubbleRead;
use super::kube::EventsRead;
use super::model::{ModelError, Volume, parse_volume};
use super::topology::Topology;
use crate::transport::{self, CaptureResult, Plan, TransportError};
use pstackd_api::request::LonghornRequest;

mod channel;
mod cilium;
mod identity;
mod manager;
mod rebuild;
mod streams;

use channel::control_channel;
use cilium::hubble_section;
use identity::topology_section;
use manager::{manager_reads, manager_reports, settings_section};
use rebuild::{engine_events, terminal_unknown, verdict_section};
use streams::{flow_roles, streams_claims, streams_surface};

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
