//! `systemd/pstackd.service` and `systemd/pstackd.socket` pass
//! `systemd-analyze verify` (with ExecStart pointed at the built binary, since
//! the test machine has no installed /usr/bin/pstackd).

use std::path::Path;
use std::process::Command;

use super::common::*;

#[test]
fn unit_files_pass_systemd_analyze_verify() {
    if Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("skipping: systemd-analyze is not installed (apt-get install systemd)");
        return;
    }
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let service = std::fs::read_to_string(repo.join("systemd/pstackd.service")).unwrap();
    let socket = std::fs::read_to_string(repo.join("systemd/pstackd.socket")).unwrap();
    assert!(service.contains("Type=notify") && service.contains("WatchdogSec="));
    assert!(service.contains("CapabilityBoundingSet="));
    for cap in pstack_agent::daemon::privilege::KEPT {
        assert!(
            service.contains(&cap.to_string()),
            "unit bounding set lacks {cap}"
        );
    }
    let service = service.replace("/usr/bin/pstackd", &pstackd_bin().display().to_string());
    std::fs::write(dir.path().join("pstackd.service"), service).unwrap();
    std::fs::write(dir.path().join("pstackd.socket"), socket).unwrap();
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(dir.path().join("pstackd.socket"))
        .arg(dir.path().join("pstackd.service"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    // Only our units are judged: lines about other units on the host are ignored.
    let ours: Vec<&str> = stderr.lines().filter(|l| l.contains("pstackd")).collect();
    assert!(
        out.status.success() && ours.is_empty(),
        "systemd-analyze verify:\n{stderr}"
    );
}
