//! What the packaging tests that need a Debian root share: the cached bare
//! root (Debian 12 minbase plus systemd and procps, made once with
//! `mmdebstrap` and kept as a tarball) and small process helpers.

#![allow(dead_code, reason = "each test binary uses its own part")]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// The bare root: Debian 12 minbase plus what the packages depend on beyond
/// it (procps) and systemd (so postinst's systemd-sysusers and offline
/// `systemctl enable` paths run as on a real node, and it can boot).
pub const CACHE: &str = "/var/cache/pstack-packaging/bookworm-minbase-systemd-procps.tar";

pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

pub fn run(cmd: &mut Command) -> Output {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

pub fn have(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Make the cached tarball if it is missing (needs the Debian archive once).
pub fn ensure_cache() {
    if Path::new(CACHE).is_file() {
        return;
    }
    std::fs::create_dir_all(Path::new(CACHE).parent().unwrap()).unwrap();
    let tmp = format!("{CACHE}.partial.tar");
    run(Command::new("mmdebstrap")
        .args([
            "--quiet",
            "--variant=minbase",
            "--include=systemd,procps",
            "bookworm",
        ])
        .arg(&tmp));
    std::fs::rename(&tmp, CACHE).unwrap();
}

/// A fresh copy of the bare root, unpacked in /var/tmp (not a tmpfs: it is
/// booted and written to).
pub fn unpacked_root() -> tempfile::TempDir {
    ensure_cache();
    let dir = tempfile::Builder::new()
        .prefix("pstack-root-")
        .tempdir_in("/var/tmp")
        .unwrap();
    run(Command::new("tar")
        .args(["-xf", CACHE, "--numeric-owner", "-C"])
        .arg(dir.path()));
    dir
}
