//! pstackd's watch rules: conditions sampled every second and, when one
//! becomes true, a capture of its subject started by the daemon itself.
//!
//! Invariants:
//! - **The rule set is the running configuration's.** It is re-read at every
//!   tick, so a SIGHUP that passes validation swaps it and a bad file keeps
//!   the old set (config reload is all-or-nothing). A rule kept across a
//!   reload (same name and definition) keeps its counters and limits.
//! - **Everything that fired is visible.** Each firing is counted and ends
//!   as exactly one of: a capture started (then sealed or failed), or a
//!   suppression counted under its reason (`SUPPRESS_*`). Nothing is
//!   dropped silently; the last [`RECENT_EVENTS`] events are kept for
//!   `GET /v1/watch/events` and streamed live.
//! - **Bounded.** Every rule has a per-subject and a per-rule hourly limit;
//!   at most one capture per subject runs at a time; captures take the same
//!   slots, spool room and leak budget as an operator's (a flight record,
//!   sealed from memory without a helper, takes no slot), and are refused the
//!   same way (counted as suppressed) when those are spent.
//! - **Identity before capture.** A D-state subject is re-read (same start
//!   time, still in D) right before its capture; the capture itself checks
//!   identity before and after, as every process capture does.
//! - **A rule that cannot run says why** (`unavailable` with the reason),
//!   and the others keep running; a rule whose source answers badly (the
//!   Longhorn manager down or answering garbage) is `degraded` with the
//!   reason and fires nothing until it answers again.

pub mod conditions;
pub mod flows;
pub mod limit;
pub mod longhorn;
mod longhorn_run;
pub mod rebuild;
pub mod rules;
pub(crate) mod runner;
pub mod sample;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pstack_capture::clock::wall_time_now;
use pstack_capture::process::Target;
use pstack_capture::request::{
    ProcessLimits, RequestedCaps, RequestedDeadlines, ValidRequest, process_plan,
};
use pstack_envelope::Trigger;
use pstack_exposition::{Exposition, Family};
use pstackd_api::status::{DStateScan, RuleState as WireRuleState, RuleStatus, WatchStatus};
use pstackd_api::{WatchEvent, WatchEventKind};
use serde_json::{Value, json};
use tokio::sync::broadcast;

use self::conditions::{CounterSample, DStateTracker, RateTracker};
use self::limit::{Limited, Limiter};
use self::rules::{Condition, RuleKind, WatchRule};
use super::engines;

/// How often conditions are sampled.
pub const TICK: Duration = Duration::from_secs(1);
/// Events kept for late readers of `/v1/watch/events`.
pub const RECENT_EVENTS: usize = 256;

/// A capture of this subject is already running.
pub const SUPPRESS_RUNNING: &str = "capture_running";
/// The subject's hourly limit is spent.
pub const SUPPRESS_SUBJECT_LIMIT: &str = "rate_limit_subject";
/// The rule's hourly limit is spent.
pub const SUPPRESS_RULE_LIMIT: &str = "rate_limit_rule";
/// The helper leak budget is spent.
pub const SUPPRESS_LEAK_BUDGET: &str = "leak_budget";
/// The spool is full and refuses new captures.
pub const SUPPRESS_SPOOL_FULL: &str = "spool_full";
/// Every capture slot is taken.
pub const SUPPRESS_BUSY: &str = "busy";
/// pstackd is shutting down.
pub const SUPPRESS_DRAINING: &str = "draining";
/// The subject recovered or went away before its capture could start.
pub const SUPPRESS_GONE: &str = "subject_gone";

/// Every suppression reason, in the order status shows them.
pub const SUPPRESS_REASONS: &[&str] = &[
    SUPPRESS_RUNNING,
    SUPPRESS_SUBJECT_LIMIT,
    SUPPRESS_RULE_LIMIT,
    SUPPRESS_LEAK_BUDGET,
    SUPPRESS_SPOOL_FULL,
    SUPPRESS_BUSY,
    SUPPRESS_DRAINING,
    SUPPRESS_GONE,
];

/// Whether a rule can run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Availability {
    /// Its source is up; it fires when its condition holds.
    Armed,
    /// Its source is missing; the reason says which and why.
    Unavailable(String),
    /// Its source is configured but its last reading failed; it fires
    /// nothing until a reading succeeds.
    Degraded(String),
}

#[derive(Debug)]
struct RuleState {
    rule: WatchRule,
    availability: Availability,
    fired: u64,
    captured: u64,
    failed: u64,
    suppressed: BTreeMap<&'static str, u64>,
    last_fired: Option<String>,
    last_envelope: Option<String>,
    last_error: Option<String>,
    limiter: Limiter,
    d_state: DStateTracker,
    rate: RateTracker,
    longhorn: longhorn::LonghornWatch,
}

impl RuleState {
    fn new(rule: WatchRule) -> RuleState {
        RuleState {
            rule,
            availability: Availability::Unavailable("starting".into()),
            fired: 0,
            captured: 0,
            failed: 0,
            suppressed: BTreeMap::new(),
            last_fired: None,
            last_envelope: None,
            last_error: None,
            limiter: Limiter::default(),
            d_state: DStateTracker::default(),
            rate: RateTracker::default(),
            longhorn: longhorn::LonghornWatch::default(),
        }
    }

    fn suppressed_total(&self) -> u64 {
        self.suppressed.values().sum()
    }
}

/// What a firing captures.
#[derive(Debug, Clone)]
pub enum Action {
    /// A process capture of `tgid` (its thread `tid` was the one in D).
    Process {
        /// Process.
        tgid: u32,
        /// The thread seen in D.
        tid: u32,
        /// The thread's start time, re-checked before the capture.
        start_ticks: u64,
    },
    /// A host capture.
    Host,
    /// A flow's own capture, prepared by [`flows`].
    Flow(flows::FlowAction),
    /// A Longhorn rebuild's windowed capture, prepared by [`longhorn`].
    Longhorn(Box<longhorn::LonghornAction>),
}

/// A rule whose condition became true.
#[derive(Debug, Clone)]
pub struct Firing {
    /// The rule's name.
    pub rule: String,
    /// Its kind.
    pub kind: RuleKind,
    /// Rate-limit and concurrency key of the subject.
    pub subject: String,
    /// The condition's readings (sealed in the trigger).
    pub condition: BTreeMap<String, String>,
    /// When the fault began, as far as the engine can tell (monotonic).
    pub fault_at: Instant,
    /// What to capture.
    pub action: Action,
}

/// The watch engine pstackd holds.
#[derive(Debug)]
pub struct WatchEngine {
    inner: Mutex<Inner>,
    /// Locked after `inner` when both are held, never before.
    flows: Mutex<flows::FlowWatch>,
    events: broadcast::Sender<WatchEvent>,
    recent: Mutex<VecDeque<WatchEvent>>,
    /// Set when pstackd starts draining: event streams end, so an open
    /// `pstackctl watch --follow` never holds the drain.
    closing: tokio::sync::watch::Sender<bool>,
    proc_root: PathBuf,
    origin: Instant,
}

#[derive(Debug, Default)]
struct Inner {
    /// The `[[watch]]` tables the rules were built from.
    configured: Vec<rules::WatchRuleConfig>,
    rules: Vec<RuleState>,
    running: BTreeSet<String>,
    next_d_scan: Option<Instant>,
    d_every: Duration,
    last_scan: Option<(usize, bool, u64)>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl WatchEngine {
    /// An engine with no rules, reading `/proc`.
    pub fn new() -> WatchEngine {
        let (events, _) = broadcast::channel(1024);
        WatchEngine {
            inner: Mutex::new(Inner::default()),
            flows: Mutex::new(flows::FlowWatch::default()),
            events,
            recent: Mutex::new(VecDeque::with_capacity(RECENT_EVENTS)),
            closing: tokio::sync::watch::Sender::new(false),
            proc_root: PathBuf::from("/proc"),
            origin: Instant::now(),
        }
    }

    fn emit(&self, event: WatchEvent) {
        {
            let mut recent = lock(&self.recent);
            if recent.len() == RECENT_EVENTS {
                recent.pop_front();
            }
            recent.push_back(event.clone());
        }
        let _ = self.events.send(event);
    }

    /// Recent events, a receiver of the ones to come (subscribed first, so
    /// nothing falls between the two), and the closing signal.
    pub fn subscribe(
        &self,
    ) -> (
        Vec<WatchEvent>,
        broadcast::Receiver<WatchEvent>,
        tokio::sync::watch::Receiver<bool>,
    ) {
        let rx = self.events.subscribe();
        let recent = lock(&self.recent).iter().cloned().collect();
        (recent, rx, self.closing.subscribe())
    }

    /// End every event stream and every Longhorn rebuild window (pstackd
    /// is draining: a window that follows a rebuild may have up to an hour
    /// left, and is sealed with what it saw so far).
    pub fn close(&self) {
        self.closing.send_replace(true);
        for s in lock(&self.inner).rules.iter() {
            s.longhorn.end_windows();
        }
    }

    /// Replace the rule set with the configuration's, keeping the state of
    /// rules that did not change. The set was validated when the
    /// configuration was loaded; it is validated again only when it changed.
    fn sync_rules(&self, configured: &[rules::WatchRuleConfig]) {
        let mut inner = lock(&self.inner);
        if inner.configured == configured {
            return;
        }
        inner.configured = configured.to_vec();
        let rules = rules::validate_all(configured).unwrap_or_default();
        let mut old: BTreeMap<String, RuleState> = inner
            .rules
            .drain(..)
            .map(|s| (s.rule.name.clone(), s))
            .collect();
        inner.rules = rules
            .into_iter()
            .map(|r| match old.remove(&r.name) {
                Some(s) if s.rule == r => s,
                _ => RuleState::new(r),
            })
            .collect();
        let names: Vec<&str> = inner.rules.iter().map(|s| s.rule.name.as_str()).collect();
        tracing::info!(rules = ?names, "watch rules in force");
    }

    /// Whether the D-state scan is due: every [`TICK`] for the shortest
    /// `min_seconds` up to 5 s, less often for longer ones (a fifth of it, at
    /// most 5 s) — the scan reads one `stat` per thread on the host, and a
    /// condition of 10 s needs no sample every second.
    fn d_scan_due(&self) -> bool {
        let mut inner = lock(&self.inner);
        let shortest = inner
            .rules
            .iter()
            .filter_map(|s| match s.rule.condition {
                Condition::DState { min } => Some(min),
                _ => None,
            })
            .min()
            .unwrap_or(TICK);
        let every = (shortest / 5).clamp(TICK, Duration::from_secs(5));
        let now = Instant::now();
        if inner.next_d_scan.is_some_and(|t| now < t) {
            return false;
        }
        // A little early is fine: ticks are TICK apart.
        inner.next_d_scan = Some(now + every - TICK / 10);
        inner.d_every = every;
        true
    }

    /// The port ranges of the TCP rules.
    fn flow_ports(&self) -> Vec<(u16, u16)> {
        lock(&self.inner)
            .rules
            .iter()
            .filter_map(|s| match s.rule.condition {
                Condition::TcpReset { ports } | Condition::TcpRto { ports } => Some(ports),
                _ => None,
            })
            .collect()
    }

    /// Decide each rule's availability from why the helper is missing (if
    /// it is) and the flight recorder's state (`flow_state`).
    fn refresh_availability(&self, helper_missing: Option<&str>, flow_state: &Result<(), String>) {
        let helper = helper_missing;
        let mut inner = lock(&self.inner);
        for s in &mut inner.rules {
            let needs_helper = !matches!(s.rule.kind, RuleKind::TcpReset);
            s.availability = match (s.rule.kind, &helper, flow_state) {
                (_, Some(reason), _) if needs_helper => {
                    Availability::Unavailable(format!("pstack-helper not found: {reason}"))
                }
                (RuleKind::LonghornRebuild, _, _) => match s.longhorn.health() {
                    longhorn::Health::Degraded(r) => Availability::Degraded(r.clone()),
                    _ => Availability::Armed,
                },
                (k, _, Err(reason)) if k.needs_flows() => Availability::Unavailable(reason.clone()),
                _ => Availability::Armed,
            };
        }
    }

    /// Fold this tick's readings into the conditions; the firings.
    fn evaluate(&self, readings: &Readings) -> Vec<Firing> {
        let now = self.origin.elapsed();
        let at = Instant::now();
        let mut inner = lock(&self.inner);
        if let Some(d) = &readings.d_scan {
            inner.last_scan = Some((
                d.scanned,
                d.truncated,
                readings.sampled_in.as_micros() as u64,
            ));
        }
        let d_every = inner.d_every;
        let mut out = Vec::new();
        for s in inner.rules.iter_mut() {
            if s.availability != Availability::Armed {
                continue;
            }
            match &s.rule.condition {
                Condition::DState { min } => {
                    let Some(scan) = &readings.d_scan else {
                        continue;
                    };
                    for f in s.d_state.observe(now, &scan.in_d, *min) {
                        let mut c = BTreeMap::new();
                        c.insert("tid".into(), f.task.tid.to_string());
                        c.insert("pid".into(), f.task.tgid.to_string());
                        c.insert("comm".into(), f.task.comm.clone());
                        c.insert("d_state_ms".into(), f.d_for.as_millis().to_string());
                        c.insert("min_seconds".into(), min.as_secs().to_string());
                        c.insert("samples_in_d".into(), f.samples.to_string());
                        c.insert("sample_interval_ms".into(), d_every.as_millis().to_string());
                        c.insert("other_threads_in_d".into(), f.sibling_threads.to_string());
                        if let Some(ts) = f.task.timeslices {
                            c.insert("timeslices_unchanged_at".into(), ts.to_string());
                        }
                        out.push(Firing {
                            rule: s.rule.name.clone(),
                            kind: s.rule.kind,
                            subject: format!("process:{}:{}", f.task.tgid, f.task.start_ticks),
                            condition: c,
                            // The condition became true T after the task
                            // entered D, which was after the sample before
                            // the first that saw it: the earliest that can
                            // be (so fault -> sealed is an upper bound,
                            // sampling included).
                            fault_at: at
                                .checked_sub(f.d_for.saturating_sub(*min) + d_every)
                                .unwrap_or(at),
                            action: Action::Process {
                                tgid: f.task.tgid,
                                tid: f.task.tid,
                                start_ticks: f.task.start_ticks,
                            },
                        });
                    }
                }
                Condition::ListenOverflow {
                    threshold_per_second,
                }
                | Condition::RetransmitRate {
                    threshold_per_second,
                } => {
                    let Some(Ok(tcp)) = &readings.tcp else {
                        continue;
                    };
                    let (counter, value) = match s.rule.kind {
                        RuleKind::ListenOverflow => {
                            ("TcpExt.ListenOverflows", tcp.listen_overflows)
                        }
                        _ => ("Tcp.RetransSegs", tcp.retrans_segs),
                    };
                    if let Some(r) = s
                        .rate
                        .observe(CounterSample { at: now, value }, *threshold_per_second)
                    {
                        let mut c = BTreeMap::new();
                        c.insert("counter".into(), counter.into());
                        c.insert("increase".into(), r.delta.to_string());
                        c.insert("over_ms".into(), r.over.as_millis().to_string());
                        c.insert("per_second".into(), format!("{:.1}", r.per_second));
                        c.insert(
                            "threshold_per_second".into(),
                            threshold_per_second.to_string(),
                        );
                        c.insert("value".into(), value.to_string());
                        out.push(Firing {
                            rule: s.rule.name.clone(),
                            kind: s.rule.kind,
                            subject: "host".into(),
                            condition: c,
                            fault_at: at.checked_sub(r.over).unwrap_or(at),
                            action: Action::Host,
                        });
                    }
                }
                Condition::TcpReset { .. } | Condition::TcpRto { .. } => {}
                // Fired from the manager's polls (`longhorn`), not the tick.
                Condition::LonghornRebuild(_) => {}
            }
        }
        let flow_rules: Vec<(String, RuleKind, Condition, Duration)> = inner
            .rules
            .iter()
            .filter(|s| s.availability == Availability::Armed && s.rule.kind.needs_flows())
            .map(|s| {
                (
                    s.rule.name.clone(),
                    s.rule.kind,
                    s.rule.condition.clone(),
                    s.rule.window,
                )
            })
            .collect();
        drop(inner);
        let mut flows = lock(&self.flows);
        if flow_rules.is_empty() {
            // Incidents of rules that are gone or unavailable fire nothing.
            flows.firings(&[], at);
        } else {
            out.extend(flows.firings(&flow_rules, at));
        }
        out
    }

    /// Count a suppressed firing and say so.
    fn suppress(&self, f: &Firing, reason: &'static str, detail: Option<String>) {
        {
            let mut inner = lock(&self.inner);
            if let Some(s) = inner.rules.iter_mut().find(|s| s.rule.name == f.rule) {
                *s.suppressed.entry(reason).or_default() += 1;
            }
        }
        tracing::info!(rule = %f.rule, subject = %f.subject, reason, "watch firing suppressed");
        self.emit(
            WatchEvent::new(WatchEventKind::Suppressed {
                rule: f.rule.clone(),
                kind: f.kind.as_str().into(),
                subject: f.subject.clone(),
                reason: reason.into(),
                detail,
            })
            .at(wall_time_now()),
        );
    }

    fn finish(&self, f: &Firing, outcome: Result<Vec<String>, String>) {
        let sealed_ms = f.fault_at.elapsed().as_millis() as u64;
        {
            let mut inner = lock(&self.inner);
            inner.running.remove(&f.subject);
            if let Some(s) = inner.rules.iter_mut().find(|s| s.rule.name == f.rule) {
                match &outcome {
                    Ok(d) => {
                        s.captured += 1;
                        s.last_envelope = d.last().cloned();
                    }
                    Err(e) => {
                        s.failed += 1;
                        s.last_error = Some(e.clone());
                    }
                }
            }
        }
        match outcome {
            Ok(digests) => {
                tracing::info!(rule = %f.rule, subject = %f.subject, ?digests, fault_to_sealed_ms = sealed_ms, "watch capture sealed");
                self.emit(
                    WatchEvent::new(WatchEventKind::Captured {
                        rule: f.rule.clone(),
                        kind: f.kind.as_str().into(),
                        subject: f.subject.clone(),
                        envelopes: digests,
                        fault_to_sealed_ms: sealed_ms,
                    })
                    .at(wall_time_now()),
                );
            }
            Err(e) => {
                tracing::warn!(rule = %f.rule, subject = %f.subject, error = %e, "watch capture failed");
                self.emit(
                    WatchEvent::new(WatchEventKind::Failed {
                        rule: f.rule.clone(),
                        kind: f.kind.as_str().into(),
                        subject: f.subject.clone(),
                        error: e,
                    })
                    .at(wall_time_now()),
                );
            }
        }
    }

    /// The `watch` member of `/v1/status` (and `GET /v1/watch`).
    pub fn status(&self) -> WatchStatus {
        let flight_recorder = lock(&self.flows).status_json();
        let inner = lock(&self.inner);
        let rules = inner
            .rules
            .iter()
            .map(|s| {
                let (state, reason) = match &s.availability {
                    Availability::Armed => (WireRuleState::Armed, None),
                    Availability::Unavailable(r) => (WireRuleState::Unavailable, Some(r.clone())),
                    Availability::Degraded(r) => (WireRuleState::Degraded, Some(r.clone())),
                };
                RuleStatus {
                    name: s.rule.name.clone(),
                    kind: s.rule.kind.as_str().to_string(),
                    state,
                    reason,
                    condition: condition_json(&s.rule),
                    window_ms: s.rule.window.as_millis() as u64,
                    max_per_subject_per_hour: s.rule.max_per_subject_per_hour,
                    max_per_hour: s.rule.max_per_hour,
                    fired_total: s.fired,
                    captured_total: s.captured,
                    failed_total: s.failed,
                    suppressed_total: s.suppressed_total(),
                    suppressed: s
                        .suppressed
                        .iter()
                        .map(|(k, v)| ((*k).to_string(), *v))
                        .collect(),
                    last_fired: s.last_fired.clone(),
                    last_envelope: s.last_envelope.clone(),
                    last_error: s.last_error.clone(),
                    longhorn: match &s.rule.condition {
                        Condition::LonghornRebuild(lh) => Some(s.longhorn.status_json(lh)),
                        _ => None,
                    },
                }
            })
            .collect();
        WatchStatus {
            rules,
            captures_running: inner.running.len() as u64,
            d_state_scan: inner
                .last_scan
                .map(|(threads, truncated, took_us)| DStateScan {
                    threads: threads as u64,
                    truncated,
                    took_us,
                }),
            flight_recorder,
        }
    }

    /// Add the rules' families, then the flight recorder's, to `/metrics`.
    pub fn write_metrics(&self, e: &mut Exposition) {
        {
            let inner = lock(&self.inner);
            for f in [RULE_ARMED, RULE_FIRED, RULE_CAPTURES, RULE_SUPPRESSED] {
                e.declare(f);
            }
            for s in &inner.rules {
                let (rule, kind) = (s.rule.name.as_str(), s.rule.kind.as_str());
                let armed = s.availability == Availability::Armed;
                e.sample(RULE_ARMED, &[("rule", rule), ("kind", kind)], armed);
                e.sample(RULE_FIRED, &[("rule", rule), ("kind", kind)], s.fired);
                for (outcome, v) in [("sealed", s.captured), ("failed", s.failed)] {
                    e.sample(
                        RULE_CAPTURES,
                        &[("rule", rule), ("kind", kind), ("outcome", outcome)],
                        v,
                    );
                }
                for &r in SUPPRESS_REASONS {
                    e.sample(
                        RULE_SUPPRESSED,
                        &[("rule", rule), ("kind", kind), ("reason", r)],
                        s.suppressed.get(r).copied().unwrap_or(0),
                    );
                }
            }
        }
        lock(&self.flows).write_metrics(e);
    }
}

const RULE_ARMED: Family = Family::gauge(
    "pstackd_watch_rule_armed",
    "1 when the watch rule's source is up and it can fire, 0 when unavailable (see /v1/status for the reason).",
);
const RULE_FIRED: Family = Family::counter(
    "pstackd_watch_fired_total",
    "Times the watch rule's condition became true.",
);
const RULE_CAPTURES: Family = Family::counter(
    "pstackd_watch_captures_total",
    "Captures started by the watch rule, by outcome.",
);
const RULE_SUPPRESSED: Family = Family::counter(
    "pstackd_watch_suppressed_total",
    "Firings of the watch rule that started no capture, by reason.",
);

impl Default for WatchEngine {
    fn default() -> Self {
        WatchEngine::new()
    }
}

fn condition_json(rule: &WatchRule) -> Value {
    match &rule.condition {
        Condition::DState { min } => json!({"min_seconds": min.as_secs()}),
        Condition::TcpReset { ports } | Condition::TcpRto { ports } => {
            json!({"ports": format!("{}-{}", ports.0, ports.1)})
        }
        Condition::ListenOverflow {
            threshold_per_second,
        }
        | Condition::RetransmitRate {
            threshold_per_second,
        } => json!({"threshold_per_second": threshold_per_second}),
        Condition::LonghornRebuild(lh) => json!({
            "manager_url": lh.manager_url,
            "volumes": lh.volumes,
            "poll_seconds": lh.poll.as_secs(),
            "node": lh.node,
            "netns": lh.netns,
            "netns_pid": lh.netns_pid,
        }),
    }
}

/// What one tick read.
#[derive(Debug, Default)]
struct Readings {
    d_scan: Option<sample::DScan>,
    tcp: Option<Result<sample::TcpCounters, String>>,
    sampled_in: Duration,
}
