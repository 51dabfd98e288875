//! `pstackd` configuration: a TOML file (default `/etc/pstack/pstackd.toml`).
//!
//! Invariants:
//! - **Closed world.** Unknown keys are refused (a typo must not silently fall
//!   back to a default); every value is validated at load with an error naming
//!   the parameter and the reason ([`ConfigError::InvalidParameter`]).
//! - **Every knob has a default** and its doc says what it trades.
//! - **Reload is all-or-nothing.** A reload (SIGHUP) parses and validates the
//!   whole file first; a bad file leaves the running configuration untouched.
//!   Settings bound at start (socket path, spool directory) keep their running
//!   value on reload and a change to them is reported, not applied.
//! - The API key is read from `shipper.api_key_file`, never from the TOML
//!   itself, and never appears in `Debug` output or logs.
//!
//! Every key with its default (an empty file is the defaults); the annotated
//! copy operators read is `examples/pstackd.toml` (reference:
//! `docs/configuration.md`; a test keeps both equal to these defaults):
//!
//! ```toml
//! socket_path = "/run/pstack/pstackd.sock"   # ignored when socket-activated
//! socket_mode = "0660"
//! group = "pstack"                 # socket group; its members may use the API
//! max_concurrent_captures = 4      # more get 429 + Retry-After
//! max_connections = 64
//! max_request_bytes = 65536
//! max_bundle_deadline_ms = 30000
//! drain_timeout_ms = 10000         # SIGTERM waits this long for in-flight captures
//! header_timeout_ms = 5000
//!
//! [spool]
//! dir = "/var/lib/pstack/spool"
//! max_bytes = 268435456
//! max_files = 100000
//! overflow = "drop_oldest"         # or "refuse_new"
//!
//! [shipper]
//! url = ""                         # e.g. "https://store.example:7470"; empty = no shipping
//! api_key_file = ""                # one line: the store's psk_... key
//! ca_file = ""                     # extra PEM roots besides webpki
//! batch_max_items = 100
//! batch_max_bytes = 4194304
//! timeout_ms = 15000
//! backoff_initial_ms = 500
//! backoff_max_ms = 60000
//!
//! [capture]
//! surface_deadline_ms = 250
//! bundle_deadline_ms = 2000
//! max_threads = 10000
//! max_bytes_per_surface = 65536
//! host_max_threads = 32768         # a host snapshot reads every thread of the host
//! host_max_bytes_per_surface = 4194304  # one host surface holds a process's every thread
//! leak_budget = 4
//! leak_journal = "/run/pstack/helper-leaks.jsonl"
//! helper_path = ""                 # empty: next to pstackd
//! digest_key_file = "/var/lib/pstack/digest.key"  # HMAC key of cmdline/environ digests;
//!                                  # created 0600 if missing, re-read on reload (replace the
//!                                  # file, or point here at a new one, and SIGHUP to rotate)
//! kubelet_url = ""                 # bound at start; e.g. "http://127.0.0.1:10255": k8s/pod names a pod's processes; empty = unsupported
//! longhorn_apis = []             # Longhorn manager URLs a caller may name in a longhorn capture
//! hubble_servers = []            # Hubble Relay host:port a caller may name
//!
//! [ebpf]                           # bound at start (restart to change)
//! enabled = true                   # keep the off-CPU programs attached; a load failure is logged, not fatal
//! tcp = true                       # also the TCP programs (retransmits, resets, state changes)
//! btf_path = "/sys/kernel/btf/vmlinux"
//!
//! [flight_recorder]                # bound at start; runs only while a tcp_reset/tcp_rto rule exists
//! seconds = 60                     # history kept per flow on the watched ports
//! max_flows = 4096                 # least recently active evicted past this (counted)
//!
//! # Watch rules: none by default. Each [[watch]] table is one rule; see
//! # docs/configuration.md for every kind and key. Reloaded on SIGHUP; a bad
//! # rule rejects the reload and the running set stays.
//! # [[watch]]
//! # name = "stuck-io"
//! # kind = "d_state"               # d_state, tcp_reset, tcp_rto, listen_overflow, retransmit_rate, longhorn_rebuild
//! # min_seconds = 10
//! # window = "2s"                  # off-CPU window of the capture (0 = none)
//! # max_per_subject_per_hour = 2
//! # max_per_hour = 12
//! ```

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Default location of the configuration file.
pub const DEFAULT_CONFIG_PATH: &str = "/etc/pstack/pstackd.toml";

/// Why a configuration could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not valid TOML for this schema (unknown keys included).
    #[error("config {path} is not valid: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The parser's diagnostic (line, column, key).
        message: String,
    },
    /// A watch rule is invalid (the rule is named).
    #[error("config {0}")]
    InvalidRule(#[from] super::watch::rules::RuleError),
    /// A value is out of range or inconsistent.
    #[error("config parameter `{param}` is invalid: {reason}")]
    InvalidParameter {
        /// Dotted parameter name.
        param: &'static str,
        /// What is wrong and what is accepted.
        reason: String,
    },
}

/// What the spool does when it is full.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OverflowPolicy {
    /// Delete the oldest unshipped envelopes to make room (counted and
    /// journaled). Trades old evidence for new captures.
    DropOldest,
    /// Refuse new captures (HTTP 507) until the shipper makes room. Trades
    /// availability of captures for never losing spooled evidence.
    RefuseNew,
}

impl OverflowPolicy {
    /// Wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            OverflowPolicy::DropOldest => "drop_oldest",
            OverflowPolicy::RefuseNew => "refuse_new",
        }
    }
}

/// The whole daemon configuration.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Unix socket to listen on when not socket-activated. Default
    /// `/run/pstack/pstackd.sock`. Bound at start.
    pub socket_path: PathBuf,
    /// Octal mode of the socket file. Default `"0660"` (owner and group).
    pub socket_mode: String,
    /// Group that owns the socket file and whose members may use the API.
    /// Default `pstack`. A group that does not exist is an error unless it is
    /// the default (then only root is allowed).
    pub group: String,
    /// Captures running at once; more get 429. Default 4 (each holds a helper).
    pub max_concurrent_captures: usize,
    /// Connections served at once; more are closed at accept. Default 64.
    pub max_connections: usize,
    /// Largest request body, bytes. Default 64 KiB (requests are small JSON).
    pub max_request_bytes: usize,
    /// Largest whole-capture deadline a caller may ask for, ms. Default 30 s.
    pub max_bundle_deadline_ms: u64,
    /// Bound on draining in-flight captures at SIGTERM, ms. Default 10 s.
    pub drain_timeout_ms: u64,
    /// Seconds a client may take to send its request headers. Default 5.
    pub header_timeout_ms: u64,
    /// Spool settings.
    pub spool: SpoolConfig,
    /// Shipper settings.
    pub shipper: ShipperConfig,
    /// Capture defaults.
    pub capture: CaptureConfig,
    /// eBPF programs kept attached while pstackd runs.
    pub ebpf: EbpfDaemonConfig,
    /// The flight recorder the TCP watch rules read.
    pub flight_recorder: FlightRecorderConfig,
    /// Watch rules (`[[watch]]` tables); none by default.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub watch: Vec<super::watch::rules::WatchRuleConfig>,
}

/// The flight recorder: per-flow TCP aggregates of the watched ports, kept
/// while a `tcp_reset` or `tcp_rto` rule is configured (bound at start).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct FlightRecorderConfig {
    /// Seconds of history kept per flow. Default 60: long enough to show a
    /// stream degrading before it was reset; memory grows with it.
    pub seconds: u64,
    /// Most flows tracked; the least recently active are evicted (counted).
    /// Default 4096.
    pub max_flows: usize,
}

impl Default for FlightRecorderConfig {
    fn default() -> Self {
        FlightRecorderConfig {
            seconds: 60,
            max_flows: 4096,
        }
    }
}

/// eBPF settings (bound at start).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct EbpfDaemonConfig {
    /// Load the off-CPU programs at start and keep them attached; windowed
    /// captures use them (no per-capture load). Default true. A failure to
    /// load (no BTF, no privilege) is logged and shown in `/v1/status`, never
    /// fatal; captures then load their own session, which fails the same typed way.
    pub enabled: bool,
    /// Also keep the TCP programs attached, counting events per kind in the
    /// kernel (the counts show in `/v1/status` and `/metrics`; no per-event
    /// records are made, so nothing is lost). Default true. Costs about the
    /// price of one per-CPU counter increment per TCP event on the host.
    pub tcp: bool,
    /// Kernel BTF the programs are relocated against. Default
    /// `/sys/kernel/btf/vmlinux`; without it no eBPF program loads and the
    /// TCP watch rules are `unavailable`.
    pub btf_path: PathBuf,
}

impl Default for EbpfDaemonConfig {
    fn default() -> Self {
        EbpfDaemonConfig {
            enabled: true,
            tcp: true,
            btf_path: PathBuf::from("/sys/kernel/btf/vmlinux"),
        }
    }
}

/// Spool settings.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct SpoolConfig {
    /// Directory holding sealed envelopes. Default `/var/lib/pstack/spool`.
    /// Bound at start.
    pub dir: PathBuf,
    /// Most bytes held. Default 256 MiB.
    pub max_bytes: u64,
    /// Most envelopes held. Default 100,000.
    pub max_files: u64,
    /// What happens when full. Default `drop_oldest`.
    pub overflow: OverflowPolicy,
}

/// Shipper settings.
#[derive(Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct ShipperConfig {
    /// Collector base URL (`https://store:8443`); `POST {url}/v1/envelopes`.
    /// Empty: shipping is off and envelopes stay spooled. `http://` is
    /// accepted only for loopback addresses.
    pub url: String,
    /// File holding the bearer API key (one line). Empty: no Authorization.
    pub api_key_file: PathBuf,
    /// Extra PEM CA bundle trusted for the collector, besides the webpki roots.
    pub ca_file: PathBuf,
    /// Most envelopes per batch. Default 100.
    pub batch_max_items: usize,
    /// Most uncompressed bytes per batch. Default 4 MiB.
    pub batch_max_bytes: u64,
    /// Whole-request timeout, ms. Default 15 s.
    pub timeout_ms: u64,
    /// First retry delay, ms. Default 500.
    pub backoff_initial_ms: u64,
    /// Largest backoff delay, ms (a collector's Retry-After is honoured
    /// separately, up to 15 min). Default 60 s.
    pub backoff_max_ms: u64,
    /// Bearer key, read from `api_key_file` at load. Never logged.
    #[serde(skip)]
    pub api_key: Option<String>,
}

impl std::fmt::Debug for ShipperConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShipperConfig")
            .field("url", &self.url)
            .field("api_key_file", &self.api_key_file)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("batch_max_items", &self.batch_max_items)
            .field("batch_max_bytes", &self.batch_max_bytes)
            .field("timeout_ms", &self.timeout_ms)
            .field("backoff_initial_ms", &self.backoff_initial_ms)
            .field("backoff_max_ms", &self.backoff_max_ms)
            .finish()
    }
}

/// Capture defaults (callers may lower deadlines, never raise them past the
/// configured maxima).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct CaptureConfig {
    /// Default per-surface deadline, ms. Default 250 (`pstackctl capture`
    /// one-shot: 2 s). A daemon serves many callers with a few capture slots:
    /// a surface stuck on a hung mount must give its slot back fast; an
    /// operator running one capture by hand can wait for a slow surface.
    pub surface_deadline_ms: u64,
    /// Default whole-capture deadline, ms. Default 2000 (one-shot: 10 s), for
    /// the same reason.
    pub bundle_deadline_ms: u64,
    /// Most threads read per capture. Default 10,000 (one-shot: 16,384 — a
    /// daemon bounds the memory of four concurrent captures).
    pub max_threads: u64,
    /// Most raw bytes per surface. Default 64 KiB.
    pub max_bytes_per_surface: u64,
    /// Most threads read by a host snapshot. Default 32,768: a host capture's
    /// universe is every thread of the host, and cutting it makes the
    /// snapshot `bounded` exactly when the host is busiest. About 1 KiB is
    /// kept per thread, so the default bounds one snapshot near 32 MiB.
    pub host_max_threads: u64,
    /// Most raw bytes per surface of a host snapshot. Default 4 MiB (as
    /// one-shot `pstackctl capture --host`): one surface holds the stat or
    /// wchan text of every thread of one process, ~300 B a thread, so 64 KiB
    /// truncated any process of more than ~200 threads.
    pub host_max_bytes_per_surface: u64,
    /// Unreaped helpers tolerated. Default 4.
    pub leak_budget: u64,
    /// Leak journal path. Default `/run/pstack/helper-leaks.jsonl`, the same
    /// journal one-shot `pstackctl` uses, so the host has one leak budget.
    pub leak_journal: PathBuf,
    /// The `pstack-helper` binary; empty: next to `pstackd`, then `$PATH`.
    pub helper_path: PathBuf,
    /// The host's digest key (HMAC-SHA-256 of `cmdline` arguments and
    /// `environ` blocks); created 0600 when missing; re-read on reload, which
    /// is how it is rotated. Default `/var/lib/pstack/digest.key`.
    pub digest_key_file: PathBuf,
    /// The node kubelet's read-only endpoint (`http://127.0.0.1:10255`):
    /// captures of a process in a pod read `GET {kubelet_url}/pods` for the
    /// pod's name, namespace and container name (surface `k8s/pod`). Empty
    /// (default): `k8s/pod` is `unsupported`; the container ID and pod UID
    /// still come from the cgroup path (`proc/container`).
    pub kubelet_url: String,
    /// Longhorn manager API base URLs a caller may name (`longhorn_api`) in a
    /// `longhorn` capture through pstackd. Empty (default): none. The daemon
    /// is root and a caller is only a member of the socket's group, so the
    /// daemon makes no HTTP request to an address only the caller chose.
    pub longhorn_apis: Vec<String>,
    /// Hubble Relay addresses (`host:port`) a caller may name
    /// (`hubble_server`) in a `longhorn` capture through pstackd. Empty
    /// (default): none, for the same reason.
    pub hubble_servers: Vec<String>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            socket_path: PathBuf::from("/run/pstack/pstackd.sock"),
            socket_mode: "0660".into(),
            group: "pstack".into(),
            max_concurrent_captures: 4,
            max_connections: 64,
            max_request_bytes: 64 << 10,
            max_bundle_deadline_ms: 30_000,
            drain_timeout_ms: 10_000,
            header_timeout_ms: 5_000,
            spool: SpoolConfig::default(),
            shipper: ShipperConfig::default(),
            capture: CaptureConfig::default(),
            ebpf: EbpfDaemonConfig::default(),
            flight_recorder: FlightRecorderConfig::default(),
            watch: Vec::new(),
        }
    }
}

impl Default for SpoolConfig {
    fn default() -> Self {
        SpoolConfig {
            dir: PathBuf::from("/var/lib/pstack/spool"),
            max_bytes: 256 << 20,
            max_files: 100_000,
            overflow: OverflowPolicy::DropOldest,
        }
    }
}

impl Default for ShipperConfig {
    fn default() -> Self {
        ShipperConfig {
            url: String::new(),
            api_key_file: PathBuf::new(),
            ca_file: PathBuf::new(),
            batch_max_items: 100,
            batch_max_bytes: 4 << 20,
            timeout_ms: 15_000,
            backoff_initial_ms: 500,
            backoff_max_ms: 60_000,
            api_key: None,
        }
    }
}

impl Default for CaptureConfig {
    fn default() -> Self {
        CaptureConfig {
            surface_deadline_ms: 250,
            bundle_deadline_ms: 2_000,
            max_threads: 10_000,
            max_bytes_per_surface: 64 << 10,
            host_max_threads: 32_768,
            host_max_bytes_per_surface: 4 << 20,
            leak_budget: 4,
            leak_journal: PathBuf::from(pstack_capture::helpers::leak::DEFAULT_JOURNAL),
            helper_path: PathBuf::new(),
            digest_key_file: PathBuf::from(pstack_capture::digest_key::DEFAULT_PATH),
            kubelet_url: String::new(),
            longhorn_apis: Vec::new(),
            hubble_servers: Vec::new(),
        }
    }
}

fn invalid(param: &'static str, reason: impl Into<String>) -> ConfigError {
    ConfigError::InvalidParameter {
        param,
        reason: reason.into(),
    }
}

impl Config {
    /// Load and validate `path`. A missing file at the default path yields the
    /// defaults; a missing file named explicitly is an error.
    pub fn load(path: &Path, explicit: bool) -> Result<Config, ConfigError> {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !explicit => String::new(),
            Err(source) => {
                return Err(ConfigError::Read {
                    path: path.to_owned(),
                    source,
                });
            }
        };
        let mut config = Config::parse(&text).map_err(|e| match e {
            ConfigError::Parse { message, .. } => ConfigError::Parse {
                path: path.to_owned(),
                message,
            },
            other => other,
        })?;
        config.load_api_key()?;
        Ok(config)
    }

    /// Parse and validate TOML text (no file access; the API key is not read).
    pub fn parse(text: &str) -> Result<Config, ConfigError> {
        let config: Config = toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: PathBuf::new(),
            message: e.to_string(),
        })?;
        config.validate()?;
        Ok(config)
    }

    fn load_api_key(&mut self) -> Result<(), ConfigError> {
        if self.shipper.api_key_file.as_os_str().is_empty() {
            return Ok(());
        }
        let text = std::fs::read_to_string(&self.shipper.api_key_file).map_err(|source| {
            ConfigError::Read {
                path: self.shipper.api_key_file.clone(),
                source,
            }
        })?;
        let key = text.trim();
        if key.is_empty() || !key.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(invalid(
                "shipper.api_key_file",
                "the key file must hold one non-empty line of printable ASCII",
            ));
        }
        self.shipper.api_key = Some(key.to_owned());
        Ok(())
    }

    /// The socket mode as a number.
    pub fn socket_mode_bits(&self) -> u32 {
        u32::from_str_radix(self.socket_mode.trim_start_matches("0o"), 8).unwrap_or(0o660)
    }

    /// Check every value.
    pub fn validate(&self) -> Result<(), ConfigError> {
        for rule in super::watch::rules::validate_all(&self.watch)? {
            // A d_state capture's deadline is the capture default plus its
            // off-CPU window; it must fit the largest a capture may have, or
            // every firing of the rule would fail at run time.
            let needed = self
                .capture
                .bundle_deadline_ms
                .saturating_add(rule.window.as_millis() as u64);
            if rule.kind == super::watch::rules::RuleKind::DState
                && needed > self.max_bundle_deadline_ms
            {
                return Err(ConfigError::InvalidRule(super::watch::rules::RuleError {
                    rule: rule.name,
                    reason: format!(
                        "window plus capture.bundle_deadline_ms is {needed} ms, more than max_bundle_deadline_ms ({} ms)",
                        self.max_bundle_deadline_ms
                    ),
                }));
            }
        }
        if !(1..=3600).contains(&self.flight_recorder.seconds) {
            return Err(invalid("flight_recorder.seconds", "between 1 and 3600"));
        }
        if !(1..=1_000_000).contains(&self.flight_recorder.max_flows) {
            return Err(invalid(
                "flight_recorder.max_flows",
                "between 1 and 1000000",
            ));
        }
        let kubelet = &self.capture.kubelet_url;
        if !kubelet.is_empty() {
            let u = url::Url::parse(kubelet)
                .map_err(|e| invalid("capture.kubelet_url", format!("not a URL: {e}")))?;
            if !matches!(u.scheme(), "http" | "https") || u.host_str().is_none() {
                return Err(invalid(
                    "capture.kubelet_url",
                    "an http(s) URL of the kubelet's read-only endpoint, e.g. http://127.0.0.1:10255",
                ));
            }
        }
        if !self.socket_path.is_absolute() {
            return Err(invalid("socket_path", "must be an absolute path"));
        }
        if self.socket_path.as_os_str().len() >= 108 {
            return Err(invalid(
                "socket_path",
                "longer than a sockaddr_un allows (107 bytes)",
            ));
        }
        match u32::from_str_radix(self.socket_mode.trim_start_matches("0o"), 8) {
            Ok(m) if m <= 0o777 && m & 0o600 == 0o600 => {}
            _ => {
                return Err(invalid(
                    "socket_mode",
                    "an octal mode string such as \"0660\" that keeps owner read/write",
                ));
            }
        }
        if self.group.is_empty() || self.group.contains(['\0', ':', '\n']) {
            return Err(invalid("group", "a group name"));
        }
        if !(1..=1024).contains(&self.max_concurrent_captures) {
            return Err(invalid("max_concurrent_captures", "between 1 and 1024"));
        }
        if !(1..=65_536).contains(&self.max_connections) {
            return Err(invalid("max_connections", "between 1 and 65536"));
        }
        if !(256..=16 << 20).contains(&self.max_request_bytes) {
            return Err(invalid("max_request_bytes", "between 256 B and 16 MiB"));
        }
        if !(10..=600_000).contains(&self.max_bundle_deadline_ms) {
            return Err(invalid(
                "max_bundle_deadline_ms",
                "between 10 ms and 10 min",
            ));
        }
        if !(1..=600_000).contains(&self.drain_timeout_ms) {
            return Err(invalid("drain_timeout_ms", "between 1 ms and 10 min"));
        }
        if !(10..=600_000).contains(&self.header_timeout_ms) {
            return Err(invalid("header_timeout_ms", "between 10 ms and 10 min"));
        }
        if !self.spool.dir.is_absolute() {
            return Err(invalid("spool.dir", "must be an absolute path"));
        }
        if self.spool.max_bytes < 4096 {
            return Err(invalid("spool.max_bytes", "at least 4096"));
        }
        if self.spool.max_files == 0 {
            return Err(invalid("spool.max_files", "at least 1"));
        }
        let s = &self.shipper;
        if !s.url.is_empty() {
            let url = reqwest::Url::parse(&s.url)
                .map_err(|e| invalid("shipper.url", format!("not a URL: {e}")))?;
            match url.scheme() {
                "https" => {}
                "http" => {
                    let loopback = match url.host() {
                        Some(url::Host::Ipv4(a)) => a.is_loopback(),
                        Some(url::Host::Ipv6(a)) => a.is_loopback(),
                        Some(url::Host::Domain(d)) => d == "localhost",
                        None => false,
                    };
                    if !loopback {
                        return Err(invalid(
                            "shipper.url",
                            "plain http is accepted only for loopback collectors; use https",
                        ));
                    }
                }
                other => {
                    return Err(invalid(
                        "shipper.url",
                        format!("scheme {other:?} (use https)"),
                    ));
                }
            }
            if !url.username().is_empty() || url.password().is_some() {
                return Err(invalid(
                    "shipper.url",
                    "credentials in the URL are refused; use api_key_file",
                ));
            }
        }
        if !(1..=5_000).contains(&s.batch_max_items) {
            return Err(invalid("shipper.batch_max_items", "between 1 and 5000"));
        }
        if !(4096..=64 << 20).contains(&s.batch_max_bytes) {
            return Err(invalid(
                "shipper.batch_max_bytes",
                "between 4 KiB and 64 MiB",
            ));
        }
        if !(10..=600_000).contains(&s.timeout_ms) {
            return Err(invalid("shipper.timeout_ms", "between 10 ms and 10 min"));
        }
        if s.backoff_initial_ms == 0 || s.backoff_initial_ms > s.backoff_max_ms {
            return Err(invalid(
                "shipper.backoff_initial_ms",
                "at least 1 and at most shipper.backoff_max_ms",
            ));
        }
        if s.backoff_max_ms > 3_600_000 {
            return Err(invalid("shipper.backoff_max_ms", "at most one hour"));
        }
        let c = &self.capture;
        if c.surface_deadline_ms == 0 || c.surface_deadline_ms > c.bundle_deadline_ms {
            return Err(invalid(
                "capture.surface_deadline_ms",
                "at least 1 and at most capture.bundle_deadline_ms",
            ));
        }
        if c.bundle_deadline_ms > self.max_bundle_deadline_ms {
            return Err(invalid(
                "capture.bundle_deadline_ms",
                "at most max_bundle_deadline_ms",
            ));
        }
        if c.max_threads == 0 || c.max_bytes_per_surface == 0 {
            return Err(invalid(
                "capture.max_threads",
                "caps must be at least 1 (max_threads, max_bytes_per_surface)",
            ));
        }
        if c.host_max_threads < c.max_threads {
            return Err(invalid(
                "capture.host_max_threads",
                "at least capture.max_threads (a host holds every process's threads)",
            ));
        }
        if c.host_max_bytes_per_surface < c.max_bytes_per_surface {
            return Err(invalid(
                "capture.host_max_bytes_per_surface",
                "at least capture.max_bytes_per_surface",
            ));
        }
        Ok(())
    }

    /// Settings that a reload cannot change, as (name, running, proposed) for
    /// each one that differs.
    pub fn fixed_differences(&self, proposed: &Config) -> Vec<&'static str> {
        let mut out = Vec::new();
        if self.socket_path != proposed.socket_path {
            out.push("socket_path");
        }
        if self.socket_mode != proposed.socket_mode {
            out.push("socket_mode");
        }
        if self.spool.dir != proposed.spool.dir {
            out.push("spool.dir");
        }
        if self.capture.leak_journal != proposed.capture.leak_journal {
            out.push("capture.leak_journal");
        }
        if self.ebpf != proposed.ebpf {
            out.push("ebpf");
        }
        if self.flight_recorder != proposed.flight_recorder {
            out.push("flight_recorder");
        }
        if self.capture.kubelet_url != proposed.capture.kubelet_url {
            out.push("capture.kubelet_url");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_documented_example_is_the_defaults() {
        let src = include_str!("config.rs");
        let start = src.find("//! ```toml\n").unwrap() + "//! ```toml\n".len();
        let end = start + src[start..].find("//! ```\n").unwrap();
        let text: String = src[start..end]
            .lines()
            .map(|l| {
                l.strip_prefix("//! ")
                    .or_else(|| l.strip_prefix("//!"))
                    .unwrap_or(l)
            })
            .collect::<Vec<_>>()
            .join("\n");
        assert_eq!(Config::parse(&text).unwrap(), Config::default());
    }

    #[test]
    fn a_d_state_window_must_fit_the_largest_capture_deadline() {
        let rule = |w: &str| {
            format!("[[watch]]\nname = \"stuck\"\nkind = \"d_state\"\nwindow = \"{w}\"\n")
        };
        assert!(Config::parse(&rule("20s")).is_ok());
        let e = Config::parse(&rule("29s")).unwrap_err().to_string();
        assert!(
            e.contains("\"stuck\"") && e.contains("max_bundle_deadline_ms"),
            "{e}"
        );
        let e = Config::parse(&format!("max_bundle_deadline_ms = 60000\n{}", rule("29s")));
        assert!(e.is_ok(), "{e:?}");
    }

    #[test]
    fn empty_text_is_the_defaults() {
        assert_eq!(Config::parse("").unwrap(), Config::default());
    }

    #[test]
    fn unknown_keys_are_refused_with_their_name() {
        let e = Config::parse("max_concurent_captures = 3").unwrap_err();
        assert!(e.to_string().contains("max_concurent_captures"), "{e}");
        let e = Config::parse("[spool]\nmax_byte = 3").unwrap_err();
        assert!(e.to_string().contains("max_byte"), "{e}");
    }

    #[test]
    fn invalid_values_name_the_parameter() {
        for (text, param) in [
            ("max_concurrent_captures = 0", "max_concurrent_captures"),
            ("socket_mode = \"0044\"", "socket_mode"),
            ("socket_path = \"relative.sock\"", "socket_path"),
            (
                "[capture]\nkubelet_url = \"unix:/run/kubelet.sock\"",
                "capture.kubelet_url",
            ),
            ("[capture]\nkubelet_url = \"10255\"", "capture.kubelet_url"),
            (
                "[shipper]\nurl = \"http://collector.example\"",
                "shipper.url",
            ),
            (
                "[shipper]\nurl = \"https://u:p@collector.example\"",
                "shipper.url",
            ),
            ("[shipper]\nurl = \"ftp://x\"", "shipper.url"),
            (
                "[shipper]\nbackoff_initial_ms = 0",
                "shipper.backoff_initial_ms",
            ),
            ("[spool]\nmax_files = 0", "spool.max_files"),
            (
                "[capture]\nsurface_deadline_ms = 5000",
                "capture.surface_deadline_ms",
            ),
        ] {
            match Config::parse(text) {
                Err(ConfigError::InvalidParameter { param: p, .. }) => {
                    assert_eq!(p, param, "{text}")
                }
                other => panic!("{text}: expected InvalidParameter({param}), got {other:?}"),
            }
        }
    }

    #[test]
    fn host_caps_are_at_least_the_process_caps() {
        // At, just below and just above the process caps.
        let host = |threads: u64, bytes: u64| {
            Config::parse(&format!(
                "[capture]\nmax_threads = 1000\nmax_bytes_per_surface = 4096\n\
                 host_max_threads = {threads}\nhost_max_bytes_per_surface = {bytes}"
            ))
        };
        assert!(host(1000, 4096).is_ok());
        assert!(host(1001, 4097).is_ok());
        for (result, param) in [
            (host(999, 4096), "capture.host_max_threads"),
            (host(1000, 4095), "capture.host_max_bytes_per_surface"),
        ] {
            match result {
                Err(ConfigError::InvalidParameter { param: p, .. }) => assert_eq!(p, param),
                other => panic!("expected InvalidParameter({param}), got {other:?}"),
            }
        }
    }

    #[test]
    fn loopback_http_and_https_are_accepted() {
        Config::parse("[shipper]\nurl = \"http://127.0.0.1:9000\"").unwrap();
        Config::parse("[shipper]\nurl = \"http://[::1]:9000\"").unwrap();
        Config::parse("[shipper]\nurl = \"https://store.example\"").unwrap();
        let c = Config::parse("[spool]\noverflow = \"refuse_new\"").unwrap();
        assert_eq!(c.spool.overflow, OverflowPolicy::RefuseNew);
    }

    #[test]
    fn api_key_never_shows_in_debug() {
        let mut c = Config::default();
        c.shipper.api_key = Some("psk_secret_value".into());
        assert!(!format!("{c:?}").contains("psk_secret_value"));
    }
}
