//! Assembly: from surfaces to a sealed envelope — completeness, claims bound
//! to surfaces, unknowns with probes, one next transition.
//!
//! Rules applied here (the envelope crate re-checks them at seal):
//! - `identity_race` wins: every read surface becomes `identity_race` with
//!   its facts withheld (digest kept), and no claim is made.
//! - otherwise `partial` if any surface is not ok/truncated, `bounded` if a
//!   surface was truncated or the universe was cut, else `complete`.
//! - a fact cites only ok/truncated surfaces; the universal
//!   `no_thread_in_d_state` is made only when `complete`.
//! - every timed-out, unreaped, denied, failed, skipped or raced surface
//!   raises an unknown with a probe.
//! - a mechanism read off a D thread's wait (`request_wait_answer`: a FUSE
//!   server not answering) is a hypothesis with its falsifier, never a fact.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use pstack_envelope::{
    Bounds, Claim, ClaimKind, Clock, Collector, Completeness, Envelope, NextTransition, SCHEMA_ID,
    Scope, StatusCause, Subject, Surface, SurfaceStatus, Termination, Universe, Unknown,
    sha256_digest,
};
use serde_json::{Map, Value};

use super::{CaptureRequest, Deadlines, SupervisorConfig};

/// Which flow produced the surfaces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// A process and its threads.
    Process,
    /// One thread.
    Thread,
    /// The whole host.
    Host,
}

/// Most unknowns listed one by one (the rest are summarized in one more).
const MAX_UNKNOWNS: usize = 200;
/// The kernel function a task waits in for a FUSE request to be answered.
const FUSE_WAIT: &str = "request_wait_answer";
/// Most per-thread D-state claims.
const MAX_D_CLAIMS: usize = 200;

/// An envelope being assembled.
#[derive(Debug)]
pub struct Assembly {
    mode: Mode,
    subject: Subject,
    collector: Collector,
    clock: Clock,
    universe: Universe,
    bounds: Bounds,
    /// Surfaces read.
    pub surfaces: Vec<Surface>,
    /// What changed, when the identity did.
    pub identity_race: Option<String>,
}

fn ok(s: &Surface) -> bool {
    matches!(s.status, SurfaceStatus::Ok | SurfaceStatus::Truncated)
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl Assembly {
    /// Start an assembly.
    #[allow(
        clippy::too_many_arguments,
        reason = "one call site; each argument is a distinct envelope part"
    )]
    pub fn new(
        mode: Mode,
        subject: Subject,
        config: &SupervisorConfig,
        request: &CaptureRequest,
        deadlines: Deadlines,
        leak_budget: u64,
        wall_time: String,
        monotonic_start_ns: u64,
    ) -> Assembly {
        Assembly {
            mode,
            subject,
            collector: Collector {
                name: config.collector_name.clone(),
                version: env!("CARGO_PKG_VERSION").to_string(),
                source_commit: config.source_commit.clone(),
            },
            clock: Clock {
                wall_time,
                monotonic_start_ns: monotonic_start_ns.to_string(),
                monotonic_end_ns: monotonic_start_ns.to_string(),
                bundle_deadline_ms: ms(deadlines.bundle),
            },
            universe: Universe {
                selector: String::new(),
                selector_digest: sha256_digest(b""),
                expected_count: 0,
                observed_count: 0,
                termination: Termination::Exhausted,
            },
            bounds: Bounds {
                surface_deadline_ms: ms(deadlines.surface),
                bundle_deadline_ms: ms(deadlines.bundle),
                max_threads: request.max_threads,
                max_bytes_per_surface: request.max_bytes_per_surface,
                leak_budget,
            },
            surfaces: Vec::new(),
            identity_race: None,
        }
    }

    /// Declare the universe.
    pub fn set_universe(
        &mut self,
        selector: String,
        expected: u64,
        observed: u64,
        termination: Termination,
    ) {
        self.universe = Universe {
            selector_digest: sha256_digest(selector.as_bytes()),
            selector,
            expected_count: expected,
            observed_count: observed,
            termination,
        };
    }

    /// Sort surfaces: process-level first, then by thread id, then by name.
    pub fn order_surfaces(&mut self) {
        self.surfaces.sort_by_key(|s| {
            let mut parts = s.id.split('/');
            let scope = parts.next().unwrap_or_default().to_string();
            let n: u64 = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
            (scope != "proc", n, s.id.clone())
        });
    }

    /// Record the end of the capture.
    pub fn finish_clock(&mut self, monotonic_end_ns: u64, _started: Instant) {
        self.clock.monotonic_end_ns = monotonic_end_ns.to_string();
    }

    fn target_command(&self) -> String {
        crate::probes::capture_again(&self.subject)
    }

    fn completeness(&self) -> Completeness {
        if self.identity_race.is_some() {
            Completeness::IdentityRace
        } else if self.surfaces.iter().any(|s| !ok(s)) {
            Completeness::Partial
        } else if self.surfaces.iter().any(|s| s.truncated)
            || self.universe.termination != Termination::Exhausted
        {
            Completeness::Bounded
        } else {
            Completeness::Complete
        }
    }

    /// Build claims, unknowns and the next transition, and seal.
    pub fn seal(mut self) -> Result<Envelope, pstack_envelope::Rejection> {
        if let Some(why) = &self.identity_race {
            for s in &mut self.surfaces {
                if ok(s) {
                    s.status = SurfaceStatus::IdentityRace;
                    s.cause = Some(StatusCause {
                        errno: None,
                        message: format!("{why}; facts withheld"),
                    });
                    s.facts = Map::new();
                }
            }
        }
        let completeness = self.completeness();
        let (claims, d_threads) = if completeness == Completeness::IdentityRace {
            (Vec::new(), Vec::new())
        } else {
            match self.mode {
                Mode::Host => self.host_claims(completeness),
                Mode::Process | Mode::Thread => self.task_claims(completeness),
            }
        };
        let unknowns = self.unknowns();
        let frozen = claims
            .iter()
            .find(|c| c.code == "d_state_from_cgroup_freezer")
            .map(|c| c.statement.clone());
        let next_transition = self.next_transition(&d_threads, &unknowns, frozen);
        Envelope {
            schema: SCHEMA_ID.to_string(),
            completeness,
            subject: self.subject,
            collector: self.collector,
            clock: self.clock,
            universe: self.universe,
            bounds: self.bounds,
            surfaces: self.surfaces,
            claims,
            unknowns,
            next_transition,
            digest: String::new(),
        }
        .seal()
    }

    fn surface(&self, id: &str) -> Option<&Surface> {
        self.surfaces.iter().find(|s| s.id == id)
    }

    /// Claims of a process/thread capture, and a description of each D thread.
    fn task_claims(&self, completeness: Completeness) -> (Vec<Claim>, Vec<String>) {
        let index: BTreeMap<&str, &Surface> =
            self.surfaces.iter().map(|s| (s.id.as_str(), s)).collect();
        let mut by_state: BTreeMap<String, Vec<(u64, &Surface)>> = BTreeMap::new();
        for s in self
            .surfaces
            .iter()
            .filter(|s| ok(s) && s.id.starts_with("task/") && s.id.ends_with("/stat"))
        {
            let Some(state) = s.facts.get("state").and_then(Value::as_str) else {
                continue;
            };
            let tid = s.facts.get("pid").and_then(Value::as_u64).unwrap_or(0);
            by_state
                .entry(state.to_string())
                .or_default()
                .push((tid, s));
        }
        let mut claims = Vec::new();
        let mut d_threads = Vec::new();
        for (state, members) in &by_state {
            let tids: Vec<String> = members
                .iter()
                .take(20)
                .map(|(t, _)| t.to_string())
                .collect();
            let more = if members.len() > 20 {
                format!(" and {} more", members.len() - 20)
            } else {
                String::new()
            };
            claims.push(Claim {
                id: format!("state-{state}"),
                kind: ClaimKind::Fact,
                code: format!("threads_in_state_{}", state_code(state)),
                statement: format!(
                    "{} thread(s) in state {state} ({}): {}{more}",
                    members.len(),
                    state_name(state),
                    tids.join(", ")
                ),
                surfaces: members.iter().map(|(_, s)| s.id.clone()).collect(),
                scope: Scope::Existential,
                falsifier: None,
            });
        }
        for (tid, stat) in by_state
            .get("D")
            .map(Vec::as_slice)
            .unwrap_or_default()
            .iter()
            .take(MAX_D_CLAIMS)
        {
            let comm = stat
                .facts
                .get("comm")
                .and_then(Value::as_str)
                .unwrap_or("?");
            let mut bound = vec![stat.id.clone()];
            let mut detail = Vec::new();
            if let Some(w) = index
                .get(format!("task/{tid}/wchan").as_str())
                .filter(|s| ok(s))
            {
                bound.push(w.id.clone());
                detail.push(format!(
                    "wchan {}",
                    w.facts.get("wchan").and_then(Value::as_str).unwrap_or("-")
                ));
            }
            if let Some(sc) = index
                .get(format!("task/{tid}/syscall").as_str())
                .filter(|s| ok(s))
            {
                bound.push(sc.id.clone());
                let name = sc
                    .facts
                    .get("name")
                    .and_then(Value::as_str)
                    .map(str::to_string);
                let nr = sc
                    .facts
                    .get("nr")
                    .and_then(Value::as_i64)
                    .map(|n| n.to_string());
                let mode = sc.facts.get("mode").and_then(Value::as_str).unwrap_or("?");
                detail.push(format!(
                    "syscall {}",
                    name.or(nr).unwrap_or_else(|| mode.to_string())
                ));
            }
            if let Some(st) = index
                .get(format!("task/{tid}/stack").as_str())
                .filter(|s| ok(s))
            {
                bound.push(st.id.clone());
                if let Some(top) = st
                    .facts
                    .get("frames")
                    .and_then(Value::as_array)
                    .and_then(|f| f.first())
                    .and_then(Value::as_str)
                {
                    detail.push(format!("top frame {top}"));
                }
            }
            let text = format!(
                "thread {tid} ({comm}) is in D{}{}",
                if detail.is_empty() { "" } else { ", " },
                detail.join(", ")
            );
            d_threads.push(text.clone());
            claims.push(Claim {
                id: format!("d-{tid}"),
                kind: ClaimKind::Fact,
                code: "thread_in_d_state".into(),
                statement: text,
                surfaces: bound,
                scope: Scope::Existential,
                falsifier: None,
            });
            // A FUSE request the server has not answered: the thread waits
            // in the kernel's FUSE request path. That names a mechanism, not
            // a fact about the server, so it is a hypothesis.
            let fuse_wait = |sid: &str, key: &str| {
                index.get(sid).filter(|s| ok(s)).and_then(|s| {
                    let v = s.facts.get(key)?;
                    let hit = match v {
                        Value::String(w) => w == FUSE_WAIT,
                        Value::Array(frames) => frames
                            .first()
                            .and_then(Value::as_str)
                            .is_some_and(|f| f.contains(FUSE_WAIT)),
                        _ => false,
                    };
                    hit.then(|| s.id.clone())
                })
            };
            let fuse_bound: Vec<String> = [
                fuse_wait(&format!("task/{tid}/wchan"), "wchan"),
                fuse_wait(&format!("task/{tid}/stack"), "frames"),
            ]
            .into_iter()
            .flatten()
            .collect();
            if !fuse_bound.is_empty() {
                claims.push(Claim {
                    id: format!("fuse-{tid}"),
                    kind: ClaimKind::Hypothesis,
                    code: "fuse_server_not_answering".into(),
                    statement: format!(
                        "thread {tid} ({comm}) is in D waiting for a FUSE request to be answered ({FUSE_WAIT}): the FUSE server of that mount is not answering"
                    ),
                    surfaces: std::iter::once(stat.id.clone()).chain(fuse_bound).collect(),
                    scope: Scope::Existential,
                    falsifier: Some(format!(
                        "the FUSE server's own threads (the process holding /dev/fuse for the mount) are running or reading /dev/fuse, not stopped or in D, while thread {tid} stays in {FUSE_WAIT}"
                    )),
                });
            }
            if let Some(fz) = index
                .get("proc/freezer")
                .filter(|s| ok(s) && s.facts.get("state").and_then(Value::as_str) != Some("thawed"))
            {
                let cg = fz
                    .facts
                    .get("cgroup")
                    .and_then(Value::as_str)
                    .unwrap_or("?");
                let state = fz.facts.get("state").and_then(Value::as_str).unwrap_or("?");
                let hierarchy = fz
                    .facts
                    .get("hierarchy")
                    .and_then(Value::as_str)
                    .unwrap_or("?");
                claims.push(Claim {
                    id: format!("frozen-{tid}"),
                    kind: ClaimKind::Inference,
                    code: "d_state_from_cgroup_freezer".into(),
                    statement: format!(
                        "thread {tid} is in D because its cgroup {cg} is {state} by the {hierarchy} freezer, not because it waits on I/O or a lock"
                    ),
                    surfaces: vec![stat.id.clone(), fz.id.clone()],
                    scope: Scope::Existential,
                    falsifier: None,
                });
            }
        }
        claims.extend(self.offcpu_claims(completeness));
        if completeness == Completeness::Complete && !by_state.contains_key("D") {
            let stats: Vec<String> = by_state
                .values()
                .flatten()
                .map(|(_, s)| s.id.clone())
                .collect();
            if !stats.is_empty() {
                claims.push(Claim {
                    id: "no-d".into(),
                    kind: ClaimKind::Fact,
                    code: "no_thread_in_d_state".into(),
                    statement: format!("no thread of the {} observed is in D", stats.len()),
                    surfaces: stats,
                    scope: Scope::Universal,
                    falsifier: None,
                });
            }
        }
        (claims, d_threads)
    }

    /// Claims from the `ebpf:offcpu` surface (when ok/truncated), about the
    /// subject's threads only: off-CPU time per state over the window, each D
    /// episode, and — only in a `complete` envelope with an `ok` surface — that
    /// no thread had a D episode in the window.
    fn offcpu_claims(&self, completeness: Completeness) -> Vec<Claim> {
        let Some(s) = self.surface(pstack_ebpf::OFFCPU_SURFACE).filter(|s| ok(s)) else {
            return Vec::new();
        };
        let mine = |v: &Value| -> bool {
            let tid = v.get("tid").and_then(Value::as_u64);
            let tgid = v.get("tgid").and_then(Value::as_u64);
            match &self.subject {
                Subject::Thread(t) => tid == Some(u64::from(t.tid)),
                Subject::Process(p) => tgid == Some(u64::from(p.pid)),
                _ => false,
            }
        };
        let list = |key: &str| -> Vec<&Value> {
            s.facts
                .get(key)
                .and_then(Value::as_array)
                .map(|a| a.iter().filter(|v| mine(v)).collect())
                .unwrap_or_default()
        };
        let window_ms = s
            .facts
            .get("window_ms")
            .and_then(Value::as_u64)
            .unwrap_or(0);
        let mut claims = Vec::new();
        let tasks = list("tasks");
        let mut per_class: BTreeMap<String, u64> = BTreeMap::new();
        for t in &tasks {
            if let Some(m) = t.get("off_cpu_ns").and_then(Value::as_object) {
                for (class, ns) in m {
                    *per_class.entry(class.clone()).or_default() += ns.as_u64().unwrap_or(0);
                }
            }
        }
        let text: Vec<String> = per_class
            .iter()
            .filter(|(_, ns)| **ns > 0)
            .map(|(c, ns)| format!("{c} {} ms", ns / 1_000_000))
            .collect();
        claims.push(Claim {
            id: "offcpu-time".into(),
            kind: ClaimKind::Fact,
            code: "offcpu_time_in_window".into(),
            statement: if tasks.is_empty() {
                format!(
                    "no thread of the subject switched off CPU during the {window_ms} ms window (each stayed where it was: on CPU, or asleep since before the window)"
                )
            } else {
                format!(
                    "in the {window_ms} ms window, {} thread(s) of the subject switched off CPU; time off CPU by state: {}",
                    tasks.len(),
                    if text.is_empty() {
                        "under 1 ms".to_string()
                    } else {
                        text.join(", ")
                    }
                )
            },
            surfaces: vec![s.id.clone()],
            scope: Scope::Existential,
            falsifier: None,
        });
        let episodes = list("d_episodes");
        for (i, e) in episodes.iter().take(MAX_D_CLAIMS).enumerate() {
            let tid = e.get("tid").and_then(Value::as_u64).unwrap_or(0);
            let comm = e.get("comm").and_then(Value::as_str).unwrap_or("");
            let dur = e.get("duration_ns").and_then(Value::as_u64).unwrap_or(0);
            let start = e.get("start_t_ns").and_then(Value::as_i64).unwrap_or(0);
            let flag = |k: &str| e.get(k).and_then(Value::as_bool).unwrap_or(false);
            let mut notes = Vec::new();
            if flag("since_before_watch") {
                notes.push(
                    "already in D when watching began (the length is a lower bound)".to_string(),
                );
            }
            if flag("ongoing") {
                notes.push("still in D at the window's end".to_string());
            }
            if flag("frozen") {
                notes
                    .push("frozen by the cgroup freezer, not waiting on I/O or a lock".to_string());
            }
            if let Some(top) = e
                .get("stack")
                .and_then(Value::as_array)
                .and_then(|a| a.first())
                .and_then(Value::as_str)
            {
                notes.push(format!("switched out at {top}"));
            }
            let who = if comm.is_empty() {
                format!("thread {tid}")
            } else {
                format!("thread {tid} ({comm})")
            };
            claims.push(Claim {
                id: format!("d-episode-{i}"),
                kind: ClaimKind::Fact,
                code: "d_state_episode".into(),
                statement: format!(
                    "{who} was in D for {} ms{}{}{}",
                    dur / 1_000_000,
                    if flag("since_before_watch") {
                        String::new()
                    } else {
                        format!(" starting {} ms into the window", start / 1_000_000)
                    },
                    if notes.is_empty() { "" } else { "; " },
                    notes.join("; ")
                ),
                surfaces: vec![s.id.clone()],
                scope: Scope::Existential,
                falsifier: None,
            });
        }
        let dropped = s
            .facts
            .get("episodes_dropped")
            .and_then(Value::as_u64)
            .unwrap_or(0);
        if episodes.is_empty()
            && dropped == 0
            && completeness == Completeness::Complete
            && s.status == SurfaceStatus::Ok
        {
            claims.push(Claim {
                id: "no-d-episode".into(),
                kind: ClaimKind::Fact,
                code: "no_d_state_episode_in_window".into(),
                statement: format!(
                    "no thread of the subject had a D episode of at least {} ms in the {window_ms} ms window",
                    s.facts.get("d_min_ns").and_then(Value::as_u64).unwrap_or(0) / 1_000_000
                ),
                surfaces: vec![s.id.clone()],
                scope: Scope::Universal,
                falsifier: None,
            });
        }
        claims
    }

    /// Claims of a host capture.
    fn host_claims(&self, completeness: Completeness) -> (Vec<Claim>, Vec<String>) {
        let mut counts: BTreeMap<String, u64> = BTreeMap::new();
        let mut bound = Vec::new();
        let mut claims = Vec::new();
        let mut d_threads = Vec::new();
        for s in self
            .surfaces
            .iter()
            .filter(|s| ok(s) && s.id.ends_with("/tasks"))
        {
            bound.push(s.id.clone());
            let pid = s
                .facts
                .get("process")
                .and_then(|p| p.get("pid"))
                .and_then(Value::as_u64)
                .unwrap_or(0);
            let wchan_id = format!("proc/{pid}/wchan");
            let wchans: BTreeMap<u64, String> = self
                .surface(&wchan_id)
                .filter(|w| ok(w))
                .and_then(|w| w.facts.get("threads").and_then(Value::as_array))
                .map(|a| {
                    a.iter()
                        .filter_map(|t| {
                            Some((
                                t.get("tid")?.as_u64()?,
                                t.get("wchan")?.as_str()?.to_string(),
                            ))
                        })
                        .collect()
                })
                .unwrap_or_default();
            for t in s
                .facts
                .get("threads")
                .and_then(Value::as_array)
                .map(Vec::as_slice)
                .unwrap_or_default()
            {
                let Some(state) = t.get("state").and_then(Value::as_str) else {
                    continue;
                };
                *counts.entry(state.to_string()).or_default() += 1;
                if state == "D" && d_threads.len() < MAX_D_CLAIMS {
                    let tid = t.get("tid").and_then(Value::as_u64).unwrap_or(0);
                    let comm = t.get("comm").and_then(Value::as_str).unwrap_or("?");
                    let mut surfaces = vec![s.id.clone()];
                    let wchan = match wchans.get(&tid) {
                        Some(w) => {
                            surfaces.push(wchan_id.clone());
                            format!(", wchan {w}")
                        }
                        None => String::new(),
                    };
                    let text = format!("thread {tid} ({comm}) of pid {pid} is in D{wchan}");
                    d_threads.push(text.clone());
                    claims.push(Claim {
                        id: format!("d-{pid}-{tid}"),
                        kind: ClaimKind::Fact,
                        code: "thread_in_d_state".into(),
                        statement: text,
                        surfaces,
                        scope: Scope::Existential,
                        falsifier: None,
                    });
                }
            }
        }
        if !bound.is_empty() {
            let text: Vec<String> = counts.iter().map(|(k, v)| format!("{k} {v}")).collect();
            claims.insert(
                0,
                Claim {
                    id: "state-counts".into(),
                    kind: ClaimKind::Fact,
                    code: "thread_state_counts".into(),
                    statement: format!("observed threads by state: {}", text.join(", ")),
                    surfaces: bound.clone(),
                    scope: Scope::Existential,
                    falsifier: None,
                },
            );
        }
        if completeness == Completeness::Complete && !counts.contains_key("D") && !bound.is_empty()
        {
            claims.push(Claim {
                id: "no-d".into(),
                kind: ClaimKind::Fact,
                code: "no_thread_in_d_state".into(),
                statement: "no thread on the host is in D".into(),
                surfaces: bound,
                scope: Scope::Universal,
                falsifier: None,
            });
        }
        (claims, d_threads)
    }

    fn unknowns(&self) -> Vec<Unknown> {
        let owner = match &self.subject {
            Subject::Process(p) => format!("operator of {}", p.host),
            Subject::Thread(t) => format!("operator of {}", t.process.host),
            Subject::Host(h) => format!("operator of {}", h.host),
            _ => "operator".into(),
        };
        let again = self.target_command();
        let mut out = Vec::new();
        if let Some(why) = &self.identity_race {
            out.push(Unknown {
                id: "u-identity".into(),
                question: format!("Is the subject still the process first observed? ({why})"),
                blocks: "ATTRIBUTE_EVIDENCE".into(),
                owner: owner.clone(),
                probe: again.clone(),
                surface: None,
            });
        }
        let mut ebpf_failed = 0;
        for s in self.surfaces.iter().filter(|s| {
            s.id.starts_with("ebpf:") && !ok(s) && s.status != SurfaceStatus::IdentityRace
        }) {
            ebpf_failed += 1;
            let cause = s.cause.as_ref().map(|c| c.message.as_str()).unwrap_or("");
            let window = std::time::Duration::from_millis(s.deadline_ms.max(1));
            let (question, probe) = match s.status {
                SurfaceStatus::PermissionDenied => (
                    format!("How long were the subject's threads off CPU, and in D, during a window? (eBPF denied: {cause})"),
                    crate::probes::with_privilege(
                        &crate::probes::capture_window(&self.subject, window),
                        &crate::supervisor::denial::Caller::current(),
                    ),
                ),
                SurfaceStatus::Unsupported => (
                    format!("How long were the subject's threads off CPU, and in D, during a window? (eBPF unsupported here: {cause})"),
                    "ls -l /sys/kernel/btf/vmlinux; grep -E 'CONFIG_DEBUG_INFO_BTF|CONFIG_BPF_SYSCALL' /boot/config-$(uname -r)".into(),
                ),
                _ => (
                    format!("Why did the eBPF surface {} fail? ({cause})", s.id),
                    crate::probes::capture_window(&self.subject, window),
                ),
            };
            out.push(Unknown {
                id: format!("u-{}", s.id.replace([':', '/'], "-")),
                question,
                blocks: "CLASSIFY_BLOCKING".into(),
                owner: owner.clone(),
                probe,
                surface: Some(s.id.clone()),
            });
        }
        let failed: Vec<&Surface> = self
            .surfaces
            .iter()
            .filter(|s| !s.id.starts_with("ebpf:"))
            .filter(|s| {
                matches!(
                    s.status,
                    SurfaceStatus::Timeout
                        | SurfaceStatus::TimeoutUnreapedHelper
                        | SurfaceStatus::PermissionDenied
                        | SurfaceStatus::Error
                        | SurfaceStatus::Skipped
                ) || (s.status == SurfaceStatus::IdentityRace && self.identity_race.is_none())
            })
            .collect();
        for s in failed.iter().take(MAX_UNKNOWNS.saturating_sub(ebpf_failed)) {
            let path = s
                .authority
                .strip_prefix("procfs:")
                .unwrap_or(&s.authority)
                .to_string();
            let look = if path.ends_with("/fd/*") {
                format!("ls -l {}", path.trim_end_matches('*'))
            } else {
                format!("cat {path}")
            };
            let cause = s.cause.as_ref().map(|c| c.message.as_str()).unwrap_or("");
            let (question, probe) = match s.status {
                SurfaceStatus::Timeout => (
                    format!(
                        "What does {path} show when given longer than {} ms?",
                        s.deadline_ms
                    ),
                    format!("timeout -s KILL 30 {look}"),
                ),
                SurfaceStatus::TimeoutUnreapedHelper => {
                    let helper = cause
                        .split("helper pid ")
                        .nth(1)
                        .and_then(|r| r.split_whitespace().next())
                        .unwrap_or("?");
                    (
                        format!(
                            "Why is the helper (pid {helper}) that read {path} stuck, and what does {path} hold?"
                        ),
                        format!(
                            "cat /proc/{helper}/stack; grep -E 'State|Cgroup' /proc/{helper}/status; cat /proc/{helper}/cgroup"
                        ),
                    )
                }
                SurfaceStatus::PermissionDenied => (
                    format!("What does {path} show to a caller allowed to read it?"),
                    crate::probes::with_privilege(
                        &again,
                        &crate::supervisor::denial::Caller::current(),
                    ),
                ),
                SurfaceStatus::Skipped if cause.contains("leak budget") => (
                    format!("What does {path} show once leaked helpers have exited?"),
                    format!("wait for the helpers journaled as leaked to exit, then {again}"),
                ),
                SurfaceStatus::Skipped => (
                    format!("What does {path} show with more time?"),
                    crate::probes::capture_longer(
                        &self.subject,
                        std::time::Duration::from_millis(
                            self.bounds.bundle_deadline_ms.saturating_mul(2),
                        ),
                    ),
                ),
                SurfaceStatus::IdentityRace => (
                    format!("Which process does {path} belong to now? ({cause})"),
                    look.clone(),
                ),
                _ => (
                    format!("Why did reading {path} fail? ({cause})"),
                    look.clone(),
                ),
            };
            out.push(Unknown {
                id: format!("u-{}", s.id.replace('/', "-")),
                question,
                blocks: "CLASSIFY_BLOCKING".into(),
                owner: owner.clone(),
                probe,
                surface: Some(s.id.clone()),
            });
        }
        if failed.len() + ebpf_failed > MAX_UNKNOWNS {
            out.push(Unknown {
                id: "u-more".into(),
                question: format!(
                    "{} more surfaces did not succeed: what do they show?",
                    failed.len() + ebpf_failed - MAX_UNKNOWNS
                ),
                blocks: "CLASSIFY_BLOCKING".into(),
                owner,
                probe: crate::probes::capture_failed_surfaces(&self.subject),
                surface: None,
            });
        }
        out
    }

    fn next_transition(
        &self,
        d_threads: &[String],
        unknowns: &[Unknown],
        frozen: Option<String>,
    ) -> NextTransition {
        let again = self.target_command();
        if self.identity_race.is_some() {
            return NextTransition {
                action: "CAPTURE_AGAIN".into(),
                success_receipt: "an envelope whose two identity reads agree".into(),
                abort_conditions: vec!["the subject keeps exiting or being replaced: capture its parent or the host instead".into()],
            };
        }
        if let Some(why) = frozen {
            return NextTransition {
                action: "INSPECT_FREEZER_OWNER".into(),
                success_receipt: format!(
                    "the agent that froze the cgroup is named, or after it thaws a new capture shows the thread out of D ({why})"
                ),
                abort_conditions: vec![
                    "the cgroup thaws on its own (capture again and diff)".into(),
                    "the identity changes".into(),
                ],
            };
        }
        if let Some(first) = d_threads.first() {
            return NextTransition {
                action: "INSPECT_BLOCKING_WAIT".into(),
                success_receipt: format!("the owner of the wait is named with evidence ({first})"),
                abort_conditions: vec![
                    "the thread leaves D before inspection (capture again and diff)".into(),
                    "the identity changes".into(),
                ],
            };
        }
        if let Some(u) = unknowns.first() {
            return NextTransition {
                action: "RESOLVE_UNKNOWN".into(),
                success_receipt: format!("unknown {} answered by its probe: {}", u.id, u.probe),
                abort_conditions: vec![
                    "the probe itself blocks past its own deadline".into(),
                    "the identity changes".into(),
                ],
            };
        }
        NextTransition {
            action: "CAPTURE_AGAIN_AFTER_CHANGE".into(),
            success_receipt: format!(
                "`pstackctl envelope diff` of this envelope and a later `{again}` shows the change"
            ),
            abort_conditions: vec!["the identity changes (a new process is a new subject)".into()],
        }
    }
}

fn state_code(letter: &str) -> &'static str {
    match letter {
        "R" => "running",
        "S" => "sleeping",
        "D" => "uninterruptible",
        "Z" => "zombie",
        "T" => "stopped",
        "t" => "tracing_stop",
        "X" => "dead",
        "I" => "idle",
        "P" => "parked",
        _ => "unknown",
    }
}

fn state_name(letter: &str) -> &'static str {
    match letter {
        "D" => "uninterruptible sleep",
        "R" => "running",
        "S" => "sleeping",
        "Z" => "zombie",
        "T" => "stopped",
        "t" => "tracing stop",
        "X" => "dead",
        "I" => "idle",
        "P" => "parked",
        _ => "unknown",
    }
}

#[cfg(test)]
mod tests {
    //! The process claim rules: for every code, surfaces that produce it and
    //! a near miss that does not. No root, no /proc: surfaces are built here.

    use super::*;
    use serde_json::json;

    fn surface(id: &str, facts: Value) -> Surface {
        Surface {
            id: id.into(),
            authority: format!("procfs:/proc/{id}"),
            status: SurfaceStatus::Ok,
            cause: None,
            deadline_ms: 250,
            elapsed_us: 3,
            digest: Some(sha256_digest(id.as_bytes())),
            bytes: 10,
            truncated: false,
            facts: facts.as_object().cloned().unwrap_or_default(),
        }
    }

    fn stat(tid: u64, state: &str) -> Surface {
        surface(
            &format!("task/{tid}/stat"),
            json!({"pid": tid, "state": state, "comm": "worker"}),
        )
    }

    fn assembly(surfaces: Vec<Surface>) -> Assembly {
        let e = pstack_envelope::example::example_unsealed();
        Assembly {
            mode: Mode::Process,
            subject: e.subject,
            collector: e.collector,
            clock: e.clock,
            universe: e.universe,
            bounds: e.bounds,
            surfaces,
            identity_race: None,
        }
    }

    fn codes(surfaces: Vec<Surface>) -> Vec<String> {
        let a = assembly(surfaces);
        a.task_claims(a.completeness())
            .0
            .into_iter()
            .map(|c| c.code)
            .collect()
    }

    fn d_thread_with(extra: Vec<Surface>) -> Vec<Surface> {
        let mut v = vec![stat(11, "S"), stat(12, "D")];
        v.extend(extra);
        v
    }

    #[test]
    fn every_process_claim_code_has_surfaces_that_produce_it_and_a_near_miss() {
        let wchan = |w: &str| surface("task/12/wchan", json!({"wchan": w}));
        let stack = |top: &str| {
            surface(
                "task/12/stack",
                json!({"frames": [top, "fuse_simple_request"]}),
            )
        };
        let freezer = |state: &str| {
            surface(
                "proc/freezer",
                json!({"state": state, "cgroup": "/jail", "hierarchy": "v1"}),
            )
        };
        let mut unread_stat = stat(11, "S");
        unread_stat.status = SurfaceStatus::Timeout;
        let table: Vec<(&str, Vec<Surface>, Vec<Surface>)> = vec![
            (
                "threads_in_state_uninterruptible",
                d_thread_with(vec![]),
                vec![stat(11, "S")],
            ),
            (
                "thread_in_d_state",
                d_thread_with(vec![]),
                vec![stat(12, "R")],
            ),
            (
                "fuse_server_not_answering",
                d_thread_with(vec![wchan("request_wait_answer")]),
                // In D on another wait: not FUSE.
                d_thread_with(vec![wchan("io_schedule")]),
            ),
            (
                "fuse_server_not_answering",
                d_thread_with(vec![stack("request_wait_answer+0x1a/0x60")]),
                // The FUSE frame below the top is not where it waits.
                d_thread_with(vec![stack("folio_wait_bit_common+0x10/0x30")]),
            ),
            (
                "d_state_from_cgroup_freezer",
                d_thread_with(vec![freezer("FROZEN")]),
                d_thread_with(vec![freezer("thawed")]),
            ),
            (
                "no_thread_in_d_state",
                vec![stat(11, "S"), stat(12, "R")],
                // A surface not read: not complete, so nothing universal.
                vec![unread_stat, stat(12, "R")],
            ),
        ];
        for (code, hit, miss) in table {
            let a = assembly(hit.clone());
            let (claims, _) = a.task_claims(a.completeness());
            assert!(
                claims.iter().any(|c| c.code == code),
                "{code}: not produced: {:?}",
                claims.iter().map(|c| &c.code).collect::<Vec<_>>()
            );
            assert!(
                !codes(miss).contains(&code.to_string()),
                "{code}: near miss"
            );
            for c in &claims {
                assert_eq!(
                    c.kind == ClaimKind::Hypothesis,
                    c.falsifier.is_some(),
                    "{}: a hypothesis and only a hypothesis has a falsifier",
                    c.code
                );
                for s in &c.surfaces {
                    let sf = hit
                        .iter()
                        .find(|x| x.id == *s)
                        .expect("bound surface exists");
                    assert!(ok(sf), "{}: binds unread {s}", c.code);
                }
            }
        }
    }

    fn offcpu(tasks: Value, episodes: Value, dropped: u64) -> Surface {
        // The example subject is process 4242.
        surface(
            pstack_ebpf::OFFCPU_SURFACE,
            json!({"window_ms": 1000, "d_min_ns": 1_000_000, "tasks": tasks,
                   "d_episodes": episodes, "episodes_dropped": dropped}),
        )
    }

    #[test]
    fn every_offcpu_claim_code_has_surfaces_that_produce_it_and_a_near_miss() {
        let task = |tgid: u64| json!([{"tid": 4243, "tgid": tgid, "off_cpu_ns": {"D": 5_000_000}}]);
        let episode = |tgid: u64| {
            json!([{"tid": 4243, "tgid": tgid, "comm": "db", "duration_ns": 20_000_000,
                    "start_t_ns": 100}])
        };
        let mut unread = stat(11, "S");
        unread.status = SurfaceStatus::PermissionDenied;
        let table: Vec<(&str, Vec<Surface>, Vec<Surface>)> = vec![
            (
                "offcpu_time_in_window",
                vec![stat(4243, "S"), offcpu(task(4242), json!([]), 0)],
                // The off-CPU surface was not read.
                vec![stat(4243, "S"), {
                    let mut s = offcpu(task(4242), json!([]), 0);
                    s.status = SurfaceStatus::PermissionDenied;
                    s
                }],
            ),
            (
                "d_state_episode",
                vec![stat(4243, "S"), offcpu(task(4242), episode(4242), 0)],
                // An episode of another process is not this subject's.
                vec![stat(4243, "S"), offcpu(task(4242), episode(999), 0)],
            ),
            (
                "no_d_state_episode_in_window",
                vec![stat(4243, "S"), offcpu(task(4242), json!([]), 0)],
                // Episodes were dropped: absence is not shown.
                vec![stat(4243, "S"), offcpu(task(4242), json!([]), 3)],
            ),
            (
                "no_d_state_episode_in_window",
                vec![stat(4243, "S"), offcpu(task(4242), json!([]), 0)],
                // Not complete: no universal claim.
                vec![unread, stat(4243, "S"), offcpu(task(4242), json!([]), 0)],
            ),
        ];
        for (code, hit, miss) in table {
            assert!(
                codes(hit).contains(&code.to_string()),
                "{code}: not produced"
            );
            assert!(
                !codes(miss).contains(&code.to_string()),
                "{code}: near miss"
            );
        }
    }

    fn host(surfaces: Vec<Surface>) -> Vec<String> {
        let mut a = assembly(surfaces);
        a.mode = Mode::Host;
        a.host_claims(a.completeness())
            .0
            .into_iter()
            .map(|c| c.code)
            .collect()
    }

    #[test]
    fn every_host_claim_code_has_surfaces_that_produce_it_and_a_near_miss() {
        let tasks = |pid: u64, states: &[&str]| {
            let threads: Vec<Value> = states
                .iter()
                .enumerate()
                .map(|(i, st)| json!({"tid": pid + i as u64, "state": st, "comm": "w"}))
                .collect();
            surface(
                &format!("proc/{pid}/tasks"),
                json!({"process": {"pid": pid}, "threads": threads}),
            )
        };
        let mut unread = tasks(30, &["S"]);
        unread.status = SurfaceStatus::Timeout;
        let table: Vec<(&str, Vec<Surface>, Vec<Surface>)> = vec![
            (
                "thread_in_d_state",
                vec![tasks(10, &["S", "D"])],
                vec![tasks(10, &["S", "R"])],
            ),
            (
                "thread_state_counts",
                vec![tasks(10, &["S"])],
                // No tasks surface was read: nothing is counted.
                vec![unread.clone()],
            ),
            (
                "no_thread_in_d_state",
                vec![tasks(10, &["S", "R"]), tasks(20, &["S"])],
                vec![tasks(10, &["S", "R"]), unread],
            ),
        ];
        for (code, hit, miss) in table {
            assert!(
                host(hit).contains(&code.to_string()),
                "{code}: not produced"
            );
            assert!(!host(miss).contains(&code.to_string()), "{code}: near miss");
        }
    }

    #[test]
    fn a_fuse_wait_is_a_hypothesis_never_a_fact() {
        let a = assembly(d_thread_with(vec![surface(
            "task/12/wchan",
            json!({"wchan": "request_wait_answer"}),
        )]));
        let (claims, _) = a.task_claims(a.completeness());
        let fuse = claims
            .iter()
            .find(|c| c.code == "fuse_server_not_answering")
            .unwrap();
        assert_eq!(fuse.kind, ClaimKind::Hypothesis);
        assert_eq!(fuse.surfaces, ["task/12/stat", "task/12/wchan"]);
        assert!(fuse.falsifier.as_deref().unwrap().contains("/dev/fuse"));
        // The thread's D state stays a fact of its own.
        assert!(
            claims
                .iter()
                .any(|c| c.code == "thread_in_d_state" && c.kind == ClaimKind::Fact)
        );
        // And the whole envelope seals.
        a.seal().expect("seals");
    }
}
