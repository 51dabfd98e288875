//! `pstackctl`: the operator's CLI for pstack.

use clap::{Parser, Subcommand};
use pstack_agent::cli;

/// Capture, verify, compare and hand off pstack evidence envelopes.
///
/// Exit codes: 0 ok/valid, 1 invalid evidence, 2 usage or I/O error.
#[derive(Debug, Parser)]
#[command(name = "pstackctl", version, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Check, diff and summarize sealed envelopes (offline; no daemon needed).
    Envelope(cli::envelope::Args),
    /// Capture a sealed envelope of a process, thread or host.
    Capture(Box<cli::capture::Args>),
    /// Show what the running pstackd holds: captures, helpers, spool, shipping.
    Status(cli::status::Args),
    /// Watch TCP retransmits, resets and state changes live (eBPF).
    Trace(cli::trace::Args),
}

fn main() {
    let parsed = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let code = if e.use_stderr() { 2 } else { 0 };
            let _ = e.print();
            std::process::exit(code);
        }
    };
    let result = match parsed.command {
        Command::Envelope(a) => cli::envelope::run(a),
        Command::Capture(a) => cli::capture::run(*a),
        Command::Trace(a) => cli::trace::run(a),
        Command::Status(a) => cli::status::run(a),
    };
    match result {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("pstackctl: {e:#}");
            std::process::exit(2);
        }
    }
}
