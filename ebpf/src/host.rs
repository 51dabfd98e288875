//! Host preconditions checked before anything is loaded: kernel BTF,
//! privileges (from the effective capability set), tracefs (mounted here if
//! it is not), and the tracepoints themselves.
//!
//! Each failing precondition is the typed error a surface status is made
//! from; none of them is a panic, and none is skipped silently.

use std::path::{Path, PathBuf};

use crate::error::EbpfError;

/// Default location of the running kernel's BTF.
pub const KERNEL_BTF: &str = "/sys/kernel/btf/vmlinux";
/// Default tracefs mount point.
pub const TRACEFS: &str = "/sys/kernel/tracing";

const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

/// Effective capabilities parsed from `/proc/self/status` text (`CapEff:` hex).
pub fn parse_cap_eff(status: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
}

/// Whether a capability set can load and attach tracepoint programs.
pub fn caps_allow_tracing(cap_eff: u64) -> bool {
    let has = |c: u32| cap_eff & (1u64 << c) != 0;
    has(CAP_SYS_ADMIN) || (has(CAP_BPF) && has(CAP_PERFMON))
}

/// Refuse early, with a clear typed error, when this process cannot trace.
pub fn check_privileges() -> Result<(), EbpfError> {
    let status =
        std::fs::read_to_string("/proc/self/status").map_err(|e| EbpfError::PermissionDenied {
            what: format!("cannot read /proc/self/status to check capabilities: {e}"),
            errno: e.raw_os_error(),
        })?;
    let caps = parse_cap_eff(&status).ok_or_else(|| EbpfError::PermissionDenied {
        what: "no CapEff line in /proc/self/status".into(),
        errno: None,
    })?;
    if caps_allow_tracing(caps) {
        Ok(())
    } else {
        // SAFETY: geteuid has no preconditions and cannot fail.
        let euid = unsafe { libc::geteuid() };
        Err(EbpfError::PermissionDenied {
            what: format!(
                "euid {euid} has effective capabilities {caps:#x}, without CAP_BPF+CAP_PERFMON or CAP_SYS_ADMIN"
            ),
            errno: Some(libc::EPERM),
        })
    }
}

/// Kernel BTF must exist for CO-RE.
pub fn check_btf(path: &Path) -> Result<(), EbpfError> {
    match std::fs::metadata(path) {
        Ok(m) if m.len() > 0 => Ok(()),
        _ => Err(EbpfError::NoBtf {
            path: path.to_path_buf(),
        }),
    }
}

/// Mount tracefs at `path` unless it is already populated there.
pub fn ensure_tracefs(path: &Path) -> Result<(), EbpfError> {
    if path.join("events").is_dir() {
        return Ok(());
    }
    nix::mount::mount(
        Some("nodev"),
        path,
        Some("tracefs"),
        nix::mount::MsFlags::empty(),
        None::<&str>,
    )
    .map_err(|errno| {
        let source = std::io::Error::from(errno);
        if matches!(errno, nix::errno::Errno::EPERM | nix::errno::Errno::EACCES) {
            EbpfError::PermissionDenied {
                what: format!("mounting tracefs at {}: {source}", path.display()),
                errno: Some(errno as i32),
            }
        } else {
            EbpfError::Tracefs {
                path: path.to_path_buf(),
                source,
            }
        }
    })
}

/// The tracepoint's directory must exist.
pub fn check_tracepoint(tracefs: &Path, tracepoint: &'static str) -> Result<(), EbpfError> {
    let dir: PathBuf = tracefs.join("events").join(tracepoint);
    if dir.is_dir() {
        Ok(())
    } else {
        Err(EbpfError::MissingTracepoint {
            tracepoint,
            path: dir,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capability_sets() {
        let root = "Name:\tx\nCapEff:\t000001ffffffffff\n";
        assert!(caps_allow_tracing(parse_cap_eff(root).unwrap()));
        let nobody = "CapEff:\t0000000000000000\n";
        assert!(!caps_allow_tracing(parse_cap_eff(nobody).unwrap()));
        let bpf_only = format!("CapEff:\t{:016x}\n", 1u64 << CAP_BPF);
        assert!(
            !caps_allow_tracing(parse_cap_eff(&bpf_only).unwrap()),
            "CAP_BPF alone cannot attach tracepoints"
        );
        let bpf_perfmon = format!(
            "CapEff:\t{:016x}\n",
            (1u64 << CAP_BPF) | (1u64 << CAP_PERFMON)
        );
        assert!(caps_allow_tracing(parse_cap_eff(&bpf_perfmon).unwrap()));
        assert_eq!(parse_cap_eff("CapEff:\tzz\n"), None);
        assert_eq!(parse_cap_eff(""), None);
    }

    #[test]
    fn missing_btf_is_unsupported() {
        let e = check_btf(Path::new("/nonexistent/btf/vmlinux")).unwrap_err();
        assert_eq!(e.status(), pstack_envelope::SurfaceStatus::Unsupported);
    }
}
