//! Limits and defaults both ends of the socket rely on.

use std::time::Duration;

/// Default path of pstackd's socket.
pub const DEFAULT_SOCKET: &str = "/run/pstack/pstackd.sock";

/// How far past its run deadline a capture may go before pstackd gives up
/// on it (504 `deadline_exceeded`); a client waits at least the run deadline
/// plus this before it calls the daemon unresponsive.
pub const OVERRUN_GRACE: Duration = Duration::from_secs(2);

/// Largest response a client reads (an envelope, a status document, one
/// event line).
pub const MAX_RESPONSE_BYTES: usize = 64 << 20;
