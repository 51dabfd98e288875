//! `pstack-store`: serve the causal store, manage API keys, run retention.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::{CommandFactory, Parser, Subcommand};
use pstack_store::http::AppState;
use pstack_store::query::{
    Connection, EnvelopesCommand, Query, ReceiptsArgs, SubjectsCommand, UnknownsArgs,
};
use pstack_store::service::serve;
use pstack_store_core::db::{OpenOptions, RetentionPolicy, Store};
use pstack_store_core::ingest::IngestLimits;
use pstack_store_core::keys::{Scope, ScopeSet};

// glibc malloc, not mimalloc (which pstackctl uses for verify): under
// mimalloc the store's peak RSS with twenty concurrent 16 MiB bodies reached
// 726 MiB, past the bound (baseline + 600 MiB) the hostile-input test holds
// it to; the store's envelopes are small, where the allocator matters less.

/// Where `serve`, `keys`, `retention` and `migrate` keep the database when
/// no --db is given: systemd's StateDirectory= (`$STATE_DIRECTORY`), else
/// this directory. It must exist: the store never invents a database in the
/// current directory, nor a directory tree.
const DEFAULT_STATE_DIR: &str = "/var/lib/pstack-store";

fn default_db() -> Result<String> {
    let dir = std::env::var("STATE_DIRECTORY")
        .ok()
        .and_then(|d| d.split(':').next().map(str::to_string))
        .filter(|d| !d.is_empty())
        .unwrap_or_else(|| DEFAULT_STATE_DIR.to_string());
    let dir = std::path::PathBuf::from(dir);
    if !dir.is_dir() {
        bail!(
            "no --db given and the state directory {} does not exist: create it (install -d -m 0750 {}) or pass --db PATH or --db postgres://...; pstack-store does not create a database in the current directory",
            dir.display(),
            dir.display()
        );
    }
    Ok(dir.join("pstack-store.db").to_string_lossy().into_owned())
}

/// Exit codes of `pstack-store` (kept equal to the README's table by a test).
const EXIT_CODES_HELP: &str = "\
Exit codes:
  0  ok: served until SIGTERM or SIGINT and drained, or the command did its work
  1  error: the database cannot be opened, the address cannot be bound, the store refused or could not be reached (the reason is printed)
  2  usage error: a bad flag or value
  3  not found: the store answered that the envelope, subject or receipt asked for does not exist";

#[derive(Parser, Debug)]
#[command(
    name = "pstack-store",
    version = env!("PSTACK_VERSION"),
    about = "The pstack causal store",
    after_help = EXIT_CODES_HELP
)]
struct Cli {
    /// Database: a SQLite file path (created if missing) or a postgres:// URL
    /// [default: $STATE_DIRECTORY/pstack-store.db under systemd, else
    /// /var/lib/pstack-store/pstack-store.db; never the current directory].
    /// Not used by the query commands, which go through --url.
    #[arg(long, env = "PSTACK_STORE_DB", global = true)]
    db: Option<String>,
    /// Log format.
    #[arg(long, value_parser = ["text", "json"], default_value = "text", global = true)]
    log_format: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Serve the HTTP API until SIGTERM/SIGINT, then drain and exit.
    Serve {
        /// SQLite only: fsync every commit so an acknowledged batch survives
        /// power loss (slower ingest). Off: a power loss may roll back the
        /// last ~200 ms of acknowledged batches.
        #[arg(long)]
        durable: bool,
        /// Address to listen on.
        #[arg(long, env = "PSTACK_STORE_LISTEN", default_value = "127.0.0.1:7470")]
        listen: SocketAddr,
        /// Largest request body on the wire, bytes (memory per request vs batch size).
        #[arg(long, default_value_t = 16 << 20)]
        max_body_bytes: usize,
        /// Largest body after gzip decoding, bytes.
        #[arg(long, default_value_t = 64 << 20)]
        max_decoded_bytes: usize,
        /// Most envelopes per request.
        #[arg(long, default_value_t = 5000)]
        max_items: usize,
        /// Most spans in one OTLP request (/v1/traces); more get 413
        /// too_many_spans. Each span takes 264 bytes and up decoded, whatever
        /// it takes on the wire (memory per request vs batch size).
        #[arg(long, default_value_t = 100_000, value_parser = clap::value_parser!(u32).range(1..))]
        max_spans: u32,
        /// Delete envelopes received longer ago than this (e.g. 30d, 12h); off by default.
        #[arg(long, value_parser = parse_duration)]
        retention_max_age: Option<Duration>,
        /// Delete the oldest envelopes while their bytes as received exceed this (e.g. 50G; the
        /// database keeps most bodies compressed, so its files are smaller); off by default.
        #[arg(long, value_parser = parse_bytes)]
        retention_max_bytes: Option<u64>,
        /// How often retention runs.
        #[arg(long, value_parser = parse_duration, default_value = "10m")]
        retention_interval: Duration,
        /// Remediation gate key: a file holding 64 hex digits (32 random
        /// bytes, e.g. `head -c32 /dev/urandom | xxd -p -c64`), mode 0600.
        /// Grant tokens are stored as keyed hashes under it and webhook
        /// callbacks sealed with it. Without it a random key is used for this
        /// run only: outstanding grants and stored callbacks do not survive
        /// a restart.
        #[arg(long, env = "PSTACK_STORE_GATE_KEY_FILE")]
        gate_key_file: Option<std::path::PathBuf>,
        /// How long an envelope stays fresh, per subject kind: the one rule
        /// of run MUTATE steps, gate pre-mutation envelopes and handoff
        /// expiry. Overrides of the defaults (thread 60s, process 120s,
        /// network_stream 60s, storage_transfer 300s, host 600s), e.g.
        /// `process=30s,host=15m`.
        #[arg(long, env = "PSTACK_STORE_FRESHNESS", value_parser = parse_freshness)]
        freshness: Option<pstack_store_core::runs::freshness::Freshness>,
        /// Let grant webhooks reach private, loopback, link-local and other
        /// internal addresses (the SSRF guard refuses them by default).
        #[arg(long, env = "ALERT_WEBHOOK_ALLOW_PRIVATE", default_value_t = false)]
        alert_webhook_allow_private: bool,
        /// Most connections served at once; one more is accepted and closed
        /// at once (counted in pstack_store_connections_refused_total). Kept
        /// below the open-file limit.
        #[arg(long, default_value_t = 4096, value_parser = clap::value_parser!(u32).range(1..))]
        max_connections: u32,
        /// Time a client has to send a complete request head; also the idle
        /// timeout of a keep-alive connection (slow-loris clients are closed).
        #[arg(long, value_parser = parse_positive_duration, default_value = "10s")]
        header_timeout: Duration,
        /// Time to answer a whole request, body included (then 408).
        #[arg(long, value_parser = parse_positive_duration, default_value = "60s")]
        request_timeout: Duration,
        /// Most concurrent ingest requests per API key (more get 429).
        #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..))]
        per_key_concurrency: u32,
        /// Bytes all ingest requests in flight may hold together, wire plus
        /// decoded body (e.g. 256M); past it 503 + Retry-After. A request
        /// larger than the whole budget still runs, alone.
        #[arg(long, value_parser = parse_bytes, default_value = "256M")]
        inflight_budget: u64,
        /// Join two mirrored stream envelopes (one end's local endpoint is
        /// the other's remote) into one transfer when their capture windows
        /// overlap or lie at most this far apart. Wider joins captures fired
        /// further apart; narrower keeps a reused 4-tuple from being taken
        /// for the same connection.
        #[arg(long, value_parser = parse_duration, default_value = "120s")]
        transfer_join_window: Duration,
        /// Refuse (400, naming the field) a change whose `at`, or a span
        /// whose start or end time, lies further than this in the future of
        /// the store's clock. Wider tolerates hosts with worse clocks; every
        /// second of it is a second a forged future record can pin the
        /// target's current state or fake a recovery.
        #[arg(long, value_parser = parse_duration, default_value = "5m")]
        max_future_skew: Duration,
        /// The URL clients reach this store at through its reverse proxy
        /// (e.g. https://store.example:7443, docs/store-tls.md). Its host,
        /// on any port, is accepted in the Host header of /mcp requests,
        /// which otherwise accept loopback names only (a DNS-rebinding
        /// guard: any other Host is 403).
        #[arg(long, env = "PSTACK_STORE_PUBLIC_URL")]
        public_url: Option<String>,
        /// Another Host header value /mcp accepts: a host name or address,
        /// with :port to accept that port only (repeatable; comma-separated
        /// in the environment). Loopback names are always accepted.
        #[arg(long, env = "PSTACK_STORE_MCP_ALLOWED_HOSTS", value_delimiter = ',')]
        mcp_allowed_host: Vec<String>,
        /// A reverse proxy whose X-Forwarded-For is believed (repeatable; an
        /// IP address, e.g. 127.0.0.1 for the nginx of docs/store-tls.md).
        /// The login throttle then keys by the client address that proxy
        /// saw; without it, by the connection's peer, and the header is
        /// ignored (any client could write it). Behind a proxy that is not
        /// listed, every login shares the proxy's address and its limits.
        #[arg(long = "trusted-proxy", value_name = "IP")]
        trusted_proxies: Vec<std::net::IpAddr>,
    },
    /// The remediation gate key every replica on this database must share:
    /// show its recorded fingerprint, or adopt a replacement key.
    GateKey {
        #[command(subcommand)]
        command: GateKeyCommand,
    },
    /// Manage API keys.
    Keys {
        #[command(subcommand)]
        command: KeysCommand,
    },
    /// Manage the approval page's human operators.
    Users {
        #[command(subcommand)]
        command: UsersCommand,
    },
    /// Run one retention pass and print what it did.
    Retention {
        /// Delete envelopes received longer ago than this.
        #[arg(long, value_parser = parse_duration)]
        max_age: Option<Duration>,
        /// Delete the oldest envelopes while their bytes as received exceed this (the
        /// database keeps most bodies compressed, so its files are smaller).
        #[arg(long, value_parser = parse_bytes)]
        max_bytes: Option<u64>,
    },
    /// Apply pending migrations and print the schema version.
    Migrate,
    /// Serve the MCP tools over stdio (the HTTP server also serves them at
    /// /mcp). Reads only, unless OBS_MCP_ENABLE_WRITES=true.
    Mcp {
        /// The API key the tools act with.
        #[arg(long, env = "PSTACK_STORE_API_KEY", hide_env_values = true)]
        api_key: String,
        /// The remediation gate key `serve` uses on this database (see
        /// `serve --gate-key-file`): a grant minted by the server, or by
        /// another MCP process, is claimed, completed or failed here only
        /// under the same key. Checked against the database's recorded
        /// fingerprint before serving, like `serve`.
        #[arg(long, env = "PSTACK_STORE_GATE_KEY_FILE")]
        gate_key_file: Option<std::path::PathBuf>,
        /// Let grant webhooks of `propose_remediation_action` reach private
        /// and loopback addresses (as `serve --alert-webhook-allow-private`).
        #[arg(long, env = "ALERT_WEBHOOK_ALLOW_PRIVATE", default_value_t = false)]
        alert_webhook_allow_private: bool,
    },
    /// Record or list changes (deploys, flag flips, kernel upgrades…) in a
    /// running store, e.g. from a CI/CD pipeline.
    Changes {
        #[command(subcommand)]
        command: Box<pstack_store::changes_cli::ChangesCommand>,
    },
    /// Read stored envelopes over the HTTP API: `get DIGEST`, `list --subject KEY`.
    Envelopes {
        #[command(flatten)]
        conn: Connection,
        #[command(subcommand)]
        command: EnvelopesCommand,
    },
    /// A subject's history over the HTTP API: `history --subject KEY`.
    Subjects {
        #[command(flatten)]
        conn: Connection,
        #[command(subcommand)]
        command: SubjectsCommand,
    },
    /// The fleet's open unknowns (with --all, answered ones too), over the HTTP API.
    Unknowns {
        #[command(flatten)]
        conn: Connection,
        #[command(flatten)]
        args: UnknownsArgs,
    },
    /// A subject's receipt chain, over the HTTP API.
    Receipts {
        #[command(flatten)]
        conn: Connection,
        #[command(flatten)]
        args: ReceiptsArgs,
    },
    /// Both ends of a transfer joined by the store (`show ID`, `of-envelope
    /// DIGEST`): who sent the RST, whose window was zero, each side's counters.
    Transfer {
        #[command(flatten)]
        conn: Connection,
        #[command(subcommand)]
        command: pstack_store::query::transfers::TransferCommand,
    },
}

#[derive(Subcommand, Debug)]
enum KeysCommand {
    /// Create a key and print it once (it is stored only hashed). Name
    /// its scopes: there is no default, since any default is wrong for
    /// someone (a node needs ingest and nothing more; an agent, analysis
    /// and read).
    #[command(after_long_help = KEY_SCOPES_HELP)]
    Create {
        /// Who holds it, e.g. the node name.
        #[arg(long)]
        name: String,
        /// What it may do (repeatable, or comma-separated): ingest,
        /// telemetry, analysis, runner, read. Required.
        #[arg(long = "scope", value_name = "SCOPE", value_delimiter = ',', value_parser = parse_scope)]
        scopes: Vec<Scope>,
    },
    /// Replace a key's scopes, e.g. narrow a key made before scopes
    /// (`legacy`: every scope) to ingest. Effective on its next request.
    #[command(after_long_help = KEY_SCOPES_HELP)]
    Scope {
        /// Key id (the 16 hex digits after psk_).
        id: String,
        /// The scopes it keeps (repeatable, or comma-separated). Required.
        #[arg(long = "scope", value_name = "SCOPE", value_delimiter = ',', value_parser = parse_scope)]
        scopes: Vec<Scope>,
    },
    /// List keys (ids, names, dates, scopes; never secrets).
    List {
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
    /// Revoke a key by id; effective on its next request.
    Revoke {
        /// Key id (the 16 hex digits after psk_).
        id: String,
    },
}

/// The scope table, after `keys create --help` and `keys scope --help`.
const KEY_SCOPES_HELP: &str = "\
Scopes (every route needs one; none implies another):
  ingest     nodes shipping envelopes (POST /v1/envelopes)
  telemetry  CI/CD and collectors (POST /v1/changes, POST /v1/traces, Alertmanager alerts)
  analysis   the investigating agent (findings, evals, incidents, proposals, receipts, runs)
  runner     executors (claim, complete or fail a grant)
  read       dashboards and agents (every GET)
  legacy     every scope: only keys made before scopes hold it; narrow them with `keys scope`

Examples:
  pstack-store keys create --name node-a --scope ingest
  pstack-store keys create --name ci --scope telemetry
  pstack-store keys create --name agent --scope analysis --scope read
  pstack-store keys create --name executor --scope runner
  pstack-store keys scope 0123456789abcdef --scope ingest";

/// A scope a new key may be given (`legacy` only survives from old keys).
fn parse_scope(s: &str) -> Result<Scope, String> {
    match Scope::parse(s) {
        Some(Scope::Legacy) => Err(
            "legacy is what keys made before scopes hold; give a new key the scopes it needs (ingest, telemetry, analysis, runner, read)".into(),
        ),
        Some(x) => Ok(x),
        None => Err(format!(
            "{s:?} is not a scope: ingest, telemetry, analysis, runner or read"
        )),
    }
}

/// `--scope` given at least once, or a usage error (exit 2) listing them.
fn require_scopes(scopes: Vec<Scope>, command: &str) -> ScopeSet {
    if scopes.is_empty() {
        Cli::command()
            .error(
                clap::error::ErrorKind::MissingRequiredArgument,
                format!(
                    "`keys {command}` needs --scope (repeatable); a key has no default scope.\n{KEY_SCOPES_HELP}"
                ),
            )
            .exit();
    }
    ScopeSet::of(scopes)
}

#[derive(Subcommand, Debug)]
enum GateKeyCommand {
    /// Print the fingerprint recorded in the database (the key the first
    /// replica started with) and, with --gate-key-file, that file's.
    Show {
        /// A gate key file to fingerprint.
        #[arg(long)]
        gate_key_file: Option<std::path::PathBuf>,
    },
    /// Record this key's fingerprint in place of the recorded one, after
    /// replacing the gate key on purpose with every replica stopped. Grants
    /// and stored webhook callbacks made under the old key stop working.
    Adopt {
        /// The new gate key file.
        #[arg(long)]
        gate_key_file: std::path::PathBuf,
    },
}

/// Put the gate key of `--gate-key-file` (else a random one of this run)
/// in `state`, checked against the database's recorded fingerprint: every
/// process on this database (`serve` replicas and stdio `mcp`) must hold
/// the one gate key, so refuse before serving anything if this one differs.
async fn adopt_gate_key(
    store: &Store,
    state: &mut AppState,
    gate_key_file: Option<&std::path::Path>,
) -> Result<()> {
    use pstack_store_core::gate::shared_key::{self, KeyAgreement, KeySource};
    let key_source = match gate_key_file {
        Some(path) => {
            state.gate.keys = std::sync::Arc::new(read_gate_key(path)?);
            KeySource::File
        }
        None => {
            tracing::warn!(
                "no --gate-key-file: remediation grants and stored webhook callbacks use a key of this run only (and no other replica can share it)"
            );
            KeySource::Ephemeral
        }
    };
    let fingerprint = state.gate.keys.fingerprint().to_string();
    match shared_key::check(
        store,
        &state.gate.keys,
        key_source,
        pstack_store_core::now_ns(),
    )
    .await?
    {
        KeyAgreement::Recorded => tracing::info!(
            fingerprint,
            "recorded the gate key's fingerprint: every replica on this database must start with this key"
        ),
        KeyAgreement::Matches => {
            tracing::info!(fingerprint, "gate key matches the database's")
        }
        KeyAgreement::Unrecorded => {}
    }
    Ok(())
}

/// A gate key file: 64 hex digits.
fn read_gate_key(path: &std::path::Path) -> Result<pstack_store_core::gate::keys::GateKeys> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading the gate key {}", path.display()))?;
    pstack_store_core::gate::keys::GateKeys::from_hex(&text)
        .with_context(|| format!("gate key {}", path.display()))
}

#[derive(Subcommand, Debug)]
enum UsersCommand {
    /// Create an operator of the approval page; the password is read from
    /// the first line of standard input (at least 12 characters) and stored
    /// only as an argon2id hash.
    Create {
        /// Login name.
        name: String,
    },
    /// List operators: name, created, disabled, live sessions.
    List {
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
    /// Disable an operator: no login, and every session of theirs ends now.
    Disable {
        /// Login name.
        name: String,
    },
    /// Enable a disabled operator again (they log in anew).
    Enable {
        /// Login name.
        name: String,
    },
    /// Set a new password, read from the first line of standard input (at
    /// least 12 characters); every session of the operator ends now.
    Passwd {
        /// Login name.
        name: String,
    },
    /// End every session of an operator now (they log in anew).
    RevokeSessions {
        /// Login name.
        name: String,
    },
}

/// The first line of standard input, without its line ending.
fn password_from_stdin() -> Result<String> {
    let mut line = String::new();
    std::io::stdin()
        .read_line(&mut line)
        .context("reading the password from standard input")?;
    Ok(line.trim_end_matches(['\r', '\n']).to_string())
}

/// Report what a change to operator `name` did.
fn operator_changed(
    name: &str,
    what: &str,
    change: pstack_store_core::db::operators::OperatorChange,
) -> Result<()> {
    match change {
        pstack_store_core::db::operators::OperatorChange::Done { sessions_ended } => {
            eprintln!("{what} operator {name:?}; {sessions_ended} session(s) ended");
            Ok(())
        }
        pstack_store_core::db::operators::OperatorChange::NoSuchOperator => {
            bail!("no operator named {name:?}")
        }
    }
}

/// A duration that is not zero (a zero timeout would close every connection).
fn parse_positive_duration(s: &str) -> Result<Duration, String> {
    match parse_duration(s)? {
        d if d.is_zero() => Err("must be more than zero".into()),
        d => Ok(d),
    }
}

/// The one duration parser of pstack's CLIs (a unit is required: 30d, 12h, 10m, 45s).
fn parse_duration(s: &str) -> Result<Duration, String> {
    pstack_cli::parse_duration(s).map_err(|e| e.to_string())
}

fn parse_freshness(s: &str) -> Result<pstack_store_core::runs::freshness::Freshness, String> {
    pstack_store_core::runs::freshness::Freshness::default()
        .with_overrides(s)
        .map_err(|e| e.to_string())
}

fn parse_bytes(s: &str) -> Result<u64, String> {
    let (num, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{s:?}: expected e.g. 500M, 50G"))?;
    let mult: u64 = match unit {
        "" | "B" => 1,
        "K" | "KiB" => 1 << 10,
        "M" | "MiB" => 1 << 20,
        "G" | "GiB" => 1 << 30,
        "T" | "TiB" => 1 << 40,
        _ => return Err(format!("{s:?}: unit must be K, M, G or T")),
    };
    n.checked_mul(mult)
        .ok_or_else(|| format!("{s:?} overflows"))
}

fn init_logs(format: &str) {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_from_env("PSTACK_STORE_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,sqlx=warn"));
    // Colour only on a terminal without NO_COLOR: a log file or the journal
    // gets plain text.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(pstack_cli::output::color_wanted(
            std::io::stderr().is_terminal(),
        ))
        .with_writer(std::io::stderr);
    if format == "json" {
        builder.json().init();
    } else {
        builder.init();
    }
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(error = %e, "cannot install SIGTERM handler; only SIGINT stops the server");
            let _ = ctrl_c.await;
            return;
        }
    };
    tokio::select! {
        _ = ctrl_c => {},
        _ = term.recv() => {},
    }
    tracing::info!("shutdown requested; draining in-flight requests");
}

/// Parse the command line; every subcommand's `--help` ends with the exit codes.
fn parse_cli() -> Cli {
    use clap::{CommandFactory, FromArgMatches};
    fn with_exit_codes(c: clap::Command) -> clap::Command {
        // A command's own long epilogue (the key scopes) comes first.
        let c = match c.get_after_long_help().map(|h| h.to_string()) {
            Some(own) => c.after_long_help(format!("{own}\n\n{EXIT_CODES_HELP}")),
            None => c,
        };
        c.after_help(EXIT_CODES_HELP)
            .mut_subcommands(with_exit_codes)
    }
    let command = with_exit_codes(Cli::command());
    let matches = command.get_matches();
    Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    pstack_packaging::assets::write_if_requested(Cli::command);
    let cli = parse_cli();
    let (conn, query) = match cli.command {
        Command::Envelopes { conn, command } => (conn, Query::Envelopes(command)),
        Command::Subjects { conn, command } => (conn, Query::Subjects(command)),
        Command::Unknowns { conn, args } => (conn, Query::Unknowns(args)),
        Command::Receipts { conn, args } => (conn, Query::Receipts(args)),
        Command::Transfer { conn, command } => (conn, Query::Transfer(command)),
        command => {
            let cli = Cli { command, ..cli };
            return match run(cli).await {
                Ok(()) => std::process::ExitCode::SUCCESS,
                Err(e) if pstack_cli::output::is_broken_pipe(e.as_ref()) => {
                    std::process::ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("pstack-store: {e:#}");
                    std::process::ExitCode::from(1)
                }
            };
        }
    };
    if cli.db.is_some() {
        eprintln!(
            "pstack-store: --db is for serve, keys, retention and migrate; queries go through --url"
        );
        return std::process::ExitCode::from(2);
    }
    match pstack_store::query::run(&conn, query).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) if e.is_broken_pipe() => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pstack-store: {e}");
            std::process::ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(1))
        }
    }
}

/// `serve`, `keys`, `retention`, `migrate`: the commands that open the database.
async fn run(cli: Cli) -> Result<()> {
    init_logs(&cli.log_format);
    // An HTTP client of a running store: opens no database.
    if let Command::Changes { command } = &cli.command {
        return pstack_store::changes_cli::run(command).await;
    }
    let durable = matches!(cli.command, Command::Serve { durable: true, .. });
    let mut opts = OpenOptions {
        sqlite_durable: durable,
        ..OpenOptions::default()
    };
    if let Command::Serve {
        transfer_join_window,
        ..
    } = &cli.command
    {
        opts.transfer_join_window = *transfer_join_window;
    }
    let db = match cli.db {
        Some(db) => db,
        None => default_db()?,
    };
    let store = Store::open(&db, &opts)
        .await
        .with_context(|| "opening the database (check --db / PSTACK_STORE_DB)".to_string())?;
    match cli.command {
        Command::Changes { .. } => {} // handled above, before the database
        Command::Mcp {
            api_key,
            gate_key_file,
            alert_webhook_allow_private,
        } => {
            let mut state = AppState::new(store.clone(), IngestLimits::default());
            // Only the write tools touch grants: a read-only session needs
            // no gate key.
            if gate_key_file.is_some() || pstack_store::mcp::writes_enabled_from_env() {
                adopt_gate_key(&store, &mut state, gate_key_file.as_deref()).await?;
            }
            state.gate.allow_private_webhooks = alert_webhook_allow_private;
            pstack_store::mcp::serve_stdio(state, api_key).await?;
        }
        Command::Migrate => {
            pstack_cli::outln!("schema version {}", store.schema_version().await?)?;
        }
        Command::Users { command } => match command {
            UsersCommand::Create { name } => {
                let password = password_from_stdin()?;
                pstack_store_core::operators::validate(&name, &password)?;
                let hash = pstack_store_core::operators::hash_password(&password)?;
                if !store
                    .create_operator(&name, &hash, pstack_store_core::now_ns())
                    .await?
                {
                    bail!("an operator named {name:?} exists");
                }
                eprintln!("created operator {name:?}");
            }
            UsersCommand::List { json } => {
                let rows = store.list_operators(pstack_store_core::now_ns()).await?;
                let when = |ns: i64| pstack_store_core::ident::format_ns(ns);
                if json {
                    let items: Vec<serde_json::Value> = rows
                        .iter()
                        .map(|(name, created, disabled, sessions)| {
                            serde_json::json!({
                                "username": name,
                                "createdAt": when(*created),
                                "disabledAt": disabled.map(when),
                                "liveSessions": sessions,
                            })
                        })
                        .collect();
                    pstack_cli::outln!("{}", serde_json::to_string_pretty(&items)?)?;
                } else {
                    pstack_cli::outln!(
                        "{:<25} {:<25} {:>8} NAME",
                        "CREATED",
                        "DISABLED",
                        "SESSIONS"
                    )?;
                    for (name, created, disabled, sessions) in rows {
                        pstack_cli::outln!(
                            "{:<25} {:<25} {:>8} {}",
                            when(created),
                            disabled.map(when).as_deref().unwrap_or("-"),
                            sessions,
                            name
                        )?;
                    }
                }
            }
            UsersCommand::Disable { name } => {
                let change = store
                    .set_operator_disabled(&name, true, pstack_store_core::now_ns())
                    .await?;
                operator_changed(&name, "disabled", change)?;
            }
            UsersCommand::Enable { name } => {
                let change = store
                    .set_operator_disabled(&name, false, pstack_store_core::now_ns())
                    .await?;
                operator_changed(&name, "enabled", change)?;
            }
            UsersCommand::Passwd { name } => {
                let password = password_from_stdin()?;
                pstack_store_core::operators::validate_password(&password)?;
                let hash = pstack_store_core::operators::hash_password(&password)?;
                let change = store.set_operator_password(&name, &hash).await?;
                operator_changed(&name, "changed the password of", change)?;
            }
            UsersCommand::RevokeSessions { name } => {
                let change = store.revoke_operator_sessions(&name).await?;
                operator_changed(&name, "revoked the sessions of", change)?;
            }
        },
        Command::Keys { command } => match command {
            KeysCommand::Create { name, scopes } => {
                if name.trim().is_empty() {
                    bail!("--name must not be empty");
                }
                let scopes = require_scopes(scopes, "create");
                let key = store.create_key(&name, &scopes).await?;
                eprintln!(
                    "created key {} for {name:?} with scope {scopes}; it is shown once, store it now:",
                    key.id
                );
                pstack_cli::outln!("{}", key.plaintext)?;
            }
            KeysCommand::Scope { id, scopes } => {
                let scopes = require_scopes(scopes, "scope");
                let (before, after) = store.set_key_scopes(&id, &scopes).await?;
                pstack_cli::outln!("key {id}: scope {before} -> {after}")?;
            }
            KeysCommand::List { json } => {
                let keys = store.list_keys().await?;
                if json {
                    pstack_cli::outln!("{}", serde_json::to_string_pretty(&keys)?)?;
                } else {
                    pstack_cli::outln!(
                        "{:<18} {:<25} {:<25} {:<32} NAME",
                        "ID",
                        "CREATED",
                        "REVOKED",
                        "SCOPES"
                    )?;
                    for k in keys {
                        pstack_cli::outln!(
                            "{:<18} {:<25} {:<25} {:<32} {}",
                            k.id,
                            k.created_at,
                            k.revoked_at.as_deref().unwrap_or("-"),
                            k.scopes.join(","),
                            k.name
                        )?;
                    }
                }
            }
            KeysCommand::Revoke { id } => {
                store.revoke_key(&id).await?;
                pstack_cli::outln!("revoked {id}")?;
            }
        },
        Command::GateKey {
            command: GateKeyCommand::Show { gate_key_file },
        } => {
            match store.gate_key_fingerprint().await? {
                Some(r) => pstack_cli::outln!(
                    "recorded  {}  (since {})",
                    r.fingerprint,
                    pstack_store_core::ident::format_ns(r.recorded_ns)
                )?,
                None => pstack_cli::outln!(
                    "recorded  none (the first serve with --gate-key-file records its key)"
                )?,
            }
            if let Some(path) = gate_key_file {
                let keys = read_gate_key(&path)?;
                pstack_cli::outln!("file      {}  ({})", keys.fingerprint(), path.display())?;
            }
        }
        Command::GateKey {
            command: GateKeyCommand::Adopt { gate_key_file },
        } => {
            let keys = read_gate_key(&gate_key_file)?;
            let before = store
                .replace_gate_key_fingerprint(keys.fingerprint(), pstack_store_core::now_ns())
                .await?;
            match before {
                Some(old) if old != keys.fingerprint() => eprintln!(
                    "adopted gate key {} in place of {old}; start every replica with {}",
                    keys.fingerprint(),
                    gate_key_file.display()
                ),
                _ => eprintln!("recorded gate key {}", keys.fingerprint()),
            }
        }
        Command::Retention { max_age, max_bytes } => {
            if max_age.is_none() && max_bytes.is_none() {
                bail!("give --max-age and/or --max-bytes");
            }
            let report = store
                .apply_retention(
                    &RetentionPolicy { max_age, max_bytes },
                    pstack_store_core::now_ns(),
                )
                .await?;
            pstack_cli::outln!("{}", serde_json::to_string_pretty(&report)?)?;
        }
        Command::Envelopes { .. }
        | Command::Subjects { .. }
        | Command::Unknowns { .. }
        | Command::Receipts { .. }
        | Command::Transfer { .. } => {
            bail!("internal: a query command reached the database path")
        }
        Command::Serve {
            durable: _,
            listen,
            max_body_bytes,
            max_decoded_bytes,
            max_items,
            max_spans,
            retention_max_age,
            retention_max_bytes,
            retention_interval,
            gate_key_file,
            freshness,
            alert_webhook_allow_private,
            max_connections,
            header_timeout,
            request_timeout,
            per_key_concurrency,
            inflight_budget,
            transfer_join_window: _,
            max_future_skew,
            public_url,
            mcp_allowed_host,
            trusted_proxies,
        } => {
            let limits = IngestLimits {
                max_body_bytes,
                max_decoded_bytes,
                max_items,
                max_spans: max_spans as usize,
                ..IngestLimits::default()
            };
            let conn = pstack_store::conn::ConnLimits {
                max_connections: max_connections as usize,
                header_timeout,
                request_timeout,
                per_key_concurrency: per_key_concurrency as usize,
                inflight_budget_bytes: inflight_budget,
            };
            let mut state = AppState::with_conn_limits(store.clone(), limits, conn);
            state.login = pstack_store_core::login::LoginControls::new(
                pstack_store_core::login::LoginLimits::default(),
                trusted_proxies,
            );
            adopt_gate_key(&store, &mut state, gate_key_file.as_deref()).await?;
            state.mcp_allowed_hosts =
                pstack_store::mcp::allowed_hosts(public_url.as_deref(), &mcp_allowed_host)?;
            state.gate.allow_private_webhooks = alert_webhook_allow_private;
            state.mcp_writes = pstack_store::mcp::writes_enabled_from_env();
            state.max_future_skew_ns =
                i64::try_from(max_future_skew.as_nanos()).unwrap_or(i64::MAX);
            if let Some(freshness) = freshness {
                state.freshness = freshness;
            }
            if alert_webhook_allow_private {
                tracing::warn!(
                    "ALERT_WEBHOOK_ALLOW_PRIVATE=true: grant webhooks may reach internal addresses"
                );
            }
            let listener = tokio::net::TcpListener::bind(listen)
                .await
                .with_context(|| format!("binding {listen}"))?;
            tracing::info!(addr = %listener.local_addr()?, backend = ?store.backend(), "serving");
            let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
            let retention = if retention_max_age.is_some() || retention_max_bytes.is_some() {
                let policy = RetentionPolicy {
                    max_age: retention_max_age,
                    max_bytes: retention_max_bytes,
                };
                let store = store.clone();
                let metrics = state.metrics.clone();
                let mut stop = stop_rx.clone();
                Some(tokio::spawn(async move {
                    let mut tick = tokio::time::interval(retention_interval);
                    loop {
                        tokio::select! {
                            _ = tick.tick() => {
                                match store.apply_retention(&policy, pstack_store_core::now_ns()).await {
                                    Ok(r) => metrics.add_retention_deleted(r.deleted),
                                    Err(e) => tracing::error!(error = %pstack_store_core::logsafe::text(&e), "retention pass failed"),
                                }
                            }
                            _ = stop.changed() => break,
                        }
                    }
                }))
            } else {
                None
            };
            // The gate's 1-minute ticker: leases, grant windows, watchdog.
            let gate_ticker = {
                let state = state.clone();
                let mut stop = stop_rx.clone();
                tokio::spawn(async move {
                    let mut tick = tokio::time::interval(Duration::from_secs(60));
                    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                    loop {
                        tokio::select! {
                            _ = tick.tick() => {
                                if let Err(e) = pstack_store_core::gate_tick::tick(&state.store, &state.clock).await {
                                    tracing::error!(error = %pstack_store_core::logsafe::text(&e), "gate tick failed");
                                }
                            }
                            _ = stop.changed() => break,
                        }
                    }
                })
            };
            serve(listener, state, shutdown_signal()).await?;
            let _ = stop_tx.send(true);
            if let Some(r) = retention {
                let _ = r.await;
            }
            let _ = gate_ticker.await;
            store.close().await;
            tracing::info!("stopped");
        }
    }
    Ok(())
}
