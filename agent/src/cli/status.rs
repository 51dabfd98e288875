//! `pstackctl status`: what the running `pstackd` holds — captures in flight,
//! helpers live and leaked, the leak budget, spool depth and bytes, shipping
//! lag and last error, eBPF state. Exit 0 when the daemon answered, 2 when it
//! is not running or refused us (the reason is printed).

use std::path::PathBuf;
use std::time::Duration;

use serde_json::Value;

use crate::client::{self, ClientError};

/// Arguments of `pstackctl status`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The daemon's socket.
    #[arg(long, env = "PSTACKD_SOCKET", default_value = client::DEFAULT_SOCKET)]
    pub socket: PathBuf,
    /// Print the daemon's JSON status document.
    #[arg(long)]
    pub json: bool,
    /// Give up after this many milliseconds.
    #[arg(long, default_value_t = 5_000)]
    pub timeout_ms: u64,
}

/// Run `pstackctl status`.
pub fn run(args: Args) -> anyhow::Result<i32> {
    let status = match client::status(&args.socket, Duration::from_millis(args.timeout_ms)) {
        Ok(s) => s,
        Err(e @ ClientError::NoDaemon { .. }) => {
            eprintln!(
                "pstackctl: {e}\n(start it with `systemctl start pstackd`, or capture one-shot as root with `pstackctl capture`)"
            );
            return Ok(2);
        }
        Err(e) => {
            eprintln!("pstackctl: {e}");
            return Ok(2);
        }
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&status)?);
        return Ok(0);
    }
    print!("{}", render(&status));
    Ok(0)
}

fn n(v: &Value) -> String {
    match v {
        Value::Null => "-".into(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Human-readable status.
pub fn render(s: &Value) -> String {
    let mut out = String::new();
    let line = |out: &mut String, k: &str, v: String| out.push_str(&format!("{k:<22} {v}\n"));
    line(
        &mut out,
        "pstackd",
        format!(
            "{} (up {} s){}",
            n(&s["version"]),
            n(&s["uptime_seconds"]),
            if s["draining"] == Value::Bool(true) {
                ", DRAINING"
            } else {
                ""
            }
        ),
    );
    let c = &s["captures"];
    line(
        &mut out,
        "captures",
        format!(
            "{} in flight (limit {}), {} ok, {} failed, {} refused busy",
            n(&c["in_flight"]),
            n(&c["max_concurrent"]),
            n(&c["ok_total"]),
            n(&c["failed_total"]),
            n(&c["busy_total"])
        ),
    );
    let h = &s["helpers"];
    let leaked = h["leaked"].as_u64().unwrap_or(0);
    line(
        &mut out,
        "helpers",
        format!(
            "{} live, {} leaked{}, budget {} of {} left",
            n(&h["live"]),
            leaked,
            if leaked > 0 { " !!" } else { "" },
            n(&h["leak_budget_available"]),
            n(&h["leak_budget"])
        ),
    );
    let sp = &s["spool"];
    line(
        &mut out,
        "spool",
        format!(
            "{} files / {} bytes (limits {} / {}, overflow {})",
            n(&sp["files"]),
            n(&sp["bytes"]),
            n(&sp["max_files"]),
            n(&sp["max_bytes"]),
            n(&sp["overflow"])
        ),
    );
    let dropped = sp["dropped_total"].as_u64().unwrap_or(0);
    let quarantined = sp["quarantined_total"].as_u64().unwrap_or(0);
    line(
        &mut out,
        "spool losses",
        format!(
            "{dropped} dropped{}, {quarantined} quarantined{}, {} refused",
            if dropped > 0 { " !!" } else { "" },
            if quarantined > 0 { " !!" } else { "" },
            n(&sp["refused_total"])
        ),
    );
    let sh = &s["shipping"];
    if sh["enabled"] == Value::Bool(true) {
        line(
            &mut out,
            "shipping",
            format!(
                "to {}, lag {} s, {} accepted, {} duplicate, {} rejected",
                n(&sh["collector"]),
                n(&sh["lag_seconds"]),
                n(&sh["accepted_total"]),
                n(&sh["duplicate_total"]),
                n(&sh["rejected_total"])
            ),
        );
        if !sh["last_error"].is_null() {
            line(
                &mut out,
                "last shipping error",
                format!(
                    "{} (next retry in {} ms) !!",
                    n(&sh["last_error"]),
                    n(&sh["next_retry_ms"])
                ),
            );
        }
    } else {
        line(
            &mut out,
            "shipping",
            "off (no shipper.url configured); envelopes stay spooled".into(),
        );
    }
    line(&mut out, "ebpf", n(&s["ebpf"]["state"]));
    out
}
