//! `pstackctl capture longhorn`: arguments → [`LonghornRequest`] → the
//! Longhorn engine (`pstack_capture::longhorn`) → envelopes printed (streams
//! first, the transfer last).

use pstack_capture::request::{CaptureRequest, LonghornRequest, PlanLonghorn, RequestError};

use super::transport::{self, FlowArgs};

/// Arguments of `pstackctl capture longhorn`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Longhorn volume name.
    #[arg(long)]
    pub volume: String,
    /// Engine name (e.g. pvc-…-e-0).
    #[arg(long)]
    pub engine: String,
    /// Node of the source (healthy) replica; default: from the manager
    /// (--longhorn-api). Given with the API, it is checked against it.
    #[arg(long)]
    pub source_node: Option<String>,
    /// Node of the target (rebuilding) replica; default: from the manager
    /// (--longhorn-api). Given with the API, it is checked against it.
    #[arg(long)]
    pub target_node: Option<String>,
    /// Transfer id; default: derived from the linked flows.
    #[arg(long)]
    pub transfer: Option<String>,
    /// The stream flows (peer = the other node's replica/instance-manager) and the window.
    #[command(flatten)]
    pub flows: FlowArgs,
    /// Daemon or one-shot.
    #[command(flatten)]
    pub via: transport::Via,
    /// Longhorn manager API base URL, with or without a trailing /v1
    /// (http://longhorn-backend.longhorn-system:9500; cluster DNS names do not
    /// resolve on a host outside the pod network: use the service's ClusterIP).
    #[arg(long)]
    pub longhorn_api: Option<String>,
    /// Hubble Relay address (e.g. hubble-relay.kube-system:4245): read every
    /// Cilium verdict for the peer over the window, per connection, with the `hubble` CLI.
    #[arg(long)]
    pub hubble_server: Option<String>,
    /// The `hubble` CLI to run (one-shot only: pstackd runs `hubble` from its PATH).
    #[arg(long, default_value = "hubble")]
    pub hubble: std::path::PathBuf,
    /// Do not load the eBPF TCP programs.
    #[arg(long)]
    pub no_ebpf: bool,
    /// Print envelopes as JSON, one per line (streams first, the transfer last).
    #[arg(long)]
    pub json: bool,
    /// Also write each envelope to DIR/sha256-<hex>.json.
    #[arg(long)]
    pub out_dir: Option<std::path::PathBuf>,
}

impl Args {
    /// The request these arguments ask for.
    pub fn request(&self) -> Result<LonghornRequest, RequestError> {
        let f = &self.flows;
        Ok(LonghornRequest {
            volume: self.volume.clone(),
            engine: self.engine.clone(),
            source_node: self.source_node.clone().unwrap_or_default(),
            target_node: self.target_node.clone().unwrap_or_default(),
            transfer: self.transfer.clone(),
            peer: f.peer.clone(),
            local: f.local.clone(),
            netns_pid: f.netns_pid,
            netns: f.netns.clone(),
            window_ms: f.window_ms()?,
            ports: Some(f.ports.clone()),
            max_flows: f.max_flows,
            wait: f.wait,
            ebpf: !self.no_ebpf,
            longhorn_api: self.longhorn_api.clone(),
            hubble_server: self.hubble_server.clone(),
        })
    }
}

/// Run `pstackctl capture longhorn`.
pub fn run(args: Args) -> anyhow::Result<i32> {
    let plan = match args.request().and_then(|r| r.plan()) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("pstackctl capture longhorn: {e}");
            return Ok(2);
        }
    };
    if !args.json {
        eprintln!("{}", plan.transport().describe("rebuild transport "));
    }
    let run_deadline = pstack_capture::longhorn::run_deadline(&plan);
    let request = CaptureRequest::Longhorn(plan.request().clone());
    let output = (args.json, args.out_dir.as_deref());
    if let Some(code) = args.via.capture_through_daemon(
        request,
        run_deadline,
        output,
        "pstackctl capture longhorn",
    )? {
        return Ok(code);
    }
    let result =
        transport::one_shot_helper("pstackctl capture transport").and_then(|(config, budget)| {
            let progress = super::progress::Stderr::default();
            pstack_capture::longhorn::capture(&plan, &config, &budget, &args.hubble, &|p| {
                progress.show(p)
            })
        });
    let result = match result {
        Ok(r) => r,
        Err(e) => {
            eprintln!("pstackctl capture longhorn: {e}");
            return Ok(2);
        }
    };
    let mut all = transport::envelopes(&result.streams);
    all.push(&result.transfer);
    transport::emit(&all, args.json, args.out_dir.as_deref())?;
    Ok(0)
}

/// `pstackctl capture transport|longhorn`.
#[derive(Debug, clap::Subcommand)]
pub enum NetCapture {
    /// One network_stream envelope per TCP flow to a peer, sampled over a window.
    Transport(Box<transport::Args>),
    /// A Longhorn rebuild: storage_transfer envelope linking its stream envelopes by digest.
    Longhorn(Box<Args>),
}

/// Run a `capture transport|longhorn` subcommand.
pub fn run_net_capture(c: NetCapture) -> anyhow::Result<i32> {
    match c {
        NetCapture::Transport(a) => transport::run(*a),
        NetCapture::Longhorn(a) => run(*a),
    }
}
