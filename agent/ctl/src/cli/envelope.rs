//! `pstackctl envelope verify|diff|handoff`: check, compare and summarize sealed
//! envelopes offline. Exit codes: 0 valid, 1 invalid (each broken rule printed
//! with where it broke), 2 usage or I/O error.

use std::io::Read;
use std::path::{Path, PathBuf};

use pstack_envelope::{Envelope, Rejection, diff, handoff, verify};
use serde_json::json;

/// Largest envelope file read (larger input is refused, not buffered).
const MAX_ENVELOPE_BYTES: u64 = 64 << 20;

/// Arguments of `pstackctl envelope`.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, clap::Subcommand)]
enum Command {
    /// Verify an envelope: strict JSON, closed-world schema, every rule, and its digest.
    ///
    /// Exit 0 when valid, 1 when invalid (every broken rule is printed with where
    /// it broke), 2 when the file cannot be read.
    Verify {
        /// Envelope file, or `-` for standard input.
        file: PathBuf,
        /// Print a JSON report instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Diff two envelopes of the same subject (refuses different subjects).
    ///
    /// Both are verified first. Output is deterministic: the same inputs give
    /// byte-identical output.
    Diff {
        /// The earlier envelope.
        before: PathBuf,
        /// The later envelope.
        after: PathBuf,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Print the compact handoff of an envelope: subject, completeness, first
    /// missing edge with its probe, open unknowns, next transition, digest.
    Handoff {
        /// Envelope file, or `-` for standard input.
        file: PathBuf,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
}

/// Read a file (or stdin for `-`), bounded.
pub fn read_input(path: &Path) -> anyhow::Result<Vec<u8>> {
    let mut bytes = Vec::new();
    let limited = |r: &mut dyn Read, bytes: &mut Vec<u8>| -> std::io::Result<()> {
        r.take(MAX_ENVELOPE_BYTES + 1).read_to_end(bytes)?;
        Ok(())
    };
    if path == Path::new("-") {
        limited(&mut std::io::stdin().lock(), &mut bytes)?;
    } else {
        let mut f = std::fs::File::open(path)
            .map_err(|e| anyhow::anyhow!("cannot open {}: {e}", path.display()))?;
        limited(&mut f, &mut bytes)
            .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display()))?;
    }
    if bytes.len() as u64 > MAX_ENVELOPE_BYTES {
        anyhow::bail!(
            "{} is larger than {} MiB; refusing to read it",
            path.display(),
            MAX_ENVELOPE_BYTES >> 20
        );
    }
    Ok(bytes)
}

fn print_rejection(path: &Path, rejection: &Rejection, as_json: bool) -> std::io::Result<()> {
    if as_json {
        let report = json!({"file": path.display().to_string(), "valid": false, "errors": rejection.errors
            .iter()
            .map(|e| json!({"rule": e.rule(), "message": e.to_string(), "detail": e}))
            .collect::<Vec<_>>()});
        pstack_cli::outln!("{report}")?;
    } else {
        pstack_cli::outln!(
            "{}: INVALID ({} problem{})",
            path.display(),
            rejection.errors.len(),
            if rejection.errors.len() == 1 { "" } else { "s" }
        )?;
        for e in &rejection.errors {
            pstack_cli::outln!("  [{}] {e}", e.rule())?;
        }
    }
    Ok(())
}

/// Verify a file; `Ok(Err(code))` carries the exit code after printing why
/// (`Err` only when stdout itself failed, e.g. a closed pipe).
fn load(path: &Path, as_json: bool) -> std::io::Result<Result<Envelope, i32>> {
    let bytes = match read_input(path) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("pstackctl: {e:#}");
            return Ok(Err(2));
        }
    };
    match verify(&bytes) {
        Ok(env) => Ok(Ok(env)),
        Err(rejection) => {
            print_rejection(path, &rejection, as_json)?;
            Ok(Err(1))
        }
    }
}

/// Run `pstackctl envelope`.
pub fn run(args: Args) -> anyhow::Result<i32> {
    match args.command {
        Command::Verify { file, json } => {
            let env = match load(&file, json)? {
                Ok(env) => env,
                Err(code) => return Ok(code),
            };
            if json {
                pstack_cli::outln!(
                    "{}",
                    json!({"file": file.display().to_string(), "valid": true, "digest": env.digest,
                        "subject": env.subject.describe(), "completeness": env.completeness})
                )?;
            } else {
                pstack_cli::outln!("{}: valid", file.display())?;
                pstack_cli::outln!("  subject:      {}", env.subject.describe())?;
                pstack_cli::outln!("  completeness: {}", env.completeness.as_str())?;
                pstack_cli::outln!(
                    "  surfaces:     {}  claims: {}  unknowns: {}",
                    env.surfaces.len(),
                    env.claims.len(),
                    env.unknowns.len()
                )?;
                pstack_cli::outln!("  digest:       {}", env.digest)?;
            }
            Ok(0)
        }
        Command::Diff {
            before,
            after,
            json,
        } => {
            let (b, a) = match (load(&before, json)?, load(&after, json)?) {
                (Ok(b), Ok(a)) => (b, a),
                (Err(c), _) | (_, Err(c)) => return Ok(c),
            };
            match diff(&b, &a) {
                Ok(d) if json => pstack_cli::outln!("{}", serde_json::to_string(&d)?)?,
                Ok(d) => pstack_cli::out!("{}", d.render())?,
                Err(e) => {
                    if json {
                        pstack_cli::outln!(
                            "{}",
                            json!({"error": {"rule": e.rule(), "message": e.to_string()}})
                        )?;
                    } else {
                        pstack_cli::outln!("cannot diff: [{}] {e}", e.rule())?;
                    }
                    return Ok(1);
                }
            }
            Ok(0)
        }
        Command::Handoff { file, json } => {
            let env = match load(&file, json)? {
                Ok(env) => env,
                Err(code) => return Ok(code),
            };
            let h = handoff(&env);
            if json {
                pstack_cli::outln!("{}", serde_json::to_string(&h)?)?;
            } else {
                pstack_cli::out!("{}", h.render())?;
            }
            Ok(0)
        }
    }
}
