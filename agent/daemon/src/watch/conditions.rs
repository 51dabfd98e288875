//! The watch conditions as pure functions of sampled readings: given what
//! was read at each tick, say when a rule's condition became true.
//!
//! Invariants:
//! - **No I/O here.** Readings come from `sample`; every rule is table-tested.
//! - **Once per episode.** A D-state episode (a task, identified by tid and
//!   start time, seen in D at consecutive samples without running) fires
//!   once; a rate condition fires on its rising edge and re-arms when the
//!   rate falls back below the threshold.
//! - **Identity before duration.** A tid reused by a new task (other start
//!   time) or a task that ran between samples (its timeslice count moved)
//!   starts a new episode: the condition is "continuously in D", not "in D
//!   whenever we looked".

use std::collections::BTreeMap;
use std::time::Duration;

/// A task seen in D state at one sample.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DTask {
    /// Thread id.
    pub tid: u32,
    /// Its process.
    pub tgid: u32,
    /// Start time, clock ticks after boot (identity against tid reuse).
    pub start_ticks: u64,
    /// Timeslices run (`schedstat`), when readable: unchanged means the
    /// task did not run between two samples.
    pub timeslices: Option<u64>,
    /// Its comm.
    pub comm: String,
}

/// A task that has been continuously in D for at least the rule's minimum.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DFiring {
    /// The task.
    pub task: DTask,
    /// How long it has been seen in D (a lower bound: from the first sample
    /// that saw it).
    pub d_for: Duration,
    /// Samples that saw it in D.
    pub samples: u32,
    /// Other threads of the same process firing at this tick.
    pub sibling_threads: u32,
}

#[derive(Debug, Clone)]
struct Episode {
    start_ticks: u64,
    timeslices: Option<u64>,
    first_seen: Duration,
    samples: u32,
    fired: bool,
}

/// Tracks D-state episodes for one `d_state` rule.
#[derive(Debug, Default)]
pub struct DStateTracker {
    episodes: BTreeMap<u32, Episode>,
}

impl DStateTracker {
    /// Fold one sample (every task in D at `now`) and return the firings:
    /// at most one per process (its longest-blocked thread).
    pub fn observe(&mut self, now: Duration, in_d: &[DTask], min: Duration) -> Vec<DFiring> {
        let mut next: BTreeMap<u32, Episode> = BTreeMap::new();
        for t in in_d {
            let ep = match self.episodes.remove(&t.tid) {
                Some(mut ep)
                    if ep.start_ticks == t.start_ticks
                        && (ep.timeslices.is_none() || ep.timeslices == t.timeslices) =>
                {
                    ep.samples += 1;
                    ep
                }
                _ => Episode {
                    start_ticks: t.start_ticks,
                    timeslices: t.timeslices,
                    first_seen: now,
                    samples: 1,
                    fired: false,
                },
            };
            next.insert(t.tid, ep);
        }
        self.episodes = next;
        let mut by_process: BTreeMap<u32, DFiring> = BTreeMap::new();
        for t in in_d {
            let Some(ep) = self.episodes.get_mut(&t.tid) else {
                continue;
            };
            let d_for = now.saturating_sub(ep.first_seen);
            if ep.fired || ep.samples < 2 || d_for < min {
                continue;
            }
            ep.fired = true;
            let firing = DFiring {
                task: t.clone(),
                d_for,
                samples: ep.samples,
                sibling_threads: 0,
            };
            by_process
                .entry(t.tgid)
                .and_modify(|f| {
                    f.sibling_threads += 1;
                    if firing.d_for > f.d_for {
                        let siblings = f.sibling_threads;
                        *f = firing.clone();
                        f.sibling_threads = siblings;
                    }
                })
                .or_insert(firing);
        }
        by_process.into_values().collect()
    }

    /// Episodes tracked now.
    pub fn tracked(&self) -> usize {
        self.episodes.len()
    }
}

/// A counter read at one sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CounterSample {
    /// When.
    pub at: Duration,
    /// Its value.
    pub value: u64,
}

/// A rate above its threshold.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RateFiring {
    /// Increase per second over the last interval.
    pub per_second: f64,
    /// Increase over the interval.
    pub delta: u64,
    /// The interval.
    pub over: Duration,
}

/// Rising-edge detector of a counter's rate.
#[derive(Debug, Default)]
pub struct RateTracker {
    prev: Option<CounterSample>,
    above: bool,
}

impl RateTracker {
    /// Fold one sample; `Some` when the rate crosses `threshold` upwards.
    pub fn observe(&mut self, s: CounterSample, threshold: u64) -> Option<RateFiring> {
        let prev = self.prev.replace(s)?;
        let over = s.at.saturating_sub(prev.at);
        if s.value < prev.value || over.is_zero() {
            // A counter reset (netns recreated, wrap): no rate this interval.
            self.above = false;
            return None;
        }
        let delta = s.value - prev.value;
        let per_second = delta as f64 / over.as_secs_f64();
        let now_above = per_second >= threshold as f64;
        let rising = now_above && !self.above;
        self.above = now_above;
        rising.then_some(RateFiring {
            per_second,
            delta,
            over,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(ms: u64) -> Duration {
        Duration::from_millis(ms)
    }

    fn t(tid: u32, tgid: u32, start: u64, slices: Option<u64>) -> DTask {
        DTask {
            tid,
            tgid,
            start_ticks: start,
            timeslices: slices,
            comm: format!("t{tid}"),
        }
    }

    #[test]
    fn d_state_fires_once_per_continuous_episode() {
        let min = s(3000);
        // (at ms, tasks in D, tids expected to fire)
        let a = t(10, 10, 100, Some(7));
        let table: Vec<(u64, Vec<DTask>, Vec<u32>)> = vec![
            (0, vec![a.clone()], vec![]),
            (1000, vec![a.clone()], vec![]),
            (2000, vec![a.clone()], vec![]),
            (3000, vec![a.clone()], vec![10]), // 3 s since first seen
            (4000, vec![a.clone()], vec![]),   // already fired this episode
            (5000, vec![], vec![]),            // left D: episode ends
            (6000, vec![a.clone()], vec![]),   // a new episode starts
            (9000, vec![a.clone()], vec![10]),
        ];
        let mut tr = DStateTracker::default();
        for (at, tasks, want) in table {
            let got: Vec<u32> = tr
                .observe(s(at), &tasks, min)
                .iter()
                .map(|f| f.task.tid)
                .collect();
            assert_eq!(got, want, "at {at} ms");
        }
    }

    #[test]
    fn shorter_than_t_never_fires() {
        let mut tr = DStateTracker::default();
        let a = t(10, 10, 100, Some(7));
        for at in [0, 1000, 2000] {
            assert!(
                tr.observe(s(at), std::slice::from_ref(&a), s(3000))
                    .is_empty()
            );
        }
        assert!(tr.observe(s(3000), &[], s(3000)).is_empty());
        assert_eq!(tr.tracked(), 0);
    }

    #[test]
    fn tid_reuse_or_running_between_samples_restarts_the_episode() {
        let min = s(2000);
        let mut tr = DStateTracker::default();
        tr.observe(s(0), &[t(10, 10, 100, Some(7))], min);
        tr.observe(s(1000), &[t(10, 10, 100, Some(7))], min);
        // Same tid, other start time: another task.
        assert!(
            tr.observe(s(2000), &[t(10, 10, 555, Some(7))], min)
                .is_empty()
        );
        assert!(
            tr.observe(s(3000), &[t(10, 10, 555, Some(7))], min)
                .is_empty()
        );
        // It ran between samples (timeslices moved): not continuous.
        assert!(
            tr.observe(s(4000), &[t(10, 10, 555, Some(8))], min)
                .is_empty()
        );
        assert!(
            tr.observe(s(5000), &[t(10, 10, 555, Some(8))], min)
                .is_empty()
        );
        assert_eq!(
            tr.observe(s(6000), &[t(10, 10, 555, Some(8))], min).len(),
            1
        );
    }

    #[test]
    fn one_firing_per_process_naming_its_longest_blocked_thread() {
        let min = s(1000);
        let mut tr = DStateTracker::default();
        tr.observe(s(0), &[t(11, 10, 1, None)], min);
        tr.observe(s(500), &[t(11, 10, 1, None), t(12, 10, 2, None)], min);
        let f = tr.observe(
            s(2000),
            &[t(11, 10, 1, None), t(12, 10, 2, None), t(20, 20, 3, None)],
            min,
        );
        assert_eq!(f.len(), 1, "{f:?}");
        assert_eq!((f[0].task.tid, f[0].sibling_threads), (11, 1));
    }

    #[test]
    fn rates_fire_on_the_rising_edge() {
        let mut r = RateTracker::default();
        // (at ms, value, fires)
        let table = [
            (0, 100, false),    // first sample: no rate yet
            (1000, 102, false), // 2/s
            (2000, 120, true),  // 18/s: crosses 10/s
            (3000, 140, false), // still above: no new firing
            (4000, 141, false), // below: re-armed
            (5000, 200, true),  // above again
            (6000, 50, false),  // counter reset
            (7000, 70, true),   // above from a fresh base
        ];
        for (at, value, fires) in table {
            let got = r.observe(CounterSample { at: s(at), value }, 10);
            assert_eq!(got.is_some(), fires, "at {at}: {got:?}");
        }
    }
}
