//! The `longhorn_rebuild` condition: what one more reading (a manager poll
//! or an Engine Event) changed for one replica's rebuild — a pure function
//! ([`step`]) of typed readings, and the book of rebuilds in flight it is
//! folded into ([`RebuildBook`]). No I/O, no clock.
//!
//! What upstream sets (longhorn-manager v1.9.0 `controller/engine_controller.go`
//! `startRebuilding` l.1770-1935, `api/model.go` l.1515-1535; engine
//! `pkg/sync/sync.go` `AddReplica` l.439-495):
//! - the manager records `Rebuilding` "Start rebuilding replica %v with
//!   Address %v for normal engine %v and volume %v" (l.1860) and calls
//!   `ReplicaAdd`; the engine's `GetReplica` on T:P_T, `ReplicaCreate(WO)`,
//!   source selection and the head `.meta` all run before `FilesSync`, and
//!   only `PrepareRebuild` inside `FilesSync` sets `in_progress`. A failure
//!   in any step is `FailedRebuilding` "Failed rebuilding replica with
//!   Address %v: %v" (l.1874) followed by `ReplicaRemove` (l.1880), so the
//!   REST `mode` (the engine's `ReplicaModeMap`) becomes `""`, not `ERR`;
//!   `failedAt` and the Replica CR's `RebuildFailed` condition are set only
//!   outside backoff (l.1892-1899);
//! - snapshot purge before rebuilding can end it first:
//!   `FailedStartingSnapshotPurge` (l.1793) or `TimeoutSnapshotPurge`
//!   (l.1827), both before the `Rebuilding` Event;
//! - success is `Rebuilt` "Replica %v with Address %v has been rebuilt for
//!   volume %v" (l.1916) and the replica turning `RW`;
//! - `ERR` is the engine's data-path fault (`Faulted` "Detected replica %v
//!   (%v) in error", l.855), not a rebuild outcome of its own;
//! - a replica deleted, evicted or detached on purpose also leaves without
//!   `RW`; only the absence of `FailedRebuilding` tells it apart.
//!
//! The condition ([`step`]):
//! - **started** at the first of: an Engine Event `Rebuilding`,
//!   `FailedRebuilding`, `TimeoutSnapshotPurge` or
//!   `FailedStartingSnapshotPurge` naming the volume; a replica in `WO`
//!   (the engine added it, before file sync); an `in_progress` entry;
//! - **failed**: `FailedRebuilding` (its text, and the step it names);
//!   a snapshot-purge failure before rebuilding; the entry's `error`;
//!   `Faulted`/mode `ERR` (an engine-side data-path fault); `failedAt` set;
//! - **complete**: `Rebuilt`; the entry `complete`; the replica `RW`;
//! - **removed on purpose** (not a failure): the replica or the volume is
//!   no longer listed, or the volume is detached, with no `FailedRebuilding`;
//! - **retried** (not an end): an entry still `in_progress` whose `error`
//!   names a reset — from v1.11 the engine retries each file up to 3 times
//!   and several sources feed one rebuild (`fromReplicaList`); counted in
//!   `Seen::retries`, and the rebuild is judged by its final state;
//! - **unresolved**: removed from the engine (`mode ""`, no entry) with no
//!   `FailedRebuilding` after [`GONE_GRACE_POLLS`] polls (the Event is
//!   recorded before `ReplicaRemove`, so a missing one is missing).
//!
//! A reading the manager could not give (down, garbage) is not a reading:
//! the caller does not fold it, so nothing ends because the manager was
//! unreachable. A rebuild that starts and ends between two polls is seen
//! only through its Events.

use std::collections::BTreeMap;

use pstack_capture::longhorn::kube::Event;
use pstack_capture::longhorn::model::{RebuildState, Volume};

/// Polls a replica may sit removed from the engine (`mode ""`, no entry)
/// before the rebuild is called unresolved: the `FailedRebuilding` Event is
/// recorded before the removal, so it normally arrives first.
pub const GONE_GRACE_POLLS: u32 = 3;

/// Retried reset texts kept per rebuild (the count goes on).
pub const MAX_RETRY_TEXTS: usize = 8;

/// What an Engine Event says about a rebuild (`constant/events.go`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Signal {
    /// `Rebuilding` (Normal): "Start rebuilding replica …" or the monitor's
    /// "Detected rebuilding replica %v (%v)".
    Rebuilding,
    /// `Rebuilt` (Normal).
    Rebuilt,
    /// `FailedRebuilding` (Warning).
    FailedRebuilding,
    /// `Faulted` (Warning): the engine set a replica `ERR` (data path).
    Faulted,
    /// `TimeoutSnapshotPurge` (Warning), before rebuilding.
    TimeoutSnapshotPurge,
    /// `FailedStartingSnapshotPurge` (Warning), before rebuilding.
    FailedStartingSnapshotPurge,
}

impl Signal {
    /// The Event `reason` this is, or None. A snapshot-purge failure
    /// "after rebuilding" (l.1926) is not about the rebuild's outcome.
    pub fn of(reason: &str, message: &str) -> Option<Signal> {
        Some(match reason {
            "Rebuilding" => Signal::Rebuilding,
            "Rebuilt" => Signal::Rebuilt,
            "FailedRebuilding" => Signal::FailedRebuilding,
            "Faulted" => Signal::Faulted,
            "TimeoutSnapshotPurge" => Signal::TimeoutSnapshotPurge,
            "FailedStartingSnapshotPurge" if !message.contains("after rebuilding") => {
                Signal::FailedStartingSnapshotPurge
            }
            _ => return None,
        })
    }
    /// The Event reason.
    pub fn as_str(self) -> &'static str {
        match self {
            Signal::Rebuilding => "Rebuilding",
            Signal::Rebuilt => "Rebuilt",
            Signal::FailedRebuilding => "FailedRebuilding",
            Signal::Faulted => "Faulted",
            Signal::TimeoutSnapshotPurge => "TimeoutSnapshotPurge",
            Signal::FailedStartingSnapshotPurge => "FailedStartingSnapshotPurge",
        }
    }
    /// Whether this Event, first seen, opens a window.
    fn opens(self) -> bool {
        !matches!(self, Signal::Rebuilt | Signal::Faulted)
    }
}

/// One Event remembered for a rebuild.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signalled {
    /// What it says.
    pub signal: Signal,
    /// Its message, verbatim.
    pub message: String,
    /// Its `lastTimestamp` (or `eventTime`).
    pub at: String,
}

/// The step of `AddReplica` a failure names (engine `pkg/sync/sync.go`
/// v1.9.0 l.439-495; manager `startRebuilding`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailStep {
    /// Snapshot purge before rebuilding (manager, before `ReplicaAdd`).
    SnapshotPurge,
    /// E→T:P_T `GetReplica` (`checkAndExpandReplica`): "failed to get replica".
    GetReplica,
    /// Source selection over S:P_S+2: "failed to find good replica to copy from" (l.655).
    SourceSelection,
    /// `FilesSync` / the sync agents' file transfer (T→S:P_S+2, S→T:P_T+3…).
    FileSync,
    /// `ReplicaAdd` failed at a step its text does not name, before file sync.
    AddReplicaBeforeFileSync,
}

impl FailStep {
    /// Wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            FailStep::SnapshotPurge => "snapshot_purge",
            FailStep::GetReplica => "get_replica",
            FailStep::SourceSelection => "source_selection",
            FailStep::FileSync => "file_sync",
            FailStep::AddReplicaBeforeFileSync => "add_replica_before_file_sync",
        }
    }
    /// Whether it is before file sync.
    pub fn before_file_sync(self) -> bool {
        self != FailStep::FileSync
    }
}

/// The step a failure text names; `file_sync_seen`: an `in_progress`
/// entry was seen (file sync had begun).
pub fn failing_step(signal: Option<Signal>, text: &str, file_sync_seen: bool) -> FailStep {
    let t = text.to_ascii_lowercase();
    if matches!(
        signal,
        Some(Signal::TimeoutSnapshotPurge | Signal::FailedStartingSnapshotPurge)
    ) || t.contains("snapshot purge")
    {
        FailStep::SnapshotPurge
    } else if t.contains("failed to find good replica to copy from") {
        FailStep::SourceSelection
    } else if t.contains("failed to send file")
        || t.contains("failed to sync")
        || t.contains("filessync")
        || t.contains("v1-ssync")
    {
        FailStep::FileSync
    } else if t.contains("failed to get replica ") && !t.contains("rebuild status") {
        FailStep::GetReplica
    } else if file_sync_seen {
        FailStep::FileSync
    } else {
        FailStep::AddReplicaBeforeFileSync
    }
}

/// What the book remembers of a rebuild it follows.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Seen {
    /// Source replicas the manager named.
    pub from: Vec<String>,
    /// Last progress reported.
    pub progress: Option<i64>,
    /// Last non-empty `error` text seen on its entry.
    pub last_error: String,
    /// What opened it: an Event reason, `replica WO` or `in_progress`.
    pub opened_by: String,
    /// An `in_progress` entry was seen (file sync had begun).
    pub file_sync_seen: bool,
    /// The Engine Events seen for it, in order.
    pub signals: Vec<Signalled>,
    /// Consecutive polls with the replica removed from the engine (`mode
    /// ""`, no entry) and no `FailedRebuilding`, after it was in it.
    pub gone_polls: u32,
    /// The replica was seen in the engine (mode `WO`/`RW`/`ERR`): before
    /// that, `mode ""` is the rebuild not yet past `GetReplica`.
    pub in_engine_seen: bool,
    /// The Replica CR's `RebuildFailed` condition when it is `True`:
    /// (reason, message). Reset by the manager before each rebuild
    /// (`engine_controller.go` v1.9.0 l.1838), so a `True` read while this
    /// rebuild is followed is this rebuild's.
    pub rebuild_failed: Option<(String, String)>,
    /// Resets the rebuild survived: an `error` text on an entry still
    /// `in_progress` (from v1.11 each file is retried up to
    /// `SyncRetryCount = 3`, engine `pkg/sync/rpc/server.go`, and the
    /// entry stays in file sync while the next attempt runs), counted once
    /// per distinct text. A retry, not the rebuild's end.
    pub retries: u32,
    /// The retried resets' texts, first [`MAX_RETRY_TEXTS`].
    pub retry_errors: Vec<String>,
}

impl Seen {
    fn signal(&self, s: Signal) -> Option<&Signalled> {
        self.signals.iter().rev().find(|x| x.signal == s)
    }
}

/// How a rebuild failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// The Engine's `FailedRebuilding` Event.
    FailedRebuilding,
    /// `TimeoutSnapshotPurge` / `FailedStartingSnapshotPurge` before rebuilding.
    SnapshotPurge,
    /// Its entry says `state: error`.
    StateError,
    /// `Faulted` or mode `ERR`: the engine's data path set the replica ERR.
    EngineFault,
    /// The replica's `failedAt` is set.
    ReplicaFailed,
    /// The Replica CR's `RebuildFailed` condition is `True` (its reason is
    /// Longhorn's own verdict: `Disconnection`, `General`, a node reason).
    RebuildFailedCondition,
}

impl Failure {
    /// Wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Failure::FailedRebuilding => "failed_rebuilding",
            Failure::SnapshotPurge => "snapshot_purge",
            Failure::StateError => "state_error",
            Failure::EngineFault => "engine_fault",
            Failure::ReplicaFailed => "replica_failed",
            Failure::RebuildFailedCondition => "rebuild_failed_condition",
        }
    }
}

/// How a followed rebuild ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// It completed; `basis` says what showed it.
    Complete {
        /// `Rebuilt Event`, `state complete` or `entry gone, replica RW`.
        basis: &'static str,
    },
    /// It failed.
    Failed {
        /// How.
        how: Failure,
        /// The failure's text: the Event's message, else the manager's
        /// error text (this reading's, else the last seen).
        error: String,
        /// The step it failed at.
        step: FailStep,
        /// The replica's `failedAt` ("" when unset or the replica is gone).
        failed_at: String,
        /// The replica's mode ("" when removed from the engine or gone).
        mode: String,
    },
    /// The replica or volume was removed on purpose: no `FailedRebuilding`.
    Removed {
        /// What showed it.
        basis: &'static str,
    },
    /// Removed from the engine with no `FailedRebuilding` and no sign of a
    /// deliberate removal: the outcome is not known.
    Unresolved {
        /// What was seen.
        basis: &'static str,
    },
}

impl Outcome {
    /// Counter label.
    pub fn label(&self) -> String {
        match self {
            Outcome::Complete { .. } => "complete".into(),
            Outcome::Failed { how, .. } => format!("failed_{}", how.as_str()),
            Outcome::Removed { .. } => "removed".into(),
            Outcome::Unresolved { .. } => "unresolved".into(),
        }
    }
}

/// What one reading changed for a replica's rebuild.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// A rebuild began (or was first seen).
    Started,
    /// Still going.
    Continuing,
    /// It ended.
    Ended(Outcome),
}

/// The change for `replica` given what was `followed` before (None: not
/// followed; its `signals` already hold this reading's Event, if any),
/// the latest manager reading of its volume (`Some(None)`: the volume is
/// no longer listed; `None`: no reading yet) and `opening`: the Event this
/// reading is, when it is one. `None`: nothing to say (not rebuilding, not
/// followed).
pub fn step(
    followed: Option<&Seen>,
    now: Option<Option<&Volume>>,
    replica: &str,
    opening: Option<Signal>,
) -> Option<Change> {
    let vol = now.flatten();
    let entry = vol.and_then(|v| v.rebuild.iter().find(|e| e.replica == replica));
    let rep = vol.and_then(|v| v.replicas.iter().find(|r| r.name == replica));
    let Some(seen) = followed else {
        if opening.is_some_and(Signal::opens) {
            return Some(Change::Started);
        }
        let failed = rep.is_some_and(|r| !r.failed_at.is_empty() || r.mode == "ERR");
        let rebuilding = entry.is_some_and(|e| {
            e.state == RebuildState::InProgress
                || (e.is_rebuilding == Some(true) && !e.state.terminal())
        }) || (rep.is_some_and(|r| r.mode == "WO")
            && !entry.is_some_and(|e| e.state.terminal()));
        return (rebuilding && !failed).then_some(Change::Started);
    };
    let failed = |how: Failure, error: String, signal: Option<Signal>| {
        let step = failing_step(signal, &error, seen.file_sync_seen);
        Change::Ended(Outcome::Failed {
            how,
            error,
            step,
            failed_at: rep.map(|r| r.failed_at.clone()).unwrap_or_default(),
            mode: rep.map(|r| r.mode.clone()).unwrap_or_default(),
        })
    };
    let manager_error = || {
        entry
            .map(|e| e.error.clone())
            .filter(|e| !e.is_empty())
            .unwrap_or_else(|| seen.last_error.clone())
    };
    // Events first: they carry Longhorn's own verdict and text.
    if let Some(s) = seen.signal(Signal::FailedRebuilding) {
        return Some(failed(
            Failure::FailedRebuilding,
            s.message.clone(),
            Some(s.signal),
        ));
    }
    for p in [
        Signal::TimeoutSnapshotPurge,
        Signal::FailedStartingSnapshotPurge,
    ] {
        if let Some(s) = seen.signal(p) {
            return Some(failed(Failure::SnapshotPurge, s.message.clone(), Some(p)));
        }
    }
    if seen.signal(Signal::Rebuilt).is_some() {
        return Some(Change::Ended(Outcome::Complete {
            basis: "Rebuilt Event",
        }));
    }
    if let Some(s) = seen.signal(Signal::Faulted) {
        return Some(failed(Failure::EngineFault, s.message.clone(), None));
    }
    if let Some((reason, message)) = &seen.rebuild_failed {
        return Some(failed(
            Failure::RebuildFailedCondition,
            format!("RebuildFailed ({reason}): {message}"),
            None,
        ));
    }
    let Some(vol) = now else {
        // Events only so far: the rebuild goes on.
        return Some(Change::Continuing);
    };
    let Some(v) = vol else {
        return Some(Change::Ended(Outcome::Removed {
            basis: "volume no longer listed, no FailedRebuilding",
        }));
    };
    Some(match (entry, rep) {
        (Some(e), _) if e.state == RebuildState::Error => {
            failed(Failure::StateError, manager_error(), None)
        }
        (Some(e), _) if e.state == RebuildState::Complete => Change::Ended(Outcome::Complete {
            basis: "state complete",
        }),
        (_, Some(r)) if r.mode == "ERR" => failed(Failure::EngineFault, manager_error(), None),
        (_, Some(r)) if !r.failed_at.is_empty() => {
            failed(Failure::ReplicaFailed, manager_error(), None)
        }
        (Some(_), _) => Change::Continuing,
        (None, Some(r)) if r.mode == "RW" => Change::Ended(Outcome::Complete {
            basis: "entry gone, replica RW",
        }),
        (None, None) => Change::Ended(Outcome::Removed {
            basis: "replica no longer listed, no FailedRebuilding",
        }),
        (None, Some(_)) if v.state == "detached" || v.state == "detaching" => {
            Change::Ended(Outcome::Removed {
                basis: "volume detached, no FailedRebuilding",
            })
        }
        // WO with no entry yet: before file sync (the entry appears with
        // `PrepareRebuild`).
        (None, Some(r)) if r.mode == "WO" => Change::Continuing,
        // Not yet added by the engine (GetReplica, source selection).
        (None, Some(_)) if !seen.in_engine_seen => Change::Continuing,
        (None, Some(_)) if seen.gone_polls + 1 < GONE_GRACE_POLLS => Change::Continuing,
        (None, Some(_)) => Change::Ended(Outcome::Unresolved {
            basis: "replica removed from the engine (mode \"\"), no FailedRebuilding, no removal seen",
        }),
    })
}

/// The volume an Engine Event is about: the volume whose `controllers[]`
/// names the Engine, else the Engine name before its `-e-` suffix
/// (`<volume>-e-<id>`). None for Events on other kinds.
pub fn volume_of_event(ev: &Event, volumes: &[Volume]) -> Option<String> {
    if ev.kind != "Engine" || ev.name.is_empty() {
        return None;
    }
    if let Some(v) = volumes
        .iter()
        .find(|v| v.controllers.iter().any(|c| c.name == ev.name))
    {
        return Some(v.name.clone());
    }
    ev.name
        .rfind("-e-")
        .filter(|i| *i > 0)
        .map(|i| ev.name[..i].to_string())
}

/// The replica an Event's message names: by name ("replica X with
/// Address", "Detected replica X (…)", "Replica X with Address"), else by
/// the address it names among the volume's replicas (not `RW` first), else
/// "" (the snapshot-purge Events name only the volume).
pub fn replica_of_event(message: &str, volume: Option<&Volume>) -> String {
    let words: Vec<&str> = message.split_whitespace().collect();
    let known = |n: &str| volume.is_none_or(|v| v.replicas.iter().any(|r| r.name == n));
    for w in words.windows(2) {
        if w[0].eq_ignore_ascii_case("replica") {
            let name = w[1].trim_end_matches([',', ':']);
            if name != "with" && !name.starts_with("tcp://") && !name.is_empty() && known(name) {
                return name.to_string();
            }
        }
    }
    let Some(v) = volume else {
        return String::new();
    };
    let named_ip = words
        .windows(2)
        .find(|w| w[0] == "Address")
        .map(|w| w[1].trim_end_matches([',', ':']))
        .and_then(pstack_capture::longhorn::model::address_ip);
    let Some(ip) = named_ip else {
        return String::new();
    };
    let mut hits: Vec<_> = v
        .replicas
        .iter()
        .filter(|r| pstack_capture::longhorn::model::address_ip(&r.address) == Some(ip))
        .collect();
    hits.sort_by_key(|r| r.mode == "RW");
    hits.first().map(|r| r.name.clone()).unwrap_or_default()
}

/// A change of one rebuild, with the reading that showed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RebuildEvent {
    /// Volume name.
    pub volume: String,
    /// Target replica name ("" when no reading names it).
    pub replica: String,
    /// What changed.
    pub change: Change,
    /// What the book knew of it (after this reading).
    pub seen: Seen,
}

/// The rebuilds followed, by (volume, replica), and the last manager reading.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RebuildBook {
    followed: BTreeMap<(String, String), Seen>,
    last: Option<Vec<Volume>>,
}

impl RebuildBook {
    /// Rebuilds followed now.
    pub fn followed(&self) -> impl Iterator<Item = (&(String, String), &Seen)> {
        self.followed.iter()
    }

    /// The last complete manager reading folded.
    pub fn last_reading(&self) -> &[Volume] {
        self.last.as_deref().unwrap_or(&[])
    }

    fn reading_of(&self, volume: &str) -> Option<Option<&Volume>> {
        self.last
            .as_ref()
            .map(|l| l.iter().find(|v| v.name == volume))
    }

    /// Fold one complete reading (every volume the rule watches) into the
    /// book; the changes, `Started` and `Ended` only.
    pub fn observe(&mut self, volumes: &[Volume]) -> Vec<RebuildEvent> {
        self.last = Some(volumes.to_vec());
        let by_name: BTreeMap<&str, &Volume> =
            volumes.iter().map(|v| (v.name.as_str(), v)).collect();
        let mut out = Vec::new();
        let keys: Vec<(String, String)> = self.followed.keys().cloned().collect();
        for key in keys {
            let now = by_name.get(key.0.as_str()).copied();
            // A rebuild opened by an Event that named no replica takes the
            // volume's WO replica once the manager shows one.
            if key.1.is_empty()
                && let Some(wo) = now.and_then(|v| v.replicas.iter().find(|r| r.mode == "WO"))
                && !self
                    .followed
                    .contains_key(&(key.0.clone(), wo.name.clone()))
                && let Some(seen) = self.followed.remove(&key)
            {
                self.followed.insert((key.0.clone(), wo.name.clone()), seen);
                continue;
            }
            let seen = self.followed.get(&key).cloned().unwrap_or_default();
            match step(Some(&seen), Some(now), &key.1, None) {
                Some(Change::Ended(o)) => {
                    self.followed.remove(&key);
                    out.push(RebuildEvent {
                        volume: key.0,
                        replica: key.1,
                        change: Change::Ended(o),
                        seen,
                    });
                }
                _ => {
                    if let Some(s) = self.followed.get_mut(&key) {
                        update(s, now, &key.1);
                    }
                }
            }
        }
        for v in volumes {
            let candidates = v
                .rebuild
                .iter()
                .map(|e| e.replica.clone())
                .chain(
                    v.replicas
                        .iter()
                        .filter(|r| r.mode == "WO")
                        .map(|r| r.name.clone()),
                )
                .collect::<Vec<_>>();
            for replica in candidates {
                let key = (v.name.clone(), replica.clone());
                if replica.is_empty()
                    || self.followed.contains_key(&key)
                    || out.iter().any(|e| e.volume == key.0 && e.replica == key.1)
                {
                    continue;
                }
                if step(None, Some(Some(v)), &replica, None) == Some(Change::Started) {
                    let entry = v.rebuild.iter().any(|e| e.replica == replica);
                    let mut seen = Seen {
                        opened_by: if entry {
                            "rebuildStatus entry"
                        } else {
                            "replica WO"
                        }
                        .into(),
                        ..Seen::default()
                    };
                    update(&mut seen, Some(v), &replica);
                    self.followed.insert(key.clone(), seen.clone());
                    out.push(RebuildEvent {
                        volume: key.0,
                        replica: key.1,
                        change: Change::Started,
                        seen,
                    });
                }
            }
        }
        out
    }

    /// Fold one Engine Event of `volume` (see [`volume_of_event`]); the
    /// changes: `Started` when it opens a rebuild, `Ended` when it ends one
    /// (both for a `FailedRebuilding` that is the first thing seen).
    pub fn signal(&mut self, volume: &str, ev: &Event) -> Vec<RebuildEvent> {
        let Some(signal) = Signal::of(&ev.reason, &ev.message) else {
            return Vec::new();
        };
        let reading_owned: Option<Option<Volume>> = self.reading_of(volume).map(|v| v.cloned());
        let reading = reading_owned.as_ref().map(Option::as_ref);
        let mut replica = replica_of_event(&ev.message, reading.flatten());
        if replica.is_empty() {
            let of_volume: Vec<&String> = self
                .followed
                .keys()
                .filter(|k| k.0 == volume)
                .map(|k| &k.1)
                .collect();
            if let [only] = of_volume.as_slice() {
                replica = (*only).clone();
            }
        }
        let key = (volume.to_string(), replica);
        // An Event that names a replica ends the same rebuild opened by an
        // Event that named none.
        if !key.1.is_empty()
            && !self.followed.contains_key(&key)
            && let Some(seen) = self.followed.remove(&(volume.to_string(), String::new()))
        {
            self.followed.insert(key.clone(), seen);
        }
        let signalled = Signalled {
            signal,
            message: ev.message.clone(),
            at: ev.last.clone(),
        };
        let mut out = Vec::new();
        if !self.followed.contains_key(&key) {
            if step(None, reading, &key.1, Some(signal)) != Some(Change::Started) {
                return out;
            }
            let seen = Seen {
                opened_by: format!("{} Event", signal.as_str()),
                ..Seen::default()
            };
            self.followed.insert(key.clone(), seen.clone());
            out.push(RebuildEvent {
                volume: key.0.clone(),
                replica: key.1.clone(),
                change: Change::Started,
                seen,
            });
        }
        let Some(seen) = self.followed.get_mut(&key) else {
            return out;
        };
        seen.signals.push(signalled);
        let seen = seen.clone();
        // Judged on the Events alone: the last manager reading is older than
        // this Event (a poll judges the two together).
        if let Some(Change::Ended(o)) = step(Some(&seen), None, &key.1, Some(signal)) {
            self.followed.remove(&key);
            out.push(RebuildEvent {
                volume: key.0,
                replica: key.1,
                change: Change::Ended(o),
                seen,
            });
        }
        out
    }
}

impl RebuildBook {
    /// The followed rebuilds' target replicas (at most `max`), whose Replica
    /// CRs a poll reads.
    pub fn replicas_to_check(&self, max: usize) -> Vec<String> {
        self.followed
            .keys()
            .filter(|k| !k.1.is_empty())
            .map(|k| k.1.clone())
            .take(max)
            .collect()
    }

    /// Fold a Replica CR's `RebuildFailed` condition read for `replica`
    /// (before the poll that read it is folded).
    pub fn condition(&mut self, replica: &str, reason: &str, message: &str, status_true: bool) {
        for (k, s) in self.followed.iter_mut() {
            if k.1 == replica {
                s.rebuild_failed = status_true.then(|| (reason.to_string(), message.to_string()));
            }
        }
    }
}

fn update(s: &mut Seen, now: Option<&Volume>, replica: &str) {
    let rep = now.and_then(|v| v.replicas.iter().find(|r| r.name == replica));
    let e = now.and_then(|v| v.rebuild.iter().find(|e| e.replica == replica));
    if rep.is_some_and(|r| !r.mode.is_empty()) {
        s.in_engine_seen = true;
    }
    if e.is_none() && rep.is_some_and(|r| r.mode.is_empty()) && s.in_engine_seen {
        s.gone_polls += 1;
    } else {
        s.gone_polls = 0;
    }
    let Some(e) = e else {
        return;
    };
    if !e.from.is_empty() {
        s.from = e.from.clone();
    }
    if e.progress.is_some() {
        s.progress = e.progress;
    }
    if !e.error.is_empty() {
        // Still in file sync with an error: the file's next attempt is under
        // way (v1.11+), a retry. An `error` state ends it in `step` instead.
        if e.state == RebuildState::InProgress && e.error != s.last_error {
            s.retries += 1;
            if s.retry_errors.len() < MAX_RETRY_TEXTS {
                s.retry_errors.push(e.error.clone());
            }
        }
        s.last_error = e.error.clone();
    }
    if e.state == RebuildState::InProgress || e.is_rebuilding == Some(true) {
        s.file_sync_seen = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pstack_capture::longhorn::model::parse_volume;

    /// A v1.9 `api/model.go` volume in `state`: replica `r-t` in `mode`
    /// with `failed_at` (None: not listed), and `entry` as its
    /// `rebuildStatus` (None: `[]`).
    fn vol_in(
        state: &str,
        entry: Option<(&str, Option<bool>, &str)>,
        target: Option<(&str, &str)>,
    ) -> Volume {
        let rebuild = match entry {
            None => serde_json::json!([]),
            Some((state, is_rebuilding, error)) => serde_json::json!([{
                "id": "", "type": "rebuildStatus", "links": null, "actions": null,
                "replica": "r-t", "fromReplica": "r-s", "state": state, "progress": 40,
                "isRebuilding": is_rebuilding, "error": error}]),
        };
        let mut replicas = vec![
            serde_json::json!({"name": "r-s", "hostId": "n-s", "address": "10.0.0.2", "mode": "RW", "failedAt": ""}),
        ];
        if let Some((mode, failed_at)) = target {
            replicas.push(serde_json::json!({"name": "r-t", "hostId": "n-t", "address": "10.0.0.3", "mode": mode, "failedAt": failed_at}));
        }
        let doc = serde_json::json!({"name": "v", "state": state, "robustness": "degraded",
            "dataEngine": "v1", "replicas": replicas,
            "controllers": [{"name": "v-e-0", "hostId": "n-e", "address": "10.0.0.1"}],
            "rebuildStatus": rebuild});
        parse_volume(doc.to_string().as_bytes()).unwrap()
    }

    fn vol(entry: Option<(&str, Option<bool>, &str)>, mode: &str, failed_at: &str) -> Volume {
        vol_in("attached", entry, Some((mode, failed_at)))
    }

    fn event(reason: &str, message: &str) -> Event {
        Event {
            kind: "Engine".into(),
            name: "v-e-0".into(),
            reason: reason.into(),
            event_type: "Warning".into(),
            message: message.into(),
            count: 1,
            last: "2026-12-07T08:00:00Z".into(),
            component: "longhorn-engine-controller".into(),
            resource_version: String::new(),
        }
    }

    /// Engine v1.9.0 `pkg/sync/rpc/server.go` l.539 around
    /// `pkg/replica/client/client.go` l.465 (longhorn#11006's shape).
    const RESET: &str = "replica tcp://10.0.0.2:10000 failed to send file x.img to 10.0.0.3:10503: failed to send file x.img to 10.0.0.3:10503: rpc error: code = Unavailable desc = error reading from server: read tcp 10.0.0.3:43126->10.0.0.2:10002: read: connection reset by peer";
    /// longhorn#8091, verbatim (manager l.1874 format around the engine's text).
    const DIAL: &str = "Failed rebuilding replica with Address 10.0.0.3:10000: proxyServer=10.0.0.1:8501 destination=10.0.0.1:10000: failed to add replica tcp://10.0.0.3:10000 for volume: rpc error: code = Unavailable desc = failed to get replica 10.0.0.3:10000: rpc error: code = Unavailable desc = connection error: desc = \"transport: Error while dialing: dial tcp 10.0.0.3:10000: i/o timeout\"";

    fn with(signals: &[(Signal, &str)], file_sync_seen: bool, gone_polls: u32) -> Seen {
        Seen {
            from: vec!["r-s".into()],
            progress: Some(30),
            last_error: "earlier text".into(),
            opened_by: "Rebuilding Event".into(),
            file_sync_seen,
            signals: signals
                .iter()
                .map(|(s, m)| Signalled {
                    signal: *s,
                    message: (*m).into(),
                    at: String::new(),
                })
                .collect(),
            gone_polls,
            in_engine_seen: true,
            rebuild_failed: None,
            retries: 0,
            retry_errors: Vec::new(),
        }
    }

    #[test]
    fn the_condition_is_a_function_of_typed_readings() {
        let plain = with(&[], true, 0);
        let before = with(&[], false, 0);
        let gone1 = with(&[], true, GONE_GRACE_POLLS - 2);
        let gone2 = with(&[], true, GONE_GRACE_POLLS - 1);
        let condition = Seen {
            rebuild_failed: Some((
                "Disconnection".into(),
                "rpc error: code = Unavailable desc = error reading from server".into(),
            )),
            ..with(&[], true, 0)
        };
        let not_added = Seen {
            in_engine_seen: false,
            ..with(&[], false, GONE_GRACE_POLLS + 5)
        };
        let dial = with(&[(Signal::FailedRebuilding, DIAL)], false, 0);
        let rebuilt = with(
            &[(
                Signal::Rebuilt,
                "Replica r-t with Address 10.0.0.3:10000 has been rebuilt for volume v",
            )],
            true,
            0,
        );
        let purge = with(
            &[(
                Signal::TimeoutSnapshotPurge,
                "Timeout waiting for snapshot purge done before rebuilding volume v, wait interval 60 second",
            )],
            false,
            0,
        );
        let faulted = with(
            &[(
                Signal::Faulted,
                "Detected replica r-t (10.0.0.3:10000) in error",
            )],
            true,
            0,
        );
        let failed = |how, error: &str, step, failed_at: &str, mode: &str| {
            Some(Change::Ended(Outcome::Failed {
                how,
                error: error.into(),
                step,
                failed_at: failed_at.into(),
                mode: mode.into(),
            }))
        };
        let ended = |o| Some(Change::Ended(o));
        /// (case, followed before, reading, opening Event, the change)
        type Case<'a> = (
            &'a str,
            Option<&'a Seen>,
            Option<Option<Volume>>,
            Option<Signal>,
            Option<Change>,
        );
        let table: Vec<Case> = vec![
            // Not followed: what opens a window.
            (
                "no entry, RW",
                None,
                Some(Some(vol(None, "RW", ""))),
                None,
                None,
            ),
            (
                "Rebuilding Event opens, no reading yet",
                None,
                None,
                Some(Signal::Rebuilding),
                Some(Change::Started),
            ),
            (
                "FailedRebuilding first opens",
                None,
                None,
                Some(Signal::FailedRebuilding),
                Some(Change::Started),
            ),
            (
                "TimeoutSnapshotPurge opens",
                None,
                None,
                Some(Signal::TimeoutSnapshotPurge),
                Some(Change::Started),
            ),
            (
                "Rebuilt alone opens nothing",
                None,
                None,
                Some(Signal::Rebuilt),
                None,
            ),
            (
                "Faulted alone opens nothing",
                None,
                Some(Some(vol(None, "ERR", ""))),
                Some(Signal::Faulted),
                None,
            ),
            (
                "a WO replica opens, before file sync",
                None,
                Some(Some(vol(None, "WO", ""))),
                None,
                Some(Change::Started),
            ),
            (
                "WO with state \"\" opens",
                None,
                Some(Some(vol(Some(("", None, "")), "WO", ""))),
                None,
                Some(Change::Started),
            ),
            (
                "in_progress opens",
                None,
                Some(Some(vol(Some(("in_progress", Some(true), "")), "WO", ""))),
                None,
                Some(Change::Started),
            ),
            (
                "mode \"\" opens nothing",
                None,
                Some(Some(vol(None, "", ""))),
                None,
                None,
            ),
            (
                "a terminal entry never seen running is not a start",
                None,
                Some(Some(vol(Some(("error", Some(false), RESET)), "WO", ""))),
                None,
                None,
            ),
            (
                "a failedAt replica's WO is not a start",
                None,
                Some(Some(vol(None, "WO", "2026-12-03T19:40:12Z"))),
                None,
                None,
            ),
            (
                "mode ERR is not a start",
                None,
                Some(Some(vol(Some(("in_progress", Some(true), "")), "ERR", ""))),
                None,
                None,
            ),
            ("volume absent, not followed", None, Some(None), None, None),
            // Followed: Events.
            (
                "FailedRebuilding before file sync: GetReplica",
                Some(&dial),
                Some(Some(vol(None, "WO", ""))),
                Some(Signal::FailedRebuilding),
                failed(
                    Failure::FailedRebuilding,
                    DIAL,
                    FailStep::GetReplica,
                    "",
                    "WO",
                ),
            ),
            (
                "FailedRebuilding wins over a reading that looks healthy",
                Some(&dial),
                Some(Some(vol(None, "RW", ""))),
                None,
                failed(
                    Failure::FailedRebuilding,
                    DIAL,
                    FailStep::GetReplica,
                    "",
                    "RW",
                ),
            ),
            (
                "snapshot purge timeout",
                Some(&purge),
                None,
                None,
                failed(
                    Failure::SnapshotPurge,
                    "Timeout waiting for snapshot purge done before rebuilding volume v, wait interval 60 second",
                    FailStep::SnapshotPurge,
                    "",
                    "",
                ),
            ),
            (
                "Rebuilt is success",
                Some(&rebuilt),
                Some(Some(vol(None, "WO", ""))),
                Some(Signal::Rebuilt),
                ended(Outcome::Complete {
                    basis: "Rebuilt Event",
                }),
            ),
            (
                "Faulted: engine-side data-path fault",
                Some(&faulted),
                Some(Some(vol(None, "ERR", ""))),
                None,
                failed(
                    Failure::EngineFault,
                    "Detected replica r-t (10.0.0.3:10000) in error",
                    FailStep::FileSync,
                    "",
                    "ERR",
                ),
            ),
            (
                "Events only, no reading: goes on",
                Some(&plain),
                None,
                None,
                Some(Change::Continuing),
            ),
            (
                "RebuildFailed condition True: Longhorn's own verdict",
                Some(&condition),
                Some(Some(vol(None, "", "2026-12-07T08:00:00Z"))),
                None,
                failed(
                    Failure::RebuildFailedCondition,
                    "RebuildFailed (Disconnection): rpc error: code = Unavailable desc = error reading from server",
                    FailStep::FileSync,
                    "2026-12-07T08:00:00Z",
                    "",
                ),
            ),
            // Followed: manager readings.
            (
                "still in progress",
                Some(&plain),
                Some(Some(vol(Some(("in_progress", Some(true), "")), "WO", ""))),
                None,
                Some(Change::Continuing),
            ),
            (
                "WO, no entry, before file sync: goes on",
                Some(&before),
                Some(Some(vol(None, "WO", ""))),
                None,
                Some(Change::Continuing),
            ),
            (
                "state \"\" with an error is not an end",
                Some(&plain),
                Some(Some(vol(
                    Some((
                        "",
                        None,
                        "failed to get replica rebuild status of tcp://10.0.0.3:10500",
                    )),
                    "WO",
                    "",
                ))),
                None,
                Some(Change::Continuing),
            ),
            (
                "complete",
                Some(&plain),
                Some(Some(vol(Some(("complete", Some(false), "")), "WO", ""))),
                None,
                ended(Outcome::Complete {
                    basis: "state complete",
                }),
            ),
            (
                "entry gone, replica RW",
                Some(&plain),
                Some(Some(vol(None, "RW", ""))),
                None,
                ended(Outcome::Complete {
                    basis: "entry gone, replica RW",
                }),
            ),
            (
                "state error carries its own text",
                Some(&plain),
                Some(Some(vol(Some(("error", Some(false), RESET)), "WO", ""))),
                None,
                failed(Failure::StateError, RESET, FailStep::FileSync, "", "WO"),
            ),
            (
                "state error without text keeps the last seen",
                Some(&plain),
                Some(Some(vol(Some(("error", Some(false), "")), "WO", ""))),
                None,
                failed(
                    Failure::StateError,
                    "earlier text",
                    FailStep::FileSync,
                    "",
                    "WO",
                ),
            ),
            (
                "mode ERR: engine fault, not a rebuild failure shape",
                Some(&plain),
                Some(Some(vol(None, "ERR", ""))),
                None,
                failed(
                    Failure::EngineFault,
                    "earlier text",
                    FailStep::FileSync,
                    "",
                    "ERR",
                ),
            ),
            (
                "failedAt set, mode \"\" (outside backoff)",
                Some(&plain),
                Some(Some(vol(None, "", "2026-12-03T19:40:12Z"))),
                None,
                failed(
                    Failure::ReplicaFailed,
                    "earlier text",
                    FailStep::FileSync,
                    "2026-12-03T19:40:12Z",
                    "",
                ),
            ),
            (
                "replica deleted on purpose: removed, not failed",
                Some(&plain),
                Some(Some(vol_in("attached", None, None))),
                None,
                ended(Outcome::Removed {
                    basis: "replica no longer listed, no FailedRebuilding",
                }),
            ),
            (
                "volume detached: removed",
                Some(&plain),
                Some(Some(vol_in("detached", None, Some(("", ""))))),
                None,
                ended(Outcome::Removed {
                    basis: "volume detached, no FailedRebuilding",
                }),
            ),
            (
                "volume deleted: removed",
                Some(&plain),
                Some(None),
                None,
                ended(Outcome::Removed {
                    basis: "volume no longer listed, no FailedRebuilding",
                }),
            ),
            (
                "mode \"\", first poll: wait for the Event",
                Some(&plain),
                Some(Some(vol(None, "", ""))),
                None,
                Some(Change::Continuing),
            ),
            (
                "mode \"\" never in the engine: still before GetReplica's end",
                Some(&not_added),
                Some(Some(vol(None, "", ""))),
                None,
                Some(Change::Continuing),
            ),
            (
                "mode \"\", just below the grace",
                Some(&gone1),
                Some(Some(vol(None, "", ""))),
                None,
                Some(Change::Continuing),
            ),
            (
                "mode \"\", at the grace: unresolved",
                Some(&gone2),
                Some(Some(vol(None, "", ""))),
                None,
                ended(Outcome::Unresolved {
                    basis: "replica removed from the engine (mode \"\"), no FailedRebuilding, no removal seen",
                }),
            ),
        ];
        for (name, followed, now, opening, want) in table {
            let now_ref = now.as_ref().map(|v| v.as_ref());
            assert_eq!(step(followed, now_ref, "r-t", opening), want, "{name}");
        }
    }

    #[test]
    fn a_reset_while_still_in_file_sync_is_a_retry_not_the_end() {
        let reset = "replica tcp://10.0.0.1:10000 failed to send file x.img to 10.0.0.3:10503: rpc error: code = Unavailable desc = error reading from server: read tcp 10.0.0.3:43126->10.0.0.1:10002: read: connection reset by peer";
        let mut book = RebuildBook::default();
        let readings = [
            (
                vol(Some(("in_progress", Some(true), "")), "WO", ""),
                "started",
            ),
            (
                vol(Some(("in_progress", Some(true), reset)), "WO", ""),
                "continuing",
            ),
            // The same text on the next poll is the same reset.
            (
                vol(Some(("in_progress", Some(true), reset)), "WO", ""),
                "continuing",
            ),
            (
                vol(Some(("in_progress", Some(true), "")), "WO", ""),
                "continuing",
            ),
            (vol(None, "RW", ""), "complete"),
        ];
        let mut retries_at_end = None;
        for (v, want) in readings {
            let evs = book.observe(std::slice::from_ref(&v));
            let got = match evs.first().map(|e| &e.change) {
                Some(Change::Started) => "started",
                Some(Change::Ended(Outcome::Complete { .. })) => {
                    retries_at_end = Some(evs[0].seen.retries);
                    "complete"
                }
                Some(other) => panic!("{other:?}"),
                None => "continuing",
            };
            assert_eq!(got, want);
        }
        assert_eq!(retries_at_end, Some(1));
        // A reset that ends in `error` is the failure, not a retry.
        let mut book = RebuildBook::default();
        book.observe(&[vol(Some(("in_progress", Some(true), "")), "WO", "")]);
        let evs = book.observe(&[vol(Some(("error", Some(false), reset)), "WO", "")]);
        match &evs[0].change {
            Change::Ended(Outcome::Failed { how, .. }) => assert_eq!(*how, Failure::StateError),
            other => panic!("{other:?}"),
        }
        assert_eq!(evs[0].seen.retries, 0);
    }

    #[test]
    fn the_failing_step_is_read_from_the_text() {
        let rows: [(&str, Option<Signal>, &str, bool, FailStep); 8] = [
            (
                "#8091 dial",
                Some(Signal::FailedRebuilding),
                DIAL,
                false,
                FailStep::GetReplica,
            ),
            (
                "#12336",
                Some(Signal::FailedRebuilding),
                "failed to add replica tcp://10.0.0.3:10000 for volume: rpc error: code = Unknown desc = failed to find good replica to copy from",
                false,
                FailStep::SourceSelection,
            ),
            (
                "#11006 file send",
                Some(Signal::FailedRebuilding),
                RESET,
                true,
                FailStep::FileSync,
            ),
            (
                "rebuild status is not GetReplica",
                None,
                "failed to get replica rebuild status of tcp://10.0.0.3:10000",
                true,
                FailStep::FileSync,
            ),
            (
                "purge event",
                Some(Signal::TimeoutSnapshotPurge),
                "Timeout waiting",
                false,
                FailStep::SnapshotPurge,
            ),
            (
                "purge text",
                Some(Signal::FailedRebuilding),
                "failed to start snapshot purge",
                false,
                FailStep::SnapshotPurge,
            ),
            (
                "unnamed, before file sync",
                Some(Signal::FailedRebuilding),
                "context canceled",
                false,
                FailStep::AddReplicaBeforeFileSync,
            ),
            (
                "unnamed, after file sync began",
                Some(Signal::FailedRebuilding),
                "context canceled",
                true,
                FailStep::FileSync,
            ),
        ];
        for (name, sig, text, fs, want) in rows {
            assert_eq!(failing_step(sig, text, fs), want, "{name}");
        }
    }

    #[test]
    fn events_name_their_volume_and_replica() {
        let v = vol(None, "WO", "");
        let vols = [v.clone()];
        assert_eq!(
            volume_of_event(&event("Rebuilding", ""), &vols).as_deref(),
            Some("v")
        );
        let mut other = event("Rebuilding", "");
        other.name = "pvc-9-e-0".into();
        assert_eq!(volume_of_event(&other, &vols).as_deref(), Some("pvc-9"));
        other.kind = "Replica".into();
        assert_eq!(volume_of_event(&other, &vols), None);
        let rows = [
            (
                "Start rebuilding replica r-t with Address 10.0.0.3:10000 for normal engine v-e-0 and volume v",
                "r-t",
            ),
            ("Detected rebuilding replica r-t (10.0.0.3:10000)", "r-t"),
            (
                "Replica r-t with Address 10.0.0.3:10000 has been rebuilt for volume v",
                "r-t",
            ),
            (DIAL, "r-t"),
            (
                "Failed rebuilding replica with Address 10.0.0.9:10000: x",
                "",
            ),
            (
                "Timeout waiting for snapshot purge done before rebuilding volume v, wait interval 60 second",
                "",
            ),
        ];
        for (m, want) in rows {
            assert_eq!(replica_of_event(m, Some(&v)), want, "{m}");
        }
    }

    #[test]
    fn the_book_opens_at_the_first_signal_and_ends_once() {
        let mut book = RebuildBook::default();
        assert!(book.observe(&[vol(None, "RW", "")]).is_empty());
        // The Rebuilding Event opens it before the manager shows anything.
        let ev = book.signal("v", &event("Rebuilding", "Start rebuilding replica r-t with Address 10.0.0.3:10000 for normal engine v-e-0 and volume v"));
        assert_eq!(ev.len(), 1);
        assert_eq!(
            (ev[0].replica.as_str(), &ev[0].change),
            ("r-t", &Change::Started)
        );
        assert_eq!(ev[0].seen.opened_by, "Rebuilding Event");
        // The WO replica appearing is the same rebuild, not a second start.
        assert!(book.observe(&[vol(None, "WO", "")]).is_empty());
        // FailedRebuilding ends it, with the step.
        let ev = book.signal("v", &event("FailedRebuilding", DIAL));
        assert_eq!(ev.len(), 1, "{ev:?}");
        match &ev[0].change {
            Change::Ended(Outcome::Failed {
                how, step, error, ..
            }) => {
                assert_eq!(
                    (*how, *step),
                    (Failure::FailedRebuilding, FailStep::GetReplica)
                );
                assert_eq!(error, DIAL);
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(book.followed().count(), 0);
        // mode "" after it: nothing more.
        assert!(book.observe(&[vol(None, "", "")]).is_empty());
        // A FailedRebuilding seen first: start and end at once.
        let ev = book.signal("v", &event("FailedRebuilding", DIAL));
        assert_eq!(ev.len(), 2, "{ev:?}");
        // A WO replica opens one by the manager; deleting it is not a failure.
        let ev = book.observe(&[vol(None, "WO", "")]);
        assert_eq!(ev[0].seen.opened_by, "replica WO");
        let ev = book.observe(&[vol_in("attached", None, None)]);
        assert_eq!(
            ev[0].change,
            Change::Ended(Outcome::Removed {
                basis: "replica no longer listed, no FailedRebuilding"
            })
        );
        // A volume-only Event (snapshot purge) opens and ends at once.
        let ev = book.signal("v", &event("TimeoutSnapshotPurge", "Timeout waiting for snapshot purge done before rebuilding volume v, wait interval 60 second"));
        assert_eq!(ev.len(), 2);
        assert_eq!(ev[1].replica, "");
        // An unreadable manager is not folded: nothing ends.
        book.observe(&[vol(Some(("in_progress", Some(true), "")), "WO", "")]);
        // mode "" without an Event: unresolved only after the grace.
        for _ in 0..GONE_GRACE_POLLS - 1 {
            assert!(book.observe(&[vol(None, "", "")]).is_empty());
        }
        let ev = book.observe(&[vol(None, "", "")]);
        assert_eq!(
            ev[0].change.clone(),
            Change::Ended(Outcome::Unresolved {
                basis: "replica removed from the engine (mode \"\"), no FailedRebuilding, no removal seen"
            })
        );
    }
}
