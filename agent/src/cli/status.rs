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
    /// Give up after this long (`5s`, `500ms`).
    #[arg(long, value_name = "DURATION", value_parser = super::capture::duration_arg, default_value = "5s")]
    pub timeout: Duration,
    /// Same as --timeout, in milliseconds (a bare number) or a duration.
    #[arg(long, value_name = "MS", value_parser = super::capture::millis_arg, conflicts_with = "timeout")]
    pub timeout_ms: Option<Duration>,
}

/// Run `pstackctl status`.
pub fn run(args: Args) -> anyhow::Result<i32> {
    let status = match client::status(&args.socket, args.timeout_ms.unwrap_or(args.timeout)) {
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
        pstack_cli::outln!("{}", serde_json::to_string_pretty(&status)?)?;
        return Ok(0);
    }
    pstack_cli::out!("{}", render(&status))?;
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
    line(&mut out, "ebpf", ebpf_line(&s["ebpf"]));
    let rules = s["watch"]["rules"]
        .as_array()
        .map_or(&[][..], Vec::as_slice);
    if rules.is_empty() {
        line(
            &mut out,
            "watch",
            "no rules (pstackd captures only when asked)".into(),
        );
    }
    for r in rules {
        line(&mut out, &format!("watch {}", n(&r["name"])), rule_line(r));
    }
    out
}

/// One line on a watch rule: kind, armed or why not, and what it did.
pub fn rule_line(r: &Value) -> String {
    let mut text = format!("{} ", n(&r["kind"]));
    match r["state"].as_str() {
        Some("armed") => text.push_str("armed"),
        Some("degraded") => text.push_str(&format!("DEGRADED ({}) !!", n(&r["reason"]))),
        _ => text.push_str(&format!("UNAVAILABLE ({}) !!", n(&r["reason"]))),
    }
    let suppressed = r["suppressed_total"].as_u64().unwrap_or(0);
    text.push_str(&format!(
        ", fired {}, captured {}, failed {}, suppressed {suppressed}",
        n(&r["fired_total"]),
        n(&r["captured_total"]),
        n(&r["failed_total"]),
    ));
    if let Some(by) = r["suppressed"].as_object().filter(|m| !m.is_empty()) {
        let parts: Vec<String> = by.iter().map(|(k, v)| format!("{k} {v}")).collect();
        text.push_str(&format!(" ({})", parts.join(", ")));
    }
    text.push_str(&format!(", last fired {}", n(&r["last_fired"])));
    text
}

/// One line on the eBPF programs: state, what is attached, events and losses.
fn ebpf_line(e: &Value) -> String {
    let mut text = n(&e["state"]);
    if let Some(message) = e["message"].as_str() {
        text.push_str(&format!(" ({message})"));
    }
    if let Some(programs) = e["programs"].as_array() {
        let attached = programs
            .iter()
            .filter(|p| p["attached"] == Value::Bool(true))
            .count();
        text.push_str(&format!(
            ", {attached}/{} programs attached",
            programs.len()
        ));
    }
    let sum = |v: &Value| {
        v.as_object()
            .map_or(0, |m| m.values().filter_map(Value::as_u64).sum::<u64>())
    };
    let (events, lost) = (sum(&e["tcp_events"]), sum(&e["tcp_lost"]));
    if e["tcp_events"].is_object() {
        text.push_str(&format!(
            ", tcp {events} events, {lost} lost{}",
            if lost > 0 { " !!" } else { "" }
        ));
    }
    let o = &e["offcpu"];
    if o.is_object() {
        text.push_str(&format!(
            ", off-cpu {} switches, {} D episodes, {} watched",
            n(&o["switches"]),
            n(&o["episodes"]),
            n(&o["watched"])
        ));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn rule_line_shows_state_reason_and_counts() {
        let armed = json!({"kind": "d_state", "state": "armed", "fired_total": 3,
            "captured_total": 1, "failed_total": 0, "suppressed_total": 2,
            "suppressed": {"rate_limit_subject": 2}, "last_fired": "2026-12-04T10:00:00.000Z"});
        assert_eq!(
            rule_line(&armed),
            "d_state armed, fired 3, captured 1, failed 0, suppressed 2 (rate_limit_subject 2), last fired 2026-12-04T10:00:00.000Z"
        );
        let off = json!({"kind": "tcp_reset", "state": "unavailable", "reason": "no BTF",
            "fired_total": 0, "captured_total": 0, "failed_total": 0, "suppressed_total": 0,
            "suppressed": {}, "last_fired": null});
        assert_eq!(
            rule_line(&off),
            "tcp_reset UNAVAILABLE (no BTF) !!, fired 0, captured 0, failed 0, suppressed 0, last fired -"
        );
    }

    #[test]
    fn ebpf_line_shows_attachment_events_losses_and_off_cpu() {
        let e = json!({
            "state": "running",
            "programs": [{"attached": true}, {"attached": false}],
            "tcp_events": {"retransmit": 3, "reset": 2},
            "tcp_lost": {"retransmit": 1},
            "offcpu": {"switches": 40, "episodes": 1, "watched": 2}
        });
        assert_eq!(
            ebpf_line(&e),
            "running, 1/2 programs attached, tcp 5 events, 1 lost !!, off-cpu 40 switches, 1 D episodes, 2 watched"
        );
        let failed = json!({"state": "permission_denied", "message": "needs CAP_BPF"});
        assert_eq!(ebpf_line(&failed), "permission_denied (needs CAP_BPF)");
    }
}
