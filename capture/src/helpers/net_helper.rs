//! Network-namespace samples through `pstack-helper --net`, under deadlines.
//!
//! Invariants:
//! - **The namespace is pinned up front.** [`NetHelper::open`] opens the
//!   target's namespace file (`/proc/PID/ns/net`, `/run/netns/NAME`) before
//!   anything is spawned or read: a gone PID or a missing name is a typed
//!   [`NetnsError`]. The open file is what every helper of the session
//!   enters (it is passed as descriptor 3), so a PID reused meanwhile cannot
//!   redirect the read, and [`NetHelper::net_ns`] is that file's inode.
//! - **The agent never enters the netns.** Only the helper calls `setns`,
//!   before it confines itself ([`pstack_helper::confine::confine_net`]: only
//!   `CAP_NET_ADMIN`, `no_new_privs`, seccomp with netlink-only `socket`).
//! - **The helper proves where it read.** Each answer carries the inode of
//!   the netns the helper stood in; an answer from any other netns is an
//!   `error`, never evidence.
//! - **Every request carries a deadline, enforced here.** The response is
//!   awaited with `poll(2)` until the deadline ([`HelperProcess`]); a miss
//!   SIGKILLs the helper and waits at most the reap deadline: reaped →
//!   `timeout`; not reaped → `timeout_unreaped_helper`, journaled and charged
//!   to the [`LeakBudget`] exactly as for procfs helpers. The next request gets
//!   a fresh helper; with the budget spent it is `skipped`. Never a hang,
//!   never a made-up value.
//! - **One helper per session while it behaves.** The same helper answers the
//!   window's start and end samples; [`NetHelper::finish`] closes its input
//!   and reaps it (killing and, if need be, journaling it).

use std::fs::File;
use std::time::{Duration, Instant};

use pstack_collectors::net::netns::{self, NetnsError, NetnsTarget};
use pstack_collectors::net::{FlowFilter, NetSample};
use pstack_envelope::{StatusCause, SurfaceStatus};
use pstack_helper::protocol::{
    EXIT_NETNS_DENIED, EXIT_NETNS_FAILED, NET_MAX_FRAME, NetOutcome, NetRequest, NetRequestKind,
    NetResponse, PROTOCOL_VERSION,
};

use super::helper_process::{HelperProcess, Reap, Received};
use super::leak::{HelperIdentity, LeakBudget};
use super::risky::describe_exit;
use crate::process::SupervisorConfig;

/// Why a sample is missing: the status its surfaces get, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetHelperFailure {
    /// `timeout`, `timeout_unreaped_helper`, `skipped` or `error`.
    pub status: SurfaceStatus,
    /// What happened, naming the helper.
    pub cause: StatusCause,
    /// Time from sending the request to giving up, µs.
    pub elapsed_us: u64,
    /// The helper that was leaked, when it could not be reaped.
    pub leaked_helper: Option<HelperIdentity>,
    /// Set when the helper exited because it could not enter the namespace:
    /// no sample of this session can succeed, and the caller should report
    /// it as a namespace error rather than as evidence.
    pub unenterable: Option<Box<NetnsError>>,
}

impl NetHelperFailure {
    fn new(status: SurfaceStatus, message: String, errno: Option<i32>, since: Instant) -> Self {
        NetHelperFailure {
            status,
            cause: StatusCause { errno, message },
            elapsed_us: u64::try_from(since.elapsed().as_micros()).unwrap_or(u64::MAX),
            leaked_helper: None,
            unenterable: None,
        }
    }
}

/// A sample with the time the helper spent on it.
#[derive(Debug, Clone)]
pub struct NetReading {
    /// The readings.
    pub sample: NetSample,
    /// Time inside the helper, µs.
    pub elapsed_us: u64,
}

/// A sampling session in one network namespace.
pub struct NetHelper<'a> {
    config: &'a SupervisorConfig,
    budget: &'a LeakBudget,
    netns: Option<File>,
    path: String,
    net_ns: u64,
    subject: String,
    helper: Option<HelperProcess>,
    seq: u32,
    /// Helpers spawned in this session.
    pub helpers_spawned: u32,
}

impl std::fmt::Debug for NetHelper<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NetHelper")
            .field("path", &self.path)
            .field("net_ns", &self.net_ns)
            .field("helper", &self.helper.as_ref().map(|h| h.identity.pid))
            .field("helpers_spawned", &self.helpers_spawned)
            .finish()
    }
}

impl<'a> NetHelper<'a> {
    /// Open `target`'s namespace file (typed error if it is gone); no helper
    /// is spawned yet. `subject` names the capture in the leak journal.
    pub fn open(
        target: &NetnsTarget,
        config: &'a SupervisorConfig,
        budget: &'a LeakBudget,
        subject: &str,
    ) -> Result<NetHelper<'a>, NetnsError> {
        let path = target.path();
        let (netns, net_ns) = match target {
            NetnsTarget::Current => (None, netns::current_inode()?),
            t => {
                let file = netns::open(t)?;
                let ino = netns::inode_of(&file, &path)?;
                (Some(file), ino)
            }
        };
        Ok(NetHelper {
            config,
            budget,
            netns,
            path,
            net_ns,
            subject: subject.to_string(),
            helper: None,
            seq: 0,
            helpers_spawned: 0,
        })
    }

    /// Inode of the namespace this session reads.
    pub fn net_ns(&self) -> u64 {
        self.net_ns
    }

    fn ensure_helper(&mut self, since: Instant) -> Result<HelperProcess, NetHelperFailure> {
        if let Some(h) = self.helper.take() {
            return Ok(h);
        }
        if self.budget.available() == 0 {
            return Err(NetHelperFailure::new(
                SurfaceStatus::Skipped,
                format!(
                    "leak budget spent: {} unreaped helper(s) of a budget of {} (journal {})",
                    self.budget.in_use(),
                    self.budget.capacity(),
                    self.budget.journal().path().display()
                ),
                None,
                since,
            ));
        }
        let helper = HelperProcess::spawn_net(
            &self.config.helper_path,
            &self.config.boot_id,
            self.netns.as_ref(),
        )
        .map_err(|e| {
            NetHelperFailure::new(
                SurfaceStatus::Error,
                format!(
                    "cannot spawn net helper {}: {e}",
                    self.config.helper_path.display()
                ),
                e.raw_os_error(),
                since,
            )
        })?;
        self.helpers_spawned += 1;
        if let Some(hook) = &self.config.on_helper_spawned {
            hook(&helper.identity);
        }
        Ok(helper)
    }

    /// Kill `helper` after it missed `deadline`; the failure to record.
    fn abandon(
        &self,
        helper: HelperProcess,
        why: &str,
        deadline: Duration,
        since: Instant,
    ) -> NetHelperFailure {
        let identity = helper.identity.clone();
        let d = deadline.as_millis();
        match helper.kill_and_reap(self.config.reap_deadline) {
            Reap::Reaped(_) => NetHelperFailure::new(
                SurfaceStatus::Timeout,
                format!(
                    "{why}: no net sample within {d} ms; net helper pid {} killed and reaped",
                    identity.pid
                ),
                None,
                since,
            ),
            Reap::Unreaped(child) => {
                let journaled =
                    self.budget
                        .charge(child, identity.clone(), "net/sample", &self.subject);
                let journal_note = match journaled {
                    Ok(()) => format!("journaled in {}", self.budget.journal().path().display()),
                    Err(e) => format!("JOURNAL WRITE FAILED: {e}"),
                };
                let mut f = NetHelperFailure::new(
                    SurfaceStatus::TimeoutUnreapedHelper,
                    format!(
                        "{why}: no net sample within {d} ms; net helper pid {} (start_ticks {}) killed but not reaped within {} ms; {journal_note}; leak budget {}/{} left",
                        identity.pid,
                        identity.start_ticks,
                        self.config.reap_deadline.as_millis(),
                        self.budget.available(),
                        self.budget.capacity()
                    ),
                    None,
                    since,
                );
                f.leaked_helper = Some(identity);
                f
            }
        }
    }

    /// Kill `helper` for a reason other than a deadline; an `error` failure.
    fn discard(&self, helper: HelperProcess, message: String, since: Instant) -> NetHelperFailure {
        let identity = helper.identity.clone();
        if let Reap::Unreaped(child) = helper.kill_and_reap(self.config.reap_deadline) {
            let _ = self
                .budget
                .charge(child, identity, "net/sample", &self.subject);
        }
        NetHelperFailure::new(SurfaceStatus::Error, message, None, since)
    }

    /// One sample of the session's netns, keeping sockets that match
    /// `filter`, answered within `deadline` or failed with a status.
    pub fn sample(
        &mut self,
        filter: &FlowFilter,
        deadline: Duration,
    ) -> Result<NetReading, NetHelperFailure> {
        let since = Instant::now();
        let mut helper = self.ensure_helper(since)?;
        self.seq = self.seq.wrapping_add(1);
        let request = NetRequest {
            version: PROTOCOL_VERSION,
            seq: self.seq,
            kind: NetRequestKind::Sample {
                filter: filter.clone(),
            },
            deadline_ms: u64::try_from(deadline.as_millis())
                .unwrap_or(u64::MAX)
                .max(1),
        };
        let until = since + deadline;
        match helper.send_message(&request, until) {
            Ok(true) => {}
            Ok(false) => {
                return Err(self.abandon(
                    helper,
                    "the net helper did not accept its request before the deadline",
                    deadline,
                    since,
                ));
            }
            Err(e) => {
                let status = helper.wait_exit(self.config.reap_deadline);
                let message = format!(
                    "sending the request failed ({e}); {}",
                    describe_exit(status)
                );
                let mut f = self.discard(helper, message, since);
                f.unenterable = self.unenterable(status.and_then(|s| s.code()));
                return Err(f);
            }
        }
        match helper.next_message::<NetResponse>(until, NET_MAX_FRAME) {
            Received::Response(resp) if resp.seq == self.seq => match resp.outcome {
                NetOutcome::Sample { net_ns, sample } if net_ns == self.net_ns => {
                    self.helper = Some(helper);
                    Ok(NetReading {
                        sample: *sample,
                        elapsed_us: resp.elapsed_us,
                    })
                }
                NetOutcome::Sample { net_ns, .. } => Err(self.discard(
                    helper,
                    format!(
                        "the net helper read netns {net_ns}, not {} ({}): its readings are not evidence of the target",
                        self.net_ns, self.path
                    ),
                    since,
                )),
                NetOutcome::Refused { reason } => {
                    self.helper = Some(helper);
                    Err(NetHelperFailure::new(
                        SurfaceStatus::Error,
                        format!("net helper refused: {reason}"),
                        None,
                        since,
                    ))
                }
            },
            Received::Response(resp) => Err(self.discard(
                helper,
                format!(
                    "protocol violation: got answer {} while {} was in flight",
                    resp.seq, self.seq
                ),
                since,
            )),
            Received::Protocol(e) => {
                Err(self.discard(helper, format!("protocol violation: {e}"), since))
            }
            Received::Timeout => Err(self.abandon(helper, "deadline missed", deadline, since)),
            Received::Closed => {
                let status = helper.wait_exit(self.config.reap_deadline);
                let message = format!("{} while sampling {}", describe_exit(status), self.path);
                if status.is_none() {
                    Err(self.abandon(helper, &message, deadline, since))
                } else {
                    drop(helper); // exited and reaped by wait_exit
                    let mut f = NetHelperFailure::new(SurfaceStatus::Error, message, None, since);
                    f.unenterable = self.unenterable(status.and_then(|s| s.code()));
                    Err(f)
                }
            }
        }
    }

    /// The namespace error an exit code of the helper stands for.
    fn unenterable(&self, code: Option<i32>) -> Option<Box<NetnsError>> {
        let message = "pstack-helper --net could not enter it (its stderr has the kernel's reason)";
        let error = match code? {
            EXIT_NETNS_DENIED => NetnsError::PermissionDenied {
                op: "setns (in pstack-helper --net)",
                path: self.path.clone(),
                errno: libc::EPERM,
            },
            EXIT_NETNS_FAILED => NetnsError::Os {
                op: "setns (in pstack-helper --net)",
                path: self.path.clone(),
                errno: 0,
                message: message.into(),
            },
            _ => return None,
        };
        Some(Box::new(error))
    }

    /// End the session: close the helper's input, let it exit, reap it
    /// (SIGKILL after the reap deadline; journaled and charged if even that
    /// does not take).
    pub fn finish(mut self) {
        if let Some(mut helper) = self.helper.take() {
            helper.close_input();
            let identity = helper.identity.clone();
            let reap = self.config.reap_deadline;
            if helper.wait_exit(reap).is_none()
                && let Reap::Unreaped(child) = helper.kill_and_reap(reap)
            {
                let _ = self
                    .budget
                    .charge(child, identity, "<after net samples>", &self.subject);
            }
        }
    }
}

impl Drop for NetHelper<'_> {
    fn drop(&mut self) {
        // A session dropped without finish (an early return): never leave a
        // helper behind.
        if let Some(helper) = self.helper.take() {
            let _ = helper.kill_and_reap(self.config.reap_deadline);
        }
    }
}
