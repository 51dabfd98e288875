//! The capture request: the body of `POST /v1/captures`, tagged by `kind`,
//! what `pstackctl` builds from its arguments and `pstackd` parses. Only the
//! shape lives here; `pstack_capture::request` validates it into the plan an
//! engine runs (every limit and refusal is there).

use serde::{Deserialize, Serialize};

/// Default transport/Longhorn window.
pub const DEFAULT_TRANSPORT_WINDOW_MS: u64 = 30_000;
/// Default `tcp_trace` window.
pub const DEFAULT_TRACE_WINDOW_MS: u64 = 10_000;
/// Default and largest `max_flows`.
pub const DEFAULT_MAX_FLOWS: usize = 64;
/// A capture, of any kind.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum CaptureRequest {
    /// A process and its threads.
    Process(ProcessRequest),
    /// One thread.
    Thread(ThreadRequest),
    /// Every process on the host.
    Host(HostRequest),
    /// TCP flows to a peer, sampled over a window.
    Transport(TransportRequest),
    /// A Longhorn rebuild and its TCP flows.
    Longhorn(LonghornRequest),
    /// TCP retransmits, resets and state changes (eBPF) over a window.
    TcpTrace(TcpTraceRequest),
}

/// Requested deadlines (each optional: the limits' defaults fill in).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RequestedDeadlines {
    /// Per-surface deadline, ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub surface_ms: Option<u64>,
    /// Whole-capture deadline, ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bundle_ms: Option<u64>,
}

/// Requested caps (each optional; at most the limits' values).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RequestedCaps {
    /// Most threads read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_threads: Option<u64>,
    /// Most raw bytes per surface.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_bytes_per_surface: Option<u64>,
}

/// `kind: process`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProcessRequest {
    /// Thread group id.
    pub pid: u32,
    /// Deadlines.
    #[serde(default)]
    pub deadlines: RequestedDeadlines,
    /// Caps.
    #[serde(default)]
    pub caps: RequestedCaps,
    /// Off-CPU observation window (eBPF), ms; inside the bundle deadline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_ms: Option<u64>,
    /// Surface families to read; absent: every surface.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub surfaces: Option<Vec<String>>,
}

/// `kind: thread`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ThreadRequest {
    /// Thread id.
    pub tid: u32,
    /// Deadlines.
    #[serde(default)]
    pub deadlines: RequestedDeadlines,
    /// Caps.
    #[serde(default)]
    pub caps: RequestedCaps,
    /// Off-CPU observation window (eBPF), ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_ms: Option<u64>,
    /// Surface families to read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub surfaces: Option<Vec<String>>,
}

/// `kind: host`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostRequest {
    /// Deadlines.
    #[serde(default)]
    pub deadlines: RequestedDeadlines,
    /// Caps.
    #[serde(default)]
    pub caps: RequestedCaps,
    /// Surface families to read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub surfaces: Option<Vec<String>>,
}

fn default_transport_window() -> u64 {
    DEFAULT_TRANSPORT_WINDOW_MS
}
fn default_trace_window() -> u64 {
    DEFAULT_TRACE_WINDOW_MS
}
fn default_max_flows() -> usize {
    DEFAULT_MAX_FLOWS
}
fn yes() -> bool {
    true
}
fn is_true(b: &bool) -> bool {
    *b
}
fn is_false(b: &bool) -> bool {
    !*b
}

/// `kind: transport`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TransportRequest {
    /// Remote endpoint: `ADDR`, `ADDR:PORT` or `[IPv6]:PORT`.
    pub peer: String,
    /// Local endpoint, same forms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local: Option<String>,
    /// Read the network namespace of this process.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub netns_pid: Option<u32>,
    /// Read this named network namespace (`/run/netns/NAME`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub netns: Option<String>,
    /// Sampling window, ms.
    #[serde(default = "default_transport_window")]
    pub window_ms: u64,
    /// With no port pinned, the port range `LO-HI` either end must be in
    /// (default: Longhorn's data ports).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ports: Option<String>,
    /// Most flows enveloped.
    #[serde(default = "default_max_flows")]
    pub max_flows: usize,
    /// Watch the whole window even when nothing matches at the first sample.
    #[serde(default, skip_serializing_if = "is_false")]
    pub wait: bool,
    /// Run the eBPF TCP window (reset attribution).
    #[serde(default = "yes", skip_serializing_if = "is_true")]
    pub ebpf: bool,
}

/// `kind: longhorn`: the transport fields plus the transfer's identity.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LonghornRequest {
    /// Longhorn volume name.
    pub volume: String,
    /// Engine name.
    pub engine: String,
    /// Node of the source replica (an override checked against the
    /// manager; empty: from the manager).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub source_node: String,
    /// Node of the target (rebuilding) replica (an override checked against
    /// the manager; empty: from the manager).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub target_node: String,
    /// Transfer id; default: derived from the linked flows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transfer: Option<String>,
    /// Remote endpoint of the stream flows.
    pub peer: String,
    /// Local endpoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local: Option<String>,
    /// Network namespace of this process.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub netns_pid: Option<u32>,
    /// Named network namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub netns: Option<String>,
    /// Sampling window, ms.
    #[serde(default = "default_transport_window")]
    pub window_ms: u64,
    /// Port range `LO-HI`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ports: Option<String>,
    /// Most flows enveloped.
    #[serde(default = "default_max_flows")]
    pub max_flows: usize,
    /// Watch the whole window even when nothing matches at first.
    #[serde(default, skip_serializing_if = "is_false")]
    pub wait: bool,
    /// Run the eBPF TCP window.
    #[serde(default = "yes", skip_serializing_if = "is_true")]
    pub ebpf: bool,
    /// Longhorn manager API base URL (`http://` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub longhorn_api: Option<String>,
    /// Hubble Relay address (`host:port`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hubble_server: Option<String>,
}

/// `kind: tcp_trace`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TcpTraceRequest {
    /// How long to watch, ms.
    #[serde(default = "default_trace_window")]
    pub window_ms: u64,
    /// Only flows with this port at either end.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    /// Only flows with this address at either end.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub addr: Option<String>,
    /// Ring buffer bytes (a power of two).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ring_bytes: Option<u32>,
}

impl CaptureRequest {
    /// The kind's wire name.
    pub fn kind(&self) -> &'static str {
        match self {
            CaptureRequest::Process(_) => "process",
            CaptureRequest::Thread(_) => "thread",
            CaptureRequest::Host(_) => "host",
            CaptureRequest::Transport(_) => "transport",
            CaptureRequest::Longhorn(_) => "longhorn",
            CaptureRequest::TcpTrace(_) => "tcp_trace",
        }
    }
}

/// The legacy process body: `{"subject": {"pid"|"tid"|"host": …}, …}`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LegacyBody {
    /// What to capture.
    pub subject: SubjectSelector,
    /// Deadlines.
    #[serde(default)]
    pub deadlines: RequestedDeadlines,
    /// Caps.
    #[serde(default)]
    pub caps: RequestedCaps,
    /// Off-CPU window, ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_ms: Option<u64>,
    /// Surface families.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub surfaces: Option<Vec<String>>,
}

/// Which subject a legacy body captures. Exactly one member.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubjectSelector {
    /// A process.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    /// One thread.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tid: Option<u32>,
    /// Every process on the host (must be `true`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<bool>,
}
