//! Log injection (issue 28, item 6): caller-supplied strings reach the text
//! log escaped and capped. A username and a `runnerId` carrying a newline
//! followed by a whole forged log line, an ANSI escape, and a 1 MB name are
//! sent through `POST /ui/login`, an incident lease and a grant claim; the
//! captured log lines hold none of them raw.

use reqwest::StatusCode;
use serde_json::json;

use crate::gate::grants::{grant_op, granted};
use crate::gate::{deploy, finding, open_incident, post, proposal, rand_u64};
use crate::on_both_backends;
use crate::support::{Db, Harness, captured_logs, code};

/// Longest log line a planted value may be part of: one event, every
/// caller string in it cut at 256 characters (each at most `\u{10ffff}`).
const MAX_LINE_BYTES: usize = 8 * 1024;

/// Log in as `username`: the status.
async fn login(h: &Harness, username: &str, password: &str) -> reqwest::Response {
    h.client
        .post(h.url("/ui/login"))
        .json(&json!({"username": username, "password": password}))
        .send()
        .await
        .expect("POST /ui/login")
}

// Regression: usernames and runnerId went into text logs raw — a `\n`
// forged a whole audit line, ANSI escapes passed, a 900 KB name was logged whole.
async fn caller_strings_in_logs_are_escaped_and_capped(db: Db) {
    let logs = captured_logs();
    let Some(h) = Harness::start(db).await else {
        return;
    };
    let marker = format!("FORGED{:016x}", rand_u64());
    let newline = format!("mallory\n{marker} INFO operator logged in user=admin");
    let ansi = format!("\x1b[31m{marker}\x1b[0m");
    let huge = format!("{marker}{}", "n".repeat(1_000_000));

    // Unknown names: refused, and logged as refused.
    for name in [&newline, &ansi, &huge] {
        let resp = login(&h, name, "wrong password").await;
        assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
    }
    // A real operator whose name carries a forged approval line: logs in,
    // approves, rejects (the `by=user:<name>` of the audit lines).
    let operator =
        format!("eve\n{marker} INFO remediation approved proposal=rem_0 by=user:alice\x1b[2K");
    let hash = pstack_store_core::operators::hash_password("operator password 2").unwrap();
    h.store
        .create_operator(&operator, &hash, pstack_store_core::now_ns())
        .await
        .unwrap();
    let resp = login(&h, &operator, "operator password 2").await;
    assert_eq!(resp.status(), StatusCode::OK);
    let cookie = resp
        .headers()
        .get("set-cookie")
        .and_then(|v| v.to_str().ok())
        .and_then(|c| c.split(';').next())
        .expect("session cookie")
        .to_string();
    let csrf = resp.json::<serde_json::Value>().await.unwrap()["csrfToken"]
        .as_str()
        .unwrap()
        .to_string();
    deploy(&h, "2.4.1", "8f3a1b2").await;
    let inc = open_incident(&h, "logs").await;
    for (i, path_end) in ["approve", "reject"].iter().enumerate() {
        let f = finding(&h, &inc, "corroborated_candidate", &format!("fp_log{i}")).await;
        let (st, p) = post(
            &h,
            "/internal/remediations/propose",
            &proposal(&inc, &f, "rollback_deploy", &format!("log{i}")),
        )
        .await;
        assert_eq!(st, StatusCode::CREATED, "{p}");
        let id = p["proposal"]["id"].as_str().unwrap();
        let resp = h
            .client
            .post(h.url(&format!("/internal/remediations/{id}/{path_end}")))
            .header("cookie", &cookie)
            .header("x-csrf-token", &csrf)
            .json(&json!({}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::OK, "{path_end}");
    }

    // runnerId: an incident lease and a grant claim.
    let leased = open_incident(&h, "logs-lease").await;
    let lease = format!("/internal/incidents/{leased}/lease");
    let (st, b) = post(&h, &lease, &json!({"runnerId": newline, "ttlSeconds": 60})).await;
    assert_eq!(st, StatusCode::OK, "{b}");
    let (id, token) = granted(&h, &inc, "fp_log_grant", "log_grant").await;
    let grant = format!("/internal/remediations/{id}/grant");
    let (st, b) = post(&h, &grant, &grant_op("claim", &token, &ansi)).await;
    assert_eq!(st, StatusCode::OK, "{b}");
    // A 1 MB runnerId is refused before anything logs it.
    let (st, b) = post(&h, &grant, &grant_op("complete", &token, &huge)).await;
    assert_eq!(
        (st, code(&b)),
        (StatusCode::UNPROCESSABLE_ENTITY, "invalid_field"),
        "{b}"
    );
    assert_eq!(b["error"]["field"], "runnerId");

    let captured = logs.lock().unwrap().clone();
    let text = String::from_utf8_lossy(&captured);
    let ours: Vec<&str> = text.lines().filter(|l| l.contains(&marker)).collect();
    for line in &ours {
        // No forged line: the marker only ever follows an escaped newline or
        // ESC, inside the quoted value.
        assert!(!line.starts_with(&marker), "a forged log line: {line:.300}");
        assert!(
            line.contains(&format!("\\n{marker}"))
                || line.contains(&format!("\\u{{1b}}[31m{marker}"))
                || line.contains(&format!("\"{marker}nnn")),
            "the planted value is not escaped: {line:.300}"
        );
        assert!(
            line.len() <= MAX_LINE_BYTES,
            "a {} byte log line: {:.300}",
            line.len(),
            line
        );
    }
    // Every planted value was logged (escaped), so the checks above bit.
    for (what, needle) in [
        ("refused login", "operator login refused"),
        ("login", "operator logged in"),
        ("approval", "remediation approved"),
        ("rejection", "remediation rejected"),
        ("lease", "incident lease"),
        ("claim", "grant claimed"),
    ] {
        assert!(
            ours.iter().any(|l| l.contains(needle)),
            "no {what} line carries the planted name:\n{}",
            ours.join("\n")
        );
    }
    assert!(!captured.contains(&0x1b), "an ESC byte reached the log");
    assert!(
        ours.iter().any(|l| l.contains("…(1000022 bytes)")),
        "the 1 MB name is not shown cut with its length"
    );
    h.finish().await;
}

on_both_backends!(caller_strings_in_logs_are_escaped_and_capped);
