//! Seed 003's secrets list never reaches a stored record, a report, a log
//! line or a response about a run — whichever path the attempt took.

use serde_json::{Value, json};

use super::{post, start};
use crate::on_both_backends;
use crate::support::{Db, Harness, captured_logs};

/// What agents attempt (each also checked as a whole string).
pub(crate) const ATTEMPTS: [&str; 7] = [
    "cli:psql --password=hunter2",
    "cli:curl https://api.example.com?token=sk-live-4242424242",
    "cli:kubectl --token=eyJhbGciOiJIUzI1NiJ9.secret",
    "cli:aws --secret-access-key wJalrXUtnFEMI/K7MDENG",
    "http:GET /admin Authorization: Bearer tok_0123456789abcdef",
    "Bearer sk-live-1",
    "mcp:vault/read --password=hunter2",
];

/// Command lines.
pub(crate) const COMMANDS: [&str; 3] = [
    "df -h $(cat /etc/shadow) --password=hunter2",
    "psql --password=hunter2 -c select",
    "curl -H Authorization:BearerZZtok_0123456789abcdef https://x",
];

/// Fragments that must appear nowhere.
pub(crate) const NEEDLES: [&str; 8] = [
    "hunter2",
    "sk-live",
    "eyJ",
    "wJalr",
    "--password=",
    "tok_0123456789abcdef",
    "/etc/shadow",
    "api.example.com",
];

pub(crate) fn assert_clean(what: &str, text: &str) {
    for n in NEEDLES {
        assert!(!text.contains(n), "{what} contains {n:?}: {text}");
    }
    for a in ATTEMPTS.iter().chain(COMMANDS.iter()) {
        assert!(!text.contains(a), "{what} contains the attempt {a:?}");
    }
}

on_both_backends!(secrets_never_reach_records_reports_logs_or_responses);

async fn secrets_never_reach_records_reports_logs_or_responses(db: Db) {
    let Some(h) = Harness::start(db).await else {
        return;
    };
    let _ = captured_logs();
    let log_start = captured_logs().lock().unwrap().len();
    let permissive = json!({"escalation": {"responses": {
        "undeclared-tool": "block-and-continue", "out-of-scope-tool": "block-and-continue",
        "out-of-order-step": "block-and-continue"}, "maxTotal": 99}});
    let run = start(&h, permissive).await;
    let path = format!("/internal/runs/{run}/steps");
    let mut responses: Vec<Value> = Vec::new();
    for tool in ATTEMPTS {
        responses.push(
            post(&h, &path, &json!({"kind": "propose", "tool": tool}))
                .await
                .1,
        );
    }
    for command in COMMANDS {
        responses.push(
            post(
                &h,
                &path,
                &json!({"kind": "proposeCommand", "command": command}),
            )
            .await
            .1,
        );
    }
    // Secrets in places that are not tools: a step id, stdout, a digest,
    // a malformed field.
    for body in [
        json!({"kind": "advance", "step": "--password=hunter2"}),
        json!({"kind": "observe", "stdout": "Bearer sk-live-1 hunter2"}),
        json!({"kind": "observe", "envelope": "eyJhbGciOiJIUzI1NiJ9"}),
        json!({"kind": "observe", "exitCode": "wJalrXUtnFEMI"}),
        json!({"kind": "propose", "tool": "cli:x", "hunter2": 1}),
    ] {
        responses.push(post(&h, &path, &body).await.1);
    }
    let ended = post(&h, &path, &json!({"kind": "conclude"})).await.1;
    responses.push(ended);
    for r in &responses {
        assert_clean("a response", &r.to_string());
    }
    let (_, got) = h.get(&format!("/internal/runs/{run}")).await;
    assert_eq!(
        got["run"]["deviations"].as_array().unwrap().len(),
        ATTEMPTS.len() + COMMANDS.len() + 2,
        "every attempt was recorded (by class): {got}"
    );
    assert_clean("GET run", &got.to_string());
    let row = h.store.run(&run).await.unwrap().unwrap();
    assert_clean("the stored run", &format!("{row:?}"));
    let (_, rep) = h
        .get(&format!(
            "/internal/runs/{run}/report?executorKind=autonomous&envClass=prod"
        ))
        .await;
    assert_eq!(rep["report_schema"], "runbook-run-report/v1", "{rep}");
    assert_clean("the report", &rep.to_string());
    let logs = String::from_utf8_lossy(&captured_logs().lock().unwrap()[log_start..]).to_string();
    assert!(
        logs.contains("/internal/runs"),
        "the log scan sees run requests"
    );
    assert_clean("the log", &logs);
    h.finish().await;
}
