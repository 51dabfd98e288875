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

/// The group the socket unit and pstackd's default config name is the group
/// `systemd/pstack.sysusers.conf` creates; applied to a scratch root, it
/// creates exactly that group (and running it twice changes nothing).
#[test]
fn sysusers_file_creates_the_socket_group_in_a_scratch_root() {
    if Command::new("systemd-sysusers")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("skipping: systemd-sysusers is not installed (apt-get install systemd)");
        return;
    }
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let conf = repo.join("systemd/pstack.sysusers.conf");
    let socket = std::fs::read_to_string(repo.join("systemd/pstackd.socket")).unwrap();
    let default_group = pstack_agent::daemon::config::Config::default().group;
    assert!(socket.contains(&format!("SocketGroup={default_group}\n")));

    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(root.path().join("etc")).unwrap();
    for _ in 0..2 {
        let out = Command::new("systemd-sysusers")
            .arg(format!("--root={}", root.path().display()))
            .arg(&conf)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "systemd-sysusers: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let groups = std::fs::read_to_string(root.path().join("etc/group")).unwrap();
    let ours: Vec<&str> = groups
        .lines()
        .filter(|l| l.starts_with(&format!("{default_group}:")))
        .collect();
    assert_eq!(ours.len(), 1, "{groups}");
    let gid: u32 = ours[0].split(':').nth(2).unwrap().parse().unwrap();
    assert!(gid > 0 && gid < 1000, "a system group: {gid}");
}
