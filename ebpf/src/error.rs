//! Typed failures of the eBPF surfaces, and the surface status each maps to.
//!
//! Degradation is typed, never a crash and never a silent empty result:
//! no kernel BTF is `unsupported`, missing privileges are `permission_denied`
//! (found up front from the capability set, or from EPERM/EACCES anywhere in
//! aya's error chain), everything else is `error` with its cause, including
//! the verifier log when the kernel refused a program.

use std::io;
use std::path::PathBuf;

use pstack_envelope::SurfaceStatus;

/// Why the eBPF surfaces could not be produced.
#[derive(Debug, thiserror::Error)]
pub enum EbpfError {
    /// No kernel BTF: CO-RE objects cannot be relocated.
    #[error("no kernel BTF at {path}: CO-RE programs cannot be relocated on this kernel")]
    NoBtf {
        /// Where BTF was looked for.
        path: PathBuf,
    },
    /// A tracepoint the programs need does not exist on this kernel.
    #[error("tracepoint {tracepoint} does not exist on this kernel ({path} missing)")]
    MissingTracepoint {
        /// `category/name`.
        tracepoint: &'static str,
        /// The tracefs directory looked for.
        path: PathBuf,
    },
    /// The caller lacks the privileges to load or attach programs.
    #[error(
        "permission denied: {what}; loading eBPF needs root or CAP_BPF+CAP_PERFMON (or CAP_SYS_ADMIN)"
    )]
    PermissionDenied {
        /// What was refused.
        what: String,
        /// errno, when a syscall refused.
        errno: Option<i32>,
    },
    /// tracefs is not mounted and could not be mounted.
    #[error("tracefs is not mounted at {path} and mounting it failed: {source}")]
    Tracefs {
        /// Mount point.
        path: PathBuf,
        /// The mount error.
        #[source]
        source: io::Error,
    },
    /// aya could not load an object (maps, BTF, relocations).
    #[error("loading eBPF object {object}: {source}")]
    Load {
        /// Embedded object name.
        object: &'static str,
        /// aya's error.
        #[source]
        source: Box<aya::EbpfError>,
    },
    /// A program failed to load (verifier) or attach.
    #[error("program {program} ({tracepoint}): {source}")]
    Program {
        /// Program (function) name.
        program: &'static str,
        /// `category/name`.
        tracepoint: &'static str,
        /// aya's error; `LoadError` carries the verifier log.
        #[source]
        source: Box<aya::programs::ProgramError>,
    },
    /// A map operation failed.
    #[error("map {map}: {source}")]
    Map {
        /// Map name.
        map: &'static str,
        /// aya's error.
        #[source]
        source: Box<aya::maps::MapError>,
    },
    /// An object lacks a map or program the loader expects (a build mismatch).
    #[error("embedded object {object} has no {what} named {name}")]
    ObjectMismatch {
        /// Object.
        object: &'static str,
        /// "map" or "program".
        what: &'static str,
        /// Name looked for.
        name: &'static str,
    },
    /// A configuration value is out of range.
    #[error("invalid eBPF config {param}: {reason}")]
    InvalidConfig {
        /// Parameter name.
        param: &'static str,
        /// Why.
        reason: String,
    },
    /// Waiting on a ring buffer failed.
    #[error("polling ring buffer {map}: {source}")]
    Poll {
        /// Ring buffer map.
        map: &'static str,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
}

/// errno of the first `io::Error` in an error's source chain.
fn chain_errno(err: &(dyn std::error::Error + 'static)) -> Option<i32> {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = cur {
        if let Some(io) = e.downcast_ref::<io::Error>()
            && let Some(n) = io.raw_os_error()
        {
            return Some(n);
        }
        if let Some(aya::sys::SyscallError { io_error, .. }) =
            e.downcast_ref::<aya::sys::SyscallError>()
            && let Some(n) = io_error.raw_os_error()
        {
            return Some(n);
        }
        cur = e.source();
    }
    None
}

fn is_permission(errno: Option<i32>) -> bool {
    matches!(errno, Some(libc::EPERM) | Some(libc::EACCES))
}

impl EbpfError {
    /// The surface status this failure maps to (closed vocabulary).
    pub fn status(&self) -> SurfaceStatus {
        match self {
            EbpfError::NoBtf { .. } | EbpfError::MissingTracepoint { .. } => {
                SurfaceStatus::Unsupported
            }
            EbpfError::PermissionDenied { .. } => SurfaceStatus::PermissionDenied,
            other if is_permission(other.errno()) => SurfaceStatus::PermissionDenied,
            _ => SurfaceStatus::Error,
        }
    }

    /// The errno behind the failure, when a syscall refused.
    pub fn errno(&self) -> Option<i32> {
        match self {
            EbpfError::PermissionDenied { errno, .. } => *errno,
            EbpfError::Tracefs { source, .. } | EbpfError::Poll { source, .. } => {
                source.raw_os_error()
            }
            EbpfError::Load { source, .. } => chain_errno(source.as_ref()),
            EbpfError::Program { source, .. } => chain_errno(source.as_ref()),
            EbpfError::Map { source, .. } => chain_errno(source.as_ref()),
            _ => None,
        }
    }

    pub(crate) fn load(object: &'static str, source: aya::EbpfError) -> EbpfError {
        let e = EbpfError::Load {
            object,
            source: Box::new(source),
        };
        e.promote_permission(format!("loading {object}"))
    }

    pub(crate) fn program(
        program: &'static str,
        tracepoint: &'static str,
        source: aya::programs::ProgramError,
    ) -> EbpfError {
        let e = EbpfError::Program {
            program,
            tracepoint,
            source: Box::new(source),
        };
        e.promote_permission(format!("loading/attaching {program} on {tracepoint}"))
    }

    pub(crate) fn map(map: &'static str, source: aya::maps::MapError) -> EbpfError {
        let e = EbpfError::Map {
            map,
            source: Box::new(source),
        };
        e.promote_permission(format!("map {map}"))
    }

    /// EPERM/EACCES anywhere in the chain becomes the typed `PermissionDenied`.
    fn promote_permission(self, what: String) -> EbpfError {
        let errno = self.errno();
        if is_permission(errno) {
            EbpfError::PermissionDenied {
                what: format!("{what}: {self}"),
                errno,
            }
        } else {
            self
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_are_typed() {
        let e = EbpfError::NoBtf {
            path: "/nope".into(),
        };
        assert_eq!(e.status(), SurfaceStatus::Unsupported);
        let e = EbpfError::PermissionDenied {
            what: "x".into(),
            errno: Some(libc::EPERM),
        };
        assert_eq!(e.status(), SurfaceStatus::PermissionDenied);
        let e = EbpfError::Tracefs {
            path: "/sys/kernel/tracing".into(),
            source: io::Error::from_raw_os_error(libc::EPERM),
        };
        assert_eq!(
            e.status(),
            SurfaceStatus::PermissionDenied,
            "EPERM mounting tracefs is a permission problem"
        );
        let e = EbpfError::Poll {
            map: "EVENTS",
            source: io::Error::from_raw_os_error(libc::EBADF),
        };
        assert_eq!(e.status(), SurfaceStatus::Error);
    }
}
