//! Socket options (`tcp/sockopt`) through `pstack-helper --sockopt`, under
//! one deadline.
//!
//! Invariants:
//! - **The agent never calls `pidfd_getfd`.** It finds each socket's owner
//!   (a `/proc/*/fd` scan) and reads the owner's `comm`; the helper, confined
//!   to `CAP_SYS_PTRACE`, no filesystem and a seccomp list of `pidfd_open`,
//!   `pidfd_getfd` and five `getsockopt` options, reads the options.
//! - **Every read is under the deadline, enforced here.** Answers come one
//!   per target in request order and are awaited with `poll(2)` until the
//!   deadline ([`HelperProcess`]); a miss SIGKILLs the helper: the target in
//!   flight and the ones after it are `Abandoned` (→ `timeout`), the answers
//!   already received are kept. A helper that will not be reaped is
//!   journaled and charged to the [`LeakBudget`] like every other helper;
//!   with the budget spent nothing is spawned and every target says why.
//! - **Never a made-up value**: an answer for a target other than the one in
//!   flight, a malformed frame or a helper that died ends the read; what is
//!   missing says why.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use pstack_collectors::net::sample::Timed;
use pstack_collectors::net::sockopt::{SockOptError, SockOpts, owner_comm};
use pstack_helper::protocol::{MAX_FRAME, PROTOCOL_VERSION};
use pstack_helper::sockopt::{SockoptAnswer, SockoptOutcome, SockoptRequest, SockoptTarget};

use super::helper_process::{HelperProcess, Reap, Received};
use super::leak::LeakBudget;
use super::risky::describe_exit;
use crate::process::SupervisorConfig;

/// The result of one socket.
pub type SockoptReading = Timed<Result<SockOpts, SockOptError>>;

/// The name every failure of the helper itself carries as its `op`.
const OP: &str = "pstack-helper --sockopt";

fn failed(message: String, errno: i32, elapsed_us: u64) -> SockoptReading {
    Timed {
        value: Err(SockOptError::Os {
            op: OP,
            errno,
            message,
        }),
        elapsed_us,
    }
}

/// The helper's answer as the collectors' types; `comm` read here.
fn reading(t: &SockoptTarget, a: SockoptAnswer) -> SockoptReading {
    let static_op = |op: &str| -> &'static str {
        match op {
            "pidfd_open" => "pidfd_open",
            "pidfd_getfd" => "pidfd_getfd",
            "getsockopt" => "getsockopt",
            _ => OP,
        }
    };
    let value = match a.outcome {
        SockoptOutcome::Ok {
            user_timeout_ms,
            keepalive,
            keepidle_s,
            keepintvl_s,
            keepcnt,
        } => Ok(SockOpts {
            owner_pid: t.pid,
            fd: t.fd,
            owner_comm: owner_comm(t.pid),
            user_timeout_ms,
            keepalive,
            keepidle_s,
            keepintvl_s,
            keepcnt,
        }),
        SockoptOutcome::OwnerGone => Err(SockOptError::OwnerGone { pid: t.pid }),
        SockoptOutcome::PermissionDenied { op, errno } => Err(SockOptError::PermissionDenied {
            op: static_op(&op),
            pid: t.pid,
            errno,
        }),
        SockoptOutcome::Unsupported { op, errno } => Err(SockOptError::Unsupported {
            op: static_op(&op),
            errno,
        }),
        SockoptOutcome::Os { op, errno, message } => Err(SockOptError::Os {
            op: static_op(&op),
            errno,
            message,
        }),
        SockoptOutcome::Refused { reason } => Err(SockOptError::Os {
            op: OP,
            errno: 0,
            message: format!("the helper refused the request: {reason}"),
        }),
    };
    Timed {
        value,
        elapsed_us: a.elapsed_us,
    }
}

/// Read the options of every target (by socket inode) in one
/// `pstack-helper --sockopt`, all within `deadline`. `subject` names the
/// capture in the leak journal.
pub fn read_sockopts(
    targets: &[SockoptTarget],
    config: &SupervisorConfig,
    budget: &LeakBudget,
    subject: &str,
    deadline: Duration,
) -> BTreeMap<u64, SockoptReading> {
    let mut out = BTreeMap::new();
    if targets.is_empty() {
        return out;
    }
    let since = Instant::now();
    let elapsed = || u64::try_from(since.elapsed().as_micros()).unwrap_or(u64::MAX);
    let rest_fail =
        |out: &mut BTreeMap<u64, SockoptReading>, from: usize, r: &dyn Fn() -> SockoptReading| {
            for t in &targets[from..] {
                out.insert(t.inode, r());
            }
        };
    if budget.available() == 0 {
        let message = format!(
            "not read: leak budget spent ({} unreaped helper(s) of {}, journal {})",
            budget.in_use(),
            budget.capacity(),
            budget.journal().path().display()
        );
        rest_fail(&mut out, 0, &|| failed(message.clone(), 0, 0));
        return out;
    }
    let mut helper = match HelperProcess::spawn_sockopt(&config.helper_path, &config.boot_id) {
        Ok(h) => h,
        Err(e) => {
            let message = format!("cannot spawn {}: {e}", config.helper_path.display());
            let errno = e.raw_os_error().unwrap_or(0);
            rest_fail(&mut out, 0, &|| failed(message.clone(), errno, 0));
            return out;
        }
    };
    if let Some(hook) = &config.on_helper_spawned {
        hook(&helper.identity);
    }
    let until = since + deadline;
    let request = SockoptRequest {
        version: PROTOCOL_VERSION,
        deadline_ms: u64::try_from(deadline.as_millis())
            .unwrap_or(u64::MAX)
            .max(1),
        targets: targets.to_vec(),
    };
    let abandoned = |d: Duration| {
        move || Timed {
            value: Err(SockOptError::Abandoned {
                deadline_ms: u64::try_from(d.as_millis()).unwrap_or(u64::MAX),
            }),
            elapsed_us: u64::try_from(d.as_micros()).unwrap_or(u64::MAX),
        }
    };
    // Kill the helper (on a deadline or a violation); charge it if it stays.
    let kill = |helper: HelperProcess| -> Option<String> {
        let identity = helper.identity.clone();
        match helper.kill_and_reap(config.reap_deadline) {
            Reap::Reaped(_) => None,
            Reap::Unreaped(child) => {
                let journaled = budget.charge(child, identity.clone(), "tcp/sockopt", subject);
                Some(format!(
                    "sockopt helper pid {} killed but not reaped within {} ms; {}",
                    identity.pid,
                    config.reap_deadline.as_millis(),
                    match journaled {
                        Ok(()) => format!("journaled in {}", budget.journal().path().display()),
                        Err(e) => format!("JOURNAL WRITE FAILED: {e}"),
                    }
                ))
            }
        }
    };
    match helper.send_message(&request, until) {
        Ok(true) => {}
        Ok(false) => {
            let _ = kill(helper);
            rest_fail(&mut out, 0, &abandoned(deadline));
            return out;
        }
        Err(e) => {
            let status = helper.wait_exit(config.reap_deadline);
            let message = format!(
                "sending the request failed ({e}); {}",
                describe_exit(status)
            );
            if status.is_none() {
                let _ = kill(helper);
            }
            rest_fail(&mut out, 0, &|| failed(message.clone(), 0, elapsed()));
            return out;
        }
    }
    for (i, t) in targets.iter().enumerate() {
        match helper.next_message::<SockoptAnswer>(until, MAX_FRAME) {
            Received::Response(a) if a.inode == t.inode => {
                out.insert(t.inode, reading(t, a));
            }
            Received::Response(a)
                if matches!(a.outcome, SockoptOutcome::Refused { .. }) && i == 0 =>
            {
                for t in targets {
                    out.insert(t.inode, reading(t, a.clone()));
                }
                break;
            }
            Received::Response(a) => {
                let message = format!(
                    "protocol violation: an answer for socket {} while {} was in flight",
                    a.inode, t.inode
                );
                let _ = kill(helper);
                rest_fail(&mut out, i, &|| failed(message.clone(), 0, elapsed()));
                return out;
            }
            Received::Protocol(e) => {
                let message = format!("protocol violation: {e}");
                let _ = kill(helper);
                rest_fail(&mut out, i, &|| failed(message.clone(), 0, elapsed()));
                return out;
            }
            Received::Timeout => {
                let _ = kill(helper);
                rest_fail(&mut out, i, &abandoned(deadline));
                return out;
            }
            Received::Closed => {
                let status = helper.wait_exit(config.reap_deadline);
                let message = describe_exit(status);
                if status.is_none() {
                    let _ = kill(helper);
                }
                rest_fail(&mut out, i, &|| failed(message.clone(), 0, elapsed()));
                return out;
            }
        }
    }
    helper.close_input();
    if helper.wait_exit(config.reap_deadline).is_none() {
        let _ = kill(helper);
    }
    out
}
