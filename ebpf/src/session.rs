//! [`EbpfSession`]: load the embedded objects, attach, read the ring buffers
//! on tokio, aggregate one window at a time, report status.
//!
//! Lifecycle and invariants:
//! - [`EbpfSession::start`] checks preconditions in a fixed order — kernel BTF
//!   (`unsupported`), privileges (`permission_denied`), tracefs (mounted here
//!   if absent), the tracepoints — then loads and attaches. It fails whole,
//!   with a typed [`EbpfError`]; nothing is left attached on failure.
//! - While the session lives the programs stay attached; dropping it detaches
//!   them and frees every map (aya owns the fds).
//! - [`EbpfSession::run_window`] first discards records queued before the
//!   window (counted as `stale_discarded`), clears the per-task totals, then
//!   drains the ring buffers whenever they signal readiness (the programs wake
//!   the reader only past `wakeup_bytes` of backlog) and on every
//!   `poll_interval` tick, until the window ends. Kernel counters are read at
//!   both ends, so lost events are per window.
//! - Aggregated TCP mode (the default): the window starts by emptying the
//!   kernel's `FLOWS` map (flows before the window belong to none), and ends,
//!   after the final drain, by reading its live entries (DEAD ones were
//!   already sent at CLOSE) and checking every event the programs counted
//!   against the flows ([`TcpAggregate::finish_kernel`]). The map is an LRU
//!   hash, not socket-local storage: creating sk storage per socket measured
//!   dearer on short-connection floods (issue 31; `tcp.bpf.c`, BENCHMARKS.md).
//! - Memory: ring buffers are `ring_bytes` each; maps have fixed
//!   `max_entries`; user-space aggregation is bounded by [`Limits`]. Nothing
//!   grows with the event rate.

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use aya::maps::{HashMap as BpfHashMap, MapData, PerCpuArray, RingBuf};
use aya::programs::TracePoint;
use aya::{Btf, Ebpf, EbpfLoader, Endianness};
use pstack_envelope::Surface;
use pstack_exposition::{Exposition, Family};
use serde::Serialize;
use tokio::io::unix::AsyncFd;

use crate::aggregate::{Limits, Sampling, TcpAggregate};
use crate::error::EbpfError;
use crate::flow_record::TCP_FLOW_SIZE;
use crate::host;
use crate::objects;
use crate::offcpu::{OffCpuBuilder, OffCpuCounters, OffCpuWindow};
use crate::record::{
    OFFCPU_START_SIZE, OFFCPU_TOTALS_SIZE, OffCpuClass, OffCpuStart, TcpEvent, TcpEventKind,
};
use crate::surface::{self, OFFCPU_SURFACE, TcpSurfaceContext, WindowMeta};
use crate::symbols::Kallsyms;

/// CLOCK_MONOTONIC now, ns (the clock `bpf_ktime_get_ns` reads).
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC always exists on Linux.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    if rc != 0 {
        return 0;
    }
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}

/// Sizes of the kernel maps (fixed at load).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MapSizes {
    /// Watched processes (default 1024).
    pub watched: u32,
    /// Open switch-outs tracked (default 16384).
    pub start: u32,
    /// Tasks totalled per window (default 8192).
    pub totals: u32,
    /// Live TCP flows aggregated in the kernel (LRU; default 16384). A flow
    /// leaves the map when it reaches CLOSE; an evicted flow's events are
    /// counted as untracked.
    pub flows: u32,
}

impl Default for MapSizes {
    fn default() -> Self {
        MapSizes {
            watched: 1024,
            start: 16384,
            totals: 8192,
            flows: 16384,
        }
    }
}

/// What to load and how. Every knob has a default and says what it trades.
#[derive(Debug, Clone)]
pub struct EbpfConfig {
    /// Load the TCP programs (retransmits, resets, state changes).
    pub tcp: bool,
    /// Load the off-CPU programs (sched_switch + sched_wakeup).
    pub offcpu: bool,
    /// Count TCP events per kind in the kernel and emit no record: the
    /// programs do nothing past the per-CPU counter (no ring-buffer record,
    /// no probe reads). Windows then carry kernel counts ([`WindowReport::tcp_kernel`])
    /// but no TCP aggregate and no `ebpf:tcp_*` surfaces; [`EbpfSession::status`]
    /// counts are unchanged. For an always-attached session whose only TCP
    /// output is the counters (pstackd). Default false.
    pub tcp_count_only: bool,
    /// A record per TCP event, folded in user space: the debug mode the
    /// aggregated recording mode is checked against, and the mode of
    /// `pstackctl trace tcp` (which prints every event) and of the flight
    /// recorder. Default false: the kernel aggregates per flow and sends only
    /// rare records, flow records and a sample (see `tcp.bpf.c`).
    pub tcp_per_event: bool,
    /// Aggregated mode: each ordinary event is sampled with probability
    /// 1/`sample_one_in` (0 = no sample; default 64). Rare events are always
    /// sent whatever this is.
    pub sample_one_in: u32,
    /// Keep only TCP events with this local or remote port (filtered in the kernel).
    pub port: Option<u16>,
    /// Keep only TCP events with a local or remote port in this inclusive
    /// range (filtered in the kernel; `port` is the one-port case of it, and
    /// at most one of the two may be set). Default none.
    pub port_range: Option<(u16, u16)>,
    /// Keep only TCP events with this address at either end (filtered in user space).
    pub addr: Option<IpAddr>,
    /// Processes whose threads the off-CPU programs watch (more can be added
    /// with [`EbpfSession::watch`]; empty watches nothing until then).
    pub watch_pids: Vec<u32>,
    /// Watch every task (bounded by the map sizes; losses counted).
    pub watch_all: bool,
    /// D episodes shorter than this are totalled, not emitted (default 1 ms).
    pub d_min: Duration,
    /// Bytes of each ring buffer (power of two, >= 4096; default 256 KiB). More
    /// absorbs longer bursts before events are lost, at that much locked memory.
    pub ring_bytes: u32,
    /// Backlog past which a program wakes the reader (default ring/8). Lower is
    /// lower latency and more wakeups (CPU); 0 wakes on every event.
    pub wakeup_bytes: u64,
    /// Reader poll tick (default 50 ms): bounds latency when below `wakeup_bytes`.
    pub poll_interval: Duration,
    /// User-space caps per window.
    pub limits: Limits,
    /// Kernel map sizes.
    pub maps: MapSizes,
    /// Kernel BTF (default `/sys/kernel/btf/vmlinux`).
    pub btf_path: PathBuf,
    /// tracefs mount point (default `/sys/kernel/tracing`).
    pub tracefs: PathBuf,
}

impl Default for EbpfConfig {
    fn default() -> Self {
        EbpfConfig {
            tcp: true,
            offcpu: false,
            tcp_count_only: false,
            tcp_per_event: false,
            sample_one_in: 64,
            port: None,
            port_range: None,
            addr: None,
            watch_pids: Vec::new(),
            watch_all: false,
            d_min: Duration::from_millis(1),
            ring_bytes: 256 * 1024,
            wakeup_bytes: 32 * 1024,
            poll_interval: Duration::from_millis(50),
            limits: Limits::default(),
            maps: MapSizes::default(),
            btf_path: PathBuf::from(host::KERNEL_BTF),
            tracefs: PathBuf::from(host::TRACEFS),
        }
    }
}

impl EbpfConfig {
    /// TCP programs only.
    pub fn tcp() -> EbpfConfig {
        EbpfConfig::default()
    }

    /// Off-CPU programs only, watching these processes.
    pub fn offcpu(pids: Vec<u32>) -> EbpfConfig {
        EbpfConfig {
            tcp: false,
            offcpu: true,
            watch_pids: pids,
            ..EbpfConfig::default()
        }
    }

    /// Check every value, naming the parameter that is wrong.
    pub fn validate(&self) -> Result<(), EbpfError> {
        let bad =
            |param: &'static str, reason: String| Err(EbpfError::InvalidConfig { param, reason });
        if !self.tcp && !self.offcpu {
            return bad("programs", "neither tcp nor offcpu selected".into());
        }
        if self.tcp_count_only && !self.tcp {
            return bad(
                "tcp_count_only",
                "counting TCP events needs the TCP programs (tcp = true)".into(),
            );
        }
        if self.tcp_count_only && self.tcp_per_event {
            return bad(
                "tcp_per_event",
                "a session either counts (tcp_count_only) or records every event, not both".into(),
            );
        }
        if self.sample_one_in > 1 << 20 {
            return bad(
                "sample_one_in",
                format!("{} not in 0..=1048576", self.sample_one_in),
            );
        }
        if !self.ring_bytes.is_power_of_two() || self.ring_bytes < 4096 || self.ring_bytes > 1 << 30
        {
            return bad(
                "ring_bytes",
                format!("{} is not a power of two in 4096..=1GiB", self.ring_bytes),
            );
        }
        if self.wakeup_bytes > u64::from(self.ring_bytes) {
            return bad(
                "wakeup_bytes",
                format!(
                    "{} exceeds ring_bytes {}",
                    self.wakeup_bytes, self.ring_bytes
                ),
            );
        }
        if self.poll_interval.is_zero() || self.poll_interval > Duration::from_secs(10) {
            return bad(
                "poll_interval",
                format!("{:?} not in (0, 10s]", self.poll_interval),
            );
        }
        if self.port == Some(0) {
            return bad("port", "0 is not a port (omit it to match any)".into());
        }
        if let Some((lo, hi)) = self.port_range {
            if self.port.is_some() {
                return bad(
                    "port_range",
                    "set either port or port_range, not both".into(),
                );
            }
            if lo == 0 || lo > hi {
                return bad(
                    "port_range",
                    format!("{lo}-{hi} is not a range of ports (1 <= lo <= hi)"),
                );
            }
        }
        if self.watch_pids.len() > self.maps.watched as usize {
            return bad(
                "watch_pids",
                format!(
                    "{} pids exceed the watched map size {}",
                    self.watch_pids.len(),
                    self.maps.watched
                ),
            );
        }
        let l = &self.limits;
        for (p, v) in [
            ("limits.max_flows", l.max_flows),
            ("limits.max_samples", l.max_samples),
            (
                "limits.max_transitions_per_flow",
                l.max_transitions_per_flow,
            ),
            ("limits.max_tasks", l.max_tasks),
            ("limits.max_episodes", l.max_episodes),
        ] {
            if v == 0 || v > 1_000_000 {
                return bad(p, format!("{v} not in 1..=1000000"));
            }
        }
        for (p, v) in [
            ("maps.watched", self.maps.watched),
            ("maps.start", self.maps.start),
            ("maps.totals", self.maps.totals),
            ("maps.flows", self.maps.flows),
        ] {
            if v == 0 || v > 1 << 20 {
                return bad(p, format!("{v} not in 1..=1048576"));
            }
        }
        Ok(())
    }
}

/// One attached program.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ProgramState {
    /// Program (function) name.
    pub program: &'static str,
    /// `category/name`.
    pub tracepoint: &'static str,
    /// Attached now.
    pub attached: bool,
}

/// Cumulative counts since load, for `/v1/status` and `/metrics`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EbpfStatus {
    /// `running`, or the failure's surface status (`unsupported`, `permission_denied`, `error`).
    pub state: String,
    /// Failure message when not running.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Programs and whether they are attached.
    pub programs: Vec<ProgramState>,
    /// TCP events seen by the programs, per kind name.
    pub tcp_events: std::collections::BTreeMap<&'static str, u64>,
    /// TCP events lost (ring buffer full), per kind name.
    pub tcp_lost: std::collections::BTreeMap<&'static str, u64>,
    /// Off-CPU counters (switches, episodes, losses).
    pub offcpu: Option<OffCpuStatus>,
    /// Ring buffer bytes per object.
    pub ring_bytes: u32,
}

/// Off-CPU counters, cumulative.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct OffCpuStatus {
    /// Switch-outs of watched tasks.
    pub switches: u64,
    /// D episodes emitted.
    pub episodes: u64,
    /// Lost: ring buffer full.
    pub lost_ring: u64,
    /// Lost: START map full.
    pub lost_start: u64,
    /// Lost: TOTALS map full.
    pub lost_totals: u64,
    /// Processes watched.
    pub watched: usize,
}

const EBPF_UP: Family = Family::gauge(
    "pstackd_ebpf_up",
    "Whether pstack's eBPF programs are loaded (state label: running, disabled, unsupported, permission_denied, error).",
);
const PROGRAM_ATTACHED: Family = Family::gauge(
    "pstackd_ebpf_program_attached",
    "Whether each eBPF program is attached to its tracepoint (1 attached, 0 not).",
);
const TCP_EVENTS: Family = Family::counter(
    "pstackd_ebpf_tcp_events_total",
    "TCP events the programs delivered, by kind (after the kernel-side port filter).",
);
const TCP_LOST: Family = Family::counter(
    "pstackd_ebpf_tcp_lost_events_total",
    "TCP events dropped because the ring buffer was full, by kind.",
);
const OFFCPU_SWITCHES: Family = Family::counter(
    "pstackd_ebpf_offcpu_switches_total",
    "Context switches away from CPU of watched tasks.",
);
const OFFCPU_EPISODES: Family = Family::counter(
    "pstackd_ebpf_offcpu_uninterruptible_episodes_total",
    "Uninterruptible (D-state) off-CPU episodes of watched tasks that ended.",
);
const OFFCPU_LOST: Family = Family::counter(
    "pstackd_ebpf_offcpu_lost_total",
    "Off-CPU records lost, by reason (ring buffer full, a map full).",
);
const OFFCPU_WATCHED: Family = Family::gauge(
    "pstackd_ebpf_offcpu_watched_processes",
    "Processes whose off-CPU time is being recorded now.",
);

impl EbpfStatus {
    /// Add the eBPF families to pstackd's `/metrics` (so every family carries
    /// pstackd's one prefix, `pstackd_ebpf_`): `pstackd_ebpf_up` (1 running, 0 not)
    /// with the state as a label, per-program `pstackd_ebpf_program_attached`,
    /// per-kind `pstackd_ebpf_tcp_events_total` and
    /// `pstackd_ebpf_tcp_lost_events_total`, and the off-CPU counters (only while
    /// off-CPU recording is on). No name part reads as an abbreviated unit
    /// (`promtool check metrics` clean).
    pub fn write_metrics(&self, e: &mut Exposition) {
        e.sample(EBPF_UP, &[("state", &self.state)], self.state == "running");
        e.declare(PROGRAM_ATTACHED);
        for p in &self.programs {
            e.sample(
                PROGRAM_ATTACHED,
                &[("program", p.program), ("tracepoint", p.tracepoint)],
                p.attached,
            );
        }
        e.declare(TCP_EVENTS);
        for (k, v) in &self.tcp_events {
            e.sample(TCP_EVENTS, &[("kind", k)], *v);
        }
        e.declare(TCP_LOST);
        for (k, v) in &self.tcp_lost {
            e.sample(TCP_LOST, &[("kind", k)], *v);
        }
        if let Some(c) = &self.offcpu {
            e.sample(OFFCPU_SWITCHES, &[], c.switches);
            e.sample(OFFCPU_EPISODES, &[], c.episodes);
            for (reason, v) in [
                ("ring_buffer", c.lost_ring),
                ("start_map_full", c.lost_start),
                ("totals_map_full", c.lost_totals),
            ] {
                e.sample(OFFCPU_LOST, &[("reason", reason)], v);
            }
            e.sample(OFFCPU_WATCHED, &[], c.watched);
        }
    }

    /// The status of a session that could not start.
    pub fn failed(err: &EbpfError) -> EbpfStatus {
        EbpfStatus {
            state: err.status().as_str().into(),
            message: Some(err.to_string()),
            programs: Vec::new(),
            tcp_events: Default::default(),
            tcp_lost: Default::default(),
            offcpu: None,
            ring_bytes: 0,
        }
    }
}

/// `PSTACK_TCP_COUNTER_SLOTS`.
const TCP_COUNTER_SLOTS: u32 = 22;

const TCP_PROGRAMS: [(&str, TcpEventKind); 4] = [
    ("pstack_tcp_retransmit", TcpEventKind::Retransmit),
    ("pstack_tcp_receive_reset", TcpEventKind::ReceiveReset),
    ("pstack_tcp_send_reset", TcpEventKind::SendReset),
    ("pstack_inet_sock_set_state", TcpEventKind::StateChange),
];
const OFFCPU_PROGRAMS: [(&str, &str); 2] = [
    ("pstack_sched_switch", "sched/sched_switch"),
    ("pstack_sched_wakeup", "sched/sched_wakeup"),
];

struct TcpPart {
    _ebpf: Ebpf,
    ring: Option<RingBuf<MapData>>,
    counters: PerCpuArray<MapData, u64>,
    flows: BpfHashMap<MapData, u64, [u8; TCP_FLOW_SIZE]>,
}

struct OffPart {
    _ebpf: Ebpf,
    ring: Option<RingBuf<MapData>>,
    counters: PerCpuArray<MapData, u64>,
    watched: BpfHashMap<MapData, u32, u8>,
    start: BpfHashMap<MapData, u32, [u8; OFFCPU_START_SIZE]>,
    totals: BpfHashMap<MapData, u32, [u8; OFFCPU_TOTALS_SIZE]>,
}

/// Loaded and attached eBPF programs. See the module docs for the lifecycle.
pub struct EbpfSession {
    cfg: EbpfConfig,
    programs: Vec<ProgramState>,
    tcp: Option<TcpPart>,
    off: Option<OffPart>,
    watched: std::collections::BTreeSet<u32>,
}

impl std::fmt::Debug for EbpfSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EbpfSession")
            .field("programs", &self.programs)
            .field("watched", &self.watched)
            .finish_non_exhaustive()
    }
}

/// Everything one window produced.
#[derive(Debug, Clone)]
pub struct WindowReport {
    /// Window bounds.
    pub meta: WindowMeta,
    /// TCP aggregate (when the TCP programs run).
    pub tcp: Option<TcpAggregate>,
    /// TCP lost counts and filters.
    pub tcp_ctx: TcpSurfaceContext,
    /// Off-CPU window (when the off-CPU programs run).
    pub offcpu: Option<OffCpuWindow>,
    /// Records queued before the window and discarded.
    pub stale_discarded: u64,
    /// TCP events the programs saw / could not queue during the window, per
    /// kind (`TcpEventKind::ALL` order), from the kernel counters read after
    /// the stale drain and after the final drain: `seen = read + lost` once
    /// traffic has stopped before the window ends.
    pub tcp_kernel: Option<KernelCounts>,
}

/// Kernel counter deltas of the TCP programs over a window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct KernelCounts {
    /// Events the programs saw (after the port filter), per kind.
    pub seen: [u64; 4],
    /// Event records lost (ring buffer full), per kind.
    pub lost: [u64; 4],
    /// Aggregated mode: rare records chosen, per kind.
    pub rare: [u64; 4],
    /// Aggregated mode: sampled records chosen, per kind.
    pub sampled: [u64; 4],
    /// Aggregated mode: flow records sent at CLOSE.
    pub flow_records: u64,
    /// Aggregated mode: flow records lost (ring buffer full).
    pub flow_records_lost: u64,
    /// Aggregated mode: events the flow map refused.
    pub flow_map_refused: u64,
}

impl KernelCounts {
    fn from_slots(c: &[u64]) -> KernelCounts {
        let mut k = KernelCounts::default();
        for (j, kind) in TcpEventKind::ALL.into_iter().enumerate() {
            let i = usize::from(kind.raw());
            k.seen[j] = c[2 * i];
            k.lost[j] = c[2 * i + 1];
            k.rare[j] = c[10 + i];
            k.sampled[j] = c[14 + i];
        }
        k.flow_records = c[19];
        k.flow_records_lost = c[20];
        k.flow_map_refused = c[21];
        k
    }

    fn since(&self, before: &KernelCounts) -> KernelCounts {
        let d4 = |a: [u64; 4], b: [u64; 4]| std::array::from_fn(|j| a[j].saturating_sub(b[j]));
        KernelCounts {
            seen: d4(self.seen, before.seen),
            lost: d4(self.lost, before.lost),
            rare: d4(self.rare, before.rare),
            sampled: d4(self.sampled, before.sampled),
            flow_records: self.flow_records.saturating_sub(before.flow_records),
            flow_records_lost: self
                .flow_records_lost
                .saturating_sub(before.flow_records_lost),
            flow_map_refused: self
                .flow_map_refused
                .saturating_sub(before.flow_map_refused),
        }
    }
}

impl WindowReport {
    /// The typed surfaces: `ebpf:tcp_retransmits`, `ebpf:tcp_resets`,
    /// `ebpf:tcp_lifecycle` and/or `ebpf:offcpu`.
    pub fn surfaces(&self) -> Vec<Surface> {
        let mut out = Vec::new();
        if let Some(t) = &self.tcp {
            out.extend(surface::tcp_surfaces(t, &self.tcp_ctx, &self.meta));
        }
        if let Some(o) = &self.offcpu {
            out.push(surface::offcpu_surface(o, &self.meta));
        }
        out
    }
}

fn take_map<T>(
    ebpf: &mut Ebpf,
    object: &'static str,
    name: &'static str,
    conv: impl FnOnce(aya::maps::Map) -> Result<T, aya::maps::MapError>,
) -> Result<T, EbpfError> {
    let map = ebpf.take_map(name).ok_or(EbpfError::ObjectMismatch {
        object,
        what: "map",
        name,
    })?;
    conv(map).map_err(|e| EbpfError::map(name, e))
}

fn attach(
    ebpf: &mut Ebpf,
    object: &'static str,
    program: &'static str,
    tracepoint: &'static str,
) -> Result<(), EbpfError> {
    let (cat, name) = tracepoint.split_once('/').unwrap_or(("", tracepoint));
    let prog: &mut TracePoint = ebpf
        .program_mut(program)
        .ok_or(EbpfError::ObjectMismatch {
            object,
            what: "program",
            name: program,
        })?
        .try_into()
        .map_err(|e| EbpfError::program(program, tracepoint, e))?;
    prog.load()
        .map_err(|e| EbpfError::program(program, tracepoint, e))?;
    prog.attach(cat, name)
        .map_err(|e| EbpfError::program(program, tracepoint, e))?;
    Ok(())
}

fn sum_counters(c: &PerCpuArray<MapData, u64>, slots: u32) -> Result<Vec<u64>, EbpfError> {
    (0..slots)
        .map(|i| {
            c.get(&i, 0)
                .map(|v| v.iter().sum::<u64>())
                .map_err(|e| EbpfError::map("COUNTERS", e))
        })
        .collect()
}

impl EbpfSession {
    /// Check preconditions, load and attach (see the module docs).
    pub fn start(cfg: EbpfConfig) -> Result<EbpfSession, EbpfError> {
        cfg.validate()?;
        host::check_btf(&cfg.btf_path)?;
        host::check_privileges()?;
        host::ensure_tracefs(&cfg.tracefs)?;
        if cfg.tcp {
            for (_, k) in TCP_PROGRAMS {
                host::check_tracepoint(&cfg.tracefs, k.tracepoint())?;
            }
        }
        if cfg.offcpu {
            for (_, tp) in OFFCPU_PROGRAMS {
                host::check_tracepoint(&cfg.tracefs, tp)?;
            }
        }
        let btf = Btf::parse_file(&cfg.btf_path, Endianness::default())
            .map_err(|e| EbpfError::load("kernel BTF", aya::EbpfError::BtfError(e)))?;
        let mut programs = Vec::new();
        let tcp = if cfg.tcp {
            let object = "tcp.bpf.o";
            let (port_lo, port_hi) = cfg
                .port_range
                .or(cfg.port.map(|p| (p, p)))
                .unwrap_or((0, 0));
            let count_only = u8::from(cfg.tcp_count_only);
            let per_event = u8::from(cfg.tcp_per_event);
            // A counting session never writes the ring: keep it one page.
            let ring_bytes = if cfg.tcp_count_only {
                4096
            } else {
                cfg.ring_bytes
            };
            let mut ebpf = EbpfLoader::new()
                .btf(Some(&btf))
                .map_max_entries("EVENTS", ring_bytes)
                .override_global("filter_port_lo", &port_lo, true)
                .override_global("filter_port_hi", &port_hi, true)
                .override_global("wakeup_bytes", &cfg.wakeup_bytes, true)
                .override_global("count_only", &count_only, true)
                .override_global("per_event", &per_event, true)
                .override_global("sample_one_in", &cfg.sample_one_in, true)
                .map_max_entries("FLOWS", cfg.maps.flows)
                .load(objects::TCP)
                .map_err(|e| EbpfError::load(object, e))?;
            for (p, k) in TCP_PROGRAMS {
                attach(&mut ebpf, object, p, k.tracepoint())?;
                programs.push(ProgramState {
                    program: p,
                    tracepoint: k.tracepoint(),
                    attached: true,
                });
            }
            let ring = take_map(&mut ebpf, object, "EVENTS", RingBuf::try_from)?;
            let counters = take_map(&mut ebpf, object, "COUNTERS", PerCpuArray::try_from)?;
            let flows = take_map(&mut ebpf, object, "FLOWS", BpfHashMap::try_from)?;
            Some(TcpPart {
                _ebpf: ebpf,
                ring: Some(ring),
                counters,
                flows,
            })
        } else {
            None
        };
        let off = if cfg.offcpu {
            let object = "offcpu.bpf.o";
            let all: u8 = u8::from(cfg.watch_all);
            let d_min = u64::try_from(cfg.d_min.as_nanos()).unwrap_or(u64::MAX);
            let mut ebpf = EbpfLoader::new()
                .btf(Some(&btf))
                .map_max_entries("EPISODES", cfg.ring_bytes)
                .map_max_entries("WATCHED", cfg.maps.watched)
                .map_max_entries("START", cfg.maps.start)
                .map_max_entries("TOTALS", cfg.maps.totals)
                .override_global("watch_all", &all, true)
                .override_global("d_min_ns", &d_min, true)
                .override_global("wakeup_bytes", &cfg.wakeup_bytes, true)
                .load(objects::OFFCPU)
                .map_err(|e| EbpfError::load(object, e))?;
            let mut watched = take_map(&mut ebpf, object, "WATCHED", BpfHashMap::try_from)?;
            for pid in &cfg.watch_pids {
                watched
                    .insert(pid, 1u8, 0)
                    .map_err(|e| EbpfError::map("WATCHED", e))?;
            }
            for (p, tp) in OFFCPU_PROGRAMS {
                attach(&mut ebpf, object, p, tp)?;
                programs.push(ProgramState {
                    program: p,
                    tracepoint: tp,
                    attached: true,
                });
            }
            let ring = take_map(&mut ebpf, object, "EPISODES", RingBuf::try_from)?;
            let counters = take_map(&mut ebpf, object, "COUNTERS", PerCpuArray::try_from)?;
            let mut start = take_map(&mut ebpf, object, "START", BpfHashMap::try_from)?;
            let totals = take_map(&mut ebpf, object, "TOTALS", BpfHashMap::try_from)?;
            // Programs are attached: from here every switch-out is seen; threads
            // already asleep get a seeded entry (the kernel's own entries win).
            for pid in &cfg.watch_pids {
                seed_asleep_threads(&mut start, *pid);
            }
            Some(OffPart {
                _ebpf: ebpf,
                ring: Some(ring),
                counters,
                watched,
                start,
                totals,
            })
        } else {
            None
        };
        let watched = cfg.watch_pids.iter().copied().collect();
        Ok(EbpfSession {
            cfg,
            programs,
            tcp,
            off,
            watched,
        })
    }

    /// The configuration in force.
    pub fn config(&self) -> &EbpfConfig {
        &self.cfg
    }

    /// Add a process to the off-CPU watched set.
    pub fn watch(&mut self, pid: u32) -> Result<(), EbpfError> {
        let off = self.off.as_mut().ok_or(EbpfError::InvalidConfig {
            param: "offcpu",
            reason: "the off-CPU programs are not loaded in this session".into(),
        })?;
        off.watched
            .insert(pid, 1u8, 0)
            .map_err(|e| EbpfError::map("WATCHED", e))?;
        seed_asleep_threads(&mut off.start, pid);
        self.watched.insert(pid);
        Ok(())
    }

    /// Remove a process from the watched set.
    pub fn unwatch(&mut self, pid: u32) -> Result<(), EbpfError> {
        if let Some(off) = self.off.as_mut() {
            match off.watched.remove(&pid) {
                Ok(()) | Err(aya::maps::MapError::KeyNotFound) => {}
                Err(e) => return Err(EbpfError::map("WATCHED", e)),
            }
        }
        self.watched.remove(&pid);
        Ok(())
    }

    fn tcp_counters(&self) -> Result<Option<Vec<u64>>, EbpfError> {
        self.tcp
            .as_ref()
            .map(|t| sum_counters(&t.counters, TCP_COUNTER_SLOTS))
            .transpose()
    }

    fn off_counters(&self) -> Result<Option<OffCpuCounters>, EbpfError> {
        self.off
            .as_ref()
            .map(|o| {
                let v = sum_counters(&o.counters, 5)?;
                Ok(OffCpuCounters::from_slots([v[0], v[1], v[2], v[3], v[4]]))
            })
            .transpose()
    }

    /// TCP events the programs saw (after the port filter) and lost (ring
    /// buffer full) since load, per kind (`TcpEventKind::ALL` order); `None`
    /// without the TCP programs.
    pub fn tcp_kernel_counts(&self) -> Result<Option<KernelCounts>, EbpfError> {
        Ok(self.tcp_counters()?.map(|c| KernelCounts::from_slots(&c)))
    }

    /// Read up to `max` queued TCP records without waiting, handing each raw
    /// record to `f`; returns how many were read. For owners that poll on
    /// their own schedule (the flight recorder) instead of running windows.
    /// Not to be mixed with windows on the same session: a window discards
    /// what is queued when it starts.
    pub fn drain_tcp(&mut self, max: usize, mut f: impl FnMut(&[u8])) -> usize {
        let Some(ring) = self.tcp.as_mut().and_then(|t| t.ring.as_mut()) else {
            return 0;
        };
        let mut n = 0;
        while n < max {
            let Some(item) = ring.next() else { break };
            f(&item);
            n += 1;
        }
        n
    }

    /// Programs, cumulative event and loss counts (for `/v1/status`, `/metrics`).
    pub fn status(&self) -> Result<EbpfStatus, EbpfError> {
        let mut tcp_events = std::collections::BTreeMap::new();
        let mut tcp_lost = std::collections::BTreeMap::new();
        if let Some(c) = self.tcp_counters()? {
            for k in TcpEventKind::ALL {
                let i = usize::from(k.raw());
                tcp_events.insert(k.as_str(), c[2 * i]);
                tcp_lost.insert(k.as_str(), c[2 * i + 1]);
            }
        }
        let offcpu = self.off_counters()?.map(|c| OffCpuStatus {
            switches: c.switches,
            episodes: c.episodes,
            lost_ring: c.lost_ring,
            lost_start: c.lost_start,
            lost_totals: c.lost_totals,
            watched: self.watched.len(),
        });
        Ok(EbpfStatus {
            state: "running".into(),
            message: None,
            programs: self.programs.clone(),
            tcp_events,
            tcp_lost,
            offcpu,
            ring_bytes: self.cfg.ring_bytes,
        })
    }

    /// Run one capture window on the current tokio runtime (needs the `net`
    /// and `time` drivers). `on_event` sees each TCP event that passed the
    /// filters as it is read (for live output).
    pub async fn run_window(
        &mut self,
        window: Duration,
        on_event: impl FnMut(&TcpEvent),
    ) -> Result<WindowReport, EbpfError> {
        self.run_window_until(window, on_event, std::future::pending::<()>())
            .await
    }

    /// [`EbpfSession::run_window`] that also ends early when `stop` completes
    /// (Ctrl-C in `pstackctl trace`, shutdown in pstackd). The report covers
    /// the time actually run (`meta.end_ns`), `window_ms` stays the request.
    pub async fn run_window_until(
        &mut self,
        window: Duration,
        mut on_event: impl FnMut(&TcpEvent),
        stop: impl std::future::Future,
    ) -> Result<WindowReport, EbpfError> {
        // Discard what was queued before the window.
        let mut stale = 0u64;
        if let Some(r) = self.tcp.as_mut().and_then(|t| t.ring.as_mut()) {
            while r.next().is_some() {
                stale += 1;
            }
        }
        if let Some(r) = self.off.as_mut().and_then(|o| o.ring.as_mut()) {
            while r.next().is_some() {
                stale += 1;
            }
        }
        // The kernel's flows so far belong to no window: forget them.
        if let Some(t) = self.tcp.as_mut() {
            let keys: Vec<u64> = t.flows.keys().filter_map(Result::ok).collect();
            for k in keys {
                let _ = t.flows.remove(&k);
            }
        }
        if let Some(o) = self.off.as_mut() {
            let keys: Vec<u32> = o.totals.keys().filter_map(Result::ok).collect();
            for k in keys {
                let _ = o.totals.remove(&k);
            }
        }
        let tcp_before = self.tcp_counters()?;
        let off_before = self.off_counters()?;
        let start_ns = monotonic_ns();

        let mut agg = self
            .tcp
            .as_ref()
            .filter(|_| !self.cfg.tcp_count_only)
            .map(|_| {
                if self.cfg.tcp_per_event {
                    TcpAggregate::new(self.cfg.limits, self.cfg.addr)
                } else {
                    TcpAggregate::aggregated(self.cfg.limits, self.cfg.addr)
                }
            });
        let watched: Vec<u32> = self.watched.iter().copied().collect();
        let d_min_ns = u64::try_from(self.cfg.d_min.as_nanos()).unwrap_or(u64::MAX);
        let mut offb = self
            .off
            .as_ref()
            .map(|_| OffCpuBuilder::new(self.cfg.limits, watched, self.cfg.watch_all, d_min_ns));

        let mut tcp_fd = match self.tcp.as_mut() {
            Some(t) => register(&mut t.ring, "EVENTS")?,
            None => None,
        };
        let mut off_fd = match self.off.as_mut() {
            Some(o) => match register(&mut o.ring, "EPISODES") {
                Ok(fd) => fd,
                Err(e) => {
                    if let (Some(t), Some(fd)) = (self.tcp.as_mut(), tcp_fd) {
                        t.ring = Some(fd.into_inner());
                    }
                    return Err(e);
                }
            },
            None => None,
        };

        let deadline = tokio::time::Instant::now() + window;
        let mut tick = tokio::time::interval(self.cfg.poll_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let result: Result<(), EbpfError> = async {
            tokio::pin!(stop);
            let mut stopped = false;
            loop {
                #[derive(PartialEq)]
                enum Wake {
                    End,
                    Data,
                }
                let wake = tokio::select! {
                    _ = tokio::time::sleep_until(deadline) => Wake::End,
                    _ = &mut stop, if !stopped => { stopped = true; Wake::End }
                    r = readable(tcp_fd.as_ref()) => { r.map_err(|source| EbpfError::Poll { map: "EVENTS", source })?; Wake::Data }
                    r = readable(off_fd.as_ref()) => { r.map_err(|source| EbpfError::Poll { map: "EPISODES", source })?; Wake::Data }
                    _ = tick.tick() => Wake::Data,
                };
                drain(tcp_fd.as_mut(), off_fd.as_mut(), agg.as_mut(), offb.as_mut(), &mut on_event, 1 << 16);
                if wake == Wake::End {
                    break;
                }
            }
            drain(tcp_fd.as_mut(), off_fd.as_mut(), agg.as_mut(), offb.as_mut(), &mut on_event, usize::MAX);
            Ok(())
        }
        .await;
        // Put the rings back whatever happened.
        if let (Some(t), Some(fd)) = (self.tcp.as_mut(), tcp_fd) {
            t.ring = Some(fd.into_inner());
        }
        if let (Some(o), Some(fd)) = (self.off.as_mut(), off_fd) {
            o.ring = Some(fd.into_inner());
        }
        result?;
        let end_ns = monotonic_ns();

        let mut tcp_ctx = TcpSurfaceContext {
            lost: [0; 3],
            port: self.cfg.port,
            addr: self.cfg.addr,
        };
        let mut tcp_kernel = None;
        if let (Some(before), Some(after)) = (tcp_before, self.tcp_counters()?) {
            let k = KernelCounts::from_slots(&after).since(&KernelCounts::from_slots(&before));
            tcp_kernel = Some(k);
            // Aggregated mode: the live flows are read from the map last (the
            // ones that reached CLOSE came as records), then checked against
            // what the programs saw.
            if let (Some(a), Some(t)) = (agg.as_mut(), self.tcp.as_ref())
                && a.is_aggregated()
            {
                let mut read = 0u64;
                for (_, raw) in t.flows.iter().flatten() {
                    // A DEAD entry's flow came as a record at CLOSE.
                    if raw
                        .get(97)
                        .is_some_and(|f| f & crate::flow_record::FLOW_DEAD != 0)
                    {
                        continue;
                    }
                    if a.add_flow_raw(&raw).is_ok() {
                        read += 1;
                    }
                }
                a.finish_kernel(
                    k.seen,
                    Sampling {
                        one_in: self.cfg.sample_one_in,
                        rare: k.rare,
                        sampled: k.sampled,
                        lost: k.lost,
                        flow_records: k.flow_records,
                        flow_records_lost: k.flow_records_lost,
                        flow_map_refused: k.flow_map_refused,
                        flows_read_at_end: read,
                    },
                );
            }
            let lost = |k: TcpEventKind| {
                let i = 2 * usize::from(k.raw()) + 1;
                after[i].saturating_sub(before[i])
            };
            tcp_ctx.lost = [
                lost(TcpEventKind::Retransmit),
                lost(TcpEventKind::ReceiveReset) + lost(TcpEventKind::SendReset),
                lost(TcpEventKind::StateChange),
            ];
        }
        let offcpu = match (offb, self.off.as_ref()) {
            (Some(mut b), Some(o)) => {
                // A key deleted while iterating ends in an Err item: skipped (the task left).
                for (tid, raw) in o.totals.iter().flatten() {
                    let _ = b.add_totals_raw(tid, &raw);
                }
                // Only watched tasks are ever in START.
                for (tid, raw) in o.start.iter().flatten() {
                    let _ = b.add_open_raw(tid, &raw);
                }
                let after = self.off_counters()?.unwrap_or_default();
                let delta = after.since(off_before.unwrap_or_default());
                Some(b.finish(delta, monotonic_ns(), Kallsyms::load))
            }
            _ => None,
        };
        Ok(WindowReport {
            meta: WindowMeta {
                start_ns,
                end_ns,
                window_ms: u64::try_from(window.as_millis()).unwrap_or(u64::MAX),
            },
            tcp: agg,
            tcp_ctx,
            offcpu,
            stale_discarded: stale,
            tcp_kernel,
        })
    }

    /// [`EbpfSession::run_window`] on a private current-thread runtime, for
    /// synchronous callers (e.g. `pstackctl capture`). Do not call from
    /// inside a tokio runtime.
    pub fn run_window_blocking(
        &mut self,
        window: Duration,
        on_event: impl FnMut(&TcpEvent),
    ) -> Result<WindowReport, EbpfError> {
        self.run_window_blocking_until(window, on_event, std::future::pending::<()>())
    }

    /// [`EbpfSession::run_window_until`] on a private current-thread runtime.
    pub fn run_window_blocking_until(
        &mut self,
        window: Duration,
        on_event: impl FnMut(&TcpEvent),
        stop: impl std::future::Future,
    ) -> Result<WindowReport, EbpfError> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|source| EbpfError::Poll {
                map: "runtime",
                source,
            })?;
        rt.block_on(self.run_window_until(window, on_event, stop))
    }
}

/// Off-CPU class of a `/proc/<pid>/task/<tid>/stat` line's state, `None`
/// for running/runnable or exiting threads.
pub fn proc_state_class(stat: &str) -> Option<OffCpuClass> {
    let state = stat.rsplit_once(')')?.1.split_whitespace().next()?;
    match state {
        "S" => Some(OffCpuClass::Sleeping),
        "D" => Some(OffCpuClass::Uninterruptible),
        "T" | "t" => Some(OffCpuClass::Stopped),
        "I" => Some(OffCpuClass::Idle),
        _ => None,
    }
}

/// Seed START for `pid`'s threads that are asleep right now: they switched out
/// before the programs were watching and would otherwise be invisible until
/// they wake. `BPF_NOEXIST`: an entry the kernel made meanwhile is not touched.
/// Best effort: a thread that exits or wakes meanwhile is harmless (its next
/// switch-out overwrites the entry).
fn seed_asleep_threads(start: &mut BpfHashMap<MapData, u32, [u8; OFFCPU_START_SIZE]>, pid: u32) {
    const BPF_NOEXIST: u64 = 1;
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return;
    };
    let now = monotonic_ns();
    for t in dir.flatten() {
        let Some(tid) = t.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(t.path().join("stat")) else {
            continue;
        };
        if let Some(class) = proc_state_class(&stat) {
            let _ = start.insert(tid, OffCpuStart::seed(now, pid, class), BPF_NOEXIST);
        }
    }
}

/// Move a ring buffer into an `AsyncFd` (put it back on failure).
fn register(
    slot: &mut Option<RingBuf<MapData>>,
    map: &'static str,
) -> Result<Option<AsyncFd<RingBuf<MapData>>>, EbpfError> {
    let Some(ring) = slot.take() else {
        return Ok(None);
    };
    // SAFETY: the RingBuf owns its map fd (an OwnedFd inside MapData) for its
    // whole life and never swaps it, so the fd stays open and the same while
    // the AsyncFd owns the RingBuf, until `into_inner` hands it back.
    match unsafe { AsyncFd::register_with_interest(ring, tokio::io::Interest::READABLE) } {
        Ok(fd) => Ok(Some(fd)),
        Err(e) => {
            let (ring, source) = e.into_parts();
            *slot = Some(ring);
            Err(EbpfError::Poll { map, source })
        }
    }
}

async fn readable<T: std::os::fd::AsRawFd>(fd: Option<&AsyncFd<T>>) -> std::io::Result<()> {
    match fd {
        Some(fd) => {
            let mut g = fd.readable().await?;
            g.clear_ready();
            Ok(())
        }
        None => std::future::pending().await,
    }
}

fn drain(
    tcp: Option<&mut AsyncFd<RingBuf<MapData>>>,
    off: Option<&mut AsyncFd<RingBuf<MapData>>>,
    agg: Option<&mut TcpAggregate>,
    offb: Option<&mut OffCpuBuilder>,
    on_event: &mut impl FnMut(&TcpEvent),
    max: usize,
) {
    if let (Some(fd), Some(agg)) = (tcp, agg) {
        let ring = fd.get_mut();
        let mut n = 0;
        while n < max {
            let Some(item) = ring.next() else { break };
            if let Ok(Some(e)) = agg.add_raw(&item) {
                on_event(&e);
            }
            n += 1;
        }
    }
    if let (Some(fd), Some(b)) = (off, offb) {
        let ring = fd.get_mut();
        let mut n = 0;
        while n < max {
            let Some(item) = ring.next() else { break };
            let _ = b.add_episode_raw(&item);
            n += 1;
        }
    }
}

/// One-shot capture that never fails: start, run one window, and return the
/// surfaces — or, when the session cannot start, the same surface ids with
/// the failure's status (`unsupported`, `permission_denied`, `error`).
pub fn capture_blocking(cfg: EbpfConfig, window: Duration) -> Vec<Surface> {
    let mut ids = Vec::new();
    if cfg.tcp {
        ids.extend(surface::tcp_surface_ids());
    }
    if cfg.offcpu {
        ids.push(OFFCPU_SURFACE);
    }
    let window_ms = u64::try_from(window.as_millis()).unwrap_or(u64::MAX);
    let t0 = monotonic_ns();
    let fail =
        |e: &EbpfError| surface::failed_surfaces(e, &ids, window_ms, (monotonic_ns() - t0) / 1000);
    match EbpfSession::start(cfg) {
        Ok(mut s) => match s.run_window_blocking(window, |_| {}) {
            Ok(r) => r.surfaces(),
            Err(e) => fail(&e),
        },
        Err(e) => fail(&e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send<T: Send>(_: &T) {}

    #[test]
    fn session_and_window_future_are_send_for_tokio_spawn() {
        // pstackd holds the session in a task and awaits windows on the multi-thread runtime.
        fn session_is_send<T: Send>() {}
        session_is_send::<EbpfSession>();
        #[allow(
            clippy::diverging_sub_expression,
            unreachable_code,
            unused_variables,
            reason = "a type check that never runs"
        )]
        if false {
            let s: &mut EbpfSession = unreachable!();
            let fut = s.run_window(Duration::from_secs(1), |_| {});
            assert_send(&fut);
        }
    }

    #[test]
    fn proc_states_map_to_classes() {
        assert_eq!(
            proc_state_class("42 (a b) D 1 2"),
            Some(OffCpuClass::Uninterruptible)
        );
        assert_eq!(proc_state_class("42 (x) S 1"), Some(OffCpuClass::Sleeping));
        assert_eq!(proc_state_class("42 (x) R 1"), None);
        assert_eq!(proc_state_class("42 (x) Z 1"), None);
        assert_eq!(
            proc_state_class("42 (we) ird) t 1"),
            Some(OffCpuClass::Stopped)
        );
        assert_eq!(proc_state_class("garbage"), None);
    }

    #[test]
    fn failed_status_renders_for_metrics() {
        let st = EbpfStatus::failed(&EbpfError::NoBtf { path: "/x".into() });
        assert_eq!(st.state, "unsupported");
        let mut e = Exposition::new();
        st.write_metrics(&mut e);
        let text = e.render();
        assert!(
            text.contains("pstackd_ebpf_up{state=\"unsupported\"} 0"),
            "{text}"
        );
        let json = serde_json::to_value(&st).expect("serializable for /v1/status");
        assert_eq!(json["state"], "unsupported");
    }
}
