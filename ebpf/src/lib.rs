//! `pstack-ebpf`: pstack's eBPF surfaces — TCP retransmits, resets (with the
//! direction: which endpoint reset the stream), TCP state changes (stream
//! lifetimes) and off-CPU / D-state time — from C CO-RE programs loaded with
//! aya.
//!
//! # Layout
//! - `ebpf/bpf/*.bpf.c` + `pstack_events.h`: the programs and the record ABI.
//!   Compiled objects are committed and embedded ([`objects`]); `ebpf/build.sh`
//!   rebuilds them, `ebpf/build.sh --check` proves the committed bytes match.
//! - [`record`] and [`flow_record`] decode records (pure), [`aggregate`] and [`offcpu`] fold them
//!   into bounded per-flow / per-task summaries (pure), [`flight`] keeps the
//!   last minute of per-flow TCP aggregates on watched ports, [`surface`] turns a
//!   window into `pstack_envelope::Surface`s, [`session`] owns the kernel side.
//!
//! # Three TCP modes (one object, read-only flags set at load)
//! - **aggregated** (default; capture windows): the kernel folds each event
//!   into its socket's entry of an LRU hash (`FLOWS`: retransmits split into
//!   RTO / fast / other, resets each way with the last reason, bytes, first
//!   and last time, the first 8 transitions). Ring records only for resets,
//!   a flow leaving ESTABLISHED, a flow's first retransmit, a uniform
//!   1/`sample_one_in` sample of the rest, and one flow record per flow at
//!   CLOSE; live flows are read from the map at window end. Counts are exact
//!   or the surface is `truncated` with the reason ([`aggregate`]).
//! - **per-event** (`tcp_per_event`; debug, `pstackctl trace tcp`, the
//!   flight recorder): a record per event, folded in user space — the mode
//!   the aggregated one is checked against (kernel test `aggregated`).
//! - **count-only** (`tcp_count_only`; pstackd's always-attached session):
//!   per-CPU counters per kind, nothing else.
//!
//! # API for pstackd and `pstackctl capture --window`
//! ```no_run
//! use std::time::Duration;
//! use pstack_ebpf::{EbpfConfig, EbpfSession, EbpfStatus};
//!
//! # async fn daemon() {
//! // pstackd: keep the programs attached while it runs.
//! let mut cfg = EbpfConfig::tcp();
//! cfg.offcpu = true;
//! cfg.watch_pids = vec![];          // add subjects later with session.watch(pid)
//! cfg.watch_all = false;
//! # cfg.watch_all = true;
//! let status = match EbpfSession::start(cfg) {
//!     Ok(mut session) => {
//!         // /v1/status (serde JSON) and /metrics (`write_metrics`): programs,
//!         // events and drops, cumulative since load.
//!         let status: EbpfStatus = session.status().expect("counters readable");
//!         let mut metrics = pstack_exposition::Exposition::new();
//!         status.write_metrics(&mut metrics);
//!         // Subjects come and go: session.watch(pid) / session.unwatch(pid).
//!         // One capture window; surfaces for the envelope. `run_window_until`
//!         // also ends early on a shutdown future. The future is Send.
//!         let report = session.run_window(Duration::from_secs(5), |_event| {}).await.unwrap();
//!         let _surfaces = report.surfaces();
//!         status
//!     }
//!     // Degraded, typed: state is "unsupported" | "permission_denied" | "error".
//!     Err(e) => EbpfStatus::failed(&e),
//! };
//! # let _ = status;
//! # }
//! // pstackctl capture --pid N --window 5s (synchronous, never fails: a
//! // failure comes back as the same surface ids with a non-ok status).
//! let surfaces = pstack_ebpf::capture_blocking(EbpfConfig::offcpu(vec![4242]), Duration::from_secs(5));
//! # let _ = surfaces;
//! ```
//!
//! # Flight recorder (pstackd's `tcp_reset` / `tcp_rto` watch rules)
//! ```no_run
//! use pstack_ebpf::{FlightConfig, FlightRecorder, FlowIncident};
//!
//! // Its own session: TCP programs recording only ports 10000-20000 (kernel filter).
//! let mut rec = FlightRecorder::start(FlightConfig::default())?; // NoBtf / PermissionDenied typed
//! loop {
//!     // Non-blocking; call every ~100 ms-1 s (the ring holds ~2 300 records).
//!     for incident in rec.poll() {
//!         if let FlowIncident::Reset { flow, received_from_peer, .. } = &incident {
//!             // What the flow did in the last 60 s, per second, and how far back that reaches.
//!             let history = rec.history(flow);
//!             let _ = (received_from_peer, history);
//!         }
//!     }
//!     let _stats = rec.stats(); // flows, evicted, folded, lost in the kernel, started_at_ns
//! #   break;
//! }
//! # Ok::<(), pstack_ebpf::EbpfError>(())
//! ```
//! The folding itself is [`FlowBook`] (pure, table-tested); the recorder only
//! owns the session and feeds it.
//!
//! A session is `Send`; keep one per daemon (each load costs ~70 ms of CPU to
//! parse the kernel BTF) and run windows on it. Windows on one session are
//! sequential (`&mut self`); events between windows are discarded as stale.
//!
//! # Invariants
//! - **Typed degradation.** No kernel BTF → `unsupported`; no privilege (not
//!   root, no CAP_BPF+CAP_PERFMON / CAP_SYS_ADMIN, or EPERM/EACCES from the
//!   kernel) → `permission_denied`; anything else → `error` with its cause
//!   (the verifier log included). Never a panic, never a silent empty `ok`.
//! - **Bounded.** Ring buffers and maps have fixed sizes; a full one is
//!   counted by the program (`COUNTERS`) and surfaces as `truncated` with
//!   `lost_events`. User-space summaries are capped by [`Limits`], counts stay
//!   exact.
//! - **Nothing secret or host-internal leaves.** Socket keys (kernel addresses)
//!   join events in memory only; stacks are symbol names, never addresses.
//! - **Attribution is honest.** The on-CPU pid/comm of an event is reported as
//!   such (`on_cpu_pid`): in softirq or timer context (retransmit timers) it is
//!   not the socket owner.

pub mod aggregate;
pub mod error;
pub mod flight;
pub mod flow_record;
pub mod host;
pub mod objects;
pub mod offcpu;
pub mod record;
pub mod session;
pub mod surface;
pub mod symbols;

pub use aggregate::{Limits, Sampling, TcpAggregate, TcpSurface};
pub use error::EbpfError;
pub use flight::{
    FlightConfig, FlightRecorder, FlightStats, FlowBook, FlowBucket, FlowHistory, FlowIncident,
    FlowKey, FlowTotals,
};
pub use offcpu::OffCpuWindow;
pub use record::{Endpoint, TcpEvent, TcpEventKind, TcpRecord, TcpSockState, TcpState};
pub use session::{
    EbpfConfig, EbpfSession, EbpfStatus, KernelCounts, MapSizes, OffCpuStatus, ProgramState,
    WindowReport, capture_blocking, monotonic_ns,
};
pub use surface::{OFFCPU_SURFACE, WindowMeta};
