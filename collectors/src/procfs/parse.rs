//! Pure parsers for procfs text. No I/O: every function takes bytes the kernel
//! produced and returns typed facts or a reason. Field numbers follow
//! `proc_pid_stat(5)`, `proc_pid_status(5)` and friends.

use serde::{Deserialize, Serialize};

/// A task's scheduler state as the kernel reports it (field 3 of `stat`).
/// Closed: a letter this table does not know is a parse error, never a guess.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum TaskState {
    /// `R`: running or runnable.
    #[serde(rename = "R")]
    Running,
    /// `S`: interruptible sleep.
    #[serde(rename = "S")]
    Sleeping,
    /// `D`: uninterruptible sleep (also a task frozen by the cgroup-v1 freezer).
    #[serde(rename = "D")]
    DiskSleep,
    /// `Z`: exited, not yet reaped by its parent.
    #[serde(rename = "Z")]
    Zombie,
    /// `T`: stopped by a signal.
    #[serde(rename = "T")]
    Stopped,
    /// `t`: stopped by a tracer.
    #[serde(rename = "t")]
    TracingStop,
    /// `X`: dead.
    #[serde(rename = "X")]
    Dead,
    /// `I`: idle kernel thread.
    #[serde(rename = "I")]
    Idle,
    /// `P`: parked kernel thread.
    #[serde(rename = "P")]
    Parked,
}

impl TaskState {
    /// Every state, in declaration order.
    pub const ALL: [TaskState; 9] = [
        TaskState::Running,
        TaskState::Sleeping,
        TaskState::DiskSleep,
        TaskState::Zombie,
        TaskState::Stopped,
        TaskState::TracingStop,
        TaskState::Dead,
        TaskState::Idle,
        TaskState::Parked,
    ];

    /// Map the kernel's letter.
    pub fn from_letter(c: u8) -> Option<TaskState> {
        Some(match c {
            b'R' => TaskState::Running,
            b'S' => TaskState::Sleeping,
            b'D' => TaskState::DiskSleep,
            b'Z' => TaskState::Zombie,
            b'T' => TaskState::Stopped,
            b't' => TaskState::TracingStop,
            b'X' | b'x' => TaskState::Dead,
            b'I' => TaskState::Idle,
            b'P' => TaskState::Parked,
            _ => return None,
        })
    }

    /// The kernel's letter.
    pub fn letter(self) -> char {
        match self {
            TaskState::Running => 'R',
            TaskState::Sleeping => 'S',
            TaskState::DiskSleep => 'D',
            TaskState::Zombie => 'Z',
            TaskState::Stopped => 'T',
            TaskState::TracingStop => 't',
            TaskState::Dead => 'X',
            TaskState::Idle => 'I',
            TaskState::Parked => 'P',
        }
    }

    /// A short human name.
    pub fn name(self) -> &'static str {
        match self {
            TaskState::Running => "running",
            TaskState::Sleeping => "sleeping",
            TaskState::DiskSleep => "uninterruptible",
            TaskState::Zombie => "zombie",
            TaskState::Stopped => "stopped",
            TaskState::TracingStop => "tracing_stop",
            TaskState::Dead => "dead",
            TaskState::Idle => "idle",
            TaskState::Parked => "parked",
        }
    }
}

/// `PF_KTHREAD` in the `flags` field: the task is a kernel thread.
pub const PF_KTHREAD: u64 = 0x0020_0000;

/// Typed `/proc/<pid>[/task/<tid>]/stat`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskStat {
    /// Field 1.
    pub pid: u32,
    /// Field 2, without parentheses (may contain spaces and parentheses).
    pub comm: String,
    /// Field 3.
    pub state: TaskState,
    /// Field 4.
    pub ppid: u32,
    /// Field 9: `PF_*` flags.
    pub flags: u64,
    /// Field 10.
    pub minflt: u64,
    /// Field 12.
    pub majflt: u64,
    /// Field 14, clock ticks.
    pub utime: u64,
    /// Field 15, clock ticks.
    pub stime: u64,
    /// Field 18.
    pub priority: i64,
    /// Field 19.
    pub nice: i64,
    /// Field 20.
    pub num_threads: u64,
    /// Field 22: start time in clock ticks after boot.
    pub start_ticks: u64,
    /// Field 23, bytes.
    pub vsize: u64,
    /// Field 24, pages.
    pub rss_pages: u64,
    /// Field 39: CPU last run on.
    pub processor: Option<u32>,
    /// Field 41: scheduling policy.
    pub policy: Option<u32>,
    /// Field 42: aggregated block I/O delay, clock ticks.
    pub blkio_ticks: Option<u64>,
}

impl TaskStat {
    /// Whether this is a kernel thread.
    pub fn is_kernel_thread(&self) -> bool {
        self.flags & PF_KTHREAD != 0
    }
}

/// Parse `stat`. The comm is everything between the first `(` and the last `)`.
pub fn parse_stat(bytes: &[u8]) -> Result<TaskStat, String> {
    let text = std::str::from_utf8(bytes).map_err(|_| "stat is not UTF-8".to_string())?;
    let open = text.find('(').ok_or("no '(' before comm")?;
    let close = text.rfind(')').ok_or("no ')' after comm")?;
    if close < open {
        return Err("')' before '('".into());
    }
    let pid = text[..open]
        .trim()
        .parse::<u32>()
        .map_err(|_| "field 1 (pid) is not a number".to_string())?;
    // A comm is whatever the process named itself (PR_SET_NAME, a title
    // rewrite): secret-shaped parts never leave the host.
    let comm = pstack_envelope::redact_text(&text[open + 1..close]).into_owned();
    let rest: Vec<&str> = text[close + 1..].split_ascii_whitespace().collect();
    // rest[i] is field i + 3.
    let field = |n: usize| -> Result<&str, String> {
        rest.get(n - 3)
            .copied()
            .ok_or_else(|| format!("field {n} missing"))
    };
    let num = |n: usize| -> Result<u64, String> {
        field(n)?
            .parse::<u64>()
            .map_err(|_| format!("field {n} is not an unsigned number"))
    };
    let signed = |n: usize| -> Result<i64, String> {
        field(n)?
            .parse::<i64>()
            .map_err(|_| format!("field {n} is not a number"))
    };
    let state_text = field(3)?;
    let state = match state_text.as_bytes() {
        [c] => TaskState::from_letter(*c)
            .ok_or_else(|| format!("unmapped task state {state_text:?}"))?,
        _ => return Err(format!("task state {state_text:?} is not one letter")),
    };
    let opt = |n: usize| rest.get(n - 3).and_then(|s| s.parse::<u64>().ok());
    Ok(TaskStat {
        pid,
        comm,
        state,
        ppid: u32::try_from(num(4)?).map_err(|_| "field 4 out of range")?,
        flags: num(9)?,
        minflt: num(10)?,
        majflt: num(12)?,
        utime: num(14)?,
        stime: num(15)?,
        priority: signed(18)?,
        nice: signed(19)?,
        num_threads: num(20)?,
        start_ticks: num(22)?,
        vsize: num(23)?,
        rss_pages: signed(24)?.max(0) as u64,
        processor: opt(39).and_then(|v| u32::try_from(v).ok()),
        policy: opt(41).and_then(|v| u32::try_from(v).ok()),
        blkio_ticks: opt(42),
    })
}

/// Typed subset of `status`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusFacts {
    /// `Name`.
    pub name: Option<String>,
    /// Letter of `State`.
    pub state: Option<String>,
    /// `Tgid`.
    pub tgid: Option<u32>,
    /// `Pid`.
    pub pid: Option<u32>,
    /// `PPid`.
    pub ppid: Option<u32>,
    /// `TracerPid`.
    pub tracer_pid: Option<u32>,
    /// `Uid`: real, effective, saved, filesystem.
    pub uid: Option<[u32; 4]>,
    /// `Gid`: real, effective, saved, filesystem.
    pub gid: Option<[u32; 4]>,
    /// `Threads`.
    pub threads: Option<u64>,
    /// `voluntary_ctxt_switches`.
    pub voluntary_ctxt_switches: Option<u64>,
    /// `nonvoluntary_ctxt_switches`.
    pub nonvoluntary_ctxt_switches: Option<u64>,
    /// `NoNewPrivs`.
    pub no_new_privs: Option<u8>,
    /// `Seccomp` mode (0 off, 1 strict, 2 filter).
    pub seccomp: Option<u8>,
    /// `CapEff`, hex.
    pub cap_eff: Option<String>,
    /// `CapPrm`, hex.
    pub cap_prm: Option<String>,
    /// `CapBnd`, hex.
    pub cap_bnd: Option<String>,
    /// `VmRSS`, kB.
    pub vm_rss_kb: Option<u64>,
    /// `VmHWM`, kB.
    pub vm_hwm_kb: Option<u64>,
    /// `SigBlk`, hex.
    pub sig_blk: Option<String>,
}

/// Parse `status` (`Key:\tvalue` lines). Unknown keys are ignored; a known
/// key with a malformed value is an error.
pub fn parse_status(bytes: &[u8]) -> Result<StatusFacts, String> {
    let text = String::from_utf8_lossy(bytes);
    let mut s = StatusFacts::default();
    let ids = |v: &str, key: &str| -> Result<[u32; 4], String> {
        let parts: Vec<u32> = v
            .split_ascii_whitespace()
            .map(str::parse)
            .collect::<Result<_, _>>()
            .map_err(|_| format!("{key}: not numbers"))?;
        parts.try_into().map_err(|_| format!("{key}: not four ids"))
    };
    for line in text.lines() {
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        let v = value.trim();
        let n = || {
            v.parse::<u64>()
                .map_err(|_| format!("{key}: {v:?} is not a number"))
        };
        let kb = || {
            v.trim_end_matches("kB")
                .trim()
                .parse::<u64>()
                .map_err(|_| format!("{key}: {v:?} is not a size"))
        };
        let small = |x: u64| u32::try_from(x).map_err(|_| format!("{key}: out of range"));
        match key {
            "Name" => s.name = Some(pstack_envelope::redact_text(v).into_owned()),
            "State" => s.state = v.split_ascii_whitespace().next().map(str::to_string),
            "Tgid" => s.tgid = Some(small(n()?)?),
            "Pid" => s.pid = Some(small(n()?)?),
            "PPid" => s.ppid = Some(small(n()?)?),
            "TracerPid" => s.tracer_pid = Some(small(n()?)?),
            "Uid" => s.uid = Some(ids(v, key)?),
            "Gid" => s.gid = Some(ids(v, key)?),
            "Threads" => s.threads = Some(n()?),
            "voluntary_ctxt_switches" => s.voluntary_ctxt_switches = Some(n()?),
            "nonvoluntary_ctxt_switches" => s.nonvoluntary_ctxt_switches = Some(n()?),
            "NoNewPrivs" => s.no_new_privs = Some(n()?.min(255) as u8),
            "Seccomp" => s.seccomp = Some(n()?.min(255) as u8),
            "CapEff" => s.cap_eff = Some(v.to_string()),
            "CapPrm" => s.cap_prm = Some(v.to_string()),
            "CapBnd" => s.cap_bnd = Some(v.to_string()),
            "VmRSS" => s.vm_rss_kb = Some(kb()?),
            "VmHWM" => s.vm_hwm_kb = Some(kb()?),
            "SigBlk" => s.sig_blk = Some(v.to_string()),
            _ => {}
        }
    }
    Ok(s)
}

/// Typed `/proc/<pid>/io`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IoCounters {
    /// `rchar`.
    pub rchar: u64,
    /// `wchar`.
    pub wchar: u64,
    /// `syscr`.
    pub syscr: u64,
    /// `syscw`.
    pub syscw: u64,
    /// `read_bytes`.
    pub read_bytes: u64,
    /// `write_bytes`.
    pub write_bytes: u64,
    /// `cancelled_write_bytes`.
    pub cancelled_write_bytes: u64,
}

/// Parse `io`; every documented key must be present.
pub fn parse_io(bytes: &[u8]) -> Result<IoCounters, String> {
    let text = String::from_utf8_lossy(bytes);
    let mut io = IoCounters::default();
    let mut seen = 0u8;
    for line in text.lines() {
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        let v = value
            .trim()
            .parse::<u64>()
            .map_err(|_| format!("{key}: not a number"))?;
        let slot = match key {
            "rchar" => &mut io.rchar,
            "wchar" => &mut io.wchar,
            "syscr" => &mut io.syscr,
            "syscw" => &mut io.syscw,
            "read_bytes" => &mut io.read_bytes,
            "write_bytes" => &mut io.write_bytes,
            "cancelled_write_bytes" => &mut io.cancelled_write_bytes,
            _ => continue,
        };
        *slot = v;
        seen += 1;
    }
    if seen < 7 {
        return Err(format!("io has {seen} of 7 counters"));
    }
    Ok(io)
}

/// Typed `schedstat`: time on CPU, time waiting on a runqueue, timeslices.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SchedStat {
    /// Nanoseconds spent running.
    pub run_ns: u64,
    /// Nanoseconds spent runnable but waiting.
    pub wait_ns: u64,
    /// Timeslices run.
    pub timeslices: u64,
}

/// Parse `schedstat`.
pub fn parse_schedstat(bytes: &[u8]) -> Result<SchedStat, String> {
    let text = String::from_utf8_lossy(bytes);
    let v: Vec<u64> = text
        .split_ascii_whitespace()
        .map(str::parse)
        .collect::<Result<_, _>>()
        .map_err(|_| "schedstat: not numbers".to_string())?;
    match v.as_slice() {
        [run_ns, wait_ns, timeslices] => Ok(SchedStat {
            run_ns: *run_ns,
            wait_ns: *wait_ns,
            timeslices: *timeslices,
        }),
        _ => Err(format!("schedstat: {} fields, want 3", v.len())),
    }
}

/// Parse `wchan`: the symbol the task sleeps in, `None` when running (`0`).
pub fn parse_wchan(bytes: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(bytes);
    let t = text.trim();
    (!t.is_empty() && t != "0").then(|| t.to_string())
}

/// Typed kernel stack.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StackFacts {
    /// Function names, innermost first, offsets stripped.
    pub frames: Vec<String>,
}

/// Parse `stack` lines like `[<0>] do_wait+0x1c4/0x2b0`.
pub fn parse_stack(bytes: &[u8]) -> Result<StackFacts, String> {
    let text = String::from_utf8_lossy(bytes);
    let mut frames = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let sym = match line.split_once("] ") {
            Some((_, s)) => s.trim(),
            None => return Err(format!("stack line {line:?} has no '[<addr>] '")),
        };
        let name = sym.split('+').next().unwrap_or(sym);
        frames.push(name.to_string());
    }
    Ok(StackFacts { frames })
}

/// Typed `syscall`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "mode", rename_all = "snake_case")]
pub enum SyscallFacts {
    /// The task is on a CPU.
    Running,
    /// Blocked, but not inside a system call (e.g. a page fault).
    NotInSyscall,
    /// Blocked in system call `nr` (arguments are not kept: they are pointers).
    InSyscall {
        /// Syscall number (x86_64 table).
        nr: i64,
        /// Its name when known.
        name: Option<String>,
    },
}

/// Parse `syscall`.
pub fn parse_syscall(bytes: &[u8]) -> Result<SyscallFacts, String> {
    let text = String::from_utf8_lossy(bytes);
    let t = text.trim();
    if t == "running" {
        return Ok(SyscallFacts::Running);
    }
    let first = t
        .split_ascii_whitespace()
        .next()
        .ok_or("syscall is empty")?;
    let nr: i64 = first
        .parse()
        .map_err(|_| format!("syscall number {first:?}"))?;
    if nr < 0 {
        return Ok(SyscallFacts::NotInSyscall);
    }
    Ok(SyscallFacts::InSyscall {
        nr,
        name: syscall_name(nr).map(str::to_string),
    })
}

/// Name of an x86_64 syscall number, for the ones a blocked task is usually in.
pub fn syscall_name(nr: i64) -> Option<&'static str> {
    Some(match nr {
        0 => "read",
        1 => "write",
        2 => "open",
        3 => "close",
        4 => "stat",
        5 => "fstat",
        6 => "lstat",
        7 => "poll",
        16 => "ioctl",
        17 => "pread64",
        18 => "pwrite64",
        19 => "readv",
        20 => "writev",
        23 => "select",
        34 => "pause",
        35 => "nanosleep",
        43 => "accept",
        44 => "sendto",
        45 => "recvfrom",
        46 => "sendmsg",
        47 => "recvmsg",
        56 => "clone",
        57 => "fork",
        58 => "vfork",
        59 => "execve",
        61 => "wait4",
        62 => "kill",
        72 => "fcntl",
        73 => "flock",
        74 => "fsync",
        75 => "fdatasync",
        82 => "rename",
        87 => "unlink",
        89 => "readlink",
        130 => "rt_sigsuspend",
        128 => "rt_sigtimedwait",
        202 => "futex",
        217 => "getdents64",
        230 => "clock_nanosleep",
        232 => "epoll_wait",
        247 => "waitid",
        257 => "openat",
        262 => "newfstatat",
        270 => "pselect6",
        271 => "ppoll",
        281 => "epoll_pwait",
        288 => "accept4",
        332 => "statx",
        435 => "clone3",
        441 => "epoll_pwait2",
        _ => return None,
    })
}

/// What an fd points at, from its link text and (when stat worked) mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FdKind {
    /// A regular file.
    File,
    /// A directory.
    Directory,
    /// A character device.
    CharDevice,
    /// A block device.
    BlockDevice,
    /// A FIFO / pipe.
    Pipe,
    /// A socket.
    Socket,
    /// An anonymous inode (eventfd, epoll, ...).
    AnonInode,
    /// A symlink or anything else.
    Other,
}

/// Classify an fd from its link text and optional `st_mode`.
pub fn classify_fd(target: &str, mode: Option<u32>) -> FdKind {
    if target.starts_with("socket:[") {
        return FdKind::Socket;
    }
    if target.starts_with("pipe:[") {
        return FdKind::Pipe;
    }
    if target.starts_with("anon_inode:") {
        return FdKind::AnonInode;
    }
    match mode.map(|m| m & libc::S_IFMT) {
        Some(libc::S_IFREG) => FdKind::File,
        Some(libc::S_IFDIR) => FdKind::Directory,
        Some(libc::S_IFCHR) => FdKind::CharDevice,
        Some(libc::S_IFBLK) => FdKind::BlockDevice,
        Some(libc::S_IFIFO) => FdKind::Pipe,
        Some(libc::S_IFSOCK) => FdKind::Socket,
        _ => FdKind::Other,
    }
}

/// One open fd: `lsof`-style link target plus what `stat` of it showed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FdTarget {
    /// The descriptor number.
    pub fd: u32,
    /// The link text (a path, `socket:[ino]`, `pipe:[ino]`, ...).
    pub target: String,
    /// What it is.
    pub kind: FdKind,
    /// Device, `major:minor`, when stat worked.
    pub dev: Option<String>,
    /// Inode, decimal, when stat worked.
    pub ino: Option<String>,
    /// errno of a failed stat.
    pub stat_errno: Option<i32>,
}

/// Inode from a namespace link like `pid:[4026531836]`.
pub fn parse_ns_inode(link: &str) -> Result<String, String> {
    let inner = link
        .split_once(":[")
        .and_then(|(_, r)| r.strip_suffix(']'))
        .ok_or_else(|| format!("namespace link {link:?} is not kind:[inode]"))?;
    inner
        .parse::<u64>()
        .map(|n| n.to_string())
        .map_err(|_| format!("namespace inode {inner:?} is not a number"))
}

/// `cgroup` lines joined by `;` (trailing newline dropped).
pub fn join_cgroup(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes)
        .lines()
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(";")
}

#[cfg(test)]
mod tests {
    use super::*;

    const SLEEP_STAT: &[u8] = b"13714 (sleep) S 13712 13712 3661 0 -1 4194304 133 0 0 0 0 0 0 0 20 0 1 0 77060 2990080 408 18446744073709551615 94388102799360 94388102817289 140724992683344 0 0 0 0 6 0 1 0 0 17 1 0 0 0 0 0 94388102831376 94388102832640 94388309614592 140724992690920 140724992690930 140724992690930 140724992692201 0\n";

    #[test]
    fn stat_of_a_sleeping_process() {
        let s = parse_stat(SLEEP_STAT).unwrap();
        assert_eq!(
            (s.pid, s.comm.as_str(), s.state, s.ppid),
            (13714, "sleep", TaskState::Sleeping, 13712)
        );
        assert_eq!(
            (s.start_ticks, s.num_threads, s.processor, s.blkio_ticks),
            (77060, 1, Some(1), Some(0))
        );
        assert!(!s.is_kernel_thread());
    }

    #[test]
    fn stat_comm_with_parens_and_spaces() {
        let text = String::from_utf8(SLEEP_STAT.to_vec())
            .unwrap()
            .replace("(sleep)", "(a) b (c)");
        let s = parse_stat(text.as_bytes()).unwrap();
        assert_eq!(s.comm, "a) b (c");
        assert_eq!(s.state, TaskState::Sleeping);
    }

    #[test]
    fn every_state_letter_maps_to_a_distinct_state() {
        // A classifier that maps every state to R must fail this table.
        for (letter, want) in [
            ('R', TaskState::Running),
            ('S', TaskState::Sleeping),
            ('D', TaskState::DiskSleep),
            ('Z', TaskState::Zombie),
            ('T', TaskState::Stopped),
            ('t', TaskState::TracingStop),
            ('X', TaskState::Dead),
            ('I', TaskState::Idle),
            ('P', TaskState::Parked),
        ] {
            let text = String::from_utf8(SLEEP_STAT.to_vec()).unwrap().replacen(
                ") S ",
                &format!(") {letter} "),
                1,
            );
            assert_eq!(parse_stat(text.as_bytes()).unwrap().state, want, "{letter}");
            assert_eq!(want.letter(), letter);
        }
    }

    #[test]
    fn unknown_state_letter_is_refused() {
        let text = String::from_utf8(SLEEP_STAT.to_vec())
            .unwrap()
            .replacen(") S ", ") Q ", 1);
        assert!(
            parse_stat(text.as_bytes())
                .unwrap_err()
                .contains("unmapped")
        );
    }

    #[test]
    fn truncated_stat_is_an_error_not_a_panic() {
        for cut in [0, 5, 10, 20, 40] {
            let _ = parse_stat(&SLEEP_STAT[..cut]);
        }
        assert!(parse_stat(b"1 (x) S 0").is_err());
    }

    #[test]
    fn status_fields() {
        let s = parse_status(b"Name:\tpstack-helper\nState:\tS (sleeping)\nTgid:\t7\nPid:\t7\nPPid:\t1\nUid:\t0\t0\t0\t0\nNoNewPrivs:\t1\nSeccomp:\t2\nCapEff:\t0000000000280004\nVmRSS:\t  1234 kB\nvoluntary_ctxt_switches:\t5\n").unwrap();
        assert_eq!(s.name.as_deref(), Some("pstack-helper"));
        assert_eq!(
            (s.no_new_privs, s.seccomp, s.vm_rss_kb, s.uid),
            (Some(1), Some(2), Some(1234), Some([0; 4]))
        );
        assert_eq!(s.voluntary_ctxt_switches, Some(5));
        assert!(parse_status(b"Uid:\t0 0\n").is_err());
    }

    #[test]
    fn io_schedstat_wchan() {
        let io = parse_io(b"rchar: 1\nwchar: 2\nsyscr: 3\nsyscw: 4\nread_bytes: 5\nwrite_bytes: 6\ncancelled_write_bytes: 7\n").unwrap();
        assert_eq!((io.rchar, io.cancelled_write_bytes), (1, 7));
        assert!(parse_io(b"rchar: 1\n").is_err());
        assert_eq!(
            parse_schedstat(b"227719244 6985566 360\n")
                .unwrap()
                .timeslices,
            360
        );
        assert!(parse_schedstat(b"1 2\n").is_err());
        assert_eq!(
            parse_wchan(b"hrtimer_nanosleep"),
            Some("hrtimer_nanosleep".into())
        );
        assert_eq!(parse_wchan(b"0"), None);
    }

    #[test]
    fn stack_and_syscall() {
        let st =
            parse_stack(b"[<0>] hrtimer_nanosleep+0xb5/0x130\n[<0>] do_syscall_64+0x71/0x290\n")
                .unwrap();
        assert_eq!(st.frames, vec!["hrtimer_nanosleep", "do_syscall_64"]);
        assert!(parse_stack(b"garbage\n").is_err());
        assert_eq!(parse_syscall(b"running\n").unwrap(), SyscallFacts::Running);
        assert_eq!(
            parse_syscall(b"-1 0x7ffd 0x7f3b\n").unwrap(),
            SyscallFacts::NotInSyscall
        );
        assert_eq!(
            parse_syscall(b"230 0x0 0x0 0x7ffd17332b60 0x7ffd17332ba0 0x0 0x0 0x7ffd17332b48 0x7f3bf3702503\n").unwrap(),
            SyscallFacts::InSyscall { nr: 230, name: Some("clock_nanosleep".into()) }
        );
        assert!(parse_syscall(b"").is_err());
    }

    #[test]
    fn ns_cgroup_fd_kind() {
        assert_eq!(parse_ns_inode("pid:[4026531836]").unwrap(), "4026531836");
        assert!(parse_ns_inode("pid:4026531836").is_err());
        assert_eq!(join_cgroup(b"0::/a\n1:freezer:/b\n"), "0::/a;1:freezer:/b");
        assert_eq!(classify_fd("socket:[123]", None), FdKind::Socket);
        assert_eq!(
            classify_fd("/tmp/x", Some(libc::S_IFREG | 0o644)),
            FdKind::File
        );
    }

    proptest::proptest! {
        #[test]
        fn parsers_never_panic(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..300)) {
            let _ = parse_stat(&bytes);
            let _ = parse_status(&bytes);
            let _ = parse_io(&bytes);
            let _ = parse_schedstat(&bytes);
            let _ = parse_stack(&bytes);
            let _ = parse_syscall(&bytes);
            let _ = parse_wchan(&bytes);
        }
    }
}
