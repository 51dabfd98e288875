//! The claim rules of process, thread and host captures: pure functions of
//! typed readings ([`super::assemble_readings`]) and the envelope's
//! completeness. No I/O, no surface JSON read back by key.
//!
//! Invariants:
//! - A fact or inference binds only surfaces whose readings it used, and
//!   every reading here is of a surface that was read (the view drops the
//!   rest), so no fact binds an unread surface.
//! - A universal claim (`no_thread_in_d_state`,
//!   `no_d_state_episode_in_window`) is made only in a `complete` envelope.
//! - A mechanism read off a D thread's wait is a hypothesis with its
//!   falsifier, never a fact: `request_wait_answer` → the FUSE server is not
//!   answering; `__refrigerator` without a freezer reading that shows the
//!   cgroup frozen → its cgroup is frozen.

use std::collections::BTreeMap;

use pstack_collectors::procfs::parse::{SyscallFacts, TaskState};
use pstack_envelope::{Claim, ClaimCode, ClaimKind, Completeness, Scope, Subject};

use super::assemble_readings::{
    HostReadings, OffCpuReading, ProcFile, SurfaceId, TaskFile, TaskReadings, ThreadReadings,
};

/// The kernel function a task waits in for a FUSE request to be answered.
pub const FUSE_WAIT: &str = "request_wait_answer";
/// The kernel functions a task waits in while its cgroup is frozen
/// (`__refrigerator`: cgroup v1 and v2 on current kernels; `do_freezer_trap`:
/// the v2 trap on older ones).
pub const FREEZER_WAITS: [&str; 2] = ["__refrigerator", "do_freezer_trap"];
/// Most per-thread D-state claims.
pub const MAX_D_CLAIMS: usize = 200;

/// The claim code of "threads in state `state`".
pub fn threads_in_state(state: TaskState) -> ClaimCode {
    match state {
        TaskState::Running => ClaimCode::ThreadsInStateRunning,
        TaskState::Sleeping => ClaimCode::ThreadsInStateSleeping,
        TaskState::DiskSleep => ClaimCode::ThreadsInStateUninterruptible,
        TaskState::Zombie => ClaimCode::ThreadsInStateZombie,
        TaskState::Stopped => ClaimCode::ThreadsInStateStopped,
        TaskState::TracingStop => ClaimCode::ThreadsInStateTracingStop,
        TaskState::Dead => ClaimCode::ThreadsInStateDead,
        TaskState::Idle => ClaimCode::ThreadsInStateIdle,
        TaskState::Parked => ClaimCode::ThreadsInStateParked,
    }
}

/// Claims of a process or thread capture, and a description of each D
/// thread (for the next transition).
pub fn task_claims(
    r: &TaskReadings,
    subject: &Subject,
    completeness: Completeness,
) -> (Vec<Claim>, Vec<String>) {
    // Keyed by the state's letter: claims come in the letters' order.
    let mut by_state: BTreeMap<char, (TaskState, Vec<u32>)> = BTreeMap::new();
    for (tid, t) in &r.threads {
        if let Some(stat) = &t.stat {
            by_state
                .entry(stat.state.letter())
                .or_insert_with(|| (stat.state, Vec::new()))
                .1
                .push(*tid);
        }
    }
    let stat_id = |tid: u32| SurfaceId::Task(tid, TaskFile::Stat).to_string();
    let mut claims = Vec::new();
    let mut d_threads = Vec::new();
    for (&letter, (state, tids)) in &by_state {
        let shown: Vec<String> = tids.iter().take(20).map(u32::to_string).collect();
        let more = if tids.len() > 20 {
            format!(" and {} more", tids.len() - 20)
        } else {
            String::new()
        };
        claims.push(Claim {
            id: format!("state-{letter}"),
            kind: ClaimKind::Fact,
            code: threads_in_state(*state).into(),
            statement: format!(
                "{} thread(s) in state {letter} ({}): {}{more}",
                tids.len(),
                state_name(*state),
                shown.join(", ")
            ),
            surfaces: tids.iter().map(|t| stat_id(*t)).collect(),
            scope: Scope::Existential,
            falsifier: None,
        });
    }
    let d_tids = by_state
        .get(&'D')
        .map(|(_, tids)| tids.as_slice())
        .unwrap_or_default();
    for &tid in d_tids.iter().take(MAX_D_CLAIMS) {
        let t = &r.threads[&tid];
        let (claim, text) = d_thread_claim(tid, t);
        d_threads.push(text);
        claims.push(claim);
        claims.extend(fuse_hypothesis(tid, t));
        claims.extend(freezer_claim(tid, t, r));
    }
    if let Some((offcpu, surface_ok)) = &r.offcpu {
        claims.extend(offcpu_claims(offcpu, *surface_ok, subject, completeness));
    }
    if completeness == Completeness::Complete && d_tids.is_empty() {
        let stats: Vec<String> = by_state
            .values()
            .flat_map(|(_, tids)| tids)
            .map(|t| stat_id(*t))
            .collect();
        if !stats.is_empty() {
            claims.push(Claim {
                id: "no-d".into(),
                kind: ClaimKind::Fact,
                code: ClaimCode::NoThreadInDState.into(),
                statement: format!("no thread of the {} observed is in D", stats.len()),
                surfaces: stats,
                scope: Scope::Universal,
                falsifier: None,
            });
        }
    }
    (claims, d_threads)
}

/// The fact that `tid` is in D, with what its other readings say of the wait.
fn d_thread_claim(tid: u32, t: &ThreadReadings) -> (Claim, String) {
    let comm = t.stat.as_ref().map_or("?", |s| s.comm.as_str());
    let mut bound = vec![SurfaceId::Task(tid, TaskFile::Stat).to_string()];
    let mut detail = Vec::new();
    if let Some(w) = &t.wchan {
        bound.push(SurfaceId::Task(tid, TaskFile::Wchan).to_string());
        detail.push(format!("wchan {}", w.wchan.as_deref().unwrap_or("-")));
    }
    if let Some(sc) = &t.syscall {
        bound.push(SurfaceId::Task(tid, TaskFile::Syscall).to_string());
        detail.push(format!(
            "syscall {}",
            match sc {
                SyscallFacts::InSyscall { name: Some(n), .. } => n.clone(),
                SyscallFacts::InSyscall { nr, name: None } => nr.to_string(),
                SyscallFacts::Running => "running".into(),
                SyscallFacts::NotInSyscall => "not_in_syscall".into(),
            }
        ));
    }
    if let Some(st) = &t.stack {
        bound.push(SurfaceId::Task(tid, TaskFile::Stack).to_string());
        if let Some(top) = st.frames.first() {
            detail.push(format!("top frame {top}"));
        }
    }
    let text = format!(
        "thread {tid} ({comm}) is in D{}{}",
        if detail.is_empty() { "" } else { ", " },
        detail.join(", ")
    );
    let claim = Claim {
        id: format!("d-{tid}"),
        kind: ClaimKind::Fact,
        code: ClaimCode::ThreadInDState.into(),
        statement: text.clone(),
        surfaces: bound,
        scope: Scope::Existential,
        falsifier: None,
    };
    (claim, text)
}

/// The surfaces of `t` that show it waiting in one of `waits`: its `wchan`
/// naming one, or its stack's innermost frame (only where it waits, not
/// a frame below it).
fn waits_in(tid: u32, t: &ThreadReadings, waits: &[&str]) -> Vec<String> {
    let mut out = Vec::new();
    if t.wchan
        .as_ref()
        .and_then(|w| w.wchan.as_deref())
        .is_some_and(|w| waits.contains(&w))
    {
        out.push(SurfaceId::Task(tid, TaskFile::Wchan).to_string());
    }
    if t.stack
        .as_ref()
        .and_then(|s| s.frames.first())
        .is_some_and(|f| waits.iter().any(|w| f.contains(w)))
    {
        out.push(SurfaceId::Task(tid, TaskFile::Stack).to_string());
    }
    out
}

/// A FUSE request the server has not answered: the thread waits in the
/// kernel's FUSE request path. That names a mechanism, not a fact about the
/// server, so it is a hypothesis.
fn fuse_hypothesis(tid: u32, t: &ThreadReadings) -> Option<Claim> {
    let shown = waits_in(tid, t, &[FUSE_WAIT]);
    if shown.is_empty() {
        return None;
    }
    let comm = t.stat.as_ref().map_or("?", |s| s.comm.as_str());
    Some(Claim {
        id: format!("fuse-{tid}"),
        kind: ClaimKind::Hypothesis,
        code: ClaimCode::FuseServerNotAnswering.into(),
        statement: format!(
            "thread {tid} ({comm}) is in D waiting for a FUSE request to be answered ({FUSE_WAIT}): the FUSE server of that mount is not answering"
        ),
        surfaces: std::iter::once(SurfaceId::Task(tid, TaskFile::Stat).to_string())
            .chain(shown)
            .collect(),
        scope: Scope::Existential,
        falsifier: Some(format!(
            "the FUSE server's own threads (the process holding /dev/fuse for the mount) are running or reading /dev/fuse, not stopped or in D, while thread {tid} stays in {FUSE_WAIT}"
        )),
    })
}

/// The freezer and a D thread: with a freezer reading that is not `thawed`,
/// the inference that the freezer put it in D; without a freezer reading,
/// a thread waiting in the freezer's wait makes the frozen cgroup a
/// hypothesis, falsified by the freezer's own state file. A freezer reading
/// of `thawed` answers both: no claim.
fn freezer_claim(tid: u32, t: &ThreadReadings, r: &TaskReadings) -> Option<Claim> {
    let stat = SurfaceId::Task(tid, TaskFile::Stat).to_string();
    match &r.freezer {
        Some(fz) if fz.frozen() => Some(Claim {
            id: format!("frozen-{tid}"),
            kind: ClaimKind::Inference,
            code: ClaimCode::DStateFromCgroupFreezer.into(),
            statement: format!(
                "thread {tid} is in D because its cgroup {} is {} by the {} freezer, not because it waits on I/O or a lock",
                fz.cgroup, fz.state, fz.hierarchy
            ),
            surfaces: vec![stat, SurfaceId::Proc(ProcFile::Freezer).to_string()],
            scope: Scope::Existential,
            falsifier: None,
        }),
        Some(_) => None,
        None => {
            let shown = waits_in(tid, t, &FREEZER_WAITS);
            if shown.is_empty() {
                return None;
            }
            let cg = if r.cgroup.is_empty() {
                "its cgroup".to_string()
            } else {
                format!("its cgroup ({})", r.cgroup)
            };
            Some(Claim {
                id: format!("cgroup-frozen-{tid}"),
                kind: ClaimKind::Hypothesis,
                code: ClaimCode::CgroupFrozen.into(),
                statement: format!(
                    "thread {tid} is in D in the freezer's wait ({}): {cg} is frozen, not waiting on I/O or a lock",
                    FREEZER_WAITS[0]
                ),
                surfaces: std::iter::once(stat).chain(shown).collect(),
                scope: Scope::Existential,
                falsifier: Some(format!(
                    "the freezer of {cg} reads thawed while thread {tid} stays in D: `freezer.state` is THAWED (cgroup v1, /sys/fs/cgroup/freezer<cgroup>/freezer.state) or `cgroup.freeze` is 0 (cgroup v2, /sys/fs/cgroup<cgroup>/cgroup.freeze)"
                )),
            })
        }
    }
}

/// Claims from the `ebpf:offcpu` reading, about the subject's threads only:
/// off-CPU time per state over the window, each D episode, and — only in a
/// `complete` envelope with an `ok` surface — that no thread had a D episode
/// in the window.
pub fn offcpu_claims(
    o: &OffCpuReading,
    surface_ok: bool,
    subject: &Subject,
    completeness: Completeness,
) -> Vec<Claim> {
    let sid = SurfaceId::EbpfOffcpu.to_string();
    let mine = |tid: u32, tgid: u32| match subject {
        Subject::Thread(t) => tid == t.tid,
        Subject::Process(p) => tgid == p.pid,
        _ => false,
    };
    let tasks: Vec<_> = o.tasks.iter().filter(|t| mine(t.tid, t.tgid)).collect();
    let mut per_class: BTreeMap<&str, u64> = BTreeMap::new();
    for t in &tasks {
        for (class, ns) in &t.off_cpu_ns {
            *per_class.entry(class).or_default() += ns;
        }
    }
    let text: Vec<String> = per_class
        .iter()
        .filter(|(_, ns)| **ns > 0)
        .map(|(c, ns)| format!("{c} {} ms", ns / 1_000_000))
        .collect();
    let window_ms = o.window_ms;
    let mut claims = vec![Claim {
        id: "offcpu-time".into(),
        kind: ClaimKind::Fact,
        code: ClaimCode::OffcpuTimeInWindow.into(),
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
        surfaces: vec![sid.clone()],
        scope: Scope::Existential,
        falsifier: None,
    }];
    let episodes: Vec<_> = o
        .d_episodes
        .iter()
        .filter(|e| mine(e.tid, e.tgid))
        .collect();
    for (i, e) in episodes.iter().take(MAX_D_CLAIMS).enumerate() {
        let mut notes = Vec::new();
        if e.since_before_watch {
            notes
                .push("already in D when watching began (the length is a lower bound)".to_string());
        }
        if e.ongoing {
            notes.push("still in D at the window's end".to_string());
        }
        if e.frozen {
            notes.push("frozen by the cgroup freezer, not waiting on I/O or a lock".to_string());
        }
        if let Some(top) = e.stack.first() {
            notes.push(format!("switched out at {top}"));
        }
        let who = if e.comm.is_empty() {
            format!("thread {}", e.tid)
        } else {
            format!("thread {} ({})", e.tid, e.comm)
        };
        claims.push(Claim {
            id: format!("d-episode-{i}"),
            kind: ClaimKind::Fact,
            code: ClaimCode::DStateEpisode.into(),
            statement: format!(
                "{who} was in D for {} ms{}{}{}",
                e.duration_ns / 1_000_000,
                if e.since_before_watch {
                    String::new()
                } else {
                    format!(" starting {} ms into the window", e.start_t_ns / 1_000_000)
                },
                if notes.is_empty() { "" } else { "; " },
                notes.join("; ")
            ),
            surfaces: vec![sid.clone()],
            scope: Scope::Existential,
            falsifier: None,
        });
    }
    if episodes.is_empty()
        && o.episodes_dropped == 0
        && completeness == Completeness::Complete
        && surface_ok
    {
        claims.push(Claim {
            id: "no-d-episode".into(),
            kind: ClaimKind::Fact,
            code: ClaimCode::NoDStateEpisodeInWindow.into(),
            statement: format!(
                "no thread of the subject had a D episode of at least {} ms in the {window_ms} ms window",
                o.d_min_ns / 1_000_000
            ),
            surfaces: vec![sid],
            scope: Scope::Universal,
            falsifier: None,
        });
    }
    claims
}

/// Claims of a host capture, and a description of each D thread.
pub fn host_claims(r: &HostReadings, completeness: Completeness) -> (Vec<Claim>, Vec<String>) {
    let mut counts: BTreeMap<char, u64> = BTreeMap::new();
    let mut bound = Vec::new();
    let mut claims = Vec::new();
    let mut d_threads = Vec::new();
    for (&pid, p) in r {
        let Some(tasks) = &p.tasks else { continue };
        let tasks_id = SurfaceId::HostTasks(pid).to_string();
        bound.push(tasks_id.clone());
        let wchans: BTreeMap<u32, &str> = p
            .wchans
            .iter()
            .flat_map(|w| &w.threads)
            .filter_map(|t| Some((t.tid, t.wchan.as_deref()?)))
            .collect();
        for t in &tasks.threads {
            *counts.entry(t.state.letter()).or_default() += 1;
            if t.state == TaskState::DiskSleep && d_threads.len() < MAX_D_CLAIMS {
                let mut surfaces = vec![tasks_id.clone()];
                let wchan = match wchans.get(&t.tid) {
                    Some(w) => {
                        surfaces.push(SurfaceId::HostWchan(pid).to_string());
                        format!(", wchan {w}")
                    }
                    None => String::new(),
                };
                let text = format!("thread {} ({}) of pid {pid} is in D{wchan}", t.tid, t.comm);
                d_threads.push(text.clone());
                claims.push(Claim {
                    id: format!("d-{pid}-{}", t.tid),
                    kind: ClaimKind::Fact,
                    code: ClaimCode::ThreadInDState.into(),
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
                code: ClaimCode::ThreadStateCounts.into(),
                statement: format!("observed threads by state: {}", text.join(", ")),
                surfaces: bound.clone(),
                scope: Scope::Existential,
                falsifier: None,
            },
        );
    }
    if completeness == Completeness::Complete && !counts.contains_key(&'D') && !bound.is_empty() {
        claims.push(Claim {
            id: "no-d".into(),
            kind: ClaimKind::Fact,
            code: ClaimCode::NoThreadInDState.into(),
            statement: "no thread on the host is in D".into(),
            surfaces: bound,
            scope: Scope::Universal,
            falsifier: None,
        });
    }
    (claims, d_threads)
}

fn state_name(s: TaskState) -> &'static str {
    match s {
        TaskState::DiskSleep => "uninterruptible sleep",
        TaskState::Running => "running",
        TaskState::Sleeping => "sleeping",
        TaskState::Zombie => "zombie",
        TaskState::Stopped => "stopped",
        TaskState::TracingStop => "tracing stop",
        TaskState::Dead => "dead",
        TaskState::Idle => "idle",
        TaskState::Parked => "parked",
    }
}

#[cfg(test)]
mod tests {
    //! For every claim code: one set of typed readings that produces it and
    //! a near miss that must not. No root, no /proc.

    use super::*;
    use pstack_collectors::procfs::freezer::FreezerFacts;
    use pstack_collectors::procfs::parse::StackFacts;
    use pstack_collectors::procfs::read::{
        ThreadState, ThreadStates, ThreadWchan, ThreadWchans, WchanFacts,
    };

    use super::super::assemble_readings::{HostProcess, OffCpuEpisode, OffCpuTask};

    use super::super::assemble::tests::stat;

    /// Process 4242 (the example subject): thread 11 asleep, thread 12 in
    /// `state`, with `f` adding readings to thread 12 or the process.
    fn task(state: TaskState, f: impl FnOnce(&mut TaskReadings)) -> TaskReadings {
        let mut r = TaskReadings {
            cgroup: "/jail".into(),
            ..TaskReadings::default()
        };
        r.threads.insert(
            11,
            ThreadReadings {
                stat: Some(stat(11, TaskState::Sleeping)),
                ..ThreadReadings::default()
            },
        );
        r.threads.insert(
            12,
            ThreadReadings {
                stat: Some(stat(12, state)),
                ..ThreadReadings::default()
            },
        );
        f(&mut r);
        r
    }

    fn wchan(w: &str) -> impl FnOnce(&mut TaskReadings) {
        let w = w.to_string();
        move |r| {
            r.threads.get_mut(&12).unwrap().wchan = Some(WchanFacts { wchan: Some(w) });
        }
    }

    fn stack(top: &str) -> impl FnOnce(&mut TaskReadings) {
        let top = top.to_string();
        move |r| {
            r.threads.get_mut(&12).unwrap().stack = Some(StackFacts {
                frames: vec![top, "get_signal".into()],
            });
        }
    }

    fn freezer(state: &str) -> impl FnOnce(&mut TaskReadings) {
        let state = state.to_string();
        move |r| {
            r.freezer = Some(FreezerFacts {
                hierarchy: "v1".into(),
                cgroup: "/jail".into(),
                state,
            })
        }
    }

    fn offcpu(
        tgid: u32,
        episode_tgid: Option<u32>,
        dropped: u64,
        ok: bool,
    ) -> impl FnOnce(&mut TaskReadings) {
        move |r| {
            r.offcpu = Some((
                OffCpuReading {
                    window_ms: 1000,
                    d_min_ns: 1_000_000,
                    tasks: vec![OffCpuTask {
                        tid: 4243,
                        tgid,
                        off_cpu_ns: BTreeMap::from([("D".to_string(), 5_000_000)]),
                    }],
                    d_episodes: episode_tgid
                        .map(|tgid| OffCpuEpisode {
                            tid: 4243,
                            tgid,
                            comm: "db".into(),
                            duration_ns: 20_000_000,
                            start_t_ns: 100,
                            since_before_watch: false,
                            ongoing: false,
                            frozen: false,
                            stack: vec![],
                        })
                        .into_iter()
                        .collect(),
                    episodes_dropped: dropped,
                },
                ok,
            ))
        }
    }

    fn subject() -> Subject {
        // Process 4242.
        pstack_envelope::example::example_unsealed().subject
    }

    fn claims(r: &TaskReadings, completeness: Completeness) -> Vec<Claim> {
        task_claims(r, &subject(), completeness).0
    }

    fn has(claims: &[Claim], code: ClaimCode) -> bool {
        claims.iter().any(|c| c.code == code)
    }

    use Completeness::{Complete, Partial};
    use TaskState::{DiskSleep as D, Running as R, Sleeping as S};

    #[test]
    fn every_process_claim_code_has_readings_that_produce_it_and_a_near_miss() {
        let none = |_: &mut TaskReadings| {};
        #[allow(clippy::type_complexity, reason = "a table")]
        let table: Vec<(
            ClaimCode,
            (TaskReadings, Completeness),
            (TaskReadings, Completeness),
        )> = vec![
            (
                ClaimCode::ThreadsInStateUninterruptible,
                (task(D, none), Partial),
                (task(S, none), Partial),
            ),
            (
                ClaimCode::ThreadInDState,
                (task(D, none), Partial),
                (task(R, none), Partial),
            ),
            (
                ClaimCode::FuseServerNotAnswering,
                (task(D, wchan(FUSE_WAIT)), Complete),
                // In D on another wait: not FUSE.
                (task(D, wchan("io_schedule")), Complete),
            ),
            (
                ClaimCode::FuseServerNotAnswering,
                (task(D, stack("request_wait_answer")), Complete),
                // The FUSE frame is not the innermost: not where it waits.
                (task(D, stack("folio_wait_bit_common")), Complete),
            ),
            (
                ClaimCode::FuseServerNotAnswering,
                (task(D, wchan(FUSE_WAIT)), Complete),
                // Not in D: a FUSE wait that is interruptible is not stuck.
                (task(S, wchan(FUSE_WAIT)), Complete),
            ),
            (
                ClaimCode::CgroupFrozen,
                (task(D, wchan("__refrigerator")), Complete),
                // The freezer was read and says thawed: falsified.
                (
                    task(D, |r| {
                        wchan("__refrigerator")(r);
                        freezer("thawed")(r);
                    }),
                    Complete,
                ),
            ),
            (
                ClaimCode::CgroupFrozen,
                (task(D, stack("__refrigerator")), Complete),
                // In D elsewhere: no freezer mechanism is pointed at.
                (task(D, stack("io_schedule")), Complete),
            ),
            (
                ClaimCode::DStateFromCgroupFreezer,
                (task(D, freezer("frozen")), Complete),
                (task(D, freezer("thawed")), Complete),
            ),
            (
                ClaimCode::DStateFromCgroupFreezer,
                (task(D, freezer("freezing")), Complete),
                // Frozen, but no thread is in D: nothing to explain.
                (task(S, freezer("frozen")), Complete),
            ),
            (
                ClaimCode::NoThreadInDState,
                (task(R, none), Complete),
                // A surface not read: not complete, so nothing universal.
                (task(R, none), Partial),
            ),
            (
                ClaimCode::NoThreadInDState,
                (task(R, none), Complete),
                (task(D, none), Complete),
            ),
            (
                ClaimCode::OffcpuTimeInWindow,
                (task(S, offcpu(4242, None, 0, true)), Complete),
                // The off-CPU surface was not read: no reading.
                (task(S, none), Complete),
            ),
            (
                ClaimCode::DStateEpisode,
                (task(S, offcpu(4242, Some(4242), 0, true)), Complete),
                // An episode of another process is not this subject's.
                (task(S, offcpu(4242, Some(999), 0, true)), Complete),
            ),
            (
                ClaimCode::NoDStateEpisodeInWindow,
                (task(S, offcpu(4242, None, 0, true)), Complete),
                // Episodes were dropped: absence is not shown.
                (task(S, offcpu(4242, None, 3, true)), Complete),
            ),
            (
                ClaimCode::NoDStateEpisodeInWindow,
                (task(S, offcpu(4242, None, 0, true)), Complete),
                // Not complete: no universal claim.
                (task(S, offcpu(4242, None, 0, true)), Partial),
            ),
            (
                ClaimCode::NoDStateEpisodeInWindow,
                (task(S, offcpu(4242, None, 0, true)), Complete),
                // The surface was truncated (events lost): not shown absent.
                (task(S, offcpu(4242, None, 0, false)), Complete),
            ),
        ];
        let mut covered = std::collections::BTreeSet::new();
        for (code, (hit, hit_c), (miss, miss_c)) in table {
            let produced = claims(&hit, hit_c);
            assert!(
                has(&produced, code),
                "{code}: not produced: {:?}",
                produced.iter().map(|c| &c.code).collect::<Vec<_>>()
            );
            assert!(
                !has(&claims(&miss, miss_c), code),
                "{code}: near miss produced it"
            );
            for c in &produced {
                assert_eq!(
                    c.kind == ClaimKind::Hypothesis,
                    c.falsifier.is_some(),
                    "{}: a hypothesis and only a hypothesis has a falsifier",
                    c.code
                );
                assert!(!c.surfaces.is_empty(), "{}", c.code);
            }
            covered.insert(code);
        }
        // Every process code is in the table. The match is exhaustive: a new
        // or renamed code is a build error here until it is placed.
        let process_rule = |c: ClaimCode| match c {
            ClaimCode::ThreadsInStateUninterruptible
            | ClaimCode::ThreadInDState
            | ClaimCode::FuseServerNotAnswering
            | ClaimCode::CgroupFrozen
            | ClaimCode::DStateFromCgroupFreezer
            | ClaimCode::NoThreadInDState
            | ClaimCode::OffcpuTimeInWindow
            | ClaimCode::DStateEpisode
            | ClaimCode::NoDStateEpisodeInWindow => true,
            // One per state (`threads_in_state`, tested with its letters), the
            // host's count (`host_claims`), and other engines' codes.
            ClaimCode::ThreadsInStateRunning
            | ClaimCode::ThreadsInStateSleeping
            | ClaimCode::ThreadsInStateZombie
            | ClaimCode::ThreadsInStateStopped
            | ClaimCode::ThreadsInStateTracingStop
            | ClaimCode::ThreadsInStateDead
            | ClaimCode::ThreadsInStateIdle
            | ClaimCode::ThreadsInStateParked
            | ClaimCode::ThreadStateCounts
            | ClaimCode::TcpRetransmitsObserved
            | ClaimCode::TcpResetSender
            | ClaimCode::FlowRetransmits
            | ClaimCode::FlowRtoTimeouts
            | ClaimCode::PeerZeroWindow
            | ClaimCode::SendStalledLocally
            | ClaimCode::LocalZeroWindow
            | ClaimCode::FlowLeftEstablished
            | ClaimCode::RstReceivedFromPeer
            | ClaimCode::RstSentByLocal
            | ClaimCode::ResetByPeerInferred
            | ClaimCode::NetnsTcpFaultCountersMoved
            | ClaimCode::MtuMismatch
            | ClaimCode::PmtuBlackHole
            | ClaimCode::FlowStalled
            | ClaimCode::LinkDrops
            | ClaimCode::ConntrackPressure
            | ClaimCode::CpuStarvation
            | ClaimCode::NoFaultObserved
            | ClaimCode::NoMatchingFlow
            | ClaimCode::LonghornShortLivedStreams
            | ClaimCode::NoStreamLinked
            | ClaimCode::StreamsLinked
            | ClaimCode::LonghornFlowsExcluded
            | ClaimCode::LonghornTopologyResolved
            | ClaimCode::LonghornFlowsSelectedOn
            | ClaimCode::LonghornFlagMismatch
            | ClaimCode::LonghornIdentityChanged
            | ClaimCode::LonghornManagerReportsRebuild
            | ClaimCode::LonghornErrorNamesStream
            | ClaimCode::LonghornErrorNamesUnlinkedConnection
            | ClaimCode::LonghornSettingsBoundFailures
            | ClaimCode::LonghornEngineEvent
            | ClaimCode::LonghornErrorNamesShortLivedFlow
            | ClaimCode::LonghornRebuildFailed
            | ClaimCode::LonghornRebuildComplete
            | ClaimCode::LonghornRebuildRemoved
            | ClaimCode::LonghornRebuildUnresolved
            | ClaimCode::LonghornRebuildRetries
            | ClaimCode::LonghornRebuildSources
            | ClaimCode::LonghornRebuildEntryGone
            | ClaimCode::LonghornFailedRebuildingEvent
            | ClaimCode::KubernetesEventsWithoutFailedRebuilding
            | ClaimCode::ControlChannelUserTimeoutBelowKeepaliveRetry
            | ClaimCode::ControlChannelKeepaliveNotHazardous
            | ClaimCode::ControlChannelClientSide
            | ClaimCode::HubbleReportsDrops
            | ClaimCode::HubbleReportsNoDrops => false,
        };
        for &code in ClaimCode::ALL {
            if process_rule(code) {
                assert!(covered.contains(&code), "{code} has no row");
            }
        }
    }

    #[test]
    fn mechanisms_read_off_a_wait_are_hypotheses_with_their_falsifier() {
        let fuse = claims(&task(D, wchan(FUSE_WAIT)), Complete);
        let h = fuse
            .iter()
            .find(|c| c.code == ClaimCode::FuseServerNotAnswering)
            .unwrap();
        assert_eq!(h.kind, ClaimKind::Hypothesis);
        assert_eq!(h.surfaces, ["task/12/stat", "task/12/wchan"]);
        assert!(h.falsifier.as_deref().unwrap().contains("/dev/fuse"));
        // The thread's D state stays a fact of its own.
        assert!(
            fuse.iter()
                .any(|c| c.code == ClaimCode::ThreadInDState && c.kind == ClaimKind::Fact)
        );
        let frozen = claims(
            &task(D, |r| {
                wchan("__refrigerator")(r);
                stack("__refrigerator")(r);
            }),
            Complete,
        );
        let h = frozen
            .iter()
            .find(|c| c.code == ClaimCode::CgroupFrozen)
            .unwrap();
        assert_eq!(h.kind, ClaimKind::Hypothesis);
        assert_eq!(
            h.surfaces,
            ["task/12/stat", "task/12/wchan", "task/12/stack"]
        );
        let f = h.falsifier.as_deref().unwrap();
        assert!(
            f.contains("freezer.state") && f.contains("cgroup.freeze") && f.contains("/jail"),
            "{f}"
        );
        // With the freezer read and frozen, it is an inference instead.
        let inferred = claims(
            &task(D, |r| {
                wchan("__refrigerator")(r);
                freezer("frozen")(r);
            }),
            Complete,
        );
        assert!(has(&inferred, ClaimCode::DStateFromCgroupFreezer));
        assert!(!has(&inferred, ClaimCode::CgroupFrozen));
    }

    fn host_process(states: &[TaskState], wchan: Option<&str>) -> HostProcess {
        HostProcess {
            tasks: Some(ThreadStates {
                threads: states
                    .iter()
                    .enumerate()
                    .map(|(i, s)| ThreadState {
                        tid: 100 + i as u32,
                        comm: "w".into(),
                        state: *s,
                        start_ticks: 1,
                    })
                    .collect(),
                vanished: 0,
            }),
            wchans: wchan.map(|w| ThreadWchans {
                threads: (0..states.len())
                    .map(|i| ThreadWchan {
                        tid: 100 + i as u32,
                        wchan: Some(w.to_string()),
                    })
                    .collect(),
                vanished: 0,
            }),
        }
    }

    #[test]
    fn every_host_claim_code_has_readings_that_produce_it_and_a_near_miss() {
        let host = |ps: Vec<(u32, HostProcess)>| -> HostReadings { ps.into_iter().collect() };
        let unread = HostProcess::default();
        #[allow(clippy::type_complexity, reason = "a table")]
        let table: Vec<(
            ClaimCode,
            (HostReadings, Completeness),
            (HostReadings, Completeness),
        )> = vec![
            (
                ClaimCode::ThreadInDState,
                (host(vec![(10, host_process(&[S, D], None))]), Partial),
                (host(vec![(10, host_process(&[S, R], None))]), Partial),
            ),
            (
                ClaimCode::ThreadStateCounts,
                (host(vec![(10, host_process(&[S], None))]), Partial),
                // No tasks reading: nothing is counted.
                (host(vec![(10, unread.clone())]), Partial),
            ),
            (
                ClaimCode::NoThreadInDState,
                (
                    host(vec![
                        (10, host_process(&[S, R], None)),
                        (20, host_process(&[S], None)),
                    ]),
                    Complete,
                ),
                (
                    host(vec![
                        (10, host_process(&[S, R], None)),
                        (20, host_process(&[S], None)),
                    ]),
                    Partial,
                ),
            ),
        ];
        for (code, (hit, hc), (miss, mc)) in table {
            assert!(has(&host_claims(&hit, hc).0, code), "{code}: not produced");
            assert!(!has(&host_claims(&miss, mc).0, code), "{code}: near miss");
        }
        // A D thread's wchan is bound when it was read.
        let (c, d) = host_claims(
            &host(vec![(10, host_process(&[D], Some("io_schedule")))]),
            Partial,
        );
        let fact = c
            .iter()
            .find(|c| c.code == ClaimCode::ThreadInDState)
            .unwrap();
        assert_eq!(fact.surfaces, ["proc/10/tasks", "proc/10/wchan"]);
        assert!(d[0].contains("wchan io_schedule"), "{d:?}");
    }
}
