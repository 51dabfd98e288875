//! TCP_USER_TIMEOUT and keepalive settings of a socket, read from its owner.
//!
//! sock_diag does not expose socket options. To read them we find the process
//! holding the socket (a bounded scan of `/proc/*/fd` for `socket:[INODE]`),
//! duplicate that descriptor into this process with `pidfd_getfd(2)` (Linux
//! 5.6+, needs ptrace-attach rights over the owner: root, subject to Yama),
//! call `getsockopt`, and close the duplicate. The owner's socket is never
//! written to, its file offset and flags are untouched, and closing our
//! duplicate does not close the connection.
//!
//! Invariants:
//! - **Bounded scan.** At most `max_fds` descriptors are examined; a scan cut
//!   by the cap says so ([`OwnerScan::truncated`]).
//! - **Typed absence.** An orphaned socket (no owner, inode 0), an owner that
//!   exited, a refused `pidfd_getfd` and a kernel without the syscall are
//!   distinct [`SockOptError`]s, never zeros.
//! - **The duplicate never outlives the read** (an `OwnedFd`).

use std::collections::{BTreeMap, BTreeSet};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use serde::Serialize;

/// Options read from one socket.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SockOpts {
    /// Owning process.
    pub owner_pid: u32,
    /// The owner's descriptor number.
    pub fd: i32,
    /// Owner's `comm`.
    pub owner_comm: String,
    /// `TCP_USER_TIMEOUT`, ms (0 = kernel default: retransmissions decide).
    pub user_timeout_ms: u32,
    /// `SO_KEEPALIVE`.
    pub keepalive: bool,
    /// `TCP_KEEPIDLE`, s.
    pub keepidle_s: i32,
    /// `TCP_KEEPINTVL`, s.
    pub keepintvl_s: i32,
    /// `TCP_KEEPCNT`.
    pub keepcnt: i32,
}

/// Why options could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SockOptError {
    /// No process holds the socket (orphaned, TIME_WAIT, or the scan cap hit).
    #[error("no process holds socket inode {inode}{}", if *truncated { " among the descriptors scanned (cap reached)" } else { "" })]
    NoOwner {
        /// Socket inode.
        inode: u64,
        /// Whether the scan was cut by its cap.
        truncated: bool,
    },
    /// The owner exited between the scan and the read.
    #[error("owner {pid} of the socket exited")]
    OwnerGone {
        /// PID.
        pid: u32,
    },
    /// `pidfd_getfd` was refused (ptrace rights, Yama).
    #[error("{op} on pid {pid} refused (errno {errno})")]
    PermissionDenied {
        /// Syscall.
        op: &'static str,
        /// PID.
        pid: u32,
        /// errno.
        errno: i32,
    },
    /// The kernel lacks `pidfd_open`/`pidfd_getfd`.
    #[error("{op} is not available in this kernel (errno {errno})")]
    Unsupported {
        /// Syscall.
        op: &'static str,
        /// errno.
        errno: i32,
    },
    /// The caller stopped waiting (`pidfd_getfd` takes the owner's
    /// `exec_update_lock` killably and can wait on an owner stuck in execve).
    /// Never produced by the readers here; set by a caller that enforces a
    /// deadline around them.
    #[error("abandoned after {deadline_ms} ms without an answer")]
    Abandoned {
        /// The caller's deadline.
        deadline_ms: u64,
    },
    /// Anything else.
    #[error("{op}: {message} (errno {errno})")]
    Os {
        /// Syscall.
        op: &'static str,
        /// errno.
        errno: i32,
        /// Description.
        message: String,
    },
}

/// `socket:[12345]` → 12345.
pub fn parse_socket_link(target: &str) -> Option<u64> {
    target
        .strip_prefix("socket:[")?
        .strip_suffix(']')?
        .parse()
        .ok()
}

/// Owners found by a scan.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OwnerScan {
    /// inode → (pid, fd).
    pub owners: BTreeMap<u64, (u32, i32)>,
    /// Descriptors examined.
    pub scanned: usize,
    /// The cap cut the scan.
    pub truncated: bool,
}

/// Find the processes holding the socket `inodes` (first holder wins).
pub fn find_owners(inodes: &BTreeSet<u64>, max_fds: usize) -> OwnerScan {
    let mut scan = OwnerScan::default();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return scan;
    };
    'procs: for p in procs.flatten() {
        let Some(pid) = p.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
            continue;
        };
        for f in fds.flatten() {
            if scan.scanned >= max_fds {
                scan.truncated = true;
                break 'procs;
            }
            scan.scanned += 1;
            let Some(fd) = f.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
                continue;
            };
            if let Ok(t) = std::fs::read_link(f.path())
                && let Some(ino) = t.to_str().and_then(parse_socket_link)
                && inodes.contains(&ino)
            {
                scan.owners.entry(ino).or_insert((pid, fd));
                if scan.owners.len() == inodes.len() {
                    break 'procs;
                }
            }
        }
    }
    scan
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

fn opt(fd: &OwnedFd, level: i32, name: i32) -> Result<i32, SockOptError> {
    let mut v: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: fd is a live descriptor; v and len are valid for the kernel to write.
    let rc = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            level,
            name,
            (&mut v as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        let e = errno();
        return Err(SockOptError::Os {
            op: "getsockopt",
            errno: e,
            message: std::io::Error::from_raw_os_error(e).to_string(),
        });
    }
    Ok(v)
}

/// [`read_socket_options`] plus the owner's `comm` (redacted), read from
/// `/proc/PID/comm`.
pub fn read_sockopts(pid: u32, fd: i32) -> Result<SockOpts, SockOptError> {
    let mut o = read_socket_options(pid, fd)?;
    o.owner_comm = owner_comm(pid);
    Ok(o)
}

/// The owner's `comm`, redacted (empty when unreadable).
pub fn owner_comm(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .map(|s| pstack_envelope::redact_text(s.trim()).into_owned())
        .unwrap_or_default()
}

/// Read the options of descriptor `fd` of process `pid`.
/// Reads no file: `owner_comm` is left empty (see [`read_sockopts`]).
pub fn read_socket_options(pid: u32, fd: i32) -> Result<SockOpts, SockOptError> {
    let classify = |op: &'static str, e: i32| match e {
        libc::ESRCH => SockOptError::OwnerGone { pid },
        libc::EPERM | libc::EACCES => SockOptError::PermissionDenied { op, pid, errno: e },
        libc::ENOSYS => SockOptError::Unsupported { op, errno: e },
        _ => SockOptError::Os {
            op,
            errno: e,
            message: std::io::Error::from_raw_os_error(e).to_string(),
        },
    };
    // SAFETY: pidfd_open(pid, 0) has no memory arguments; the result is checked.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::c_int, 0) };
    if pidfd < 0 {
        return Err(classify("pidfd_open", errno()));
    }
    // SAFETY: pidfd is a fresh descriptor we own.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd as i32) };
    // SAFETY: pidfd_getfd(pidfd, fd, 0) has no memory arguments; the result is checked.
    let dup = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), fd, 0) };
    if dup < 0 {
        let e = errno();
        // EBADF: the owner closed that descriptor meanwhile.
        return Err(if e == libc::EBADF {
            SockOptError::OwnerGone { pid }
        } else {
            classify("pidfd_getfd", e)
        });
    }
    // SAFETY: dup is a fresh descriptor (our duplicate) that we own and close on drop.
    let dup = unsafe { OwnedFd::from_raw_fd(dup as i32) };
    Ok(SockOpts {
        owner_pid: pid,
        fd,
        owner_comm: String::new(),
        user_timeout_ms: opt(&dup, libc::IPPROTO_TCP, libc::TCP_USER_TIMEOUT)? as u32,
        keepalive: opt(&dup, libc::SOL_SOCKET, libc::SO_KEEPALIVE)? != 0,
        keepidle_s: opt(&dup, libc::IPPROTO_TCP, libc::TCP_KEEPIDLE)?,
        keepintvl_s: opt(&dup, libc::IPPROTO_TCP, libc::TCP_KEEPINTVL)?,
        keepcnt: opt(&dup, libc::IPPROTO_TCP, libc::TCP_KEEPCNT)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socket_links_parse_and_others_do_not() {
        assert_eq!(parse_socket_link("socket:[4026532]"), Some(4026532));
        for bad in [
            "pipe:[5]",
            "socket:[x]",
            "socket:[5",
            "/dev/null",
            "socket:[]",
        ] {
            assert_eq!(parse_socket_link(bad), None, "{bad}");
        }
    }

    #[test]
    fn reads_own_socket_options_through_pidfd() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let v: libc::c_int = 12_345;
        // SAFETY: valid fd and option pointer/length.
        unsafe {
            libc::setsockopt(
                c.as_raw_fd(),
                libc::IPPROTO_TCP,
                libc::TCP_USER_TIMEOUT,
                (&v as *const libc::c_int).cast(),
                4,
            )
        };
        let ino = std::fs::metadata(format!("/proc/self/fd/{}", c.as_raw_fd()))
            .map(|m| std::os::unix::fs::MetadataExt::ino(&m))
            .unwrap();
        let scan = find_owners(&BTreeSet::from([ino]), 1_000_000);
        let (pid, fd) = scan.owners[&ino];
        assert_eq!(pid, std::process::id());
        match read_sockopts(pid, fd) {
            Ok(o) => {
                assert_eq!(o.user_timeout_ms, 12_345);
                assert!(!o.keepalive);
            }
            // Only where the kernel or Yama forbids it; say so.
            Err(e @ (SockOptError::Unsupported { .. } | SockOptError::PermissionDenied { .. })) => {
                eprintln!("SKIP pidfd_getfd: {e}")
            }
            Err(e) => panic!("{e}"),
        }
    }

    #[test]
    fn a_gone_owner_is_typed() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        assert!(matches!(
            read_sockopts(pid, 0),
            Err(SockOptError::OwnerGone { .. })
        ));
    }
}
