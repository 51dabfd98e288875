//! Running a batch of risky surfaces through helpers under deadlines.
//!
//! Invariants:
//! - **Every risky read carries a deadline.** [`RiskyRun::start`] refuses a
//!   batch in which any read has none ([`CaptureError::MissingDeadline`]);
//!   nothing is spawned.
//! - **Exactly one surface is in flight** at a time per helper: the helper
//!   answers in order, so after `k` responses surface `k` is the one being
//!   read, and its deadline runs from the arrival of response `k-1` (or from
//!   the batch being sent). Results buffered while the caller did other work
//!   only make a deadline more lenient, never stricter; the bundle deadline is
//!   absolute.
//! - **A missed deadline kills the helper.** SIGKILL, then at most the reap
//!   deadline of waiting: reaped → `timeout`; not reaped →
//!   `timeout_unreaped_helper`, journaled and charged to the leak budget. Either
//!   way the remaining surfaces go to a fresh helper.
//! - **A helper that dies** (e.g. SIGSYS from its seccomp filter) makes the
//!   surface in flight `error` with the cause (signal, exit code); the rest go
//!   to a fresh helper.
//! - **No budget, no attempt.** With the leak budget spent, remaining risky
//!   surfaces are `skipped` with that cause; past the bundle deadline they are
//!   `skipped` with that cause.

use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::time::{Duration, Instant};

use pstack_collectors::procfs::{RawMeta, ReadError};
use pstack_envelope::{StatusCause, SurfaceStatus};
use pstack_helper::protocol::{Outcome, PROTOCOL_VERSION, Request, SurfaceKind, SurfaceRequest};
use serde_json::{Map, Value};

use super::helper_process::{HelperProcess, Reap, Received};
use super::leak::{HelperIdentity, LeakBudget};
use super::{CaptureError, SupervisorConfig};

/// One risky surface to read in a helper.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RiskyRead {
    /// Surface id in the envelope.
    pub id: String,
    /// Process it belongs to.
    pub pid: u32,
    /// What to read.
    pub kind: SurfaceKind,
    /// Its deadline; `None` is refused.
    pub deadline: Option<Duration>,
    /// Raw byte cap.
    pub max_bytes: u64,
}

/// What became of one risky surface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RiskyOutcome {
    /// Status in the closed vocabulary.
    pub status: SurfaceStatus,
    /// Why, when not ok.
    pub cause: Option<StatusCause>,
    /// Deadline it ran under, ms.
    pub deadline_ms: u64,
    /// Time it took or ran until abandoned, µs.
    pub elapsed_us: u64,
    /// Typed facts (empty unless read).
    pub facts: Map<String, Value>,
    /// Raw digest/length/truncation when read.
    pub raw: Option<RawMeta>,
    /// The helper that was reading it when it timed out unreaped.
    pub leaked_helper: Option<HelperIdentity>,
}

impl RiskyOutcome {
    fn without_facts(
        status: SurfaceStatus,
        cause: StatusCause,
        deadline_ms: u64,
        elapsed_us: u64,
    ) -> RiskyOutcome {
        RiskyOutcome {
            status,
            cause: Some(cause),
            deadline_ms,
            elapsed_us,
            facts: Map::new(),
            raw: None,
            leaked_helper: None,
        }
    }
}

/// The status a failed read maps to.
pub fn status_of(error: &ReadError) -> SurfaceStatus {
    match error {
        ReadError::Vanished { .. } => SurfaceStatus::Vanished,
        ReadError::PermissionDenied { .. } => SurfaceStatus::PermissionDenied,
        ReadError::Io { .. } | ReadError::Parse { .. } => SurfaceStatus::Error,
    }
}

/// A cause from a read error.
pub fn cause_of(error: &ReadError) -> StatusCause {
    StatusCause {
        errno: error.errno(),
        message: error.to_string(),
    }
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

/// Describe how a helper ended.
pub fn describe_exit(status: Option<ExitStatus>) -> String {
    match status {
        Some(st) => match (st.code(), st.signal()) {
            (_, Some(libc::SIGSYS)) => {
                "helper killed by SIGSYS: its seccomp filter refused a syscall".into()
            }
            (_, Some(sig)) => format!("helper killed by signal {sig}"),
            (Some(3), _) => {
                "helper refused to serve: it could not confine itself (see its stderr)".into()
            }
            (Some(code), _) => format!("helper exited with code {code} mid-batch"),
            (None, None) => "helper ended for an unknown reason".into(),
        },
        None => "helper closed its output and did not exit".into(),
    }
}

/// A batch in progress.
pub struct RiskyRun<'a> {
    reads: Vec<RiskyRead>,
    outcomes: Vec<Option<RiskyOutcome>>,
    next: usize,
    helper: Option<HelperProcess>,
    window_start: Instant,
    bundle_deadline: Instant,
    subject: String,
    config: &'a SupervisorConfig,
    budget: &'a LeakBudget,
    /// Helpers spawned for this batch.
    pub helpers_spawned: u32,
}

impl std::fmt::Debug for RiskyRun<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RiskyRun")
            .field("reads", &self.reads.len())
            .field("next", &self.next)
            .field("helpers_spawned", &self.helpers_spawned)
            .finish()
    }
}

impl<'a> RiskyRun<'a> {
    /// Validate the batch, spawn a helper and send it the batch. The caller
    /// may do safe reads before calling [`RiskyRun::finish`].
    pub fn start(
        reads: Vec<RiskyRead>,
        bundle_deadline: Instant,
        subject: &str,
        config: &'a SupervisorConfig,
        budget: &'a LeakBudget,
    ) -> Result<RiskyRun<'a>, CaptureError> {
        if let Some(r) = reads
            .iter()
            .find(|r| r.deadline.is_none_or(|d| d.is_zero()))
        {
            return Err(CaptureError::MissingDeadline {
                surface: r.id.clone(),
            });
        }
        let n = reads.len();
        let mut run = RiskyRun {
            reads,
            outcomes: vec![None; n],
            next: 0,
            helper: None,
            window_start: Instant::now(),
            bundle_deadline,
            subject: subject.to_string(),
            config,
            budget,
            helpers_spawned: 0,
        };
        run.launch();
        Ok(run)
    }

    fn deadline_ms(&self, i: usize) -> u64 {
        self.reads[i].deadline.map(millis).unwrap_or(1)
    }

    fn settle(&mut self, i: usize, outcome: RiskyOutcome) {
        self.outcomes[i] = Some(outcome);
        if i == self.next {
            self.next += 1;
        }
    }

    fn skip_rest(&mut self, message: String) {
        for i in self.next..self.reads.len() {
            let d = self.deadline_ms(i);
            self.outcomes[i] = Some(RiskyOutcome::without_facts(
                SurfaceStatus::Skipped,
                StatusCause {
                    errno: None,
                    message: message.clone(),
                },
                d,
                0,
            ));
        }
        self.next = self.reads.len();
    }

    /// Ensure a helper is serving the remaining reads, or settle them.
    fn launch(&mut self) {
        while self.next < self.reads.len() && self.helper.is_none() {
            if Instant::now() >= self.bundle_deadline {
                self.skip_rest("bundle deadline reached before this surface was attempted".into());
                return;
            }
            if self.budget.available() == 0 {
                let msg = format!(
                    "leak budget spent: {} unreaped helper(s) of a budget of {} (journal {})",
                    self.budget.in_use(),
                    self.budget.capacity(),
                    self.budget.journal().path().display()
                );
                self.skip_rest(msg);
                return;
            }
            let mut helper =
                match HelperProcess::spawn(&self.config.helper_path, &self.config.boot_id) {
                    Ok(h) => h,
                    Err(e) => {
                        let message = format!(
                            "cannot spawn helper {}: {e}",
                            self.config.helper_path.display()
                        );
                        for i in self.next..self.reads.len() {
                            let d = self.deadline_ms(i);
                            self.outcomes[i] = Some(RiskyOutcome::without_facts(
                                SurfaceStatus::Error,
                                StatusCause {
                                    errno: e.raw_os_error(),
                                    message: message.clone(),
                                },
                                d,
                                0,
                            ));
                        }
                        self.next = self.reads.len();
                        return;
                    }
                };
            self.helpers_spawned += 1;
            if let Some(hook) = &self.config.on_helper_spawned {
                hook(&helper.identity);
            }
            let request = Request {
                version: PROTOCOL_VERSION,
                surfaces: self.reads[self.next..]
                    .iter()
                    .enumerate()
                    .map(|(k, r)| SurfaceRequest {
                        seq: (self.next + k) as u32,
                        pid: r.pid,
                        kind: r.kind.clone(),
                        deadline_ms: r.deadline.map(millis).unwrap_or(0),
                        max_bytes: r.max_bytes,
                    })
                    .collect(),
            };
            self.window_start = Instant::now();
            let first = self.next;
            let send_deadline = (self.window_start
                + self.reads[first].deadline.unwrap_or_default())
            .min(self.bundle_deadline);
            match helper.send(&request, send_deadline) {
                Ok(true) => self.helper = Some(helper),
                Ok(false) => self.abandon(
                    helper,
                    first,
                    "the helper did not accept its request before the deadline",
                ),
                Err(e) => {
                    let status = helper.wait_exit(self.config.reap_deadline);
                    let _ = helper.kill_and_reap(self.config.reap_deadline);
                    let d = self.deadline_ms(first);
                    let elapsed = micros(self.window_start.elapsed());
                    self.settle(
                        first,
                        RiskyOutcome::without_facts(
                            SurfaceStatus::Error,
                            StatusCause {
                                errno: None,
                                message: format!(
                                    "sending the request failed ({e}); {}",
                                    describe_exit(status)
                                ),
                            },
                            d,
                            elapsed,
                        ),
                    );
                }
            }
        }
    }

    /// Kill `helper` after surface `i` missed its deadline and settle `i`.
    fn abandon(&mut self, helper: HelperProcess, i: usize, why: &str) {
        let elapsed = micros(self.window_start.elapsed());
        let d = self.deadline_ms(i);
        let identity = helper.identity.clone();
        let bundle = if Instant::now() >= self.bundle_deadline {
            " (bundle deadline)"
        } else {
            ""
        };
        let outcome = match helper.kill_and_reap(self.config.reap_deadline) {
            Reap::Reaped(_) => RiskyOutcome::without_facts(
                SurfaceStatus::Timeout,
                StatusCause {
                    errno: None,
                    message: format!(
                        "{why}{bundle}: no result within {d} ms; helper pid {} killed and reaped",
                        identity.pid
                    ),
                },
                d,
                elapsed,
            ),
            Reap::Unreaped(child) => {
                let journaled =
                    self.budget
                        .charge(child, identity.clone(), &self.reads[i].id, &self.subject);
                let journal_note = match journaled {
                    Ok(()) => format!("journaled in {}", self.budget.journal().path().display()),
                    Err(e) => format!("JOURNAL WRITE FAILED: {e}"),
                };
                let mut o = RiskyOutcome::without_facts(
                    SurfaceStatus::TimeoutUnreapedHelper,
                    StatusCause {
                        errno: None,
                        message: format!(
                            "{why}{bundle}: no result within {d} ms; helper pid {} (start_ticks {}) killed but not reaped within {} ms; {journal_note}; leak budget {}/{} left",
                            identity.pid,
                            identity.start_ticks,
                            self.config.reap_deadline.as_millis(),
                            self.budget.available(),
                            self.budget.capacity()
                        ),
                    },
                    d,
                    elapsed,
                );
                o.leaked_helper = Some(identity);
                o
            }
        };
        self.settle(i, outcome);
    }

    /// Collect every result, enforcing deadlines, respawning as needed.
    pub fn finish(mut self) -> Vec<RiskyOutcome> {
        while self.next < self.reads.len() {
            let Some(mut helper) = self.helper.take() else {
                self.launch();
                continue;
            };
            let i = self.next;
            let deadline = (self.window_start + self.reads[i].deadline.unwrap_or_default())
                .min(self.bundle_deadline);
            match helper.next_response(deadline) {
                Received::Response(resp) if resp.seq as usize == i => {
                    let d = self.deadline_ms(i);
                    let outcome = match resp.outcome {
                        Outcome::Ok { facts, raw } => RiskyOutcome {
                            status: if raw.truncated {
                                SurfaceStatus::Truncated
                            } else {
                                SurfaceStatus::Ok
                            },
                            cause: raw.truncated.then(|| StatusCause {
                                errno: None,
                                message: format!(
                                    "cut at the byte cap of {} bytes",
                                    self.reads[i].max_bytes
                                ),
                            }),
                            deadline_ms: d,
                            elapsed_us: resp.elapsed_us,
                            facts: match facts {
                                Value::Object(m) => m,
                                other => Map::from_iter([("value".to_string(), other)]),
                            },
                            raw: Some(raw),
                            leaked_helper: None,
                        },
                        Outcome::Failed { error } => RiskyOutcome::without_facts(
                            status_of(&error),
                            cause_of(&error),
                            d,
                            resp.elapsed_us,
                        ),
                        Outcome::Refused { reason } => RiskyOutcome::without_facts(
                            SurfaceStatus::Error,
                            StatusCause {
                                errno: None,
                                message: format!("helper refused: {reason}"),
                            },
                            d,
                            resp.elapsed_us,
                        ),
                    };
                    self.settle(i, outcome);
                    self.window_start = Instant::now();
                    self.helper = Some(helper);
                }
                Received::Response(resp) => {
                    let why = format!(
                        "protocol violation: got result {} while {i} was in flight",
                        resp.seq
                    );
                    self.kill_with_error(helper, i, why);
                }
                Received::Protocol(e) => {
                    self.kill_with_error(helper, i, format!("protocol violation: {e}"))
                }
                Received::Timeout => self.abandon(helper, i, "deadline missed"),
                Received::Closed => {
                    let status = helper.wait_exit(self.config.reap_deadline);
                    let message = format!("{} while reading this surface", describe_exit(status));
                    if status.is_none() {
                        self.abandon(helper, i, &message);
                    } else {
                        let d = self.deadline_ms(i);
                        let elapsed = micros(self.window_start.elapsed());
                        self.settle(
                            i,
                            RiskyOutcome::without_facts(
                                SurfaceStatus::Error,
                                StatusCause {
                                    errno: None,
                                    message,
                                },
                                d,
                                elapsed,
                            ),
                        );
                    }
                }
            }
        }
        if let Some(mut helper) = self.helper.take() {
            helper.close_input();
            if helper.wait_exit(self.config.reap_deadline).is_none()
                && let Reap::Unreaped(child) = helper.kill_and_reap(self.config.reap_deadline)
            {
                let identity = child.id();
                let _ = identity;
                let helper_id = HelperIdentity {
                    pid: child.id(),
                    start_ticks: 0,
                    boot_id: self.config.boot_id.clone(),
                };
                let _ = self
                    .budget
                    .charge(child, helper_id, "<after batch>", &self.subject);
            }
        }
        self.outcomes
            .into_iter()
            .map(|o| {
                o.unwrap_or_else(|| {
                    RiskyOutcome::without_facts(
                        SurfaceStatus::Error,
                        StatusCause {
                            errno: None,
                            message: "internal: surface was never settled".into(),
                        },
                        1,
                        0,
                    )
                })
            })
            .collect()
    }

    fn kill_with_error(&mut self, helper: HelperProcess, i: usize, message: String) {
        let d = self.deadline_ms(i);
        let elapsed = micros(self.window_start.elapsed());
        match helper.kill_and_reap(self.config.reap_deadline) {
            Reap::Reaped(_) => self.settle(
                i,
                RiskyOutcome::without_facts(
                    SurfaceStatus::Error,
                    StatusCause {
                        errno: None,
                        message,
                    },
                    d,
                    elapsed,
                ),
            ),
            Reap::Unreaped(child) => {
                let id = HelperIdentity {
                    pid: child.id(),
                    start_ticks: 0,
                    boot_id: self.config.boot_id.clone(),
                };
                let _ = self
                    .budget
                    .charge(child, id, &self.reads[i].id, &self.subject);
                self.settle(
                    i,
                    RiskyOutcome::without_facts(
                        SurfaceStatus::Error,
                        StatusCause {
                            errno: None,
                            message,
                        },
                        d,
                        elapsed,
                    ),
                )
            }
        }
    }
}

/// Run a batch to completion (start + finish). The low-level entry point for
/// callers that need only risky reads.
pub fn run_risky(
    reads: Vec<RiskyRead>,
    bundle_deadline: Instant,
    subject: &str,
    config: &SupervisorConfig,
    budget: &LeakBudget,
) -> Result<Vec<RiskyOutcome>, CaptureError> {
    Ok(RiskyRun::start(reads, bundle_deadline, subject, config, budget)?.finish())
}
