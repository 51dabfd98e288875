//! The shipper: spooled envelopes → the collector (`POST {url}/v1/envelopes`).
//!
//! Invariants:
//! - **Delete only after acknowledgement, per item.** A batch is a JSON array
//!   of the exact spooled bytes (gzip, `Authorization: Bearer`). A spooled file
//!   is deleted only when the collector's per-item result at its index names
//!   its digest with status `accepted` or `duplicate`. A `rejected` item is a
//!   permanent refusal: it is quarantined (counted, journaled), never deleted
//!   silently, never retried forever. Anything else — no result, a different
//!   digest, an unknown status, an unreadable response — keeps the file.
//! - **Never ship a torn envelope.** Every file is verified (digest recomputed
//!   and matched to its name) when the batch is read; a file that fails is
//!   quarantined by the spool and left out of the batch.
//! - **Delivery is at-least-once**: a crash between the collector's ack and
//!   the delete re-sends the item, and the collector dedupes by digest.
//! - **Bounded.** One batch in flight; at most `batch_max_items` files and
//!   `batch_max_bytes` bytes read at once, one file open at a time.
//! - **Retry.** Transport failures, timeouts, 5xx, 408, 401/403 and unreadable
//!   responses back off exponentially with jitter (`backoff_initial_ms` doubling
//!   up to `backoff_max_ms`, each delay drawn from [d/2, d]); 429 and 503
//!   honour `Retry-After` (seconds or HTTP date) exactly, up to
//!   [`MAX_RETRY_AFTER`] (a broken collector cannot park the shipper for days);
//!   without one they back off like a 5xx.
//!   Time comes from `tokio::time`, so tests drive it with a paused clock.

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use serde::Deserialize;
use tokio::sync::{Notify, watch};

use super::config::ShipperConfig;
use super::spool::{QuarantineReason, Spool};

/// Longest `Retry-After` honoured.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(15 * 60);

/// Why a batch was not (fully) delivered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FailureClass {
    /// Could not connect.
    Connect,
    /// The request or response timed out.
    Timeout,
    /// The connection broke mid-request or mid-response.
    Transport,
    /// 429 or 503: the collector asked us to slow down.
    Throttled {
        /// HTTP status.
        status: u16,
        /// Its Retry-After, if it sent one we could read.
        retry_after: Option<Duration>,
    },
    /// Other 5xx (and 408).
    Server {
        /// HTTP status.
        status: u16,
    },
    /// 4xx other than 408/429 (auth, size): retried slowly; an operator must act.
    Client {
        /// HTTP status.
        status: u16,
    },
    /// 2xx whose body is not a per-item result list.
    BadResponse,
}

impl FailureClass {
    /// Stable label for metrics and logs.
    pub fn label(&self) -> &'static str {
        match self {
            FailureClass::Connect => "connect",
            FailureClass::Timeout => "timeout",
            FailureClass::Transport => "transport",
            FailureClass::Throttled { .. } => "throttled",
            FailureClass::Server { .. } => "server_error",
            FailureClass::Client { .. } => "client_error",
            FailureClass::BadResponse => "bad_response",
        }
    }
}

/// What one batch attempt achieved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BatchOutcome {
    /// The collector answered per item.
    Answered {
        /// Acked as newly stored (deleted).
        accepted: usize,
        /// Acked as already stored (deleted).
        duplicate: usize,
        /// Refused permanently (quarantined).
        rejected: usize,
        /// No usable result (kept for retry).
        unacknowledged: usize,
    },
    /// Nothing acknowledged.
    Failed(FailureClass),
    /// Nothing to send.
    Empty,
}

/// Exponential backoff with jitter.
#[derive(Debug, Clone)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    attempt: u32,
    rng: fastrand::Rng,
}

impl Backoff {
    /// A fresh schedule.
    pub fn new(initial: Duration, max: Duration, seed: u64) -> Backoff {
        Backoff {
            initial,
            max,
            attempt: 0,
            rng: fastrand::Rng::with_seed(seed),
        }
    }

    /// The next delay: `min(max, initial·2^n)` scaled by a factor in [0.5, 1].
    pub fn next_delay(&mut self) -> Duration {
        let exp = self.initial.saturating_mul(1u32 << self.attempt.min(20));
        let ceiling = exp.min(self.max);
        self.attempt = self.attempt.saturating_add(1);
        let half = ceiling / 2;
        let jitter_ns = self.rng.u64(0..=half.as_nanos() as u64);
        half + Duration::from_nanos(jitter_ns)
    }

    /// After a success.
    pub fn reset(&mut self) {
        self.attempt = 0;
    }

    /// Retries since the last success.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }
}

/// Parse `Retry-After`: delta-seconds or an HTTP date (relative to `now`).
pub fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let v = value.trim();
    if let Ok(secs) = v.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let when = httpdate(v)?;
    Some(when.duration_since(now).unwrap_or(Duration::ZERO))
}

/// IMF-fixdate only (`Sun, 06 Nov 1994 08:49:37 GMT`), as RFC 9110 requires senders to use.
fn httpdate(v: &str) -> Option<SystemTime> {
    let parts: Vec<&str> = v.split_whitespace().collect();
    if parts.len() != 6 || parts[5] != "GMT" {
        return None;
    }
    let day: u64 = parts[1].parse().ok()?;
    let month = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ]
    .iter()
    .position(|m| *m == parts[2])? as u64
        + 1;
    let year: u64 = parts[3].parse().ok()?;
    let hms: Vec<u64> = parts[4]
        .split(':')
        .map(|x| x.parse().ok())
        .collect::<Option<_>>()?;
    if hms.len() != 3 || !(1..=31).contains(&day) || year < 1970 {
        return None;
    }
    // Days from civil (Howard Hinnant's algorithm).
    let (y, m) = if month <= 2 {
        (year - 1, month + 9)
    } else {
        (year, month - 3)
    };
    let era = y / 400;
    let yoe = y - era * 400;
    let doy = (153 * m + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = days * 86_400 + hms[0] * 3600 + hms[1] * 60 + hms[2];
    Some(SystemTime::UNIX_EPOCH + Duration::from_secs(secs))
}

/// The collector's per-item result (the store's `ItemResult`, read leniently
/// except for what decides deletion).
#[derive(Debug, Clone, Deserialize)]
pub struct ItemResult {
    /// Position in the batch.
    pub index: usize,
    /// Digest the collector attributes to that item.
    #[serde(default)]
    pub digest: Option<String>,
    /// `accepted`, `duplicate` or `rejected`.
    pub status: String,
}

#[derive(Debug, Deserialize)]
struct IngestResponse {
    results: Vec<ItemResult>,
}

/// Classify a response that is not a 2xx.
pub fn classify_status(status: u16, retry_after: Option<&str>, now: SystemTime) -> FailureClass {
    match status {
        429 | 503 => FailureClass::Throttled {
            status,
            retry_after: retry_after.and_then(|v| parse_retry_after(v, now)),
        },
        408 | 500..=599 => FailureClass::Server { status },
        _ => FailureClass::Client { status },
    }
}

/// Shipping state for `/v1/status` and `/metrics`.
#[derive(Debug, Default)]
pub struct ShipperStats {
    /// Batches attempted.
    pub batches: AtomicU64,
    /// Items acknowledged accepted.
    pub accepted: AtomicU64,
    /// Items acknowledged duplicate.
    pub duplicate: AtomicU64,
    /// Items rejected (quarantined).
    pub rejected: AtomicU64,
    /// Failed attempts, by class label.
    pub failures: Mutex<std::collections::BTreeMap<&'static str, u64>>,
    /// Last failure, for people (never contains the key or payloads).
    pub last_error: Mutex<Option<String>>,
    /// When `last_error` was set (unix seconds; 0 when there is none).
    pub last_error_unix: AtomicU64,
    /// Unix seconds of the last batch that acknowledged something.
    pub last_success_unix: AtomicU64,
    /// Delay chosen before the next attempt, ms (0 when not backing off).
    pub next_delay_ms: AtomicU64,
}

impl ShipperStats {
    fn fail(&self, class: &FailureClass, message: String) {
        *self
            .failures
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(class.label())
            .or_insert(0) += 1;
        *self.last_error.lock().unwrap_or_else(|p| p.into_inner()) = Some(message);
        self.last_error_unix.store(unix_now(), Ordering::Relaxed);
    }

    /// A batch was answered: the last error no longer describes the present.
    fn succeeded(&self) {
        *self.last_error.lock().unwrap_or_else(|p| p.into_inner()) = None;
        self.last_error_unix.store(0, Ordering::Relaxed);
        self.last_success_unix.store(unix_now(), Ordering::Relaxed);
    }
}

/// The shipper.
#[derive(Debug)]
pub struct Shipper {
    spool: Arc<Spool>,
    config: watch::Receiver<ShipperConfig>,
    /// Woken when an envelope is spooled.
    pub wake: Arc<Notify>,
    /// Counters.
    pub stats: Arc<ShipperStats>,
}

/// Why the HTTP client could not be built.
#[derive(Debug, thiserror::Error)]
pub enum ShipperError {
    /// CA file unreadable or invalid.
    #[error("shipper.ca_file {path}: {reason}")]
    CaFile {
        /// Path.
        path: String,
        /// Reason.
        reason: String,
    },
    /// reqwest refused the configuration.
    #[error("cannot build the HTTP client: {0}")]
    Client(String),
}

/// Build the HTTP client for a configuration (rustls, no proxies from env).
pub fn build_client(config: &ShipperConfig) -> Result<reqwest::Client, ShipperError> {
    let mut b = reqwest::Client::builder()
        .use_rustls_tls()
        .no_proxy()
        .timeout(Duration::from_millis(config.timeout_ms))
        .connect_timeout(Duration::from_millis(config.timeout_ms.min(5_000)))
        .pool_max_idle_per_host(1)
        .user_agent(concat!("pstackd/", env!("CARGO_PKG_VERSION")));
    if !config.ca_file.as_os_str().is_empty() {
        let path = config.ca_file.display().to_string();
        let pem = std::fs::read(&config.ca_file).map_err(|e| ShipperError::CaFile {
            path: path.clone(),
            reason: e.to_string(),
        })?;
        let certs =
            reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| ShipperError::CaFile {
                path: path.clone(),
                reason: e.to_string(),
            })?;
        for c in certs {
            b = b.add_root_certificate(c);
        }
    }
    b.build().map_err(|e| ShipperError::Client(e.to_string()))
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut enc = flate2::write::GzEncoder::new(
        Vec::with_capacity(bytes.len() / 4 + 64),
        flate2::Compression::fast(),
    );
    // Writing into a Vec cannot fail.
    let _ = enc.write_all(bytes);
    enc.finish().unwrap_or_default()
}

fn transport_class(e: &reqwest::Error) -> FailureClass {
    if e.is_timeout() {
        FailureClass::Timeout
    } else if e.is_connect() {
        FailureClass::Connect
    } else {
        FailureClass::Transport
    }
}

/// Describe a reqwest error without its URL (which is config, not a secret,
/// but keeps the log short) and with its source chain.
fn describe(e: &reqwest::Error) -> String {
    let mut s = e.without_url_ref().to_string();
    let mut src = std::error::Error::source(e);
    while let Some(inner) = src {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        src = inner.source();
    }
    s
}

trait WithoutUrl {
    fn without_url_ref(&self) -> String;
}

impl WithoutUrl for reqwest::Error {
    fn without_url_ref(&self) -> String {
        let mut s = self.to_string();
        if let Some(url) = self.url() {
            s = s.replace(&format!(" ({url})"), "");
        }
        s
    }
}

impl Shipper {
    /// A shipper over `spool` following `config` (reloadable).
    pub fn new(spool: Arc<Spool>, config: watch::Receiver<ShipperConfig>) -> Shipper {
        Shipper {
            spool,
            config,
            wake: Arc::new(Notify::new()),
            stats: Arc::new(ShipperStats::default()),
        }
    }

    /// Build the client; a failure is logged and shown in `/v1/status` (never
    /// a silent stall: envelopes stay spooled until the config is fixed).
    fn client_for(&self, config: &ShipperConfig) -> Option<reqwest::Client> {
        match build_client(config) {
            Ok(c) => Some(c),
            Err(e) => {
                tracing::error!(error = %e, "shipping is stopped until the configuration is fixed");
                *self
                    .stats
                    .last_error
                    .lock()
                    .unwrap_or_else(|p| p.into_inner()) = Some(format!("shipping stopped: {e}"));
                None
            }
        }
    }

    /// Send one batch of the oldest spooled envelopes and apply the answer.
    pub async fn ship_once(
        &self,
        client: &reqwest::Client,
        config: &ShipperConfig,
    ) -> BatchOutcome {
        let entries = self
            .spool
            .oldest(config.batch_max_items, config.batch_max_bytes);
        if entries.is_empty() {
            return BatchOutcome::Empty;
        }
        let spool = self.spool.clone();
        let digests: Vec<String> = entries.iter().map(|e| e.digest()).collect();
        let read = tokio::task::spawn_blocking(move || {
            let mut items = Vec::with_capacity(digests.len());
            for d in digests {
                // A file that fails verification or cannot be read is
                // quarantined by the spool (and leaves its index).
                if let Ok(Some(bytes)) = spool.read_verified(&d) {
                    items.push((d, bytes));
                }
            }
            items
        })
        .await;
        let Ok(items) = read else {
            return BatchOutcome::Failed(FailureClass::BadResponse);
        };
        if items.is_empty() {
            return BatchOutcome::Answered {
                accepted: 0,
                duplicate: 0,
                rejected: 0,
                unacknowledged: 0,
            };
        }
        // 413: halve the batch until the collector takes it; an item it
        // refuses alone is quarantined. Ranges are sent oldest first.
        let mut pending = vec![(0, items.len())];
        let (mut accepted, mut duplicate, mut rejected, mut unacknowledged) = (0, 0, 0, 0);
        while let Some((from, to)) = pending.pop() {
            match self.post(client, config, &items[from..to]).await {
                Err(FailureClass::Client { status: 413 }) if to - from > 1 => {
                    let mid = from + (to - from) / 2;
                    tracing::info!(
                        items = to - from,
                        "collector refused the batch as too large (413); splitting it"
                    );
                    pending.push((mid, to));
                    pending.push((from, mid));
                }
                Err(FailureClass::Client { status: 413 }) => {
                    let digest = &items[from].0;
                    tracing::warn!(digest = %digest, bytes = items[from].1.len(), "collector refused this envelope alone as too large (413); quarantined");
                    let _ = self
                        .spool
                        .quarantine(digest, QuarantineReason::TooLargeForCollector);
                    rejected += 1;
                }
                Err(class) => {
                    if accepted + duplicate + rejected > 0 {
                        // Part of the batch went through: report that, and
                        // let the rest be retried after a backoff.
                        return BatchOutcome::Answered {
                            accepted,
                            duplicate,
                            rejected,
                            unacknowledged: unacknowledged
                                + pending.iter().map(|(a, b)| b - a).sum::<usize>()
                                + (to - from),
                        };
                    }
                    return BatchOutcome::Failed(class);
                }
                Ok(BatchOutcome::Answered {
                    accepted: a,
                    duplicate: d,
                    rejected: r,
                    unacknowledged: u,
                }) => {
                    accepted += a;
                    duplicate += d;
                    rejected += r;
                    unacknowledged += u;
                }
                Ok(other) => return other,
            }
        }
        BatchOutcome::Answered {
            accepted,
            duplicate,
            rejected,
            unacknowledged,
        }
    }

    /// POST one batch of verified items; the per-item outcome, or the class
    /// of failure (recorded in the stats).
    async fn post(
        &self,
        client: &reqwest::Client,
        config: &ShipperConfig,
        items: &[(String, Vec<u8>)],
    ) -> Result<BatchOutcome, FailureClass> {
        let mut json =
            Vec::with_capacity(2 + items.iter().map(|(_, b)| b.len() + 1).sum::<usize>());
        json.push(b'[');
        for (i, (_, bytes)) in items.iter().enumerate() {
            if i > 0 {
                json.push(b',');
            }
            json.extend_from_slice(bytes);
        }
        json.push(b']');
        let body = tokio::task::spawn_blocking(move || gzip(&json))
            .await
            .map_err(|_| FailureClass::BadResponse)?;
        let batch: Vec<String> = items.iter().map(|(d, _)| d.clone()).collect();
        self.stats.batches.fetch_add(1, Ordering::Relaxed);
        let url = format!("{}/v1/envelopes", config.url.trim_end_matches('/'));
        let mut req = client
            .post(url)
            .header("content-type", "application/json")
            .header("content-encoding", "gzip")
            .body(body);
        if let Some(key) = &config.api_key {
            req = req.bearer_auth(key);
        }
        let resp = match req.send().await {
            Ok(r) => r,
            Err(e) => {
                let class = transport_class(&e);
                self.stats.fail(&class, describe(&e));
                return Err(class);
            }
        };
        let status = resp.status().as_u16();
        if !(200..300).contains(&status) {
            let retry_after = resp
                .headers()
                .get("retry-after")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            let class = classify_status(status, retry_after.as_deref(), SystemTime::now());
            self.stats
                .fail(&class, format!("collector answered HTTP {status}"));
            return Err(class);
        }
        let bytes = match resp.bytes().await {
            Ok(b) => b,
            Err(e) => {
                let class = transport_class(&e);
                self.stats.fail(&class, describe(&e));
                return Err(class);
            }
        };
        let Ok(parsed) = serde_json::from_slice::<IngestResponse>(&bytes) else {
            let class = FailureClass::BadResponse;
            self.stats.fail(
                &class,
                format!("collector answered HTTP {status} without a per-item result list"),
            );
            return Err(class);
        };
        Ok(self.apply(&batch, parsed.results).await)
    }

    async fn apply(&self, batch: &[String], results: Vec<ItemResult>) -> BatchOutcome {
        let spool = self.spool.clone();
        let batch = batch.to_vec();
        let stats = self.stats.clone();
        let outcome = tokio::task::spawn_blocking(move || {
            // `answered`: the collector gave a result for that item (counted once);
            // `done`: the spool then settled it (deleted or quarantined).
            let mut answered = vec![false; batch.len()];
            let mut done = vec![false; batch.len()];
            let (mut accepted, mut duplicate, mut rejected) = (0, 0, 0);
            for r in results {
                let Some(expected) = batch.get(r.index) else {
                    continue;
                };
                if answered[r.index] || r.digest.as_deref() != Some(expected.as_str()) {
                    continue;
                }
                // Count the collector's answer before touching the spool, so a
                // status reader never sees a drained spool with the answer
                // still uncounted.
                let (counter, tally) = match r.status.as_str() {
                    "accepted" => (&stats.accepted, &mut accepted),
                    "duplicate" => (&stats.duplicate, &mut duplicate),
                    "rejected" => (&stats.rejected, &mut rejected),
                    _ => continue,
                };
                answered[r.index] = true;
                counter.fetch_add(1, Ordering::Relaxed);
                *tally += 1;
                let settled = if r.status == "rejected" {
                    tracing::warn!(digest = %expected, "collector rejected an envelope; quarantined");
                    spool
                        .quarantine(expected, QuarantineReason::RejectedByCollector)
                        .is_ok()
                } else {
                    spool.acknowledge(expected).is_ok()
                };
                done[r.index] = settled;
            }
            let unacknowledged = done.iter().filter(|d| !**d).count();
            BatchOutcome::Answered {
                accepted,
                duplicate,
                rejected,
                unacknowledged,
            }
        })
        .await;
        outcome.unwrap_or(BatchOutcome::Failed(FailureClass::BadResponse))
    }

    /// Ship until `shutdown` turns true.
    pub async fn run(mut self, mut shutdown: watch::Receiver<bool>) {
        let mut config = self.config.borrow_and_update().clone();
        let mut client = self.client_for(&config);
        let mut backoff = Backoff::new(
            Duration::from_millis(config.backoff_initial_ms),
            Duration::from_millis(config.backoff_max_ms),
            u64::from(std::process::id()) ^ 0x9e37_79b9_7f4a_7c15,
        );
        let mut wake_early = false;
        loop {
            if *shutdown.borrow() {
                return;
            }
            if self.config.has_changed().unwrap_or(false) {
                config = self.config.borrow_and_update().clone();
                client = self.client_for(&config);
                backoff = Backoff::new(
                    Duration::from_millis(config.backoff_initial_ms),
                    Duration::from_millis(config.backoff_max_ms),
                    u64::from(std::process::id()),
                );
            }
            let delay = match (&client, config.url.is_empty()) {
                (Some(client), false) => match self.ship_once(client, &config).await {
                    BatchOutcome::Empty => None,
                    BatchOutcome::Answered {
                        accepted,
                        duplicate,
                        rejected,
                        unacknowledged,
                    } => {
                        let settled = accepted + duplicate + rejected;
                        if settled > 0 {
                            backoff.reset();
                            self.stats.succeeded();
                        }
                        wake_early = false;
                        if settled == 0 && unacknowledged == 0 {
                            // Entries were indexed but none could be sent
                            // (each was quarantined or vanished): progress was
                            // made on the index, but never spin on it.
                            Some(backoff.next_delay().min(Duration::from_secs(1)))
                        } else if unacknowledged > 0 {
                            tracing::warn!(
                                unacknowledged,
                                "collector left items unacknowledged; retrying"
                            );
                            Some(backoff.next_delay())
                        } else {
                            Some(Duration::ZERO)
                        }
                    }
                    BatchOutcome::Failed(class) => {
                        // The collector was unreachable: a new capture is a
                        // reason to try again now rather than at the end of
                        // the backoff. Throttling (Retry-After) is honoured.
                        wake_early = matches!(
                            class,
                            FailureClass::Connect | FailureClass::Timeout | FailureClass::Transport
                        );
                        let d = match &class {
                            FailureClass::Throttled {
                                retry_after: Some(ra),
                                ..
                            } => (*ra).min(MAX_RETRY_AFTER),
                            _ => backoff.next_delay(),
                        };
                        tracing::warn!(
                            class = class.label(),
                            retry_in_ms = d.as_millis() as u64,
                            attempt = backoff.attempt(),
                            "shipping failed; will retry"
                        );
                        Some(d)
                    }
                },
                _ => None,
            };
            self.stats.next_delay_ms.store(
                delay.map(|d| d.as_millis() as u64).unwrap_or(0),
                Ordering::Relaxed,
            );
            match delay {
                Some(d) if d.is_zero() => continue,
                Some(d) if wake_early => {
                    tokio::select! {
                        _ = tokio::time::sleep(d) => {}
                        _ = self.wake.notified() => {
                            tracing::info!("new capture while the collector was unreachable; retrying now");
                        }
                        _ = shutdown.changed() => {}
                    }
                }
                Some(d) => {
                    tokio::select! {
                        _ = tokio::time::sleep(d) => {}
                        _ = shutdown.changed() => {}
                    }
                }
                None => {
                    // Idle: wait for a new envelope, a reload, or a slow poll.
                    tokio::select! {
                        _ = self.wake.notified() => {}
                        _ = self.config.changed() => {}
                        _ = tokio::time::sleep(Duration::from_secs(30)) => {}
                        _ = shutdown.changed() => {}
                    }
                }
            }
        }
    }
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_with_jitter_and_caps() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_secs(2), 7);
        let mut ceilings = vec![];
        for _ in 0..8 {
            ceilings.push(b.next_delay());
        }
        let expected_ceiling = [100u64, 200, 400, 800, 1600, 2000, 2000, 2000];
        for (d, c) in ceilings.iter().zip(expected_ceiling) {
            let c = Duration::from_millis(c);
            assert!(*d >= c / 2 && *d <= c, "{d:?} not in [{:?}, {c:?}]", c / 2);
        }
        b.reset();
        assert!(b.next_delay() <= Duration::from_millis(100));
    }

    #[test]
    fn jitter_spreads_retries() {
        let mut a = Backoff::new(Duration::from_secs(1), Duration::from_secs(60), 1);
        let mut b = Backoff::new(Duration::from_secs(1), Duration::from_secs(60), 2);
        let da: Vec<_> = (0..5).map(|_| a.next_delay()).collect();
        let db: Vec<_> = (0..5).map(|_| b.next_delay()).collect();
        assert_ne!(da, db);
    }

    #[test]
    fn retry_after_seconds_and_http_date() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(784_111_717); // Sun, 06 Nov 1994 08:48:37 GMT
        assert_eq!(
            parse_retry_after("120", now),
            Some(Duration::from_secs(120))
        );
        assert_eq!(
            parse_retry_after("Sun, 06 Nov 1994 08:49:37 GMT", now),
            Some(Duration::from_secs(60))
        );
        assert_eq!(
            parse_retry_after("Sun, 06 Nov 1994 08:40:00 GMT", now),
            Some(Duration::ZERO)
        );
        assert_eq!(parse_retry_after("soon", now), None);
        assert_eq!(parse_retry_after("-5", now), None);
    }

    #[test]
    fn unreadable_or_invalid_ca_files_are_typed_errors() {
        let mut c = ShipperConfig {
            ca_file: "/nonexistent/ca.pem".into(),
            ..ShipperConfig::default()
        };
        assert!(matches!(build_client(&c), Err(ShipperError::CaFile { .. })));
        let dir = tempfile::tempdir().unwrap();
        let bad = dir.path().join("bad.pem");
        std::fs::write(
            &bad,
            "-----BEGIN CERTIFICATE-----\nnot base64 !!\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        c.ca_file = bad;
        assert!(matches!(build_client(&c), Err(ShipperError::CaFile { .. })));
        c.ca_file = Default::default();
        build_client(&c).expect("rustls client with webpki roots");
    }

    fn spool_with(n: u64) -> (tempfile::TempDir, Arc<Spool>, Vec<String>) {
        use super::super::config::OverflowPolicy;
        use super::super::spool::SpoolLimits;
        let dir = tempfile::tempdir().unwrap();
        let spool = Arc::new(
            Spool::open(
                dir.path(),
                SpoolLimits {
                    max_bytes: 1 << 30,
                    max_files: 1000,
                    overflow: OverflowPolicy::DropOldest,
                },
            )
            .unwrap(),
        );
        let mut digests = Vec::new();
        for i in 0..n {
            let mut e = pstack_envelope::example::example_unsealed();
            e.clock.monotonic_start_ns = (77_000 + i).to_string();
            let e = e.seal().unwrap();
            spool
                .put(&e.digest, &serde_json::to_vec(&e).unwrap())
                .unwrap();
            digests.push(e.digest);
        }
        (dir, spool, digests)
    }

    fn result(index: usize, digest: Option<&str>, status: &str) -> ItemResult {
        ItemResult {
            index,
            digest: digest.map(str::to_owned),
            status: status.into(),
        }
    }

    /// Only a result naming the item's own digest with accepted/duplicate
    /// deletes it; everything else keeps the file.
    #[tokio::test]
    async fn nothing_is_deleted_without_its_own_per_item_ack() {
        let (_dir, spool, d) = spool_with(6);
        let (_tx, rx) = watch::channel(ShipperConfig::default());
        let shipper = Shipper::new(spool.clone(), rx);
        let outcome = shipper
            .apply(
                &d,
                vec![
                    result(0, Some(&d[0]), "accepted"),
                    result(1, Some(&d[1]), "duplicate"),
                    result(2, Some(&d[3]), "accepted"), // digest of another item
                    result(3, None, "accepted"),        // no digest
                    result(4, Some(&d[4]), "stored?"),  // unknown status
                    result(99, Some(&d[5]), "accepted"), // index out of range
                    result(0, Some(&d[0]), "accepted"), // repeated result
                ],
            )
            .await;
        assert_eq!(
            outcome,
            BatchOutcome::Answered {
                accepted: 1,
                duplicate: 1,
                rejected: 0,
                unacknowledged: 4
            }
        );
        assert!(!spool.contains(&d[0]) && !spool.contains(&d[1]));
        for kept in &d[2..] {
            assert!(spool.contains(kept), "{kept} deleted without its ack");
        }
        // A rejection quarantines (counted), never silently deletes.
        let outcome = shipper
            .apply(&d[2..3], vec![result(0, Some(&d[2]), "rejected")])
            .await;
        assert!(matches!(
            outcome,
            BatchOutcome::Answered { rejected: 1, .. }
        ));
        assert_eq!(spool.snapshot().quarantined_total, 1);
    }

    #[test]
    fn statuses_are_classified() {
        let now = SystemTime::now();
        assert_eq!(
            classify_status(429, Some("3"), now),
            FailureClass::Throttled {
                status: 429,
                retry_after: Some(Duration::from_secs(3))
            }
        );
        assert_eq!(
            classify_status(503, None, now),
            FailureClass::Throttled {
                status: 503,
                retry_after: None
            }
        );
        assert_eq!(
            classify_status(500, None, now),
            FailureClass::Server { status: 500 }
        );
        assert_eq!(
            classify_status(408, None, now),
            FailureClass::Server { status: 408 }
        );
        assert_eq!(
            classify_status(401, None, now),
            FailureClass::Client { status: 401 }
        );
    }

    /// Retry waits are tokio timers: with a paused clock a 30 s Retry-After
    /// passes instantly but in order.
    #[tokio::test(start_paused = true)]
    async fn paused_clock_drives_backoff_sleeps() {
        let start = tokio::time::Instant::now();
        let mut b = Backoff::new(Duration::from_secs(1), Duration::from_secs(8), 3);
        let mut total = Duration::ZERO;
        for _ in 0..4 {
            let d = b.next_delay();
            total += d;
            tokio::time::sleep(d).await;
        }
        // The timer wheel rounds each sleep up to the next millisecond.
        let waited = tokio::time::Instant::now() - start;
        assert!(
            waited >= total && waited <= total + Duration::from_millis(4),
            "{waited:?} vs {total:?}"
        );
        assert!(total >= Duration::from_millis(500 + 1000 + 2000 + 4000));
    }
}
