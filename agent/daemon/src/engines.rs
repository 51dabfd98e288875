//! Runs one validated capture request on its engine and spools every
//! envelope it produced — the daemon's side of `pstack-capture`.
//!
//! Invariants:
//! - **Blocking, off the runtime.** [`run_and_spool`] is synchronous; the API
//!   calls it inside `spawn_blocking` while holding a capture slot, so every
//!   kind counts against `max_concurrent_captures` alike.
//! - **Shared helpers, shared budget.** Process and net captures use the
//!   daemon's one `SupervisorConfig` and its one `LeakBudget`: a net helper
//!   leaked by a transport capture is charged where a process helper's would be.
//! - **Spooled before answered.** Every envelope of a capture is put in the
//!   spool (durably, see `spool`) before the answer names it; envelopes of a
//!   multi-envelope capture (transport flows, Longhorn streams then the
//!   transfer) are spooled in the order the CLI prints them. If one put
//!   fails the answer is the failure, and the envelopes already spooled stay
//!   there and are shipped (they are sealed evidence, not a partial write).
//! - **Own eBPF sessions for transport and trace.** `transport`, `longhorn`
//!   and `tcp_trace` load their own one-shot eBPF session rather than borrow
//!   pstackd's (issue 17, item 4 — not done, on purpose): the daemon's TCP
//!   programs run count-only (no records, so no per-socket reset
//!   attribution and no live lines) with no port or address filter, while
//!   these captures need records filtered in the kernel by their own port.
//!   Borrowing would mean switching the shared programs to recording and
//!   rewriting their filter per capture, which changes what the daemon's
//!   always-on counters mean while the capture runs and serialises every
//!   capture behind one filter. A process capture's off-CPU window does
//!   borrow it (`ebpf`), since its programs need no per-capture filter.
//! - **Bounded, one way.** Every capture pstackd runs (asked over the API
//!   or started by a watch rule, process or transport or Longhorn) goes
//!   through [`run_bounded`]: the engine on the blocking pool, awaited at
//!   most its run deadline plus [`OVERRUN_GRACE`]; past that the caller is
//!   answered and the engine finishes in the background, still holding its
//!   capture slot (the closure owns it) until it really returns.
//! - **Nothing from the caller is executed.** The `hubble` CLI a Longhorn
//!   capture runs is [`HUBBLE_BIN`] from the daemon's PATH, never a path from
//!   the request.

use std::path::Path;
use std::time::Duration;

use pstackd_api::limits::OVERRUN_GRACE;

use pstack_capture::process::{self, CaptureError, LeakBudget, SupervisorConfig};
use pstack_capture::request::ValidRequest;
use pstack_capture::tcp_trace::TraceError;
use pstack_capture::transport::TransportError;
use pstack_capture::{Progress, longhorn, tcp_trace, transport};
use pstack_envelope::{Envelope, SurfaceStatus};

use super::captures::Record;
use super::spool::{PutOutcome, Spool, SpoolError};
use pstackd_api::CaptureEvent;

/// Why a bounded run has no answer from its engine.
#[derive(Debug)]
pub enum RunAborted {
    /// The engine's task panicked or was cancelled.
    Failed(tokio::task::JoinError),
    /// Not finished within the run deadline plus [`OVERRUN_GRACE`]; the
    /// engine runs on in the background.
    Overran,
}

/// Run one capture's engine (`work`, which owns the capture slot so that it
/// is held until the engine really returns) on the blocking pool and wait
/// for it at most `deadline` plus [`OVERRUN_GRACE`].
pub async fn run_bounded<T, F>(deadline: Duration, work: F) -> Result<T, RunAborted>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    match tokio::time::timeout(deadline + OVERRUN_GRACE, tokio::task::spawn_blocking(work)).await {
        Ok(Ok(r)) => Ok(r),
        Ok(Err(join)) => Err(RunAborted::Failed(join)),
        Err(_) => Err(RunAborted::Overran),
    }
}

/// The `hubble` CLI a Longhorn capture runs (looked up on PATH).
pub const HUBBLE_BIN: &str = "hubble";

/// One spooled envelope.
#[derive(Debug)]
pub struct Spooled {
    /// Its digest.
    pub digest: String,
    /// The bytes spooled (compact JSON).
    pub bytes: Vec<u8>,
    /// What the spool did.
    pub put: PutOutcome,
}

/// What one capture produced, spooled.
#[derive(Debug)]
pub struct Captured {
    /// The request's kind (`process`, `transport`, …).
    pub kind: &'static str,
    /// Every envelope, in the order the CLI prints them.
    pub envelopes: Vec<Spooled>,
    /// `tcp_trace` only: why the eBPF session could not start (the envelope
    /// carries it in its surfaces).
    pub trace_refused: Option<SurfaceStatus>,
}

/// Why a capture produced no answer.
#[derive(Debug, thiserror::Error)]
pub enum EngineFailure {
    /// The process supervisor refused or failed.
    #[error(transparent)]
    Capture(#[from] CaptureError),
    /// The transport or Longhorn engine could not run.
    #[error(transparent)]
    Transport(#[from] TransportError),
    /// The trace engine could not run.
    #[error(transparent)]
    Trace(#[from] TraceError),
    /// An envelope could not be spooled.
    #[error(transparent)]
    Spool(#[from] SpoolError),
    /// An envelope could not be encoded.
    #[error("encoding an envelope: {0}")]
    Encode(String),
}

fn log_progress<'r>(kind: &'static str, record: Option<&'r Record>) -> impl Fn(Progress<'_>) + 'r {
    move |p| {
        if let Some(r) = record {
            r.push(super::captures::progress_event(p));
        }
        log_one(kind, p)
    }
}

fn log_one(kind: &'static str, p: Progress<'_>) {
    match p {
        Progress::Phase { what, expected } => {
            tracing::debug!(
                kind,
                phase = what,
                expected_ms = expected.as_millis() as u64,
                "capture phase"
            )
        }
        Progress::PhaseDone => {}
        Progress::Note(text) => tracing::info!(kind, note = text, "capture note"),
    }
}

/// Run `request` with the daemon's helper configuration and leak budget,
/// then spool what it produced.
pub fn run_and_spool(
    request: &ValidRequest,
    config: &SupervisorConfig,
    budget: &LeakBudget,
    spool: &Spool,
) -> Result<Captured, EngineFailure> {
    run_and_spool_with(request, config, budget, spool, None)
}

/// [`run_and_spool`], reporting into `record` (a capture started with
/// `Prefer: respond-async`): every phase, and a `tcp_trace`'s live lines as
/// they happen (its reader then wakes every 100 ms, as `pstackctl trace
/// tcp` one-shot does). The envelopes are not written to the record here:
/// the caller does, after this returns, when they are all spooled.
pub fn run_and_spool_with(
    request: &ValidRequest,
    config: &SupervisorConfig,
    budget: &LeakBudget,
    spool: &Spool,
    record: Option<&Record>,
) -> Result<Captured, EngineFailure> {
    // Leaks journaled by one-shot pstackctl since the last capture count here.
    budget.refresh_from_journal();
    let (kind, envelopes, trace_refused): (&'static str, Vec<Envelope>, _) = match request {
        ValidRequest::Process(r) => ("process", vec![process::capture(r, config, budget)?], None),
        ValidRequest::Transport(plan) => {
            let progress = log_progress("transport", record);
            let r = transport::capture_with(plan, config, budget, &progress)?;
            let all = r.flows.into_iter().chain(r.no_match).collect();
            ("transport", all, None)
        }
        ValidRequest::Longhorn(plan) => {
            let progress = log_progress("longhorn", record);
            let r = longhorn::capture(plan, config, budget, Path::new(HUBBLE_BIN), &progress)?;
            ("longhorn", r.into_envelopes(), None)
        }
        ValidRequest::TcpTrace(plan) => {
            let progress = log_progress("tcp_trace", record);
            let r = match record {
                None => tcp_trace::capture(plan, &progress)?,
                Some(rec) => tcp_trace::run(
                    plan,
                    true,
                    std::future::pending::<()>(),
                    &progress,
                    &mut |line| rec.push(CaptureEvent::Trace { line }),
                )?,
            };
            ("tcp_trace", vec![r.envelope], r.refused)
        }
    };
    spool_all(kind, envelopes, trace_refused, spool)
}

/// A Longhorn capture under a watcher (pstackd's `longhorn_rebuild` rule:
/// the window ends when the rebuild does), spooled like [`run_and_spool`].
pub fn run_longhorn_watched(
    plan: &longhorn::LonghornPlan,
    watcher: &longhorn::Watcher,
    config: &SupervisorConfig,
    budget: &LeakBudget,
    spool: &Spool,
) -> Result<Captured, EngineFailure> {
    budget.refresh_from_journal();
    let progress = log_progress("longhorn", None);
    let r = longhorn::capture_watched(
        plan,
        config,
        budget,
        Path::new(HUBBLE_BIN),
        &progress,
        watcher,
    )?;
    spool_all("longhorn", r.into_envelopes(), None, spool)
}

fn spool_all(
    kind: &'static str,
    envelopes: Vec<Envelope>,
    trace_refused: Option<SurfaceStatus>,
    spool: &Spool,
) -> Result<Captured, EngineFailure> {
    let mut spooled = Vec::with_capacity(envelopes.len());
    for env in envelopes {
        let bytes = serde_json::to_vec(&env).map_err(|e| EngineFailure::Encode(e.to_string()))?;
        let put = spool.put(&env.digest, &bytes)?;
        spooled.push(Spooled {
            digest: env.digest,
            bytes,
            put,
        });
    }
    Ok(Captured {
        kind,
        envelopes: spooled,
        trace_refused,
    })
}
