//! Long captures by id: `POST /v1/captures` with `Prefer: respond-async`
//! answers `202 Accepted` + `Location: /v1/captures/{id}` and the capture
//! runs on; `GET /v1/captures/{id}` reports its state and phases, and
//! `GET /v1/captures/{id}/events` streams its progress, live lines
//! (`tcp_trace`), spooled envelopes and outcome as NDJSON ([`CaptureEvent`],
//! one object a line, chunked).
//!
//! Invariants:
//! - **Owned and unguessable.** An id is 128 bits from the kernel's CSPRNG;
//!   a record answers only the uid that started it (and root). Any other
//!   peer gets the same 404 as an unknown id: existence is not revealed.
//! - **Bounded.** Running records are bounded by the capture slots (a record
//!   is made only after admission); finished records are kept
//!   [`KEEP_FINISHED`] long, at most [`MAX_FINISHED`] of them, oldest
//!   evicted first. A record's log holds at most [`MAX_LOG_BYTES`] of live
//!   lines; past it live lines are counted ([`CaptureEvent::Dropped`]), never
//!   buffered — phases, envelopes and the outcome are always kept.
//! - **Replayable.** Every reader of the events gets the log from its first
//!   line, then follows it to the outcome; a reader arriving after the end
//!   gets the whole log. The log ends with exactly one `done` or `failed`.
//! - **Spooled before listed.** An `envelope` line is written only after the
//!   envelope is durably spooled (the same promise as a 200).

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use tokio::sync::watch;

use pstack_capture::Progress;
use pstackd_api::{
    CaptureEvent, CaptureOutcome, CaptureState, CaptureStatus, ErrorDetail, PhaseStatus,
};

/// How long a finished capture stays readable.
pub const KEEP_FINISHED: Duration = Duration::from_secs(600);
/// Most finished captures kept.
pub const MAX_FINISHED: usize = 64;
/// Most bytes of live lines kept per capture.
pub const MAX_LOG_BYTES: usize = 16 << 20;

/// An engine's progress report as an event line.
pub fn progress_event(p: Progress<'_>) -> CaptureEvent {
    match p {
        Progress::Phase { what, expected } => CaptureEvent::Phase {
            what: what.to_string(),
            expected_ms: u64::try_from(expected.as_millis()).unwrap_or(u64::MAX),
        },
        Progress::PhaseDone => CaptureEvent::PhaseDone,
        Progress::Note(text) => CaptureEvent::Note {
            text: text.to_string(),
        },
    }
}

#[derive(Debug, Default)]
struct Log {
    lines: Vec<Bytes>,
    live_bytes: usize,
    dropped: u64,
    phases: Vec<(String, u64, bool)>,
    outcome: Option<CaptureEvent>,
    finished_at: Option<Instant>,
}

/// One capture started with `Prefer: respond-async`.
#[derive(Debug)]
pub struct Record {
    /// Its id (32 lowercase hex digits).
    pub id: String,
    /// The uid of the peer that started it.
    pub owner_uid: u32,
    /// The request's kind.
    pub kind: &'static str,
    started: Instant,
    started_unix_ms: u64,
    log: Mutex<Log>,
    tick: watch::Sender<u64>,
}

impl Record {
    fn log(&self) -> std::sync::MutexGuard<'_, Log> {
        self.log.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Append one event (a no-op once the outcome is written).
    pub fn push(&self, event: CaptureEvent) {
        let mut log = self.log();
        if log.outcome.is_some() {
            return;
        }
        let live = matches!(event, CaptureEvent::Trace { .. });
        let mut text = match serde_json::to_vec(&event) {
            Ok(t) => t,
            Err(e) => {
                tracing::error!(error = %e, "a capture event could not be encoded");
                return;
            }
        };
        text.push(b'\n');
        if live {
            if log.live_bytes + text.len() > MAX_LOG_BYTES {
                log.dropped += 1;
                return;
            }
            log.live_bytes += text.len();
        }
        match &event {
            CaptureEvent::Phase { what, expected_ms } => {
                log.phases.push((what.clone(), *expected_ms, false))
            }
            CaptureEvent::PhaseDone => {
                if let Some(p) = log.phases.iter_mut().rev().find(|p| !p.2) {
                    p.2 = true;
                }
            }
            _ => {}
        }
        if event.is_final() {
            if log.dropped > 0 {
                let dropped = serde_json::to_vec(&CaptureEvent::Dropped { lines: log.dropped })
                    .unwrap_or_default();
                log.lines
                    .push(Bytes::from([dropped, b"\n".to_vec()].concat()));
            }
            log.outcome = Some(event);
            log.finished_at = Some(Instant::now());
        }
        log.lines.push(Bytes::from(text));
        let n = log.lines.len() as u64;
        drop(log);
        self.tick.send_replace(n);
    }

    /// Lines from `cursor` on, and whether the log is complete.
    pub fn lines_from(&self, cursor: usize) -> (Vec<Bytes>, bool) {
        let log = self.log();
        let lines = log
            .lines
            .get(cursor..)
            .map(<[Bytes]>::to_vec)
            .unwrap_or_default();
        (lines, log.outcome.is_some())
    }

    /// Wakes when a line is appended.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.tick.subscribe()
    }

    /// `GET /v1/captures/{id}`.
    pub fn status(&self) -> CaptureStatus {
        let log = self.log();
        let (state, outcome) = match &log.outcome {
            Some(CaptureEvent::Done {
                digests,
                spool_status,
                trace_refused,
            }) => (
                CaptureState::Succeeded,
                Some(CaptureOutcome::Succeeded {
                    digests: digests.clone(),
                    spool_status: spool_status.clone(),
                    trace_refused: *trace_refused,
                }),
            ),
            Some(CaptureEvent::Failed {
                status,
                code,
                message,
                field,
            }) => (
                CaptureState::Failed,
                Some(CaptureOutcome::Failed {
                    status: *status,
                    error: ErrorDetail {
                        code: code.clone(),
                        message: message.clone(),
                        field: field.clone(),
                    },
                }),
            ),
            _ => (CaptureState::Running, None),
        };
        let end = log.finished_at.unwrap_or_else(Instant::now);
        CaptureStatus {
            id: self.id.clone(),
            kind: self.kind.to_string(),
            state,
            started_unix_ms: self.started_unix_ms,
            elapsed_ms: u64::try_from(end.duration_since(self.started).as_millis())
                .unwrap_or(u64::MAX),
            phases: log
                .phases
                .iter()
                .map(|(what, expected_ms, done)| PhaseStatus {
                    what: what.clone(),
                    expected_ms: *expected_ms,
                    done: *done,
                })
                .collect(),
            lines: log.lines.len() as u64,
            live_lines_dropped: log.dropped,
            outcome,
            events: format!("/v1/captures/{}/events", self.id),
        }
    }

    fn finished_before(&self, t: Instant) -> bool {
        self.log().finished_at.is_some_and(|f| f < t)
    }

    fn finished(&self) -> bool {
        self.log().outcome.is_some()
    }
}

/// The captures started with `Prefer: respond-async`.
#[derive(Debug, Default)]
pub struct Registry {
    records: Mutex<VecDeque<std::sync::Arc<Record>>>,
}

/// 128 bits from the kernel's CSPRNG, as hex.
fn new_id() -> std::io::Result<String> {
    let mut buf = [0u8; 16];
    let mut filled = 0;
    while filled < buf.len() {
        // SAFETY: writes at most the remaining bytes of `buf`.
        let n =
            unsafe { libc::getrandom(buf[filled..].as_mut_ptr().cast(), buf.len() - filled, 0) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        filled += n as usize;
    }
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}

impl Registry {
    /// Register a new running capture owned by `owner_uid`.
    pub fn start(
        &self,
        owner_uid: u32,
        kind: &'static str,
    ) -> std::io::Result<std::sync::Arc<Record>> {
        let record = std::sync::Arc::new(Record {
            id: new_id()?,
            owner_uid,
            kind,
            started: Instant::now(),
            started_unix_ms: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_millis() as u64)
                .unwrap_or(0),
            log: Mutex::new(Log::default()),
            tick: watch::Sender::new(0),
        });
        let mut records = self.records.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(cutoff) = Instant::now().checked_sub(KEEP_FINISHED) {
            records.retain(|r| !r.finished_before(cutoff));
        }
        while records.iter().filter(|r| r.finished()).count() >= MAX_FINISHED {
            match records.iter().position(|r| r.finished()) {
                Some(i) => {
                    records.remove(i);
                }
                None => break,
            }
        }
        records.push_back(record.clone());
        Ok(record)
    }

    /// The record `id` as `uid` may see it: its owner's, or any for root.
    pub fn get(&self, id: &str, uid: u32) -> Option<std::sync::Arc<Record>> {
        let records = self.records.lock().unwrap_or_else(|p| p.into_inner());
        records
            .iter()
            .find(|r| r.id == id && (r.owner_uid == uid || uid == 0))
            .cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pstackd_api::TraceLine;

    #[test]
    fn ids_are_owned_and_the_log_ends_once() {
        let reg = Registry::default();
        let a = reg.start(1000, "tcp_trace").unwrap();
        let b = reg.start(1000, "tcp_trace").unwrap();
        assert_ne!(a.id, b.id);
        assert_eq!(a.id.len(), 32);
        assert!(reg.get(&a.id, 1000).is_some());
        assert!(reg.get(&a.id, 1001).is_none(), "another uid sees a 404");
        assert!(reg.get(&a.id, 0).is_some(), "root sees every capture");
        assert!(reg.get("0123", 1000).is_none());
        a.push(CaptureEvent::Phase {
            what: "watching TCP".into(),
            expected_ms: 5,
        });
        a.push(CaptureEvent::PhaseDone);
        a.push(CaptureEvent::Done {
            digests: vec![],
            spool_status: "spooled".into(),
            trace_refused: None,
        });
        a.push(CaptureEvent::Note {
            text: "after the end".into(),
        });
        let (lines, done) = a.lines_from(0);
        assert!(done);
        assert_eq!(lines.len(), 3, "nothing after the outcome");
        let s = a.status();
        assert_eq!(s.state, CaptureState::Succeeded);
        assert!(s.phases[0].done);
        // The wire form reads back as the same type (what a client parses).
        let wire = serde_json::to_vec(&s).unwrap();
        assert_eq!(serde_json::from_slice::<CaptureStatus>(&wire).unwrap(), s);
        assert!(matches!(s.outcome, Some(CaptureOutcome::Succeeded { .. })));
    }

    #[test]
    fn live_lines_past_the_cap_are_counted_not_kept() {
        let reg = Registry::default();
        let r = reg.start(0, "tcp_trace").unwrap();
        let big = "x".repeat(1 << 20);
        for _ in 0..20 {
            r.push(CaptureEvent::Trace {
                line: TraceLine::Event {
                    text: big.clone(),
                    json: "{}".into(),
                },
            });
        }
        r.push(CaptureEvent::Done {
            digests: vec![],
            spool_status: "spooled".into(),
            trace_refused: None,
        });
        let (lines, _) = r.lines_from(0);
        let kept = lines.len() - 2;
        assert!((14..20).contains(&kept), "{kept}");
        let dropped: CaptureEvent = serde_json::from_slice(&lines[lines.len() - 2]).unwrap();
        assert_eq!(
            dropped,
            CaptureEvent::Dropped {
                lines: 20 - kept as u64
            }
        );
    }

    #[test]
    fn finished_records_are_bounded() {
        let reg = Registry::default();
        let first = reg.start(0, "transport").unwrap();
        first.push(CaptureEvent::Failed {
            status: 500,
            code: "x".into(),
            message: "y".into(),
            field: None,
        });
        let running = reg.start(0, "transport").unwrap();
        for _ in 0..MAX_FINISHED + 3 {
            let r = reg.start(0, "transport").unwrap();
            r.push(CaptureEvent::Failed {
                status: 500,
                code: "x".into(),
                message: "y".into(),
                field: None,
            });
        }
        assert!(reg.get(&first.id, 0).is_none(), "oldest finished evicted");
        assert!(reg.get(&running.id, 0).is_some(), "running never evicted");
        let n = reg.records.lock().unwrap().len();
        assert!(n <= MAX_FINISHED + 2, "{n}");
    }
}
