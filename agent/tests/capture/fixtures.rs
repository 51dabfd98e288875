//! Planted fixtures: processes in each state, a cgroup-v1 freezer guard, a
//! FUSE server that stops answering, and supervisor setup.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use pstack_capture::process::{
    self, DEFAULT_MAX_FDS, LeakBudget, LeakJournal, ProcessPlan, SupervisorConfig, Target,
};
use pstack_capture::request::{
    ProcessLimits, RequestError, RequestedCaps, RequestedDeadlines, process_plan,
};
use pstack_envelope::{Envelope, Surface};

pub fn is_root() -> bool {
    // SAFETY: geteuid has no arguments and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// The supervisor config for tests; the helper sits next to the test binary's
/// parent directory (`target/<profile>/pstack-helper`).
pub fn config() -> SupervisorConfig {
    let mut c = SupervisorConfig::locate("pstack-test").unwrap_or_else(|e| {
        panic!("{e}\nbuild the helper first: cargo build -p pstack-helper (cargo test --workspace does)")
    });
    c.reap_deadline = Duration::from_millis(150);
    c
}

pub fn budget(dir: &Path, capacity: u64) -> LeakBudget {
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
    LeakBudget::new(
        capacity,
        LeakJournal::new(dir.join("leaks.jsonl")),
        boot.trim(),
    )
}

/// The tests' limits: wide enough for every test, which narrows through
/// what it asks ([`Ask`]), as a caller of pstackd does.
pub const LIMITS: ProcessLimits = ProcessLimits {
    surface_deadline_ms: 2_000,
    bundle_deadline_ms: 10_000,
    max_bundle_deadline_ms: 600_000,
    max_threads: 16_384,
    max_bytes_per_surface: 64 * 1024,
    max_fds: DEFAULT_MAX_FDS,
};

/// What a test asks beyond the target and deadlines: the optional parts of
/// a wire request.
#[derive(Debug, Default)]
pub struct Ask {
    pub max_threads: Option<u64>,
    pub max_bytes_per_surface: Option<u64>,
    pub window_ms: Option<u64>,
    pub surfaces: Option<Vec<String>>,
}

/// A plan through the one validator (`pstack_capture::request`), the only
/// way to a plan the engine runs.
pub fn plan(
    target: Target,
    surface_ms: u64,
    bundle_ms: u64,
    ask: Ask,
) -> Result<ProcessPlan, RequestError> {
    process_plan(
        target,
        &RequestedDeadlines {
            surface_ms: Some(surface_ms),
            bundle_ms: Some(bundle_ms),
        },
        &RequestedCaps {
            max_threads: ask.max_threads,
            max_bytes_per_surface: ask.max_bytes_per_surface,
        },
        ask.window_ms,
        &ask.surfaces,
        &LIMITS,
    )
}

/// A plan with the default caps and every surface.
pub fn request(target: Target, surface_ms: u64, bundle_ms: u64) -> ProcessPlan {
    plan(target, surface_ms, bundle_ms, Ask::default())
        .unwrap_or_else(|e| panic!("a test plan was refused: {e}"))
}

/// A plan with an off-CPU window of `window_ms`.
pub fn windowed(
    target: Target,
    surface_ms: u64,
    bundle_ms: u64,
    window_ms: u64,
) -> Result<ProcessPlan, RequestError> {
    plan(
        target,
        surface_ms,
        bundle_ms,
        Ask {
            window_ms: Some(window_ms),
            ..Ask::default()
        },
    )
}

/// The names of surfaces, as a request carries them.
pub fn names(surfaces: &[&str]) -> Option<Vec<String>> {
    Some(surfaces.iter().map(|s| s.to_string()).collect())
}

/// `process::capture`, plus the independent-canonicalizer check on every envelope
/// it seals (pstack-testkit): the capture tests all go through here.
pub fn sealed_capture(
    request: &ProcessPlan,
    config: &SupervisorConfig,
    budget: &LeakBudget,
) -> Result<Envelope, pstack_capture::process::CaptureError> {
    let env = process::capture(request, config, budget)?;
    pstack_testkit::check_envelope(&env);
    Ok(env)
}

/// Capture a process with generous deadlines.
pub fn capture_pid(pid: u32) -> Envelope {
    let dir = tempfile::tempdir().unwrap();
    sealed_capture(
        &request(Target::Process { pid }, 2000, 10_000),
        &config(),
        &budget(dir.path(), 4),
    )
    .unwrap()
}

pub fn surface<'a>(env: &'a Envelope, id: &str) -> &'a Surface {
    env.surfaces.iter().find(|s| s.id == id).unwrap_or_else(|| {
        panic!(
            "no surface {id}; have {:?}",
            env.surfaces.iter().map(|s| &s.id).collect::<Vec<_>>()
        )
    })
}

/// A child killed and reaped on drop.
pub struct Proc(pub Child);

impl Proc {
    pub fn spawn(cmd: &str, args: &[&str]) -> Proc {
        Proc(
            Command::new(cmd)
                .args(args)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .spawn()
                .unwrap(),
        )
    }
    pub fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        // Bounded: a frozen process cannot be reaped until its freezer thaws
        // (a Freezer guard dropped later does that and kills it again).
        let until = Instant::now() + Duration::from_secs(5);
        while Instant::now() < until {
            if !matches!(self.0.try_wait(), Ok(None)) {
                return;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        eprintln!("warning: fixture pid {} not reaped within 5 s", self.0.id());
    }
}

pub fn state_of(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

/// Wait until `pid` shows `state` (true) or 5 s pass (false).
pub fn wait_state(pid: u32, state: char) -> bool {
    let until = Instant::now() + Duration::from_secs(5);
    while Instant::now() < until {
        if state_of(pid) == Some(state) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    false
}

static SEQ: AtomicU32 = AtomicU32::new(0);

/// A cgroup-v1 freezer cgroup, thawed, emptied and removed on drop.
pub struct Freezer {
    pub dir: PathBuf,
}

pub const FREEZER_ROOT: &str = "/sys/fs/cgroup/freezer";

impl Freezer {
    /// `None` when the freezer hierarchy is not mounted (printed by callers).
    pub fn new(tag: &str) -> Option<Freezer> {
        if !Path::new(FREEZER_ROOT).join("cgroup.procs").exists() {
            return None;
        }
        let dir = Path::new(FREEZER_ROOT).join(format!(
            "pstack-test-{}-{tag}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::SeqCst)
        ));
        std::fs::create_dir(&dir).unwrap();
        Some(Freezer { dir })
    }

    pub fn add(&self, pid: u32) {
        std::fs::write(self.dir.join("cgroup.procs"), pid.to_string()).unwrap();
    }

    fn set(&self, state: &str) {
        std::fs::write(self.dir.join("freezer.state"), state).unwrap();
    }

    pub fn state(&self) -> String {
        std::fs::read_to_string(self.dir.join("freezer.state"))
            .unwrap_or_default()
            .trim()
            .to_string()
    }

    /// Freeze and wait until the kernel reports FROZEN.
    pub fn freeze(&self) {
        self.set("FROZEN");
        let until = Instant::now() + Duration::from_secs(5);
        while self.state() != "FROZEN" && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(2));
        }
        assert_eq!(
            self.state(),
            "FROZEN",
            "freezer {} did not freeze",
            self.dir.display()
        );
    }

    pub fn thaw(&self) {
        self.set("THAWED");
    }
}

impl Drop for Freezer {
    fn drop(&mut self) {
        let _ = std::fs::write(self.dir.join("freezer.state"), "THAWED");
        let until = Instant::now() + Duration::from_secs(5);
        loop {
            let procs = std::fs::read_to_string(self.dir.join("cgroup.procs")).unwrap_or_default();
            if procs.trim().is_empty() || Instant::now() > until {
                break;
            }
            for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
                // SAFETY: kill(2) with a pid read from our own test cgroup.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// Spawn a process with exactly `pid` by steering `ns_last_pid` (root, init
/// pid namespace). `None` if another process keeps taking it.
pub fn spawn_with_pid(pid: u32) -> Option<Proc> {
    for _ in 0..200 {
        std::fs::write("/proc/sys/kernel/ns_last_pid", (pid - 1).to_string()).ok()?;
        let p = Proc::spawn("sleep", &["1000"]);
        if p.pid() == pid {
            return Some(p);
        }
    }
    None
}

// ---- FUSE: a server that answers until told to hang, then never answers ----

#[path = "../support/fuse_wire.rs"]
mod fuse_wire;
use fuse_wire::*;

/// A FUSE mount served by a thread of this process over raw `/dev/fuse`.
pub struct HangingFuse {
    pub mountpoint: tempfile::TempDir,
    pub hang: Arc<AtomicBool>,
    /// Requests read (and not answered) while hanging.
    pub unanswered: Arc<AtomicU32>,
    server: Option<std::thread::JoinHandle<()>>,
}

impl HangingFuse {
    /// Mount; `None` (with the reason) when FUSE is unavailable.
    pub fn mount() -> Result<HangingFuse, String> {
        let dev = c"/dev/fuse";
        // SAFETY: NUL-terminated path; flags are constants.
        let fd = unsafe { libc::open(dev.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
        if fd < 0 {
            return Err(format!(
                "cannot open /dev/fuse: {}",
                std::io::Error::last_os_error()
            ));
        }
        let mountpoint = tempfile::tempdir().unwrap();
        let target =
            std::ffi::CString::new(mountpoint.path().as_os_str().as_encoded_bytes()).unwrap();
        let opts =
            std::ffi::CString::new(format!("fd={fd},rootmode=40000,user_id=0,group_id=0")).unwrap();
        // SAFETY: all pointers are NUL-terminated strings that outlive the call.
        let rc = unsafe {
            libc::mount(
                c"pstack-test".as_ptr(),
                target.as_ptr(),
                c"fuse".as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV,
                opts.as_ptr().cast(),
            )
        };
        if rc != 0 {
            let e = std::io::Error::last_os_error();
            // SAFETY: fd was opened above.
            unsafe { libc::close(fd) };
            return Err(format!("mount -t fuse failed: {e}"));
        }
        let hang = Arc::new(AtomicBool::new(false));
        let unanswered = Arc::new(AtomicU32::new(0));
        let (h, u) = (hang.clone(), unanswered.clone());
        let server = std::thread::spawn(move || {
            let mut buf = vec![0u8; 1 << 20 | 4096];
            loop {
                // SAFETY: buf is a live, writable buffer of buf.len() bytes.
                let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
                if n < 0 {
                    let e = std::io::Error::last_os_error();
                    if e.raw_os_error() == Some(libc::EINTR)
                        || e.raw_os_error() == Some(libc::EAGAIN)
                    {
                        continue;
                    }
                    break; // ENODEV after abort/unmount
                }
                let n = n as usize;
                if n < 40 {
                    continue;
                }
                let opcode = u32::from_ne_bytes(buf[4..8].try_into().unwrap());
                let unique = u64::from_ne_bytes(buf[8..16].try_into().unwrap());
                if matches!(opcode, FUSE_FORGET | FUSE_BATCH_FORGET | FUSE_INTERRUPT) {
                    continue;
                }
                if h.load(Ordering::SeqCst) && opcode != FUSE_INIT {
                    u.fetch_add(1, Ordering::SeqCst);
                    continue; // accepted, never answered
                }
                match opcode {
                    FUSE_INIT => {
                        let mut body = Vec::new();
                        body.extend_from_slice(&7u32.to_ne_bytes()); // major
                        body.extend_from_slice(&31u32.to_ne_bytes()); // minor
                        body.extend_from_slice(&0u32.to_ne_bytes()); // max_readahead
                        body.extend_from_slice(&0u32.to_ne_bytes()); // flags
                        body.extend_from_slice(&16u16.to_ne_bytes()); // max_background
                        body.extend_from_slice(&12u16.to_ne_bytes()); // congestion_threshold
                        body.extend_from_slice(&4096u32.to_ne_bytes()); // max_write
                        body.extend_from_slice(&1u32.to_ne_bytes()); // time_gran
                        body.extend_from_slice(&[0u8; 64 - 28]); // max_pages .. unused: 64-byte fuse_init_out
                        reply(fd, unique, 0, &body);
                    }
                    FUSE_GETATTR => reply(fd, unique, 0, &attr(libc::S_IFDIR | 0o755, 0, 2)),
                    FUSE_OPENDIR => reply(fd, unique, 0, &[0u8; 16]),
                    FUSE_LOOKUP => reply(fd, unique, -libc::ENOENT, &[]),
                    _ => reply(fd, unique, -libc::ENOSYS, &[]),
                }
            }
            // SAFETY: fd is owned by this thread from here on.
            unsafe { libc::close(fd) };
        });
        Ok(HangingFuse {
            mountpoint,
            hang,
            unanswered,
            server: Some(server),
        })
    }

    /// Abort the connection (every waiter gets an error) and detach the mount.
    pub fn abort(&mut self) {
        let target =
            std::ffi::CString::new(self.mountpoint.path().as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: NUL-terminated path. MNT_FORCE on FUSE aborts the connection.
        unsafe { libc::umount2(target.as_ptr(), libc::MNT_FORCE) };
        // SAFETY: as above; lazily detach whatever is left.
        unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
        if let Some(s) = self.server.take() {
            let _ = s.join();
        }
    }
}

impl Drop for HangingFuse {
    fn drop(&mut self) {
        self.abort();
    }
}
