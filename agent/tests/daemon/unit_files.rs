//! `systemd/pstackd.service` and `systemd/pstackd.socket` pass
//! `systemd-analyze verify` (with ExecStart pointed at the built binary, since
//! the test machine has no installed /usr/bin/pstackd).

use std::path::Path;
use std::process::Command;

use super::common::*;

#[test]
fn unit_files_pass_systemd_analyze_verify() {
    pstack_testkit::require!(
        pstack_testkit::have_tool("systemd-analyze"),
        "systemd-analyze is not installed (scripts/setup.d/50-daemon.sh installs systemd)"
    );
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let service = std::fs::read_to_string(repo.join("systemd/pstackd.service")).unwrap();
    let socket = std::fs::read_to_string(repo.join("systemd/pstackd.socket")).unwrap();
    assert!(service.contains("Type=notify") && service.contains("WatchdogSec="));
    // Literal, reviewed expectations (not the code's constants): the bounding set and
    // the hardening settings the unit must carry.
    let bounding: std::collections::BTreeSet<String> = service
        .lines()
        .find_map(|l| l.strip_prefix("CapabilityBoundingSet="))
        .expect("a CapabilityBoundingSet= line")
        .split_whitespace()
        .map(str::to_string)
        .collect();
    assert_eq!(
        bounding,
        pstack_testkit::names(&[
            "CAP_SYS_PTRACE",
            "CAP_DAC_READ_SEARCH",
            "CAP_SYS_ADMIN",
            "CAP_BPF",
            "CAP_PERFMON",
            "CAP_NET_ADMIN",
            "CAP_SETPCAP",
        ])
    );
    for setting in [
        "Type=notify",
        "AmbientCapabilities=",
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        "PrivateTmp=yes",
        "PrivateDevices=yes",
        "ProtectKernelModules=yes",
        "RestrictSUIDSGID=yes",
        "LockPersonality=yes",
        "SystemCallArchitectures=native",
        "UMask=0077",
    ] {
        assert!(
            service.lines().any(|l| l.trim() == setting),
            "pstackd.service lacks `{setting}`"
        );
    }
    let service = service.replace("/usr/bin/pstackd", &pstackd_bin().display().to_string());
    std::fs::write(dir.path().join("pstackd.service"), service).unwrap();
    std::fs::write(dir.path().join("pstackd.socket"), socket).unwrap();
    let out = Command::new("systemd-analyze")
        .arg("verify")
        // The units' `man:` documentation is installed by the package, not here.
        .arg("--man=no")
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
    pstack_testkit::require!(
        pstack_testkit::have_tool("systemd-sysusers"),
        "systemd-sysusers is not installed (scripts/setup.d/50-daemon.sh installs systemd)"
    );
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let conf = repo.join("systemd/pstack.sysusers.conf");
    let socket = std::fs::read_to_string(repo.join("systemd/pstackd.socket")).unwrap();
    let default_group = pstackd::config::Config::default().group;
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

#[test]
fn unit_exposure_stays_at_or_below_3_5_and_every_setting_left_off_has_a_reason() {
    pstack_testkit::require!(
        pstack_testkit::have_tool("systemd-analyze"),
        "systemd-analyze is not installed (apt-get install systemd)"
    );
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let unit = repo.join("systemd/pstackd.service");
    let out = Command::new("systemd-analyze")
        .args(["security", "--offline=true"])
        .arg(&unit)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let score: f64 = text
        .lines()
        .find_map(|l| l.split("pstackd.service: ").nth(1))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no exposure level in:\n{text}"));
    // 3.4 measured with systemd 252: 3.3 + CAP_SETPCAP (issue 10) - ProtectProc.
    // Issue 10 asks for at most 3.5.
    assert!(score <= 3.5, "exposure {score}:\n{text}");
    let service = std::fs::read_to_string(&unit).unwrap();
    for setting in [
        "ProtectKernelTunables=yes",
        "ProtectKernelLogs=yes",
        "ProtectControlGroups=yes",
        "PrivateMounts=yes",
        "SystemCallFilter=@system-service",
        "RestrictAddressFamilies=",
        "IPAddressDeny=any",
        "ProtectProc=ptraceable",
    ] {
        assert!(service.contains(setting), "{setting} missing");
    }
    for left_off in [
        "User=/DynamicUser=",
        "PrivateUsers=",
        "PrivateNetwork=",
        "ProcSubset=",
    ] {
        assert!(
            service.contains(&format!("# {left_off}")),
            "no reason for {left_off}"
        );
    }
}
