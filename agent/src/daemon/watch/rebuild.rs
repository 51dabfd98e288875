//! The `longhorn_rebuild` condition: what changed for one replica's
//! rebuild between two consecutive readings of the Longhorn manager — a
//! pure function ([`step`]) and the book of rebuilds in flight it is folded
//! into ([`RebuildBook`]). No I/O, no clock.
//!
//! What the manager shows (longhorn-manager v1.6–v1.11 `api/model.go`
//! `RebuildStatus`, `Replica`; engine `pkg/sync/sync.go`): a
//! `rebuildStatus[]` entry exists only while the target replica is WO; its
//! `state` is `in_progress`, `complete`, `error`, or `""` when the engine
//! could not ask the sync agent. On failure the manager removes the
//! replica from the engine and sets its `failedAt` (mode `ERR`), so the
//! entry usually just disappears (`[]`); on success the replica turns `RW`
//! and the entry disappears too.
//!
//! The condition:
//! - **started**: an entry for a replica not being followed is
//!   `in_progress` (or `isRebuilding` with no terminal state), and the
//!   replica has not failed;
//! - **ended complete**: the entry says `complete`, or it is gone and the
//!   replica is `RW` with no `failedAt` (Longhorn's success path);
//! - **failed**: the entry says `error`; or the replica's `failedAt` is set
//!   or its mode is `ERR`; or the entry is gone and the replica is not a
//!   healthy `RW` (removed, `WO`, `ERR`); or the volume is no longer listed.
//!
//! A reading the manager could not give (down, garbage) is not a reading:
//! the caller does not fold it, so nothing ends because the manager was
//! unreachable. A rebuild that starts and ends between two polls is not
//! seen (the poll interval bounds what the rule can see).

use std::collections::BTreeMap;

use pstack_capture::longhorn::model::{RebuildState, Volume};

/// What the book remembers of a rebuild it follows.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Seen {
    /// Source replicas the manager named.
    pub from: Vec<String>,
    /// Last progress reported.
    pub progress: Option<i64>,
    /// Last non-empty `error` text seen on its entry.
    pub last_error: String,
}

/// How a rebuild failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// Its entry says `state: error`.
    StateError,
    /// The replica's `failedAt` is set or its mode is `ERR`.
    ReplicaFailed,
    /// The entry is gone and the replica is not a healthy `RW`.
    EntryGone,
    /// The volume is no longer in the manager's list.
    VolumeGone,
}

impl Failure {
    /// Wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Failure::StateError => "state_error",
            Failure::ReplicaFailed => "replica_failed",
            Failure::EntryGone => "entry_gone",
            Failure::VolumeGone => "volume_gone",
        }
    }
}

/// How a followed rebuild ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// It completed; `basis` says what showed it.
    Complete {
        /// `state complete` or `entry gone, replica RW`.
        basis: &'static str,
    },
    /// It failed.
    Failed {
        /// How.
        how: Failure,
        /// The manager's error text (this reading's, else the last seen).
        error: String,
        /// The replica's `failedAt` ("" when unset or the replica is gone).
        failed_at: String,
        /// The replica's mode ("" when gone).
        mode: String,
    },
}

/// What one reading changed for a replica's rebuild.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// A rebuild began (or was first seen in progress).
    Started,
    /// Still in progress (progress or error text updated).
    Continuing,
    /// It ended.
    Ended(Outcome),
}

/// The change for `replica` given what was `followed` before (None: not
/// followed) and this reading of its volume (None: the volume is no longer
/// listed). `None`: nothing to say (not rebuilding, not followed).
pub fn step(followed: Option<&Seen>, now: Option<&Volume>, replica: &str) -> Option<Change> {
    let entry = now.and_then(|v| v.rebuild.iter().find(|e| e.replica == replica));
    let rep = now.and_then(|v| v.replicas.iter().find(|r| r.name == replica));
    let replica_failed = rep.is_some_and(|r| !r.failed_at.is_empty() || r.mode == "ERR");
    let failed = |how: Failure| {
        let error = entry
            .map(|e| e.error.clone())
            .filter(|e| !e.is_empty())
            .or_else(|| followed.map(|s| s.last_error.clone()))
            .unwrap_or_default();
        Change::Ended(Outcome::Failed {
            how,
            error,
            failed_at: rep.map(|r| r.failed_at.clone()).unwrap_or_default(),
            mode: rep.map(|r| r.mode.clone()).unwrap_or_default(),
        })
    };
    let Some(_) = followed else {
        let rebuilding = entry.is_some_and(|e| {
            e.state == RebuildState::InProgress
                || (e.is_rebuilding == Some(true) && !e.state.terminal())
        });
        return (rebuilding && !replica_failed).then_some(Change::Started);
    };
    if now.is_none() {
        return Some(failed(Failure::VolumeGone));
    }
    Some(match entry {
        Some(e) if e.state == RebuildState::Error => failed(Failure::StateError),
        Some(e) if e.state == RebuildState::Complete => Change::Ended(Outcome::Complete {
            basis: "state complete",
        }),
        _ if replica_failed => failed(Failure::ReplicaFailed),
        Some(_) => Change::Continuing,
        None => match rep {
            Some(r) if r.mode == "RW" => Change::Ended(Outcome::Complete {
                basis: "entry gone, replica RW",
            }),
            _ => failed(Failure::EntryGone),
        },
    })
}

/// A change of one rebuild, with the reading that showed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RebuildEvent {
    /// Volume name.
    pub volume: String,
    /// Target replica name.
    pub replica: String,
    /// What changed.
    pub change: Change,
    /// What the book knew of it (after this reading).
    pub seen: Seen,
}

/// The rebuilds followed, by (volume, replica).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RebuildBook {
    followed: BTreeMap<(String, String), Seen>,
}

impl RebuildBook {
    /// Rebuilds followed now.
    pub fn followed(&self) -> impl Iterator<Item = (&(String, String), &Seen)> {
        self.followed.iter()
    }

    /// Fold one complete reading (every volume the rule watches) into the
    /// book; the changes, `Started` and `Ended` only (a rebuild in progress
    /// updates the book silently).
    pub fn observe(&mut self, volumes: &[Volume]) -> Vec<RebuildEvent> {
        let by_name: BTreeMap<&str, &Volume> =
            volumes.iter().map(|v| (v.name.as_str(), v)).collect();
        let mut out = Vec::new();
        // Followed rebuilds first: continuing or ended.
        let keys: Vec<(String, String)> = self.followed.keys().cloned().collect();
        for key in keys {
            let now = by_name.get(key.0.as_str()).copied();
            let seen = self.followed.get(&key).cloned().unwrap_or_default();
            match step(Some(&seen), now, &key.1) {
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
        // New rebuilds.
        for v in volumes {
            for e in &v.rebuild {
                let key = (v.name.clone(), e.replica.clone());
                if e.replica.is_empty() || self.followed.contains_key(&key) {
                    continue;
                }
                if step(None, Some(v), &e.replica) == Some(Change::Started) {
                    let mut seen = Seen::default();
                    update(&mut seen, Some(v), &e.replica);
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
}

fn update(s: &mut Seen, now: Option<&Volume>, replica: &str) {
    let Some(e) = now.and_then(|v| v.rebuild.iter().find(|e| e.replica == replica)) else {
        return;
    };
    if !e.from.is_empty() {
        s.from = e.from.clone();
    }
    if e.progress.is_some() {
        s.progress = e.progress;
    }
    if !e.error.is_empty() {
        s.last_error = e.error.clone();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pstack_capture::longhorn::model::parse_volume;

    /// A v1.9 `api/model.go` volume: replica `r-t` in `mode` with
    /// `failed_at`, and `entry` as its `rebuildStatus` (None: `[]`).
    fn vol(entry: Option<(&str, Option<bool>, &str)>, mode: &str, failed_at: &str) -> Volume {
        let rebuild = match entry {
            None => serde_json::json!([]),
            Some((state, is_rebuilding, error)) => serde_json::json!([{
                "id": "", "type": "rebuildStatus", "links": null, "actions": null,
                "replica": "r-t", "fromReplica": "r-s", "state": state, "progress": 40,
                "isRebuilding": is_rebuilding, "error": error}]),
        };
        let doc = serde_json::json!({"name": "v", "state": "attached", "robustness": "degraded",
            "dataEngine": "v1",
            "replicas": [{"name": "r-s", "hostId": "n-s", "address": "10.0.0.2", "mode": "RW", "failedAt": ""},
                         {"name": "r-t", "hostId": "n-t", "address": "10.0.0.3", "mode": mode, "failedAt": failed_at}],
            "controllers": [{"name": "v-e-0", "hostId": "n-e", "address": "10.0.0.1"}],
            "rebuildStatus": rebuild});
        parse_volume(doc.to_string().as_bytes()).unwrap()
    }

    fn no_replica() -> Volume {
        let mut v = vol(None, "RW", "");
        v.replicas.retain(|r| r.name != "r-t");
        v
    }

    const RESET: &str = "failed to send file x.img to 10.0.0.3:10503: read tcp 10.0.0.3:43126->10.0.0.2:10002: read: connection reset by peer";

    #[test]
    fn the_condition_is_a_function_of_consecutive_readings() {
        let seen = Seen {
            from: vec!["r-s".into()],
            progress: Some(30),
            last_error: "earlier text".into(),
        };
        let failed = |how, error: &str, failed_at: &str, mode: &str| {
            Some(Change::Ended(Outcome::Failed {
                how,
                error: error.into(),
                failed_at: failed_at.into(),
                mode: mode.into(),
            }))
        };
        /// (case, followed before, this reading, the change)
        type Case<'a> = (&'a str, Option<&'a Seen>, Option<Volume>, Option<Change>);
        let table: Vec<Case> = vec![
            // Not followed.
            ("no entry", None, Some(vol(None, "RW", "")), None),
            (
                "in_progress starts",
                None,
                Some(vol(Some(("in_progress", Some(true), "")), "WO", "")),
                Some(Change::Started),
            ),
            (
                "isRebuilding with an unreported state starts",
                None,
                Some(vol(Some(("", Some(true), "")), "WO", "")),
                Some(Change::Started),
            ),
            (
                "isRebuilding false and no state: not a start",
                None,
                Some(vol(Some(("", Some(false), "")), "WO", "")),
                None,
            ),
            (
                "a terminal entry never seen running is not a start",
                None,
                Some(vol(Some(("error", Some(false), RESET)), "WO", "")),
                None,
            ),
            (
                "a failed replica's entry is not a start",
                None,
                Some(vol(
                    Some(("in_progress", Some(true), "")),
                    "ERR",
                    "2026-12-03T19:40:12Z",
                )),
                None,
            ),
            ("volume absent, not followed", None, None, None),
            // Followed.
            (
                "still in progress",
                Some(&seen),
                Some(vol(Some(("in_progress", Some(true), "")), "WO", "")),
                Some(Change::Continuing),
            ),
            (
                "state \"\" with an error is not an end",
                Some(&seen),
                Some(vol(
                    Some((
                        "",
                        None,
                        "failed to get replica rebuild status of tcp://10.0.0.3:10500",
                    )),
                    "WO",
                    "",
                )),
                Some(Change::Continuing),
            ),
            (
                "complete",
                Some(&seen),
                Some(vol(Some(("complete", Some(false), "")), "WO", "")),
                Some(Change::Ended(Outcome::Complete {
                    basis: "state complete",
                })),
            ),
            (
                "entry gone, replica RW: Longhorn's success path",
                Some(&seen),
                Some(vol(None, "RW", "")),
                Some(Change::Ended(Outcome::Complete {
                    basis: "entry gone, replica RW",
                })),
            ),
            (
                "state error carries its own text",
                Some(&seen),
                Some(vol(Some(("error", Some(false), RESET)), "WO", "")),
                failed(Failure::StateError, RESET, "", "WO"),
            ),
            (
                "state error without text keeps the last seen",
                Some(&seen),
                Some(vol(Some(("error", Some(false), "")), "WO", "")),
                failed(Failure::StateError, "earlier text", "", "WO"),
            ),
            (
                "failedAt set while the entry remains",
                Some(&seen),
                Some(vol(
                    Some(("in_progress", Some(true), "")),
                    "WO",
                    "2026-12-03T19:40:12Z",
                )),
                failed(
                    Failure::ReplicaFailed,
                    "earlier text",
                    "2026-12-03T19:40:12Z",
                    "WO",
                ),
            ),
            (
                "mode ERR",
                Some(&seen),
                Some(vol(None, "ERR", "")),
                failed(Failure::ReplicaFailed, "earlier text", "", "ERR"),
            ),
            (
                "[] after it was seen, replica still WO",
                Some(&seen),
                Some(vol(None, "WO", "")),
                failed(Failure::EntryGone, "earlier text", "", "WO"),
            ),
            (
                "[] and the replica removed",
                Some(&seen),
                Some(no_replica()),
                failed(Failure::EntryGone, "earlier text", "", ""),
            ),
            (
                "the volume is gone",
                Some(&seen),
                None,
                failed(Failure::VolumeGone, "earlier text", "", ""),
            ),
        ];
        for (name, followed, now, want) in table {
            assert_eq!(step(followed, now.as_ref(), "r-t"), want, "{name}");
        }
    }

    #[test]
    fn the_book_reports_each_start_and_end_once() {
        let mut book = RebuildBook::default();
        assert!(book.observe(&[vol(None, "RW", "")]).is_empty());
        let ev = book.observe(&[vol(Some(("in_progress", Some(true), "")), "WO", "")]);
        assert_eq!(ev.len(), 1);
        assert_eq!(ev[0].change, Change::Started);
        assert_eq!(ev[0].seen.from, ["r-s"]);
        // Continuing is silent, but its error text is remembered.
        let ev = book.observe(&[vol(Some(("", Some(true), RESET)), "WO", "")]);
        assert!(ev.is_empty(), "{ev:?}");
        assert_eq!(book.followed().count(), 1);
        // [] after failure: failed, with the text seen before.
        let ev = book.observe(&[vol(None, "ERR", "2026-12-03T19:40:12Z")]);
        assert_eq!(ev.len(), 1);
        match &ev[0].change {
            Change::Ended(Outcome::Failed {
                how,
                error,
                failed_at,
                ..
            }) => {
                assert_eq!(*how, Failure::ReplicaFailed);
                assert_eq!(error, RESET);
                assert_eq!(failed_at, "2026-12-03T19:40:12Z");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(book.followed().count(), 0);
        // The same [] again says nothing.
        assert!(
            book.observe(&[vol(None, "ERR", "2026-12-03T19:40:12Z")])
                .is_empty()
        );
        // An unreadable manager is not folded: nothing ends. (The caller
        // never calls observe; an empty list is a real reading that the
        // volume is gone.)
        book.observe(&[vol(Some(("in_progress", Some(true), "")), "WO", "")]);
        let ev = book.observe(&[]);
        assert!(matches!(
            ev[0].change,
            Change::Ended(Outcome::Failed {
                how: Failure::VolumeGone,
                ..
            })
        ));
    }
}
