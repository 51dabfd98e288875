//! The listening Unix socket: taken from systemd (`LISTEN_FDS`) or bound at
//! the configured path.
//!
//! Invariants:
//! - A systemd-passed socket is used only when `LISTEN_PID` is our PID; the
//!   `LISTEN_*` variables are then removed so children (helpers) never see
//!   them. The fd must be a listening `AF_UNIX` stream socket.
//! - When binding ourselves: a stale socket file is replaced only if nothing
//!   answers on it (a second daemon on the same path is an error, not a
//!   takeover); the file gets the configured mode and group *before* we drop
//!   `CAP_CHOWN`/`CAP_FOWNER`, and the process umask keeps it from ever being
//!   wider than that mode in between.

use std::os::fd::{FromRawFd, RawFd};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};

/// First fd systemd passes.
pub const SD_LISTEN_FDS_START: RawFd = 3;

/// Why the socket could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum ListenError {
    /// Something answers on the path already.
    #[error("another daemon is already serving {0}")]
    InUse(PathBuf),
    /// A non-socket file occupies the path.
    #[error("{0} exists and is not a socket; refusing to replace it")]
    NotASocket(PathBuf),
    /// The passed fd is not what we need.
    #[error("socket passed by systemd (fd {fd}) is unusable: {reason}")]
    BadActivatedSocket {
        /// The fd.
        fd: RawFd,
        /// Why.
        reason: String,
    },
    /// A syscall failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// The operation.
        op: &'static str,
        /// The path.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
}

/// Where the listener came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListenerOrigin {
    /// Passed by systemd.
    Activated,
    /// Bound by us at this path (removed at exit).
    Bound(PathBuf),
}

/// Take the socket systemd passed us, if any.
pub fn from_systemd() -> Result<Option<UnixListener>, ListenError> {
    let pid_matches = std::env::var("LISTEN_PID")
        .ok()
        .and_then(|p| p.trim().parse::<u32>().ok())
        == Some(std::process::id());
    let fds = std::env::var("LISTEN_FDS")
        .ok()
        .and_then(|n| n.trim().parse::<i32>().ok())
        .unwrap_or(0);
    // SAFETY: called at startup before any other thread exists (main runs
    // this before building the runtime), so no concurrent environment access.
    unsafe {
        std::env::remove_var("LISTEN_PID");
        std::env::remove_var("LISTEN_FDS");
        std::env::remove_var("LISTEN_FDNAMES");
    }
    if !pid_matches || fds < 1 {
        return Ok(None);
    }
    let fd = SD_LISTEN_FDS_START;
    let bad = |reason: String| ListenError::BadActivatedSocket { fd, reason };
    // Check the fd's type before taking ownership.
    let mut ty: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `ty`, which is a
    // properly aligned c_int we own; `len` is initialized to its size.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_TYPE,
            (&mut ty as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(bad(format!(
            "not a socket: {}",
            std::io::Error::last_os_error()
        )));
    }
    if ty != libc::SOCK_STREAM {
        return Err(bad("not a stream socket".into()));
    }
    // SAFETY: fd 3 was handed to this process by systemd (LISTEN_PID is us)
    // and nothing else in the process owns it; we take ownership once.
    let listener = unsafe { UnixListener::from_raw_fd(fd) };
    // SAFETY: fcntl on an fd we own, with integer arguments only.
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFD);
        libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC);
    }
    listener
        .local_addr()
        .map_err(|e| bad(format!("not an AF_UNIX socket: {e}")))?;
    if fds > 1 {
        tracing::warn!(fds, "systemd passed more than one socket; using the first");
    }
    Ok(Some(listener))
}

/// Bind `path` with `mode` and group `gid`.
pub fn bind(path: &Path, mode: u32, gid: Option<u32>) -> Result<UnixListener, ListenError> {
    let io = |op: &'static str| {
        let path = path.to_owned();
        move |source| ListenError::Io { op, path, source }
    };
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(io("create directory"))?;
    }
    match std::fs::symlink_metadata(path) {
        Ok(meta) => {
            use std::os::unix::fs::FileTypeExt;
            if !meta.file_type().is_socket() {
                return Err(ListenError::NotASocket(path.to_owned()));
            }
            if UnixStream::connect(path).is_ok() {
                return Err(ListenError::InUse(path.to_owned()));
            }
            std::fs::remove_file(path).map_err(io("remove stale socket"))?;
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io("stat")(e)),
    }
    // Bind under a umask that leaves only the owner bits, then widen to `mode`.
    // SAFETY: umask only swaps the process file-creation mask.
    let old = unsafe { libc::umask(0o177) };
    let bound = UnixListener::bind(path);
    // SAFETY: as above; restores the previous mask.
    unsafe { libc::umask(old) };
    let listener = bound.map_err(io("bind"))?;
    if let Some(gid) = gid {
        match std::os::unix::fs::chown(path, None, Some(gid)) {
            Ok(()) => {}
            // An unprivileged daemon (development, tests) cannot give the
            // socket to a group it is not in: the socket stays ours alone.
            Err(e)
                if e.raw_os_error() == Some(libc::EPERM) && !nix::unistd::geteuid().is_root() =>
            {
                tracing::warn!(gid, "not root: socket group left unchanged");
            }
            Err(e) => return Err(io("chown")(e)),
        }
    }
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(io("chmod"))?;
    Ok(listener)
}
