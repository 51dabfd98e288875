//! The socket-option reader (`pstack-helper --sockopt`): `pidfd_open` +
//! `pidfd_getfd` + `getsockopt(TCP_USER_TIMEOUT, SO_KEEPALIVE,
//! TCP_KEEPIDLE/INTVL/CNT)` of sockets other processes own, in a killable
//! child under its own profile ([`crate::confine::Profile::Sockopt`]).
//!
//! Why a helper: `pidfd_getfd` takes the owner's `exec_update_lock`
//! (killably) and waits on an owner stuck in execve; a thread abandoned in
//! the agent is not a deadline, a process the agent SIGKILLs is.
//!
//! Invariants:
//! - **One answer per target, in request order, as each completes**: the
//!   agent knows which target is in flight from how many answers it has, so
//!   a missed deadline costs that target and the ones after it, never the
//!   answers already received.
//! - **Bounded.** At most [`MAX_TARGETS`] targets per request; every request
//!   carries a non-zero deadline (enforced by the agent; refused here when
//!   absent).
//! - **Nothing but the options.** The helper never reads the filesystem (its
//!   seccomp list has no `open` of any kind; the owner's `comm` is read by
//!   the agent), and the duplicated descriptor is closed as soon as its options
//!   are read: it is never written, sent on or configured (`write` only to
//!   the response pipe, no `sendto`/`setsockopt` in its seccomp list).

use std::io::{Read, Write};
use std::time::Instant;

use pstack_collectors::net::sockopt::{self, SockOptError};
use serde::{Deserialize, Serialize};

use crate::protocol::{FrameError, MAX_FRAME, PROTOCOL_VERSION, read_frame, write_frame};

/// Most targets in one request.
pub const MAX_TARGETS: usize = 4096;

/// A batch of sockets whose options to read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SockoptRequest {
    /// Must be [`PROTOCOL_VERSION`].
    pub version: u32,
    /// The agent's deadline for the whole batch, ms (non-zero).
    pub deadline_ms: u64,
    /// The sockets, by owner and descriptor (found by the agent's owner scan).
    pub targets: Vec<SockoptTarget>,
}

/// One socket: its inode and where an owner holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SockoptTarget {
    /// Socket inode (echoed).
    pub inode: u64,
    /// Owning process.
    pub pid: u32,
    /// The owner's descriptor number.
    pub fd: i32,
}

/// The answer for one target.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SockoptAnswer {
    /// The target's inode.
    pub inode: u64,
    /// What was read.
    pub outcome: SockoptOutcome,
    /// Time in the helper, µs.
    pub elapsed_us: u64,
}

/// The options of one socket, or why not.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case", deny_unknown_fields)]
pub enum SockoptOutcome {
    /// Read.
    Ok {
        /// `TCP_USER_TIMEOUT`, ms.
        user_timeout_ms: u32,
        /// `SO_KEEPALIVE`.
        keepalive: bool,
        /// `TCP_KEEPIDLE`, s.
        keepidle_s: i32,
        /// `TCP_KEEPINTVL`, s.
        keepintvl_s: i32,
        /// `TCP_KEEPCNT`.
        keepcnt: i32,
    },
    /// The owner exited (or closed the descriptor).
    OwnerGone,
    /// A call was refused (ptrace rights, Yama).
    PermissionDenied {
        /// The call.
        op: String,
        /// errno.
        errno: i32,
    },
    /// The kernel lacks the call.
    Unsupported {
        /// The call.
        op: String,
        /// errno.
        errno: i32,
    },
    /// Anything else.
    Os {
        /// The call.
        op: String,
        /// errno.
        errno: i32,
        /// Description.
        message: String,
    },
    /// The request was refused whole (only ever the first answer).
    Refused {
        /// Why.
        reason: String,
    },
}

/// Why a request is refused before any read, or `None`.
pub fn refusal(req: &SockoptRequest) -> Option<String> {
    if req.version != PROTOCOL_VERSION {
        return Some(format!(
            "protocol version {} is not {PROTOCOL_VERSION}",
            req.version
        ));
    }
    if req.deadline_ms == 0 {
        return Some("no deadline: every socket-option read must carry one".into());
    }
    if req.targets.len() > MAX_TARGETS {
        return Some(format!(
            "{} targets exceed the cap of {MAX_TARGETS}",
            req.targets.len()
        ));
    }
    if let Some(t) = req.targets.iter().find(|t| t.pid == 0 || t.fd < 0) {
        return Some(format!("target {t:?} names no process or descriptor"));
    }
    None
}

/// Read one target's options (the collectors' one implementation, without
/// the owner's `comm`, which this helper may not read).
pub fn read_one(t: &SockoptTarget) -> SockoptOutcome {
    match sockopt::read_socket_options(t.pid, t.fd) {
        Ok(o) => SockoptOutcome::Ok {
            user_timeout_ms: o.user_timeout_ms,
            keepalive: o.keepalive,
            keepidle_s: o.keepidle_s,
            keepintvl_s: o.keepintvl_s,
            keepcnt: o.keepcnt,
        },
        Err(SockOptError::OwnerGone { .. }) => SockoptOutcome::OwnerGone,
        Err(SockOptError::PermissionDenied { op, errno, .. }) => SockoptOutcome::PermissionDenied {
            op: op.into(),
            errno,
        },
        Err(SockOptError::Unsupported { op, errno }) => SockoptOutcome::Unsupported {
            op: op.into(),
            errno,
        },
        Err(SockOptError::Os { op, errno, message }) => SockoptOutcome::Os {
            op: op.into(),
            errno,
            message,
        },
        Err(e @ (SockOptError::NoOwner { .. } | SockOptError::Abandoned { .. })) => {
            SockoptOutcome::Os {
                op: "read".into(),
                errno: 0,
                message: e.to_string(),
            }
        }
    }
}

/// Serve socket-option requests until EOF: one [`SockoptAnswer`] frame per
/// target (one `Refused` answer for a refused request).
pub fn serve(input: &mut impl Read, output: &mut impl Write) -> Result<(), FrameError> {
    while let Some(req) = read_frame::<SockoptRequest>(input, MAX_FRAME)? {
        if let Some(reason) = refusal(&req) {
            let answer = SockoptAnswer {
                inode: 0,
                outcome: SockoptOutcome::Refused { reason },
                elapsed_us: 0,
            };
            write_frame(output, &answer, MAX_FRAME)?;
            output.flush().map_err(|e| FrameError::Io(e.to_string()))?;
            continue;
        }
        for t in &req.targets {
            let started = Instant::now();
            let outcome = read_one(t);
            let answer = SockoptAnswer {
                inode: t.inode,
                outcome,
                elapsed_us: u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX),
            };
            write_frame(output, &answer, MAX_FRAME)?;
            output.flush().map_err(|e| FrameError::Io(e.to_string()))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_without_deadline_or_past_the_cap_are_refused() {
        let t = SockoptTarget {
            inode: 1,
            pid: 1,
            fd: 3,
        };
        let ok = SockoptRequest {
            version: PROTOCOL_VERSION,
            deadline_ms: 10,
            targets: vec![t],
        };
        assert_eq!(refusal(&ok), None);
        for bad in [
            SockoptRequest {
                deadline_ms: 0,
                ..ok.clone()
            },
            SockoptRequest {
                version: 99,
                ..ok.clone()
            },
            SockoptRequest {
                targets: vec![t; MAX_TARGETS + 1],
                ..ok.clone()
            },
            SockoptRequest {
                targets: vec![SockoptTarget { pid: 0, ..t }],
                ..ok.clone()
            },
        ] {
            assert!(refusal(&bad).is_some(), "{bad:?}");
        }
    }

    #[test]
    fn serves_one_answer_per_target_in_order() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        use std::os::fd::AsRawFd;
        let req = SockoptRequest {
            version: PROTOCOL_VERSION,
            deadline_ms: 1000,
            targets: vec![
                SockoptTarget {
                    inode: 7,
                    pid: std::process::id(),
                    fd: c.as_raw_fd(),
                },
                SockoptTarget {
                    inode: 8,
                    pid: std::process::id(),
                    fd: 1_000_000,
                },
            ],
        };
        let input = crate::protocol::encode(&req, MAX_FRAME).unwrap();
        let mut out = Vec::new();
        serve(&mut input.as_slice(), &mut out).unwrap();
        let mut r = out.as_slice();
        let a: SockoptAnswer = read_frame(&mut r, MAX_FRAME).unwrap().unwrap();
        let b: SockoptAnswer = read_frame(&mut r, MAX_FRAME).unwrap().unwrap();
        assert_eq!((a.inode, b.inode), (7, 8));
        assert!(
            matches!(
                a.outcome,
                SockoptOutcome::Ok { .. }
                    | SockoptOutcome::PermissionDenied { .. }
                    | SockoptOutcome::Unsupported { .. }
            ),
            "{a:?}"
        );
        assert_eq!(b.outcome, SockoptOutcome::OwnerGone, "a closed descriptor");
        assert!(
            read_frame::<SockoptAnswer>(&mut r, MAX_FRAME)
                .unwrap()
                .is_none()
        );
    }
}
