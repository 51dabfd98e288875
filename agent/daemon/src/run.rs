//! The daemon's lifecycle: set up, serve, reload, drain, exit.
//!
//! Order at start (each step before the next), single-threaded in [`prepare`]:
//! load config → resolve group → take or bind the socket → drop privileges;
//! then on the runtime in [`run`]: open the spool (scan) → start loading the
//! eBPF programs in the background (never fatal, not awaited; see `ebpf`) →
//! open the leak budget → start shipper, watchdog, eBPF drain and accept
//! loop → `READY=1`.
//! Readiness is sent only after the accept loop is running, so a client that
//! connects on `READY=1` is served.
//!
//! Shutdown (SIGTERM/SIGINT): `STOPPING=1`, stop accepting, refuse new
//! captures (503), let in-flight requests finish for at most
//! `drain_timeout_ms`, stop the shipper (an interrupted batch is simply
//! re-sent next start: deletion happens only after an ack), remove a socket
//! file we bound, exit 0. SIGHUP: reload (see `config`).

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::watch;
use tower::ServiceExt;

use super::api;
use super::config::{Config, ConfigError, DEFAULT_CONFIG_PATH};
use super::listener::{self, ListenError, ListenerOrigin};
use super::notify::Notifier;
use super::peer::{AccessPolicy, GroupError, PeerCred};
use super::privilege::{self, PrivilegeError};
use super::shipper::Shipper;
use super::spool::{Spool, SpoolError, SpoolLimits};
use super::state::{CaptureEngine, DaemonState};
use pstack_capture::process::{LeakBudget, LeakJournal, SupervisorConfig};

/// Why the daemon could not start.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// Bad configuration.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The configured group cannot be resolved.
    #[error(transparent)]
    Group(#[from] GroupError),
    /// The socket.
    #[error(transparent)]
    Listen(#[from] ListenError),
    /// The spool.
    #[error(transparent)]
    Spool(#[from] SpoolError),
    /// Dropping privileges.
    #[error(transparent)]
    Privilege(#[from] PrivilegeError),
    /// Other I/O.
    #[error("{0}")]
    Io(String),
}

/// How `pstackd` was started.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// Config file.
    pub config_path: PathBuf,
    /// Whether the path was given explicitly (then it must exist).
    pub explicit: bool,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            config_path: PathBuf::from(DEFAULT_CONFIG_PATH),
            explicit: false,
        }
    }
}

fn spool_limits(c: &Config) -> SpoolLimits {
    SpoolLimits {
        max_bytes: c.spool.max_bytes,
        max_files: c.spool.max_files,
        overflow: c.spool.overflow,
    }
}

fn resolve_policy(c: &Config) -> Result<AccessPolicy, GroupError> {
    let required = c.group != Config::default().group;
    AccessPolicy::resolve(&c.group, required)
}

/// What [`prepare`] set up before the runtime existed.
#[derive(Debug)]
pub struct Prepared {
    config: Config,
    policy: AccessPolicy,
    listener: std::os::unix::net::UnixListener,
    origin: ListenerOrigin,
    privileges: privilege::PrivilegeReport,
}

/// Everything that must happen while the process has exactly one thread:
/// load the config, take (or bind and chown) the socket, and drop
/// privileges. Capabilities, the bounding set and `no_new_privs` are
/// per-thread in Linux, so they are dropped before the runtime spawns any
/// worker or blocking thread — every later thread inherits the reduced set.
pub fn prepare(opts: &RunOptions) -> Result<Prepared, DaemonError> {
    let activated = listener::from_systemd()?;
    let config = Config::load(&opts.config_path, opts.explicit)?;
    let policy = resolve_policy(&config)?;
    if policy.gid.is_none() {
        tracing::warn!(group = %config.group, "configured group does not exist; only root may use the API");
    }
    let (listener, origin) = match activated {
        Some(l) => (l, ListenerOrigin::Activated),
        None => (
            listener::bind(&config.socket_path, config.socket_mode_bits(), policy.gid)?,
            ListenerOrigin::Bound(config.socket_path.clone()),
        ),
    };
    if let Some(parent) = config.capture.leak_journal.parent() {
        let _ = std::fs::create_dir_all(parent);
    }
    let privileges = privilege::drop_privileges()?;
    Ok(Prepared {
        config,
        policy,
        listener,
        origin,
        privileges,
    })
}

/// Run the daemon until SIGTERM/SIGINT. Returns after a clean drain.
pub async fn run(opts: RunOptions, prepared: Prepared) -> Result<(), DaemonError> {
    let notifier = Arc::new(Notifier::from_env());
    let Prepared {
        config,
        policy,
        listener: std_listener,
        origin,
        privileges: report,
    } = prepared;
    tracing::info!(
        effective = ?report.effective,
        bounding_dropped = report.bounding_dropped,
        "privileges dropped; no_new_privs set"
    );
    std_listener
        .set_nonblocking(true)
        .map_err(|e| DaemonError::Io(format!("socket nonblocking: {e}")))?;
    let listener = tokio::net::UnixListener::from_std(std_listener)
        .map_err(|e| DaemonError::Io(format!("socket registration: {e}")))?;

    let spool = Arc::new(
        tokio::task::spawn_blocking({
            let dir = config.spool.dir.clone();
            let limits = spool_limits(&config);
            move || Spool::open(&dir, limits)
        })
        .await
        .map_err(|e| DaemonError::Io(e.to_string()))??,
    );
    let snap = spool.snapshot();
    tracing::info!(files = snap.files, bytes = snap.bytes, dir = %config.spool.dir.display(), "spool indexed");

    let digest_key = load_digest_key(&config.capture.digest_key_file)?;
    let ebpf = super::ebpf::DaemonEbpf::start(&config.ebpf);
    let engine = {
        let helper = if config.capture.helper_path.as_os_str().is_empty() {
            pstack_capture::process::locate_helper()
        } else {
            Ok(config.capture.helper_path.clone())
        };
        match helper.and_then(|p| SupervisorConfig::new("pstackd", p)) {
            Ok(mut sc) => {
                *sc.digest_key.write().unwrap_or_else(|p| p.into_inner()) = digest_key.clone();
                sc.offcpu = Some(ebpf.clone() as Arc<dyn pstack_capture::process::OffCpuSource>);
                sc.kubelet_url = Some(config.capture.kubelet_url.clone()).filter(|u| !u.is_empty());
                let budget = LeakBudget::new(
                    config.capture.leak_budget,
                    LeakJournal::new(config.capture.leak_journal.clone()),
                    &sc.boot_id,
                );
                CaptureEngine {
                    supervisor: Ok(sc),
                    budget: Some(budget),
                    ebpf: ebpf.clone(),
                }
            }
            Err(e) => {
                tracing::error!(error = %e, "captures are unavailable until pstack-helper is installed");
                CaptureEngine {
                    supervisor: Err(e.to_string()),
                    budget: None,
                    ebpf: ebpf.clone(),
                }
            }
        }
    };

    let (shipper_tx, shipper_rx) = watch::channel(config.shipper.clone());
    let shipper = Shipper::new(spool.clone(), shipper_rx);
    let state = Arc::new(DaemonState::new(
        config,
        policy,
        spool.clone(),
        shipper.stats.clone(),
        shipper.wake.clone(),
        shipper_tx,
        engine,
    ));
    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let shipper_task = tokio::spawn(shipper.run(shutdown_rx.clone()));
    ebpf.spawn_drain(shutdown_rx.clone());
    tokio::spawn(super::watch::runner::run(
        state.clone(),
        shutdown_rx.clone(),
    ));

    if let Some(interval) = notifier.watchdog_interval() {
        let n = notifier.clone();
        let mut stop = shutdown_rx.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(interval / 2);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = tick.tick() => n.watchdog(),
                    _ = stop.changed() => return,
                }
            }
        });
    }
    if notifier.enabled() {
        let n = notifier.clone();
        let st = state.clone();
        let mut stop = shutdown_rx.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(10));
            tick.tick().await;
            loop {
                tokio::select! {
                    _ = tick.tick() => n.status(&status_line(&st)),
                    _ = stop.changed() => return,
                }
            }
        });
    }

    let mut sigterm =
        signal(SignalKind::terminate()).map_err(|e| DaemonError::Io(e.to_string()))?;
    let mut sigint = signal(SignalKind::interrupt()).map_err(|e| DaemonError::Io(e.to_string()))?;
    let mut sighup = signal(SignalKind::hangup()).map_err(|e| DaemonError::Io(e.to_string()))?;

    let router = api::router(state.clone());
    let graceful = GracefulShutdown::new();
    let where_ = match &origin {
        ListenerOrigin::Activated => "systemd socket".to_string(),
        ListenerOrigin::Bound(p) => p.display().to_string(),
    };
    tracing::info!(listen = %where_, "pstackd serving");
    notifier.ready(&format!("serving on {where_}; {}", status_line(&state)));

    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, _) = match accepted {
                    Ok(s) => s,
                    Err(e) => {
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let config = state.config();
                let policy = state.policy();
                let cred = match stream.peer_cred() {
                    Ok(c) => {
                        use std::os::fd::AsFd;
                        let groups = super::peer::peer_groups(stream.as_fd()).unwrap_or_default();
                        PeerCred {
                            uid: c.uid(),
                            gid: c.gid(),
                            pid: c.pid(),
                            supplementary_member: policy.gid.is_some_and(|g| groups.contains(&g)),
                        }
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "SO_PEERCRED failed; connection closed");
                        continue;
                    }
                };
                // Authorize before counting: a peer that may not use the API
                // never holds one of the max_connections slots.
                if !policy.allows(&cred) {
                    refuse_unauthorized(stream, cred, &policy.group_name, &state);
                    continue;
                }
                if state.counters.connections_open.load(Ordering::Relaxed) >= config.max_connections as u64 {
                    state.counters.connections_refused.fetch_add(1, Ordering::Relaxed);
                    drop(stream);
                    continue;
                }
                let svc = router.clone().map_request(move |mut req: axum::http::Request<hyper::body::Incoming>| {
                    req.extensions_mut().insert(cred);
                    req
                });
                let conn = hyper::server::conn::http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(Duration::from_millis(config.header_timeout_ms))
                    .max_buf_size(16 << 10)
                    .serve_connection(TokioIo::new(stream), TowerToHyperService::new(svc));
                let conn = graceful.watch(conn);
                let st = state.clone();
                st.counters.connections_open.fetch_add(1, Ordering::Relaxed);
                tokio::spawn(async move {
                    if let Err(e) = conn.await {
                        tracing::debug!(error = %e, "connection ended with an error");
                    }
                    st.counters.connections_open.fetch_sub(1, Ordering::Relaxed);
                });
            }
            _ = sighup.recv() => {
                notifier.reloading();
                reload(&state, &opts);
                notifier.ready(&status_line(&state));
            }
            _ = sigterm.recv() => break,
            _ = sigint.recv() => break,
        }
    }

    // Drain.
    let drain = Duration::from_millis(state.config().drain_timeout_ms);
    state.draining.store(true, Ordering::SeqCst);
    state.watch.close();
    notifier.stopping("draining in-flight captures");
    tracing::info!(
        in_flight = state.in_flight.load(Ordering::SeqCst),
        drain_ms = drain.as_millis() as u64,
        "draining"
    );
    drop(listener);
    if let ListenerOrigin::Bound(p) = &origin {
        let _ = std::fs::remove_file(p);
    }
    let drained = tokio::time::timeout(drain, graceful.shutdown())
        .await
        .is_ok();
    let _ = shutdown_tx.send(true);
    let _ = tokio::time::timeout(Duration::from_millis(500), shipper_task).await;
    if drained {
        tracing::info!("drained; exiting");
    } else {
        tracing::warn!(
            in_flight = state.in_flight.load(Ordering::SeqCst),
            "drain bound reached; exiting with captures unanswered (nothing unacknowledged was spooled as acknowledged)"
        );
    }
    Ok(())
}

/// Most refusals answered at once; beyond it a refused peer's connection is
/// closed without an answer.
const MAX_REFUSALS_IN_FLIGHT: u64 = 16;

/// Answer an unauthorized peer with a JSON 403 (after reading at most 16 KiB
/// of its request for at most 1 s, so it sees the answer rather than a reset)
/// and close; outside the connection count.
fn refuse_unauthorized(
    stream: tokio::net::UnixStream,
    cred: PeerCred,
    group: &str,
    state: &Arc<DaemonState>,
) {
    state.counters.unauthorized.fetch_add(1, Ordering::Relaxed);
    tracing::warn!(
        uid = cred.uid,
        gid = cred.gid,
        pid = cred.pid.unwrap_or(0),
        "refused a peer that is neither root nor in the configured group (primary or supplementary)"
    );
    let in_flight = &state.counters.refusals_in_flight;
    if in_flight.fetch_add(1, Ordering::Relaxed) >= MAX_REFUSALS_IN_FLIGHT {
        in_flight.fetch_sub(1, Ordering::Relaxed);
        return;
    }
    let body = serde_json::json!({"error": {"code": "forbidden", "message": format!(
        "uid {} (gid {}) may not use pstackd: only root and members of group {group:?} (primary or supplementary) may",
        cred.uid, cred.gid
    )}})
    .to_string();
    // hyper reads the request head (16 KiB at most) and answers 403 without
    // reading the body; the whole exchange is bounded by one second.
    let service = hyper::service::service_fn(move |_req: hyper::Request<hyper::body::Incoming>| {
        let body = body.clone();
        async move {
            hyper::Response::builder()
                .status(hyper::StatusCode::FORBIDDEN)
                .header(hyper::header::CONTENT_TYPE, "application/json")
                .header(hyper::header::CONNECTION, "close")
                .body(http_body_util::Full::new(bytes::Bytes::from(body)))
        }
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .keep_alive(false)
        .max_buf_size(16 << 10)
        .serve_connection(TokioIo::new(stream), service);
    let st = state.clone();
    tokio::spawn(async move {
        let _ = tokio::time::timeout(Duration::from_secs(1), conn).await;
        st.counters
            .refusals_in_flight
            .fetch_sub(1, Ordering::Relaxed);
    });
}

fn status_line(state: &DaemonState) -> String {
    let sp = state.spool.snapshot();
    format!(
        "captures in flight {}; spool {} files / {} bytes; dropped {}; quarantined {}",
        state.in_flight.load(Ordering::SeqCst),
        sp.files,
        sp.bytes,
        sp.dropped_total,
        sp.quarantined_total
    )
}

/// Read (or create) the host's digest key, logging which.
fn load_digest_key(path: &std::path::Path) -> Result<pstack_envelope::DigestKey, DaemonError> {
    let (key, created) = pstack_capture::digest_key::load_or_create(path)
        .map_err(|e| DaemonError::Io(e.to_string()))?;
    tracing::info!(path = %path.display(), created, "digest key ready");
    Ok(key)
}

/// Re-read the config file; apply it whole or keep the old one.
fn reload(state: &DaemonState, opts: &RunOptions) {
    let proposed = match Config::load(&opts.config_path, opts.explicit) {
        Ok(c) => c,
        Err(e) => {
            state
                .counters
                .reloads_rejected
                .fetch_add(1, Ordering::Relaxed);
            tracing::error!(error = %e, "reload rejected; keeping the running configuration");
            return;
        }
    };
    let policy = match resolve_policy(&proposed) {
        Ok(p) => p,
        Err(e) => {
            state
                .counters
                .reloads_rejected
                .fetch_add(1, Ordering::Relaxed);
            tracing::error!(error = %e, "reload rejected; keeping the running configuration");
            return;
        }
    };
    // The digest key rotates with the config: re-read it (or create it at a
    // new path) before anything is applied, so a bad key file rejects the
    // whole reload.
    let key = match load_digest_key(&proposed.capture.digest_key_file) {
        Ok(k) => k,
        Err(e) => {
            state
                .counters
                .reloads_rejected
                .fetch_add(1, Ordering::Relaxed);
            tracing::error!(error = %e, "reload rejected; keeping the running configuration");
            return;
        }
    };
    if let Ok(sc) = &state.engine.supervisor {
        *sc.digest_key.write().unwrap_or_else(|p| p.into_inner()) = key;
    }
    let running = state.config();
    let mut applied = proposed.clone();
    for name in running.fixed_differences(&proposed) {
        tracing::warn!(
            parameter = name,
            "changed in the file but bound at start; restart pstackd to apply"
        );
    }
    applied.socket_path = running.socket_path.clone();
    applied.socket_mode = running.socket_mode.clone();
    applied.spool.dir = running.spool.dir.clone();
    applied.capture.leak_journal = running.capture.leak_journal.clone();
    applied.capture.kubelet_url = running.capture.kubelet_url.clone();
    applied.ebpf = running.ebpf.clone();
    state.spool.set_limits(spool_limits(&applied));
    let _ = state.shipper_config.send(applied.shipper.clone());
    state.replace(applied, policy);
    state.counters.reloads_ok.fetch_add(1, Ordering::Relaxed);
    tracing::info!("configuration reloaded");
}
