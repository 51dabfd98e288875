//! Operator login admission: who may spend a password verification, and
//! when a name or a source is refused (issue 28).
//!
//! A password verification is argon2id: ~19 MiB and tens of milliseconds of
//! one core each, reachable without any credential. Unbounded, 120
//! concurrent bad logins took a store to 2.95 GB. What bounds it now:
//!
//! - **Verifier slots.** At most [`LoginLimits::verifier_slots`] (default 4)
//!   verifications run at once per process; one more is refused at once,
//!   429 `login_verifier_busy` with `Retry-After`, before any database work.
//!   The slot is taken before the name is looked up, so an unknown name
//!   takes one too (and is then verified against
//!   [`crate::operators::dummy_phc`], at the same cost as a known name).
//! - **Per source.** At most [`LoginLimits::per_source_verifications`]
//!   (default 1) of those slots belong to one source address at a time;
//!   another is refused, 429 `login_source_busy`. One address cannot hold
//!   every slot.
//! - **CPU yielded.** Verifications run on one thread per slot at nice
//!   [`VERIFIER_NICE`], so a burst of logins slows logins, not `/healthz`
//!   or ingest on the async workers.
//! - **Memory handed back.** Each verification maps its argon2 memory for
//!   itself and unmaps it when done (`operators::verify_password`), so RSS
//!   is back at idle the moment a burst ends, whichever thread ran it. (Through malloc the memory stayed: see `MappedBlocks`. Trimming
//!   with `malloc_trim(0)` after each verification was tried first and
//!   still left up to +77 MiB resident after a flood: glibc does not trim
//!   the top chunk of a thread's arena.)
//!
//! **The throttle** (`db::login_throttle`) lives in the database, so every
//! replica on one PostgreSQL shares it. A login attempt is charged *before*
//! its password is verified (one atomic upsert per dimension that returns
//! the new count), so racing attempts on several replicas cannot overshoot
//! a limit; a success refunds its charge. Three dimensions, each a fixed
//! window from its first failure ([`LoginLimits::window_ns`], 15 min):
//!
//! 1. **Source** ([`LoginLimits::source_failures`], 30): one address
//!    spraying names is refused for every name (`login_source_throttled`).
//! 2. **Name at a source** ([`LoginLimits::pair_failures`], 5): five failed
//!    logins of one name from one address refuse that name *from that
//!    address only* (`too_many_login_failures`). Anonymous requests from
//!    elsewhere therefore cannot lock an operator out of their own address.
//! 3. **Name** ([`LoginLimits::name_failures`], 50): failures of one name
//!    from all addresses together. Past it the name is refused
//!    (`login_user_throttled`) — but only from addresses that have not
//!    logged in as that operator successfully within
//!    [`LoginLimits::known_source_ns`] (30 days). A distributed guesser gets
//!    at most 50 guesses per window at a name; the operator, at an address
//!    they have used before, is never locked out by someone else. The cost:
//!    during such an attack an operator at a *new* address waits for the
//!    window.
//!
//! What is guaranteed, and tested (`store/tests/accounts`): failures on one
//! replica count on the other; after 4 failures of a name from a source the
//! right password still logs in there, after 5 it is refused there while
//! another source logs in; a source past its budget is refused for every
//! name while another source logs in; past the name budget a known source
//! logs in and an unknown one does not; a full table drops expired rows,
//! then junk, and a real name's count survives and still locks.
//!
//! **Bounded table.** About [`LoginLimits::max_entries`] rows (default
//! 100,000; checked every [`LoginLimits::evict_check_every`] new rows).
//! Past it rows are evicted, never cleared: first rows whose window has
//! passed (they no longer refuse anything), then the fewest failures,
//! oldest last failure first. Junk names therefore evict each other; to
//! push out a row with *n* failures an attacker must first make 100,000 rows
//! with at least *n* failures each. Names are keyed by a SHA-256 prefix (a
//! password typed into the name field is not stored); sources in the clear.
//!
//! **Sources.** The peer address of the TCP connection; when that peer is a
//! configured trusted proxy (`serve --trusted-proxy`, e.g. the nginx of
//! docs/store-tls.md), the right-most `X-Forwarded-For` entry that is not
//! itself a trusted proxy. Without a trusted proxy the header is ignored (a
//! client could write any address there). IPv6 sources are keyed by their
//! /64, since one host commonly holds a whole /64; IPv4-mapped IPv6 is
//! keyed as the IPv4 address.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use sha2::{Digest, Sha256};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The limits of operator logins. Defaults in [`LoginLimits::default`].
#[derive(Debug, Clone, Copy)]
pub struct LoginLimits {
    /// Verifications running at once in this process (4: ~76 MiB of argon2
    /// memory at most; fewer slots, more 429s under a burst).
    pub verifier_slots: usize,
    /// Of those, held by one source at once (1).
    pub per_source_verifications: usize,
    /// Failed logins of one name from one source per window (5).
    pub pair_failures: i64,
    /// Failed logins from one source, any names, per window (30).
    pub source_failures: i64,
    /// Failed logins of one name from sources it has not logged in from,
    /// per window (50).
    pub name_failures: i64,
    /// The window, from the first failure counted (15 min).
    pub window_ns: i64,
    /// Rows the throttle table keeps (100,000; each ~100 bytes).
    pub max_entries: i64,
    /// Check the bound every this many new rows per process (64: a check
    /// counts the table; the table may overshoot by this much per replica).
    pub evict_check_every: u64,
    /// How long a successful login makes its source known for its
    /// operator (30 days).
    pub known_source_ns: i64,
}

impl Default for LoginLimits {
    fn default() -> Self {
        LoginLimits {
            verifier_slots: 4,
            per_source_verifications: 1,
            pair_failures: 5,
            source_failures: 30,
            name_failures: 50,
            window_ns: 15 * 60 * 1_000_000_000,
            max_entries: 100_000,
            evict_check_every: 64,
            known_source_ns: 30 * 24 * 3600 * 1_000_000_000,
        }
    }
}

/// Everything the login route needs beyond the database.
#[derive(Debug, Clone)]
pub struct LoginControls {
    /// The limits.
    pub limits: LoginLimits,
    /// The verifier slots.
    pub verifier: Arc<PasswordVerifier>,
    /// Peers whose `X-Forwarded-For` is believed.
    pub trusted_proxies: Arc<[IpAddr]>,
}

impl Default for LoginControls {
    fn default() -> Self {
        LoginControls::new(LoginLimits::default(), Vec::new())
    }
}

impl LoginControls {
    /// Controls with these limits and trusted proxies.
    pub fn new(limits: LoginLimits, trusted_proxies: Vec<IpAddr>) -> LoginControls {
        LoginControls {
            limits,
            verifier: Arc::new(PasswordVerifier::new(
                limits.verifier_slots,
                limits.per_source_verifications,
            )),
            trusted_proxies: trusted_proxies.into_iter().map(canonical).collect(),
        }
    }
}

/// IPv4-mapped IPv6 as IPv4.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    }
}

/// Where a login attempt comes from, as the throttle keys it: an IPv4
/// address, an IPv6 /64 (`2001:db8:1:2::/64`), or `unknown` (a request
/// without a connection, e.g. an in-process call).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ClientSource(String);

impl ClientSource {
    /// The source of a request from `peer` carrying these `X-Forwarded-For`
    /// header values (in order), given the trusted proxies.
    pub fn resolve<'a>(
        peer: Option<IpAddr>,
        forwarded_for: impl Iterator<Item = &'a str>,
        trusted: &[IpAddr],
    ) -> ClientSource {
        let Some(mut addr) = peer.map(canonical) else {
            return ClientSource("unknown".into());
        };
        if trusted.contains(&addr) {
            let hops: Vec<&str> = forwarded_for.flat_map(|v| v.split(',')).collect();
            for hop in hops.iter().rev() {
                // A hop the proxy wrote that is not an address: stop at the
                // proxy itself rather than believe anything left of it.
                let Ok(ip) = hop.trim().parse::<IpAddr>() else {
                    break;
                };
                addr = canonical(ip);
                if !trusted.contains(&addr) {
                    break;
                }
            }
        }
        ClientSource(match addr {
            IpAddr::V4(v4) => v4.to_string(),
            IpAddr::V6(v6) => {
                let s = v6.segments();
                let net = Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0);
                format!("{net}/64")
            }
        })
    }

    /// The source as stored and logged.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The throttle rows one attempt touches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThrottleKeys {
    /// `source:<source>`.
    pub source: String,
    /// `name:<32 hex of SHA-256(name)>`.
    pub name: String,
    /// `pair:<32 hex of SHA-256(name)>@<source>`.
    pub pair: String,
}

impl ThrottleKeys {
    /// The keys of an attempt at `username` from `source`.
    pub fn new(username: &str, source: &ClientSource) -> ThrottleKeys {
        let digest = Sha256::digest(username.as_bytes());
        let name = hex::encode(&digest[..16]);
        ThrottleKeys {
            source: format!("source:{}", source.as_str()),
            name: format!("name:{name}"),
            pair: format!("pair:{name}@{}", source.as_str()),
        }
    }
}

/// Which limit refused a login.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ThrottleDimension {
    /// Too many failures from this source.
    Source,
    /// Too many failures of this name from this source.
    Pair,
    /// Too many failures of this name from unknown sources.
    Name,
}

impl ThrottleDimension {
    /// The error code of a refusal on this dimension.
    pub fn code(self) -> &'static str {
        match self {
            ThrottleDimension::Source => "login_source_throttled",
            ThrottleDimension::Pair => "too_many_login_failures",
            ThrottleDimension::Name => "login_user_throttled",
        }
    }
}

/// A login refused by the throttle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ThrottleRefusal {
    /// Which limit.
    pub dimension: ThrottleDimension,
    /// The limit.
    pub limit: i64,
    /// When the window that refuses ends, ns from now.
    pub retry_after_ns: i64,
}

/// What charging an attempt did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoginCharge {
    /// Refused: do not verify.
    pub refused: Option<ThrottleRefusal>,
    /// The name's budget was charged (the source is not known for it); a
    /// success refunds it.
    pub name_charged: bool,
}

/// Why no verifier slot was given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VerifierBusy {
    /// Every slot of the process is taken.
    Slots {
        /// The slots.
        limit: usize,
    },
    /// This source holds its share already.
    Source {
        /// Its share.
        limit: usize,
    },
}

/// The bounded pool of password verifications (see the module doc).
#[derive(Debug)]
pub struct PasswordVerifier {
    slots: Arc<Semaphore>,
    total: usize,
    per_source: usize,
    in_flight: Mutex<HashMap<ClientSource, usize>>,
    /// The verifier threads' queue, started on first use (`None`: no
    /// thread could be started; verifications use the blocking pool).
    workers: std::sync::OnceLock<Option<std::sync::mpsc::SyncSender<VerifyJob>>>,
    /// Attempts refused for want of a slot (either kind).
    pub refused_busy: AtomicU64,
}

type VerifyJob = Box<dyn FnOnce() + Send>;

/// The nice value of the verifier threads: argon2 yields the CPU to the
/// async workers (`/healthz`, ingest) whenever both want it.
pub const VERIFIER_NICE: i32 = 10;

/// Lower the calling thread's scheduling priority to [`VERIFIER_NICE`].
fn lower_this_threads_priority() {
    // SAFETY: gettid has no preconditions; setpriority with this thread's
    // id changes only this thread's nice value (Linux: per thread).
    let rc = unsafe {
        let tid = libc::gettid();
        libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, VERIFIER_NICE)
    };
    if rc != 0 {
        tracing::debug!(
            error = %std::io::Error::last_os_error(),
            "could not lower the login verifier thread's priority"
        );
    }
}

impl PasswordVerifier {
    /// `total` slots, `per_source` of them per source (both at least 1).
    pub fn new(total: usize, per_source: usize) -> PasswordVerifier {
        let total = total.max(1);
        PasswordVerifier {
            slots: Arc::new(Semaphore::new(total)),
            total,
            per_source: per_source.max(1),
            in_flight: Mutex::new(HashMap::new()),
            workers: std::sync::OnceLock::new(),
            refused_busy: AtomicU64::new(0),
        }
    }

    /// The verifier threads (one per slot, at [`VERIFIER_NICE`]), started
    /// on first use. They end when this verifier is dropped.
    fn workers(&self) -> Option<&std::sync::mpsc::SyncSender<VerifyJob>> {
        self.workers
            .get_or_init(|| {
                // Never full: a job needs a slot, and there are as many
                // threads as slots.
                let (tx, rx) = std::sync::mpsc::sync_channel::<VerifyJob>(self.total);
                let rx = Arc::new(Mutex::new(rx));
                let mut started = 0;
                for i in 0..self.total {
                    let rx = rx.clone();
                    let spawned = std::thread::Builder::new()
                        .name(format!("login-verify-{i}"))
                        .spawn(move || {
                            lower_this_threads_priority();
                            loop {
                                let next = rx.lock().unwrap_or_else(|p| p.into_inner()).recv();
                                match next {
                                    Ok(job) => job(),
                                    Err(_) => return,
                                }
                            }
                        });
                    match spawned {
                        Ok(_) => started += 1,
                        Err(e) => {
                            tracing::warn!(error = %e, "cannot start a login verifier thread")
                        }
                    }
                }
                (started > 0).then_some(tx)
            })
            .as_ref()
    }

    fn in_flight(&self) -> std::sync::MutexGuard<'_, HashMap<ClientSource, usize>> {
        self.in_flight.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Take a slot for `source`, or say why not (never waits).
    pub fn try_begin(
        self: &Arc<Self>,
        source: &ClientSource,
    ) -> Result<VerifierSlot, VerifierBusy> {
        {
            let mut map = self.in_flight();
            let n = map.entry(source.clone()).or_insert(0);
            if *n >= self.per_source {
                self.refused_busy.fetch_add(1, Ordering::Relaxed);
                return Err(VerifierBusy::Source {
                    limit: self.per_source,
                });
            }
            *n += 1;
        }
        match self.slots.clone().try_acquire_owned() {
            Ok(permit) => Ok(VerifierSlot {
                permit: Some(permit),
                source: source.clone(),
                verifier: self.clone(),
            }),
            Err(_) => {
                self.release_source(source);
                self.refused_busy.fetch_add(1, Ordering::Relaxed);
                Err(VerifierBusy::Slots { limit: self.total })
            }
        }
    }

    fn release_source(&self, source: &ClientSource) {
        let mut map = self.in_flight();
        if let Some(n) = map.get_mut(source) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                map.remove(source);
            }
        }
    }
}

/// One taken verifier slot; dropping it frees the slot.
#[derive(Debug)]
pub struct VerifierSlot {
    permit: Option<OwnedSemaphorePermit>,
    source: ClientSource,
    verifier: Arc<PasswordVerifier>,
}

impl VerifierSlot {
    /// Verify `password` against `phc` (an unknown name: `None`, verified
    /// against the dummy hash and always false) on a verifier thread. The
    /// slot is held by the verification itself, so a client that hangs up
    /// does not free it before the memory is.
    pub async fn verify(self, password: String, phc: Option<String>) -> bool {
        let verifier = self.verifier.clone();
        let (tx, rx) = tokio::sync::oneshot::channel();
        let job: VerifyJob = Box::new(move || {
            let ok = match phc.as_deref() {
                Some(phc) => crate::operators::verify_password(&password, phc),
                None => {
                    if let Some(dummy) = crate::operators::dummy_phc() {
                        let _ = crate::operators::verify_password(&password, dummy);
                    }
                    false
                }
            };
            drop(self);
            let _ = tx.send(ok);
        });
        let job = match verifier.workers() {
            Some(workers) => match workers.try_send(job) {
                Ok(()) => None,
                Err(
                    std::sync::mpsc::TrySendError::Full(job)
                    | std::sync::mpsc::TrySendError::Disconnected(job),
                ) => Some(job),
            },
            None => Some(job),
        };
        if let Some(job) = job {
            // No verifier thread: the blocking pool, at normal priority.
            let _ = tokio::task::spawn_blocking(job).await;
        }
        rx.await.unwrap_or(false)
    }
}

impl Drop for VerifierSlot {
    fn drop(&mut self) {
        drop(self.permit.take());
        self.verifier.release_source(&self.source);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn src(peer: &str, xff: &[&str], trusted: &[&str]) -> String {
        let trusted: Vec<IpAddr> = trusted.iter().map(|t| t.parse().unwrap()).collect();
        let trusted: Vec<IpAddr> = trusted.into_iter().map(canonical).collect();
        ClientSource::resolve(Some(peer.parse().unwrap()), xff.iter().copied(), &trusted)
            .as_str()
            .to_string()
    }

    #[test]
    fn sources_believe_forwarded_for_only_from_trusted_proxies() {
        // No trusted proxy: the header is a client's word, ignored.
        assert_eq!(src("203.0.113.9", &["10.0.0.1"], &[]), "203.0.113.9");
        // From the proxy: the right-most hop it appended.
        assert_eq!(
            src("127.0.0.1", &["10.9.9.9, 198.51.100.7"], &["127.0.0.1"]),
            "198.51.100.7"
        );
        // Several headers, chained proxies: skip trusted hops from the right.
        assert_eq!(
            src(
                "127.0.0.1",
                &["198.51.100.7", "192.0.2.1"],
                &["127.0.0.1", "192.0.2.1"]
            ),
            "198.51.100.7"
        );
        // A forged left-most hop is never reached.
        assert_eq!(
            src("127.0.0.1", &["1.1.1.1, 198.51.100.7"], &["127.0.0.1"]),
            "198.51.100.7"
        );
        // Garbage from the proxy: stay at the proxy.
        assert_eq!(
            src("127.0.0.1", &["not-an-ip"], &["127.0.0.1"]),
            "127.0.0.1"
        );
        // No header: the proxy.
        assert_eq!(src("127.0.0.1", &[], &["127.0.0.1"]), "127.0.0.1");
        // IPv6 by /64; IPv4-mapped as IPv4 (peer and trusted list alike).
        assert_eq!(src("2001:db8:1:2:aaaa::1", &[], &[]), "2001:db8:1:2::/64");
        assert_eq!(src("::ffff:203.0.113.9", &[], &[]), "203.0.113.9");
        assert_eq!(
            src("::ffff:127.0.0.1", &["198.51.100.7"], &["127.0.0.1"]),
            "198.51.100.7"
        );
        assert_eq!(
            ClientSource::resolve(None, std::iter::empty(), &[]).as_str(),
            "unknown"
        );
    }

    #[test]
    fn throttle_keys_never_hold_the_name() {
        let s = ClientSource("198.51.100.7".into());
        let k = ThrottleKeys::new("my secret password typed as a name", &s);
        assert!(!k.name.contains("secret") && !k.pair.contains("secret"));
        assert_eq!(k.source, "source:198.51.100.7");
        assert!(k.pair.ends_with("@198.51.100.7"));
        assert_eq!(k.name.len(), "name:".len() + 32);
        let huge = "x".repeat(1 << 20);
        assert_eq!(ThrottleKeys::new(&huge, &s).name.len(), k.name.len());
    }

    #[tokio::test]
    async fn slots_are_bounded_overall_and_per_source() {
        let v = Arc::new(PasswordVerifier::new(2, 1));
        let a = ClientSource("198.51.100.1".into());
        let b = ClientSource("198.51.100.2".into());
        let c = ClientSource("198.51.100.3".into());
        let sa = v.try_begin(&a).unwrap();
        assert_eq!(
            v.try_begin(&a).unwrap_err(),
            VerifierBusy::Source { limit: 1 }
        );
        let sb = v.try_begin(&b).unwrap();
        assert_eq!(
            v.try_begin(&c).unwrap_err(),
            VerifierBusy::Slots { limit: 2 }
        );
        // A refusal for want of a slot does not leave c counted in flight.
        drop(sa);
        let sc = v.try_begin(&c).unwrap();
        drop(sb);
        drop(sc);
        assert!(v.in_flight().is_empty());
        let phc = crate::operators::hash_password("correct horse battery").unwrap();
        let s = v.try_begin(&a).unwrap();
        assert!(s.verify("correct horse battery".into(), Some(phc)).await);
        let s = v.try_begin(&a).unwrap();
        assert!(!s.verify("correct horse battery".into(), None).await);
        assert!(v.in_flight().is_empty());
        assert_eq!(v.slots.available_permits(), 2);
        // The verifications ran on the verifier threads, at lower priority.
        let nice_of = |name: &str| {
            std::fs::read_dir("/proc/self/task").unwrap().find_map(|t| {
                let t = t.ok()?.path();
                let comm = std::fs::read_to_string(t.join("comm")).ok()?;
                (comm.trim() == name).then(|| {
                    let stat = std::fs::read_to_string(t.join("stat")).unwrap();
                    // Field 19 (nice), counted after the ")" closing comm.
                    let rest = &stat[stat.rfind(')').unwrap() + 2..];
                    rest.split(' ').nth(16).unwrap().parse::<i32>().unwrap()
                })
            })
        };
        assert_eq!(nice_of("login-verify-0"), Some(VERIFIER_NICE));
        assert_eq!(nice_of("login-verify-1"), Some(VERIFIER_NICE));
    }
}
