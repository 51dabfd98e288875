//! pstackd's `longhorn_rebuild` rule: polls the Longhorn manager's volume
//! list, folds each reading into the [`RebuildBook`] (the pure condition of
//! [`super::rebuild`]) and turns its changes into firings of windowed
//! Longhorn captures on this node.
//!
//! Invariants:
//! - **Only real readings are folded.** A manager that is down, times out
//!   or answers something that is not the volume list makes the rule
//!   `degraded` with the reason; the book is left as it was, so no rebuild
//!   starts or ends because the manager could not be read, and no envelope
//!   is made from it.
//! - **One poll in flight per rule**, each bounded by the client's deadline
//!   ([`pstack_capture::longhorn::API_DEADLINE`]) through the project's one
//!   HTTP client, off the tick (a slow manager never delays other rules).
//! - **A window per rebuild at a time, bounded.** A start fires a capture
//!   whose window lasts until the rebuild ends (the poll that sees the end
//!   stops it) or the rule's `window`, whichever is first; a rebuild that
//!   outlasts the window gets another window when the last one has sealed
//!   (counted in `continued`). A window that was suppressed is not retried.
//!   pstackd draining ends every window (sealed with what it saw).
//! - **The end is evidence.** A failure hands the capture the poll's own
//!   reading of that volume (the `error` text, `failedAt`, mode) as its end
//!   read; a failure seen with no window running fires a terminal capture
//!   that seals that reading at once. Either goes through the same limits
//!   and counters as every firing.
//! - **Only parties capture.** This node's role (engine, source, target) is
//!   the party whose `hostId` is this node's name; a rebuild this node takes
//!   no part in is followed and counted (`not_a_party`), never captured.

use std::collections::{BTreeMap, VecDeque};
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Instant;

use pstack_capture::longhorn::client::{self, ApiRead};
use pstack_capture::longhorn::kube::{Event, KubeApi, WatchReport};
use pstack_capture::longhorn::model::{Volume, parse_error_addrs, parse_volume_list};
use pstack_capture::longhorn::topology::{NodeSeen, PartyRole, Topology, node_roles, resolve};
use pstack_capture::longhorn::{LonghornPlan, Verdict, Watcher};
use pstack_capture::request::{DEFAULT_MAX_FLOWS, LonghornRequest, PlanLonghorn};
use pstackd_api::{WatchEvent, WatchEventKind};
use serde_json::{Value, json};

use super::rebuild::{Change, Outcome, RebuildBook, RebuildEvent, volume_of_event};
use super::rules::{LonghornRule, RuleKind, WatchRule};
use super::{Action, Firing};

/// Window of a terminal capture (it is stopped before it starts: the
/// samples are taken back to back).
const TERMINAL_WINDOW_MS: u64 = 1000;
/// Rebuild changes kept for status.
const RECENT_CHANGES: usize = 32;

/// A capture window's lifecycle, shared with the task that runs it.
#[derive(Debug, Default)]
pub struct WindowLife(AtomicU8);

impl WindowLife {
    const RUNNING: u8 = 1;
    const DONE: u8 = 2;
    /// The capture started.
    pub fn started(&self) {
        self.0.store(Self::RUNNING, Ordering::SeqCst);
    }
    /// The capture returned (sealed or failed).
    pub fn done(&self) {
        self.0.store(Self::DONE, Ordering::SeqCst);
    }
    fn is_done(&self) -> bool {
        self.0.load(Ordering::SeqCst) == Self::DONE
    }
}

/// What a `longhorn_rebuild` firing captures.
#[derive(Debug, Clone)]
pub struct LonghornAction {
    /// The capture request (volume, engine, peer, netns, window, manager).
    pub request: LonghornRequest,
    /// Ends the window and hands over the terminal read.
    pub watcher: Watcher,
    /// Started / done, read by the rule's next polls.
    pub life: Arc<WindowLife>,
}

impl LonghornAction {
    /// The validated plan.
    pub fn plan(&self) -> Result<LonghornPlan, String> {
        self.request
            .plan()
            .map_err(|e| format!("building the capture: {e}"))
    }
}

#[derive(Debug)]
struct Window {
    seq: u32,
    watcher: Watcher,
    life: Arc<WindowLife>,
    role: PartyRole,
    request: LonghornRequest,
}

/// Manager health as the last poll left it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Health {
    /// No poll has finished yet.
    Starting,
    /// The last poll read the volume list.
    Ok,
    /// The last poll failed; why.
    Degraded(String),
}

/// One `longhorn_rebuild` rule's state between polls.
#[derive(Debug)]
pub struct LonghornWatch {
    book: RebuildBook,
    health: Health,
    in_flight: bool,
    next_poll: Option<Instant>,
    polls: u64,
    poll_failures: u64,
    last_poll_at: Option<String>,
    last_poll_us: u64,
    windows: BTreeMap<(String, String), Window>,
    not_a_party: u64,
    continued: u64,
    terminal: u64,
    started: u64,
    ended: BTreeMap<String, u64>,
    recent: VecDeque<WatchEvent>,
    /// The last poll's documents by volume (the terminal read of a rebuild
    /// an Event ends).
    last_docs: BTreeMap<String, Vec<u8>>,
    last_read: Option<ApiRead>,
    pub(super) events: EventsWatch,
    /// v2 volumes in the last poll (skipped).
    v2_volumes: Vec<String>,
    /// Engine Events of v2 volumes ignored.
    v2_events_skipped: u64,
    cr_reads: u64,
    cr_failures: u64,
    cr_last_failure: Option<String>,
}

/// Most Replica CRs read with one poll.
pub const MAX_REPLICA_CR_READS: usize = 16;

/// One Replica CR read: its `RebuildFailed` condition, or why not.
pub type ConditionRead = Result<
    Option<pstack_capture::longhorn::kube::RebuildFailedCondition>,
    pstack_capture::longhorn::ApiFailure,
>;

/// Read the Replica CRs' `RebuildFailed` conditions (blocking; run it off
/// the runtime), each under the Events deadline.
pub fn read_conditions(lh: &LonghornRule, replicas: &[String]) -> Vec<(String, ConditionRead)> {
    let Some(api) = kubernetes_api(lh) else {
        return Vec::new();
    };
    replicas
        .iter()
        .map(|r| {
            (
                r.clone(),
                pstack_capture::longhorn::kube::fetch_replica_rebuild_failed(&api, r),
            )
        })
        .collect()
}

/// The Engine Events watch's side of the rule.
#[derive(Debug, Default)]
pub struct EventsWatch {
    /// Set when the rule is dropped (reloaded away, pstackd stopping): the
    /// watch thread ends within a session's check interval.
    pub stop: Arc<std::sync::atomic::AtomicBool>,
    /// The watch thread was started.
    pub started: bool,
    state: Option<Result<String, String>>,
    received: u64,
    rebuild_signals: u64,
    failures: u64,
}

impl Drop for LonghornWatch {
    fn drop(&mut self) {
        self.events
            .stop
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

impl Default for LonghornWatch {
    fn default() -> Self {
        LonghornWatch {
            book: RebuildBook::default(),
            health: Health::Starting,
            in_flight: false,
            next_poll: None,
            polls: 0,
            poll_failures: 0,
            last_poll_at: None,
            last_poll_us: 0,
            windows: BTreeMap::new(),
            not_a_party: 0,
            continued: 0,
            terminal: 0,
            started: 0,
            ended: BTreeMap::new(),
            recent: VecDeque::new(),
            last_docs: BTreeMap::new(),
            last_read: None,
            events: EventsWatch::default(),
            v2_volumes: Vec::new(),
            v2_events_skipped: 0,
            cr_reads: 0,
            cr_failures: 0,
            cr_last_failure: None,
        }
    }
}

/// This node's Longhorn name: the rule's `node`, else `$NODE_NAME` (the
/// downward API's usual name), else the hostname.
pub fn node_name(rule: &LonghornRule) -> String {
    rule.node
        .clone()
        .or_else(|| std::env::var("NODE_NAME").ok().filter(|n| !n.is_empty()))
        .or_else(|| {
            nix::unistd::gethostname()
                .ok()
                .and_then(|h| h.into_string().ok())
        })
        .unwrap_or_default()
}

/// This node's acting role in a rebuild and the peer its capture selects:
/// the target captures towards the source (the control channel it opened, the
/// bulk streams it receives); the source and the engine towards the target.
/// The role is the capture's own decision ([`node_roles`], target first when
/// one node plays two parts, E = T is common), so the window and the
/// envelope it produces carry the same label.
pub fn local_role(t: &Topology, node: &str) -> Option<(PartyRole, Option<IpAddr>)> {
    let addr =
        |p: &Option<pstack_capture::longhorn::topology::Party>| p.as_ref().and_then(|p| p.address);
    let roles = node_roles(
        t,
        NodeSeen {
            node,
            ..Default::default()
        },
    );
    let role = roles.acting()?;
    let peer = match role {
        PartyRole::Target => addr(&t.source),
        PartyRole::Source | PartyRole::Engine => addr(&t.target),
    };
    Some((role, peer))
}

impl LonghornWatch {
    /// Whether a poll is due now; if so it is marked in flight.
    pub fn take_poll(&mut self, rule: &LonghornRule, now: Instant) -> bool {
        if self.in_flight || self.next_poll.is_some_and(|t| now < t) {
            return false;
        }
        self.in_flight = true;
        // A little early is fine: ticks are a second apart, and a poll due
        // just after a tick would otherwise wait for the next one.
        self.next_poll = Some(now + rule.poll.saturating_sub(super::TICK / 10));
        true
    }

    /// End every running window now (pstackd is draining).
    pub fn end_windows(&self) {
        for w in self.windows.values() {
            w.watcher.end(None);
        }
    }

    /// The rule's health.
    pub fn health(&self) -> &Health {
        &self.health
    }

    fn remember(&mut self, v: WatchEvent) {
        if self.recent.len() == RECENT_CHANGES {
            self.recent.pop_front();
        }
        self.recent.push_back(v);
    }

    /// Fold a poll's result; the firings it makes and the events to emit.
    pub fn on_poll(
        &mut self,
        rule: &WatchRule,
        lh: &LonghornRule,
        read: ApiRead,
    ) -> (Vec<Firing>, Vec<WatchEvent>) {
        self.in_flight = false;
        self.polls += 1;
        self.last_poll_at = Some(read.at.clone());
        self.last_poll_us = read.elapsed_us;
        let list = match &read.result {
            Err(f) => Err(format!(
                "the manager at {} did not answer the volume list: {} ({})",
                read.url,
                f.message,
                serde_json::to_value(f.status)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_string))
                    .unwrap_or_default()
            )),
            Ok(body) => parse_volume_list(body)
                .map_err(|e| format!("the manager at {} answered garbage: {e}", read.url)),
        };
        let list = match list {
            Ok(l) => l,
            Err(reason) => {
                self.poll_failures += 1;
                let was = std::mem::replace(&mut self.health, Health::Degraded(reason.clone()));
                let events = if matches!(was, Health::Degraded(_)) {
                    Vec::new()
                } else {
                    vec![WatchEvent::new(WatchEventKind::Degraded {
                        rule: rule.name.clone(),
                        kind: rule.kind.as_str().into(),
                        reason,
                    })]
                };
                return (Vec::new(), events);
            }
        };
        self.health = Health::Ok;
        let list: Vec<(Volume, Vec<u8>)> = list
            .into_iter()
            .filter(|(v, _)| lh.volumes.is_empty() || lh.volumes.contains(&v.name))
            .collect();
        // v2 volumes (SPDK over NVMe-oF/TCP between spdk_tgt processes) do not
        // rebuild through the v1 sync agents this rule captures: skipped,
        // counted, and their Events ignored.
        let (v2, list): (Vec<_>, Vec<_>) = list.into_iter().partition(|(v, _)| {
            v.data_engine == "v2" || v.replicas.iter().any(|r| r.data_engine == "v2")
        });
        self.v2_volumes = v2.into_iter().map(|(v, _)| v.name).collect();
        let volumes: Vec<Volume> = list.iter().map(|(v, _)| v.clone()).collect();
        let bytes: BTreeMap<&str, &[u8]> = list
            .iter()
            .map(|(v, b)| (v.name.as_str(), b.as_slice()))
            .collect();
        self.last_docs = bytes
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_vec()))
            .collect();
        self.last_read = Some(ApiRead {
            result: Ok(Vec::new()),
            ..read.clone()
        });
        let changes = self.book.observe(&volumes);
        self.apply(rule, lh, changes)
    }

    /// The Replica CRs a poll reads with the volume list (the followed
    /// rebuilds' targets, at most [`MAX_REPLICA_CR_READS`]), when a
    /// Kubernetes API is configured.
    pub fn replicas_to_check(&self, lh: &LonghornRule) -> Vec<String> {
        if kubernetes_api(lh).is_none() {
            return Vec::new();
        }
        self.book.replicas_to_check(MAX_REPLICA_CR_READS)
    }

    /// Fold the Replica CR reads made with a poll (before the poll itself):
    /// a `RebuildFailed` condition `True` is Longhorn's own verdict.
    pub fn on_conditions(&mut self, reads: Vec<(String, ConditionRead)>) {
        for (replica, read) in reads {
            self.cr_reads += 1;
            match read {
                Ok(Some(c)) => {
                    self.book
                        .condition(&replica, &c.reason, &c.message, c.status == "True")
                }
                Ok(None) => self.book.condition(&replica, "", "", false),
                Err(f) => {
                    self.cr_failures += 1;
                    self.cr_last_failure = Some(f.message);
                }
            }
        }
    }

    /// Whether the Engine Events watch should be started now (once per
    /// rule, when a Kubernetes API is configured); if so it is marked.
    pub fn take_events_watch(&mut self, lh: &LonghornRule) -> Option<KubeApi> {
        if self.events.started {
            return None;
        }
        let api = kubernetes_api(lh)?;
        self.events.started = true;
        Some(api)
    }

    /// Fold one report of the Engine Events watch.
    pub fn on_events(
        &mut self,
        rule: &WatchRule,
        lh: &LonghornRule,
        report: WatchReport,
    ) -> (Vec<Firing>, Vec<WatchEvent>) {
        match report {
            WatchReport::Healthy { rv } => {
                self.events.state = Some(Ok(rv));
                (Vec::new(), Vec::new())
            }
            WatchReport::Failed(f) => {
                self.events.failures += 1;
                let was_ok = !matches!(self.events.state, Some(Err(_)));
                self.events.state = Some(Err(f.message.clone()));
                let e = WatchEvent::new(WatchEventKind::EventsWatchDegraded {
                    rule: rule.name.clone(),
                    kind: rule.kind.as_str().into(),
                    reason: f.message,
                });
                (Vec::new(), if was_ok { vec![e] } else { Vec::new() })
            }
            WatchReport::Event(ev) => {
                self.events.received += 1;
                let Some(volume) = volume_of_event(&ev, self.book.last_reading()) else {
                    return (Vec::new(), Vec::new());
                };
                if !lh.volumes.is_empty() && !lh.volumes.contains(&volume) {
                    return (Vec::new(), Vec::new());
                }
                if self.v2_volumes.contains(&volume) {
                    self.v2_events_skipped += 1;
                    return (Vec::new(), Vec::new());
                }
                let changes = self.book.signal(&volume, &ev);
                if super::rebuild::Signal::of(&ev.reason, &ev.message).is_some() {
                    self.events.rebuild_signals += 1;
                }
                let (f, mut e) = self.apply(rule, lh, changes);
                // Each running window holds its rebuild's Events so far.
                for (key, w) in &self.windows {
                    if let Some((_, seen)) = self.book.followed().find(|(k, _)| *k == key) {
                        w.watcher.set_signals(
                            seen.signals
                                .iter()
                                .map(|s| signal_event(&w.request.engine, s))
                                .collect(),
                        );
                    }
                }
                let note = WatchEvent::new(WatchEventKind::EngineEvent {
                    rule: rule.name.clone(),
                    kind: rule.kind.as_str().into(),
                    engine: ev.name.clone(),
                    reason: ev.reason.clone(),
                    volume: volume.clone(),
                    message: (ev.message.len() <= 2048).then(|| ev.message.clone()),
                })
                .at(ev.last.clone());
                e.insert(0, note);
                (f, e)
            }
        }
    }

    /// Turn the book's changes into firings and events.
    fn apply(
        &mut self,
        rule: &WatchRule,
        lh: &LonghornRule,
        changes: Vec<RebuildEvent>,
    ) -> (Vec<Firing>, Vec<WatchEvent>) {
        let node = node_name(lh);
        let mut firings = Vec::new();
        let mut events = Vec::new();
        let at = Instant::now();
        // Only a change needs the reading (an Event that changes nothing
        // must not copy 200 volumes).
        let volumes: Vec<Volume> = if changes.is_empty() {
            Vec::new()
        } else {
            self.book.last_reading().to_vec()
        };
        for ev in changes {
            let key = (ev.volume.clone(), ev.replica.clone());
            let vol = volumes.iter().find(|v| v.name == ev.volume);
            match &ev.change {
                Change::Started => {
                    self.started += 1;
                    let started = |role: Option<String>, why_no_window: Option<String>| {
                        WatchEvent::new(WatchEventKind::RebuildStarted {
                            rule: rule.name.clone(),
                            kind: rule.kind.as_str().into(),
                            volume: ev.volume.clone(),
                            replica: ev.replica.clone(),
                            from: ev.seen.from.clone(),
                            opened_by: ev.seen.opened_by.clone(),
                            node: node.clone(),
                            role,
                            why_no_window,
                        })
                    };
                    let Some(v) = vol else {
                        // An Event before any reading of its volume: followed,
                        // but no party to capture on is known.
                        self.not_a_party += 1;
                        let e = started(None, Some("no manager reading of the volume yet".into()));
                        self.remember(e.clone());
                        events.push(e);
                        continue;
                    };
                    let want = (!ev.replica.is_empty()).then_some(ev.replica.as_str());
                    let topo = resolve(v, want);
                    let role = local_role(&topo, &node);
                    let e = started(role.map(|r| r.0.as_str().to_string()), None);
                    self.remember(e.clone());
                    events.push(e);
                    let Some((role, peer)) = role else {
                        self.not_a_party += 1;
                        continue;
                    };
                    match self.window(rule, lh, &ev, &topo, role, peer, 1) {
                        Ok((f, w)) => {
                            self.windows.insert(key, w);
                            firings.push(f);
                        }
                        Err(reason) => events.push(WatchEvent::new(WatchEventKind::Failed {
                            rule: rule.name.clone(),
                            kind: rule.kind.as_str().into(),
                            subject: subject(&ev.volume, &ev.replica),
                            error: reason,
                        })),
                    }
                }
                Change::Continuing => {}
                Change::Ended(outcome) => {
                    let failed = matches!(outcome, Outcome::Failed { .. });
                    *self.ended.entry(outcome.label()).or_default() += 1;
                    let e = ended_event(rule, &ev, outcome);
                    self.remember(e.clone());
                    events.push(e);
                    // The last poll's own reading of the volume, as the end read.
                    let terminal = failed
                        .then(|| {
                            self.last_read.as_ref().map(|read| ApiRead {
                                url: format!("{} (volume {})", read.url, ev.volume),
                                at: read.at.clone(),
                                result: Ok(self
                                    .last_docs
                                    .get(ev.volume.as_str())
                                    .cloned()
                                    .unwrap_or_else(|| b"{\"rebuildStatus\":[]}".to_vec())),
                                elapsed_us: read.elapsed_us,
                            })
                        })
                        .flatten();
                    // A window opened under the name-less key of a volume Event.
                    let w = self.windows.remove(&key).or_else(|| {
                        let anon = (ev.volume.clone(), String::new());
                        self.windows.remove(&anon)
                    });
                    let verdict = verdict_of(outcome, &ev.seen);
                    match w {
                        Some(w) if !w.life.is_done() => {
                            // Running, or fired and about to start: it takes the end.
                            w.watcher.set_signals(
                                ev.seen
                                    .signals
                                    .iter()
                                    .map(|s| signal_event(&w.request.engine, s))
                                    .collect(),
                            );
                            w.watcher.end_with(terminal, verdict);
                        }
                        Some(w) if failed => {
                            // No window running: seal the terminal reading now.
                            let mut request = w.request.clone();
                            request.window_ms = TERMINAL_WINDOW_MS;
                            let watcher = watcher_for(lh, &ev.replica);
                            watcher.set_signals(
                                ev.seen
                                    .signals
                                    .iter()
                                    .map(|s| signal_event(&request.engine, s))
                                    .collect(),
                            );
                            watcher.end_with(terminal, verdict);
                            self.terminal += 1;
                            firings.push(self.firing(
                                rule,
                                &ev,
                                w.role,
                                "failed",
                                w.seq + 1,
                                Some(outcome),
                                LonghornAction {
                                    request,
                                    watcher,
                                    life: Arc::new(WindowLife::default()),
                                },
                                at,
                            ));
                        }
                        _ => {}
                    }
                }
            }
        }
        // Rebuilds that outlast their window: the next window once the last sealed.
        let followed: Vec<(String, String)> =
            self.book.followed().map(|(k, _)| k.clone()).collect();
        for key in followed {
            let Some(w) = self.windows.get(&key) else {
                continue;
            };
            if !w.life.is_done() {
                continue;
            }
            let seq = w.seq + 1;
            let (role, request) = (w.role, w.request.clone());
            let seen = self
                .book
                .followed()
                .find(|(k, _)| **k == key)
                .map(|(_, s)| s.clone())
                .unwrap_or_default();
            let ev = RebuildEvent {
                volume: key.0.clone(),
                replica: key.1.clone(),
                change: Change::Continuing,
                seen,
            };
            let action = LonghornAction {
                request,
                watcher: watcher_for(lh, &key.1),
                life: Arc::new(WindowLife::default()),
            };
            let (watcher, life) = (action.watcher.clone(), action.life.clone());
            let f = self.firing(rule, &ev, role, "continued", seq, None, action, at);
            if let Some(w) = self.windows.get_mut(&key) {
                w.seq = seq;
                w.watcher = watcher;
                w.life = life;
            }
            self.continued += 1;
            firings.push(f);
        }
        (firings, events)
    }

    #[allow(
        clippy::too_many_arguments,
        reason = "one call site each; the readings of one poll, named"
    )]
    fn window(
        &self,
        rule: &WatchRule,
        lh: &LonghornRule,
        ev: &RebuildEvent,
        topo: &Topology,
        role: PartyRole,
        peer: Option<IpAddr>,
        seq: u32,
    ) -> Result<(Firing, Window), String> {
        // Before file sync no source is named; T's first peer is E (GetReplica).
        let peer = peer
            .or_else(|| {
                (role == PartyRole::Target)
                    .then(|| topo.engine.as_ref().and_then(|p| p.address))
                    .flatten()
            })
            .ok_or_else(|| {
            format!(
                "the manager gives no address for the {} party of {}'s rebuild: no peer to capture towards",
                if role == PartyRole::Target { "source" } else { "target" },
                ev.replica
            )
        })?;
        let engine = topo
            .engine
            .as_ref()
            .map(|p| p.name.clone())
            .ok_or_else(|| format!("volume {} lists no engine (controllers[])", ev.volume))?;
        let request = LonghornRequest {
            volume: ev.volume.clone(),
            engine,
            source_node: String::new(),
            target_node: String::new(),
            transfer: None,
            peer: peer.to_string(),
            local: None,
            netns_pid: lh.netns_pid,
            netns: lh.netns.clone(),
            window_ms: rule.window.as_millis() as u64,
            ports: None,
            max_flows: DEFAULT_MAX_FLOWS,
            wait: true,
            ebpf: true,
            longhorn_api: Some(lh.manager_url.clone()),
            hubble_server: None,
        };
        request
            .plan()
            .map_err(|e| format!("building the capture: {e}"))?;
        let action = LonghornAction {
            request: request.clone(),
            watcher: watcher_for(lh, &ev.replica),
            life: Arc::new(WindowLife::default()),
        };
        let w = Window {
            seq,
            watcher: action.watcher.clone(),
            life: action.life.clone(),
            role,
            request,
        };
        Ok((
            self.firing(rule, ev, role, "started", seq, None, action, Instant::now()),
            w,
        ))
    }

    #[allow(
        clippy::too_many_arguments,
        reason = "one call site each; the readings of one poll, named"
    )]
    fn firing(
        &self,
        rule: &WatchRule,
        ev: &RebuildEvent,
        role: PartyRole,
        phase: &str,
        seq: u32,
        outcome: Option<&Outcome>,
        action: LonghornAction,
        at: Instant,
    ) -> Firing {
        let mut c = BTreeMap::new();
        c.insert("volume".into(), ev.volume.clone());
        c.insert("replica".into(), ev.replica.clone());
        c.insert("from".into(), ev.seen.from.join(","));
        c.insert("role".into(), role.as_str().into());
        c.insert("phase".into(), phase.into());
        c.insert("window_seq".into(), seq.to_string());
        c.insert("peer".into(), action.request.peer.clone());
        c.insert("window_ms".into(), action.request.window_ms.to_string());
        if let Some(p) = ev.seen.progress {
            c.insert("progress".into(), p.to_string());
        }
        if let Some(o) = outcome {
            outcome_into(o, &mut c);
        }
        Firing {
            rule: rule.name.clone(),
            kind: RuleKind::LonghornRebuild,
            subject: subject(&ev.volume, &ev.replica),
            condition: c,
            fault_at: at,
            action: Action::Longhorn(Box::new(action)),
        }
    }

    /// The `longhorn` member of the rule's status.
    pub fn status_json(&self, lh: &LonghornRule) -> Value {
        let (health, reason) = match &self.health {
            Health::Starting => ("starting", None),
            Health::Ok => ("ok", None),
            Health::Degraded(r) => ("degraded", Some(r.clone())),
        };
        json!({
            "manager_url": lh.manager_url,
            "volumes": lh.volumes,
            "poll_ms": lh.poll.as_millis() as u64,
            "node": node_name(lh),
            "kubernetes_api": kubernetes_api(lh).map(|k| k.base),
            "manager": {"state": health, "reason": reason, "polls": self.polls,
                        "failures": self.poll_failures, "last_poll": self.last_poll_at,
                        "last_poll_us": self.last_poll_us},
            "following": self.book.followed().map(|((v, r), s)| json!({"volume": v, "replica": r, "from": s.from, "progress": s.progress})).collect::<Vec<_>>(),
            "engine_events": {"state": match &self.events.state {
                    None => "starting",
                    Some(Ok(_)) => "ok",
                    Some(Err(_)) => "degraded",
                },
                "reason": self.events.state.as_ref().and_then(|s| s.as_ref().err()),
                "resource_version": self.events.state.as_ref().and_then(|s| s.as_ref().ok()),
                "received": self.events.received, "rebuild_signals": self.events.rebuild_signals,
                "failures": self.events.failures, "watching": self.events.started},
            "skipped": {"v2_volumes": self.v2_volumes.len(), "v2_events": self.v2_events_skipped,
                "reason": "v2 data engine: SPDK over NVMe-oF/TCP between spdk_tgt processes, not the v1 sync-agent rebuild this rule captures"},
            "replica_crs": {"reads": self.cr_reads, "failures": self.cr_failures, "last_failure": self.cr_last_failure},
            "rebuilds_started": self.started,
            "rebuilds_ended": self.ended,
            "not_a_party": self.not_a_party,
            "windows_continued": self.continued,
            "terminal_captures": self.terminal,
            "recent": self.recent,
        })
    }
}

/// The Kubernetes API a rule's captures read Events through: the
/// configured one, else the in-cluster service account, else none.
pub fn kubernetes_api(lh: &LonghornRule) -> Option<KubeApi> {
    lh.kubernetes.clone().or_else(KubeApi::in_cluster)
}

fn watcher_for(lh: &LonghornRule, replica: &str) -> Watcher {
    Watcher {
        kube: kubernetes_api(lh),
        target_replica: (!replica.is_empty()).then(|| replica.to_string()),
        ..Watcher::default()
    }
}

/// Rate-limit and concurrency key of a rebuild.
pub fn subject(volume: &str, replica: &str) -> String {
    format!("longhorn:{volume}/{replica}")
}

/// An Event the book remembered, as the capture records it.
fn signal_event(engine: &str, s: &super::rebuild::Signalled) -> Event {
    Event {
        kind: "Engine".into(),
        name: engine.into(),
        reason: s.signal.as_str().into(),
        event_type: if matches!(
            s.signal,
            super::rebuild::Signal::Rebuilding | super::rebuild::Signal::Rebuilt
        ) {
            "Normal".into()
        } else {
            "Warning".into()
        },
        message: s.message.clone(),
        count: 1,
        last: s.at.clone(),
        component: "longhorn-engine-controller".into(),
        resource_version: String::new(),
    }
}

/// The rule's verdict, handed to the capture that seals it.
fn verdict_of(o: &Outcome, seen: &super::rebuild::Seen) -> Verdict {
    Verdict {
        retries: seen.retries,
        retry_errors: seen.retry_errors.clone(),
        ..verdict_of_outcome(o)
    }
}

fn verdict_of_outcome(o: &Outcome) -> Verdict {
    match o {
        Outcome::Complete { basis } => Verdict {
            outcome: o.label(),
            basis: (*basis).into(),
            ..Verdict::default()
        },
        Outcome::Removed { basis } | Outcome::Unresolved { basis } => Verdict {
            outcome: o.label(),
            basis: (*basis).into(),
            ..Verdict::default()
        },
        Outcome::Failed {
            how, error, step, ..
        } => Verdict {
            outcome: o.label(),
            basis: how.as_str().into(),
            step: step.as_str().into(),
            before_file_sync: step.before_file_sync(),
            error: error.clone(),
            ..Verdict::default()
        },
    }
}

fn outcome_into(o: &Outcome, c: &mut BTreeMap<String, String>) {
    match o {
        Outcome::Complete { basis } => {
            c.insert("outcome".into(), "complete".into());
            c.insert("basis".into(), (*basis).into());
        }
        Outcome::Removed { basis } => {
            c.insert("outcome".into(), "removed".into());
            c.insert("basis".into(), (*basis).into());
        }
        Outcome::Unresolved { basis } => {
            c.insert("outcome".into(), "unresolved".into());
            c.insert("basis".into(), (*basis).into());
        }
        Outcome::Failed {
            how,
            error,
            step,
            failed_at,
            mode,
        } => {
            c.insert("outcome".into(), "failed".into());
            c.insert("failure".into(), how.as_str().into());
            c.insert("step".into(), step.as_str().into());
            c.insert(
                "before_file_sync".into(),
                step.before_file_sync().to_string(),
            );
            if !error.is_empty() {
                c.insert("error".into(), error.clone());
                let addrs = parse_error_addrs(error);
                let pairs: Vec<String> = addrs
                    .pairs
                    .iter()
                    .map(|(a, b)| format!("{a}->{b}"))
                    .collect();
                if !addrs.endpoints.is_empty() {
                    let ends: Vec<String> = addrs.endpoints.iter().map(|a| a.to_string()).collect();
                    c.insert("error_endpoints".into(), ends.join(","));
                }
                if !pairs.is_empty() {
                    c.insert("error_pairs".into(), pairs.join(","));
                }
            }
            if !failed_at.is_empty() {
                c.insert("failed_at".into(), failed_at.clone());
            }
            c.insert("mode".into(), mode.clone());
        }
    }
}

fn ended_event(rule: &WatchRule, ev: &RebuildEvent, o: &Outcome) -> WatchEvent {
    let mut c = BTreeMap::new();
    outcome_into(o, &mut c);
    c.insert("retries".into(), ev.seen.retries.to_string());
    WatchEvent::new(WatchEventKind::RebuildEnded {
        rule: rule.name.clone(),
        kind: rule.kind.as_str().into(),
        volume: ev.volume.clone(),
        replica: ev.replica.clone(),
        outcome: c,
    })
}

/// Read the manager's volume list (blocking; run it off the runtime).
pub fn poll(lh: &LonghornRule) -> ApiRead {
    client::fetch_volumes(&lh.manager_url)
}

#[cfg(test)]
mod tests {
    //! The rule's orchestration over synthetic manager reads (the capture
    //! itself is exercised on the testbed, `tests/transport/watch_longhorn.rs`).
    use super::*;

    /// A rule's events as the JSON lines pstackd streams.
    fn as_json<F>((f, ev): (F, Vec<WatchEvent>)) -> (F, Vec<Value>) {
        (
            f,
            ev.iter()
                .map(|e| serde_json::to_value(e).unwrap())
                .collect(),
        )
    }
    use crate::watch::rules::WatchRuleConfig;

    fn rule(node: &str) -> (WatchRule, LonghornRule) {
        let cfg: WatchRuleConfig = toml::from_str(&format!(
            "name = \"rebuilds\"\nkind = \"longhorn_rebuild\"\nmanager_url = \"http://127.0.0.1:9500\"\nnode = \"{node}\"\nwindow = \"30s\""
        ))
        .unwrap();
        let r = cfg.validate().unwrap();
        let super::super::rules::Condition::LonghornRebuild(lh) = &r.condition else {
            panic!()
        };
        let lh = (**lh).clone();
        (r, lh)
    }

    /// A `GET /v1/volumes` answer: volume `pvc-7` (replica S on node-s
    /// 10.0.0.2, T on node-t 10.0.0.3 in `mode`, engine on node-e) with
    /// `rebuild` as its `rebuildStatus`.
    fn list(rebuild: serde_json::Value, mode: &str) -> ApiRead {
        let v = json!({"name": "pvc-7", "state": "attached", "robustness": "degraded", "dataEngine": "v1",
            "replicas": [{"name": "r-s", "hostId": "node-s", "address": "10.0.0.2", "instanceManagerName": "im-s", "mode": "RW", "failedAt": ""},
                         {"name": "r-t", "hostId": "node-t", "address": "10.0.0.3", "instanceManagerName": "im-t", "mode": mode, "failedAt": ""}],
            "controllers": [{"name": "pvc-7-e-0", "hostId": "node-e", "address": "10.0.0.1"}],
            "rebuildStatus": rebuild});
        ApiRead {
            url: "http://127.0.0.1:9500/v1/volumes".into(),
            at: "2026-12-04T18:00:00.000Z".into(),
            result: Ok(json!({"type": "collection", "data": [v]})
                .to_string()
                .into_bytes()),
            elapsed_us: 10,
        }
    }

    fn running(state: &str, error: &str) -> serde_json::Value {
        json!([{"replica": "r-t", "fromReplica": "r-s", "state": state, "progress": 5,
                "isRebuilding": state == "in_progress", "error": error}])
    }

    fn action(f: &Firing) -> &LonghornAction {
        match &f.action {
            Action::Longhorn(a) => a,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_rebuild_gets_a_window_a_continuation_and_a_terminal_capture() {
        let (r, lh) = rule("node-t");
        let mut w = LonghornWatch::default();
        assert!(w.take_poll(&lh, Instant::now()));
        assert!(!w.take_poll(&lh, Instant::now()), "one poll in flight");
        let (f, ev) = as_json(w.on_poll(&r, &lh, list(json!([]), "RW")));
        assert!(f.is_empty() && ev.is_empty());
        // Started: a window on the target towards the source.
        let (f, ev) = as_json(w.on_poll(&r, &lh, list(running("in_progress", ""), "WO")));
        assert_eq!(ev[0]["event"], "rebuild_started");
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].subject, "longhorn:pvc-7/r-t");
        assert_eq!(f[0].condition["role"], "target");
        assert_eq!(f[0].condition["phase"], "started");
        let a = action(&f[0]);
        assert_eq!(a.request.peer, "10.0.0.2");
        assert_eq!(a.request.engine, "pvc-7-e-0");
        assert_eq!(a.request.window_ms, 30_000);
        // While it runs, polls fire nothing.
        a.life.started();
        let (f2, _) = w.on_poll(&r, &lh, list(running("in_progress", ""), "WO"));
        assert!(f2.is_empty());
        // It sealed at its bound while the rebuild goes on: the next window.
        a.life.done();
        let (f3, _) = w.on_poll(&r, &lh, list(running("in_progress", ""), "WO"));
        assert_eq!(f3.len(), 1);
        assert_eq!(f3[0].condition["phase"], "continued");
        assert_eq!(f3[0].condition["window_seq"], "2");
        assert_eq!(w.continued, 1);
        // That one is running when the rebuild fails: it is ended, and handed
        // the poll's reading.
        let b = action(&f3[0]);
        b.life.started();
        let text = "read tcp 10.0.0.3:43126->10.0.0.2:10002: read: connection reset by peer";
        let (f4, ev) = as_json(w.on_poll(&r, &lh, list(running("error", text), "WO")));
        assert!(f4.is_empty(), "the running window takes the end");
        assert!(b.watcher.stop.is_stopped());
        let handed = b.watcher.terminal.lock().unwrap().clone().unwrap();
        assert!(
            String::from_utf8_lossy(handed.result.as_ref().unwrap()).contains("connection reset")
        );
        assert_eq!(ev[0]["event"], "rebuild_ended");
        assert_eq!(ev[0]["outcome"]["failure"], "state_error");
        assert_eq!(
            ev[0]["outcome"]["error_pairs"],
            "10.0.0.3:43126->10.0.0.2:10002"
        );

        // A failure seen when no window runs: a terminal capture, already ended.
        let (f, _) = w.on_poll(&r, &lh, list(running("in_progress", ""), "WO"));
        let c = action(&f[0]);
        c.life.started();
        c.life.done();
        let (f5, _) = w.on_poll(&r, &lh, list(json!([]), "ERR"));
        assert_eq!(f5.len(), 1, "{f5:?}");
        assert_eq!(f5[0].condition["phase"], "failed");
        // mode ERR: the engine's data path set it ERR (the `Faulted` shape).
        assert_eq!(f5[0].condition["failure"], "engine_fault");
        let t = action(&f5[0]);
        assert!(t.watcher.stop.is_stopped());
        assert!(t.watcher.terminal.lock().unwrap().is_some());
        assert_eq!(w.terminal, 1);
    }

    #[test]
    fn v2_volumes_are_skipped_and_counted() {
        let (r, lh) = rule("node-t");
        let mut w = LonghornWatch::default();
        let mut read = list(running("in_progress", ""), "WO");
        let body = String::from_utf8(read.result.clone().unwrap()).unwrap();
        read.result = Ok(body
            .replace("\"dataEngine\":\"v1\"", "\"dataEngine\":\"v2\"")
            .into_bytes());
        let (f, ev) = as_json(w.on_poll(&r, &lh, read));
        assert!(f.is_empty() && ev.is_empty(), "{ev:?}");
        let (f, ev) = as_json(w.on_events(
            &r,
            &lh,
            engine_event(
                "Rebuilding",
                "Start rebuilding replica r-t with Address 10.0.0.3:20001",
            ),
        ));
        assert!(f.is_empty() && ev.is_empty(), "{ev:?}");
        let st = w.status_json(&lh);
        assert_eq!(st["skipped"]["v2_volumes"], 1, "{st:#}");
        assert_eq!(st["skipped"]["v2_events"], 1, "{st:#}");
        assert!(
            st["skipped"]["reason"]
                .as_str()
                .unwrap()
                .contains("v2 data engine")
        );
    }

    /// All-in-one instance manager: the engine shares T's node and pod IP.
    /// pstackd's window label and the capture's self-label (from the flows'
    /// local ends, towards the window's peer) are one decision.
    #[test]
    fn on_a_shared_ip_layout_pstackd_and_the_capture_name_the_same_role() {
        use pstack_capture::longhorn::model::parse_volume;
        let vol = json!({"name": "pvc-7", "state": "attached", "robustness": "degraded", "dataEngine": "v1",
            "replicas": [{"name": "r-s", "hostId": "node-s", "address": "10.0.0.2", "instanceManagerName": "im-s", "mode": "RW", "failedAt": ""},
                         {"name": "r-t", "hostId": "node-t", "address": "10.0.0.3", "instanceManagerName": "im-t", "mode": "WO", "failedAt": ""}],
            "controllers": [{"name": "pvc-7-e-0", "hostId": "node-t", "address": "10.0.0.3"}],
            "rebuildStatus": running("in_progress", "")});
        let mut read = list(json!([]), "WO");
        read.result = Ok(json!({"type": "collection", "data": [vol.clone()]})
            .to_string()
            .into_bytes());
        let (r, lh) = rule("node-t");
        let mut w = LonghornWatch::default();
        let (f, _) = w.on_poll(&r, &lh, read);
        assert_eq!(f.len(), 1);
        let pstackd = f[0].condition["role"].to_string();
        let peer: IpAddr = action(&f[0]).request.peer.parse().unwrap();
        let topo = resolve(
            &parse_volume(vol.to_string().as_bytes()).unwrap(),
            Some("r-t"),
        );
        let local: [IpAddr; 1] = ["10.0.0.3".parse().unwrap()];
        let capture = node_roles(
            &topo,
            NodeSeen {
                node: "",
                local_ips: &local,
                peer: Some(peer),
            },
        );
        assert_eq!(capture.label(), "engine+target", "{}", capture.basis);
        assert_eq!(
            capture.acting().map(|r| r.as_str()),
            Some(pstackd.as_str()),
            "{}",
            capture.basis
        );
        assert_eq!(pstackd, "target");
    }

    #[test]
    fn a_node_that_takes_no_part_captures_nothing_and_a_bad_read_degrades() {
        let (r, lh) = rule("node-x");
        let mut w = LonghornWatch::default();
        let (f, ev) = as_json(w.on_poll(&r, &lh, list(running("in_progress", ""), "WO")));
        assert!(f.is_empty());
        assert_eq!(ev[0]["role"], serde_json::Value::Null);
        assert_eq!(w.not_a_party, 1);
        // The engine's node captures towards the target.
        let (r, lh) = rule("node-e");
        let mut w = LonghornWatch::default();
        let (f, _) = w.on_poll(&r, &lh, list(running("in_progress", ""), "WO"));
        assert_eq!(f[0].condition["role"], "engine");
        assert_eq!(action(&f[0]).request.peer, "10.0.0.3");
        // A bad read: degraded, the rebuild still followed, nothing ends.
        let mut bad = list(json!([]), "WO");
        bad.result = Ok(b"<html><body>UI</body></html>".to_vec());
        let (f, ev) = as_json(w.on_poll(&r, &lh, bad.clone()));
        assert!(f.is_empty());
        assert_eq!(ev[0]["event"], "degraded");
        assert!(matches!(w.health(), Health::Degraded(m) if m.contains("HTML")));
        assert_eq!(w.book.followed().count(), 1);
        let (_, ev) = as_json(w.on_poll(&r, &lh, bad));
        assert!(ev.is_empty(), "degraded is said once");
    }

    fn engine_event(reason: &str, message: &str) -> WatchReport {
        WatchReport::Event(Event {
            kind: "Engine".into(),
            name: "pvc-7-e-0".into(),
            reason: reason.into(),
            event_type: "Warning".into(),
            message: message.into(),
            count: 1,
            last: "2026-12-07T08:00:00Z".into(),
            component: "longhorn-engine-controller".into(),
            resource_version: "9".into(),
        })
    }

    #[test]
    fn an_engine_event_opens_the_window_before_file_sync_and_its_failure_is_handed_over() {
        let (r, lh) = rule("node-e");
        let mut w = LonghornWatch::default();
        // T's replica exists, not yet in the engine (mode "").
        let (f, _) = w.on_poll(&r, &lh, list(json!([]), ""));
        assert!(f.is_empty());
        let (f, ev) = as_json(w.on_events(&r, &lh, engine_event("Rebuilding",
            "Start rebuilding replica r-t with Address 10.0.0.3:10000 for normal engine pvc-7-e-0 and volume pvc-7")));
        assert_eq!(ev[0]["event"], "engine_event");
        assert_eq!(ev[1]["event"], "rebuild_started");
        assert_eq!(ev[1]["opened_by"], "Rebuilding Event");
        assert_eq!(f.len(), 1, "{ev:?}");
        assert_eq!(f[0].condition["role"], "engine");
        let a = action(&f[0]);
        assert_eq!(a.request.peer, "10.0.0.3");
        a.life.started();
        // Polls before the Event: mode "" is not an end.
        let (f, ev) = as_json(w.on_poll(&r, &lh, list(json!([]), "")));
        assert!(f.is_empty() && ev.is_empty(), "{ev:?}");
        let text = "Failed rebuilding replica with Address 10.0.0.3:10000: proxyServer=10.0.0.1:8501 destination=10.0.0.1:10000: failed to add replica tcp://10.0.0.3:10000 for volume: rpc error: code = Unavailable desc = failed to get replica 10.0.0.3:10000: rpc error: code = Unavailable desc = connection error: desc = \"transport: Error while dialing: dial tcp 10.0.0.3:10000: i/o timeout\"";
        let (f, ev) = as_json(w.on_events(&r, &lh, engine_event("FailedRebuilding", text)));
        assert!(f.is_empty(), "the running window takes the end");
        let ended = ev.iter().find(|e| e["event"] == "rebuild_ended").unwrap();
        assert_eq!(ended["outcome"]["failure"], "failed_rebuilding");
        assert_eq!(ended["outcome"]["step"], "get_replica");
        assert_eq!(ended["outcome"]["before_file_sync"], "true");
        assert!(a.watcher.stop.is_stopped());
        let v = a.watcher.verdict.lock().unwrap().clone().unwrap();
        assert_eq!((v.step.as_str(), v.before_file_sync), ("get_replica", true));
        let signals = a.watcher.signals.lock().unwrap().clone();
        let reasons: Vec<&str> = signals.iter().map(|e| e.reason.as_str()).collect();
        assert_eq!(reasons, ["Rebuilding", "FailedRebuilding"]);
        assert_eq!(w.ended["failed_failed_rebuilding"], 1);
        // An Event of a volume the rule does not watch is ignored.
        let (r2, mut lh2) = rule("node-e");
        lh2.volumes = vec!["other".into()];
        let mut w2 = LonghornWatch::default();
        let (f, ev) = as_json(w2.on_events(
            &r2,
            &lh2,
            engine_event(
                "Rebuilding",
                "Start rebuilding replica r-t with Address 10.0.0.3:10000",
            ),
        ));
        assert!(f.is_empty() && ev.is_empty());
    }
}

#[cfg(test)]
mod bench {
    //! The rule's own cost per poll and per Event with 200 volumes (the
    //! parse of `GET /v1/volumes` and the fold; the HTTP read is not in it).
    //! `cargo test -p pstack-agent --lib bench_the_rule -- --ignored --nocapture`
    use super::*;
    use crate::watch::rules::WatchRuleConfig;

    #[test]
    #[ignore = "a measurement, printed for BENCHMARKS.md"]
    fn bench_the_rule_with_200_volumes() {
        let cfg: WatchRuleConfig = toml::from_str(
            "name = \"rebuilds\"\nkind = \"longhorn_rebuild\"\nmanager_url = \"http://127.0.0.1:9500\"\nnode = \"node-t\"\nwindow = \"30s\"",
        )
        .unwrap();
        let r = cfg.validate().unwrap();
        let super::super::rules::Condition::LonghornRebuild(lh) = &r.condition else {
            panic!()
        };
        let lh = (**lh).clone();
        let vols: Vec<Value> = (0..200)
            .map(|i| {
                json!({"name": format!("pvc-{i}"), "state": "attached", "robustness": "healthy", "dataEngine": "v1",
                    "replicas": [
                        {"name": format!("pvc-{i}-r-a"), "hostId": "node-s", "address": "10.0.0.2", "instanceManagerName": "im-s", "mode": "RW", "failedAt": ""},
                        {"name": format!("pvc-{i}-r-b"), "hostId": "node-t", "address": "10.0.0.3", "instanceManagerName": "im-t", "mode": "RW", "failedAt": ""},
                        {"name": format!("pvc-{i}-r-c"), "hostId": "node-e", "address": "10.0.0.1", "instanceManagerName": "im-e", "mode": "RW", "failedAt": ""}],
                    "controllers": [{"name": format!("pvc-{i}-e-0"), "hostId": "node-e", "address": "10.0.0.1"}],
                    "rebuildStatus": []})
            })
            .collect();
        let body = json!({"type": "collection", "data": vols})
            .to_string()
            .into_bytes();
        let read = ApiRead {
            url: "http://127.0.0.1:9500/v1/volumes".into(),
            at: "2026-12-07T08:00:00Z".into(),
            result: Ok(body.clone()),
            elapsed_us: 0,
        };
        let mut w = LonghornWatch::default();
        let n = 50;
        let t = Instant::now();
        for _ in 0..n {
            let _ = w.on_poll(&r, &lh, read.clone());
        }
        let per_poll = t.elapsed() / n;
        let ev = Event {
            kind: "Engine".into(),
            name: "pvc-77-e-0".into(),
            reason: "Rebuilding".into(),
            event_type: "Normal".into(),
            message: "Detected rebuilding replica pvc-77-r-b (10.0.0.3:10000)".into(),
            count: 1,
            last: String::new(),
            component: String::new(),
            resource_version: String::new(),
        };
        let other = Event {
            reason: "Attached".into(),
            ..ev.clone()
        };
        let m = 1000;
        let t = Instant::now();
        for _ in 0..m {
            let _ = w.on_events(&r, &lh, WatchReport::Event(other.clone()));
        }
        let per_event = t.elapsed() / m;
        eprintln!(
            "BENCH longhorn_rebuild rule, 200 volumes ({} bytes of GET /v1/volumes): parse + fold {:?} per poll (mean of {n}); an Engine Event that is not a rebuild signal {:?} (mean of {m}); debug build",
            body.len(),
            per_poll,
            per_event
        );
    }
}
