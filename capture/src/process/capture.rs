//! The capture flows: process/thread and host. Each: identity before, risky
//! batch sent to a helper, safe reads here while it works, risky results
//! collected under deadlines, identity after, assembly and seal.

use std::cell::RefCell;
use std::time::{Duration, Instant};

use pstack_collectors::procfs::freezer;
use pstack_collectors::procfs::parse::TaskState;
use pstack_collectors::procfs::read::{self, TaskRef};
use pstack_collectors::procfs::{
    HostFacts, IdentityReading, ReadError, Reading, json_safe, read_host_facts, read_identity,
};
use pstack_envelope::{
    Envelope, HostIdentity, StatusCause, Subject, Surface, SurfaceStatus, Termination,
    ThreadIdentity,
};
use pstack_helper::protocol::SurfaceKind;
use serde::Serialize;
use serde_json::{Map, Value};

use super::assemble::{Assembly, Mode};
use super::assemble_readings::{
    ClaimInput, OffCpuReading, ProcFile, Readings, SurfaceId, TaskFile, Typed,
};
use super::{CaptureError, OffCpuSource, ProcessPlan, SupervisorConfig, SurfaceFamily, Target};
use crate::clock::{monotonic_ns, wall_time_now};
use crate::helpers::leak::LeakBudget;
use crate::helpers::risky::{EarlyHelper, RiskyOutcome, RiskyRead, RiskyRun, cause_of, status_of};

/// Longest off-CPU window a capture may ask for (the one limit, in
/// [`crate::validation::PROCESS_WINDOW`]).
pub const MAX_WINDOW: Duration = crate::validation::PROCESS_WINDOW.1;

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

/// A surface from a risky outcome; its typed reading (if a claim rule
/// reads that kind) goes to `readings`.
fn risky_surface(
    readings: &RefCell<Readings>,
    id: SurfaceId,
    authority: String,
    o: RiskyOutcome,
) -> Surface {
    if let Some(t) = o.reading.as_ref().and_then(Typed::from_helper) {
        readings.borrow_mut().insert(id, t);
    }
    Surface {
        id: id.to_string(),
        authority,
        status: o.status,
        cause: o.cause,
        deadline_ms: o.deadline_ms,
        elapsed_us: o.elapsed_us,
        digest: o.raw.as_ref().map(|r| r.digest.clone()),
        bytes: o.raw.as_ref().map_or(0, |r| r.bytes),
        truncated: o.raw.as_ref().is_some_and(|r| r.truncated),
        facts: o.facts,
    }
}

fn facts_of<T: Serialize>(facts: &T) -> Map<String, Value> {
    match serde_json::to_value(facts).map(json_safe) {
        Ok(Value::Object(m)) => m,
        Ok(other) => Map::from_iter([("value".to_string(), other)]),
        Err(e) => Map::from_iter([("encode_error".to_string(), Value::String(e.to_string()))]),
    }
}

/// A surface read in this process (safe reads only); typed readings the
/// claim rules read go to `readings`.
struct SafeReader<'a> {
    deadline_ms: u64,
    bundle_deadline: Instant,
    readings: &'a RefCell<Readings>,
}

impl SafeReader<'_> {
    fn read<T: Serialize + ClaimInput>(
        &self,
        id: SurfaceId,
        authority: String,
        f: impl FnOnce() -> Result<Reading<T>, ReadError>,
    ) -> Surface {
        if Instant::now() >= self.bundle_deadline {
            return skipped(
                id.to_string(),
                authority,
                self.deadline_ms,
                "bundle deadline reached before this surface was attempted",
            );
        }
        let start = Instant::now();
        let r = f();
        let elapsed_us = micros(start.elapsed());
        match r {
            Ok(reading) => {
                if let Some(t) = reading.facts.typed() {
                    self.readings.borrow_mut().insert(id, t);
                }
                Surface {
                    id: id.to_string(),
                    authority,
                    status: if reading.raw.truncated {
                        SurfaceStatus::Truncated
                    } else {
                        SurfaceStatus::Ok
                    },
                    cause: reading.raw.truncated.then(|| StatusCause {
                        errno: None,
                        message: "cut at the byte cap".into(),
                    }),
                    deadline_ms: self.deadline_ms,
                    elapsed_us,
                    digest: Some(reading.raw.digest.clone()),
                    bytes: reading.raw.bytes,
                    truncated: reading.raw.truncated,
                    facts: facts_of(&reading.facts),
                }
            }
            Err(e) => Surface {
                id: id.to_string(),
                authority,
                status: status_of(&e),
                cause: Some(cause_of(&e)),
                deadline_ms: self.deadline_ms,
                elapsed_us,
                digest: None,
                bytes: 0,
                truncated: false,
                facts: Map::new(),
            },
        }
    }
}

fn skipped(id: String, authority: String, deadline_ms: u64, why: &str) -> Surface {
    with_status(id, authority, deadline_ms, SurfaceStatus::Skipped, why)
}

fn with_status(
    id: String,
    authority: String,
    deadline_ms: u64,
    status: SurfaceStatus,
    why: &str,
) -> Surface {
    let cause = StatusCause {
        errno: None,
        message: why.to_string(),
    };
    Surface::unread(id, authority, deadline_ms, 0, status, cause)
}

/// Capture `plan.target` and return the sealed envelope.
///
/// The plan was validated where it was built (`crate::request`; see
/// [`ProcessPlan`] for what that guarantees): nothing here checks a field
/// again, and every refusal from here on is about the host (no such
/// process, unreadable identity, a pid that names a thread).
pub fn capture(
    request: &ProcessPlan,
    config: &SupervisorConfig,
    budget: &LeakBudget,
) -> Result<Envelope, CaptureError> {
    let started = Instant::now();
    let host = read_host_facts().map_err(CaptureError::HostFacts)?;
    let ctx = Ctx {
        request,
        config,
        budget,
        host,
        bundle_deadline: started + request.deadlines.bundle,
        wall_time: wall_time_now(),
        monotonic_start_ns: monotonic_ns(),
        readings: RefCell::new(Readings::default()),
    };
    let assembly = match request.target {
        Target::Process { pid } => capture_task(&ctx, pid, false)?,
        Target::Thread { tid } => capture_task(&ctx, tid, true)?,
        Target::Host => capture_host(&ctx)?,
    };
    Ok(assembly.seal()?)
}

struct Ctx<'a> {
    /// The plan: its surface selection is resolved against its target, its
    /// deadlines set.
    request: &'a ProcessPlan,
    config: &'a SupervisorConfig,
    budget: &'a LeakBudget,
    host: HostFacts,
    bundle_deadline: Instant,
    wall_time: String,
    monotonic_start_ns: u64,
    /// Typed readings of the surfaces read so far.
    readings: RefCell<Readings>,
}

impl Ctx<'_> {
    fn assembly(&self, mode: Mode, subject: Subject) -> Assembly {
        Assembly::new(
            mode,
            subject,
            self.config,
            self.request,
            self.budget.capacity(),
            self.wall_time.clone(),
            self.monotonic_start_ns,
        )
    }

    fn wants(&self, family: SurfaceFamily) -> bool {
        self.request.surfaces.wants(family)
    }

    fn safe(&self) -> SafeReader<'_> {
        SafeReader {
            deadline_ms: ms(self.request.deadlines.surface),
            bundle_deadline: self.bundle_deadline,
            readings: &self.readings,
        }
    }

    fn risky(&self, id: SurfaceId, pid: u32, kind: SurfaceKind) -> RiskyRead {
        RiskyRead {
            id: id.to_string(),
            pid,
            kind,
            deadline: Some(self.request.deadlines.surface),
            max_bytes: self.request.max_bytes_per_surface,
        }
    }
}

fn identity_error(what: &'static str, id: u32, e: ReadError) -> CaptureError {
    match e {
        ReadError::Vanished { .. } => CaptureError::NoSuchProcess { what, id },
        error => CaptureError::IdentityUnreadable {
            id,
            advice: matches!(error, ReadError::PermissionDenied { .. }).then(|| {
                crate::helpers::denial::explain(&crate::helpers::denial::Caller::current())
            }),
            error,
        },
    }
}

fn capture_task(ctx: &Ctx<'_>, task: u32, thread_only: bool) -> Result<Assembly, CaptureError> {
    let what = if thread_only { "tid" } else { "pid" };
    let before = read_identity(&ctx.host, task).map_err(|e| identity_error(what, task, e))?;
    let pid = before.identity.pid;
    if !thread_only && pid != task {
        return Err(CaptureError::InvalidParameter {
            param: "pid",
            reason: format!("{task} is a thread of process {pid}: use --tid {task} or --pid {pid}"),
        });
    }
    let (tids, total) = if thread_only {
        (vec![task], 1)
    } else {
        let list = read::list_tasks(pid, ctx.request.max_threads)
            .map_err(|e| identity_error(what, task, e))?;
        (list.ids, list.total)
    };
    let subject = if thread_only {
        Subject::Thread(ThreadIdentity {
            process: before.identity.clone(),
            tid: task,
        })
    } else {
        Subject::Process(before.identity.clone())
    };
    let subject_text = subject.describe();

    // Risky batch: per-thread wchan, syscall, stack; then the per-process
    // surfaces most likely to block (fd targets last).
    let mut reads = Vec::new();
    let mut authorities = Vec::new();
    let mut ids = Vec::new();
    for (file, family) in [
        (TaskFile::Wchan, SurfaceFamily::TaskWchan),
        (TaskFile::Syscall, SurfaceFamily::TaskSyscall),
        (TaskFile::Stack, SurfaceFamily::TaskStack),
    ] {
        if !ctx.wants(family) {
            continue;
        }
        for &tid in &tids {
            let kind = match file {
                TaskFile::Wchan => SurfaceKind::Wchan { tid },
                TaskFile::Syscall => SurfaceKind::Syscall { tid },
                _ => SurfaceKind::Stack { tid },
            };
            authorities.push(kind.authority(pid));
            let id = SurfaceId::Task(tid, file);
            ids.push(id);
            reads.push(ctx.risky(id, pid, kind));
        }
    }
    if !before.kernel_thread {
        for (kind, file, family) in [
            (
                SurfaceKind::Cmdline,
                ProcFile::Cmdline,
                SurfaceFamily::ProcCmdline,
            ),
            (
                SurfaceKind::Environ,
                ProcFile::Environ,
                SurfaceFamily::ProcEnviron,
            ),
            (
                SurfaceKind::FdTargets {
                    max_fds: ctx.request.max_fds,
                },
                ProcFile::Fd,
                SurfaceFamily::ProcFd,
            ),
        ] {
            if !ctx.wants(family) {
                continue;
            }
            authorities.push(kind.authority(pid));
            let id = SurfaceId::Proc(file);
            ids.push(id);
            reads.push(ctx.risky(id, pid, kind));
        }
    }
    // The off-CPU window (if any) runs on its own thread, concurrently with
    // the helper and the safe reads, and is joined before the second
    // identity read: it is observed between the two.
    std::thread::scope(|scope| {
        let window = ctx.request.window.map(|w| {
            let source = ctx.config.offcpu.clone();
            let handle = scope.spawn(move || match source {
                Some(src) => src.observe(pid, w),
                None => super::OneShotOffCpu.observe(pid, w),
            });
            (w, handle)
        });
        let mut surfaces = task_reads(
            ctx,
            pid,
            &tids,
            &before,
            reads,
            ids,
            authorities,
            &subject_text,
        )?;
        if let Some((w, handle)) = window {
            for s in offcpu_surfaces(w, handle.join()) {
                if let Some(r) = OffCpuReading::from_surface(&s) {
                    ctx.readings
                        .borrow_mut()
                        .insert(SurfaceId::EbpfOffcpu, Typed::OffCpu(r));
                }
                surfaces.push(s);
            }
        }
        Ok::<_, CaptureError>(surfaces)
    })
    .and_then(|surfaces| {
        finish_task(
            ctx,
            task,
            thread_only,
            pid,
            &tids,
            total,
            &before,
            subject,
            surfaces,
        )
    })
}

/// `proc/container` and `k8s/pod` for a process whose cgroup (as the
/// identity read saw it) names a container; nothing for any other process.
/// The container facts are re-read from `/proc/<pid>/cgroup` so the surface
/// carries the digest of the bytes they came from.
fn container_surfaces(
    ctx: &Ctx<'_>,
    safe: &SafeReader<'_>,
    pid: u32,
    before: &IdentityReading,
) -> Vec<Surface> {
    use pstack_collectors::procfs::container;
    let Some(seen) = container::parse_cgroup(&before.identity.cgroup) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    if ctx.wants(SurfaceFamily::ProcContainer) {
        let file = std::path::PathBuf::from(format!("/proc/{pid}/cgroup"));
        let max = ctx.request.max_bytes_per_surface;
        out.push(safe.read(
            SurfaceId::Proc(ProcFile::Container),
            format!("procfs:/proc/{pid}/cgroup"),
            || {
                container::read_container(&file, max).and_then(|r| match r.facts {
                    Some(facts) => Ok(Reading { facts, raw: r.raw }),
                    // Moved out of its container between the identity read
                    // and this one: the identity re-read will say so too.
                    None => Err(ReadError::Parse {
                        path: file.display().to_string(),
                        reason: "the cgroup no longer names a container".into(),
                    }),
                })
            },
        ));
    }
    if let Some(uid) = seen.pod_uid.as_deref()
        && ctx.wants(SurfaceFamily::K8sPod)
        && let Some(url) = ctx.config.kubelet_url.as_deref()
    {
        let url = format!("{}/pods", url.trim_end_matches('/'));
        let deadline = Duration::from_millis(safe.deadline_ms.max(1));
        out.push(safe.read(SurfaceId::K8sPod, format!("kubelet:{url}"), || {
            let body = fetch_pod_list(&url, deadline)?;
            let raw = pstack_collectors::procfs::RawRead::capped(body, super::MAX_POD_LIST_BYTES);
            if raw.truncated {
                return Err(ReadError::Parse {
                    path: url.clone(),
                    reason: format!("pod list larger than {} bytes", super::MAX_POD_LIST_BYTES),
                });
            }
            let facts = pstack_collectors::kubelet::find_pod(&raw.bytes, uid, &seen.container_id)
                .map_err(|e| ReadError::Parse {
                path: url.clone(),
                reason: e.to_string(),
            })?;
            Ok(Reading {
                facts,
                raw: raw.meta(),
            })
        }));
    } else if let Some(uid) = seen.pod_uid.as_deref()
        && ctx.wants(SurfaceFamily::K8sPod)
    {
        out.push(with_status(
            "k8s/pod".into(),
            "kubelet:/pods".into(),
            safe.deadline_ms,
            SurfaceStatus::Unsupported,
            &format!(
                "pod name, namespace and container name need the node's kubelet or CRI \
                 endpoint, and pstackd has none configured; pod {uid}, container {}: \
                 on the node `crictl inspect {}` shows its io.kubernetes.pod.* labels",
                seen.container_id, seen.container_id
            ),
        ));
    }
    out
}

/// `GET url` within `deadline`, on a runtime of its own (captures run on
/// blocking threads, never inside the daemon's async tasks).
fn fetch_pod_list(url: &str, deadline: Duration) -> Result<Vec<u8>, ReadError> {
    let io = |message: String| ReadError::Io {
        path: url.to_string(),
        errno: 0,
        message,
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| io(format!("runtime: {e}")))?;
    rt.block_on(async {
        let client = reqwest::Client::builder()
            .timeout(deadline)
            .build()
            .map_err(|e| io(e.to_string()))?;
        let resp = client
            .get(url)
            .send()
            .await
            .map_err(|e| io(format!("GET: {e}")))?;
        let status = resp.status();
        if !status.is_success() {
            return Err(io(format!("GET answered {status}")));
        }
        let bytes = resp.bytes().await.map_err(|e| io(format!("body: {e}")))?;
        Ok(bytes.to_vec())
    })
}

/// The `ebpf:offcpu` surface of a window thread (an `error` surface if it panicked).
fn offcpu_surfaces(window: Duration, joined: std::thread::Result<Vec<Surface>>) -> Vec<Surface> {
    let keep = |s: &Surface| s.id == pstack_ebpf::OFFCPU_SURFACE;
    match joined {
        Ok(v) if v.iter().any(keep) => v.into_iter().filter(keep).collect(),
        Ok(_) => vec![with_status(
            pstack_ebpf::OFFCPU_SURFACE.into(),
            "ebpf:pstack-ebpf".into(),
            ms(window),
            SurfaceStatus::Error,
            "the off-CPU source returned no ebpf:offcpu surface",
        )],
        Err(_) => vec![with_status(
            pstack_ebpf::OFFCPU_SURFACE.into(),
            "ebpf:pstack-ebpf".into(),
            ms(window),
            SurfaceStatus::Error,
            "the off-CPU window thread panicked",
        )],
    }
}

/// Risky batch in a helper, safe reads here meanwhile; every surface read.
#[allow(
    clippy::too_many_arguments,
    reason = "one call site; the pieces of one capture flow"
)]
fn task_reads(
    ctx: &Ctx<'_>,
    pid: u32,
    tids: &[u32],
    before: &IdentityReading,
    reads: Vec<RiskyRead>,
    ids: Vec<SurfaceId>,
    authorities: Vec<String>,
    subject_text: &str,
) -> Result<Vec<Surface>, CaptureError> {
    let run = RiskyRun::start(
        reads,
        ctx.bundle_deadline,
        subject_text,
        ctx.config,
        ctx.budget,
    )?;

    // Safe reads while the helper works.
    let safe = ctx.safe();
    let proc_ref = TaskRef::process(pid);
    let mut surfaces = Vec::new();
    if ctx.wants(SurfaceFamily::ProcStatus) {
        surfaces.push(safe.read(
            SurfaceId::Proc(ProcFile::Status),
            format!("procfs:/proc/{pid}/status"),
            || read::read_status(proc_ref, ctx.request.max_bytes_per_surface),
        ));
    }
    if ctx.wants(SurfaceFamily::ProcIo) {
        surfaces.push(safe.read(
            SurfaceId::Proc(ProcFile::Io),
            format!("procfs:/proc/{pid}/io"),
            || read::read_io(proc_ref, ctx.request.max_bytes_per_surface),
        ));
    }
    if !ctx.wants(SurfaceFamily::ProcFreezer) {
        // Not selected.
    } else if let Some((file, _, _)) = freezer::freezer_file(&before.identity.cgroup) {
        // Tells a frozen task's D from a real uninterruptible wait.
        let cgroup = before.identity.cgroup.clone();
        let path = file.display().to_string();
        surfaces.push(safe.read(
            SurfaceId::Proc(ProcFile::Freezer),
            format!("cgroupfs:{path}"),
            || {
                freezer::read_freezer(&cgroup).unwrap_or(Err(ReadError::Vanished {
                    path: path.clone(),
                    errno: libc::ENOENT,
                }))
            },
        ));
    }
    surfaces.extend(container_surfaces(ctx, &safe, pid, before));
    if before.kernel_thread {
        for (file, family) in [
            (ProcFile::Cmdline, SurfaceFamily::ProcCmdline),
            (ProcFile::Environ, SurfaceFamily::ProcEnviron),
            (ProcFile::Fd, SurfaceFamily::ProcFd),
        ] {
            if !ctx.wants(family) {
                continue;
            }
            let authority = if file == ProcFile::Fd {
                format!("procfs:/proc/{pid}/fd/*")
            } else {
                format!("procfs:/proc/{pid}/{}", file.name())
            };
            surfaces.push(with_status(
                SurfaceId::Proc(file).to_string(),
                authority,
                safe.deadline_ms,
                SurfaceStatus::Unsupported,
                "kernel thread: no user memory, command line, environment or file table",
            ));
        }
    }
    for &tid in tids {
        let t = TaskRef::thread(pid, tid);
        let max = ctx.request.max_bytes_per_surface;
        surfaces.push(safe.read(
            SurfaceId::Task(tid, TaskFile::Stat),
            format!("procfs:/proc/{pid}/task/{tid}/stat"),
            || read::read_stat(t, max),
        ));
        if ctx.wants(SurfaceFamily::TaskStatus) {
            surfaces.push(safe.read(
                SurfaceId::Task(tid, TaskFile::Status),
                format!("procfs:/proc/{pid}/task/{tid}/status"),
                || read::read_status(t, max),
            ));
        }
        if ctx.wants(SurfaceFamily::TaskSchedstat) {
            surfaces.push(safe.read(
                SurfaceId::Task(tid, TaskFile::Schedstat),
                format!("procfs:/proc/{pid}/task/{tid}/schedstat"),
                || read::read_schedstat(t, max),
            ));
        }
    }

    let outcomes = run.finish();
    for ((id, authority), o) in ids.into_iter().zip(authorities).zip(outcomes) {
        surfaces.push(risky_surface(&ctx.readings, id, authority, o));
    }
    let key = ctx
        .config
        .digest_key
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    let zombie = matches!(
        ctx.readings.borrow().task_view(&surfaces, "").threads.get(&pid),
        Some(t) if t.stat.as_ref().is_some_and(|s| s.state == TaskState::Zombie)
    );
    if zombie {
        settle_zombie_memory_reads(&mut surfaces, pid, &key);
    }
    Ok(surfaces)
}

/// A zombie (state `Z`: exited, not yet reaped) has released its memory, so opening an
/// mm-backed file (`environ`) fails with ESRCH although the process is still there
/// (its `cmdline` likewise reads empty). That is not `vanished` — the second identity
/// read still finds the same process — and nothing is missing: the complete answer is
/// "no environment any more". The main thread's stat surface, read in this capture
/// and showing `Z`, is the evidence (the caller checks it); the surface's facts
/// say why it is empty.
fn settle_zombie_memory_reads(
    surfaces: &mut [Surface],
    pid: u32,
    key: &pstack_envelope::DigestKey,
) {
    let stat_id = SurfaceId::Task(pid, TaskFile::Stat);
    let environ = SurfaceId::Proc(ProcFile::Environ).to_string();
    for s in surfaces.iter_mut().filter(|s| {
        s.id == environ
            && s.status == SurfaceStatus::Vanished
            && s.cause.as_ref().and_then(|c| c.errno) == Some(libc::ESRCH)
    }) {
        s.status = SurfaceStatus::Ok;
        s.cause = None;
        s.bytes = 0;
        s.truncated = false;
        s.digest = Some(pstack_envelope::sha256_digest(b""));
        s.facts = facts_of(&pstack_envelope::redact_environ(b"", key));
        s.facts.insert(
            "memory".into(),
            Value::String(format!(
                "released: the process exited and is not yet reaped (state Z in {stat_id}); the kernel has no memory to read"
            )),
        );
    }
}

/// Second identity read, universe, assembly.
#[allow(
    clippy::too_many_arguments,
    reason = "one call site; the pieces of one capture flow"
)]
fn finish_task(
    ctx: &Ctx<'_>,
    task: u32,
    thread_only: bool,
    pid: u32,
    tids: &[u32],
    total: u64,
    before: &IdentityReading,
    subject: Subject,
    surfaces: Vec<Surface>,
) -> Result<Assembly, CaptureError> {
    // Second identity read, before emit.
    let race = identity_change(before, read_identity(&ctx.host, task));
    let mode = if thread_only {
        Mode::Thread
    } else {
        Mode::Process
    };
    let mut a = ctx.assembly(mode, subject);
    let selector = if thread_only {
        format!("/proc/{pid}/task/{task}")
    } else {
        format!("/proc/{pid}/task/*")
    } + &ctx.request.surfaces.selector_suffix();
    let deadline_cut = surfaces.iter().any(|s| {
        s.status == SurfaceStatus::Skipped
            && s.cause
                .as_ref()
                .is_some_and(|c| c.message.contains("bundle deadline"))
    });
    let termination = if total > tids.len() as u64 {
        Termination::Cap
    } else if deadline_cut {
        Termination::Deadline
    } else {
        Termination::Exhausted
    };
    let readings = ctx.readings.take();
    let observed = readings
        .task_view(&surfaces, "")
        .threads
        .values()
        .filter(|t| t.stat.is_some())
        .count() as u64;
    a.set_universe(selector, total, observed, termination);
    a.surfaces = surfaces;
    a.readings = readings;
    a.identity_race = race;
    a.order_surfaces();
    a.finish_clock(monotonic_ns());
    Ok(a)
}

/// `None` when the identity is unchanged, else what changed.
fn identity_change(
    before: &IdentityReading,
    after: Result<IdentityReading, ReadError>,
) -> Option<String> {
    match after {
        Err(e) => Some(format!(
            "the subject could not be re-read before emit ({e})"
        )),
        Ok(a) if a.identity != before.identity || a.task_start_ticks != before.task_start_ticks => {
            let b = &before.identity;
            let n = &a.identity;
            let mut diffs = Vec::new();
            for (name, x, y) in [
                ("boot_id", b.boot_id.clone(), n.boot_id.clone()),
                ("pid", b.pid.to_string(), n.pid.to_string()),
                (
                    "start_ticks",
                    b.start_ticks.to_string(),
                    n.start_ticks.to_string(),
                ),
                ("uid", b.uid.to_string(), n.uid.to_string()),
                ("pid_ns", b.pid_ns.clone(), n.pid_ns.clone()),
                ("cgroup", b.cgroup.clone(), n.cgroup.clone()),
                (
                    "task_start_ticks",
                    before.task_start_ticks.to_string(),
                    a.task_start_ticks.to_string(),
                ),
            ] {
                if x != y {
                    diffs.push(format!("{name} {x} -> {y}"));
                }
            }
            Some(format!(
                "identity changed between the reads: {}",
                diffs.join(", ")
            ))
        }
        Ok(_) => None,
    }
}

fn capture_host(ctx: &Ctx<'_>) -> Result<Assembly, CaptureError> {
    let subject = Subject::Host(HostIdentity {
        host: ctx.host.host.clone(),
        boot_id: ctx.host.boot_id.clone(),
    });
    // The helper's exec and confinement overlap with the enumeration.
    let wchans = ctx.wants(SurfaceFamily::HostWchan);
    let early = if wchans {
        EarlyHelper::spawn(ctx.config, ctx.budget)
    } else {
        EarlyHelper::none()
    };
    let pids = read::list_pids(u64::MAX).map_err(CaptureError::HostFacts)?;
    let mut remaining = ctx.request.max_threads;
    let mut expected: u64 = 0;
    let mut members: Vec<(IdentityReading, Vec<u32>)> = Vec::new();
    let mut enumeration_cut = false;
    for &pid in &pids.ids {
        if remaining == 0 {
            // Past the cap: count the universe, read nothing.
            if let Ok(list) = read::list_tasks(pid, 0) {
                expected += list.total;
            }
            continue;
        }
        if Instant::now() >= ctx.bundle_deadline {
            enumeration_cut = true;
            break;
        }
        let Ok(identity) = read_identity(&ctx.host, pid) else {
            continue; // exited before it was observed: not in the universe
        };
        let Ok(list) = read::list_tasks(pid, remaining) else {
            continue;
        };
        expected += list.total;
        remaining -= list.ids.len() as u64;
        members.push((identity, list.ids));
    }

    let reads: Vec<RiskyRead> = members
        .iter()
        .filter(|_| wchans)
        .map(|(id, tids)| {
            ctx.risky(
                SurfaceId::HostWchan(id.identity.pid),
                id.identity.pid,
                SurfaceKind::ThreadWchans { tids: tids.clone() },
            )
        })
        .collect();
    let subject_text = subject.describe();
    let run = RiskyRun::start_with(
        reads,
        ctx.bundle_deadline,
        &subject_text,
        ctx.config,
        ctx.budget,
        early,
    )?;

    let safe = ctx.safe();
    let mut states: Vec<Surface> = Vec::with_capacity(members.len());
    for (id, tids) in &members {
        let pid = id.identity.pid;
        let mut s = safe.read(
            SurfaceId::HostTasks(pid),
            format!("procfs:/proc/{pid}/task/*/stat"),
            || read::read_thread_states(pid, tids, ctx.request.max_bytes_per_surface),
        );
        if matches!(s.status, SurfaceStatus::Ok | SurfaceStatus::Truncated) {
            let ident = serde_json::json!({
                "pid": pid,
                "comm": id.comm,
                "start_ticks": id.identity.start_ticks,
                "uid": id.identity.uid,
                "pid_ns": id.identity.pid_ns,
                "cgroup": id.identity.cgroup,
                "kernel_thread": id.kernel_thread,
            });
            s.facts.insert("process".into(), ident);
        }
        states.push(s);
    }
    // Second identity read of each process as soon as its slow surface is in.
    let mut after: Vec<Option<Result<IdentityReading, ReadError>>> = vec![None; members.len()];
    let outcomes: Vec<Option<RiskyOutcome>> = if wchans {
        run.finish_with(|i| {
            after[i] = Some(read_identity(&ctx.host, members[i].0.identity.pid));
        })
        .into_iter()
        .map(Some)
        .collect()
    } else {
        vec![None; members.len()]
    };

    let mut surfaces = Vec::with_capacity(states.len() * 2);
    for ((((id, _), mut state), outcome), after) in
        members.iter().zip(states).zip(outcomes).zip(after)
    {
        let pid = id.identity.pid;
        let mut wchan = outcome.map(|o| {
            risky_surface(
                &ctx.readings,
                SurfaceId::HostWchan(pid),
                format!("procfs:/proc/{pid}/task/*/wchan"),
                o,
            )
        });
        let after = after.unwrap_or_else(|| read_identity(&ctx.host, pid));
        let change = match &after {
            Err(ReadError::Vanished { .. }) => Some((
                SurfaceStatus::Vanished,
                "the process exited before the second identity read; facts withheld".to_string(),
            )),
            _ => identity_change(id, after).map(|why| {
                (
                    SurfaceStatus::IdentityRace,
                    format!("{why}; facts withheld"),
                )
            }),
        };
        if let Some((status, why)) = change {
            for s in std::iter::once(&mut state).chain(wchan.as_mut()) {
                if matches!(s.status, SurfaceStatus::Ok | SurfaceStatus::Truncated) {
                    s.status = status;
                    s.cause = Some(StatusCause {
                        errno: None,
                        message: why.clone(),
                    });
                    s.facts = Map::new();
                }
            }
        }
        surfaces.push(state);
        surfaces.extend(wchan);
    }

    let race = match read_host_facts() {
        Ok(h) if h.boot_id == ctx.host.boot_id => None,
        Ok(h) => Some(format!(
            "boot_id changed {} -> {}",
            ctx.host.boot_id, h.boot_id
        )),
        Err(e) => Some(format!("host facts could not be re-read ({e})")),
    };
    let mut a = ctx.assembly(Mode::Host, subject);
    let deadline_cut = enumeration_cut
        || surfaces.iter().any(|s| {
            s.status == SurfaceStatus::Skipped
                && s.cause
                    .as_ref()
                    .is_some_and(|c| c.message.contains("bundle deadline"))
        });
    let termination = if remaining == 0 && expected > ctx.request.max_threads {
        Termination::Cap
    } else if deadline_cut {
        Termination::Deadline
    } else {
        Termination::Exhausted
    };
    let readings = ctx.readings.take();
    let observed = readings
        .host_view(&surfaces)
        .values()
        .filter_map(|p| p.tasks.as_ref())
        .map(|t| t.threads.len() as u64)
        .sum();
    a.set_universe(
        format!("/proc/*/task/*{}", ctx.request.surfaces.selector_suffix()),
        expected,
        observed,
        termination,
    );
    a.surfaces = surfaces;
    a.readings = readings;
    a.identity_race = race;
    a.finish_clock(monotonic_ns());
    Ok(a)
}
