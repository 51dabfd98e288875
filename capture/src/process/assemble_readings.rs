//! Typed surface ids and typed readings of a process, thread or host
//! capture: what the claim rules ([`super::assemble_claims`]) read.
//!
//! Invariants:
//! - **A surface id is a [`SurfaceId`]**, rendered to the envelope's text
//!   (`task/4243/stack`) in one place ([`fmt::Display`]) and parsed back in
//!   one place ([`FromStr`]); no flow spells an id by hand.
//! - **A reading is the collector's own type**, kept beside the surface it
//!   was rendered into ([`Typed`]); the claim rules never read a surface's
//!   JSON facts back by key.
//! - **Only what was read is visible**: [`Readings::task_view`] and
//!   [`Readings::host_view`] drop the reading of every surface that is not
//!   `ok`/`truncated` at seal time (a surface demoted to `identity_race` or
//!   `vanished` after it was read loses its reading with its facts).

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use pstack_collectors::procfs::freezer::FreezerFacts;
use pstack_collectors::procfs::parse::{StackFacts, SyscallFacts, TaskStat};
use pstack_collectors::procfs::read::{ThreadStates, ThreadWchans, WchanFacts};
use pstack_envelope::{Surface, SurfaceStatus};
use pstack_helper::protocol::ProcReading;
use serde::Deserialize;

/// A per-thread file of a process or thread capture.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum TaskFile {
    /// `stat` (safe).
    Stat,
    /// `status` (safe).
    Status,
    /// `schedstat` (safe).
    Schedstat,
    /// `wchan` (helper).
    Wchan,
    /// `syscall` (helper).
    Syscall,
    /// `stack` (helper).
    Stack,
}

impl TaskFile {
    const ALL: [TaskFile; 6] = [
        TaskFile::Stat,
        TaskFile::Status,
        TaskFile::Schedstat,
        TaskFile::Wchan,
        TaskFile::Syscall,
        TaskFile::Stack,
    ];

    /// The file's name under `/proc/<pid>/task/<tid>/`.
    pub fn name(self) -> &'static str {
        match self {
            TaskFile::Stat => "stat",
            TaskFile::Status => "status",
            TaskFile::Schedstat => "schedstat",
            TaskFile::Wchan => "wchan",
            TaskFile::Syscall => "syscall",
            TaskFile::Stack => "stack",
        }
    }
}

/// A per-process file of a process or thread capture.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ProcFile {
    /// `proc/status`.
    Status,
    /// `proc/io`.
    Io,
    /// `proc/freezer` (the cgroup freezer's state).
    Freezer,
    /// `proc/container`.
    Container,
    /// `proc/cmdline` (helper).
    Cmdline,
    /// `proc/environ` (helper).
    Environ,
    /// `proc/fd` (helper).
    Fd,
}

impl ProcFile {
    const ALL: [ProcFile; 7] = [
        ProcFile::Status,
        ProcFile::Io,
        ProcFile::Freezer,
        ProcFile::Container,
        ProcFile::Cmdline,
        ProcFile::Environ,
        ProcFile::Fd,
    ];

    /// The name after `proc/`.
    pub fn name(self) -> &'static str {
        match self {
            ProcFile::Status => "status",
            ProcFile::Io => "io",
            ProcFile::Freezer => "freezer",
            ProcFile::Container => "container",
            ProcFile::Cmdline => "cmdline",
            ProcFile::Environ => "environ",
            ProcFile::Fd => "fd",
        }
    }
}

/// The id of a surface of a process, thread or host capture.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SurfaceId {
    /// `proc/<file>` of the subject process.
    Proc(ProcFile),
    /// `k8s/pod`.
    K8sPod,
    /// `task/<tid>/<file>`.
    Task(u32, TaskFile),
    /// `proc/<pid>/tasks` (host capture: the states of a process's threads).
    HostTasks(u32),
    /// `proc/<pid>/wchan` (host capture: its threads' wait channels).
    HostWchan(u32),
    /// `ebpf:offcpu`.
    EbpfOffcpu,
}

impl fmt::Display for SurfaceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SurfaceId::Proc(p) => write!(f, "proc/{}", p.name()),
            SurfaceId::K8sPod => f.write_str("k8s/pod"),
            SurfaceId::Task(tid, t) => write!(f, "task/{tid}/{}", t.name()),
            SurfaceId::HostTasks(pid) => write!(f, "proc/{pid}/tasks"),
            SurfaceId::HostWchan(pid) => write!(f, "proc/{pid}/wchan"),
            SurfaceId::EbpfOffcpu => f.write_str(pstack_ebpf::OFFCPU_SURFACE),
        }
    }
}

/// A surface id this capture kind does not produce.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a process, thread or host surface id")]
pub struct UnknownSurfaceId(pub String);

impl FromStr for SurfaceId {
    type Err = UnknownSurfaceId;

    fn from_str(s: &str) -> Result<SurfaceId, UnknownSurfaceId> {
        let bad = || UnknownSurfaceId(s.to_string());
        if s == pstack_ebpf::OFFCPU_SURFACE {
            return Ok(SurfaceId::EbpfOffcpu);
        }
        if s == "k8s/pod" {
            return Ok(SurfaceId::K8sPod);
        }
        let parts: Vec<&str> = s.split('/').collect();
        let num = |p: &str| -> Result<u32, UnknownSurfaceId> {
            // Canonical decimal only: `task/012/stat` is not `task/12/stat`.
            match p.parse::<u32>() {
                Ok(n) if n.to_string() == p => Ok(n),
                _ => Err(bad()),
            }
        };
        match parts.as_slice() {
            ["proc", name] => ProcFile::ALL
                .into_iter()
                .find(|p| p.name() == *name)
                .map(SurfaceId::Proc)
                .ok_or_else(bad),
            ["proc", pid, "tasks"] => Ok(SurfaceId::HostTasks(num(pid)?)),
            ["proc", pid, "wchan"] => Ok(SurfaceId::HostWchan(num(pid)?)),
            ["task", tid, name] => {
                let tid = num(tid)?;
                TaskFile::ALL
                    .into_iter()
                    .find(|t| t.name() == *name)
                    .map(|t| SurfaceId::Task(tid, t))
                    .ok_or_else(bad)
            }
            _ => Err(bad()),
        }
    }
}

/// Off-CPU time of one task, as the `ebpf:offcpu` surface states it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct OffCpuTask {
    /// Thread id.
    pub tid: u32,
    /// Process id.
    pub tgid: u32,
    /// ns off CPU per state class.
    pub off_cpu_ns: BTreeMap<String, u64>,
}

/// One D episode, as the `ebpf:offcpu` surface states it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct OffCpuEpisode {
    /// Thread id.
    pub tid: u32,
    /// Process id.
    pub tgid: u32,
    /// Thread comm (may be empty).
    pub comm: String,
    /// Length, ns.
    pub duration_ns: u64,
    /// Start, ns from the window's start.
    pub start_t_ns: i64,
    /// Already in D when watching began.
    pub since_before_watch: bool,
    /// Still in D at the window's end.
    pub ongoing: bool,
    /// Frozen by the cgroup freezer.
    pub frozen: bool,
    /// Kernel stack at switch-out, innermost first.
    pub stack: Vec<String>,
}

/// The `ebpf:offcpu` surface's readings. The eBPF session hands the
/// supervisor a finished surface, so this is decoded from its facts once,
/// with serde: a surface whose facts do not decode yields no reading (and
/// so no claim), never a default.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct OffCpuReading {
    /// The window, ms.
    pub window_ms: u64,
    /// Shortest D episode emitted, ns.
    pub d_min_ns: u64,
    /// Tasks that switched off CPU.
    pub tasks: Vec<OffCpuTask>,
    /// D episodes kept.
    pub d_episodes: Vec<OffCpuEpisode>,
    /// D episodes beyond the cap.
    pub episodes_dropped: u64,
}

impl OffCpuReading {
    /// Decode from an `ebpf:offcpu` surface's facts.
    pub fn from_surface(s: &Surface) -> Option<OffCpuReading> {
        serde_json::from_value(serde_json::Value::Object(s.facts.clone())).ok()
    }
}

/// A typed reading of one surface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Typed {
    /// `task/<tid>/stat`.
    Stat(TaskStat),
    /// `task/<tid>/wchan`.
    Wchan(WchanFacts),
    /// `task/<tid>/stack`.
    Stack(StackFacts),
    /// `task/<tid>/syscall`.
    Syscall(SyscallFacts),
    /// `proc/freezer`.
    Freezer(FreezerFacts),
    /// `proc/<pid>/tasks`.
    ThreadStates(ThreadStates),
    /// `proc/<pid>/wchan`.
    ThreadWchans(ThreadWchans),
    /// `ebpf:offcpu`.
    OffCpu(OffCpuReading),
}

impl Typed {
    /// The typed reading a helper's answer carries, when a claim rule reads
    /// that kind (cmdline, environ and fd tables are rendered only).
    pub fn from_helper(r: &ProcReading) -> Option<Typed> {
        match r {
            ProcReading::Wchan(w) => Some(Typed::Wchan(w.clone())),
            ProcReading::Stack(s) => Some(Typed::Stack(s.clone())),
            ProcReading::Syscall(s) => Some(Typed::Syscall(s.clone())),
            ProcReading::ThreadWchans(w) => Some(Typed::ThreadWchans(w.clone())),
            ProcReading::Cmdline(_) | ProcReading::Environ(_) | ProcReading::FdTargets(_) => None,
        }
    }
}

/// A safe reading's typed value, when a claim rule reads it.
pub trait ClaimInput {
    /// The typed reading to keep (default: none).
    fn typed(&self) -> Option<Typed> {
        None
    }
}

impl ClaimInput for TaskStat {
    fn typed(&self) -> Option<Typed> {
        Some(Typed::Stat(self.clone()))
    }
}
impl ClaimInput for FreezerFacts {
    fn typed(&self) -> Option<Typed> {
        Some(Typed::Freezer(self.clone()))
    }
}
impl ClaimInput for ThreadStates {
    fn typed(&self) -> Option<Typed> {
        Some(Typed::ThreadStates(self.clone()))
    }
}
impl ClaimInput for pstack_collectors::procfs::parse::StatusFacts {}
impl ClaimInput for pstack_collectors::procfs::parse::IoCounters {}
impl ClaimInput for pstack_collectors::procfs::parse::SchedStat {}
impl ClaimInput for pstack_collectors::procfs::container::ContainerFacts {}
impl ClaimInput for pstack_collectors::kubelet::PodFacts {}

/// Every typed reading of a capture, by surface id.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Readings {
    by_id: BTreeMap<SurfaceId, Typed>,
}

/// The readings of one thread that was read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ThreadReadings {
    /// `stat`, when read.
    pub stat: Option<TaskStat>,
    /// `wchan`, when read.
    pub wchan: Option<WchanFacts>,
    /// `syscall`, when read.
    pub syscall: Option<SyscallFacts>,
    /// `stack`, when read.
    pub stack: Option<StackFacts>,
}

/// What the process and thread claim rules read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TaskReadings {
    /// Threads by tid.
    pub threads: BTreeMap<u32, ThreadReadings>,
    /// The cgroup freezer, when read.
    pub freezer: Option<FreezerFacts>,
    /// The subject's cgroup path (from its identity), for probes.
    pub cgroup: String,
    /// The off-CPU window, when read, and whether its surface was `ok`
    /// (not merely `truncated`).
    pub offcpu: Option<(OffCpuReading, bool)>,
}

/// One process of a host capture.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostProcess {
    /// Its threads' states, when read.
    pub tasks: Option<ThreadStates>,
    /// Its threads' wait channels, when read.
    pub wchans: Option<ThreadWchans>,
}

/// What the host claim rules read: processes by pid.
pub type HostReadings = BTreeMap<u32, HostProcess>;

fn read(s: &Surface) -> bool {
    matches!(s.status, SurfaceStatus::Ok | SurfaceStatus::Truncated)
}

impl Readings {
    /// Keep `typed` as the reading of `id`.
    pub fn insert(&mut self, id: SurfaceId, typed: Typed) {
        self.by_id.insert(id, typed);
    }

    /// Drop every reading (identity race: facts withheld).
    pub fn clear(&mut self) {
        self.by_id.clear();
    }

    /// Readings of surfaces in `surfaces` that are read at this point, by id.
    fn visible<'a>(
        &'a self,
        surfaces: &'a [Surface],
    ) -> impl Iterator<Item = (SurfaceId, &'a Typed, &'a Surface)> + 'a {
        surfaces.iter().filter(|s| read(s)).filter_map(|s| {
            let id: SurfaceId = s.id.parse().ok()?;
            self.by_id.get(&id).map(|t| (id, t, s))
        })
    }

    /// The process/thread view.
    pub fn task_view(&self, surfaces: &[Surface], cgroup: &str) -> TaskReadings {
        let mut v = TaskReadings {
            cgroup: cgroup.to_string(),
            ..TaskReadings::default()
        };
        for (id, typed, surface) in self.visible(surfaces) {
            match (id, typed) {
                (SurfaceId::Task(tid, TaskFile::Stat), Typed::Stat(s)) => {
                    v.threads.entry(tid).or_default().stat = Some(s.clone());
                }
                (SurfaceId::Task(tid, TaskFile::Wchan), Typed::Wchan(w)) => {
                    v.threads.entry(tid).or_default().wchan = Some(w.clone());
                }
                (SurfaceId::Task(tid, TaskFile::Syscall), Typed::Syscall(s)) => {
                    v.threads.entry(tid).or_default().syscall = Some(s.clone());
                }
                (SurfaceId::Task(tid, TaskFile::Stack), Typed::Stack(s)) => {
                    v.threads.entry(tid).or_default().stack = Some(s.clone());
                }
                (SurfaceId::Proc(ProcFile::Freezer), Typed::Freezer(f)) => {
                    v.freezer = Some(f.clone());
                }
                (SurfaceId::EbpfOffcpu, Typed::OffCpu(o)) => {
                    v.offcpu = Some((o.clone(), surface.status == SurfaceStatus::Ok));
                }
                _ => {}
            }
        }
        v
    }

    /// The host view.
    pub fn host_view(&self, surfaces: &[Surface]) -> HostReadings {
        let mut v = HostReadings::new();
        for (id, typed, _) in self.visible(surfaces) {
            match (id, typed) {
                (SurfaceId::HostTasks(pid), Typed::ThreadStates(t)) => {
                    v.entry(pid).or_default().tasks = Some(t.clone());
                }
                (SurfaceId::HostWchan(pid), Typed::ThreadWchans(w)) => {
                    v.entry(pid).or_default().wchans = Some(w.clone());
                }
                _ => {}
            }
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_surface_id_round_trips_through_its_text() {
        let mut ids = vec![
            SurfaceId::K8sPod,
            SurfaceId::EbpfOffcpu,
            SurfaceId::HostTasks(1),
            SurfaceId::HostWchan(4_000_000),
        ];
        ids.extend(ProcFile::ALL.map(SurfaceId::Proc));
        ids.extend(TaskFile::ALL.map(|t| SurfaceId::Task(4243, t)));
        for id in ids {
            let text = id.to_string();
            assert_eq!(text.parse::<SurfaceId>(), Ok(id), "{text}");
        }
        for bad in [
            "task/12/stak",
            "task/012/stat",
            "task/-1/stat",
            "proc/x/tasks",
            "proc/nope",
            "ebpf:tcp",
            "",
        ] {
            assert!(bad.parse::<SurfaceId>().is_err(), "{bad}");
        }
    }
}
