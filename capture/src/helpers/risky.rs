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
use pstack_helper::protocol::{
    Outcome, PROTOCOL_VERSION, ProcReading, Request, SurfaceKind, SurfaceRequest,
};
use serde_json::{Map, Value};

use super::helper_process::{HelperProcess, Reap, Received};
use super::leak::{HelperIdentity, LeakBudget};
use crate::process::{CaptureError, SupervisorConfig};

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
    /// The envelope rendering of `reading` (empty unless read).
    pub facts: Map<String, Value>,
    /// The helper's typed reading, when read.
    pub reading: Option<ProcReading>,
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
            reading: None,
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
            (Some(pstack_helper::protocol::EXIT_NETNS_DENIED), _) => {
                "net helper was refused entry to the target network namespace (see its stderr)"
                    .into()
            }
            (Some(pstack_helper::protocol::EXIT_NETNS_FAILED), _) => {
                "net helper could not enter the target network namespace (see its stderr)".into()
            }
            (Some(2), _) => "helper refused its arguments (see its stderr)".into(),
            (Some(4), _) => {
                "helper read a malformed request frame (agent and helper versions differ?)".into()
            }
            (Some(pstack_helper::protocol::EXIT_PANIC), _) => {
                "helper panicked after confinement (it cannot write to stderr then)".into()
            }
            (Some(code), _) => format!("helper exited with code {code} mid-batch"),
            (None, None) => "helper ended for an unknown reason".into(),
        },
        None => "helper closed its output and did not exit".into(),
    }
}

/// Spawn a helper and call the spawn hook.
fn spawn_helper(config: &SupervisorConfig) -> std::io::Result<HelperProcess> {
    let helper = HelperProcess::spawn(&config.helper_path, &config.boot_id)?;
    if let Some(hook) = &config.on_helper_spawned {
        hook(&helper.identity);
    }
    Ok(helper)
}

/// A helper spawned before its batch is known, so its exec and confinement
/// overlap with the caller's work. Sending it nothing is harmless: it is
/// killed (and reaped) when the batch finishes.
#[derive(Debug)]
pub struct EarlyHelper {
    helper: Option<HelperProcess>,
}

impl EarlyHelper {
    /// No early helper.
    pub fn none() -> EarlyHelper {
        EarlyHelper { helper: None }
    }

    /// Spawn one now if the leak budget allows (else the batch will skip).
    pub fn spawn(config: &SupervisorConfig, budget: &LeakBudget) -> EarlyHelper {
        if budget.available() == 0 {
            return EarlyHelper::none();
        }
        EarlyHelper {
            helper: spawn_helper(config).ok(),
        }
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
    prespawned: Option<HelperProcess>,
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
        RiskyRun::start_with(
            reads,
            bundle_deadline,
            subject,
            config,
            budget,
            EarlyHelper::none(),
        )
    }

    /// [`RiskyRun::start`] using a helper spawned earlier with
    /// [`EarlyHelper::spawn`] (its exec and confinement overlapped with the
    /// caller's enumeration).
    pub fn start_with(
        reads: Vec<RiskyRead>,
        bundle_deadline: Instant,
        subject: &str,
        config: &'a SupervisorConfig,
        budget: &'a LeakBudget,
        early: EarlyHelper,
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
            prespawned: early.helper,
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
            let spawned = match self.prespawned.take() {
                Some(h) => Ok(h),
                None => spawn_helper(self.config),
            };
            let mut helper = match spawned {
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
            let digest_key = match self.config.digest_key.read() {
                Ok(k) => k.clone(),
                Err(poisoned) => poisoned.into_inner().clone(),
            };
            let request = Request {
                version: PROTOCOL_VERSION,
                digest_key,
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
    pub fn finish(self) -> Vec<RiskyOutcome> {
        self.finish_with(|_| {})
    }

    /// [`RiskyRun::finish`], calling `settled(i)` as soon as surface `i` has
    /// its outcome (in order), so a caller can do per-surface follow-up work
    /// (e.g. the second identity read) while later surfaces are still read.
    pub fn finish_with(mut self, mut settled: impl FnMut(usize)) -> Vec<RiskyOutcome> {
        let mut reported = 0;
        loop {
            while reported < self.next {
                settled(reported);
                reported += 1;
            }
            if self.next >= self.reads.len() {
                break;
            }
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
                        Outcome::Ok { reading, .. } if !reading.answers(&self.reads[i].kind) => {
                            RiskyOutcome::without_facts(
                                SurfaceStatus::Error,
                                StatusCause {
                                    errno: None,
                                    message: format!(
                                        "the helper answered a {} request with another reading; not believed",
                                        self.reads[i].kind.name()
                                    ),
                                },
                                d,
                                resp.elapsed_us,
                            )
                        }
                        Outcome::Ok { reading, raw } => RiskyOutcome {
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
                            facts: reading.envelope_facts(),
                            reading: Some(reading),
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
            let identity = helper.identity.clone();
            if helper.wait_exit(self.config.reap_deadline).is_none()
                && let Reap::Unreaped(child) = helper.kill_and_reap(self.config.reap_deadline)
            {
                // Every surface was answered, yet the helper would not exit:
                // still a leak, journaled and charged.
                let _ = self
                    .budget
                    .charge(child, identity, "<after batch>", &self.subject);
            }
        }
        if let Some(spare) = self.prespawned.take() {
            let identity = spare.identity.clone();
            if let Reap::Unreaped(child) = spare.kill_and_reap(self.config.reap_deadline) {
                let _ = self
                    .budget
                    .charge(child, identity, "<unused helper>", &self.subject);
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
        let identity = helper.identity.clone();
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
                let _ = self
                    .budget
                    .charge(child, identity, &self.reads[i].id, &self.subject);
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
