//! `pstackctl` subcommands, one module each. Each exposes a clap `Args` type and
//! `run(args) -> anyhow::Result<i32>` returning the process exit code
//! (0 ok / valid, 1 invalid evidence, 2 usage or I/O error; `trace` adds 3 when
//! the kernel cannot provide eBPF (`unsupported`) and 4 when the caller lacks
//! CAP_BPF/CAP_PERFMON (`permission_denied`)).

/// Exit codes of `pstackctl`, shown after every `--help` and kept equal to
/// the README's table (a test compares them).
pub const EXIT_CODES_HELP: &str = "\
Exit codes:
  0  ok: the command did its work (an envelope was captured whatever its completeness, the envelope is valid, the daemon answered), or stdout was closed by its reader
  1  invalid evidence: envelope verify/diff/handoff found a broken rule (each printed with where it broke) or diff refused two subjects
  2  usage or I/O error: a bad flag or value, an unreadable file, no envelope could be produced, the daemon is not running (status)
  3  trace tcp: this kernel cannot provide the eBPF surfaces (unsupported: no BTF or a missing tracepoint)
  4  trace tcp: not allowed to load eBPF (permission_denied: not root, no CAP_BPF and CAP_PERFMON, or a sandbox refusing bpf())";

pub mod capture;
pub mod envelope;
pub mod longhorn;
pub mod progress;
pub mod sockets;
pub mod status;
pub mod trace;
pub mod transport;
pub mod watch;

// `pstackctl`'s command line lives here, not in the binary, so tests can run
// the probe commands envelopes carry through the very same parser.
#[derive(Debug, clap::Parser)]
#[command(
    name = "pstackctl",
    version = pstack_capture::process::VERSION,
    propagate_version = true
)]
/// Capture, verify, compare and hand off pstack evidence envelopes.
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// `pstackctl`'s subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Check, diff and summarize sealed envelopes (offline; no daemon needed).
    Envelope(envelope::Args),
    /// Capture a sealed envelope of a process, thread or host.
    Capture(Box<capture::Args>),
    /// Show what the running pstackd holds: captures, helpers, spool, shipping.
    Status(status::Args),
    /// List TCP sockets with their tcp_info, like `ss -tin` (a table; --json for every field).
    #[command(long_about = sockets::LONG_ABOUT)]
    Sockets(sockets::Args),
    /// Watch TCP retransmits, resets and state changes live (eBPF).
    Trace(trace::Args),
    /// List pstackd's watch rules (armed or why not, fired, suppressed) and follow their firings.
    Watch(watch::Args),
}

/// `pstackctl`'s clap command with the exit codes after every `--help`,
/// nested subcommands included (`envelope verify --help`).
pub fn command() -> clap::Command {
    fn with_exit_codes(c: clap::Command) -> clap::Command {
        c.after_help(EXIT_CODES_HELP)
            .mut_subcommands(with_exit_codes)
    }
    with_exit_codes(<Cli as clap::CommandFactory>::command())
}

/// Parse the process's arguments with [`command`].
pub fn try_parse() -> Result<Cli, clap::Error> {
    let matches = command().try_get_matches()?;
    <Cli as clap::FromArgMatches>::from_arg_matches(&matches)
}

/// Run a parsed command line; the process exit code.
pub fn run(cli: Cli) -> anyhow::Result<i32> {
    match cli.command {
        Command::Envelope(a) => envelope::run(a),
        Command::Capture(a) => capture::run(*a),
        Command::Sockets(a) => sockets::run(a),
        Command::Trace(a) => trace::run(a),
        Command::Status(a) => status::run(a),
        Command::Watch(a) => watch::run(a),
    }
}
