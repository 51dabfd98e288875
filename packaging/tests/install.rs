//! The packages, installed for real: `packaging/build` builds both .debs
//! (and the rpms), a bare Debian root is made with `mmdebstrap` (cached as a
//! tarball under /var/cache/pstack-packaging, unpacked in /var/tmp), and in
//! it, through `chroot`:
//!
//! - `dpkg -i` installs both packages; files, modes, owners, the `pstack`
//!   group and `pstack-store` user, unit contents, man pages, completions,
//!   enabled units and `pstackctl --version` (naming the commit) are checked;
//!   the installed binaries are stripped and the -dbgsym package holds their
//!   debug info under their build-id;
//! - pstackd is started in the root and the time to its first capture is
//!   measured; `dpkg -r` then stops it cleanly (exit 0) and keeps the spool;
//! - an upgrade to a rebuilt package (revision 2) keeps an edited config and
//!   a spooled envelope; `dpkg --purge` removes both;
//! - the rpms list the same files (`rpm -qlp`).
//!
//! Needs root, network access to the Debian archive the first time (the
//! root is cached), dpkg-dev, rpm, mmdebstrap (scripts/setup.d/60-packaging.sh).
//! Packages the `dev` profile binaries by default (cargo test has built
//! them; the packaging steps are the same): `PSTACK_INSTALL_TEST_PROFILE=release`
//! packages a release build instead.

use std::collections::BTreeSet;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

mod support;

use support::{have, repo, run};

fn stdout(cmd: &mut Command) -> String {
    String::from_utf8(run(cmd).stdout).unwrap()
}

/// A bare Debian root in /var/tmp; its mounts are undone on drop.
struct Root {
    /// `None` only while dropping.
    dir: Option<tempfile::TempDir>,
    mounts: Vec<PathBuf>,
}

impl Root {
    fn path(&self) -> &Path {
        self.dir.as_ref().unwrap().path()
    }

    fn at(&self, p: &str) -> PathBuf {
        self.path().join(p.trim_start_matches('/'))
    }

    fn chroot(&self) -> Command {
        let mut c = Command::new("chroot");
        c.arg(self.path())
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .env("DEBIAN_FRONTEND", "noninteractive")
            .env("LANG", "C.UTF-8");
        c
    }

    fn mount(&mut self, args: &[&str], target: &str) {
        let t = self.at(target);
        std::fs::create_dir_all(&t).unwrap();
        run(Command::new("mount").args(args).arg(&t));
        if !self.mounts.contains(&t) {
            self.mounts.push(t);
        }
    }

    fn dpkg(&self, args: &[&str]) -> Output {
        run(self.chroot().arg("dpkg").args(args))
    }

    fn copy_in(&self, file: &Path) -> String {
        let name = file.file_name().unwrap().to_string_lossy().into_owned();
        std::fs::copy(file, self.at("/tmp").join(&name)).unwrap();
        format!("/tmp/{name}")
    }
}

impl Drop for Root {
    fn drop(&mut self) {
        for m in self.mounts.iter().rev() {
            let _ = Command::new("umount").arg("-l").arg(m).status();
        }
        // The root holds bind mounts of /dev and /sys: delete it only when
        // nothing is mounted under it any more, else leave it (and say so)
        // rather than recurse into the host's /dev.
        let dir = self.dir.take().unwrap();
        let prefix = format!("{} ", dir.path().display());
        let prefix_sub = format!("{}/", dir.path().display());
        let still = std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap_or_default()
            .lines()
            .any(|l| {
                let mp = l.split(' ').nth(4).unwrap_or("");
                format!("{mp} ").starts_with(&prefix) || mp.starts_with(&prefix_sub)
            });
        if still {
            let kept = dir.keep();
            eprintln!(
                "install test: mounts remain under {}; left in place",
                kept.display()
            );
        }
    }
}

fn bare_root() -> Root {
    let dir = support::unpacked_root();
    let mut root = Root {
        dir: Some(dir),
        mounts: Vec::new(),
    };
    root.mount(&["-t", "proc", "proc"], "/proc");
    root.mount(&["--rbind", "/sys"], "/sys");
    root.mount(&["-o", "remount,bind,ro"], "/sys");
    root.mount(&["--bind", "/dev"], "/dev");
    root.mount(&["-t", "tmpfs", "-o", "mode=0755", "tmpfs"], "/run");
    root
}

/// Build the packages (revision `rev`) into `out`; returns the files.
fn build_packages(out: &Path, rev: u32, rpm: bool, skip_cargo: bool) -> Vec<PathBuf> {
    let profile = std::env::var("PSTACK_INSTALL_TEST_PROFILE").unwrap_or_else(|_| "dev".into());
    let mut cmd = Command::new(repo().join("packaging/build"));
    cmd.args(["--profile", &profile])
        .env("PSTACK_PACKAGE_REVISION", rev.to_string())
        .env("PSTACK_PACKAGE_OUT", out)
        .env("PSTACK_DEB_COMPRESSION", "gzip");
    if !rpm {
        cmd.args(["--no-rpm", "--no-dbgsym"]);
    }
    if skip_cargo {
        cmd.arg("--skip-cargo");
    }
    let listed = stdout(&mut cmd);
    listed
        .lines()
        .filter(|l| l.ends_with(".deb") || l.ends_with(".rpm"))
        .map(PathBuf::from)
        .collect()
}

fn pick(files: &[PathBuf], prefix: &str) -> PathBuf {
    files
        .iter()
        .find(|f| {
            let n = f.file_name().unwrap().to_string_lossy();
            n.starts_with(prefix) && !n[prefix.len()..].starts_with("-d")
        })
        .unwrap_or_else(|| panic!("no {prefix} in {files:?}"))
        .clone()
}

fn mode_owner(root: &Root, p: &str) -> (u32, String, String) {
    let m = std::fs::metadata(root.at(p)).unwrap_or_else(|e| panic!("{p}: {e}"));
    let name = |file: &str, id: u32| -> String {
        std::fs::read_to_string(root.at(file))
            .unwrap()
            .lines()
            .find(|l| l.split(':').nth(2) == Some(&id.to_string()))
            .map(|l| l.split(':').next().unwrap().to_string())
            .unwrap_or_else(|| id.to_string())
    };
    (
        m.mode() & 0o7777,
        name("/etc/passwd", m.uid()),
        name("/etc/group", m.gid()),
    )
}

fn head_commit() -> String {
    let rev = stdout(
        Command::new("git")
            .arg("-C")
            .arg(repo())
            .args(["rev-parse", "HEAD"]),
    );
    let clean = Command::new("git")
        .arg("-C")
        .arg(repo())
        .args(["diff-index", "--quiet", "HEAD", "--"])
        .status()
        .unwrap()
        .success();
    format!("{}{}", rev.trim(), if clean { "" } else { "-dirty" })
}

fn build_id(elf: &Path) -> String {
    stdout(Command::new("readelf").arg("-n").arg(elf))
        .lines()
        .find_map(|l| l.trim().strip_prefix("Build ID: "))
        .unwrap()
        .to_string()
}

/// A child killed and reaped on drop (a failed assertion leaves no pstackd
/// running in a deleted root); waiting first keeps its real exit status.
struct Reap(Child);

impl Drop for Reap {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Every regular file under `dir`, recursively, sorted.
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            if e.file_type().unwrap().is_dir() {
                stack.push(e.path());
            } else {
                out.push(e.path());
            }
        }
    }
    out.sort();
    out
}

/// Start pstackd in the root; returns it and the time to its first capture.
#[allow(
    clippy::zombie_processes,
    reason = "the child is returned; the caller waits for it"
)]
fn start_pstackd(root: &Root) -> (Reap, Duration) {
    // What pstackd.service's RuntimeDirectory= would create.
    std::fs::create_dir_all(root.at("/run/pstack")).unwrap();
    let start = Instant::now();
    // The subject: a process in the root (not PID 1, which may belong to
    // another user namespace in a sandboxed CI).
    let mut subject = root.chroot().args(["sleep", "600"]).spawn().unwrap();
    let subject_pid = subject.id().to_string();
    let mut child = root
        .chroot()
        .args(["/usr/bin/pstackd", "--config", "/etc/pstack/pstackd.toml"])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(root.at("/tmp/pstackd.log")).unwrap())
        .spawn()
        .unwrap();
    let deadline = start + Duration::from_secs(60);
    loop {
        let out = root
            .chroot()
            .args([
                "pstackctl",
                "capture",
                "--pid",
                &subject_pid,
                "-o",
                "/tmp/first.json",
            ])
            .output()
            .unwrap();
        let spooled = files_under(&root.at("/var/lib/pstack/spool"))
            .iter()
            .filter(|p| p.extension().is_some_and(|e| e == "json"))
            .count();
        if out.status.success() && spooled > 0 {
            let elapsed = start.elapsed();
            let _ = subject.kill();
            let _ = subject.wait();
            return (Reap(child), elapsed);
        }
        if Instant::now() >= deadline {
            let _ = subject.kill();
            let _ = subject.wait();
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "no capture through pstackd within 60 s: {}\npstackd log:\n{}",
                String::from_utf8_lossy(&out.stderr),
                std::fs::read_to_string(root.at("/tmp/pstackd.log")).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn debs_install_upgrade_remove_and_purge_in_a_bare_debian_root() {
    pstack_testkit::require!(
        pstack_testkit::is_root(),
        "the install test needs root (chroot, mounts)"
    );
    for tool in [
        "mmdebstrap",
        "dpkg-deb",
        "rpmbuild",
        "rpm",
        "objcopy",
        "chroot",
    ] {
        pstack_testkit::require!(
            have(tool),
            "{tool} missing: run scripts/setup.d/60-packaging.sh"
        );
    }
    let t0 = Instant::now();
    let pkgs = tempfile::Builder::new()
        .prefix("pstack-packages-")
        .tempdir_in("/var/tmp")
        .unwrap();
    let rev1 = build_packages(&pkgs.path().join("r1"), 1, true, false);
    let built = t0.elapsed();
    let commit = head_commit();
    let root = bare_root();

    // ---- install ----
    let agent = root.copy_in(&pick(&rev1, "pstack-agent_"));
    let store = root.copy_in(&pick(&rev1, "pstack-store_"));
    let t_install = Instant::now();
    root.dpkg(&["-i", &agent, &store]);
    let install_time = t_install.elapsed();

    for (path, mode, owner, group) in [
        ("/usr/bin/pstackd", 0o755, "root", "root"),
        ("/usr/bin/pstackctl", 0o755, "root", "root"),
        ("/usr/bin/pstack-helper", 0o755, "root", "root"),
        ("/usr/bin/pstack-store", 0o755, "root", "root"),
        ("/etc/pstack/pstackd.toml", 0o644, "root", "root"),
        ("/etc/pstack/pstack-store.env", 0o600, "root", "root"),
        (
            "/usr/lib/systemd/system/pstackd.service",
            0o644,
            "root",
            "root",
        ),
        (
            "/usr/lib/systemd/system/pstackd.socket",
            0o644,
            "root",
            "root",
        ),
        (
            "/usr/lib/systemd/system/pstack-store.service",
            0o644,
            "root",
            "root",
        ),
        ("/usr/lib/sysusers.d/pstack.conf", 0o644, "root", "root"),
        (
            "/usr/lib/sysusers.d/pstack-store.conf",
            0o644,
            "root",
            "root",
        ),
        ("/var/lib/pstack", 0o700, "root", "root"),
        ("/var/lib/pstack/spool", 0o700, "root", "root"),
        (
            "/var/lib/pstack-store",
            0o700,
            "pstack-store",
            "pstack-store",
        ),
    ] {
        assert_eq!(
            mode_owner(&root, path),
            (mode, owner.to_string(), group.to_string()),
            "{path}"
        );
    }
    let group = std::fs::read_to_string(root.at("/etc/group")).unwrap();
    assert!(group.lines().any(|l| l.starts_with("pstack:")), "{group}");
    let conffiles = stdout(root.chroot().args([
        "dpkg-query",
        "--showformat=${Conffiles}\n",
        "-W",
        "pstack-agent",
        "pstack-store",
    ]));
    assert!(
        conffiles.contains("/etc/pstack/pstackd.toml")
            && conffiles.contains("/etc/pstack/pstack-store.env"),
        "{conffiles}"
    );
    for unit in ["pstackd.service", "pstackd.socket", "pstack-store.service"] {
        assert_eq!(
            std::fs::read(root.at(&format!("/usr/lib/systemd/system/{unit}"))).unwrap(),
            std::fs::read(repo().join("systemd").join(unit)).unwrap(),
            "{unit}"
        );
    }
    // Enabled on first install (offline: no systemd runs in the root).
    for unit in ["pstackd.socket", "pstackd.service", "pstack-store.service"] {
        let state = stdout(root.chroot().args(["systemctl", "is-enabled", unit]));
        assert_eq!(state.trim(), "enabled", "{unit}");
    }
    // The units verify against the installed binaries.
    let verify = root
        .chroot()
        .args(["systemd-analyze", "verify", "--man=no"])
        .args([
            "/usr/lib/systemd/system/pstackd.socket",
            "/usr/lib/systemd/system/pstackd.service",
            "/usr/lib/systemd/system/pstack-store.service",
        ])
        .output()
        .unwrap();
    let verr = String::from_utf8_lossy(&verify.stderr);
    assert!(
        verr.lines().all(|l| !l.contains("pstack")),
        "systemd-analyze verify in the root:\n{verr}"
    );
    for bin in ["pstackctl", "pstackd", "pstack-store"] {
        let page = root.at(&format!("/usr/share/man/man1/{bin}.1.gz"));
        let text = stdout(Command::new("gzip").arg("-dc").arg(&page));
        assert!(
            text.contains(&format!(".TH {bin} 1")),
            "{bin}.1: {}",
            &text[..200.min(text.len())]
        );
        for f in [
            format!("/usr/share/bash-completion/completions/{bin}"),
            format!("/usr/share/zsh/vendor-completions/_{bin}"),
            format!("/usr/share/fish/vendor_completions.d/{bin}.fish"),
        ] {
            let text = std::fs::read_to_string(root.at(&f)).unwrap_or_else(|e| panic!("{f}: {e}"));
            assert!(text.contains(bin), "{f}");
        }
    }
    assert!(
        root.at("/usr/share/man/man1/pstackctl-capture.1.gz")
            .is_file()
    );
    for bin in ["pstackctl", "pstackd", "pstack-store", "pstack-helper"] {
        let v = stdout(root.chroot().args([bin, "--version"]));
        assert_eq!(v.trim(), format!("{bin} 0.1.0 (commit {commit})"));
    }
    assert!(
        stdout(root.chroot().args([
            "pstackd",
            "--check-config",
            "--config",
            "/etc/pstack/pstackd.toml"
        ]))
        .len()
            < 10_000
    );

    // Stripped binaries; their debug info in -dbgsym under the build-id.
    let dbgsym = pick(&rev1, "pstack-agent-dbgsym_");
    let dbg_list = stdout(Command::new("dpkg-deb").arg("-c").arg(&dbgsym));
    for bin in ["pstackd", "pstackctl", "pstack-helper"] {
        let installed = root.at(&format!("/usr/bin/{bin}"));
        let sections = stdout(Command::new("readelf").arg("-S").arg(&installed));
        assert!(!sections.contains(".debug_info"), "{bin} is not stripped");
        assert!(
            sections.contains(".gnu_debuglink"),
            "{bin} has no debuglink"
        );
        let id = build_id(&installed);
        let want = format!("./usr/lib/debug/.build-id/{}/{}.debug", &id[..2], &id[2..]);
        assert!(
            dbg_list.contains(&want),
            "{want} not in {}:\n{dbg_list}",
            dbgsym.display()
        );
    }

    // ---- first capture through pstackd, then remove stops it cleanly ----
    let (mut pstackd, first_capture) = start_pstackd(&root);
    // The envelope names the commit the package was built from.
    let envelope: serde_json::Value =
        serde_json::from_slice(&std::fs::read(root.at("/tmp/first.json")).unwrap()).unwrap();
    assert_eq!(envelope["collector"]["source_commit"], commit.as_str());
    let spooled: Vec<PathBuf> = files_under(&root.at("/var/lib/pstack/spool"))
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    let spooled_bytes: Vec<Vec<u8>> = spooled.iter().map(|p| std::fs::read(p).unwrap()).collect();
    root.dpkg(&["-r", "pstack-agent"]);
    let status = pstackd.0.wait().unwrap();
    assert!(
        status.success(),
        "pstackd did not exit cleanly on remove: {status}"
    );
    assert!(
        root.at("/etc/pstack/pstackd.toml").is_file(),
        "remove keeps the config"
    );
    for (p, b) in spooled.iter().zip(&spooled_bytes) {
        assert_eq!(
            &std::fs::read(p).unwrap(),
            b,
            "remove keeps the spool: {}",
            p.display()
        );
    }

    // ---- upgrade to a rebuilt package keeps an edited config and the spool ----
    root.dpkg(&["-i", &agent]);
    let edited = std::fs::read_to_string(root.at("/etc/pstack/pstackd.toml"))
        .unwrap()
        .replacen(
            "\n[spool]",
            "\nmax_concurrent_captures = 3  # edited by the operator\n\n[spool]",
            1,
        );
    assert!(edited.contains("edited by the operator"));
    std::fs::write(root.at("/etc/pstack/pstackd.toml"), &edited).unwrap();
    run(root.chroot().args([
        "pstackd",
        "--check-config",
        "--config",
        "/etc/pstack/pstackd.toml",
    ]));
    let rev2 = build_packages(&pkgs.path().join("r2"), 2, false, true);
    let agent2 = root.copy_in(&pick(&rev2, "pstack-agent_"));
    let store2 = root.copy_in(&pick(&rev2, "pstack-store_"));
    root.dpkg(&["-i", &agent2, &store2]);
    let versions = stdout(root.chroot().args([
        "dpkg-query",
        "-W",
        "-f",
        "${Package} ${Version}\n",
        "pstack-agent",
        "pstack-store",
    ]));
    assert_eq!(versions, "pstack-agent 0.1.0-2\npstack-store 0.1.0-2\n");
    assert_eq!(
        std::fs::read_to_string(root.at("/etc/pstack/pstackd.toml")).unwrap(),
        edited
    );
    for (p, b) in spooled.iter().zip(&spooled_bytes) {
        assert_eq!(
            &std::fs::read(p).unwrap(),
            b,
            "upgrade keeps the spool: {}",
            p.display()
        );
    }
    assert!(!spooled.is_empty());

    // ---- purge removes config, spool and state ----
    root.dpkg(&["--purge", "pstack-agent", "pstack-store"]);
    for gone in [
        "/etc/pstack/pstackd.toml",
        "/etc/pstack/pstack-store.env",
        "/var/lib/pstack",
        "/var/lib/pstack-store",
        "/usr/bin/pstackd",
        "/usr/lib/systemd/system/pstackd.service",
    ] {
        assert!(!root.at(gone).exists(), "purge left {gone}");
    }

    // ---- rpm: the same files ----
    for (deb, rpm) in [
        ("pstack-agent_", "pstack-agent-0"),
        ("pstack-store_", "pstack-store-0"),
    ] {
        let deb_files: BTreeSet<String> =
            stdout(Command::new("dpkg-deb").arg("-c").arg(pick(&rev1, deb)))
                .lines()
                .filter(|l| !l.starts_with('d'))
                .map(|l| {
                    l.rsplit(' ')
                        .next()
                        .unwrap()
                        .trim_start_matches('.')
                        .to_string()
                })
                .collect();
        let rpm_file = rev1
            .iter()
            .find(|f| f.file_name().unwrap().to_string_lossy().starts_with(rpm))
            .unwrap();
        let rpm_files: BTreeSet<String> = stdout(Command::new("rpm").arg("-qlp").arg(rpm_file))
            .lines()
            .map(str::to_string)
            .collect();
        assert_eq!(rpm_files, deb_files, "{}", rpm_file.display());
        let scripts = stdout(Command::new("rpm").args(["-qp", "--scripts"]).arg(rpm_file));
        assert!(
            scripts.contains("postinstall scriptlet") && scripts.contains("preuninstall scriptlet"),
            "{scripts}"
        );
    }

    let sizes: Vec<String> = rev1
        .iter()
        .map(|f| {
            format!(
                "{} {} bytes",
                f.file_name().unwrap().to_string_lossy(),
                std::fs::metadata(f).unwrap().len()
            )
        })
        .collect();
    println!(
        "install test: packages built in {:.1}s; dpkg -i of both into the bare root {:.2}s; \
         pstackd start to first capture {:.3}s; whole test {:.1}s\n{}",
        built.as_secs_f64(),
        install_time.as_secs_f64(),
        first_capture.as_secs_f64(),
        t0.elapsed().as_secs_f64(),
        sizes.join("\n")
    );
}
