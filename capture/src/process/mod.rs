//! The capture supervisor: risky reads in a killable helper, deadlines,
//! identity re-reads, and assembly of a sealed envelope. Used by
//! `pstackctl capture` now and by `pstackd` next (it is synchronous and
//! runtime-agnostic: call it from `tokio::task::spawn_blocking`).
//!
//! # API
//!
//! ```no_run
//! use pstack_capture::process::{capture, LeakBudget, LeakJournal, SupervisorConfig};
//! use pstack_capture::request::{parse, ProcessLimits, ValidRequest, Validate};
//! let config = SupervisorConfig::locate("pstackd").unwrap();
//! let budget = LeakBudget::new(4, LeakJournal::new("/run/pstack/helper-leaks.jsonl"), &config.boot_id);
//! let limits = ProcessLimits {
//!     surface_deadline_ms: 2_000,
//!     bundle_deadline_ms: 10_000,
//!     max_bundle_deadline_ms: 60_000,
//!     max_threads: 16_384,
//!     max_bytes_per_surface: 64 * 1024,
//!     max_fds: 1024,
//! };
//! // The one way to a plan: a request, validated against the caller's limits.
//! let ValidRequest::Process(plan) = parse(br#"{"kind":"process","pid":4242}"#).unwrap().validate(&limits).unwrap() else {
//!     unreachable!()
//! };
//! let envelope = capture(&plan, &config, &budget).unwrap(); // sealed
//! ```
//!
//! One [`LeakBudget`] is meant to live as long as the process (pstackd shares
//! one across captures; a one-shot CLI adopts leaks still alive from the
//! journal). The [`SupervisorConfig`] is cheap to clone.
//!
//! # Invariants
//!
//! - **Risky reads never run in this process** — `stack`, `wchan`,
//!   `syscall`, `cmdline`, `environ`, fd targets (and `wchan` sweeps in host
//!   captures) go to `pstack-helper` through [`RiskyRun`]. Only reads
//!   that do not take the target's locks (`stat`, `status`, `io`,
//!   `schedstat`, `cgroup`, the `ns/pid` link) run here.
//! - **Network-namespace samples never run in this process either** — the
//!   transport capture's reads go to `pstack-helper --net` through
//!   [`NetHelper`] (same deadline/kill/reap/leak-budget rules),
//!   and no thread of the agent enters another netns.
//! - **No deadline, no capture**: a [`ProcessPlan`] always carries both
//!   deadlines (only the validator builds one, and it refuses zero or
//!   inverted ones); a risky read without one is refused with
//!   [`CaptureError::MissingDeadline`] before any helper is spawned.
//! - **Identity twice**: read before the slow surfaces and again before emit.
//!   Any change (or the subject vanishing) makes the envelope
//!   `identity_race`: surfaces keep their status and digest but their facts
//!   are withheld, and no claim is made. In a host capture, a *process* whose
//!   identity changed gets `identity_race` surfaces instead.
//! - **Claims bound to surfaces**: every fact cites the surfaces that show it;
//!   a universal claim ("no thread is in D") is made only in a `complete`
//!   envelope; every timed-out, denied, failed or skipped surface raises an
//!   unknown with a probe; there is exactly one next transition.
//! - **Timeout is evidence**: each surface records its deadline and elapsed
//!   time; a timeout names the helper and whether it was reaped.
//!
//! # Adding a surface
//!
//! A new risky surface is a `pstack_helper::protocol::SurfaceKind` variant,
//! the `ProcReading` variant that answers it (the collector's typed facts
//! cross the pipe as that type) and a reader in `pstack-collectors`; a new
//! non-risky one is a reader called from [`capture`]'s safe phase. Either
//! gets a [`assemble_readings::SurfaceId`] variant, and — when a claim rule
//! reads it — a [`assemble_readings::Typed`] variant; the rules themselves
//! are pure functions in [`assemble_claims`] with a table row per code.
//!
//! # Off-CPU window (`ProcessPlan::window`)
//!
//! With a window, a process/thread capture also observes the subject's
//! threads with eBPF (`sched_switch` + `sched_wakeup`) for that long, between
//! the two identity reads and concurrently with the risky and safe reads. The
//! result is the `ebpf:offcpu` surface, typed like any other: `ok`,
//! `truncated` (events lost), `unsupported` (no BTF), `permission_denied`
//! (not root / no CAP_BPF+CAP_PERFMON) or `error`. Facts from it (off-CPU
//! time per state, D episodes) cite only that surface and only when it is
//! ok/truncated; a failed one raises an unknown with a probe and makes the
//! envelope `partial`. The window must be shorter than the bundle deadline,
//! and a host capture takes no window. The eBPF side comes from
//! [`SupervisorConfig::offcpu`] (pstackd lends its running session) or, by
//! default, a one-shot session ([`OneShotOffCpu`]).

mod assemble;
pub mod assemble_claims;
pub mod assemble_readings;
mod assemble_unknowns;
mod capture;
pub mod selection;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use pstack_collectors::procfs::ReadError;
use pstack_envelope::Surface;

pub use capture::{MAX_WINDOW, capture};
// The helper machinery a process capture runs on (capture/src/helpers), named
// here too because every caller of the process engine configures it.
pub use crate::helpers::leak::{HelperIdentity, JournalEntry, LeakBudget, LeakJournal};
pub use crate::helpers::net_helper::{NetHelper, NetHelperFailure, NetReading};
pub use crate::helpers::risky::{EarlyHelper, RiskyOutcome, RiskyRead, RiskyRun, run_risky};
pub use selection::{SelectionError, SurfaceFamily, SurfaceSelection, UnknownSurface};

/// What to capture.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// A process and all its threads (up to `max_threads`).
    Process {
        /// Its pid (a thread-group id).
        pid: u32,
    },
    /// One thread.
    Thread {
        /// Its tid.
        tid: u32,
    },
    /// Every process on the host (threads up to `max_threads`).
    Host,
}

/// The deadlines a capture runs under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deadlines {
    /// Each surface's deadline.
    pub surface: Duration,
    /// The whole capture's deadline.
    pub bundle: Duration,
}

/// The most file descriptors a capture reads unless its caller says less.
pub const DEFAULT_MAX_FDS: u64 = 1024;

/// A validated process, thread or host capture: what [`capture`] runs.
///
/// Outside this crate a plan can only come from the one validator,
/// `pstack_capture::request` (`Validate::validate` on a wire request, or
/// `process_plan` for the CLI's flags): the fields are crate-private and
/// there is no `Default`, so the engine never receives deadlines, caps, a
/// window or a surface selection that were not checked. Inside the crate
/// only `request.rs` builds one. The engine reads the fields as given and
/// checks none of them again.
///
/// What a plan guarantees: both deadlines are positive and the surface
/// deadline is at most the bundle's; the caps are positive and within the
/// caller's limits (bytes per surface also within what the helper protocol
/// carries); a window is within [`MAX_WINDOW`], shorter than the bundle
/// deadline, and only on a process or thread; `surfaces` is resolved
/// against the target and window; a pid or tid is not 0.
#[derive(Debug, Clone)]
pub struct ProcessPlan {
    pub(crate) target: Target,
    pub(crate) deadlines: Deadlines,
    pub(crate) max_threads: u64,
    pub(crate) max_bytes_per_surface: u64,
    pub(crate) max_fds: u64,
    pub(crate) window: Option<Duration>,
    pub(crate) surfaces: SurfaceSelection,
    pub(crate) trigger: Option<pstack_envelope::Trigger>,
}

impl ProcessPlan {
    /// What is captured.
    pub fn target(&self) -> Target {
        self.target
    }
    /// The deadlines it runs under.
    pub fn deadlines(&self) -> Deadlines {
        self.deadlines
    }
    /// Universe cap: most threads read.
    pub fn max_threads(&self) -> u64 {
        self.max_threads
    }
    /// Most raw bytes kept per surface.
    pub fn max_bytes_per_surface(&self) -> u64 {
        self.max_bytes_per_surface
    }
    /// Most file descriptors read.
    pub fn max_fds(&self) -> u64 {
        self.max_fds
    }
    /// The off-CPU observation window (eBPF), if any.
    pub fn window(&self) -> Option<Duration> {
        self.window
    }
    /// The surfaces read, resolved against the target and window.
    pub fn surfaces(&self) -> &SurfaceSelection {
        &self.surfaces
    }
    /// The watch rule that started this capture (none for an operator's).
    pub fn trigger(&self) -> Option<&pstack_envelope::Trigger> {
        self.trigger.as_ref()
    }
    /// The same plan, started by a watch rule: the trigger is recorded in
    /// the envelope and changes nothing that was validated.
    pub fn with_trigger(mut self, trigger: pstack_envelope::Trigger) -> Self {
        self.trigger = Some(trigger);
        self
    }
}

/// Where the `ebpf:offcpu` surface of a windowed capture comes from.
///
/// `observe` watches process `pid`'s threads for `window` and returns the
/// surfaces (exactly one, `ebpf:offcpu`). It never fails: a failure is the
/// same surface with a non-ok status. It is called from a thread of the
/// capture; it blocks for about `window`.
pub trait OffCpuSource: Send + Sync {
    /// Observe `pid`'s threads for `window`.
    fn observe(&self, pid: u32, window: Duration) -> Vec<Surface>;

    /// The caps the source's session enforces on a window (declared in the
    /// envelope's `bounds.caps`). Default: an off-CPU session's defaults.
    fn limits(&self) -> pstack_ebpf::Limits {
        pstack_ebpf::EbpfConfig::offcpu(Vec::new()).limits
    }
}

/// The default [`OffCpuSource`]: a fresh eBPF session per capture
/// ([`pstack_ebpf::capture_blocking`]; ~70 ms of CPU to load).
#[derive(Debug, Clone, Copy, Default)]
pub struct OneShotOffCpu;

impl OffCpuSource for OneShotOffCpu {
    fn observe(&self, pid: u32, window: Duration) -> Vec<Surface> {
        pstack_ebpf::capture_blocking(pstack_ebpf::EbpfConfig::offcpu(vec![pid]), window)
    }
}

/// Hook called with each helper right after it is spawned, before it is sent
/// its batch (e.g. to place it in a cgroup).
pub type HelperSpawnHook = Arc<dyn Fn(&HelperIdentity) + Send + Sync>;

/// How the supervisor runs helpers.
#[derive(Clone)]
pub struct SupervisorConfig {
    /// Path of the `pstack-helper` binary.
    pub helper_path: PathBuf,
    /// How long to wait for a SIGKILLed helper to be reaped before declaring
    /// it leaked. Longer tolerates a loaded host; shorter returns sooner.
    pub reap_deadline: Duration,
    /// `collector.name` in envelopes.
    pub collector_name: String,
    /// `collector.source_commit` in envelopes.
    pub source_commit: String,
    /// This boot's id.
    pub boot_id: String,
    /// Called with each spawned helper.
    pub on_helper_spawned: Option<HelperSpawnHook>,
    /// Source of the off-CPU window; `None` uses [`OneShotOffCpu`].
    pub offcpu: Option<Arc<dyn OffCpuSource>>,
    /// The host's digest key for `cmdline` arguments and `environ` blocks
    /// (see [`crate::digest_key`]); [`SupervisorConfig::new`] starts with a
    /// random one.
    pub digest_key: crate::digest_key::SharedDigestKey,
    /// The node kubelet's read-only endpoint (e.g. `http://127.0.0.1:10255`):
    /// `k8s/pod` reads `GET {url}/pods` for a process in a pod. `None`:
    /// `k8s/pod` is `unsupported`.
    pub kubelet_url: Option<String>,
}

impl std::fmt::Debug for SupervisorConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SupervisorConfig")
            .field("helper_path", &self.helper_path)
            .field("reap_deadline", &self.reap_deadline)
            .field("collector_name", &self.collector_name)
            .field("source_commit", &self.source_commit)
            .field("boot_id", &self.boot_id)
            .field("on_helper_spawned", &self.on_helper_spawned.is_some())
            .field("offcpu", &self.offcpu.is_some())
            .field("kubelet_url", &self.kubelet_url)
            .finish()
    }
}

/// Largest kubelet `/pods` answer read (a node's whole pod list).
pub(crate) const MAX_POD_LIST_BYTES: u64 = 16 << 20;

/// Default reap deadline.
pub const DEFAULT_REAP_DEADLINE: Duration = Duration::from_millis(200);

/// The commit this build came from, recorded in every envelope's
/// `collector.source_commit` (set by `packaging/source_commit.rs`).
pub const SOURCE_COMMIT: &str = env!("PSTACK_SOURCE_COMMIT");

/// What `--version` prints: `0.1.0 (commit <SOURCE_COMMIT>)`.
pub const VERSION: &str = env!("PSTACK_VERSION");

impl SupervisorConfig {
    /// A config using the helper at `helper_path`.
    pub fn new(
        collector_name: &str,
        helper_path: PathBuf,
    ) -> Result<SupervisorConfig, CaptureError> {
        let host = pstack_collectors::procfs::read_host_facts().map_err(CaptureError::HostFacts)?;
        let key = crate::digest_key::random_key().map_err(CaptureError::DigestKey)?;
        Ok(SupervisorConfig {
            digest_key: Arc::new(std::sync::RwLock::new(key)),
            helper_path,
            reap_deadline: DEFAULT_REAP_DEADLINE,
            collector_name: collector_name.to_string(),
            source_commit: SOURCE_COMMIT.to_string(),
            boot_id: host.boot_id,
            on_helper_spawned: None,
            offcpu: None,
            kubelet_url: None,
        })
    }

    /// A config with the helper found by [`locate_helper`].
    pub fn locate(collector_name: &str) -> Result<SupervisorConfig, CaptureError> {
        SupervisorConfig::new(collector_name, locate_helper()?)
    }
}

/// Find `pstack-helper`: `$PSTACK_HELPER`, else next to the running
/// executable, else one directory up (test binaries live in `target/*/deps`).
pub fn locate_helper() -> Result<PathBuf, CaptureError> {
    if let Some(p) = std::env::var_os("PSTACK_HELPER") {
        let p = PathBuf::from(p);
        return if p.is_file() {
            Ok(p)
        } else {
            Err(CaptureError::HelperNotFound { searched: vec![p] })
        };
    }
    let mut searched = Vec::new();
    if let Ok(exe) = std::env::current_exe() {
        let mut dir = exe.parent().map(PathBuf::from);
        for _ in 0..2 {
            let Some(d) = dir else { break };
            let candidate = d.join("pstack-helper");
            if candidate.is_file() {
                return Ok(candidate);
            }
            searched.push(candidate);
            dir = d.parent().map(PathBuf::from);
        }
    }
    Err(CaptureError::HelperNotFound { searched })
}

/// Why a capture could not produce an envelope at all. Anything that goes
/// wrong with a *surface* is a surface status instead.
#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    /// No random digest key could be made (`/dev/urandom` unreadable).
    #[error("cannot make a digest key from /dev/urandom: {0}")]
    DigestKey(std::io::Error),
    /// A request or a risky read without a deadline.
    #[error("refused: surface {surface} has no deadline (every risky read must carry one)")]
    MissingDeadline {
        /// The surface (or `*` for the whole request).
        surface: String,
    },
    /// A parameter out of range.
    #[error("invalid {param}: {reason}")]
    InvalidParameter {
        /// Which.
        param: &'static str,
        /// Why.
        reason: String,
    },
    /// The target names no process.
    #[error("no such process: {what} {id} does not exist")]
    NoSuchProcess {
        /// `pid` or `tid`.
        what: &'static str,
        /// The id.
        id: u32,
    },
    /// The target's identity could not be read.
    #[error("cannot read the identity of {id}: {error}{}", .advice.as_ref().map(|a| format!(" ({a})")).unwrap_or_default())]
    IdentityUnreadable {
        /// The id.
        id: u32,
        /// Why.
        error: ReadError,
        /// For a permission denial: what to do, true for who was refused
        /// (see [`crate::helpers::denial::explain`]).
        advice: Option<String>,
    },
    /// Host facts (hostname, boot id) could not be read.
    #[error("cannot read host facts: {0}")]
    HostFacts(ReadError),
    /// The helper binary is missing.
    #[error("pstack-helper not found (searched: {}); set PSTACK_HELPER or install it next to pstackctl", .searched.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", "))]
    HelperNotFound {
        /// Paths tried.
        searched: Vec<PathBuf>,
    },
    /// The assembled envelope broke a rule (a defect in the supervisor): the
    /// envelope builder refused a part of it, or the validator the result.
    #[error("internal: the envelope would not seal: {0}")]
    Seal(#[from] pstack_envelope::BuildError),
}
