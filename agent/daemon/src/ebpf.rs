//! pstackd's eBPF session: the off-CPU (and, by default, TCP) programs are
//! loaded once at start and stay attached while the daemon runs.
//!
//! Invariants:
//! - **Off the readiness path.** The programs load on the blocking pool after
//!   start (BTF parsing costs ~70 ms of CPU); until then the state is
//!   `loading` and windowed captures load their own one-shot session.
//! - **Never fatal.** A load failure (no BTF → `unsupported`, no privilege →
//!   `permission_denied`, anything else → `error`) is logged once and shown
//!   in `/v1/status` and `/metrics`; the daemon serves on without it.
//! - **One window at a time on the session.** A windowed capture borrows the
//!   session (watch its pid, run the window, unwatch) while holding its lock;
//!   a second windowed capture that cannot get the lock within
//!   [`LOCK_WAIT`] loads its own one-shot session instead (counted as
//!   `windows_one_shot_total`), so captures never queue behind each other's
//!   windows.
//! - **Counters stay meaningful, and cheap.** The TCP programs run in
//!   count-only mode (`EbpfConfig::tcp_count_only`): the kernel counts
//!   events per kind and writes no record, so nothing queues and nothing is
//!   lost. A background task refreshes the cached status every
//!   [`DRAIN_EVERY`] (and, were records on, would drain the ring).
//!   `/v1/status` reads the counters live when the session is free, else the
//!   cached copy (`as_of_unix` says when it was read).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use pstack_ebpf::{EbpfConfig, EbpfSession, EbpfStatus, OFFCPU_SURFACE};
use pstack_envelope::Surface;
use pstack_exposition::{Exposition, Family};
use tokio::sync::{Mutex, watch};

use super::config::EbpfDaemonConfig;
use pstack_capture::process::OffCpuSource;

const WINDOWS: Family = Family::counter(
    "pstackd_ebpf_windows_total",
    "Capture windows by where they ran (the daemon's session, or a one-shot load when it was busy or not loaded).",
);

/// How long a windowed capture waits for the shared session before loading
/// its own.
pub const LOCK_WAIT: Duration = Duration::from_millis(250);

/// How often the status is refreshed (and a recording TCP ring drained).
pub const DRAIN_EVERY: Duration = Duration::from_secs(1);

/// The daemon's eBPF state.
pub struct DaemonEbpf {
    session: std::sync::OnceLock<Arc<Mutex<EbpfSession>>>,
    /// Last status read (or the failure / disabled status).
    last: std::sync::Mutex<(EbpfStatus, u64)>,
    handle: tokio::runtime::Handle,
    windows_shared: AtomicU64,
    windows_one_shot: AtomicU64,
}

impl std::fmt::Debug for DaemonEbpf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DaemonEbpf")
            .field("loaded", &self.session.get().is_some())
            .finish_non_exhaustive()
    }
}

fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn disabled() -> EbpfStatus {
    EbpfStatus {
        state: "disabled".into(),
        message: Some("ebpf.enabled = false in the configuration".into()),
        programs: Vec::new(),
        tcp_events: Default::default(),
        tcp_lost: Default::default(),
        offcpu: None,
        ring_bytes: 0,
    }
}

impl DaemonEbpf {
    /// Start loading the programs per `cfg` (on the blocking pool; needs a
    /// tokio runtime) and return at once. Never fails: a failure is logged and
    /// becomes the reported state.
    pub fn start(cfg: &EbpfDaemonConfig) -> Arc<DaemonEbpf> {
        let initial = if cfg.enabled {
            let mut st = disabled();
            st.state = "loading".into();
            st.message = None;
            st
        } else {
            tracing::info!("eBPF disabled by configuration (ebpf.enabled = false)");
            disabled()
        };
        let me = Arc::new(DaemonEbpf {
            session: std::sync::OnceLock::new(),
            last: std::sync::Mutex::new((initial, now_unix())),
            handle: tokio::runtime::Handle::current(),
            windows_shared: AtomicU64::new(0),
            windows_one_shot: AtomicU64::new(0),
        });
        if cfg.enabled {
            let mut ec = EbpfConfig::offcpu(Vec::new());
            ec.tcp = cfg.tcp;
            // Its only TCP output is the counters in /v1/status and /metrics:
            // count in the kernel, emit no records (see BENCHMARKS.md, eBPF).
            ec.tcp_count_only = cfg.tcp;
            ec.btf_path = cfg.btf_path.clone();
            let loader = me.clone();
            tokio::spawn(async move {
                let started = tokio::task::spawn_blocking(move || {
                    let session = EbpfSession::start(ec);
                    release_freed_heap();
                    session
                })
                .await;
                loader.loaded_with(started);
            });
        }
        me
    }

    fn loaded_with(
        &self,
        started: Result<Result<EbpfSession, pstack_ebpf::EbpfError>, tokio::task::JoinError>,
    ) {
        match started {
            Ok(Ok(s)) => match s.status() {
                Ok(st) => {
                    tracing::info!(
                        programs = st.programs.len(),
                        "eBPF programs attached; kept while pstackd runs"
                    );
                    self.remember(st);
                    let _ = self.session.set(Arc::new(Mutex::new(s)));
                }
                Err(e) => {
                    tracing::warn!(error = %e, "eBPF counters unreadable; programs unloaded");
                    self.remember(EbpfStatus::failed(&e));
                }
            },
            Ok(Err(e)) => {
                tracing::warn!(state = e.status().as_str(), error = %e, "eBPF programs not loaded; captures with a window will report the same typed status");
                self.remember(EbpfStatus::failed(&e));
            }
            Err(e) => {
                tracing::warn!(error = %e, "eBPF load task failed");
                let mut st = disabled();
                st.state = "error".into();
                st.message = Some(format!("load task failed: {e}"));
                self.remember(st);
            }
        }
    }

    /// Whether the programs are loaded.
    pub fn loaded(&self) -> bool {
        self.session.get().is_some()
    }

    fn remember(&self, st: EbpfStatus) {
        *self.last.lock().unwrap_or_else(|p| p.into_inner()) = (st, now_unix());
    }

    /// The current status: live when the session is free, else the last read.
    pub fn status(&self) -> (EbpfStatus, u64) {
        if let Some(s) = self.session.get()
            && let Ok(g) = s.try_lock()
        {
            match g.status() {
                Ok(st) => self.remember(st),
                Err(e) => tracing::warn!(error = %e, "eBPF counters unreadable"),
            }
        }
        self.last.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The `ebpf` member of `/v1/status`.
    pub fn status_doc(&self) -> pstackd_api::status::EbpfStatus {
        let (st, as_of_unix) = self.status();
        let kinds = |m: &std::collections::BTreeMap<&'static str, u64>| {
            m.iter().map(|(k, v)| ((*k).to_string(), *v)).collect()
        };
        pstackd_api::status::EbpfStatus {
            tcp_events: kinds(&st.tcp_events),
            tcp_lost: kinds(&st.tcp_lost),
            state: st.state,
            message: st.message,
            programs: st
                .programs
                .iter()
                .map(|p| pstackd_api::status::EbpfProgram {
                    program: p.program.to_string(),
                    tracepoint: p.tracepoint.to_string(),
                    attached: p.attached,
                })
                .collect(),
            offcpu: st.offcpu.map(|o| pstackd_api::status::OffCpuStatus {
                switches: o.switches,
                episodes: o.episodes,
                lost_ring: o.lost_ring,
                lost_start: o.lost_start,
                lost_totals: o.lost_totals,
                watched: o.watched as u64,
            }),
            ring_bytes: st.ring_bytes,
            as_of_unix,
            windows_on_session_total: self.windows_shared.load(Ordering::Relaxed),
            windows_one_shot_total: self.windows_one_shot.load(Ordering::Relaxed),
        }
    }

    /// Add the eBPF part of `/metrics`.
    pub fn write_metrics(&self, e: &mut Exposition) {
        self.status().0.write_metrics(e);
        e.sample(
            WINDOWS,
            &[("session", "shared")],
            self.windows_shared.load(Ordering::Relaxed),
        );
        e.sample(
            WINDOWS,
            &[("session", "one_shot")],
            self.windows_one_shot.load(Ordering::Relaxed),
        );
    }

    /// Drain the TCP ring and refresh the status every [`DRAIN_EVERY`] until
    /// `stop` turns true (idle while the programs are not loaded).
    pub fn spawn_drain(self: &Arc<Self>, mut stop: watch::Receiver<bool>) {
        let me = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(DRAIN_EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = tick.tick() => {}
                    _ = stop.changed() => return,
                }
                let Some(session) = me.session.get() else {
                    continue;
                };
                let mut g = session.lock().await;
                if g.config().tcp && !g.config().tcp_count_only {
                    // A 1 ms window: its first step discards what queued since the last.
                    if let Err(e) = g.run_window(Duration::from_millis(1), |_| {}).await {
                        tracing::debug!(error = %e, "eBPF drain window failed");
                    }
                }
                if let Ok(st) = g.status() {
                    me.remember(st);
                }
            }
        });
    }
}

impl OffCpuSource for DaemonEbpf {
    /// Runs on a capture thread (never inside the runtime): borrow the
    /// session if it is free within [`LOCK_WAIT`], else load a one-shot one.
    fn observe(&self, pid: u32, window: Duration) -> Vec<Surface> {
        let one_shot = || {
            self.windows_one_shot.fetch_add(1, Ordering::Relaxed);
            pstack_ebpf::capture_blocking(EbpfConfig::offcpu(vec![pid]), window)
        };
        let Some(session) = self.session.get().cloned() else {
            return one_shot();
        };
        let guard = self.handle.block_on(async {
            tokio::time::timeout(LOCK_WAIT, session.lock_owned())
                .await
                .ok()
        });
        let Some(mut g) = guard else {
            return one_shot();
        };
        self.windows_shared.fetch_add(1, Ordering::Relaxed);
        let t0 = pstack_ebpf::monotonic_ns();
        let result = self.handle.block_on(async {
            g.watch(pid)?;
            let r = g.run_window(window, |_| {}).await;
            if let Err(e) = g.unwatch(pid) {
                tracing::warn!(pid, error = %e, "eBPF unwatch failed");
            }
            r
        });
        if let Ok(st) = g.status() {
            self.remember(st);
        }
        drop(g);
        match result {
            Ok(report) => report
                .surfaces()
                .into_iter()
                .filter(|s| s.id == OFFCPU_SURFACE)
                .collect(),
            Err(e) => pstack_ebpf::surface::failed_surfaces(
                &e,
                &[OFFCPU_SURFACE],
                u64::try_from(window.as_millis()).unwrap_or(u64::MAX),
                pstack_ebpf::monotonic_ns().saturating_sub(t0) / 1000,
            ),
        }
    }
}

/// Loading parses the kernel's BTF (several MiB, tens of MiB of short-lived
/// allocations) on a blocking-pool thread; glibc keeps that thread's freed
/// arena mapped, which would triple the idle daemon's RSS. Hand it back.
pub(crate) fn release_freed_heap() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only releases free heap pages; no pointer is touched.
    unsafe {
        libc::malloc_trim(0);
    }
}
