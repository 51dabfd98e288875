//! Connections: the accept loop and the limits that keep slow or greedy
//! clients from taking the store down (issue 10).
//!
//! Invariants:
//! - **Connection cap.** At most [`ConnLimits::max_connections`] connections
//!   are served at once; one more is accepted and closed at once (counted in
//!   `pstack_store_connections_refused_total`), so the listen backlog never
//!   fills with clients nobody will serve. The soft `RLIMIT_NOFILE` is raised
//!   to its hard limit at start and the cap kept below it, so `accept` does
//!   not fail with EMFILE first.
//! - **Header and idle timeout.** A connection must deliver a complete
//!   request head within [`ConnLimits::header_timeout`] of starting to wait
//!   for one — that is also the idle timeout of a keep-alive connection
//!   (hyper starts the same timer when it waits for the next request). A
//!   slow-loris client is closed after it, whatever it sends.
//! - **Request timeout.** A request (body included) that has not been
//!   answered within [`ConnLimits::request_timeout`] is answered 408 (see
//!   `http::observe`); a slow body cannot hold memory or a slot longer.
//! - Per-key concurrency and the in-flight byte budget are enforced in
//!   `http` ([`Guards`]), where the key and the body size are known.
//! - **Freed heap goes back to the OS once ingest is quiet.** When the last
//!   request holding the budget ends and none is admitted for
//!   [`TRIM_QUIET`], `malloc_trim` runs once. Not after every request: a
//!   trim returns pages with `madvise`, which interrupts every core to flush
//!   its TLB, and the next request faults them back in; under a steady load
//!   that cost ~35 of ~190 µs of CPU per envelope (BENCHMARKS.md, issue 31
//!   item 5).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Limits of the serving loop.
#[derive(Debug, Clone, Copy)]
pub struct ConnLimits {
    /// Most connections served at once (default 4096; capped below the fd
    /// limit).
    pub max_connections: usize,
    /// Time to deliver a request head, and idle time of a keep-alive
    /// connection (default 10 s).
    pub header_timeout: Duration,
    /// Time to answer a whole request, body included (default 60 s).
    pub request_timeout: Duration,
    /// Most concurrent ingest requests per API key (default 16).
    pub per_key_concurrency: usize,
    /// Bytes that ingest requests in flight may hold together, wire body plus
    /// decoded body, reserved before reading (default 256 MiB).
    pub inflight_budget_bytes: u64,
}

impl Default for ConnLimits {
    fn default() -> Self {
        ConnLimits {
            max_connections: 4096,
            header_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(60),
            per_key_concurrency: 16,
            inflight_budget_bytes: 256 << 20,
        }
    }
}

/// Budget unit: permits are KiB.
const UNIT: u64 = 1024;

/// Per-key concurrency and the global in-flight byte budget.
#[derive(Debug)]
pub struct Guards {
    limits: ConnLimits,
    budget: Arc<Semaphore>,
    trimmer: Arc<Trimmer>,
    per_key: Mutex<HashMap<String, Arc<Semaphore>>>,
    /// Connections closed at accept over the cap.
    pub connections_refused: AtomicU64,
    /// Connections open now.
    pub connections_open: AtomicU64,
    /// Requests answered 503 for the byte budget.
    pub budget_refused: AtomicU64,
    /// Requests answered 429 for the per-key limit.
    pub key_limited: AtomicU64,
}

/// How long ingest must be quiet (no request admitted, the budget all
/// free) before freed heap is given back to the OS.
pub const TRIM_QUIET: Duration = Duration::from_millis(200);

/// Gives freed heap back to the OS after a burst, once (see the module's
/// invariants).
#[derive(Debug, Default)]
struct Trimmer {
    /// Requests admitted so far: unchanged over a wait means none came.
    admitted: AtomicU64,
    /// A wait for quiet is running.
    waiting: AtomicBool,
    /// Trims done.
    trims: AtomicU64,
}

impl Trimmer {
    /// The budget just became all free: trim once ingest stays quiet.
    fn quiet_now(self: &Arc<Self>, budget: &Arc<Semaphore>, total: u32) {
        if self.waiting.swap(true, Ordering::AcqRel) {
            return; // the running wait covers this one
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            trim();
            self.trims.fetch_add(1, Ordering::Relaxed);
            self.waiting.store(false, Ordering::Release);
            return;
        };
        let (me, budget) = (self.clone(), budget.clone());
        runtime.spawn(async move {
            loop {
                let seen = me.admitted.load(Ordering::Acquire);
                tokio::time::sleep(TRIM_QUIET).await;
                let idle = budget.available_permits() >= total as usize;
                if idle && me.admitted.load(Ordering::Acquire) == seen {
                    break;
                }
            }
            // Off the runtime's workers: a trim walks the whole heap.
            let _ = tokio::task::spawn_blocking(trim).await;
            me.trims.fetch_add(1, Ordering::Relaxed);
            me.waiting.store(false, Ordering::Release);
        });
    }
}

fn trim() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only walks glibc's own arenas.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// What a request holds while it runs: dropping it returns the budget.
#[derive(Debug)]
pub struct Held {
    _key: OwnedSemaphorePermit,
    _bytes: Option<OwnedSemaphorePermit>,
    budget: Arc<Semaphore>,
    total: u32,
    trimmer: Arc<Trimmer>,
}

impl Drop for Held {
    fn drop(&mut self) {
        // Last big request done: give freed heap back to the OS once ingest
        // is quiet, so RSS comes down after a burst instead of staying at
        // its peak.
        if self._bytes.is_some()
            && self.budget.available_permits() + self.held() >= self.total as usize
        {
            self.trimmer.quiet_now(&self.budget, self.total);
        }
    }
}

impl Held {
    fn held(&self) -> usize {
        self._bytes.as_ref().map_or(0, |p| p.num_permits())
    }

    /// Whether this request could ever hold `bytes` more: what it holds
    /// plus them within the whole budget.
    pub fn could_hold(&self, bytes: usize) -> bool {
        (self.held() as u64).saturating_add((bytes as u64).div_ceil(UNIT)) <= u64::from(self.total)
    }

    /// The whole in-flight budget, bytes.
    pub fn budget_bytes(&self) -> u64 {
        u64::from(self.total) * UNIT
    }

    /// Reserve `bytes` more of the budget for this request; `false` when the
    /// budget does not have them free now.
    pub fn grow(&mut self, bytes: usize) -> bool {
        let want = (bytes as u64)
            .div_ceil(UNIT)
            .clamp(1, u64::from(self.total)) as u32;
        match self.budget.clone().try_acquire_many_owned(want) {
            Ok(more) => {
                match &mut self._bytes {
                    Some(p) => p.merge(more),
                    None => self._bytes = Some(more),
                }
                true
            }
            Err(_) => false,
        }
    }
}

/// Why a request may not run now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The key already has its limit of requests in flight (429).
    KeyBusy {
        /// The limit.
        limit: usize,
    },
    /// The in-flight byte budget cannot hold this request now (503).
    Budget {
        /// Bytes asked for.
        wanted: u64,
        /// The budget.
        budget: u64,
    },
}

impl Guards {
    /// Guards for `limits`.
    pub fn new(limits: ConnLimits) -> Guards {
        let total = (limits.inflight_budget_bytes / UNIT).clamp(1, u32::MAX as u64 >> 3) as usize;
        Guards {
            limits,
            budget: Arc::new(Semaphore::new(total)),
            trimmer: Arc::default(),
            per_key: Mutex::new(HashMap::new()),
            connections_refused: AtomicU64::new(0),
            connections_open: AtomicU64::new(0),
            budget_refused: AtomicU64::new(0),
            key_limited: AtomicU64::new(0),
        }
    }

    /// The limits in force.
    pub fn limits(&self) -> ConnLimits {
        self.limits
    }

    /// Times freed heap was given back to the OS after ingest went quiet.
    pub fn heap_trims(&self) -> u64 {
        self.trimmer.trims.load(Ordering::Relaxed)
    }

    /// Admit one request of `key_id` that may hold up to `bytes` bytes.
    pub fn admit(&self, key_id: &str, bytes: u64) -> Result<Held, Refusal> {
        let sem = {
            let mut map = self.per_key.lock().unwrap_or_else(|p| p.into_inner());
            map.entry(key_id.to_string())
                .or_insert_with(|| Arc::new(Semaphore::new(self.limits.per_key_concurrency)))
                .clone()
        };
        let key = sem.try_acquire_owned().map_err(|_| {
            self.key_limited.fetch_add(1, Ordering::Relaxed);
            Refusal::KeyBusy {
                limit: self.limits.per_key_concurrency,
            }
        })?;
        let total =
            (self.limits.inflight_budget_bytes / UNIT).clamp(1, u32::MAX as u64 >> 3) as u32;
        let want = bytes.div_ceil(UNIT).clamp(1, u64::from(total)) as u32;
        let bytes_permit = self
            .budget
            .clone()
            .try_acquire_many_owned(want)
            .map_err(|_| {
                self.budget_refused.fetch_add(1, Ordering::Relaxed);
                Refusal::Budget {
                    wanted: bytes,
                    budget: self.limits.inflight_budget_bytes,
                }
            })?;
        self.trimmer.admitted.fetch_add(1, Ordering::AcqRel);
        Ok(Held {
            _key: key,
            _bytes: Some(bytes_permit),
            budget: self.budget.clone(),
            total,
            trimmer: self.trimmer.clone(),
        })
    }
}

/// Raise the soft fd limit to the hard one; the cap on connections that
/// leaves room for the database and logs.
pub fn connection_cap(wanted: usize) -> usize {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit write/read one live rlimit.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 {
            lim.rlim_cur = lim.rlim_max;
            let _ = libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
            libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim);
        }
    }
    let fds = usize::try_from(lim.rlim_cur).unwrap_or(usize::MAX);
    wanted.min(fds.saturating_sub(64).max(16))
}

/// Accept and serve `router` until `shutdown`, under `limits`.
pub async fn serve_router(
    listener: tokio::net::TcpListener,
    router: axum::Router,
    guards: Arc<Guards>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let limits = guards.limits();
    let cap = connection_cap(limits.max_connections);
    let slots = Arc::new(Semaphore::new(cap));
    let graceful = GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            let n = guards.connections_refused.fetch_add(1, Ordering::Relaxed);
            if n.is_power_of_two() {
                tracing::warn!(
                    cap,
                    refused_total = n + 1,
                    "connection cap reached; closing new connections"
                );
            }
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        // The peer address, for handlers that key limits by source (login).
        let with_peer = tower::ServiceExt::map_request(
            router.clone(),
            move |mut req: axum::http::Request<hyper::body::Incoming>| {
                req.extensions_mut()
                    .insert(axum::extract::ConnectInfo(peer));
                req
            },
        );
        let conn = hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(limits.header_timeout)
            .max_buf_size(64 << 10)
            .serve_connection(TokioIo::new(stream), TowerToHyperService::new(with_peer));
        let conn = graceful.watch(conn);
        let g = guards.clone();
        g.connections_open.fetch_add(1, Ordering::Relaxed);
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "connection ended with an error");
            }
            g.connections_open.fetch_sub(1, Ordering::Relaxed);
            drop(slot);
        });
    }
    drop(listener);
    let _ = tokio::time::timeout(Duration::from_secs(30), graceful.shutdown()).await;
    Ok(())
}
