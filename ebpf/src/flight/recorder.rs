//! [`FlightRecorder`]: the TCP programs in record mode, the watched port
//! range filtered in the kernel, feeding a [`FlowBook`] on a poll that never
//! blocks.
//!
//! Invariants: the session is the recorder's own (never shared), so its
//! filter and record mode change nothing else; a poll drains at most a
//! bounded number of records and loses none silently (the kernel's losses
//! are read back as `events_lost`).

use super::{FlightConfig, FlightStats, FlowBook, FlowHistory, FlowIncident, FlowKey};
use crate::error::EbpfError;
use crate::session::{EbpfConfig, EbpfSession, monotonic_ns};

/// The flight recorder: an [`EbpfSession`] of its own feeding a [`FlowBook`].
pub struct FlightRecorder {
    session: EbpfSession,
    book: FlowBook,
    kernel_events: u64,
    events_lost: u64,
    max_per_poll: usize,
}

impl std::fmt::Debug for FlightRecorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FlightRecorder")
            .field("session", &self.session)
            .field("flows", &self.book.flows())
            .finish_non_exhaustive()
    }
}

/// Ring buffer of the recorder's session: ~2 300 records between two polls.
const FLIGHT_RING_BYTES: u32 = 256 * 1024;

impl FlightRecorder {
    /// Load and attach the TCP programs, recording only flows with a port in
    /// `cfg.ports` (filtered in the kernel). Typed errors as
    /// [`EbpfSession::start`]: no BTF is `NoBtf` (`unsupported`), no privilege
    /// `PermissionDenied`; a bad config `InvalidConfig` naming the field.
    pub fn start(cfg: FlightConfig) -> Result<FlightRecorder, EbpfError> {
        cfg.validate()?;
        let ecfg = EbpfConfig {
            tcp: true,
            offcpu: false,
            tcp_count_only: false,
            // The recorder folds every record of its watched ports per flow
            // per second (FlowBook): it keeps the per-event record mode.
            tcp_per_event: true,
            port: None,
            port_range: Some(cfg.ports),
            ring_bytes: FLIGHT_RING_BYTES,
            // Never woken: the recorder polls on its owner's schedule.
            wakeup_bytes: u64::from(FLIGHT_RING_BYTES),
            btf_path: cfg.btf_path.clone(),
            tracefs: cfg.tracefs.clone(),
            ..EbpfConfig::tcp()
        };
        let session = EbpfSession::start(ecfg)?;
        let started = monotonic_ns();
        Ok(FlightRecorder {
            session,
            book: FlowBook::new(cfg.horizon, cfg.max_flows, started),
            kernel_events: 0,
            events_lost: 0,
            max_per_poll: 4 * FLIGHT_RING_BYTES as usize / crate::record::TCP_EVENT_SIZE,
        })
    }

    /// Drain what the kernel queued (without waiting), fold it, expire what
    /// left the horizon, and return the resets and RTOs seen since the last
    /// poll. Call it at least every second or so: the ring holds ~2 300
    /// records and more are lost (counted in [`FlightStats::events_lost`]).
    pub fn poll(&mut self) -> Vec<FlowIncident> {
        let book = &mut self.book;
        self.session
            .drain_tcp(self.max_per_poll, |raw| book.fold_raw(raw));
        if let Ok(Some(k)) = self.session.tcp_kernel_counts() {
            self.kernel_events = k.seen.iter().sum();
            self.events_lost = k.lost.iter().sum();
        }
        self.book.expire(monotonic_ns());
        self.book.take_incidents()
    }

    /// What the recorder holds about one flow (as of the last poll).
    pub fn history(&self, flow: &FlowKey) -> Option<FlowHistory> {
        self.book.history(flow)
    }

    /// The flows held, in key order.
    pub fn keys(&self) -> Vec<FlowKey> {
        self.book.keys()
    }

    /// Flows held.
    pub fn flows(&self) -> usize {
        self.book.flows()
    }

    /// Counters, with the kernel's (as of the last poll).
    pub fn stats(&self) -> FlightStats {
        FlightStats {
            kernel_events: self.kernel_events,
            events_lost: self.events_lost,
            ..self.book.stats()
        }
    }

    /// The session's status (programs attached, cumulative counts).
    pub fn session_status(&self) -> Result<crate::EbpfStatus, EbpfError> {
        self.session.status()
    }
}
