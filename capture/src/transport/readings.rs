//! Readings of a transport capture that are not samples of the netns: the
//! flow owners' socket options, read through the sockopt helper, and what
//! an unread sample says.

use super::*;

/// What one end of the window produced: the net helper's sample, or why
/// there is none (the status every surface of that end gets).
pub(super) type SampleRead = Result<NetSample, NetHelperFailure>;

/// Leak budget of a one-shot transport capture (unreaped net helpers
/// tolerated before samples are `skipped`).
pub const NET_LEAK_BUDGET: u64 = 4;

/// Default leak journal (`PSTACK_LEAK_JOURNAL` overrides), shared with
/// `pstackctl capture`.
pub const DEFAULT_LEAK_JOURNAL: &str = crate::helpers::leak::DEFAULT_JOURNAL;

/// Most a capture spends around its window: two net-helper samples and the
/// socket-option read, each under [`SURFACE_DEADLINE_MS`], plus helper
/// spawn, kill and reap.
pub const RUN_OVERHEAD: Duration = Duration::from_secs(10);

/// Most descriptors examined when looking for sockets' owners.
pub const MAX_OWNER_SCAN_FDS: usize = 1_000_000;

/// TCP_USER_TIMEOUT / keepalive of every matched socket that has an owner,
/// by socket cookie. The owners are found here (a `/proc/*/fd` scan); the
/// options are read by `pstack-helper --sockopt` under one deadline of
/// [`SURFACE_DEADLINE_MS`] (`pidfd_getfd` can wait, killably, on an owner
/// stuck in execve: the helper is SIGKILLed and the sockets not yet read
/// are `timeout`).
pub(super) fn read_flow_sockopts(
    dump: Option<&TcpDump>,
    config: &SupervisorConfig,
    budget: &LeakBudget,
    subject: &str,
) -> BTreeMap<u64, Timed<Result<SockOpts, SockOptError>>> {
    let mut out = BTreeMap::new();
    let Some(dump) = dump else {
        return out;
    };
    let wanted: std::collections::BTreeSet<u64> = dump
        .sockets
        .iter()
        .filter(|s| s.inode != 0)
        .map(|s| u64::from(s.inode))
        .collect();
    if wanted.is_empty() {
        return out;
    }
    let t = Instant::now();
    let scan = sockopt::find_owners(&wanted, MAX_OWNER_SCAN_FDS);
    let scan_us = t.elapsed().as_micros() as u64;
    let targets: Vec<SockoptTarget> = scan
        .owners
        .iter()
        .map(|(inode, (pid, fd))| SockoptTarget {
            inode: *inode,
            pid: *pid,
            fd: *fd,
        })
        .collect();
    let mut read = crate::helpers::sockopt_helper::read_sockopts(
        &targets,
        config,
        budget,
        subject,
        Duration::from_millis(SURFACE_DEADLINE_MS),
    );
    for s in dump.sockets.iter().filter(|s| s.inode != 0) {
        let ino = u64::from(s.inode);
        let r = read.remove(&ino).unwrap_or(Timed {
            value: Err(SockOptError::NoOwner {
                inode: ino,
                truncated: scan.truncated,
            }),
            elapsed_us: 0,
        });
        out.insert(
            s.cookie,
            Timed {
                value: r.value,
                elapsed_us: r.elapsed_us + scan_us,
            },
        );
    }
    out
}

/// A surface that could not be read, and why.
pub(super) struct Unread {
    pub(super) status: SurfaceStatus,
    pub(super) errno: Option<i32>,
    pub(super) message: String,
    pub(super) elapsed_us: u64,
}

impl Unread {
    pub(super) fn of_helper(f: &NetHelperFailure) -> Unread {
        Unread {
            status: f.status,
            errno: f.cause.errno,
            message: f.cause.message.clone(),
            elapsed_us: f.elapsed_us,
        }
    }
}

/// The sock_diag dump of one end of the window, or why it is missing.
pub(super) fn tcp_of(end: &SampleRead) -> Result<(&TcpDump, u64), Unread> {
    match end {
        Ok(s) => match &s.tcp.value {
            Ok(d) => Ok((d, s.tcp.elapsed_us)),
            Err(err) => Err(Unread {
                status: status_of_errno(err.errno()),
                errno: err.errno(),
                message: err.to_string(),
                elapsed_us: s.tcp.elapsed_us,
            }),
        },
        Err(f) => Err(Unread::of_helper(f)),
    }
}
