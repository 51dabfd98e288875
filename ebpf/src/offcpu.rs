//! The off-CPU window: per-task time off CPU split by state, and D-state
//! episodes (completed ones from the ring buffer, open ones from the START
//! map) for the watched tasks.
//!
//! Bounded: at most `max_tasks` tasks are listed (ranked by D time, then total
//! off-CPU time; the rest counted in `tasks_dropped`) and at most
//! `max_episodes` episodes kept (longest first; the rest counted). Kernel
//! losses (ring buffer full, START/TOTALS maps full) are counted by the
//! programs and carried here; any of them makes the surface truncated.
//!
//! Interval attribution: an off-CPU interval counts in the window in which it
//! ends (switch-in), whole. A thread already asleep when watching began has no
//! switch-out to see; the session seeds it (state from `/proc`) so it is not
//! invisible, and its episode says `since_before_watch` (times are lower bounds).

use crate::aggregate::{Limits, RawDigest};
use crate::record::{
    DStateEpisode, OFF_CLASSES, OffCpuClass, OffCpuStart, OffCpuTotals, RecordError,
};
use crate::symbols::Kallsyms;

/// Off-CPU totals of one task over the window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskOffCpu {
    /// Thread id.
    pub tid: u32,
    /// The totals (ns/count/max per class, tgid, comm).
    pub totals: OffCpuTotals,
}

impl TaskOffCpu {
    /// Off-CPU ns in a class.
    pub fn ns(&self, c: OffCpuClass) -> u64 {
        self.totals.ns[c as usize]
    }
}

/// One D-state episode, symbolized.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Episode {
    /// Thread id.
    pub tid: u32,
    /// Process id.
    pub tgid: u32,
    /// Thread comm (empty for an open episode read from START).
    pub comm: String,
    /// Switch-out, CLOCK_MONOTONIC ns.
    pub start_ns: u64,
    /// Length (so far, when `ongoing`), ns.
    pub duration_ns: u64,
    /// Waker thread, when seen.
    pub waker_tid: Option<u32>,
    /// Frozen by the cgroup freezer (TASK_FROZEN), not blocked on I/O or a lock.
    pub frozen: bool,
    /// Still in D when the window ended.
    pub ongoing: bool,
    /// Kernel stack at switch-out, `name+0xoff` (never raw addresses; empty
    /// for a seeded episode: its switch-out was not seen).
    pub stack: Vec<String>,
    /// Already off CPU when watching began: `start_ns` and `duration_ns` are
    /// lower bounds.
    pub since_before_watch: bool,
}

/// Counter deltas of the off-CPU programs over a window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OffCpuCounters {
    /// Switch-outs of watched tasks.
    pub switches: u64,
    /// D episodes emitted.
    pub episodes: u64,
    /// D episodes lost: ring buffer full.
    pub lost_ring: u64,
    /// Switch-outs not tracked: START full.
    pub lost_start: u64,
    /// Intervals not totalled: TOTALS full.
    pub lost_totals: u64,
}

impl OffCpuCounters {
    /// From the five counter slots (summed over CPUs).
    pub fn from_slots(s: [u64; 5]) -> OffCpuCounters {
        OffCpuCounters {
            switches: s[0],
            episodes: s[1],
            lost_ring: s[2],
            lost_start: s[3],
            lost_totals: s[4],
        }
    }

    /// `self - before`, saturating.
    pub fn since(self, before: OffCpuCounters) -> OffCpuCounters {
        OffCpuCounters {
            switches: self.switches.saturating_sub(before.switches),
            episodes: self.episodes.saturating_sub(before.episodes),
            lost_ring: self.lost_ring.saturating_sub(before.lost_ring),
            lost_start: self.lost_start.saturating_sub(before.lost_start),
            lost_totals: self.lost_totals.saturating_sub(before.lost_totals),
        }
    }

    /// Events the kernel could not record.
    pub fn lost(&self) -> u64 {
        self.lost_ring + self.lost_start + self.lost_totals
    }
}

/// Everything the off-CPU surface is built from.
#[derive(Debug, Clone, Default)]
pub struct OffCpuWindow {
    /// Watched processes (empty with `watch_all`).
    pub watched: Vec<u32>,
    /// Every task was watched.
    pub watch_all: bool,
    /// Episodes shorter than this were totalled, not emitted.
    pub d_min_ns: u64,
    /// Tasks listed (capped).
    pub tasks: Vec<TaskOffCpu>,
    /// Tasks beyond the cap.
    pub tasks_dropped: u64,
    /// Episodes kept (completed and open), longest first.
    pub episodes: Vec<Episode>,
    /// Episodes completed in the window (exact).
    pub episodes_completed: u64,
    /// Episodes beyond the cap.
    pub episodes_dropped: u64,
    /// Kernel counter deltas.
    pub counters: OffCpuCounters,
    /// Records that failed to decode.
    pub undecodable: u64,
    /// Raw bytes (episode records, TOTALS and START values).
    pub raw: RawDigest,
}

/// Builds an [`OffCpuWindow`] from raw records. Pure.
#[derive(Debug, Default)]
pub struct OffCpuBuilder {
    limits: Limits,
    completed: Vec<DStateEpisode>,
    open: Vec<(u32, OffCpuStart)>,
    tasks: Vec<TaskOffCpu>,
    window: OffCpuWindow,
}

impl OffCpuBuilder {
    /// Start a window.
    pub fn new(limits: Limits, watched: Vec<u32>, watch_all: bool, d_min_ns: u64) -> OffCpuBuilder {
        OffCpuBuilder {
            limits,
            window: OffCpuWindow {
                watched,
                watch_all,
                d_min_ns,
                ..OffCpuWindow::default()
            },
            ..OffCpuBuilder::default()
        }
    }

    /// A completed D episode record from the ring buffer.
    pub fn add_episode_raw(&mut self, raw: &[u8]) -> Result<(), RecordError> {
        let e = DStateEpisode::parse(raw).inspect_err(|_| self.window.undecodable += 1)?;
        self.window.raw.update(raw);
        self.window.episodes_completed += 1;
        // Keep at most 2x the cap while streaming; the final cut keeps the longest.
        if self.completed.len() >= 2 * self.limits.max_episodes.max(1) {
            self.completed
                .sort_unstable_by_key(|e| std::cmp::Reverse(e.duration_ns));
            let cut = self.completed.len() - self.limits.max_episodes;
            self.completed.truncate(self.limits.max_episodes);
            self.window.episodes_dropped += cut as u64;
        }
        self.completed.push(e);
        Ok(())
    }

    /// A TOTALS value (key = tid).
    pub fn add_totals_raw(&mut self, tid: u32, raw: &[u8]) -> Result<(), RecordError> {
        let totals = OffCpuTotals::parse(raw).inspect_err(|_| self.window.undecodable += 1)?;
        self.window.raw.update(raw);
        self.tasks.push(TaskOffCpu { tid, totals });
        Ok(())
    }

    /// A START value (key = tid) of a task still off CPU; only D ones matter.
    pub fn add_open_raw(&mut self, tid: u32, raw: &[u8]) -> Result<(), RecordError> {
        let s = OffCpuStart::parse(raw).inspect_err(|_| self.window.undecodable += 1)?;
        if s.class == OffCpuClass::Uninterruptible {
            self.window.raw.update(raw);
            self.open.push((tid, s));
        }
        Ok(())
    }

    /// Finish: rank, cap and symbolize. `now_ns` is CLOCK_MONOTONIC at the end.
    pub fn finish(
        mut self,
        counters: OffCpuCounters,
        now_ns: u64,
        syms: impl FnOnce() -> Kallsyms,
    ) -> OffCpuWindow {
        let mut w = self.window;
        w.counters = counters;
        self.tasks.sort_unstable_by(|a, b| {
            let d = OffCpuClass::Uninterruptible as usize;
            let total = |t: &TaskOffCpu| t.totals.ns.iter().take(OFF_CLASSES).sum::<u64>();
            b.totals.ns[d]
                .cmp(&a.totals.ns[d])
                .then(total(b).cmp(&total(a)))
                .then(a.tid.cmp(&b.tid))
        });
        if self.tasks.len() > self.limits.max_tasks {
            w.tasks_dropped = (self.tasks.len() - self.limits.max_tasks) as u64;
            self.tasks.truncate(self.limits.max_tasks);
        }
        let comm_of = |tid: u32, tasks: &[TaskOffCpu]| {
            tasks
                .iter()
                .find(|t| t.tid == tid)
                .map(|t| t.totals.comm.clone())
                .unwrap_or_default()
        };
        let needs_syms = self.completed.iter().any(|e| !e.stack.is_empty())
            || self.open.iter().any(|(_, s)| !s.stack.is_empty());
        let k = if needs_syms {
            syms()
        } else {
            Kallsyms::default()
        };
        let mut episodes: Vec<Episode> = self
            .completed
            .into_iter()
            .map(|e| Episode {
                frozen: e.frozen(),
                tid: e.tid,
                tgid: e.tgid,
                comm: e.comm,
                start_ns: e.start_ns,
                duration_ns: e.duration_ns,
                waker_tid: e.waker_tid,
                ongoing: false,
                stack: e.stack.iter().map(|a| k.resolve(*a)).collect(),
                since_before_watch: e.seeded,
            })
            .collect();
        for (tid, s) in self.open {
            episodes.push(Episode {
                tid,
                tgid: s.tgid,
                comm: comm_of(tid, &self.tasks),
                start_ns: s.ts_ns,
                duration_ns: now_ns.saturating_sub(s.ts_ns),
                waker_tid: s.waker_tid,
                frozen: s.raw_state & crate::record::TASK_FROZEN != 0,
                ongoing: true,
                stack: s.stack.iter().map(|a| k.resolve(*a)).collect(),
                since_before_watch: s.seeded,
            });
        }
        episodes.sort_unstable_by(|a, b| b.duration_ns.cmp(&a.duration_ns).then(a.tid.cmp(&b.tid)));
        if episodes.len() > self.limits.max_episodes {
            w.episodes_dropped += (episodes.len() - self.limits.max_episodes) as u64;
            episodes.truncate(self.limits.max_episodes);
        }
        w.tasks = self.tasks;
        w.episodes = episodes;
        w
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::DSTATE_EVENT_SIZE;

    fn episode(tid: u32, dur: u64) -> Vec<u8> {
        let mut b = vec![0u8; DSTATE_EVENT_SIZE];
        b[8..16].copy_from_slice(&dur.to_le_bytes());
        b[16..20].copy_from_slice(&tid.to_le_bytes());
        b
    }

    #[test]
    fn episode_cap_keeps_the_longest_and_counts_the_rest() {
        let limits = Limits {
            max_episodes: 3,
            ..Limits::default()
        };
        let mut b = OffCpuBuilder::new(limits, vec![1], false, 0);
        for i in 0..50u32 {
            b.add_episode_raw(&episode(i, u64::from(i) * 10)).unwrap();
        }
        let w = b.finish(OffCpuCounters::default(), 0, Kallsyms::default);
        assert_eq!(w.episodes.len(), 3);
        assert_eq!(w.episodes_completed, 50);
        assert_eq!(w.episodes_dropped, 47);
        assert_eq!(w.episodes[0].tid, 49);
    }

    #[test]
    fn counters_delta_saturates() {
        let a = OffCpuCounters::from_slots([10, 2, 1, 0, 0]);
        let b = OffCpuCounters::from_slots([4, 2, 0, 0, 0]);
        assert_eq!(a.since(b).switches, 6);
        assert_eq!(b.since(a).switches, 0);
        assert_eq!(a.lost(), 1);
    }
}
