//! Shared daemon state: the running configuration, the access policy, the
//! spool, shipping stats, the capture supervisor and counters.
//!
//! Invariants:
//! - The configuration and the access policy are swapped whole (an `Arc`
//!   behind a lock held only to clone or replace it): a request sees one
//!   consistent configuration from start to end.
//! - `in_flight` counts captures from admission until the supervisor call
//!   actually returns (the guard travels into the blocking task), so a capture
//!   abandoned by its HTTP caller still holds its slot and its helper.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Instant;

use tokio::sync::{Notify, watch};

use super::config::{Config, ShipperConfig};
use super::peer::AccessPolicy;
use super::shipper::ShipperStats;
use super::spool::Spool;
use pstack_capture::process::{LeakBudget, SupervisorConfig};

/// Request counters for `/metrics`.
#[derive(Debug, Default)]
pub struct Counters {
    /// Captures that returned an envelope.
    pub captures_ok: AtomicU64,
    /// Captures the supervisor could not produce.
    pub captures_failed: AtomicU64,
    /// Captures refused with 429.
    pub captures_busy: AtomicU64,
    /// Captures refused because the spool is full (507).
    pub captures_spool_full: AtomicU64,
    /// Captures that overran their deadline plus grace (504).
    pub captures_overran: AtomicU64,
    /// Requests refused with 400/404/405/413.
    pub bad_requests: AtomicU64,
    /// Requests refused with 403.
    pub unauthorized: AtomicU64,
    /// Connections refused at accept (over `max_connections`).
    pub connections_refused: AtomicU64,
    /// Connections open now.
    pub connections_open: AtomicU64,
    /// Unauthorized peers being answered 403 at accept now.
    pub refusals_in_flight: AtomicU64,
    /// Reloads applied / rejected.
    pub reloads_ok: AtomicU64,
    /// Reloads rejected.
    pub reloads_rejected: AtomicU64,
}

/// The capture supervisor as the daemon holds it.
#[derive(Debug)]
pub struct CaptureEngine {
    /// How helpers run; `None` when `pstack-helper` was not found (captures
    /// then answer 503 with the reason).
    pub supervisor: Result<SupervisorConfig, String>,
    /// One budget for the daemon's lifetime.
    pub budget: Option<LeakBudget>,
    /// The eBPF programs kept attached (or why not).
    pub ebpf: Arc<super::ebpf::DaemonEbpf>,
}

/// Everything the handlers share.
#[derive(Debug)]
pub struct DaemonState {
    config: RwLock<Arc<Config>>,
    policy: RwLock<Arc<AccessPolicy>>,
    /// The spool.
    pub spool: Arc<Spool>,
    /// Shipping stats.
    pub shipper_stats: Arc<ShipperStats>,
    /// Wakes the shipper after a put.
    pub shipper_wake: Arc<Notify>,
    /// Pushes reloaded shipper settings.
    pub shipper_config: watch::Sender<ShipperConfig>,
    /// The supervisor.
    pub engine: CaptureEngine,
    /// Captures admitted and not yet finished.
    pub in_flight: AtomicUsize,
    /// Set at SIGTERM: new captures get 503.
    pub draining: AtomicBool,
    /// Counters.
    pub counters: Counters,
    /// Start time.
    pub started: Instant,
    /// The watch rules' engine.
    pub watch: super::watch::WatchEngine,
}

impl DaemonState {
    /// Assemble the state.
    pub fn new(
        config: Config,
        policy: AccessPolicy,
        spool: Arc<Spool>,
        shipper_stats: Arc<ShipperStats>,
        shipper_wake: Arc<Notify>,
        shipper_config: watch::Sender<ShipperConfig>,
        engine: CaptureEngine,
    ) -> DaemonState {
        DaemonState {
            config: RwLock::new(Arc::new(config)),
            policy: RwLock::new(Arc::new(policy)),
            spool,
            shipper_stats,
            shipper_wake,
            shipper_config,
            engine,
            in_flight: AtomicUsize::new(0),
            draining: AtomicBool::new(false),
            counters: Counters::default(),
            started: Instant::now(),
            watch: super::watch::WatchEngine::new(),
        }
    }

    /// The running configuration.
    pub fn config(&self) -> Arc<Config> {
        self.config
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The running access policy.
    pub fn policy(&self) -> Arc<AccessPolicy> {
        self.policy
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Replace configuration and policy together.
    pub fn replace(&self, config: Config, policy: AccessPolicy) {
        *self.config.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(config);
        *self.policy.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(policy);
    }

    /// Try to take a capture slot (no queueing).
    pub fn admit(self: &Arc<Self>) -> Option<CaptureSlot> {
        let max = self.config().max_concurrent_captures;
        let prev = self.in_flight.fetch_add(1, Ordering::SeqCst);
        if prev >= max {
            self.in_flight.fetch_sub(1, Ordering::SeqCst);
            return None;
        }
        Some(CaptureSlot {
            state: self.clone(),
        })
    }
}

/// A held capture slot; released on drop.
#[derive(Debug)]
pub struct CaptureSlot {
    state: Arc<DaemonState>,
}

impl Drop for CaptureSlot {
    fn drop(&mut self) {
        self.state.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}
