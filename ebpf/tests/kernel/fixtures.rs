//! Real fixtures: network namespaces, nftables rules inside them, a cgroup-v1
//! freezer cgroup, child processes. Every one is a Drop guard that undoes
//! itself (namespace deleted with its rules, cgroup thawed and removed,
//! children killed and reaped), so a failing assertion leaves nothing behind.

use std::io::Write;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

static SEQ: AtomicU32 = AtomicU32::new(0);

/// Run a command; panic with its stderr when it fails.
pub fn sh(cmd: &str, args: &[&str], stdin: Option<&str>) {
    let mut c = Command::new(cmd)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {cmd}: {e}"));
    if let Some(s) = stdin {
        c.stdin
            .take()
            .expect("stdin")
            .write_all(s.as_bytes())
            .expect("write stdin");
    }
    let out = c.wait_with_output().expect("wait");
    assert!(
        out.status.success(),
        "{cmd} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Whether a tool is on PATH.
pub fn have(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .stdout(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// A network namespace with `lo` up; deleted (with its nftables rules) on drop.
#[derive(Debug)]
pub struct NetNs {
    pub name: String,
    pub ino: u32,
}

impl NetNs {
    pub fn new() -> NetNs {
        let name = format!(
            "pstk-ebpf-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        );
        sh("ip", &["netns", "add", &name], None);
        let mut ns = NetNs { ino: 0, name };
        sh("ip", &["-n", &ns.name, "link", "set", "lo", "up"], None);
        use std::os::unix::fs::MetadataExt;
        ns.ino = std::fs::metadata(ns.path()).expect("netns file").ino() as u32;
        ns
    }

    pub fn path(&self) -> PathBuf {
        PathBuf::from("/run/netns").join(&self.name)
    }

    /// Load a one-chain input-hook nftables table with `rule` into namespace `name`
    /// (gone with the namespace). nft 1.0.6 wants newlines, not `;`, before `}`.
    pub fn nft_input_rule(name: &str, rule: &str) {
        let ruleset = format!(
            "table inet pstack_test {{\n chain input {{\n  type filter hook input priority 0;\n  {rule}\n }}\n}}\n"
        );
        sh(
            "ip",
            &["netns", "exec", name, "nft", "-f", "-"],
            Some(&ruleset),
        );
    }

    /// Run `f` on a thread that lives in this namespace.
    pub fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> std::thread::JoinHandle<T> {
        let file = std::fs::File::open(self.path()).expect("open netns");
        std::thread::spawn(move || {
            nix::sched::setns(file.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
            f()
        })
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}

/// A loopback listener on an ephemeral port (in the calling thread's netns).
pub fn listener() -> (TcpListener, SocketAddr) {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let a = l.local_addr().expect("addr");
    (l, a)
}

/// Connect with a timeout.
pub fn connect(a: SocketAddr) -> std::io::Result<TcpStream> {
    TcpStream::connect_timeout(&a, Duration::from_secs(5))
}

/// A cgroup-v1 freezer cgroup; on drop: thawed, members moved out, removed.
#[derive(Debug)]
pub struct Freezer {
    pub dir: PathBuf,
}

pub const FREEZER_ROOT: &str = "/sys/fs/cgroup/freezer";

impl Freezer {
    pub fn available() -> bool {
        Path::new(FREEZER_ROOT).join("cgroup.procs").exists()
    }

    pub fn new() -> Freezer {
        let dir = Path::new(FREEZER_ROOT).join(format!(
            "pstack-ebpf-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir(&dir).expect("mkdir freezer cgroup");
        Freezer { dir }
    }

    pub fn add(&self, pid: u32) {
        std::fs::write(self.dir.join("cgroup.procs"), pid.to_string()).expect("join cgroup");
    }

    pub fn freeze(&self) {
        std::fs::write(self.dir.join("freezer.state"), "FROZEN").expect("freeze");
        let t = Instant::now();
        while self.state() != "FROZEN" {
            assert!(
                t.elapsed() < Duration::from_secs(5),
                "cgroup did not freeze"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    pub fn thaw(&self) {
        let _ = std::fs::write(self.dir.join("freezer.state"), "THAWED");
    }

    pub fn state(&self) -> String {
        std::fs::read_to_string(self.dir.join("freezer.state"))
            .unwrap_or_default()
            .trim()
            .to_string()
    }
}

impl Drop for Freezer {
    fn drop(&mut self) {
        self.thaw();
        if let Ok(procs) = std::fs::read_to_string(self.dir.join("cgroup.procs")) {
            for p in procs.split_whitespace() {
                let _ = std::fs::write(Path::new(FREEZER_ROOT).join("cgroup.procs"), p);
            }
        }
        let t = Instant::now();
        while std::fs::remove_dir(&self.dir).is_err() && t.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// A child process killed and reaped on drop.
#[derive(Debug)]
pub struct Kid(pub Child);

impl Kid {
    pub fn sh(script: &str) -> Kid {
        Kid(Command::new("sh")
            .args(["-c", script])
            .stdin(Stdio::null())
            .spawn()
            .expect("spawn sh"))
    }
    pub fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Kid {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Resident set size of this process, bytes.
pub fn rss_bytes() -> u64 {
    let s = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = s
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

/// Run `work` on a thread in `ns` with a loopback listener bound there, while a
/// session filtered (in the kernel) to the listener's port runs one window:
/// the listener is bound first, the session started with `cfg.port` set to its
/// port, and `work` released 100 ms into the window; the window ends 300 ms
/// after `work` returns (or at `window`, whichever is first). Traffic of other tests
/// (a parallel flood) never reaches this session's ring buffer.
pub fn in_port_window<T: Send + 'static>(
    ns: &NetNs,
    mut cfg: pstack_ebpf::EbpfConfig,
    window: Duration,
    work: impl FnOnce(TcpListener) -> T + Send + 'static,
) -> (pstack_ebpf::WindowReport, T, pstack_ebpf::EbpfSession) {
    let (port_tx, port_rx) = std::sync::mpsc::channel();
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
    let h = ns.run(move || {
        let (l, a) = listener();
        port_tx.send(a.port()).expect("send port");
        go_rx.recv().expect("go");
        let out = work(l);
        // Let the last segments and state changes land, then end the window early.
        std::thread::sleep(Duration::from_millis(300));
        let _ = done_tx.send(());
        out
    });
    cfg.port = Some(port_rx.recv().expect("port"));
    let mut s = crate::session(cfg);
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(100));
        let _ = go_tx.send(());
    });
    let report = s
        .run_window_blocking_until(window, |_| {}, done_rx)
        .expect("window");
    let out = h.join().unwrap_or_else(|e| std::panic::resume_unwind(e));
    (report, out, s)
}
