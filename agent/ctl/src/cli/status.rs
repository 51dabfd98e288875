//! `pstackctl status`: what the running `pstackd` holds — captures in flight,
//! helpers live and leaked, the leak budget, spool depth and bytes, shipping
//! lag and last error, eBPF state. Exit 0 when the daemon answered, 2 when it
//! is not running or refused us (the reason is printed).

use std::path::PathBuf;
use std::time::Duration;

use pstackd_api::DaemonStatus;
use pstackd_api::status::{EbpfStatus, RuleState, RuleStatus};

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
        pstack_cli::outln!(
            "{}",
            serde_json::to_string_pretty(
                // A Value: members in name order, as the daemon sent them.
                &serde_json::to_value(&status)?
            )?
        )?;
        return Ok(0);
    }
    pstack_cli::out!("{}", render(&status))?;
    Ok(0)
}

/// An absent value (`null` in the document) reads as `-`.
fn or_dash(v: Option<&str>) -> &str {
    v.unwrap_or("-")
}

/// Human-readable status.
pub fn render(s: &DaemonStatus) -> String {
    let mut out = String::new();
    let line = |out: &mut String, k: &str, v: String| out.push_str(&format!("{k:<22} {v}\n"));
    line(
        &mut out,
        "pstackd",
        format!(
            "{} (up {} s){}",
            s.version,
            s.uptime_seconds,
            if s.draining { ", DRAINING" } else { "" }
        ),
    );
    let c = &s.captures;
    line(
        &mut out,
        "captures",
        format!(
            "{} in flight (limit {}), {} ok, {} failed, {} refused busy",
            c.in_flight, c.max_concurrent, c.ok_total, c.failed_total, c.busy_total
        ),
    );
    let h = &s.helpers;
    line(
        &mut out,
        "helpers",
        format!(
            "{} live, {} leaked{}, budget {} of {} left",
            h.live,
            h.leaked,
            if h.leaked > 0 { " !!" } else { "" },
            h.leak_budget_available,
            h.leak_budget
        ),
    );
    let sp = &s.spool;
    line(
        &mut out,
        "spool",
        format!(
            "{} files / {} bytes (limits {} / {}, overflow {})",
            sp.files, sp.bytes, sp.max_files, sp.max_bytes, sp.overflow
        ),
    );
    let (dropped, quarantined) = (sp.dropped_total, sp.quarantined_total);
    line(
        &mut out,
        "spool losses",
        format!(
            "{dropped} dropped{}, {quarantined} quarantined{}, {} refused",
            if dropped > 0 { " !!" } else { "" },
            if quarantined > 0 { " !!" } else { "" },
            sp.refused_total
        ),
    );
    let sh = &s.shipping;
    if sh.enabled {
        line(
            &mut out,
            "shipping",
            format!(
                "to {}, lag {} s, {} accepted, {} duplicate, {} rejected",
                sh.collector,
                sh.lag_seconds,
                sh.accepted_total,
                sh.duplicate_total,
                sh.rejected_total
            ),
        );
        if let Some(last_error) = &sh.last_error {
            line(
                &mut out,
                "last shipping error",
                format!("{last_error} (next retry in {} ms) !!", sh.next_retry_ms),
            );
        }
    } else {
        line(
            &mut out,
            "shipping",
            "off (no shipper.url configured); envelopes stay spooled".into(),
        );
    }
    line(&mut out, "ebpf", ebpf_line(&s.ebpf));
    if s.watch.rules.is_empty() {
        line(
            &mut out,
            "watch",
            "no rules (pstackd captures only when asked)".into(),
        );
    }
    for r in &s.watch.rules {
        line(&mut out, &format!("watch {}", r.name), rule_line(r));
    }
    out
}

/// One line on a watch rule: kind, armed or why not, and what it did.
pub fn rule_line(r: &RuleStatus) -> String {
    let mut text = format!("{} ", r.kind);
    let reason = or_dash(r.reason.as_deref());
    match r.state {
        RuleState::Armed => text.push_str("armed"),
        RuleState::Degraded => text.push_str(&format!("DEGRADED ({reason}) !!")),
        RuleState::Unavailable => text.push_str(&format!("UNAVAILABLE ({reason}) !!")),
    }
    text.push_str(&format!(
        ", fired {}, captured {}, failed {}, suppressed {}",
        r.fired_total, r.captured_total, r.failed_total, r.suppressed_total
    ));
    if !r.suppressed.is_empty() {
        let parts: Vec<String> = r
            .suppressed
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        text.push_str(&format!(" ({})", parts.join(", ")));
    }
    text.push_str(&format!(
        ", last fired {}",
        or_dash(r.last_fired.as_deref())
    ));
    text
}

/// One line on the eBPF programs: state, what is attached, events and losses.
fn ebpf_line(e: &EbpfStatus) -> String {
    let mut text = e.state.clone();
    if let Some(message) = &e.message {
        text.push_str(&format!(" ({message})"));
    }
    let attached = e.programs.iter().filter(|p| p.attached).count();
    text.push_str(&format!(
        ", {attached}/{} programs attached",
        e.programs.len()
    ));
    let events: u64 = e.tcp_events.values().sum();
    let lost: u64 = e.tcp_lost.values().sum();
    text.push_str(&format!(
        ", tcp {events} events, {lost} lost{}",
        if lost > 0 { " !!" } else { "" }
    ));
    if let Some(o) = &e.offcpu {
        text.push_str(&format!(
            ", off-cpu {} switches, {} D episodes, {} watched",
            o.switches, o.episodes, o.watched
        ));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn rule(v: serde_json::Value) -> RuleStatus {
        let mut doc = json!({"name": "r", "kind": "d_state", "state": "armed", "reason": null,
            "condition": {}, "window_ms": 0, "max_per_subject_per_hour": 2, "max_per_hour": 12,
            "fired_total": 0, "captured_total": 0, "failed_total": 0, "suppressed_total": 0,
            "suppressed": {}, "last_fired": null, "last_envelope": null, "last_error": null});
        for (k, x) in v.as_object().unwrap() {
            doc[k] = x.clone();
        }
        serde_json::from_value(doc).unwrap()
    }

    #[test]
    fn rule_line_shows_state_reason_and_counts() {
        let armed = rule(
            json!({"kind": "d_state", "state": "armed", "fired_total": 3,
            "captured_total": 1, "failed_total": 0, "suppressed_total": 2,
            "suppressed": {"rate_limit_subject": 2}, "last_fired": "2026-12-04T10:00:00.000Z"}),
        );
        assert_eq!(
            rule_line(&armed),
            "d_state armed, fired 3, captured 1, failed 0, suppressed 2 (rate_limit_subject 2), last fired 2026-12-04T10:00:00.000Z"
        );
        let off = rule(
            json!({"kind": "tcp_reset", "state": "unavailable", "reason": "no BTF",
            "fired_total": 0, "captured_total": 0, "failed_total": 0, "suppressed_total": 0,
            "suppressed": {}, "last_fired": null}),
        );
        assert_eq!(
            rule_line(&off),
            "tcp_reset UNAVAILABLE (no BTF) !!, fired 0, captured 0, failed 0, suppressed 0, last fired -"
        );
    }

    fn ebpf(v: serde_json::Value) -> EbpfStatus {
        let mut doc = json!({"state": "running", "programs": [], "tcp_events": {},
            "tcp_lost": {}, "offcpu": null, "ring_bytes": 0, "as_of_unix": 0,
            "windows_on_session_total": 0, "windows_one_shot_total": 0});
        for (k, x) in v.as_object().unwrap() {
            doc[k] = x.clone();
        }
        serde_json::from_value(doc).unwrap()
    }

    #[test]
    fn ebpf_line_shows_attachment_events_losses_and_off_cpu() {
        let program =
            |attached| json!({"program": "p", "tracepoint": "tcp/t", "attached": attached});
        let e = ebpf(json!({
            "state": "running",
            "programs": [program(true), program(false)],
            "tcp_events": {"retransmit": 3, "reset": 2},
            "tcp_lost": {"retransmit": 1},
            "offcpu": {"switches": 40, "episodes": 1, "watched": 2, "lost_ring": 0,
                "lost_start": 0, "lost_totals": 0}
        }));
        assert_eq!(
            ebpf_line(&e),
            "running, 1/2 programs attached, tcp 5 events, 1 lost !!, off-cpu 40 switches, 1 D episodes, 2 watched"
        );
        let failed = ebpf(json!({"state": "permission_denied", "message": "needs CAP_BPF"}));
        assert_eq!(
            ebpf_line(&failed),
            "permission_denied (needs CAP_BPF), 0/0 programs attached, tcp 0 events, 0 lost"
        );
    }
}
