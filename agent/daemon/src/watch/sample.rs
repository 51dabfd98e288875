//! Cheap readings for the watch conditions, taken once per tick.
//!
//! Invariants:
//! - **Cheap and bounded.** The D-state scan reads one `stat` per thread
//!   into a reused buffer and parses only tasks whose state letter is `D`
//!   (then their `schedstat`); at most [`MAX_TASKS`] threads are looked at
//!   per scan and the overflow is reported. Nothing here can block on a
//!   task: `stat` and `schedstat` are not among the risky surfaces.
//! - **Vanishing tasks are normal**: a read that fails is skipped.

use std::io::Read;
use std::path::Path;

use pstack_collectors::procfs::parse::{parse_schedstat, parse_stat};

use super::conditions::DTask;

/// Most threads looked at per scan.
pub const MAX_TASKS: usize = 200_000;

/// One D-state scan.
#[derive(Debug, Default)]
pub struct DScan {
    /// Tasks in D.
    pub in_d: Vec<DTask>,
    /// Threads looked at.
    pub scanned: usize,
    /// Whether [`MAX_TASKS`] cut the scan.
    pub truncated: bool,
}

fn read_small(path: &Path, buf: &mut Vec<u8>) -> bool {
    buf.clear();
    match std::fs::File::open(path) {
        Ok(mut f) => f.read_to_end(buf).is_ok(),
        Err(_) => false,
    }
}

/// The state letter of a `stat` line: the first byte after the last `)`.
fn state_letter(stat: &[u8]) -> Option<u8> {
    let close = stat.iter().rposition(|&b| b == b')')?;
    stat.get(close + 2).copied()
}

/// Every thread under `proc_root` in D state.
pub fn d_state_tasks(proc_root: &Path) -> DScan {
    let mut scan = DScan::default();
    let Ok(procs) = std::fs::read_dir(proc_root) else {
        return scan;
    };
    let mut buf = Vec::with_capacity(512);
    'outer: for p in procs.flatten() {
        let name = p.file_name();
        let Some(tgid) = name.to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(tasks) = std::fs::read_dir(p.path().join("task")) else {
            continue;
        };
        for t in tasks.flatten() {
            if scan.scanned >= MAX_TASKS {
                scan.truncated = true;
                break 'outer;
            }
            scan.scanned += 1;
            let dir = t.path();
            if !read_small(&dir.join("stat"), &mut buf) || state_letter(&buf) != Some(b'D') {
                continue;
            }
            let Ok(stat) = parse_stat(&buf) else {
                continue;
            };
            let timeslices = read_small(&dir.join("schedstat"), &mut buf)
                .then(|| parse_schedstat(&buf).ok().map(|s| s.timeslices))
                .flatten();
            scan.in_d.push(DTask {
                tid: stat.pid,
                tgid,
                start_ticks: stat.start_ticks,
                timeslices,
                comm: stat.comm,
            });
        }
    }
    scan
}

/// Start time (clock ticks after boot) of process `pid`, for confirming
/// identity right before a capture.
pub fn task_start_ticks(proc_root: &Path, tgid: u32, tid: u32) -> Option<(u64, char)> {
    let bytes = std::fs::read(proc_root.join(format!("{tgid}/task/{tid}/stat"))).ok()?;
    let stat = parse_stat(&bytes).ok()?;
    Some((stat.start_ticks, stat.state.letter()))
}

/// The host's TCP counters the rate rules read: `Tcp.RetransSegs` and
/// `TcpExt.ListenOverflows` (pstackd's network namespace).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TcpCounters {
    /// Segments retransmitted.
    pub retrans_segs: u64,
    /// Times a listener's accept queue was full.
    pub listen_overflows: u64,
}

/// Read [`TcpCounters`] from pstackd's `/proc/net/{snmp,netstat}` (the
/// collectors' one reader of them).
pub fn tcp_counters() -> Result<TcpCounters, String> {
    let (all, _raw) = pstack_collectors::net::read_counters().map_err(|e| e.to_string())?;
    let get = |k: &str| -> Result<u64, String> {
        all.get(k)
            .and_then(|v| u64::try_from(*v).ok())
            .ok_or_else(|| format!("{k} is missing from /proc/net"))
    };
    Ok(TcpCounters {
        retrans_segs: get("Tcp.RetransSegs")?,
        listen_overflows: get("TcpExt.ListenOverflows")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_letter_survives_hostile_comms() {
        assert_eq!(state_letter(b"42 (a) b) D 1 2"), Some(b'D'));
        assert_eq!(state_letter(b"42 (x) S 1"), Some(b'S'));
        assert_eq!(state_letter(b"garbage"), None);
    }

    #[test]
    fn this_host_scans_and_reads_counters() {
        let scan = d_state_tasks(Path::new("/proc"));
        assert!(scan.scanned > 0 && !scan.truncated, "{scan:?}");
        let c = tcp_counters().unwrap();
        // Both are real counters of this kernel; a failure would be an Err.
        let _ = (c.retrans_segs, c.listen_overflows);
    }
}
