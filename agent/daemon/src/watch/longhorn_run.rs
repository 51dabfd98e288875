//! How pstackd runs its `longhorn_rebuild` rules (the rule's state and
//! firings are [`super::longhorn`]): each due poll on a task of its own, its
//! result folded by the rule under the engine's lock and its firings
//! considered like any other; each capture on the blocking pool under the
//! rule's watcher.
//!
//! Invariants:
//! - **Polls never hold the tick**: a poll is spawned and the tick goes on;
//!   a rule has at most one in flight ([`super::longhorn::LonghornWatch::take_poll`]).
//! - **A rule reloaded away drops its poll's result**: it is folded only
//!   into the rule of the same name and definition.
//! - **One Engine Events watch per rule** (when a Kubernetes API is
//!   configured), on a thread of its own, ended by the rule's `stop` when
//!   the rule is dropped; its reports are folded in order, through a bounded
//!   queue.
//! - **A poll reads the followed replicas' CRs too** (their `RebuildFailed`
//!   condition, at most 16, each under the Events deadline, only with a
//!   Kubernetes API), folded before the volume list it came with.
//! - **A capture's life is reported** (`started`, then `done` whatever the
//!   outcome, a deadline overrun included), so the rule never continues a
//!   window that is still running nor waits for one that is gone.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use pstack_capture::longhorn::kube::{KubeApi, WatchReport, run_engine_event_watch};

use pstack_capture::clock::wall_time_now;
use pstack_capture::request::ValidRequest;
use pstack_envelope::Trigger;

use super::rules::{self, Condition};
use super::runner::consider;
use super::{Availability, engines, lock, longhorn};
use crate::engines::RunAborted;
use crate::state::DaemonState;

/// Start the `longhorn_rebuild` polls that are due, each on its own task
/// (a manager that takes its whole deadline never holds the tick); each
/// poll's result is folded by its rule and its firings considered.
pub(super) fn polls(state: &Arc<DaemonState>) {
    let engine = &state.watch;
    let watches: Vec<(String, rules::LonghornRule, KubeApi, Arc<AtomicBool>)> = {
        let mut inner = lock(&engine.inner);
        inner
            .rules
            .iter_mut()
            .filter_map(|s| match &s.rule.condition {
                Condition::LonghornRebuild(lh) => {
                    let api = s.longhorn.take_events_watch(lh)?;
                    Some((
                        s.rule.name.clone(),
                        (**lh).clone(),
                        api,
                        s.longhorn.events.stop.clone(),
                    ))
                }
                _ => None,
            })
            .collect()
    };
    for (name, lh, api, stop) in watches {
        events_watch(state, name, lh, api, stop);
    }
    let due: Vec<(String, rules::LonghornRule, Vec<String>)> = {
        let mut inner = lock(&engine.inner);
        let now = Instant::now();
        inner
            .rules
            .iter_mut()
            .filter_map(|s| match &s.rule.condition {
                Condition::LonghornRebuild(lh) if s.longhorn.take_poll(lh, now) => Some((
                    s.rule.name.clone(),
                    (**lh).clone(),
                    s.longhorn.replicas_to_check(lh),
                )),
                _ => None,
            })
            .collect()
    };
    for (name, lh, replicas) in due {
        let state = state.clone();
        tokio::spawn(async move {
            let poll_lh = lh.clone();
            let read = match tokio::task::spawn_blocking(move || {
                // The followed replicas' CRs first: a condition set by the
                // time the list is read is folded before it.
                let conditions = longhorn::read_conditions(&poll_lh, &replicas);
                (longhorn::poll(&poll_lh), conditions)
            })
            .await
            {
                Ok(r) => r,
                Err(e) => (
                    pstack_capture::longhorn::ApiRead {
                        url: lh.manager_url.clone(),
                        at: wall_time_now(),
                        result: Err(pstack_capture::longhorn::ApiFailure {
                            status: pstack_envelope::SurfaceStatus::Error,
                            errno: None,
                            message: format!("the poll task failed: {e}"),
                        }),
                        elapsed_us: 0,
                    },
                    Vec::new(),
                ),
            };
            let (read, conditions) = read;
            let engine = &state.watch;
            let (firings, events) = {
                let mut inner = lock(&engine.inner);
                let Some(s) = inner.rules.iter_mut().find(|s| {
                    s.rule.name == name
                        && s.rule.condition == Condition::LonghornRebuild(Box::new(lh.clone()))
                }) else {
                    return; // reloaded away meanwhile
                };
                let rule = s.rule.clone();
                s.longhorn.on_conditions(conditions);
                let out = s.longhorn.on_poll(&rule, &lh, read);
                if let longhorn::Health::Degraded(r) = s.longhorn.health() {
                    s.availability = Availability::Degraded(r.clone());
                } else if matches!(s.availability, Availability::Degraded(_)) {
                    s.availability = Availability::Armed;
                }
                out
            };
            for mut e in events {
                e.at = Some(wall_time_now());
                tracing::info!(
                    event = %serde_json::to_string(&e).unwrap_or_default(),
                    "longhorn rebuild watch"
                );
                engine.emit(e);
            }
            for f in firings {
                consider(&state, f);
            }
        });
    }
}

/// Most watch reports queued between the watch thread and the rule: the
/// thread blocks (the watch stalls, bounded) rather than dropping one.
const EVENT_QUEUE: usize = 256;

/// The rule's Engine Events watch: a thread of its own runs
/// [`pstack_capture::longhorn::kube::run_engine_event_watch`] until the
/// rule is dropped (its `stop`); a task folds each report into the rule of
/// the same name and definition and considers the firings.
fn events_watch(
    state: &Arc<DaemonState>,
    name: String,
    lh: rules::LonghornRule,
    api: KubeApi,
    stop: Arc<AtomicBool>,
) {
    let (tx, mut rx) = tokio::sync::mpsc::channel::<WatchReport>(EVENT_QUEUE);
    let thread_stop = stop.clone();
    let spawned = std::thread::Builder::new()
        .name("lh-events".into())
        .spawn(move || {
            // The report is handed on from inside the watch's own runtime,
            // where `blocking_send` is refused: a full queue is waited out
            // here (the watch stalls, bounded by the stop flag).
            run_engine_event_watch(&api, &thread_stop, &mut |r| {
                let mut r = Some(r);
                while let Some(report) = r.take() {
                    match tx.try_send(report) {
                        Ok(()) => {}
                        Err(tokio::sync::mpsc::error::TrySendError::Full(back)) => {
                            if thread_stop.load(Ordering::SeqCst) {
                                return;
                            }
                            r = Some(back);
                            std::thread::sleep(std::time::Duration::from_millis(10));
                        }
                        Err(tokio::sync::mpsc::error::TrySendError::Closed(_)) => {
                            thread_stop.store(true, Ordering::SeqCst);
                        }
                    }
                }
            });
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "the Engine Events watch thread did not start");
        return;
    }
    let state = state.clone();
    tokio::spawn(async move {
        while let Some(report) = rx.recv().await {
            let engine = &state.watch;
            let (firings, events) = {
                let mut inner = lock(&engine.inner);
                let Some(s) = inner.rules.iter_mut().find(|s| {
                    s.rule.name == name
                        && s.rule.condition == Condition::LonghornRebuild(Box::new(lh.clone()))
                }) else {
                    stop.store(true, Ordering::SeqCst);
                    return; // reloaded away
                };
                let rule = s.rule.clone();
                s.longhorn.on_events(&rule, &lh, report)
            };
            for mut e in events {
                e.at_seen = Some(wall_time_now());
                tracing::info!(
                    event = %serde_json::to_string(&e).unwrap_or_default(),
                    "longhorn rebuild watch"
                );
                engine.emit(e);
            }
            for f in firings {
                consider(&state, f);
            }
        }
    });
}

/// A rebuild's capture: its window ends when the rule's poll sees the
/// rebuild end (or at the rule's window); `life` tells the rule when it
/// started and when it returned.
pub(super) async fn capture(
    state: &Arc<DaemonState>,
    a: &longhorn::LonghornAction,
    trigger: Trigger,
    slot: Option<crate::state::CaptureSlot>,
    budget: Option<pstack_capture::process::LeakBudget>,
) -> Result<Vec<String>, String> {
    let life = a.life.clone();
    let result = async {
        let plan = a.plan()?.with_trigger(trigger);
        let supervisor = state
            .engine
            .supervisor
            .clone()
            .map_err(|e| format!("pstack-helper not found: {e}"))?;
        let budget = budget.ok_or("no leak budget")?;
        let spool = state.spool.clone();
        let deadline = ValidRequest::Longhorn(Box::new(plan.clone())).run_deadline();
        let watcher = a.watcher.clone();
        a.life.started();
        let work = move || {
            let _slot = slot;
            engines::run_longhorn_watched(&plan, &watcher, &supervisor, &budget, &spool)
        };
        match engines::run_bounded(deadline, work).await {
            Ok(Ok(captured)) => Ok(captured.envelopes.into_iter().map(|e| e.digest).collect()),
            Ok(Err(e)) => Err(e.to_string()),
            Err(RunAborted::Failed(join)) => Err(format!("the capture task failed: {join}")),
            Err(RunAborted::Overran) => Err(format!(
                "the capture overran its {} ms deadline",
                deadline.as_millis()
            )),
        }
    }
    .await;
    life.done();
    result
}
