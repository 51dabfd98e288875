//! The watch engine's clock: each tick samples what the armed rules need
//! (on the blocking pool), lets the engine evaluate it, and takes every
//! firing through the limits to a capture or a counted suppression.
//!
//! Invariants:
//! - **One tick at a time**; a tick that overruns delays the next, never
//!   stacks (`MissedTickBehavior::Delay`).
//! - **Every firing ends counted** ([`consider`]): started (then sealed or
//!   failed) or suppressed under one reason, in the order the limits apply.
//! - **Captures run beside the tick**, on the blocking pool, holding a
//!   capture slot; the tick never waits for one.

use super::*;
use crate::engines::RunAborted;
use crate::state::DaemonState;

/// Run the engine until `stop` turns true.
pub async fn run(state: Arc<DaemonState>, mut stop: tokio::sync::watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => tick_once(&state).await,
            _ = stop.changed() => return,
        }
    }
}

async fn tick_once(state: &Arc<DaemonState>) {
    let engine = &state.watch;
    engine.sync_rules(&state.config().watch);
    let flow_ports = engine.flow_ports();
    // The recorder is touched (on the blocking pool: it loads programs and
    // drains a ring) only while a TCP rule wants it, or to detach it when
    // the last one went with a reload.
    let flow_state = if flow_ports.is_empty() && !lock(&engine.flows).is_running() {
        Ok(())
    } else {
        let st = state.clone();
        tokio::task::spawn_blocking(move || {
            let config = st.config();
            let mut fw = lock(&st.watch.flows);
            let r = fw.ensure(&flow_ports, &config.ebpf, &config.flight_recorder);
            fw.poll();
            r
        })
        .await
        .unwrap_or_else(|e| Err(format!("the flight recorder task failed: {e}")))
    };
    if lock(&engine.inner).rules.is_empty() {
        return;
    }
    longhorn_run::polls(state);
    engine.refresh_availability(
        state.engine.supervisor.as_ref().err().map(String::as_str),
        &flow_state,
    );
    let (needs_d, needs_rates) = {
        let inner = lock(&engine.inner);
        let armed = |k: &[RuleKind]| {
            inner
                .rules
                .iter()
                .any(|s| s.availability == Availability::Armed && k.contains(&s.rule.kind))
        };
        (
            armed(&[RuleKind::DState]),
            armed(&[RuleKind::ListenOverflow, RuleKind::RetransmitRate]),
        )
    };
    let needs_d = needs_d && engine.d_scan_due();
    let proc_root = engine.proc_root.clone();
    let readings = tokio::task::spawn_blocking(move || {
        let started = Instant::now();
        let mut r = Readings {
            d_scan: needs_d.then(|| sample::d_state_tasks(&proc_root)),
            tcp: needs_rates.then(sample::tcp_counters),
            sampled_in: Duration::ZERO,
        };
        r.sampled_in = started.elapsed();
        r
    })
    .await
    .unwrap_or_default();
    for f in engine.evaluate(&readings) {
        consider(state, f);
    }
}

/// A firing: count it, apply every limit in order, and start its capture
/// or count why not.
pub(super) fn consider(state: &Arc<DaemonState>, f: Firing) {
    let engine = &state.watch;
    {
        let mut inner = lock(&engine.inner);
        if let Some(s) = inner.rules.iter_mut().find(|s| s.rule.name == f.rule) {
            s.fired += 1;
            s.last_fired = Some(wall_time_now());
        }
    }
    tracing::info!(rule = %f.rule, subject = %f.subject, condition = ?f.condition, "watch rule fired");
    engine.emit(
        WatchEvent::new(WatchEventKind::Fired {
            rule: f.rule.clone(),
            kind: f.kind.as_str().into(),
            subject: f.subject.clone(),
            condition: f.condition.clone(),
        })
        .at(wall_time_now()),
    );
    if lock(&engine.inner).running.contains(&f.subject) {
        return engine.suppress(&f, SUPPRESS_RUNNING, None);
    }
    if state.draining.load(Ordering::SeqCst) {
        return engine.suppress(&f, SUPPRESS_DRAINING, None);
    }
    if let Action::Process {
        tgid,
        tid,
        start_ticks,
    } = &f.action
    {
        match sample::task_start_ticks(&engine.proc_root, *tgid, *tid) {
            Some((st, 'D')) if st == *start_ticks => {}
            Some((st, letter)) if st == *start_ticks => {
                return engine.suppress(
                    &f,
                    SUPPRESS_GONE,
                    Some(format!("thread {tid} left D state (now {letter})")),
                );
            }
            _ => {
                return engine.suppress(
                    &f,
                    SUPPRESS_GONE,
                    Some(format!("thread {tid} exited or its id was reused")),
                );
            }
        }
    }
    if !state.spool.has_room_for(0) {
        state.spool.counters.refused.fetch_add(1, Ordering::Relaxed);
        return engine.suppress(&f, SUPPRESS_SPOOL_FULL, None);
    }
    let needs_helper = !matches!(f.action, Action::Flow(flows::FlowAction::Recorded(_)));
    let budget = state.engine.budget.clone();
    if needs_helper && budget.as_ref().is_none_or(|b| b.available() == 0) {
        return engine.suppress(&f, SUPPRESS_LEAK_BUDGET, None);
    }
    // A flight record is sealed from memory (no helper, nothing that can
    // block on the subject): it takes no capture slot, so a reset storm is
    // bounded by the rule's limits, not turned away as busy.
    let slot = if needs_helper {
        let Some(slot) = state.admit() else {
            return engine.suppress(&f, SUPPRESS_BUSY, None);
        };
        Some(slot)
    } else {
        None
    };
    {
        let mut inner = lock(&engine.inner);
        let Some(s) = inner.rules.iter_mut().find(|s| s.rule.name == f.rule) else {
            return;
        };
        let (per_subject, per_rule) = (s.rule.max_per_subject_per_hour, s.rule.max_per_hour);
        match s
            .limiter
            .try_charge(&f.subject, engine.origin.elapsed(), per_subject, per_rule)
        {
            Ok(()) => {}
            Err(Limited::Subject) => {
                drop(inner);
                return engine.suppress(&f, SUPPRESS_SUBJECT_LIMIT, None);
            }
            Err(Limited::Rule) => {
                drop(inner);
                return engine.suppress(&f, SUPPRESS_RULE_LIMIT, None);
            }
        }
        inner.running.insert(f.subject.clone());
    }
    engine.emit(
        WatchEvent::new(WatchEventKind::Started {
            rule: f.rule.clone(),
            kind: f.kind.as_str().into(),
            subject: f.subject.clone(),
        })
        .at(wall_time_now()),
    );
    let state = state.clone();
    tokio::spawn(async move {
        let outcome = run_capture(&state, &f, slot, budget).await;
        if outcome.is_ok() {
            state.shipper_wake.notify_one();
        }
        state.watch.finish(&f, outcome);
    });
}

fn trigger_of(f: &Firing) -> Trigger {
    Trigger {
        condition: f.condition.clone(),
        fired_at: wall_time_now(),
        kind: f.kind.as_str().into(),
        rule: f.rule.clone(),
    }
}

/// Build the request of a firing, run it on the blocking pool holding
/// `slot`, spool what it sealed; the digests or why not.
async fn run_capture(
    state: &Arc<DaemonState>,
    f: &Firing,
    slot: Option<crate::state::CaptureSlot>,
    budget: Option<pstack_capture::process::LeakBudget>,
) -> Result<Vec<String>, String> {
    let config = state.config();
    let trigger = trigger_of(f);
    let limits: ProcessLimits = crate::capture::limits(&config);
    let window = lock(&state.watch.inner)
        .rules
        .iter()
        .find(|s| s.rule.name == f.rule)
        .map(|s| s.rule.window)
        .unwrap_or_default();
    let request = match &f.action {
        Action::Process { tgid, .. } => {
            // An off-CPU window only when pstackd's programs are attached:
            // a D-state capture must not wait on loading BTF.
            let window_ms = (!window.is_zero() && state.engine.ebpf.loaded())
                .then_some(window.as_millis() as u64);
            let r = process_plan(
                Target::Process { pid: *tgid },
                &RequestedDeadlines::default(),
                &RequestedCaps::default(),
                window_ms,
                &None,
                &limits,
            )
            .map_err(|e| format!("building the capture: {e}"))?;
            ValidRequest::Process(r.with_trigger(trigger))
        }
        Action::Host => {
            let r = process_plan(
                Target::Host,
                &RequestedDeadlines::default(),
                &RequestedCaps::default(),
                None,
                &None,
                &crate::capture::host_limits(&config),
            )
            .map_err(|e| format!("building the capture: {e}"))?;
            ValidRequest::Process(r.with_trigger(trigger))
        }
        Action::Flow(flows::FlowAction::Recorded(rec)) => {
            let spool = state.spool.clone();
            let rec = rec.clone();
            return tokio::task::spawn_blocking(move || {
                let _slot = slot;
                flows::seal_recorded(&rec, trigger, &spool)
            })
            .await
            .map_err(|e| format!("the capture task failed: {e}"))?;
        }
        Action::Flow(flows::FlowAction::Live(plan)) => {
            ValidRequest::Transport((**plan).clone().with_trigger(trigger))
        }
        Action::Longhorn(a) => return longhorn_run::capture(state, a, trigger, slot, budget).await,
    };
    let supervisor = state
        .engine
        .supervisor
        .clone()
        .map_err(|e| format!("pstack-helper not found: {e}"))?;
    let budget = budget.ok_or("no leak budget")?;
    let spool = state.spool.clone();
    let deadline = request.run_deadline();
    let work = move || {
        let _slot = slot; // held until the engine really returns
        engines::run_and_spool(&request, &supervisor, &budget, &spool)
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
