//! `sd_notify`: readiness, watchdog, stopping and status messages to systemd.
//!
//! Invariants:
//! - Messages go to the datagram socket named by `NOTIFY_SOCKET` (a path, or
//!   `@name` for the abstract namespace); without it every call is a no-op, so
//!   the daemon runs the same outside systemd.
//! - The watchdog interval honours `WATCHDOG_USEC` only when `WATCHDOG_PID` is
//!   absent or equals our PID (the variable may be inherited by mistake). We
//!   ping at half the interval, from a task on the main runtime: a wedged
//!   runtime (or a stopped process) stops pinging, which is the point.
//! - Sending never blocks and never fails the daemon: a lost notification is
//!   logged at debug level.

use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::time::Duration;

/// A handle to systemd's notification socket (or nothing).
#[derive(Debug)]
pub struct Notifier {
    target: Option<(UnixDatagram, SocketAddr)>,
    watchdog: Option<Duration>,
}

impl Notifier {
    /// Read `NOTIFY_SOCKET`, `WATCHDOG_USEC` and `WATCHDOG_PID`.
    pub fn from_env() -> Notifier {
        let target = std::env::var_os("NOTIFY_SOCKET").and_then(|path| {
            let bytes = path.as_encoded_bytes();
            let addr = if let Some(name) = bytes.strip_prefix(b"@") {
                use std::os::linux::net::SocketAddrExt;
                SocketAddr::from_abstract_name(name).ok()?
            } else {
                SocketAddr::from_pathname(std::path::Path::new(&path)).ok()?
            };
            let sock = UnixDatagram::unbound().ok()?;
            sock.set_nonblocking(true).ok()?;
            Some((sock, addr))
        });
        let pid_ok = match std::env::var("WATCHDOG_PID") {
            Ok(p) => p.trim().parse::<u32>().ok() == Some(std::process::id()),
            Err(_) => true,
        };
        let watchdog = std::env::var("WATCHDOG_USEC")
            .ok()
            .and_then(|u| u.trim().parse::<u64>().ok())
            .filter(|&u| u > 0 && pid_ok)
            .map(Duration::from_micros);
        Notifier { target, watchdog }
    }

    /// Whether a notification socket is configured.
    pub fn enabled(&self) -> bool {
        self.target.is_some()
    }

    /// The watchdog interval systemd expects, if any.
    pub fn watchdog_interval(&self) -> Option<Duration> {
        self.watchdog
    }

    /// Send one datagram of newline-separated `KEY=VALUE` assignments.
    pub fn send(&self, message: &str) {
        if let Some((sock, addr)) = &self.target
            && let Err(e) = sock.send_to_addr(message.as_bytes(), addr)
        {
            tracing::debug!(error = %e, "sd_notify send failed");
        }
    }

    /// `READY=1` with a status line.
    pub fn ready(&self, status: &str) {
        self.send(&format!(
            "READY=1\nSTATUS={}\nMAINPID={}",
            one_line(status),
            std::process::id()
        ));
    }

    /// `WATCHDOG=1`.
    pub fn watchdog(&self) {
        self.send("WATCHDOG=1");
    }

    /// `STOPPING=1` with a status line.
    pub fn stopping(&self, status: &str) {
        self.send(&format!("STOPPING=1\nSTATUS={}", one_line(status)));
    }

    /// `RELOADING=1` (with `MONOTONIC_USEC`, as `Type=notify-reload` wants)
    /// then, after the reload, `READY=1`.
    pub fn reloading(&self) {
        let usec = pstack_capture::clock::monotonic_ns() / 1_000;
        self.send(&format!("RELOADING=1\nMONOTONIC_USEC={usec}"));
    }

    /// A `STATUS=` line.
    pub fn status(&self, status: &str) {
        self.send(&format!("STATUS={}", one_line(status)));
    }
}

fn one_line(s: &str) -> String {
    s.replace(['\n', '\r'], " ")
}
