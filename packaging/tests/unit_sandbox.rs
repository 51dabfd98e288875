//! pstackd under its own unit, for real (issue 10, item 6).
//!
//! The install test's bare Debian root (the cached mmdebstrap tarball, with
//! systemd) is booted with `systemd-nspawn --boot`, so systemd is PID 1 of the
//! container and starts `pstackd.socket` + `pstackd.service` exactly as shipped
//! in `systemd/`, with every restriction of the unit applied by systemd itself
//! (not by an imitation of them). The binaries are this build's.
//!
//! From the host, the test reads the running daemon's `/proc/PID/status` and
//! `mountinfo` to show the restrictions are in force — bounding set equal to
//! the unit's `CapabilityBoundingSet=`, `no_new_privs`, a seccomp filter, a
//! read-only `/` with the state directory writable, `/proc` with
//! `hidepid=ptraceable` — and then captures through the daemon's socket inside
//! the container: PID 1, a process of another uid (which `ProtectProc=` must
//! not hide from pstackd), the host view, an eBPF off-CPU window, and a
//! transport capture of a loopback stream. Every envelope verifies, and the
//! daemon stops cleanly.
//!
//! What nspawn adds on top of the unit: its own bounding set and seccomp
//! allowlist. The container is given exactly the unit's capabilities nspawn
//! drops by default (`CAP_BPF`, `CAP_PERFMON`, `CAP_NET_ADMIN`) and
//! `bpf`/`perf_event_open` in nspawn's filter, so what binds pstackd is the
//! unit. Not reproduced here: `IPAddressDeny=`/`IPAddressAllow=` are enforced
//! by systemd with cgroup-v2 BPF programs, and this host's hierarchy is
//! cgroup v1 (systemd accepts the settings and cannot attach them).

mod support;

use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use support::{have, repo, run};

/// The unit's `KEY=` value (first occurrence), from the file as shipped.
fn unit_setting(unit: &str, key: &str) -> String {
    unit.lines()
        .find_map(|l| l.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("{key}= not in pstackd.service"))
        .trim()
        .to_string()
}

/// A booted container; powered off (and killed if it will not) on drop.
struct Container {
    nspawn: Child,
    leader: u32,
    dir: Option<tempfile::TempDir>,
    log: PathBuf,
}

impl Container {
    /// `nsenter` into every namespace of the container's PID 1.
    fn exec(&self, args: &[&str]) -> Command {
        let mut c = Command::new("nsenter");
        c.args(["-t", &self.leader.to_string(), "-a", "--"])
            .args(args)
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .env("LANG", "C.UTF-8");
        c
    }

    fn out(&self, args: &[&str]) -> Output {
        self.exec(args).output().unwrap()
    }

    fn root(&self) -> &Path {
        self.dir.as_ref().unwrap().path()
    }

    fn journal(&self) -> String {
        let o = self.out(&["journalctl", "-b", "--no-pager", "-u", "pstackd.service"]);
        String::from_utf8_lossy(&o.stdout).into_owned()
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = self.out(&["systemctl", "poweroff"]);
        let until = Instant::now() + Duration::from_secs(30);
        while Instant::now() < until {
            if let Ok(Some(_)) = self.nspawn.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        if let Ok(None) = self.nspawn.try_wait() {
            eprintln!(
                "container did not power off in 30 s; killing nspawn (log: {})",
                self.log.display()
            );
            let _ = self.nspawn.kill();
            let _ = self.nspawn.wait();
        }
        // nspawn has undone its mounts once it exited; remove the root only
        // when nothing is mounted below it (never recurse into a bind of /dev).
        let _ = std::fs::remove_file(&self.log);
        let _ = std::fs::remove_file(self.log.with_extension("err"));
        let dir = self.dir.take().unwrap();
        let prefix = format!("{}/", dir.path().display());
        let mounted = std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap_or_default()
            .lines()
            .any(|l| l.split(' ').nth(4).unwrap_or("").starts_with(&prefix));
        if mounted {
            let kept = dir.keep();
            eprintln!("mounts remain under {}; left in place", kept.display());
        }
    }
}

/// The processes whose parent is `pid` (all threads' children).
fn children(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
    {
        let p = task.unwrap().path().join("children");
        for c in std::fs::read_to_string(p)
            .unwrap_or_default()
            .split_whitespace()
        {
            out.push(c.parse().unwrap());
        }
    }
    out
}

/// The host PID of the process named `comm` inside the container's PID namespace.
fn host_pid_in(container: &Container, comm: &str) -> Option<u32> {
    let ns = std::fs::read_link(format!("/proc/{}/ns/pid", container.leader)).ok()?;
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        let c = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
        (c.trim() == comm && std::fs::read_link(format!("/proc/{pid}/ns/pid")).ok()? == ns)
            .then_some(pid)
    })
}

fn status_field(pid: u32, key: &str) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{key}:")))
        .unwrap_or_else(|| panic!("{key} not in /proc/{pid}/status"))
        .trim()
        .to_string()
}

/// Boot the root at `dir` with systemd as the container's PID 1.
fn boot(dir: tempfile::TempDir) -> Container {
    let log = dir.path().with_extension("nspawn.log");
    let machine = format!("pstack-unit-{}", std::process::id());
    let mut cmd = Command::new("systemd-nspawn");
    cmd.arg("--directory")
        .arg(dir.path())
        .args([
            "--boot",
            "--quiet",
            // No systemd on the host to register with or to place a scope in.
            "--register=no",
            "--keep-unit",
            "--machine",
            &machine,
            "--capability=CAP_BPF,CAP_PERFMON,CAP_NET_ADMIN",
            "--system-call-filter=bpf perf_event_open",
        ])
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&log).unwrap())
        .stderr(std::fs::File::create(log.with_extension("err")).unwrap());
    let nspawn = cmd.spawn().unwrap();
    let started = Instant::now();
    let leader = loop {
        let pid = nspawn.id();
        if let Some(l) = children(pid).into_iter().find(|c| {
            std::fs::read_to_string(format!("/proc/{c}/comm")).is_ok_and(|s| s.trim() == "systemd")
        }) {
            break l;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "systemd-nspawn started no systemd in 30 s: {}",
            std::fs::read_to_string(log.with_extension("err")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    Container {
        nspawn,
        leader,
        dir: Some(dir),
        log,
    }
}

fn captured_by_daemon(o: &Output, what: &str) {
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(o.status.success(), "{what} failed ({}):\n{text}", o.status);
    assert!(
        text.contains("captured by pstackd"),
        "{what} did not go through the daemon:\n{text}"
    );
}

fn envelope(path: &Path) -> serde_json::Value {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    pstack_testkit::verify(&bytes)
        .unwrap_or_else(|e| panic!("{} does not verify: {e:?}", path.display()));
    serde_json::from_slice(&bytes).unwrap()
}

fn surface_status(env: &serde_json::Value, id: &str) -> String {
    env["surfaces"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["id"] == id)
        .unwrap_or_else(|| panic!("no surface {id} in {env:#}"))["status"]
        .as_str()
        .unwrap()
        .to_string()
}

#[test]
fn pstackd_runs_and_captures_under_its_shipped_unit_with_systemd_as_pid_1() {
    pstack_testkit::require!(
        pstack_testkit::is_root(),
        "booting a container with systemd-nspawn needs root"
    );
    for tool in [
        "systemd-nspawn",
        "nsenter",
        "systemctl",
        "tar",
        "mmdebstrap",
    ] {
        pstack_testkit::require!(
            have(tool),
            "{tool} missing: run scripts/setup.d/60-packaging.sh"
        );
    }
    // This build's binaries, next to this test binary's profile directory.
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    run(Command::new(cargo).current_dir(repo()).args([
        "build",
        "--bins",
        "-p",
        "pstack-agent",
        "-p",
        "pstack-helper",
    ]));
    let exe = std::env::current_exe().unwrap();
    let bins = exe.parent().unwrap().parent().unwrap().to_path_buf();

    let dir = support::unpacked_root();
    let r = |p: &str| dir.path().join(p.trim_start_matches('/'));
    for b in ["pstackd", "pstackctl", "pstack-helper"] {
        run(Command::new("install")
            .args(["-m", "0755"])
            .arg(bins.join(b))
            .arg(r("/usr/bin").join(b)));
    }
    let repo = repo();
    for (src, dest) in [
        (
            "systemd/pstackd.service",
            "/usr/lib/systemd/system/pstackd.service",
        ),
        (
            "systemd/pstackd.socket",
            "/usr/lib/systemd/system/pstackd.socket",
        ),
        (
            "systemd/pstack.sysusers.conf",
            "/usr/lib/sysusers.d/pstack.conf",
        ),
        ("packaging/etc/pstackd.toml", "/etc/pstack/pstackd.toml"),
    ] {
        run(Command::new("install")
            .args(["-D", "-m", "0644"])
            .arg(repo.join(src))
            .arg(r(dest)));
    }
    run(Command::new("systemctl")
        .arg(format!("--root={}", dir.path().display()))
        .args(["enable", "pstackd.socket", "pstackd.service"]));
    let unit = std::fs::read_to_string(repo.join("systemd/pstackd.service")).unwrap();

    let ct = boot(dir);
    // Boot to pstackd.service active (it is wanted by multi-user.target).
    let until = Instant::now() + Duration::from_secs(90);
    loop {
        let o = ct.out(&["systemctl", "is-active", "pstackd.service"]);
        if String::from_utf8_lossy(&o.stdout).trim() == "active" {
            break;
        }
        assert!(
            Instant::now() < until,
            "pstackd.service not active 90 s after boot ({}):\n{}",
            String::from_utf8_lossy(&o.stdout).trim(),
            ct.journal()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // eBPF is loaded after the socket serves; wait for its verdict.
    let until = Instant::now() + Duration::from_secs(60);
    let journal = loop {
        let j = ct.journal();
        if j.contains("eBPF programs") || Instant::now() > until {
            break j;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(
        journal.contains("eBPF programs attached"),
        "pstackd under its unit did not attach eBPF:\n{journal}"
    );

    // The restrictions, as the kernel holds them for the running daemon.
    let daemon = host_pid_in(&ct, "pstackd").expect("pstackd's host PID");
    let want_bnd = pstack_testkit::names(
        &unit_setting(&unit, "CapabilityBoundingSet")
            .split_whitespace()
            .collect::<Vec<_>>(),
    );
    assert_eq!(
        pstack_testkit::capsh_decode(&status_field(daemon, "CapBnd")),
        want_bnd,
        "pstackd's bounding set is not the unit's CapabilityBoundingSet="
    );
    assert_eq!(status_field(daemon, "NoNewPrivs"), "1");
    assert_eq!(status_field(daemon, "Seccomp"), "2", "no seccomp filter");
    let mountinfo = std::fs::read_to_string(format!("/proc/{daemon}/mountinfo")).unwrap();
    let mount_opts = |target: &str| -> Vec<String> {
        mountinfo
            .lines()
            .filter(|l| l.split(' ').nth(4) == Some(target))
            .map(|l| l.to_string())
            .collect()
    };
    let last = |target: &str| {
        mount_opts(target)
            .pop()
            .unwrap_or_else(|| panic!("no mount at {target} in pstackd's view:\n{mountinfo}"))
    };
    let root_mount = last("/");
    assert!(
        root_mount
            .split(' ')
            .nth(5)
            .unwrap()
            .split(',')
            .any(|o| o == "ro"),
        "ProtectSystem=strict: / not read-only for pstackd: {root_mount}"
    );
    let state = last("/var/lib/pstack");
    assert!(
        state
            .split(' ')
            .nth(5)
            .unwrap()
            .split(',')
            .any(|o| o == "rw"),
        "the state directory is not writable: {state}"
    );
    let proc_mount = last("/proc");
    let protect_proc = unit_setting(&unit, "ProtectProc");
    assert!(
        proc_mount.contains(&format!("hidepid={protect_proc}")),
        "ProtectProc={protect_proc} not in force on pstackd's /proc: {proc_mount}"
    );

    // Captures through the socket, inside the container.
    let o = ct.out(&[
        "pstackctl",
        "capture",
        "--pid",
        "1",
        "-o",
        "/root/pid1.json",
    ]);
    captured_by_daemon(&o, "capture --pid 1");
    let pid1 = envelope(&ct.root().join("root/pid1.json"));
    assert_eq!(pid1["completeness"], "complete", "{pid1:#}");
    assert_eq!(surface_status(&pid1, "task/1/stack"), "ok");

    // Another uid's process: hidepid=ptraceable must not hide it from pstackd.
    let o = ct.out(&[
        "sh",
        "-c",
        "setpriv --reuid=65534 --regid=65534 --clear-groups sleep 600 </dev/null >/dev/null 2>&1 & echo $!",
    ]);
    let nobody = String::from_utf8_lossy(&o.stdout).trim().to_string();
    assert!(nobody.parse::<u32>().is_ok(), "no sleeper pid: {o:?}");
    let o = ct.out(&[
        "pstackctl",
        "capture",
        "--pid",
        &nobody,
        "--window",
        "1s",
        "-o",
        "/root/nobody.json",
    ]);
    captured_by_daemon(&o, "capture --pid (uid 65534) --window 1s");
    let other = envelope(&ct.root().join("root/nobody.json"));
    assert_eq!(other["subject"]["identity"]["uid"], 65534);
    assert_eq!(other["completeness"], "complete", "{other:#}");
    for s in [
        "proc/environ",
        "proc/fd",
        &format!("task/{nobody}/stack"),
        "ebpf:offcpu",
    ] {
        assert_eq!(
            surface_status(&other, s),
            "ok",
            "{s} under the unit: {other:#}"
        );
    }

    let o = ct.out(&["pstackctl", "capture", "--host", "-o", "/root/host.json"]);
    captured_by_daemon(&o, "capture --host");
    let host = envelope(&ct.root().join("root/host.json"));
    assert_eq!(host["completeness"], "complete", "{host:#}");

    // A loopback stream (the container shares the host's network namespace).
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let mut client = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let (_server, _) = listener.accept().unwrap();
    client.write_all(&[7u8; 4096]).unwrap();
    let peer = format!("127.0.0.1:{port}");
    let o = ct.out(&[
        "pstackctl",
        "capture",
        "transport",
        "--peer",
        &peer,
        "--window",
        "1s",
        "--out-dir",
        "/root/transport",
    ]);
    captured_by_daemon(&o, "capture transport");
    let streams: Vec<serde_json::Value> = std::fs::read_dir(ct.root().join("root/transport"))
        .unwrap()
        .map(|e| envelope(&e.unwrap().path()))
        .collect();
    assert_eq!(streams.len(), 1, "one flow to {peer}: {streams:#?}");
    assert_eq!(streams[0]["subject"]["kind"], "network_stream");
    assert!(
        streams[0]["subject"]
            .to_string()
            .contains(&port.to_string()),
        "the stream is not the one to {peer}: {:#}",
        streams[0]["subject"]
    );

    // Every capture was spooled by the daemon, on the writable state directory.
    let spooled = std::fs::read_dir(ct.root().join("var/lib/pstack/spool"))
        .unwrap()
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
        .count();
    assert!(spooled >= 4, "{spooled} envelopes spooled, 4 captured");

    // And it stops cleanly under the unit's KillMode/TimeoutStopSec.
    run(&mut ct.exec(&["systemctl", "stop", "pstackd.service"]));
    let o = ct.out(&[
        "systemctl",
        "show",
        "-p",
        "Result",
        "-p",
        "ExecMainStatus",
        "pstackd.service",
    ]);
    let shown = String::from_utf8_lossy(&o.stdout);
    assert!(
        shown.contains("Result=success") && shown.contains("ExecMainStatus=0"),
        "pstackd did not stop cleanly:\n{shown}\n{}",
        ct.journal()
    );
}
