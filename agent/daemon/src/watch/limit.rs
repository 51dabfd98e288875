//! Per-rule rate limits over a sliding hour.
//!
//! Invariants:
//! - A capture is allowed only when both the subject's and the rule's
//!   count of captures in the last hour are below their limits; an allowed
//!   capture is charged to both at once.
//! - Memory is bounded: timestamps older than an hour are forgotten on
//!   every check, and subjects with none left are removed.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

const HOUR: Duration = Duration::from_secs(3600);

/// Why a firing was not allowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limited {
    /// The subject already had `max_per_subject_per_hour` captures.
    Subject,
    /// The rule already had `max_per_hour` captures.
    Rule,
}

/// One rule's limiter. Times are monotonic offsets (any fixed origin).
#[derive(Debug, Default)]
pub struct Limiter {
    rule: VecDeque<Duration>,
    subjects: BTreeMap<String, VecDeque<Duration>>,
}

fn expire(q: &mut VecDeque<Duration>, now: Duration) {
    while q.front().is_some_and(|t| now.saturating_sub(*t) >= HOUR) {
        q.pop_front();
    }
}

impl Limiter {
    /// Charge a capture of `subject` at `now` if both limits allow it.
    pub fn try_charge(
        &mut self,
        subject: &str,
        now: Duration,
        per_subject: u32,
        per_rule: u32,
    ) -> Result<(), Limited> {
        expire(&mut self.rule, now);
        self.subjects.retain(|_, q| {
            expire(q, now);
            !q.is_empty()
        });
        let used = self.subjects.get(subject).map_or(0, VecDeque::len);
        if used >= per_subject as usize {
            return Err(Limited::Subject);
        }
        if self.rule.len() >= per_rule as usize {
            return Err(Limited::Rule);
        }
        self.rule.push_back(now);
        self.subjects
            .entry(subject.to_owned())
            .or_default()
            .push_back(now);
        Ok(())
    }

    /// Subjects remembered (for tests and status).
    pub fn subjects(&self) -> usize {
        self.subjects.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(secs: u64) -> Duration {
        Duration::from_secs(secs)
    }

    #[test]
    fn subject_then_rule_limits_over_a_sliding_hour() {
        let mut l = Limiter::default();
        // (subject, at, expected)
        let table: &[(&str, u64, Result<(), Limited>)] = &[
            ("a", 0, Ok(())),
            ("a", 10, Ok(())),
            ("a", 20, Err(Limited::Subject)),
            ("b", 30, Ok(())),
            ("c", 40, Err(Limited::Rule)),
            ("a", 3600, Ok(())), // the charge at 0 has aged out
            ("c", 3611, Ok(())), // the one at 10 too
            ("d", 3612, Err(Limited::Rule)),
        ];
        for (subject, at, want) in table {
            assert_eq!(l.try_charge(subject, s(*at), 2, 3), *want, "{subject}@{at}");
        }
    }

    #[test]
    fn forgotten_subjects_free_their_memory() {
        let mut l = Limiter::default();
        for i in 0..100 {
            l.try_charge(&format!("s{i}"), s(i), 1, 1000).unwrap();
        }
        assert_eq!(l.subjects(), 100);
        l.try_charge("late", s(10_000), 1, 1000).unwrap();
        assert_eq!(l.subjects(), 1);
    }
}
