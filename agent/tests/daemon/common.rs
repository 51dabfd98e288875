//! The harness: spawn `pstackd` with a config in a temp dir, talk to it,
//! observe its memory and fds, stop it.

use std::io::Write;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use pstack_capture::request::{CaptureRequest, ProcessRequest, RequestedDeadlines};
use pstack_envelope::Envelope;
use pstackctl::client::{self, ClientError};

pub fn is_root() -> bool {
    // SAFETY: geteuid takes no arguments and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

pub fn pstackd_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_pstackd"))
}

pub fn pstackctl_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_pstackctl"))
}

/// Build a sibling workspace binary into the same target dir if it is missing.
pub fn sibling_bin(package: &str, name: &str) -> Option<PathBuf> {
    let dir = pstackd_bin().parent()?.to_path_buf();
    let path = dir.join(name);
    if path.is_file() {
        return Some(path);
    }
    let target_dir = dir.parent()?;
    let profile = dir.file_name()?.to_str()?;
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.args(["build", "-p", package, "--bin", name, "--target-dir"])
        .arg(target_dir);
    if profile == "release" {
        cmd.arg("--release");
    }
    let ok = cmd
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .stdout(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    (ok && path.is_file()).then_some(path)
}

pub fn helper_bin() -> PathBuf {
    static HELPER: OnceLock<Option<PathBuf>> = OnceLock::new();
    HELPER
        .get_or_init(|| sibling_bin("pstack-helper", "pstack-helper"))
        .clone()
        .expect("pstack-helper could not be built: run cargo build -p pstack-helper")
}

/// Settings a test varies.
#[derive(Debug, Clone)]
pub struct Settings {
    pub collector_url: Option<String>,
    pub max_concurrent: usize,
    pub spool_max_bytes: u64,
    pub spool_max_files: u64,
    pub overflow: &'static str,
    pub socket_mode: &'static str,
    pub group: &'static str,
    pub drain_timeout_ms: u64,
    pub ship_timeout_ms: u64,
    pub backoff_initial_ms: u64,
    pub backoff_max_ms: u64,
    pub batch_max_items: usize,
    pub spool_dir: Option<PathBuf>,
    pub api_key: Option<String>,
    pub extra_shipper: String,
    pub extra: String,
    /// Appended to the `[capture]` table.
    pub extra_capture: String,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            collector_url: None,
            max_concurrent: 4,
            spool_max_bytes: 64 << 20,
            spool_max_files: 100_000,
            overflow: "drop_oldest",
            socket_mode: "0660",
            group: "nogroup",
            drain_timeout_ms: 3_000,
            ship_timeout_ms: 2_000,
            backoff_initial_ms: 20,
            backoff_max_ms: 300,
            batch_max_items: 100,
            spool_dir: None,
            api_key: None,
            extra_shipper: String::new(),
            extra: String::new(),
            extra_capture: String::new(),
        }
    }
}

impl Settings {
    pub fn toml(&self, dir: &Path) -> String {
        let spool = self.spool_dir.clone().unwrap_or_else(|| dir.join("spool"));
        let shipper = match &self.collector_url {
            Some(url) => format!(
                "url = \"{url}\"\napi_key_file = \"{}\"\n",
                dir.join("api-key").display()
            ),
            None => String::new(),
        };
        format!(
            r#"socket_path = "{sock}"
socket_mode = "{mode}"
group = "{group}"
max_concurrent_captures = {maxc}
drain_timeout_ms = {drain}
{extra}
[spool]
dir = "{spool}"
max_bytes = {mb}
max_files = {mf}
overflow = "{ov}"

[shipper]
{shipper}{extra_shipper}
timeout_ms = {st}
backoff_initial_ms = {bi}
backoff_max_ms = {bm}
batch_max_items = {bmi}

[capture]
leak_journal = "{leaks}"
helper_path = "{helper}"
digest_key_file = "{digest_key}"
{extra_capture}
"#,
            sock = dir.join("pstackd.sock").display(),
            mode = self.socket_mode,
            group = self.group,
            maxc = self.max_concurrent,
            drain = self.drain_timeout_ms,
            extra = self.extra,
            extra_shipper = self.extra_shipper,
            extra_capture = self.extra_capture,
            spool = spool.display(),
            mb = self.spool_max_bytes,
            mf = self.spool_max_files,
            ov = self.overflow,
            st = self.ship_timeout_ms,
            bi = self.backoff_initial_ms,
            bm = self.backoff_max_ms,
            bmi = self.batch_max_items,
            leaks = dir.join("leaks.jsonl").display(),
            digest_key = dir.join("digest.key").display(),
            helper = helper_bin().display(),
        )
    }
}

/// A running pstackd; killed on drop.
#[derive(Debug)]
pub struct Daemon {
    pub child: Option<Child>,
    pub socket: PathBuf,
    pub log: PathBuf,
}

pub const API_KEY: &str =
    "psk_0123456789abcdef_00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";

impl Daemon {
    /// Write the config into `dir` and start pstackd; wait until it serves.
    pub fn start(dir: &Path, settings: &Settings) -> Daemon {
        Daemon::start_with(dir, settings, |_| {})
    }

    pub fn start_with(dir: &Path, settings: &Settings, tweak: impl FnOnce(&mut Command)) -> Daemon {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(
            dir.join("api-key"),
            format!("{}\n", settings.api_key.as_deref().unwrap_or(API_KEY)),
        )
        .unwrap();
        std::fs::write(dir.join("pstackd.toml"), settings.toml(dir)).unwrap();
        let log = dir.join(format!("pstackd-{:016x}.log", rand_u64()));
        let mut cmd = Command::new(pstackd_bin());
        cmd.arg("--config")
            .arg(dir.join("pstackd.toml"))
            .env("PSTACKD_LOG", "info")
            .env_remove("NOTIFY_SOCKET")
            .env_remove("WATCHDOG_USEC")
            .env_remove("LISTEN_FDS")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap());
        tweak(&mut cmd);
        let child = cmd.spawn().expect("spawn pstackd");
        let d = Daemon {
            child: Some(child),
            socket: dir.join("pstackd.sock"),
            log,
        };
        d.wait_serving(Duration::from_secs(10));
        d
    }

    pub fn pid(&self) -> i32 {
        self.child.as_ref().map(|c| c.id() as i32).unwrap_or(0)
    }

    pub fn wait_serving(&self, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            if client::status(&self.socket, Duration::from_secs(2)).is_ok() {
                return;
            }
            if Instant::now() > deadline {
                panic!(
                    "pstackd did not serve within {within:?}; log:\n{}",
                    self.log_text()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The status document, read as the typed `DaemonStatus` (a missing
    /// field fails here) and handed back as JSON for the tests' lookups.
    pub fn status(&self) -> serde_json::Value {
        let status = client::status(&self.socket, Duration::from_secs(5)).expect("status");
        serde_json::to_value(status).expect("a status document")
    }

    pub fn capture_pid(&self, pid: u32) -> Result<Envelope, ClientError> {
        capture(&self.socket, pid, 3_000)
    }

    pub fn signal(&self, sig: i32) {
        // SAFETY: kill with a pid we spawned and a valid signal number.
        unsafe { libc::kill(self.pid(), sig) };
    }

    /// SIGTERM and wait; returns the exit status and how long it took.
    pub fn terminate(&mut self, within: Duration) -> (ExitStatus, Duration) {
        let start = Instant::now();
        self.signal(libc::SIGTERM);
        let st = self
            .wait(within)
            .unwrap_or_else(|| panic!("pstackd did not exit within {within:?}"));
        (st, start.elapsed())
    }

    pub fn wait(&mut self, within: Duration) -> Option<ExitStatus> {
        let child = self.child.as_mut()?;
        let deadline = Instant::now() + within;
        loop {
            if let Ok(Some(st)) = child.try_wait() {
                self.child = None;
                return Some(st);
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let st = c.wait().unwrap();
            assert_eq!(st.signal(), Some(libc::SIGKILL));
        }
    }

    pub fn rss_kib(&self) -> u64 {
        proc_status_field(self.pid(), "VmRSS:")
    }

    pub fn open_fds(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.pid()))
            .map(|d| d.count())
            .unwrap_or(0)
    }

    pub fn metric_text(&self) -> String {
        let resp = client::request(
            &self.socket,
            "GET",
            "/metrics",
            None,
            Duration::from_secs(5),
        )
        .unwrap();
        String::from_utf8(resp.body).unwrap()
    }

    pub fn metric(&self, name_and_labels: &str) -> u64 {
        let text = self.metric_text();
        text.lines()
            .find_map(|l| {
                l.strip_prefix(name_and_labels)
                    .and_then(|v| v.trim().parse().ok())
            })
            .unwrap_or_else(|| panic!("metric {name_and_labels} not in:\n{text}"))
    }

    /// The watch rule `name` as `/v1/status` shows it.
    pub fn watch_rule(&self, name: &str) -> serde_json::Value {
        let s = self.status();
        s["watch"]["rules"]
            .as_array()
            .and_then(|rs| rs.iter().find(|r| r["name"] == name).cloned())
            .unwrap_or_else(|| panic!("rule {name} not in status: {:#}", s["watch"]))
    }

    /// The watch events pstackd still holds (the recent ones).
    pub fn watch_events(&self) -> Vec<serde_json::Value> {
        let mut out = Vec::new();
        // Each line is read as the typed event by the client (a line that
        // does not fit pstackd-api's WatchEvent fails here) and kept as sent.
        client::follow_watch_events(&self.socket, Duration::from_millis(300), &mut |line, _| {
            out.push(serde_json::from_str(line).expect("a JSON line"));
            true
        })
        .expect("watch events");
        out
    }

    /// Wait until a `captured` watch event matches `want`; that event.
    pub fn wait_captured(
        &self,
        within: Duration,
        what: &str,
        want: impl Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        let deadline = Instant::now() + within;
        loop {
            if let Some(e) = self
                .watch_events()
                .into_iter()
                .find(|e| e["event"] == "captured" && want(e))
            {
                return e;
            }
            if Instant::now() > deadline {
                panic!(
                    "no capture of {what} within {within:?}; events {:#?}\nstatus {:#}\nlog:\n{}",
                    self.watch_events(),
                    self.status()["watch"],
                    self.log_text()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Wait until `f(status)` holds.
    pub fn wait_status(
        &self,
        within: Duration,
        what: &str,
        f: impl Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        let deadline = Instant::now() + within;
        loop {
            let s = self.status();
            if f(&s) {
                return s;
            }
            if Instant::now() > deadline {
                panic!(
                    "timed out waiting for {what}; status: {s:#}\nlog:\n{}",
                    self.log_text()
                );
            }
            std::thread::sleep(Duration::from_millis(25));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

pub fn proc_status_field(pid: i32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next().and_then(|n| n.parse().ok()))
        .unwrap_or(0)
}

pub fn capture(socket: &Path, pid: u32, bundle_ms: u64) -> Result<Envelope, ClientError> {
    let req = CaptureRequest::Process(ProcessRequest {
        pid,
        deadlines: RequestedDeadlines {
            bundle_ms: Some(bundle_ms),
            surface_ms: Some(bundle_ms.min(500)),
        },
        ..Default::default()
    });
    let env = client::capture_via_socket(socket, &req, Duration::from_millis(bundle_ms + 5_000))?;
    // Every envelope the daemon seals agrees with the independent canonicalizer.
    pstack_testkit::check_envelope(&env);
    Ok(env)
}

/// A sleeping process to capture; killed on drop.
#[derive(Debug)]
pub struct Sleeper(pub Child);

impl Sleeper {
    pub fn spawn() -> Sleeper {
        Sleeper(
            Command::new("sleep")
                .arg("600")
                .spawn()
                .expect("spawn sleep"),
        )
    }
    pub fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Sleeper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub fn rand_u64() -> u64 {
    let mut b = [0u8; 8];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        use std::io::Read;
        let _ = f.read_exact(&mut b);
    }
    u64::from_le_bytes(b)
}

/// A sealed example envelope made unique by `n` (for pre-filled spools).
pub fn sealed_example(n: u64) -> (String, Vec<u8>) {
    let mut e = pstack_envelope::example::example_unsealed();
    e.clock.monotonic_start_ns = (10_000_000 + n).to_string();
    let e = e.seal().expect("example seals");
    (e.digest.clone(), serde_json::to_vec(&e).unwrap())
}

pub fn write_spool_file(spool: &Path, digest: &str, bytes: &[u8]) {
    std::fs::create_dir_all(spool).unwrap();
    let hex = digest.strip_prefix("sha256:").unwrap();
    let mut f = std::fs::File::create(spool.join(format!("{hex}.json"))).unwrap();
    f.write_all(bytes).unwrap();
}

pub fn wait_until(within: Duration, what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !f() {
        if Instant::now() > deadline {
            panic!("timed out after {within:?} waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A `pstack-store serve` process on a loopback port with one API key;
/// killed on drop.
pub struct StoreProc {
    child: Child,
    pub addr: std::net::SocketAddr,
    pub key: String,
}

impl StoreProc {
    /// Create a key in `dir/store.db`, serve it, wait until it answers.
    pub fn start(dir: &Path) -> StoreProc {
        let bin = sibling_bin("pstack-store", "pstack-store")
            .expect("pstack-store could not be built (cargo build -p pstack-store)");
        let db = dir.join("store.db");
        let out = Command::new(&bin)
            .arg("--db")
            .arg(&db)
            .args([
                "keys",
                "create",
                "--name",
                "pstackd-test-node",
                "--scope",
                "ingest,read",
            ])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let key = String::from_utf8(out.stdout).unwrap().trim().to_string();
        let addr = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let child = Command::new(&bin)
            .arg("--db")
            .arg(&db)
            .args(["serve", "--listen", &addr.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let store = StoreProc { child, addr, key };
        wait_until(Duration::from_secs(20), "the store serves", || {
            store.get("/v1/envelopes?limit=1").is_some()
        });
        store
    }

    /// `GET path` with the key; status and body, `None` when unreachable.
    pub fn get(&self, path: &str) -> Option<(u16, Vec<u8>)> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .ok()?;
        rt.block_on(async {
            let r = reqwest::Client::new()
                .get(format!("http://{}{path}", self.addr))
                .bearer_auth(&self.key)
                .timeout(Duration::from_secs(10))
                .send()
                .await
                .ok()?;
            let status = r.status().as_u16();
            Some((status, r.bytes().await.ok()?.to_vec()))
        })
    }

    /// The stored envelope `digest`, once shipped (verified).
    pub fn envelope(&self, digest: &str) -> Envelope {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some((200, body)) = self.get(&format!("/v1/envelopes/{digest}")) {
                return pstack_testkit::verify(&body).expect("stored envelope verifies");
            }
            assert!(
                Instant::now() < deadline,
                "{digest} never reached the store"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for StoreProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
