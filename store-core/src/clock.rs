//! The server's clock: wall time ([`crate::now_ns`]) plus an offset that
//! only tests move, so time windows (grant claim, execution, watchdog
//! checkpoints, leases) are tested without sleeping. Production never
//! advances or pins it; a test pins it to judge a threshold to the
//! nanosecond (freshness at, just below and just above its limit).

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

/// A cheaply cloned handle; clones share the offset.
#[derive(Debug, Clone, Default)]
pub struct Clock {
    offset_ns: Arc<AtomicI64>,
    /// When set (non-zero), the instant this clock reads, whatever the time.
    pinned_ns: Arc<AtomicI64>,
}

impl Clock {
    /// The system clock.
    pub fn system() -> Clock {
        Clock::default()
    }

    /// Now, ns since the Unix epoch.
    pub fn now_ns(&self) -> i64 {
        match self.pinned_ns.load(Ordering::SeqCst) {
            0 => crate::now_ns().saturating_add(self.offset_ns.load(Ordering::SeqCst)),
            pinned => pinned,
        }
    }

    /// Stop this clock (and every clone) at `at_ns` until [`Clock::unpin`].
    pub fn pin(&self, at_ns: i64) {
        self.pinned_ns.store(at_ns, Ordering::SeqCst);
    }

    /// Let this clock run again (with its offset).
    pub fn unpin(&self) {
        self.pinned_ns.store(0, Ordering::SeqCst);
    }

    /// Move this clock (and every clone) forward by `d`.
    pub fn advance(&self, d: Duration) {
        let ns = i64::try_from(d.as_nanos()).unwrap_or(i64::MAX);
        self.offset_ns.fetch_add(ns, Ordering::SeqCst);
    }
}
