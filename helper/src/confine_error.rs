//! Why confining the helper failed. Its own module so that the steps of
//! confinement ([`crate::view`], [`crate::filter`]) and their sequence
//! ([`crate::confine`]) all name it without importing one another.

/// A confinement step failed; the helper must not serve.
#[derive(Debug, thiserror::Error)]
pub enum ConfineError {
    /// A prctl/setrlimit call failed.
    #[error("{call} failed: {source}")]
    Syscall {
        /// The call.
        call: &'static str,
        /// The OS error.
        source: std::io::Error,
    },
    /// The parent exited before the death signal was armed.
    #[error("parent {expected} is gone (parent is now {actual})")]
    ParentGone {
        /// The agent's pid.
        expected: i32,
        /// The current parent.
        actual: i32,
    },
    /// Changing capability sets failed.
    #[error("capabilities: {0}")]
    Caps(String),
    /// The bounding set could not be emptied.
    #[error(
        "cannot empty the bounding set: {0} (pstackd keeps CAP_SETPCAP so that its helpers can; a helper started without it refuses to serve)"
    )]
    Bounding(String),
    /// Building the read-only view failed.
    #[error("read-only /proc view: {call} failed: {source}")]
    View {
        /// The call.
        call: &'static str,
        /// The OS error.
        source: std::io::Error,
    },
    /// No directory to mount the view's root on.
    #[error("read-only /proc view: none of /tmp, /mnt, /run, /var exists to mount the new root on")]
    NoMountPoint,
    /// A privileged helper lacks `CAP_SYS_ADMIN` for its view.
    #[error(
        "read-only /proc view: the helper holds capabilities but not CAP_SYS_ADMIN, which building the view needs"
    )]
    NoViewPrivilege,
    /// Building or applying the Landlock ruleset failed.
    #[error("landlock: {0}")]
    Landlock(String),
    /// Building or installing the seccomp filter failed.
    #[error("seccomp: {0}")]
    Seccomp(String),
}
