//! Supervised investigation runs end to end (seed 003 on seed 001's agent
//! loop): real HTTP into a real server on SQLite and PostgreSQL, envelopes
//! ingested through `/v1/envelopes`, time moved by the server's clock.

use std::time::Duration;

use pstack_store_core::synthetic::Capture;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::on_both_backends;
use crate::support::{Db, Harness, captured_logs, code};

mod acceptance;
mod bundles;
pub(crate) mod mutation;
mod newcomer;
pub(crate) mod secrets;

pub(crate) async fn post(h: &Harness, path: &str, body: &Value) -> (StatusCode, Value) {
    let resp = h
        .client
        .post(h.url(path))
        .bearer_auth(&h.key)
        .json(body)
        .send()
        .await
        .expect("POST");
    let status = resp.status();
    (status, resp.json().await.unwrap_or(Value::Null))
}

/// A sealed, complete envelope of `pid` on `host` captured `ago_s` seconds
/// before `now_ns`, ingested; its digest.
pub(crate) async fn capture(h: &Harness, host: &str, pid: u32, ago_s: i64) -> String {
    let now = h.clock.now_ns();
    let seq = now / 1_000_000_000 - ago_s - 1_796_000_000;
    let mut c = Capture::new(host, pid, u64::try_from(seq).expect("after the base"));
    c.blocked = false;
    let (d, b) = c.bytes().expect("sealed");
    let (st, _) = h.post_batch(&[b]).await;
    assert!(st.is_success());
    d
}

pub(crate) async fn start(h: &Harness, extra: Value) -> String {
    let mut body = json!({"agentIdentity": "agent-7"});
    if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
        b.extend(e.clone());
    }
    let (st, r) = post(h, "/internal/runs", &body).await;
    assert_eq!(st, StatusCode::CREATED, "{r}");
    assert_eq!(r["run"]["current"], "capture");
    r["run"]["id"].as_str().unwrap().to_string()
}

pub(crate) async fn step(h: &Harness, run: &str, body: Value) -> Value {
    let (st, r) = post(h, &format!("/internal/runs/{run}/steps"), &body).await;
    assert_eq!(st, StatusCode::OK, "{body} → {r}");
    r
}

fn classes(r: &Value) -> Vec<String> {
    r["run"]["deviations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["class"].as_str().unwrap().to_string())
        .collect()
}

/// Walk a run from CAPTURE to CHOOSE FALSIFIER, observing `envelope` in
/// CAPTURE if given.
pub(crate) async fn to_choose_falsifier(h: &Harness, run: &str, envelope: Option<&str>) {
    if let Some(d) = envelope {
        let r = step(h, run, json!({"kind": "observe", "envelope": d})).await;
        assert_eq!(r["verdict"], "permit", "{r}");
    }
    for to in ["bind-identity", "classify-unknown", "choose-falsifier"] {
        let r = step(h, run, json!({"kind": "advance", "step": to})).await;
        assert_eq!(r["verdict"], "permit", "{to}: {r}");
    }
}

on_both_backends!(
    mutate_needs_a_fresh_pre_mutation_capture_of_the_same_subject,
    the_taxonomy_over_http_with_escalation_and_max_total,
    a_failed_diff_leaves_a_typed_failure_receipt_and_a_valid_report,
    an_expired_handoff_does_not_advance_a_run,
    hostile_run_requests_get_typed_errors_naming_the_field,
);

async fn mutate_needs_a_fresh_pre_mutation_capture_of_the_same_subject(db: Db) {
    let Some(h) = Harness::start(db).await else {
        return;
    };
    // Before any capture: a deviation, and by default the run ends.
    let run = start(&h, json!({})).await;
    to_choose_falsifier(&h, &run, None).await;
    let r = step(&h, &run, json!({"kind": "advance", "step": "mutate"})).await;
    assert_eq!(r["verdict"], "block");
    assert_eq!(classes(&r), ["out-of-order-step"]);
    assert_eq!(r["run"]["status"], "ended");
    assert_eq!(r["run"]["current"], "choose-falsifier");

    // A stale capture (process freshness is 120 s) does not satisfy it.
    let stale = capture(&h, "node-a", 4242, 200).await;
    let run = start(&h, json!({})).await;
    to_choose_falsifier(&h, &run, Some(&stale)).await;
    let r = step(&h, &run, json!({"kind": "advance", "step": "mutate"})).await;
    assert_eq!(classes(&r), ["out-of-order-step"], "{r}");

    // A fresh one does.
    let fresh = capture(&h, "node-a", 4242, 10).await;
    let run = start(&h, json!({})).await;
    to_choose_falsifier(&h, &run, Some(&fresh)).await;
    let r = step(&h, &run, json!({"kind": "advance", "step": "mutate"})).await;
    assert_eq!(r["verdict"], "permit", "{r}");
    assert_eq!(classes(&r), Vec::<String>::new());
    // CAPTURE AGAIN of another subject does not satisfy DIFF …
    step(
        &h,
        &run,
        json!({"kind": "advance", "step": "capture-again"}),
    )
    .await;
    let other = capture(&h, "node-b", 77, 1).await;
    step(&h, &run, json!({"kind": "observe", "envelope": other})).await;
    let (st, blocked) = post(
        &h,
        &format!("/internal/runs/{run}/steps"),
        &json!({"kind": "advance", "step": "diff"}),
    )
    .await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(classes(&blocked), ["out-of-order-step"]);
    assert_eq!(blocked["run"]["status"], "ended");
    // … and the ended run is not resurrected by anything done to it.
    let again = capture(&h, "node-a", 4242, 0).await;
    for body in [
        json!({"kind": "observe", "envelope": again}),
        json!({"kind": "advance", "step": "diff"}),
        json!({"kind": "propose", "tool": "pstack:diff_envelopes"}),
        json!({"kind": "conclude"}),
    ] {
        let r = step(&h, &run, body).await;
        assert_eq!(r["run"]["status"], "ended", "{r}");
    }
    let (_, got) = h.get(&format!("/internal/runs/{run}")).await;
    assert_eq!(got["run"]["status"], "ended");
    assert_eq!(got["run"]["current"], "capture-again");
    assert_eq!(
        classes(&got),
        ["out-of-order-step"; 4],
        "observe, advance and propose after the end are recorded; conclude adds nothing"
    );
    h.finish().await;
}

async fn the_taxonomy_over_http_with_escalation_and_max_total(db: Db) {
    let Some(h) = Harness::start(db).await else {
        return;
    };
    // Defaults: an out-of-scope tool blocks and continues; an undeclared
    // one too; the sixth deviation exceeds maxTotal 5 and ends the run.
    let run = start(&h, json!({})).await;
    for i in 0..5 {
        let r = step(
            &h,
            &run,
            json!({"kind": "propose", "tool": "pstack:diff_envelopes"}),
        )
        .await;
        assert_eq!(r["verdict"], "block");
        assert_eq!(r["run"]["status"], "running", "after {i}");
    }
    let r = step(
        &h,
        &run,
        json!({"kind": "propose", "tool": "cli:nothing-declares-this"}),
    )
    .await;
    assert_eq!(r["run"]["status"], "ended");
    assert_eq!(r["run"]["outcome"], "deviation-limit");
    assert_eq!(r["run"]["deviations"].as_array().unwrap().len(), 6);
    assert!(
        r["events"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["code"] == "run/deviation-limit")
    );

    // A control-flow deviation ends the run by default …
    let run = start(&h, json!({})).await;
    let r = step(&h, &run, json!({"kind": "advance", "step": "diff"})).await;
    assert_eq!(
        (r["run"]["status"].as_str(), classes(&r)),
        (Some("ended"), vec!["out-of-order-step".to_string()])
    );
    let esc = r["events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["kind"] == "escalated")
        .unwrap()
        .clone();
    assert_eq!(esc["at"], "capture");
    assert!(
        esc["message"]
            .as_str()
            .unwrap()
            .contains("out-of-order-step")
    );
    // … unless the operator says otherwise, and then maxTotal still holds.
    let run = start(&h, json!({"escalation": {"responses": {"out-of-order-step": "block-and-continue"}, "maxTotal": 2}})).await;
    for want in ["running", "running", "ended"] {
        let r = step(&h, &run, json!({"kind": "advance", "step": "diff"})).await;
        assert_eq!(r["run"]["status"], want, "{r}");
        assert_eq!(r["verdict"], "block");
    }
    // unchecked-advance (DIFF has a check) and terminal-not-reached.
    let fresh = capture(&h, "node-a", 4242, 1).await;
    let run = start(
        &h,
        json!({"escalation": {"responses": {"unchecked-advance": "block-and-continue"}}}),
    )
    .await;
    to_choose_falsifier(&h, &run, Some(&fresh)).await;
    for to in ["mutate", "capture-again"] {
        step(&h, &run, json!({"kind": "advance", "step": to})).await;
    }
    step(&h, &run, json!({"kind": "observe", "envelope": fresh})).await;
    h.clock.advance(Duration::from_secs(2));
    let again = capture(&h, "node-a", 4242, 0).await;
    step(&h, &run, json!({"kind": "observe", "envelope": again})).await;
    step(&h, &run, json!({"kind": "advance", "step": "diff"})).await;
    let r = step(
        &h,
        &run,
        json!({"kind": "advance", "step": "issue-receipt"}),
    )
    .await;
    assert_eq!(classes(&r), ["unchecked-advance"]);
    assert_eq!(r["run"]["status"], "running");
    let r = step(&h, &run, json!({"kind": "conclude"})).await;
    assert_eq!(classes(&r), ["unchecked-advance", "terminal-not-reached"]);
    assert_eq!(r["run"]["status"], "ended");
    assert_eq!(
        r["run"]["account"]["deviations"]["byClass"]["unchecked-advance"],
        1
    );
    assert_eq!(r["run"]["account"]["deviations"]["byStep"]["diff"], 2);
    h.finish().await;
}

async fn a_failed_diff_leaves_a_typed_failure_receipt_and_a_valid_report(db: Db) {
    let Some(h) = Harness::start(db).await else {
        return;
    };
    let pre = capture(&h, "node-a", 4242, 5).await;
    let run = start(&h, json!({})).await;
    to_choose_falsifier(&h, &run, Some(&pre)).await;
    step(&h, &run, json!({"kind": "advance", "step": "mutate"})).await;
    step(
        &h,
        &run,
        json!({"kind": "advance", "step": "capture-again"}),
    )
    .await;
    h.clock.advance(Duration::from_secs(2));
    let post_d = capture(&h, "node-a", 4242, 0).await;
    step(&h, &run, json!({"kind": "observe", "envelope": post_d})).await;
    step(&h, &run, json!({"kind": "advance", "step": "diff"})).await;
    // Before it ends, the report is partial.
    let (st, rep) = h
        .get(&format!(
            "/internal/runs/{run}/report?executorKind=autonomous&envClass=ci"
        ))
        .await;
    assert_eq!(st, StatusCode::OK, "{rep}");
    assert_eq!(rep["outcome"], "partial");
    // The diff says the falsifier's prediction did not hold.
    let r = step(&h, &run, json!({"kind": "observe", "exitCode": 1})).await;
    assert_eq!(r["run"]["current"], "end:failed");
    assert_eq!(r["run"]["reportOutcome"], "failed");
    let receipt = &r["run"]["failureReceipt"];
    assert_eq!(receipt["failedStepId"], "diff", "{r}");
    assert_eq!(receipt["failureClass"], "expectation_mismatch");
    assert_eq!(receipt["preMutationEnvelope"], pre.as_str());
    assert_eq!(receipt["postMutationEnvelope"], post_d.as_str());
    let (st, rep) = h
        .get(&format!(
            "/internal/runs/{run}/report?executorKind=autonomous&envClass=ci&runtimeProfile=R2"
        ))
        .await;
    assert_eq!(st, StatusCode::OK, "{rep}");
    assert_eq!(rep["report_schema"], "runbook-run-report/v1");
    assert_eq!(rep["outcome"], "failed");
    assert_eq!(rep["failure_class"], "expectation_mismatch");
    assert_eq!(rep["failed_step_id"], "diff");
    assert_eq!(rep["duration_bucket"], "<1m");
    assert_eq!(rep["runbook"], "pstack/investigation-loop");
    assert_eq!(rep["reported_at"].as_str().unwrap().len(), 10);
    // The published schema, validated independently here.
    let (st, schema) = h.get("/internal/schemas/runbook-run-report-v1.json").await;
    assert_eq!(st, StatusCode::OK);
    let v = jsonschema_check(&schema, &rep);
    assert!(
        v,
        "the emitted report validates against the published schema"
    );
    // No default for executorKind / envClass.
    let (st, e) = h
        .get(&format!("/internal/runs/{run}/report?envClass=ci"))
        .await;
    assert_eq!(
        (st, code(&e), e["error"]["field"].as_str()),
        (
            StatusCode::BAD_REQUEST,
            "invalid_query",
            Some("executorKind")
        )
    );
    let (st, e) = h
        .get(&format!(
            "/internal/runs/{run}/report?executorKind=human&envClass=moon"
        ))
        .await;
    assert_eq!(
        (st, e["error"]["field"].as_str()),
        (StatusCode::BAD_REQUEST, Some("envClass"))
    );
    h.finish().await;
}

/// Minimal independent check of the report against the served schema: the
/// closed set of keys, the required ones, and each enum.
fn jsonschema_check(schema: &Value, report: &Value) -> bool {
    let props = schema["properties"].as_object().unwrap();
    let obj = report.as_object().unwrap();
    obj.keys().all(|k| props.contains_key(k))
        && schema["required"]
            .as_array()
            .unwrap()
            .iter()
            .all(|k| obj.contains_key(k.as_str().unwrap()))
        && obj.iter().all(|(k, v)| match props[k].get("enum") {
            Some(e) => e.as_array().unwrap().contains(v),
            None => true,
        })
}

async fn an_expired_handoff_does_not_advance_a_run(db: Db) {
    let Some(h) = Harness::start(db).await else {
        return;
    };
    let d = capture(&h, "node-a", 4242, 1).await;
    let run = start(&h, json!({})).await;
    step(&h, &run, json!({"kind": "observe", "envelope": d})).await;
    let r = step(
        &h,
        &run,
        json!({"kind": "advance", "step": "bind-identity", "handoff": d}),
    )
    .await;
    assert_eq!(r["verdict"], "permit");
    h.clock.advance(Duration::from_secs(121));
    let (st, e) = post(
        &h,
        &format!("/internal/runs/{run}/steps"),
        &json!({"kind": "advance", "step": "classify-unknown", "handoff": d}),
    )
    .await;
    assert_eq!((st, code(&e)), (StatusCode::GONE, "handoff_expired"), "{e}");
    assert_eq!(e["error"]["field"], "handoff");
    let (_, got) = h.get(&format!("/internal/runs/{run}")).await;
    assert_eq!(
        got["run"]["current"], "bind-identity",
        "the run did not move"
    );
    h.finish().await;
}

async fn hostile_run_requests_get_typed_errors_naming_the_field(db: Db) {
    let Some(h) = Harness::start(db).await else {
        return;
    };
    let _ = captured_logs();
    let run = start(&h, json!({})).await;
    let path = format!("/internal/runs/{run}/steps");
    for (body, field) in [
        (json!({"kind": "teleport", "tool": "x"}), Some("kind")),
        (json!({"kind": "propose"}), Some("tool")),
        (json!({"kind": "conclude", "tool": "cli:df"}), Some("tool")),
        (json!({"kind": "propose", "tool": 7}), Some("tool")),
        (
            json!({"kind": "observe", "exitCode": "hunter2"}),
            Some("exitCode"),
        ),
        (json!({"kind": "advance", "step": "diff", "extra": 1}), None),
    ] {
        let (st, e) = post(&h, &path, &body).await;
        assert_eq!(
            (st, code(&e)),
            (StatusCode::BAD_REQUEST, "invalid_body"),
            "{body} → {e}"
        );
        if let Some(f) = field {
            assert_eq!(e["error"]["field"], f, "{body} → {e}");
        }
        assert!(!e.to_string().contains("hunter2"), "{e}");
    }
    let (st, e) = post(
        &h,
        &path,
        &json!({"kind": "observe", "envelope": "sha256:nothex"}),
    )
    .await;
    assert_eq!(
        (st, e["error"]["field"].as_str()),
        (StatusCode::BAD_REQUEST, Some("envelope"))
    );
    let unknown = format!("sha256:{}", "0".repeat(64));
    let (st, e) = post(&h, &path, &json!({"kind": "observe", "envelope": unknown})).await;
    assert_eq!(
        (st, code(&e)),
        (StatusCode::UNPROCESSABLE_ENTITY, "envelope_unknown")
    );
    let (st, e) = post(
        &h,
        "/internal/runs/run_nope/steps",
        &json!({"kind": "conclude"}),
    )
    .await;
    assert_eq!((st, code(&e)), (StatusCode::NOT_FOUND, "run_not_found"));
    let (st, e) = post(&h, "/internal/runs", &json!({"agentIdentity": " "})).await;
    assert_eq!(
        (st, e["error"]["field"].as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some("agentIdentity"))
    );
    let (st, e) = post(
        &h,
        "/internal/runs",
        &json!({"agentIdentity": "a", "graph": {"name": "x/y", "version": "1"}}),
    )
    .await;
    assert_eq!((st, code(&e)), (StatusCode::NOT_FOUND, "graph_not_found"));
    let (st, e) = post(
        &h,
        "/internal/runs",
        &json!({"agentIdentity": "a", "escalation": {"responses": {"made-up": "abort"}}}),
    )
    .await;
    assert_eq!(
        (st, code(&e)),
        (StatusCode::BAD_REQUEST, "invalid_body"),
        "{e}"
    );
    // Operators register their own graph; a broken one names the field.
    let g = json!({"graph": {"name": "ops/disk", "version": "1", "entry": "s1",
        "steps": {"s1": {"tools": ["cli:df"], "next": ["done"]}, "done": {"terminal": "success"}}}});
    let (st, r) = post(&h, "/internal/graphs", &g).await;
    assert_eq!(st, StatusCode::CREATED, "{r}");
    let (st, _) = post(&h, "/internal/graphs", &g).await;
    assert_eq!(st, StatusCode::OK, "the same body again");
    let mut changed = g.clone();
    changed["graph"]["steps"]["s1"]["tools"] = json!(["cli:du"]);
    let (st, e) = post(&h, "/internal/graphs", &changed).await;
    assert_eq!((st, code(&e)), (StatusCode::CONFLICT, "graph_exists"));
    let mut broken = g.clone();
    broken["graph"]["version"] = json!("2");
    broken["graph"]["steps"]["s1"]["next"] = json!(["nowhere"]);
    let (st, e) = post(&h, "/internal/graphs", &broken).await;
    assert_eq!(
        (st, e["error"]["field"].as_str()),
        (
            StatusCode::UNPROCESSABLE_ENTITY,
            Some("graph.steps.s1.next")
        ),
        "{e}"
    );
    let (st, r) = post(
        &h,
        "/internal/runs",
        &json!({"agentIdentity": "a", "graph": {"name": "ops/disk", "version": "1"}}),
    )
    .await;
    assert_eq!(st, StatusCode::CREATED);
    assert_eq!(r["run"]["current"], "s1");
    // Without the key: 401 before anything is read.
    let resp = h
        .client
        .post(h.url(&path))
        .json(&json!({"kind": "conclude"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
    h.finish().await;
}
