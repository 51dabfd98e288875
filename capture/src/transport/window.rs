//! The eBPF window of a transport capture: the session, its stop switch
//! and the per-cookie view ([`EbpfFlow`], [`TransientFlow`]) it yields.

use super::*;

/// eBPF view of one flow for the window.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EbpfFlow {
    /// Socket cookie.
    pub cookie: u64,
    /// Retransmit events.
    pub retransmits: u64,
    /// RSTs this host sent on the flow.
    pub resets_sent: u64,
    /// RSTs the flow received (sent by the remote endpoint).
    pub resets_received: u64,
    /// Kernel reset reason name of the last RST sent, if any.
    pub last_reset_reason: Option<String>,
    /// State transitions (`FROM>TO@monotonic_ns`).
    pub transitions: Vec<String>,
    /// First and last event, CLOCK_MONOTONIC ns.
    pub first_ns: u64,
    /// Last event.
    pub last_ns: u64,
    /// Reset events kept in the window's sample: (`received`|`sent`,
    /// CLOCK_MONOTONIC ns, the endpoint that sent the RST).
    pub resets: Vec<(String, u64, String)>,
}

/// A flow eBPF saw close inside the window (a transition to CLOSE): the
/// short-lived streams a sock_diag sample at each end cannot see, such as
/// Longhorn's per-file bulk streams. Identity: the socket cookie when the
/// kernel had generated one (`skc_cookie` is made lazily, by sock_diag or a
/// BPF helper, so a socket nobody dumped has none), else the 4-tuple with
/// its first and last event times.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct TransientFlow {
    /// Socket cookie, when the kernel had one.
    pub cookie: Option<String>,
    /// This host's end.
    pub local: SocketAddr,
    /// The other end.
    pub remote: SocketAddr,
    /// Netns inode of the socket, when the event carried it.
    pub netns_ino: Option<u32>,
    /// Whether its opening (a SYN state → ESTABLISHED) was seen too.
    pub opened_in_window: bool,
    /// First and last event, CLOCK_MONOTONIC ns (decimal strings).
    pub first_ns: String,
    /// Last event.
    pub last_ns: String,
    /// State transitions (`FROM>TO@ns`).
    pub transitions: Vec<String>,
    /// Retransmits.
    pub retransmits: u64,
    /// RSTs this host sent.
    pub resets_sent: u64,
    /// RSTs received.
    pub resets_received: u64,
}

/// The eBPF side of a window.
#[derive(Debug, Clone)]
pub enum EbpfWindow {
    /// Not requested (`--no-ebpf`).
    NotRequested,
    /// Requested but this host cannot provide it.
    Unavailable {
        /// `unsupported`, `permission_denied` or `error`.
        status: SurfaceStatus,
        /// Why.
        message: String,
    },
    /// Events joined by socket cookie.
    Flows {
        /// Per-flow summaries.
        flows: Vec<EbpfFlow>,
        /// Digest of the raw records.
        digest: Option<String>,
        /// Raw bytes.
        bytes: u64,
        /// Whether a ring or cap dropped events.
        truncated: bool,
        /// Flows that closed inside the window (sock_diag's cookies not yet
        /// removed: see [`CaptureResult::short_lived`]).
        transient: Vec<TransientFlow>,
    },
}

/// Load the eBPF TCP programs (before the window starts), filtered to `peer`.
pub fn ebpf_start(peer: IpAddr) -> Result<pstack_ebpf::EbpfSession, EbpfWindow> {
    let mut cfg = pstack_ebpf::EbpfConfig::tcp();
    cfg.addr = Some(peer);
    pstack_ebpf::EbpfSession::start(cfg).map_err(|e| EbpfWindow::Unavailable {
        status: e.status(),
        message: e.to_string(),
    })
}

// Linux `TCP_*` states (include/net/tcp_states.h).
pub(super) const TCP_ESTABLISHED: u8 = 1;
pub(super) const TCP_SYN_SENT: u8 = 2;
pub(super) const TCP_SYN_RECV: u8 = 3;
pub(super) const TCP_CLOSE: u8 = 7;

/// Ends a capture's window before its length: set by whoever watches what
/// the window is about (pstackd's `longhorn_rebuild` rule ends a rebuild's
/// window when the rebuild ends). Cloning shares the signal.
#[derive(Debug, Clone, Default)]
pub struct WindowStop(std::sync::Arc<std::sync::atomic::AtomicBool>);

impl WindowStop {
    /// Slice in which a sleeping window notices the signal.
    pub const SLICE: Duration = Duration::from_millis(50);

    /// End the window now (or at once, when it has not started).
    pub fn stop(&self) {
        self.0.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Whether the window was ended.
    pub fn is_stopped(&self) -> bool {
        self.0.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Sleep `window`, or until stopped; whether it was stopped.
    pub fn sleep(&self, window: Duration) -> bool {
        let until = Instant::now() + window;
        loop {
            if self.is_stopped() {
                return true;
            }
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            std::thread::sleep(left.min(Self::SLICE));
        }
    }

    /// Resolves when stopped (polled every [`Self::SLICE`]).
    pub async fn stopped(self) {
        while !self.is_stopped() {
            tokio::time::sleep(Self::SLICE).await;
        }
    }
}

/// Run one eBPF window on a loaded session and join its flows by socket cookie.
pub fn ebpf_window(session: pstack_ebpf::EbpfSession, window: Duration) -> EbpfWindow {
    ebpf_window_until(session, window, &WindowStop::default())
}

/// [`ebpf_window`], ended early by `stop`.
pub fn ebpf_window_until(
    mut session: pstack_ebpf::EbpfSession,
    window: Duration,
    stop: &WindowStop,
) -> EbpfWindow {
    use pstack_ebpf::TcpSurface;
    let report = match session.run_window_blocking_until(window, |_| {}, stop.clone().stopped()) {
        Ok(r) => r,
        Err(e) => {
            return EbpfWindow::Unavailable {
                status: e.status(),
                message: e.to_string(),
            };
        }
    };
    let Some(agg) = report.tcp.as_ref() else {
        return EbpfWindow::Unavailable {
            status: SurfaceStatus::Unsupported,
            message: "the TCP programs are not loaded in this session".into(),
        };
    };
    let flows = agg
        .flows()
        .iter()
        .filter_map(|f| {
            Some(EbpfFlow {
                cookie: f.sock_cookie?,
                retransmits: f.retransmits,
                resets_sent: f.resets_sent,
                resets_received: f.resets_received,
                last_reset_reason: f
                    .last_reset_reason
                    .map(pstack_ebpf::record::reset_reason_name),
                transitions: f
                    .transitions
                    .iter()
                    .map(|t| format!("{}>{}@{}", t.from.name(), t.to.name(), t.ts_ns))
                    .collect(),
                first_ns: f.first_ns,
                last_ns: f.last_ns,
                resets: agg
                    .events(TcpSurface::Resets)
                    .filter(|e| e.sock_cookie.is_some() && e.sock_cookie == f.sock_cookie)
                    .map(|e| match e.kind {
                        pstack_ebpf::TcpEventKind::ReceiveReset => {
                            ("received".to_string(), e.ts_ns, e.remote.to_string())
                        }
                        _ => ("sent".to_string(), e.ts_ns, e.local.to_string()),
                    })
                    .collect(),
            })
        })
        .collect();
    let digests: Vec<String> = TcpSurface::ALL
        .iter()
        .filter_map(|s| agg.raw(*s).digest())
        .collect();
    let bytes: u64 = TcpSurface::ALL.iter().map(|s| agg.raw(*s).bytes).sum();
    let truncated = TcpSurface::ALL.iter().any(|s| agg.truncated(*s))
        || report.tcp_ctx.lost.iter().any(|l| *l > 0);
    let transient = agg
        .flows()
        .iter()
        .filter(|f| f.transitions.iter().any(|t| t.to.0 == TCP_CLOSE))
        .filter(|f| !f.local.addr.is_unspecified() && f.local.port != 0 && f.remote.port != 0)
        .map(|f| TransientFlow {
            cookie: f.sock_cookie.map(|c| c.to_string()),
            local: SocketAddr::new(f.local.addr, f.local.port),
            remote: SocketAddr::new(f.remote.addr, f.remote.port),
            netns_ino: f.netns_ino,
            opened_in_window: f.transitions.iter().any(|t| {
                t.to.0 == TCP_ESTABLISHED && matches!(t.from.0, TCP_SYN_SENT | TCP_SYN_RECV)
            }),
            first_ns: f.first_ns.to_string(),
            last_ns: f.last_ns.to_string(),
            transitions: f
                .transitions
                .iter()
                .map(|t| format!("{}>{}@{}", t.from.name(), t.to.name(), t.ts_ns))
                .collect(),
            retransmits: f.retransmits,
            resets_sent: f.resets_sent,
            resets_received: f.resets_received,
        })
        .collect();
    EbpfWindow::Flows {
        flows,
        digest: (!digests.is_empty()).then(|| sha256_digest(digests.join("\n").as_bytes())),
        bytes,
        truncated,
        transient,
    }
}
