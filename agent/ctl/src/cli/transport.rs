//! `pstackctl capture transport`: arguments → [`TransportRequest`] →
//! the transport engine (`pstack_capture::transport`) → envelopes printed.
//!
//! The engine, its claim rules and its invariants live in `pstack-capture`;
//! this module only parses flags, validates through the one request
//! validator, shows progress and renders.

use std::path::{Path, PathBuf};

use std::time::Duration;

use pstack_capture::process::{LeakBudget, LeakJournal, SupervisorConfig};
use pstack_capture::request::{
    CaptureRequest, PlanTransport, RequestError, TransportRequest, ValidRequest, invalid_window,
};
use pstack_capture::transport::{CaptureResult, Plan, TransportError};
use pstack_envelope::Envelope;

pub use pstack_capture::transport::{DEFAULT_LEAK_JOURNAL, NET_LEAK_BUDGET};

/// Which flows to capture and how long to watch them; shared by
/// `capture transport` and `capture longhorn`.
#[derive(Debug, Clone, clap::Args)]
pub struct FlowArgs {
    /// Remote endpoint: ADDR or ADDR:PORT (IPv6 with a port in brackets: [fd00::2]:10001).
    #[arg(long)]
    pub peer: String,
    /// Local endpoint: ADDR or ADDR:PORT.
    #[arg(long)]
    pub local: Option<String>,
    /// Read the network namespace of this process (e.g. Longhorn's instance-manager).
    #[arg(long, conflicts_with = "netns")]
    pub netns_pid: Option<u32>,
    /// Read this named network namespace (/run/netns/NAME).
    #[arg(long)]
    pub netns: Option<String>,
    /// Sampling window (e.g. 30s, 500ms, 2m).
    #[arg(long, default_value = "30s")]
    pub window: String,
    /// With no port pinned, match flows whose local or remote port is in this
    /// range (Longhorn v1's instance-manager data ports by default; the v2
    /// engine's 20001-30000 only when asked).
    #[arg(long, default_value = "10000-20000")]
    pub ports: String,
    /// Most flows enveloped; more matching flows make every envelope `bounded`.
    #[arg(long, default_value_t = 64)]
    pub max_flows: usize,
    /// Watch the whole window even when no flow matches at the first sample
    /// (a stream expected to start). Without it the capture stops early and says so.
    #[arg(long)]
    pub wait: bool,
}

impl FlowArgs {
    /// The window in ms (the unit is required; the range is checked by the
    /// request validator).
    pub fn window_ms(&self) -> Result<u64, RequestError> {
        let d =
            pstack_cli::parse_duration(&self.window).map_err(|e| invalid_window(e.to_string()))?;
        Ok(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }
}

/// Where a net capture runs: through pstackd when it listens, else here.
#[derive(Debug, Clone, clap::Args)]
pub struct Via {
    /// pstackd's socket: when a daemon listens there, the capture goes through it
    /// (and its envelopes are spooled and shipped); otherwise it runs one-shot here.
    #[arg(long, value_name = "PATH", env = "PSTACKD_SOCKET", default_value = crate::client::DEFAULT_SOCKET)]
    pub socket: PathBuf,
    /// Never use the daemon: capture in this process (run as root).
    #[arg(long)]
    pub one_shot: bool,
}

impl Via {
    /// Ask the daemon unless `--one-shot`: `Ok(None)` when none listens (the
    /// caller then captures here), the envelopes when it captured. A daemon
    /// that refuses is an error, never bypassed quietly.
    fn try_daemon(
        &self,
        request: CaptureRequest,
        run_deadline: Duration,
    ) -> Result<Option<Vec<Envelope>>, crate::client::ClientError> {
        if self.one_shot {
            return Ok(None);
        }
        let progress =
            pstack_cli::progress::Progress::start("capturing through pstackd", run_deadline);
        // The daemon's own grace past the run deadline, and some for the socket.
        let timeout = run_deadline + Duration::from_secs(10);
        let got = crate::client::try_capture_kind_via_daemon(&self.socket, &request, timeout);
        progress.finish();
        if matches!(got, Ok(Some(_))) {
            eprintln!(
                "captured by pstackd ({}); spooled for shipping",
                self.socket.display()
            );
        }
        got
    }

    /// Capture through pstackd when one listens: `Some(exit code)` when it
    /// answered (its envelopes emitted like a capture here, or its refusal
    /// printed as `who: …`), `None` when the caller captures here.
    pub fn capture_through_daemon(
        &self,
        request: CaptureRequest,
        run_deadline: Duration,
        output: (bool, Option<&std::path::Path>),
        who: &str,
    ) -> anyhow::Result<Option<i32>> {
        match self.try_daemon(request, run_deadline) {
            Ok(Some(envs)) => {
                emit(&envs.iter().collect::<Vec<_>>(), output.0, output.1)?;
                Ok(Some(0))
            }
            Ok(None) => Ok(None),
            Err(e) => {
                eprintln!("{who}: {e}");
                Ok(Some(2))
            }
        }
    }
}

/// Arguments of `pstackctl capture transport`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// The flows and the window.
    #[command(flatten)]
    pub flows: FlowArgs,
    /// Daemon or one-shot.
    #[command(flatten)]
    pub via: Via,
    /// Do not load the eBPF TCP programs (reset attribution becomes an unknown).
    #[arg(long)]
    pub no_ebpf: bool,
    /// Print envelopes as JSON, one per line, instead of a summary.
    #[arg(long)]
    pub json: bool,
    /// Also write each envelope to DIR/sha256-<hex>.json.
    #[arg(long)]
    pub out_dir: Option<PathBuf>,
}

impl Args {
    /// The request these arguments ask for.
    pub fn request(&self) -> Result<TransportRequest, RequestError> {
        let f = &self.flows;
        Ok(TransportRequest {
            peer: f.peer.clone(),
            local: f.local.clone(),
            netns_pid: f.netns_pid,
            netns: f.netns.clone(),
            window_ms: f.window_ms()?,
            ports: Some(f.ports.clone()),
            max_flows: f.max_flows,
            wait: f.wait,
            ebpf: !self.no_ebpf,
        })
    }
}

/// The one-shot net helper configuration and leak budget: the helper is
/// found by `SupervisorConfig::locate` (`PSTACK_HELPER`, else next to this
/// executable), leaks are journaled in `PSTACK_LEAK_JOURNAL` (default
/// [`DEFAULT_LEAK_JOURNAL`]) under a budget of [`NET_LEAK_BUDGET`].
pub fn one_shot_helper(who: &str) -> Result<(SupervisorConfig, LeakBudget), TransportError> {
    let config = SupervisorConfig::locate(who)?;
    let journal = std::env::var_os("PSTACK_LEAK_JOURNAL")
        .map(PathBuf::from)
        .unwrap_or_else(|| DEFAULT_LEAK_JOURNAL.into());
    let budget = LeakBudget::new(NET_LEAK_BUDGET, LeakJournal::new(journal), &config.boot_id);
    Ok((config, budget))
}

/// Run a transport capture one-shot in this process, progress on stderr.
pub fn capture(plan: &Plan) -> Result<CaptureResult, TransportError> {
    let (config, budget) = one_shot_helper("pstackctl capture transport")?;
    let progress = super::progress::Stderr::default();
    pstack_capture::transport::capture_with(plan, &config, &budget, &|p| progress.show(p))
}

/// Emit envelopes (JSON lines or a summary) and write them to `out_dir`.
pub fn emit(envelopes: &[&Envelope], json: bool, out_dir: Option<&Path>) -> anyhow::Result<()> {
    use std::io::Write;
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    for env in envelopes {
        if let Some(dir) = out_dir {
            pstack_capture::envelope_file::write_into(dir, env)?;
        }
        if json {
            writeln!(out, "{}", serde_json::to_string(env)?)?;
        } else {
            writeln!(
                out,
                "{} [{}] {}",
                env.subject.describe(),
                env.completeness.as_str(),
                env.digest
            )?;
            for c in &env.claims {
                writeln!(out, "  {} {}: {}", c.kind.as_str(), c.code, c.statement)?;
                if let Some(f) = &c.falsifier {
                    writeln!(out, "    falsifier: {f}")?;
                }
            }
            for u in &env.unknowns {
                writeln!(out, "  unknown: {} (probe: {})", u.question, u.probe)?;
            }
            writeln!(out, "  next: {}", env.next_transition.action)?;
        }
    }
    Ok(())
}

/// Every envelope of a transport result, flows first.
pub fn envelopes(result: &CaptureResult) -> Vec<&Envelope> {
    result.flows.iter().chain(result.no_match.iter()).collect()
}

/// Run `pstackctl capture transport`.
pub fn run(args: Args) -> anyhow::Result<i32> {
    let plan = match args.request().and_then(|r| r.plan()) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("pstackctl capture transport: {e}");
            return Ok(2);
        }
    };
    if !args.json {
        eprintln!("{}", plan.describe(""));
    }
    let request = match args.request() {
        Ok(r) => CaptureRequest::Transport(r),
        Err(e) => {
            eprintln!("pstackctl capture transport: {e}");
            return Ok(2);
        }
    };
    let run_deadline = ValidRequest::Transport(plan.clone()).run_deadline();
    let output = (args.json, args.out_dir.as_deref());
    if let Some(code) = args.via.capture_through_daemon(
        request,
        run_deadline,
        output,
        "pstackctl capture transport",
    )? {
        return Ok(code);
    }
    let result = match capture(&plan) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("pstackctl capture transport: {e}");
            return Ok(2);
        }
    };
    emit(&envelopes(&result), args.json, args.out_dir.as_deref())?;
    Ok(0)
}
