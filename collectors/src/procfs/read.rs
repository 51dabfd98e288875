//! Thin readers: open, read under a byte cap, parse with [`super::parse`].
//! Each returns a [`Reading`] (typed facts + raw digest/length/truncation) or a
//! typed [`ReadError`]. The risky ones (see [`super::RISKY`]) must only be
//! called inside `pstack-helper`.

use std::path::{Path, PathBuf};

use pstack_envelope::{
    DigestKey, RedactedCommand, RedactedEnviron, redact_cmdline, redact_environ,
};
use serde::{Deserialize, Serialize};

use super::parse::{
    self, FdTarget, IoCounters, SchedStat, StackFacts, StatusFacts, SyscallFacts, TaskStat,
    TaskState, classify_fd,
};
use super::raw::{ProcDir, RawMeta, RawRead, ReadError, Reading, read_capped, read_seq_capped};

/// Root of procfs. Overridable only so parsers can be exercised on captured
/// trees; production always reads `/proc`.
pub const PROC: &str = "/proc";

/// A process or one of its threads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskRef {
    /// Thread-group id.
    pub pid: u32,
    /// Thread id, or `None` for the process as a whole.
    pub tid: Option<u32>,
}

impl TaskRef {
    /// The process.
    pub fn process(pid: u32) -> TaskRef {
        TaskRef { pid, tid: None }
    }

    /// One thread of `pid`.
    pub fn thread(pid: u32, tid: u32) -> TaskRef {
        TaskRef {
            pid,
            tid: Some(tid),
        }
    }

    /// `/proc/<pid>` or `/proc/<pid>/task/<tid>`.
    pub fn dir(&self) -> PathBuf {
        match self.tid {
            None => PathBuf::from(format!("{PROC}/{}", self.pid)),
            Some(t) => PathBuf::from(format!("{PROC}/{}/task/{t}", self.pid)),
        }
    }

    /// `dir()/name`.
    pub fn file(&self, name: &str) -> PathBuf {
        self.dir().join(name)
    }
}

fn parsed<T>(
    path: &Path,
    raw: &RawRead,
    f: impl FnOnce(&[u8]) -> Result<T, String>,
) -> Result<Reading<T>, ReadError> {
    let facts = f(&raw.bytes).map_err(|reason| ReadError::Parse {
        path: path.display().to_string(),
        reason,
    })?;
    Ok(Reading {
        facts,
        raw: raw.meta(),
    })
}

/// Read a `seq_file` (one `read(2)` when it fits) and parse it.
fn read_parsed<T>(
    path: PathBuf,
    max_bytes: u64,
    f: impl FnOnce(&[u8]) -> Result<T, String>,
) -> Result<Reading<T>, ReadError> {
    let raw = read_seq_capped(&path, max_bytes)?;
    parsed(&path, &raw, f)
}

/// `stat`.
pub fn read_stat(task: TaskRef, max_bytes: u64) -> Result<Reading<TaskStat>, ReadError> {
    read_parsed(task.file("stat"), max_bytes, parse::parse_stat)
}

/// `status`.
pub fn read_status(task: TaskRef, max_bytes: u64) -> Result<Reading<StatusFacts>, ReadError> {
    read_parsed(task.file("status"), max_bytes, parse::parse_status)
}

/// `io`.
pub fn read_io(task: TaskRef, max_bytes: u64) -> Result<Reading<IoCounters>, ReadError> {
    read_parsed(task.file("io"), max_bytes, parse::parse_io)
}

/// `schedstat`.
pub fn read_schedstat(task: TaskRef, max_bytes: u64) -> Result<Reading<SchedStat>, ReadError> {
    read_parsed(task.file("schedstat"), max_bytes, parse::parse_schedstat)
}

/// Typed `wchan`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WchanFacts {
    /// Kernel function the task sleeps in; `None` when running (`0`).
    pub wchan: Option<String>,
}

/// `wchan` (risky: helper only).
pub fn read_wchan(task: TaskRef, max_bytes: u64) -> Result<Reading<WchanFacts>, ReadError> {
    read_parsed(task.file("wchan"), max_bytes, |b| {
        Ok(WchanFacts {
            wchan: parse::parse_wchan(b),
        })
    })
}

/// `stack` (risky: helper only; needs CAP_SYS_ADMIN).
pub fn read_stack(task: TaskRef, max_bytes: u64) -> Result<Reading<StackFacts>, ReadError> {
    read_parsed(task.file("stack"), max_bytes, parse::parse_stack)
}

/// `syscall` (risky: helper only).
pub fn read_syscall(task: TaskRef, max_bytes: u64) -> Result<Reading<SyscallFacts>, ReadError> {
    read_parsed(task.file("syscall"), max_bytes, parse::parse_syscall)
}

/// [`parsed`] for secret-bearing files: the raw digest is keyed too (an
/// unkeyed digest of the raw block would confirm a guess as well as the
/// facts' digest would). The envelope schema wants `sha256:<hex>` there, so
/// it is the SHA-256 of the keyed digest: still equal for equal blocks on
/// one host, still unconfirmable without the key.
fn parsed_keyed<T>(
    path: &Path,
    raw: &RawRead,
    key: &DigestKey,
    f: impl FnOnce(&[u8]) -> T,
) -> Result<Reading<T>, ReadError> {
    let mut reading = parsed(path, raw, |b| Ok(f(b)))?;
    reading.raw.digest = pstack_envelope::sha256_digest(key.digest(&raw.bytes).as_bytes());
    Ok(reading)
}

/// `cmdline`, redacted to argv[0] + a keyed digest of the rest (risky:
/// helper only). The raw digest is keyed with the same host key, so two
/// captures on one host compare equal and nobody can confirm a guess.
pub fn read_cmdline(
    pid: u32,
    max_bytes: u64,
    key: &DigestKey,
) -> Result<Reading<RedactedCommand>, ReadError> {
    // Not a seq_file: the kernel serves at most a page per read.
    let path = TaskRef::process(pid).file("cmdline");
    let raw = read_capped(&path, max_bytes)?;
    parsed_keyed(&path, &raw, key, |b| redact_cmdline(b, key))
}

/// `environ`, redacted to variable names + a keyed digest (risky: helper
/// only).
pub fn read_environ(
    pid: u32,
    max_bytes: u64,
    key: &DigestKey,
) -> Result<Reading<RedactedEnviron>, ReadError> {
    // Not a seq_file: the kernel serves at most a page per read.
    let path = TaskRef::process(pid).file("environ");
    let raw = read_capped(&path, max_bytes)?;
    parsed_keyed(&path, &raw, key, |b| redact_environ(b, key))
}

/// The fd table: `lsof`-style readlink + stat of every target.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FdTable {
    /// Descriptors read, ascending.
    pub fds: Vec<FdTarget>,
    /// Descriptors the directory listed.
    pub total: u64,
    /// Descriptors that closed between listing and reading.
    pub vanished: u64,
}

/// Read `/proc/<pid>/fd/*` (risky: helper only — `stat` of a target on a hung
/// filesystem blocks). At most `max_fds` descriptors are read; the raw bytes
/// (one `fd\ttarget\n` line per descriptor) are capped at `max_bytes`, and
/// either cap sets `truncated`.
pub fn read_fd_targets(
    pid: u32,
    max_fds: u64,
    max_bytes: u64,
) -> Result<Reading<FdTable>, ReadError> {
    let dir = TaskRef::process(pid).file("fd");
    let entries = std::fs::read_dir(&dir).map_err(|e| ReadError::from_io(&dir, &e))?;
    let mut nums: Vec<u32> = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| ReadError::from_io(&dir, &e))?;
        if let Some(n) = entry.file_name().to_str().and_then(|s| s.parse().ok()) {
            nums.push(n);
        }
    }
    nums.sort_unstable();
    let total = nums.len() as u64;
    let mut truncated = total > max_fds;
    nums.truncate(usize::try_from(max_fds).unwrap_or(usize::MAX));
    let mut fds = Vec::with_capacity(nums.len());
    let mut raw = Vec::new();
    let mut vanished = 0;
    for fd in nums {
        let link = dir.join(fd.to_string());
        let target = match std::fs::read_link(&link) {
            Ok(t) => t.to_string_lossy().into_owned(),
            Err(e) => match ReadError::from_io(&link, &e) {
                ReadError::Vanished { .. } => {
                    vanished += 1;
                    continue;
                }
                other => return Err(other),
            },
        };
        // `stat` follows the link to the target itself, as lsof does. This is
        // the call that hangs on a filesystem whose server stopped answering.
        let (mode, dev, ino, stat_errno) = match std::fs::metadata(&link) {
            Ok(m) => {
                use std::os::unix::fs::MetadataExt;
                let dev = m.dev();
                (
                    Some(m.mode()),
                    Some(format!("{}:{}", libc::major(dev), libc::minor(dev))),
                    Some(m.ino().to_string()),
                    None,
                )
            }
            Err(e) => (None, None, None, e.raw_os_error()),
        };
        raw.extend_from_slice(format!("{fd}\t{target}\n").as_bytes());
        fds.push(FdTarget {
            fd,
            kind: classify_fd(&target, mode),
            target,
            dev,
            ino,
            stat_errno,
        });
    }
    let kept = RawRead::capped(raw, max_bytes);
    truncated |= kept.truncated;
    Ok(Reading {
        facts: FdTable {
            fds,
            total,
            vanished,
        },
        raw: RawMeta::of(&kept.bytes, truncated),
    })
}

/// A capped, sorted list of ids and how many there were.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdList {
    /// Kept ids, ascending.
    pub ids: Vec<u32>,
    /// How many the directory listed.
    pub total: u64,
}

impl IdList {
    /// Whether the cap cut the list.
    pub fn capped(&self) -> bool {
        self.total > self.ids.len() as u64
    }
}

fn list_numeric(dir: &Path, cap: u64) -> Result<IdList, ReadError> {
    let entries = std::fs::read_dir(dir).map_err(|e| ReadError::from_io(dir, &e))?;
    let mut ids: Vec<u32> = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| ReadError::from_io(dir, &e))?;
        if let Some(n) = entry.file_name().to_str().and_then(|s| s.parse().ok()) {
            ids.push(n);
        }
    }
    ids.sort_unstable();
    let total = ids.len() as u64;
    ids.truncate(usize::try_from(cap).unwrap_or(usize::MAX));
    Ok(IdList { ids, total })
}

/// The thread universe of `pid`: `/proc/<pid>/task/*`, at most `cap`.
pub fn list_tasks(pid: u32, cap: u64) -> Result<IdList, ReadError> {
    list_numeric(&TaskRef::process(pid).file("task"), cap)
}

/// Every process on the host: `/proc/[0-9]*`, at most `cap`.
pub fn list_pids(cap: u64) -> Result<IdList, ReadError> {
    list_numeric(Path::new(PROC), cap)
}

/// One thread's state in a whole-process sweep.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ThreadState {
    /// Thread id.
    pub tid: u32,
    /// Its comm.
    pub comm: String,
    /// Its state.
    pub state: TaskState,
    /// Its start time (clock ticks after boot).
    pub start_ticks: u64,
}

/// States of many threads of one process: `stat` of each listed tid. The raw
/// digest covers the concatenated `stat` texts. Threads that exited between
/// listing and reading are counted in `vanished`, not reported as errors.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ThreadStates {
    /// States read, in tid order.
    pub threads: Vec<ThreadState>,
    /// Threads that went away.
    pub vanished: u64,
}

/// Read the state of each of `tids` (safe: `stat` does not take the target's
/// locks). Fails only if the process itself is gone or unreadable.
pub fn read_thread_states(
    pid: u32,
    tids: &[u32],
    max_bytes: u64,
) -> Result<Reading<ThreadStates>, ReadError> {
    let (threads, vanished, raw) =
        sweep_tasks(pid, tids, "stat", 4096, false, max_bytes, |tid, bytes| {
            let st = parse::parse_stat(bytes).map_err(|reason| ReadError::Parse {
                path: format!("/proc/{pid}/task/{tid}/stat"),
                reason,
            })?;
            Ok(ThreadState {
                tid,
                comm: st.comm,
                state: st.state,
                start_ticks: st.start_ticks,
            })
        })?;
    Ok(Reading {
        facts: ThreadStates { threads, vanished },
        raw,
    })
}

/// Read `task/<tid>/<file>` of each of `tids` with one read each, parsing as
/// it goes. The raw bytes kept are the texts concatenated (each followed by a
/// newline when `newline_after`: `wchan` has none of its own), capped at `max_bytes`. Threads that exited are
/// counted; all of them gone means the process is.
fn sweep_tasks<T>(
    pid: u32,
    tids: &[u32],
    file: &str,
    read_cap: u64,
    newline_after: bool,
    max_bytes: u64,
    mut parse_one: impl FnMut(u32, &[u8]) -> Result<T, ReadError>,
) -> Result<(Vec<T>, u64, RawMeta), ReadError> {
    let mut raw = Vec::new();
    let mut items = Vec::with_capacity(tids.len());
    let mut vanished = 0;
    let dir = ProcDir::open(&TaskRef::process(pid).file("task"))?;
    for &tid in tids {
        match dir.read_seq(&format!("{tid}/{file}"), read_cap) {
            Ok(r) => {
                items.push(parse_one(tid, &r.bytes)?);
                raw.extend_from_slice(&r.bytes);
                if newline_after {
                    raw.push(b'\n');
                }
            }
            Err(ReadError::Vanished { .. }) => vanished += 1,
            Err(e) => return Err(e),
        }
    }
    if items.is_empty() && !tids.is_empty() {
        let path = TaskRef::process(pid).file("task");
        return Err(ReadError::Vanished {
            path: path.display().to_string(),
            errno: libc::ESRCH,
        });
    }
    Ok((items, vanished, RawRead::capped(raw, max_bytes).meta()))
}

/// One thread's wait channel in a whole-process sweep.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ThreadWchan {
    /// Thread id.
    pub tid: u32,
    /// Kernel function it sleeps in, `None` when running.
    pub wchan: Option<String>,
}

/// Wait channels of many threads (risky: helper only).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ThreadWchans {
    /// Read, in tid order.
    pub threads: Vec<ThreadWchan>,
    /// Threads that went away.
    pub vanished: u64,
}

/// Read `wchan` of each of `tids` (risky: helper only).
pub fn read_thread_wchans(
    pid: u32,
    tids: &[u32],
    max_bytes: u64,
) -> Result<Reading<ThreadWchans>, ReadError> {
    let (threads, vanished, raw) =
        sweep_tasks(pid, tids, "wchan", 256, true, max_bytes, |tid, bytes| {
            Ok(ThreadWchan {
                tid,
                wchan: parse::parse_wchan(bytes),
            })
        })?;
    Ok(Reading {
        facts: ThreadWchans { threads, vanished },
        raw,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_own_process() {
        let me = std::process::id();
        let st = read_stat(TaskRef::process(me), 4096).unwrap();
        assert_eq!(st.facts.pid, me);
        assert!(st.raw.bytes > 0 && !st.raw.truncated);
        let tasks = list_tasks(me, 10_000).unwrap();
        assert!(tasks.ids.contains(&me));
        let status = read_status(TaskRef::process(me), 1 << 16).unwrap();
        assert_eq!(status.facts.tgid, Some(me));
        let states = read_thread_states(me, &tasks.ids, 1 << 20).unwrap();
        assert_eq!(
            states.facts.threads.len() as u64 + states.facts.vanished,
            tasks.ids.len() as u64
        );
    }

    #[test]
    fn status_cap_is_reported() {
        let me = std::process::id();
        let r = read_status(TaskRef::process(me), 16).unwrap();
        assert!(r.raw.truncated);
        assert_eq!(r.raw.bytes, 16);
    }

    #[test]
    fn task_cap_is_reported() {
        let list = list_pids(1).unwrap();
        assert_eq!(list.ids.len(), 1);
        assert!(list.capped());
    }
}
