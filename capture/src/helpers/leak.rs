//! The leak journal and the leak budget.
//!
//! A helper that was SIGKILLed but could not be reaped within the reap
//! deadline is *leaked*: it is stuck in uninterruptible sleep (or frozen) and
//! holds whatever it held. Each leak is
//!
//! 1. appended to the [`LeakJournal`] — one JSON line with the helper's pid,
//!    start ticks and boot id, the surface it was reading and the subject —
//!    and `fsync`ed before capture continues (the directory is fsynced when
//!    the file is created), so a crash cannot lose it;
//! 2. charged to the [`LeakBudget`]: one unit per unreaped helper. With the
//!    budget spent, risky surfaces are not attempted (`skipped`, with that
//!    reason), so a wedged kernel path cannot accumulate helpers without bound.
//!
//! A background reaper thread (started on the first leak, exiting when none
//! is left) polls leaked helpers; when one finally exits it is reaped, a
//! `reaped` line is journaled (fsynced) and its unit returned to the budget.
//! Leaks journaled by an earlier process (a previous `pstackctl` run) whose
//! helper is still alive — same boot id, same pid, same start ticks — are
//! adopted when a budget is created, so one-shot runs share one budget, and
//! again on [`LeakBudget::refresh_from_journal`], which a long-lived process
//! (pstackd) calls before each capture and status: one journal per host
//! ([`DEFAULT_JOURNAL`], the default of `pstackctl` and `pstackd` alike)
//! makes one budget per host — a helper leaked by either is counted by both.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use pstack_collectors::procfs::read::{TaskRef, read_stat};
use serde::{Deserialize, Serialize};

use crate::clock::wall_time_now;

/// The host's one leak journal, shared by one-shot `pstackctl` and `pstackd`
/// (`/run`: a leak does not outlive the boot).
pub const DEFAULT_JOURNAL: &str = "/run/pstack/helper-leaks.jsonl";

/// Who a helper was: enough to tell it from a later process with its pid.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HelperIdentity {
    /// Its pid.
    pub pid: u32,
    /// Field 22 of its `stat`.
    pub start_ticks: u64,
    /// The boot it ran in.
    pub boot_id: String,
}

impl HelperIdentity {
    /// Whether this exact process still exists (same pid and start ticks).
    pub fn is_alive(&self, current_boot_id: &str) -> bool {
        current_boot_id == self.boot_id
            && read_stat(TaskRef::process(self.pid), 4096)
                .is_ok_and(|s| s.facts.start_ticks == self.start_ticks)
    }
}

/// One journal line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case", deny_unknown_fields)]
pub enum JournalEntry {
    /// A helper could not be reaped after SIGKILL.
    Leaked {
        /// The helper.
        helper: HelperIdentity,
        /// Surface it was reading.
        surface: String,
        /// Subject of the capture.
        subject: String,
        /// RFC 3339 UTC.
        at: String,
    },
    /// A leaked helper finally exited and was reaped (or seen gone).
    Reaped {
        /// The helper.
        helper: HelperIdentity,
        /// RFC 3339 UTC.
        at: String,
    },
}

/// Append-only, fsynced JSON-lines journal of leaked helpers.
#[derive(Debug)]
pub struct LeakJournal {
    path: PathBuf,
    lock: Mutex<()>,
}

/// A journal write failed.
#[derive(Debug, thiserror::Error)]
#[error("leak journal {path}: {source}")]
pub struct JournalError {
    /// The journal file.
    pub path: PathBuf,
    /// The OS error.
    #[source]
    pub source: std::io::Error,
}

impl LeakJournal {
    /// A journal at `path` (created on first append, with its directory).
    pub fn new(path: impl Into<PathBuf>) -> LeakJournal {
        LeakJournal {
            path: path.into(),
            lock: Mutex::new(()),
        }
    }

    /// Where it is.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Append one entry and fsync it (and the directory when the file is new).
    pub fn append(&self, entry: &JournalEntry) -> Result<(), JournalError> {
        let _guard = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        let err = |source| JournalError {
            path: self.path.clone(),
            source,
        };
        let dir = self.path.parent().filter(|d| !d.as_os_str().is_empty());
        if let Some(d) = dir {
            std::fs::create_dir_all(d).map_err(err)?;
        }
        let existed = self.path.exists();
        let mut line = serde_json::to_vec(entry).map_err(|e| err(std::io::Error::other(e)))?;
        line.push(b'\n');
        use std::os::unix::fs::OpenOptionsExt;
        let mut f = OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(&self.path)
            .map_err(err)?;
        f.write_all(&line).map_err(err)?;
        f.sync_all().map_err(err)?;
        if !existed && let Some(d) = dir {
            std::fs::File::open(d)
                .and_then(|d| d.sync_all())
                .map_err(err)?;
        }
        Ok(())
    }

    /// Every entry, in order (unparseable lines are skipped: a torn final
    /// line from a crash must not hide the entries before it).
    pub fn entries(&self) -> Vec<JournalEntry> {
        let Ok(text) = std::fs::read_to_string(&self.path) else {
            return Vec::new();
        };
        text.lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }
}

enum Holder {
    /// Our own child: reaped with waitpid.
    Child(Child),
    /// Journaled by an earlier process: watched through procfs.
    Foreign,
}

struct Leaked {
    holder: Holder,
    helper: HelperIdentity,
}

struct BudgetState {
    leaked: Vec<Leaked>,
    reaper_running: bool,
}

struct BudgetInner {
    capacity: u64,
    journal: LeakJournal,
    boot_id: String,
    state: Mutex<BudgetState>,
    changed: Condvar,
}

/// The bounded number of unreaped helpers tolerated before risky surfaces
/// are skipped. Cheap to clone; clones share one budget.
#[derive(Clone)]
pub struct LeakBudget {
    inner: Arc<BudgetInner>,
}

impl std::fmt::Debug for LeakBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeakBudget")
            .field("capacity", &self.inner.capacity)
            .field("in_use", &self.in_use())
            .field("journal", &self.inner.journal.path)
            .finish()
    }
}

/// How often the reaper polls leaked helpers.
const REAPER_POLL: Duration = Duration::from_millis(50);

impl LeakBudget {
    /// A budget of `capacity` units journaling to `journal`. Leaks in the
    /// journal whose helper is still alive in this boot are adopted and count
    /// against the budget until they exit.
    pub fn new(capacity: u64, journal: LeakJournal, boot_id: &str) -> LeakBudget {
        let budget = LeakBudget {
            inner: Arc::new(BudgetInner {
                capacity,
                journal,
                boot_id: boot_id.to_string(),
                state: Mutex::new(BudgetState {
                    leaked: Vec::new(),
                    reaper_running: false,
                }),
                changed: Condvar::new(),
            }),
        };
        budget.adopt_journaled();
        budget
    }

    fn adopt_journaled(&self) {
        let mut open: Vec<HelperIdentity> = Vec::new();
        for entry in self.inner.journal.entries() {
            match entry {
                JournalEntry::Leaked { helper, .. } => open.push(helper),
                JournalEntry::Reaped { helper, .. } => open.retain(|h| *h != helper),
            }
        }
        let alive: Vec<HelperIdentity> = open
            .into_iter()
            .filter(|h| h.is_alive(&self.inner.boot_id))
            .collect();
        if alive.is_empty() {
            return;
        }
        let mut st = self.state();
        for helper in alive {
            // Ours already (charged here, or adopted before): counted once.
            if st.leaked.iter().any(|l| l.helper == helper) {
                continue;
            }
            st.leaked.push(Leaked {
                holder: Holder::Foreign,
                helper,
            });
        }
        self.ensure_reaper(&mut st);
        self.inner.changed.notify_all();
    }

    /// Adopt the leaks another process journaled since this budget was
    /// created (a one-shot `pstackctl` beside pstackd, or another daemon
    /// generation): each live one holds a unit here too until it exits.
    pub fn refresh_from_journal(&self) {
        self.adopt_journaled();
    }

    fn state(&self) -> MutexGuard<'_, BudgetState> {
        self.inner.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Units in the budget.
    pub fn capacity(&self) -> u64 {
        self.inner.capacity
    }

    /// Units held by helpers not yet reaped.
    pub fn in_use(&self) -> u64 {
        self.state().leaked.len() as u64
    }

    /// Units left.
    pub fn available(&self) -> u64 {
        self.inner.capacity.saturating_sub(self.in_use())
    }

    /// The journal.
    pub fn journal(&self) -> &LeakJournal {
        &self.inner.journal
    }

    /// Identities of helpers currently charged to the budget.
    pub fn leaked_helpers(&self) -> Vec<HelperIdentity> {
        self.state()
            .leaked
            .iter()
            .map(|l| l.helper.clone())
            .collect()
    }

    /// Journal a leak (fsynced) and charge one unit. The journal error, if
    /// any, is returned after the unit is charged: an unjournaled leak still
    /// counts.
    pub(crate) fn charge(
        &self,
        child: Child,
        helper: HelperIdentity,
        surface: &str,
        subject: &str,
    ) -> Result<(), JournalError> {
        let written = self.inner.journal.append(&JournalEntry::Leaked {
            helper: helper.clone(),
            surface: surface.to_string(),
            subject: subject.to_string(),
            at: wall_time_now(),
        });
        let mut st = self.state();
        st.leaked.push(Leaked {
            holder: Holder::Child(child),
            helper,
        });
        self.ensure_reaper(&mut st);
        self.inner.changed.notify_all();
        written
    }

    fn ensure_reaper(&self, st: &mut BudgetState) {
        if st.reaper_running || st.leaked.is_empty() {
            return;
        }
        st.reaper_running = true;
        let budget = self.clone();
        let spawned = std::thread::Builder::new()
            .name("pstack-reaper".into())
            .spawn(move || budget.reap_loop());
        if spawned.is_err() {
            st.reaper_running = false;
        }
    }

    fn reap_loop(&self) {
        loop {
            let mut finished = Vec::new();
            {
                let mut st = self.state();
                st.leaked.retain_mut(|l| {
                    let gone = match &mut l.holder {
                        Holder::Child(c) => !matches!(c.try_wait(), Ok(None)),
                        Holder::Foreign => !l.helper.is_alive(&self.inner.boot_id),
                    };
                    if gone {
                        finished.push(l.helper.clone());
                    }
                    !gone
                });
                if st.leaked.is_empty() {
                    st.reaper_running = false;
                }
            }
            for helper in &finished {
                // Best effort: the unit is returned either way; a failed write
                // only means the journal shows the helper as still leaked.
                let _ = self.inner.journal.append(&JournalEntry::Reaped {
                    helper: helper.clone(),
                    at: wall_time_now(),
                });
            }
            let done = {
                let st = self.state();
                self.inner.changed.notify_all();
                !st.reaper_running
            };
            if done {
                return;
            }
            std::thread::sleep(REAPER_POLL);
        }
    }

    /// Block until every leaked helper has been reaped or `timeout` passes;
    /// whether the budget is whole again.
    pub fn wait_until_whole(&self, timeout: Duration) -> bool {
        let until = Instant::now() + timeout;
        let mut st = self.state();
        while !st.leaked.is_empty() {
            let now = Instant::now();
            if now >= until {
                return false;
            }
            st = self
                .inner
                .changed
                .wait_timeout(st, until - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn journal_appends_and_reads_back_skipping_torn_lines() {
        let dir = tempfile::tempdir().unwrap();
        let j = LeakJournal::new(dir.path().join("sub/leaks.jsonl"));
        let helper = HelperIdentity {
            pid: 1,
            start_ticks: 2,
            boot_id: "b".into(),
        };
        j.append(&JournalEntry::Leaked {
            helper: helper.clone(),
            surface: "s".into(),
            subject: "p".into(),
            at: "t".into(),
        })
        .unwrap();
        std::fs::OpenOptions::new()
            .append(true)
            .open(j.path())
            .unwrap()
            .write_all(b"{\"event\":\"lea")
            .unwrap();
        assert_eq!(j.entries().len(), 1);
    }

    #[test]
    fn adopted_leak_of_a_dead_helper_is_not_charged() {
        let dir = tempfile::tempdir().unwrap();
        let j = LeakJournal::new(dir.path().join("leaks.jsonl"));
        let helper = HelperIdentity {
            pid: u32::MAX - 1,
            start_ticks: 1,
            boot_id: "boot".into(),
        };
        j.append(&JournalEntry::Leaked {
            helper,
            surface: "s".into(),
            subject: "p".into(),
            at: "t".into(),
        })
        .unwrap();
        let b = LeakBudget::new(2, j, "boot");
        assert_eq!(b.available(), 2);
    }

    #[test]
    fn adopted_leak_of_a_live_process_is_charged_until_it_exits() {
        let dir = tempfile::tempdir().unwrap();
        let j = LeakJournal::new(dir.path().join("leaks.jsonl"));
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let start_ticks = read_stat(TaskRef::process(child.id()), 4096)
            .unwrap()
            .facts
            .start_ticks;
        let helper = HelperIdentity {
            pid: child.id(),
            start_ticks,
            boot_id: "boot".into(),
        };
        j.append(&JournalEntry::Leaked {
            helper: helper.clone(),
            surface: "s".into(),
            subject: "p".into(),
            at: "t".into(),
        })
        .unwrap();
        let b = LeakBudget::new(2, j, "boot");
        assert_eq!((b.in_use(), b.available()), (1, 1));
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(b.wait_until_whole(Duration::from_secs(5)));
        assert!(
            matches!(b.journal().entries().last(), Some(JournalEntry::Reaped { helper: h, .. }) if *h == helper)
        );
    }
}
