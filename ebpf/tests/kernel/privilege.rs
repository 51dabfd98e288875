//! Degradation is typed: as `nobody` (fork, setgid/setuid 65534, exec this
//! test binary) starting a session is `permission_denied` with a clear
//! message; without kernel BTF it is `unsupported`; `capture_blocking` turns
//! both into surfaces with that status instead of failing or returning nothing.

use std::os::unix::process::CommandExt;
use std::process::Command;
use std::time::Duration;

use pstack_ebpf::{EbpfConfig, EbpfError, EbpfSession, capture_blocking};
use pstack_envelope::SurfaceStatus;

use crate::require_kernel;

const AS_NOBODY: &str = "PSTACK_EBPF_TEST_AS_NOBODY";

/// The half that runs as nobody (a no-op in a normal run).
#[test]
fn nobody_child_half() {
    if std::env::var_os(AS_NOBODY).is_none() {
        return;
    }
    // SAFETY: getuid has no preconditions.
    assert_eq!(unsafe { libc::getuid() }, 65534, "running as nobody");
    let err = EbpfSession::start(EbpfConfig::tcp()).expect_err("nobody cannot load eBPF");
    assert!(
        matches!(err, EbpfError::PermissionDenied { .. }),
        "typed: {err:?}"
    );
    assert_eq!(err.status(), SurfaceStatus::PermissionDenied);
    let surfaces = capture_blocking(EbpfConfig::tcp(), Duration::from_millis(10));
    assert_eq!(surfaces.len(), 3);
    for s in &surfaces {
        assert_eq!(s.status, SurfaceStatus::PermissionDenied, "{s:?}");
        assert!(
            s.cause
                .as_ref()
                .is_some_and(|c| c.message.contains("CAP_BPF")),
            "{s:?}"
        );
    }
    println!("NOBODY-RESULT status={} message={err}", err.status());
}

#[test]
fn unprivileged_run_is_permission_denied_with_a_clear_message() {
    require_kernel!();
    // nobody must be able to execute the binary wherever the target dir lives
    // (a checkout under /root is not traversable): run a world-readable copy.
    let dir = std::env::temp_dir().join(format!("pstack-ebpf-nobody-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let exe = dir.join("kernel-tests");
    std::fs::copy(std::env::current_exe().expect("test binary"), &exe).expect("copy test binary");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).expect("chmod dir");
    std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).expect("chmod exe");
    struct Cleanup(std::path::PathBuf);
    impl Drop for Cleanup {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    let _cleanup = Cleanup(dir.clone());
    let out = Command::new(&exe)
        .current_dir(&dir)
        .args([
            "--exact",
            "privilege::nobody_child_half",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(AS_NOBODY, "1")
        .uid(65534)
        .gid(65534)
        .output()
        .expect("spawn as nobody");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "child failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("NOBODY-RESULT status=permission_denied"),
        "{stdout}"
    );
    assert!(
        stdout.contains("CAP_BPF+CAP_PERFMON"),
        "the message says what is needed: {stdout}"
    );
}

#[test]
fn missing_btf_is_unsupported_not_a_crash() {
    let cfg = EbpfConfig {
        btf_path: "/nonexistent/pstack/vmlinux".into(),
        ..EbpfConfig::tcp()
    };
    let err = EbpfSession::start(cfg.clone()).expect_err("no BTF");
    assert!(matches!(err, EbpfError::NoBtf { .. }), "{err:?}");
    let surfaces = capture_blocking(cfg, Duration::from_millis(10));
    assert_eq!(
        surfaces
            .iter()
            .map(|s| (s.id.as_str(), s.status))
            .collect::<Vec<_>>(),
        vec![
            ("ebpf:tcp_retransmits", SurfaceStatus::Unsupported),
            ("ebpf:tcp_resets", SurfaceStatus::Unsupported),
            ("ebpf:tcp_lifecycle", SurfaceStatus::Unsupported),
        ]
    );
}

#[test]
fn invalid_config_names_the_parameter() {
    for (cfg, param) in [
        (
            EbpfConfig {
                ring_bytes: 5000,
                ..EbpfConfig::tcp()
            },
            "ring_bytes",
        ),
        (
            EbpfConfig {
                port: Some(0),
                ..EbpfConfig::tcp()
            },
            "port",
        ),
        (
            EbpfConfig {
                port_range: Some((20000, 10000)),
                ..EbpfConfig::tcp()
            },
            "port_range",
        ),
        (
            EbpfConfig {
                port: Some(15000),
                port_range: Some((10000, 20000)),
                ..EbpfConfig::tcp()
            },
            "port_range",
        ),
        (
            EbpfConfig {
                tcp: false,
                ..EbpfConfig::tcp()
            },
            "programs",
        ),
        (
            EbpfConfig {
                poll_interval: Duration::ZERO,
                ..EbpfConfig::tcp()
            },
            "poll_interval",
        ),
    ] {
        match EbpfSession::start(cfg) {
            Err(EbpfError::InvalidConfig { param: p, .. }) => assert_eq!(p, param),
            other => panic!("expected InvalidConfig {param}, got {other:?}"),
        }
    }
}
