//! `pstackd`: the pstack node daemon. See the `pstackd` crate.

use std::path::PathBuf;

use clap::{CommandFactory, Parser};
use pstackd::config::{Config, DEFAULT_CONFIG_PATH};
use pstackd::run::{RunOptions, prepare, run};

/// Exit codes of `pstackd` (kept equal to the README's table by a test).
const EXIT_CODES_HELP: &str = "\
Exit codes:
  0  stopped cleanly after SIGTERM or SIGINT (in-flight captures drained), or --check-config found the configuration valid (or the default file absent: built-in defaults apply, and it says so)
  1  cannot start: the configuration, the socket, the privilege drop, the spool or the runtime failed (the reason is logged)
  2  usage error, or --check-config found the configuration invalid or the file given with --config missing";

/// Serve captures on a Unix socket and ship sealed envelopes to the store.
#[derive(Debug, Parser)]
#[command(
    name = "pstackd",
    version = pstack_capture::process::VERSION,
    after_help = EXIT_CODES_HELP
)]
struct Args {
    /// Configuration file (TOML). Default /etc/pstack/pstackd.toml (optional
    /// at the default path: built-in defaults apply; required when given).
    /// Every key and default: docs/configuration.md; an annotated file:
    /// examples/pstackd.toml.
    #[arg(long, short = 'c')]
    config: Option<PathBuf>,
    /// Validate the configuration and exit (0 valid, 2 invalid).
    #[arg(long)]
    check_config: bool,
    /// Log format: `text` (journald-friendly when under systemd) or `json`.
    #[arg(long, default_value = "text", value_parser = ["text", "json"])]
    log_format: String,
}

fn init_logging(format: &str) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_env("PSTACKD_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    // Under systemd the journal timestamps each line; plain text, no colour.
    let journald = std::env::var_os("JOURNAL_STREAM").is_some();
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .with_target(false);
    if format == "json" {
        builder.json().init();
    } else if journald {
        builder.without_time().init();
    } else {
        builder.init();
    }
}

fn main() {
    // One malloc arena: the eBPF load parses the kernel's BTF (tens of MiB of
    // short-lived allocations) on a pool thread, and glibc cannot give a
    // per-thread arena's fragmented pages back; in the main arena
    // `malloc_trim` can. Idle RSS 20 MiB -> 10 MiB; captures are I/O-bound,
    // so one arena's lock costs nothing measurable. Before any thread starts.
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only sets an allocator tunable; no thread exists yet.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
    pstack_packaging::assets::write_if_requested(Args::command);
    let args = Args::parse();
    let explicit = args.config.is_some();
    let config_path = args
        .config
        .unwrap_or_else(|| PathBuf::from(DEFAULT_CONFIG_PATH));
    if args.check_config {
        match Config::load(&config_path, explicit) {
            Ok(_) if !explicit && !config_path.exists() => {
                let _ = pstack_cli::outln!(
                    "{}: not found; pstackd runs on its built-in defaults (see docs/configuration.md)",
                    config_path.display()
                );
                std::process::exit(0);
            }
            Ok(_) => {
                let _ = pstack_cli::outln!("{}: valid", config_path.display());
                std::process::exit(0);
            }
            Err(e) => {
                eprintln!("pstackd: {e}");
                std::process::exit(2);
            }
        }
    }
    init_logging(&args.log_format);
    let opts = RunOptions {
        config_path,
        explicit,
    };
    // Socket, config and the privilege drop while we are still single-threaded.
    let prepared = match prepare(&opts) {
        Ok(p) => p,
        Err(e) => {
            tracing::error!(error = %e, "cannot start");
            std::process::exit(1);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(64)
        .thread_keep_alive(std::time::Duration::from_secs(5))
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            tracing::error!(error = %e, "cannot build the runtime");
            std::process::exit(1);
        }
    };
    match runtime.block_on(run(opts, prepared)) {
        Ok(()) => {
            runtime.shutdown_timeout(std::time::Duration::from_millis(200));
            std::process::exit(0)
        }
        Err(e) => {
            tracing::error!(error = %e, "cannot start");
            std::process::exit(1);
        }
    }
}
