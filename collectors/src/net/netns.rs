//! Entering a target network namespace.
//!
//! `setns(2)` with `CLONE_NEWNET` changes the namespace of the *calling
//! thread* only. Two ways to use it:
//! - [`enter`]: the calling thread itself moves. `pstack-helper --net` calls
//!   it while it is still single-threaded, so the whole helper process is in
//!   the target netns before it confines itself and reads anything; this is
//!   how the transport capture reads another namespace (the agent's own
//!   threads never change namespace).
//! - [`run_in`]: spawns a dedicated thread, enters the target there, runs the
//!   reader, and lets the thread die: the caller's threads never change
//!   namespace, and nothing outlives the read (kept for in-process readers
//!   and the kernel-semantics tests).
//!
//! Inside the entered thread:
//! - netlink sockets it opens belong to the target netns;
//! - `/proc/thread-self/net/*` shows the target netns (plain `/proc/net` is
//!   `/proc/self/net`, i.e. the thread-group leader's netns — the wrong one
//!   unless the whole process moved);
//! - `/proc/sys/net/*` resolves against the thread's netns;
//! - `/sys/class/net` does **not** (sysfs is bound to the netns of its mount),
//!   so interface facts come from rtnetlink, never sysfs.
//!
//! The namespace file is opened ([`open`]) before anything else, so a PID
//! that is gone or a name that does not exist is a typed error up front, and
//! the namespace cannot be freed between open and `setns`. After `setns`
//! the thread's namespace inode is compared with the file's: entering
//! anything else is an error, never a silent read of the wrong netns.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;

/// Which network namespace to read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NetnsTarget {
    /// The caller's own.
    Current,
    /// The namespace of a process (`/proc/PID/ns/net`).
    Pid(u32),
    /// A named namespace (`/run/netns/NAME`, as `ip netns` makes).
    Named(String),
}

impl NetnsTarget {
    /// The namespace file this target opens.
    pub fn path(&self) -> String {
        match self {
            NetnsTarget::Current => "/proc/thread-self/ns/net".into(),
            NetnsTarget::Pid(p) => format!("/proc/{p}/ns/net"),
            NetnsTarget::Named(n) => format!("/run/netns/{n}"),
        }
    }
}

/// Why a namespace could not be entered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NetnsError {
    /// The process is gone (or never existed).
    #[error("process {pid} is gone: {path} does not exist")]
    ProcessGone {
        /// PID asked for.
        pid: u32,
        /// Path tried.
        path: String,
    },
    /// No namespace of that name.
    #[error("no network namespace named {name:?} ({path} does not exist)")]
    NoSuchNetns {
        /// Name asked for.
        name: String,
        /// Path tried.
        path: String,
    },
    /// The name cannot be a namespace name.
    #[error("invalid netns name {name:?}: {reason}")]
    InvalidName {
        /// Name given.
        name: String,
        /// Why.
        reason: String,
    },
    /// The kernel refused (needs CAP_SYS_ADMIN over the target's user ns).
    #[error("{op} {path}: permission denied (errno {errno})")]
    PermissionDenied {
        /// What was attempted.
        op: &'static str,
        /// Path.
        path: String,
        /// errno.
        errno: i32,
    },
    /// Any other failure.
    #[error("{op} {path}: {message} (errno {errno})")]
    Os {
        /// What was attempted.
        op: &'static str,
        /// Path.
        path: String,
        /// errno.
        errno: i32,
        /// The OS's description.
        message: String,
    },
    /// The reader thread panicked.
    #[error("netns reader thread panicked")]
    ReaderPanicked,
}

impl NetnsError {
    fn os(op: &'static str, path: &str, e: &std::io::Error) -> NetnsError {
        let errno = e.raw_os_error().unwrap_or(0);
        if errno == libc::EPERM || errno == libc::EACCES {
            NetnsError::PermissionDenied {
                op,
                path: path.into(),
                errno,
            }
        } else {
            NetnsError::Os {
                op,
                path: path.into(),
                errno,
                message: e.to_string(),
            }
        }
    }

    /// errno, when there is one.
    pub fn errno(&self) -> Option<i32> {
        match self {
            NetnsError::ProcessGone { .. } | NetnsError::NoSuchNetns { .. } => Some(libc::ENOENT),
            NetnsError::PermissionDenied { errno, .. } | NetnsError::Os { errno, .. } => {
                Some(*errno)
            }
            _ => None,
        }
    }
}

fn validate_name(name: &str) -> Result<(), NetnsError> {
    let bad = |reason: &str| {
        Err(NetnsError::InvalidName {
            name: name.into(),
            reason: reason.into(),
        })
    };
    if name.is_empty() {
        return bad("empty");
    }
    if name.len() > 255 {
        return bad("longer than 255 bytes");
    }
    if name == "." || name == ".." || name.contains('/') || name.contains('\0') {
        return bad("must be a single path component");
    }
    Ok(())
}

/// Open the namespace file of `target`, mapping "gone" to typed errors.
pub fn open(target: &NetnsTarget) -> Result<File, NetnsError> {
    if let NetnsTarget::Named(n) = target {
        validate_name(n)?;
    }
    let path = target.path();
    File::open(&path).map_err(|e| match (target, e.kind()) {
        (NetnsTarget::Pid(pid), std::io::ErrorKind::NotFound) => NetnsError::ProcessGone {
            pid: *pid,
            path: path.clone(),
        },
        (NetnsTarget::Named(name), std::io::ErrorKind::NotFound) => NetnsError::NoSuchNetns {
            name: name.clone(),
            path: path.clone(),
        },
        _ => NetnsError::os("open", &path, &e),
    })
}

/// Inode of the calling thread's network namespace, decimal.
pub fn current_inode() -> Result<u64, NetnsError> {
    let p = "/proc/thread-self/ns/net";
    std::fs::metadata(p)
        .map(|m| m.ino())
        .map_err(|e| NetnsError::os("stat", p, &e))
}

/// Move the calling thread into the network namespace `file` refers to
/// (`path` is only for errors); returns the namespace inode now current,
/// which is checked to be the file's.
pub fn enter(file: &File, path: &str) -> Result<u64, NetnsError> {
    let want = file
        .metadata()
        .map(|m| m.ino())
        .map_err(|e| NetnsError::os("fstat", path, &e))?;
    // SAFETY: setns on a valid, open namespace fd; affects only this thread.
    let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
    if rc != 0 {
        return Err(NetnsError::os(
            "setns",
            path,
            &std::io::Error::last_os_error(),
        ));
    }
    let now = current_inode()?;
    if now != want {
        return Err(NetnsError::Os {
            op: "setns",
            path: path.into(),
            errno: 0,
            message: format!("entered netns {now}, expected {want}"),
        });
    }
    Ok(now)
}

/// Inode of the namespace `file` refers to.
pub fn inode_of(file: &File, path: &str) -> Result<u64, NetnsError> {
    file.metadata()
        .map(|m| m.ino())
        .map_err(|e| NetnsError::os("fstat", path, &e))
}

/// Run `f` in a fresh thread inside `target`'s network namespace; returns its
/// result and the namespace inode it ran in.
pub fn run_in<T, F>(target: &NetnsTarget, f: F) -> Result<(T, u64), NetnsError>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    let file = match target {
        NetnsTarget::Current => None,
        t => Some(open(t)?),
    };
    let path = target.path();
    let handle = std::thread::Builder::new()
        .name("pstack-netns".into())
        .spawn(move || -> Result<(T, u64), NetnsError> {
            let ino = match &file {
                Some(file) => enter(file, &path)?,
                None => current_inode()?,
            };
            Ok((f(), ino))
        })
        .map_err(|e| NetnsError::os("spawn", "thread", &e))?;
    handle.join().map_err(|_| NetnsError::ReaderPanicked)?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostile_names_are_refused_before_any_open() {
        for n in ["", ".", "..", "a/b", "../../etc/passwd", "x\0y"] {
            assert!(
                matches!(
                    open(&NetnsTarget::Named(n.into())),
                    Err(NetnsError::InvalidName { .. })
                ),
                "{n:?}"
            );
        }
    }

    #[test]
    fn missing_named_netns_is_typed() {
        let e = open(&NetnsTarget::Named(format!(
            "pstack-absent-{}",
            std::process::id()
        )))
        .unwrap_err();
        assert!(matches!(e, NetnsError::NoSuchNetns { .. }));
    }

    #[test]
    fn current_runs_in_own_netns() {
        let here = current_inode().unwrap();
        let ((), ino) = run_in(&NetnsTarget::Current, || ()).unwrap();
        assert_eq!(ino, here);
    }
}
