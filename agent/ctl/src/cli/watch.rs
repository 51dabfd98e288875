//! `pstackctl watch`: the running pstackd's watch rules (armed or why not,
//! fired, captured, suppressed) and, with `--follow`, each firing as it
//! happens. Exit 0 when the daemon answered, 2 when it is not running.

use std::path::PathBuf;
use std::time::Duration;

use pstackd_api::status::WatchStatus;
use pstackd_api::{WatchEvent, WatchEventKind};

use crate::client::{self, ClientError};

/// Arguments of `pstackctl watch`.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
Rules live in pstackd.toml as [[watch]] tables (docs/configuration.md);
`systemctl reload pstackd` (SIGHUP) applies a changed set, or keeps the
running one when the file is invalid.

Examples:
  pstackctl watch                      list the rules and what they did
  pstackctl watch --follow             then print each firing as it happens
  pstackctl watch --follow --json      one JSON event per line (for scripts)")]
pub struct Args {
    /// The daemon's socket.
    #[arg(long, env = "PSTACKD_SOCKET", default_value = client::DEFAULT_SOCKET)]
    pub socket: PathBuf,
    /// Print JSON (the rules document; with --follow one event per line).
    #[arg(long)]
    pub json: bool,
    /// After the list, print recent and new firings until interrupted (or
    /// for --for).
    #[arg(long, short = 'f')]
    pub follow: bool,
    /// With --follow: stop after this long (`30s`, `10m`).
    #[arg(long = "for", value_name = "DURATION", value_parser = super::capture::duration_arg, requires = "follow")]
    pub follow_for: Option<Duration>,
    /// Give up on the daemon after this long (`5s`, `500ms`).
    #[arg(long, value_name = "DURATION", value_parser = super::capture::duration_arg, default_value = "5s")]
    pub timeout: Duration,
}

fn no_daemon(e: ClientError) -> i32 {
    match e {
        e @ ClientError::NoDaemon { .. } => eprintln!(
            "pstackctl: {e}\n(start it with `systemctl start pstackd`; rules are [[watch]] tables in pstackd.toml)"
        ),
        e => eprintln!("pstackctl: {e}"),
    }
    2
}

/// Run `pstackctl watch`.
pub fn run(args: Args) -> anyhow::Result<i32> {
    let rules = match client::watch(&args.socket, args.timeout) {
        Ok(r) => r,
        Err(e) => return Ok(no_daemon(e)),
    };
    if args.json && !args.follow {
        pstack_cli::outln!(
            "{}",
            serde_json::to_string_pretty(
                // A Value: members in name order, as the daemon sent them.
                &serde_json::to_value(&rules)?
            )?
        )?;
        return Ok(0);
    }
    if !args.json {
        pstack_cli::out!("{}", render(&rules))?;
    }
    if !args.follow {
        return Ok(0);
    }
    // A century stands for "until interrupted".
    let follow = args
        .follow_for
        .unwrap_or(Duration::from_secs(100 * 365 * 86_400));
    let mut failed = None;
    let result = client::follow_watch_events(&args.socket, follow, &mut |line, event| {
        // --json prints the line as pstackd sent it (members this build
        // does not know included).
        let text = if args.json {
            line.to_string()
        } else {
            event_line(event)
        };
        if let Err(e) = pstack_cli::outln!("{text}") {
            failed = Some(e);
            return false;
        }
        true
    });
    if let Some(e) = failed {
        return Err(e.into());
    }
    match result {
        Ok(()) => Ok(0),
        Err(e) => Ok(no_daemon(e)),
    }
}

/// The rule list.
pub fn render(doc: &WatchStatus) -> String {
    let rules = &doc.rules;
    if rules.is_empty() {
        return "no watch rules (add [[watch]] tables to pstackd.toml and reload)\n".into();
    }
    let mut out = String::new();
    for r in rules {
        out.push_str(&format!("{:<24} {}\n", r.name, super::status::rule_line(r)));
    }
    out
}

/// One watch event as a line.
pub fn event_line(e: &WatchEvent) -> String {
    use WatchEventKind as K;
    let (rule, subject) = match &e.what {
        K::Fired { rule, subject, .. }
        | K::Suppressed { rule, subject, .. }
        | K::Started { rule, subject, .. }
        | K::Captured { rule, subject, .. }
        | K::Failed { rule, subject, .. } => (rule.as_str(), subject.as_str()),
        K::Degraded { rule, .. }
        | K::EventsWatchDegraded { rule, .. }
        | K::EngineEvent { rule, .. }
        | K::RebuildStarted { rule, .. }
        | K::RebuildEnded { rule, .. } => (rule.as_str(), "-"),
        K::Lagged { .. } | K::Unknown => ("-", "-"),
    };
    let head = format!(
        "{} {:<10} {rule} ({subject})",
        e.at.as_deref().unwrap_or("-"),
        e.name(),
    );
    let pairs = |m: &std::collections::BTreeMap<String, String>| {
        m.iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    match &e.what {
        K::Fired { condition, .. } => format!("{head}: {}", pairs(condition)),
        K::Suppressed { reason, detail, .. } => match detail {
            Some(d) => format!("{head}: {reason} ({d})"),
            None => format!("{head}: {reason}"),
        },
        K::Captured {
            envelopes,
            fault_to_sealed_ms,
            ..
        } => format!(
            "{head}: sealed {} in {fault_to_sealed_ms} ms from the fault",
            envelopes.join(", ")
        ),
        K::Failed { error, .. } => format!("{head}: {error}"),
        K::Degraded { reason, .. } | K::EventsWatchDegraded { reason, .. } => {
            format!("{head}: {reason}")
        }
        K::EngineEvent {
            engine,
            reason,
            volume,
            ..
        } => format!("{head}: {volume} {engine} {reason}"),
        K::RebuildStarted {
            volume,
            replica,
            from,
            role,
            ..
        } => format!(
            "{head}: {volume}/{replica} from {}, this node {}",
            from.join("+"),
            role.as_deref()
                .map(|r| format!("is the {r}"))
                .unwrap_or_else(|| "takes no part".into())
        ),
        K::RebuildEnded {
            volume,
            replica,
            outcome,
            ..
        } => format!("{head}: {volume}/{replica} {}", pairs(outcome)),
        K::Lagged { missed } => {
            format!("(missed {missed} events: the reader was too slow)")
        }
        K::Started { .. } | K::Unknown => head,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn line(v: serde_json::Value) -> String {
        event_line(&serde_json::from_value(v).expect("a watch event"))
    }

    #[test]
    fn longhorn_rebuild_events_read_as_lines() {
        let started = json!({"at": "T", "event": "rebuild_started", "rule": "rebuilds", "kind": "longhorn_rebuild",
            "opened_by": "poll", "node": "n1",
            "volume": "pvc-7", "replica": "pvc-7-r-t", "from": ["pvc-7-r-s"], "role": "target"});
        assert!(
            line(started.clone())
                .ends_with("pvc-7/pvc-7-r-t from pvc-7-r-s, this node is the target")
        );
        let ended = json!({"at": "T", "event": "rebuild_ended", "rule": "rebuilds", "kind": "longhorn_rebuild", "volume": "pvc-7",
            "replica": "pvc-7-r-t", "outcome": {"outcome": "failed", "failure": "state_error"}});
        assert!(
            line(ended.clone()).ends_with("pvc-7/pvc-7-r-t failure=state_error outcome=failed"),
            "{}",
            line(ended.clone())
        );
        let degraded = json!({"at": "T", "event": "degraded", "rule": "rebuilds", "kind": "longhorn_rebuild", "reason": "down"});
        assert!(line(degraded.clone()).ends_with(": down"));
        let rule = serde_json::from_value(json!({"name": "rebuilds", "kind": "longhorn_rebuild",
            "state": "degraded", "reason": "the manager did not answer", "condition": {},
            "window_ms": 0, "max_per_subject_per_hour": 2, "max_per_hour": 12,
            "fired_total": 0, "captured_total": 0, "failed_total": 0, "suppressed_total": 0,
            "suppressed": {}, "last_fired": null, "last_envelope": null, "last_error": null}))
        .unwrap();
        assert!(
            crate::cli::status::rule_line(&rule)
                .contains("DEGRADED (the manager did not answer) !!")
        );
    }

    #[test]
    fn events_read_as_lines() {
        let fired = json!({"at": "T", "event": "fired", "rule": "stuck", "kind": "d_state", "subject": "process:42:7",
            "condition": {"d_state_ms": "3000", "tid": "42"}});
        assert_eq!(
            line(fired.clone()),
            "T fired      stuck (process:42:7): d_state_ms=3000 tid=42"
        );
        let sup = json!({"at": "T", "event": "suppressed", "rule": "stuck", "kind": "d_state", "subject": "host",
            "reason": "rate_limit_rule", "detail": null});
        assert_eq!(
            line(sup.clone()),
            "T suppressed stuck (host): rate_limit_rule"
        );
        let cap = json!({"at": "T", "event": "captured", "rule": "r", "kind": "d_state", "subject": "host",
            "envelopes": ["sha256:ab"], "fault_to_sealed_ms": 812});
        assert_eq!(
            line(cap.clone()),
            "T captured   r (host): sealed sha256:ab in 812 ms from the fault"
        );
    }
}
