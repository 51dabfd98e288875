//! The Longhorn engine: a Longhorn v1 replica rebuild as a
//! `storage_transfer` envelope linked, by digest, to the `network_stream`
//! envelopes of its TCP flows, split by idea:
//! [`client`] (the manager's REST API through `reqwest`, with a deadline),
//! [`model`] (the manager's real shapes and its error texts),
//! [`topology`] (E, S, T, their instance managers and port blocks; flags
//! checked against them), [`flows`] (each flow's role), [`hubble`] (every
//! Cilium verdict per connection, from a killable child) and [`envelope`]
//! (the transfer envelope, a pure function of the readings).
//!
//! A capture runs: manager read at window start (volume, then the source's
//! and target's instance managers for their port blocks) → the capture's
//! port filter narrowed to the span of the two blocks → the transport window
//! → flows outside both blocks excluded (counted) → manager read at window
//! end → Hubble → the transfer envelope.
//!
//! Invariants:
//! - **Every outside read is bounded**: each manager GET by
//!   [`client::API_DEADLINE`], Hubble by [`hubble::HUBBLE_DEADLINE`]; the run
//!   deadline in `request.rs` adds them up.
//! - **Flags are overrides, checked**: a flag that disagrees with the manager
//!   becomes a `longhorn_flag_mismatch` fact; the capture never silently
//!   prefers either.
//! - **Narrowing never widens**: the port span from Longhorn only replaces
//!   the request's range when it lies inside it, and no port is pinned.

pub mod client;
pub mod envelope;
pub mod flows;
pub mod hubble;
pub mod kube;
pub mod model;
pub mod topology;

use std::path::Path;
use std::sync::{Arc, Mutex};

use pstack_envelope::{Clock, Envelope};

use crate::Progress;
use crate::clock::{monotonic_ns, wall_time_now};
use crate::process::{LeakBudget, SupervisorConfig};
use crate::transport::{
    self, CaptureResult, FlowSelection, LONGHORN_PORTS, Plan, TransportError, WindowStop,
};
use crate::validation::{RequestError, invalid};
use pstackd_api::request::LonghornRequest;

/// Most manager reads one capture makes (volume at start, the source's and
/// target's instance managers, the settings, volume at end), each under
/// [`API_DEADLINE`].
pub const MAX_API_READS: u32 = 5;

pub use client::{API_DEADLINE, ApiFailure, ApiRead, MAX_API_BYTES, parse_base_url};
pub use envelope::{Excluded, Readings, transfer_envelope};
pub use hubble::{HUBBLE_DEADLINE, HubbleRead, read_hubble};

/// A validated Longhorn request: the transport plan of its streams and the
/// transfer's identity and sources. Outside this crate it comes only from
/// [`plan`]: the fields are crate-private.
#[derive(Debug, Clone)]
pub struct LonghornPlan {
    /// The stream flows and the window.
    pub(crate) transport: Plan,
    /// The request it came from (names, API, Hubble).
    pub(crate) request: LonghornRequest,
}

impl LonghornPlan {
    /// The transport plan of the stream flows.
    pub fn transport(&self) -> &Plan {
        &self.transport
    }

    /// The request it was validated from (names, API, Hubble).
    pub fn request(&self) -> &LonghornRequest {
        &self.request
    }

    /// The same plan, started by a watch rule (see [`Plan::with_trigger`]).
    pub fn with_trigger(mut self, trigger: pstack_envelope::Trigger) -> Self {
        self.transport = self.transport.with_trigger(trigger);
        self
    }
}

/// One Longhorn capture: the stream envelopes and the transfer envelope
/// linking them.
#[derive(Debug, Clone)]
pub struct LonghornResult {
    /// The `network_stream` envelopes of the rebuild's flows (or the no-match envelope).
    pub streams: CaptureResult,
    /// The `storage_transfer` envelope.
    pub transfer: Envelope,
}

impl LonghornResult {
    /// Every envelope of the capture: the flows, the no-match envelope, then
    /// the transfer (the order `pstackctl --json` prints and pstackd spools).
    pub fn into_envelopes(self) -> Vec<Envelope> {
        let mut all: Vec<Envelope> = self
            .streams
            .flows
            .into_iter()
            .chain(self.streams.no_match)
            .collect();
        all.push(self.transfer);
        all
    }
}

fn name_ok(param: &'static str, v: &str) -> Result<(), RequestError> {
    if v.trim().is_empty()
        || v.len() > 253
        || !v
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._".contains(&b))
    {
        return Err(invalid(
            param,
            format!("{v:?} is not a Kubernetes object name (1–253 of [A-Za-z0-9-._])"),
        ));
    }
    Ok(())
}

/// The longest a Longhorn capture of `plan` can run: its window, the
/// transport engine's overhead around it, and every read it may make, each
/// under its own deadline.
pub fn run_deadline(plan: &LonghornPlan) -> std::time::Duration {
    plan.transport.window
        + transport::RUN_OVERHEAD
        // Volume at start, two instance managers, volume at end.
        + API_DEADLINE * MAX_API_READS
        + HUBBLE_DEADLINE
        // The volume's, engine's and replica's Events (a watched capture).
        + kube::EVENTS_DEADLINE * 3
}

/// Validate a request into a Longhorn plan.
pub fn plan(a: &LonghornRequest) -> Result<LonghornPlan, RequestError> {
    for (p, v) in [("volume", &a.volume), ("engine", &a.engine)] {
        name_ok(p, v)?;
    }
    // Node flags are overrides: empty means "from Longhorn", which needs the API.
    for (p, v) in [
        ("source_node", &a.source_node),
        ("target_node", &a.target_node),
    ] {
        if v.is_empty() {
            if a.longhorn_api.is_none() {
                return Err(invalid(
                    p,
                    "required without longhorn_api (the topology is read from the manager)",
                ));
            }
        } else {
            name_ok(p, v)?;
        }
    }
    if let Some(t) = &a.transfer {
        name_ok("transfer", t)?;
    }
    let plan = Plan::from_selection(&FlowSelection::from(a), a.ebpf)?;
    let range = plan.filter.either_port_in.unwrap_or(LONGHORN_PORTS);
    for (param, port) in [
        ("peer", plan.filter.peer_port),
        ("local", plan.filter.local_port),
    ] {
        if let Some(p) = port
            && !range.contains(p)
        {
            return Err(invalid(
                param,
                format!(
                    "port {p} is outside the Longhorn data port range {}–{} (instance-manager); pass --ports to widen it",
                    range.lo, range.hi
                ),
            ));
        }
    }
    if let Some(api) = &a.longhorn_api {
        client::parse_base_url(api).map_err(|reason| invalid("longhorn_api", reason))?;
    }
    if let Some(h) = &a.hubble_server {
        hubble_server_ok(h)?;
    }
    Ok(LonghornPlan {
        transport: plan,
        request: a.clone(),
    })
}

/// The manager's volume at window start, the topology it names, and the
/// instance-manager reads of S and T.
fn read_start(
    api: &str,
    volume: &str,
    target: Option<&str>,
) -> (ApiRead, Option<topology::Topology>, Vec<(String, ApiRead)>) {
    let start = client::fetch_volume(api, volume);
    let Some(mut topo) = start
        .result
        .as_ref()
        .ok()
        .and_then(|b| model::parse_volume(b).ok())
        .filter(|v| v.data_engine != "v2" && !v.replicas.iter().any(|r| r.data_engine == "v2"))
        .map(|v| {
            let known = target.filter(|t| v.replicas.iter().any(|r| r.name == *t));
            topology::resolve(&v, known)
        })
    else {
        return (start, None, Vec::new());
    };
    let mut ims = Vec::new();
    for im in topo.replica_ims() {
        let read = client::fetch_instance_manager(api, &im);
        if let Some(blocks) = read
            .result
            .as_ref()
            .ok()
            .and_then(|b| model::parse_instance_manager(b).ok())
        {
            topo.set_blocks(&blocks);
        }
        ims.push((im, read));
    }
    (start, Some(topo), ims)
}

/// Narrow the plan's port filter to the span of S's and T's blocks when it
/// lies inside the requested range and no port is pinned; a peer that is a
/// replica's pod IP becomes its storage IP when one was read (the storage
/// network carries the rebuild).
fn narrow(plan: &Plan, topo: Option<&topology::Topology>) -> Plan {
    let mut p = plan.clone();
    let f = &mut p.filter;
    if let Some(storage) = topo.and_then(|t| {
        t.parties()
            .find(|p| p.address == Some(f.peer))
            .and_then(|p| p.storage_ip)
    }) {
        f.peer = storage;
    }
    if f.peer_port.is_some() || f.local_port.is_some() {
        return p;
    }
    let range = f.either_port_in.unwrap_or(LONGHORN_PORTS);
    if let Some((lo, hi)) = topo.and_then(topology::Topology::covering_ports)
        && range.contains(lo)
        && range.contains(hi)
    {
        f.either_port_in = Some(pstack_collectors::net::sockdiag::PortRange { lo, hi });
    }
    p
}

/// Split captured flows into the rebuild's and other volumes'.
fn select(
    streams: CaptureResult,
    topo: Option<&topology::Topology>,
) -> (CaptureResult, Vec<Excluded>, bool) {
    let Some(t) = topo.filter(|t| {
        t.source.as_ref().and_then(|p| p.block).is_some()
            || t.target.as_ref().and_then(|p| p.block).is_some()
    }) else {
        return (streams, Vec::new(), true);
    };
    // Match by pod IP when any flow end is a party's pod IP; else (a storage
    // network) by ports alone.
    let by_ip = streams
        .flows
        .iter()
        .filter_map(envelope::endpoints)
        .chain(
            streams
                .short_lived
                .iter()
                .flatten()
                .map(|f| (f.local, f.remote)),
        )
        .any(|(l, r)| {
            t.parties()
                .any(|p| p.data_ip() == Some(l.ip()) || p.data_ip() == Some(r.ip()))
        });
    let mut kept = Vec::new();
    let mut excluded = Vec::new();
    for e in streams.flows {
        let role = envelope::endpoints(&e)
            .map(|(x, y)| flows::classify(t, x, y, by_ip))
            .unwrap_or(flows::FlowRole::InBlock);
        if role == flows::FlowRole::Excluded {
            if let pstack_envelope::Subject::NetworkStream(s) = &e.subject {
                excluded.push(Excluded {
                    flow_id: s.flow_id.clone(),
                    src: s.src.clone(),
                    dst: s.dst.clone(),
                });
            }
        } else {
            kept.push(e);
        }
    }
    // Short-lived flows (eBPF): the same roles, the same exclusions.
    let short_lived = streams.short_lived.map(|all| {
        let mut kept = Vec::new();
        for f in all {
            if flows::classify(t, f.local, f.remote, by_ip) == flows::FlowRole::Excluded {
                excluded.push(Excluded {
                    flow_id: format!(
                        "short-lived {}>{} (eBPF, first event {} ns)",
                        f.local, f.remote, f.first_ns
                    ),
                    src: f.local.to_string(),
                    dst: f.remote.to_string(),
                });
            } else {
                kept.push(f);
            }
        }
        kept
    });
    (
        CaptureResult {
            net_ns: streams.net_ns,
            flows: kept,
            no_match: streams.no_match,
            short_lived,
        },
        excluded,
        by_ip,
    )
}

/// What a watcher of a Longhorn capture (pstackd's `longhorn_rebuild`
/// rule) can do to it while it runs: end its window when the rebuild ends,
/// and hand it the manager read that saw the end. Cloning shares both.
#[derive(Debug, Clone, Default)]
pub struct Watcher {
    /// Ends the window.
    pub stop: WindowStop,
    /// The watcher's own manager read that saw the rebuild end (one
    /// volume's document, with the time it was read). When set before the
    /// window ends it is the transfer's end read: Longhorn drops a failed
    /// rebuild's entry within seconds, so a fresh read after the window
    /// would often show only `[]`.
    pub terminal: Arc<Mutex<Option<ApiRead>>>,
    /// The Kubernetes API, for the Events of a rebuild whose entry is gone
    /// at the end (None: the probe names the `kubectl` command instead).
    pub kube: Option<kube::KubeApi>,
    /// The rebuild's Engine Events the watcher saw (its Events watch), in order.
    pub signals: Arc<Mutex<Vec<kube::Event>>>,
    /// The watcher's verdict on how the rebuild ended, when it did.
    pub verdict: Arc<Mutex<Option<Verdict>>>,
    /// The target replica the watcher follows: before file sync there is
    /// no `rebuildStatus` entry (nor, before `ReplicaCreate`, a WO replica)
    /// to name it.
    pub target_replica: Option<String>,
}

/// A watcher's verdict on a rebuild's end (pstackd's `longhorn_rebuild`
/// condition, a pure function of the manager reads and Engine Events).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Verdict {
    /// `complete`, `failed_<how>`, `removed`, `unresolved`.
    pub outcome: String,
    /// What showed it.
    pub basis: String,
    /// The `AddReplica` step a failure names ("" when not a failure).
    pub step: String,
    /// The failure happened before file sync.
    pub before_file_sync: bool,
    /// The failure's text ("" when none).
    pub error: String,
    /// Resets the rebuild survived (a file's next attempt followed; v1.11+).
    pub retries: u32,
    /// The retried resets' texts (bounded).
    pub retry_errors: Vec<String>,
}

impl Watcher {
    /// Hand over the read that saw the end, and end the window.
    pub fn end(&self, terminal: Option<ApiRead>) {
        if let Some(t) = terminal {
            *self.terminal.lock().unwrap_or_else(|p| p.into_inner()) = Some(t);
        }
        self.stop.stop();
    }

    /// [`Watcher::end`] with the watcher's verdict.
    pub fn end_with(&self, terminal: Option<ApiRead>, verdict: Verdict) {
        *self.verdict.lock().unwrap_or_else(|p| p.into_inner()) = Some(verdict);
        self.end(terminal);
    }

    /// The rebuild's Engine Events so far (replacing what was handed before).
    pub fn set_signals(&self, events: Vec<kube::Event>) {
        *self.signals.lock().unwrap_or_else(|p| p.into_inner()) = events;
    }
}

/// Run a Longhorn capture (see the module doc for the order) with the net
/// helper of `config` under `budget`, Hubble through the CLI at `hubble_bin`.
pub fn capture(
    plan: &LonghornPlan,
    config: &SupervisorConfig,
    budget: &LeakBudget,
    hubble_bin: &Path,
    progress: &dyn Fn(Progress<'_>),
) -> Result<LonghornResult, TransportError> {
    capture_watched(
        plan,
        config,
        budget,
        hubble_bin,
        progress,
        &Watcher::default(),
    )
}

/// [`capture`] under a [`Watcher`]: the window ends when it says so, and
/// the end read is its terminal read when it handed one over.
pub fn capture_watched(
    plan: &LonghornPlan,
    config: &SupervisorConfig,
    budget: &LeakBudget,
    hubble_bin: &Path,
    progress: &dyn Fn(Progress<'_>),
    watcher: &Watcher,
) -> Result<LonghornResult, TransportError> {
    let r = &plan.request;
    let wall = wall_time_now();
    let mono_start = monotonic_ns();
    let (start, topo, ims) = match &r.longhorn_api {
        Some(api) => {
            progress(Progress::Phase {
                what: "reading the Longhorn manager",
                expected: API_DEADLINE,
            });
            let (s, t, i) = read_start(api, &r.volume, watcher.target_replica.as_deref());
            progress(Progress::PhaseDone);
            (Some(s), t, i)
        }
        None => (None, None, Vec::new()),
    };
    // The settings that bound each failure, recorded as facts.
    let settings = r
        .longhorn_api
        .as_ref()
        .map(|api| client::fetch_settings(api));
    // Under a storage network the data path runs on the Replica CRs'
    // storage IPs: read them (Kubernetes API) and select flows there.
    let mut topo = topo;
    let selected_on = topo.as_mut().map(|t| {
        let setting = settings
            .as_ref()
            .and_then(|s| s.result.as_ref().ok())
            .and_then(|b| model::parse_settings(b).ok())
            .map(|m| m.get("storage-network").cloned().unwrap_or_default());
        let mut storage = std::collections::BTreeMap::new();
        if setting.as_deref().is_some_and(|v| !v.trim().is_empty()) {
            for p in [&t.source, &t.target].into_iter().flatten() {
                let read = match &watcher.kube {
                    Some(api) => kube::fetch_replica_storage(api, &p.name)
                        .map(|a| a.map(|a| a.ip))
                        .map_err(|e| e.message),
                    None => Err("no Kubernetes API configured".to_string()),
                };
                storage.insert(p.name.clone(), read);
            }
        }
        topology::select_network(t, setting.as_deref(), &storage)
    });
    let narrowed = narrow(&plan.transport, topo.as_ref());
    let captured = transport::capture_until(&narrowed, config, budget, progress, &watcher.stop)?;
    let (streams, excluded, by_ip) = select(captured, topo.as_ref());
    let handed = watcher
        .terminal
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .take();
    let end = handed.or_else(|| {
        r.longhorn_api
            .as_ref()
            .map(|api| client::fetch_volume(api, &r.volume))
    });
    // `[]` after the rebuild was seen: its Events, when the API is reachable.
    let events = watcher.kube.as_ref().and_then(|api| {
        let target = envelope::entry_gone(topo.as_ref(), start.as_ref(), end.as_ref())?;
        progress(Progress::Phase {
            what: "reading the rebuild's Kubernetes Events",
            expected: kube::EVENTS_DEADLINE * 3,
        });
        // The volume's, the engine's (Longhorn records FailedRebuilding on
        // the Engine object) and the target replica's.
        let reads = [r.volume.as_str(), r.engine.as_str(), target.as_str()]
            .iter()
            .map(|o| kube::fetch_events(api, o))
            .collect();
        progress(Progress::PhaseDone);
        Some(reads)
    });
    let signals = watcher
        .signals
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    let verdict = watcher
        .verdict
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    let hubble = r.hubble_server.as_ref().map(|server| {
        progress(Progress::Phase {
            what: "reading Hubble flows",
            expected: HUBBLE_DEADLINE,
        });
        let h = read_hubble(hubble_bin, server, narrowed.filter.peer, narrowed.window);
        progress(Progress::PhaseDone);
        h
    });
    let clock = Clock {
        wall_time: wall,
        monotonic_start_ns: mono_start.to_string(),
        monotonic_end_ns: monotonic_ns().to_string(),
        bundle_deadline_ms: run_deadline(plan).as_millis() as u64,
    };
    let readings = Readings {
        streams,
        excluded,
        start,
        end,
        ims,
        topology: topo,
        by_ip,
        hubble,
        events,
        signals,
        verdict,
        settings,
        selected_on,
        clock,
    };
    let transfer = transfer_envelope(r, &narrowed, &readings)?;
    Ok(LonghornResult {
        streams: readings.streams,
        transfer,
    })
}

/// A Hubble Relay address is `HOST:PORT` of plain name characters: it
/// becomes one argument of a child process and must not read as a flag.
fn hubble_server_ok(s: &str) -> Result<(), RequestError> {
    let ok = !s.is_empty()
        && s.len() <= 260
        && !s.starts_with('-')
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._:[]".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(invalid("hubble_server", format!("{s:?} is not HOST:PORT")))
    }
}

#[cfg(test)]
mod tests;
