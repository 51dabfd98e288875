//! Queries: subject histories (newest first, paged), diff, handoff, the fleet
//! view of open unknowns, health and metrics.

use pstack_store_core::synthetic::Capture;
use reqwest::StatusCode;
use serde_json::Value;

use crate::on_both_backends;
use crate::support::{Db, Harness, code};

on_both_backends!(
    subject_history_is_newest_first_and_paged,
    history_queries_are_validated,
    diff_and_handoff_use_the_envelope_crate,
    open_unknowns_across_the_fleet,
    healthz_and_metrics,
);

fn bytes(c: &Capture) -> Vec<u8> {
    c.bytes().unwrap().1
}

fn digests(v: &Value) -> Vec<String> {
    v["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["digest"].as_str().unwrap().to_string())
        .collect()
}

async fn subject_history_is_newest_first_and_paged(db: Db) {
    let Some(h) = Harness::start(db).await else {
        return;
    };
    // Subject A: pid 4242 captured 5 times, shipped out of order.
    let a: Vec<Capture> = [3u64, 1, 4, 0, 2]
        .iter()
        .map(|s| Capture::new("node-a", 4242, *s))
        .collect();
    // PID reuse: same host and pid, different start_ticks: a different subject.
    let mut reused = Capture::new("node-a", 4242, 10);
    reused.start_ticks += 500;
    // Same pid on another host, and another pid on the same host.
    let other_host = Capture::new("node-b", 4242, 11);
    let other_pid = Capture::new("node-a", 4243, 12);
    let mut items: Vec<Vec<u8>> = a.iter().map(bytes).collect();
    items.extend([bytes(&reused), bytes(&other_host), bytes(&other_pid)]);
    let (_, resp) = h.post_batch(&items).await;
    assert_eq!(resp.accepted, 8);
    let mut a_sorted = a.clone();
    a_sorted.sort_by_key(|c| std::cmp::Reverse(c.seq));
    let a_digests: Vec<String> = a_sorted.iter().map(|c| c.bytes().unwrap().0).collect();

    // host + pid: both identities that used pid 4242 on node-a, newest first.
    let (status, all) = h
        .get("/v1/subjects?kind=process&host=node-a&pid=4242")
        .await;
    assert_eq!(status, StatusCode::OK, "{all}");
    let mut expected = vec![reused.bytes().unwrap().0];
    expected.extend(a_digests.clone());
    assert_eq!(digests(&all), expected);

    // Narrowed to one identity by start_ticks.
    let st = a[0].start_ticks;
    let (_, one) = h
        .get(&format!(
            "/v1/subjects?kind=process&host=node-a&pid=4242&start_ticks={st}"
        ))
        .await;
    assert_eq!(digests(&one), a_digests);
    let key = one["items"][0]["subject_key"].as_str().unwrap().to_string();
    assert!(
        one["items"]
            .as_array()
            .unwrap()
            .iter()
            .all(|i| i["subject_key"] == key.as_str())
    );
    assert_eq!(one["items"][0]["identity"]["start_ticks"], st.to_string());
    assert_eq!(one["items"][0]["key_id"], h.key_id.as_str());

    // The full identity resolves to the same subject key index.
    let id = &one["items"][0]["identity"];
    let full = format!(
        "/v1/subjects?kind=process&host=node-a&pid=4242&start_ticks={st}&boot_id={}&uid={}&pid_ns={}&cgroup={}",
        id["boot_id"].as_str().unwrap(),
        id["uid"].as_str().unwrap(),
        id["pid_ns"].as_str().unwrap(),
        id["cgroup"]
            .as_str()
            .unwrap()
            .replace('/', "%2F")
            .replace(':', "%3A"),
    );
    let (_, by_full) = h.get(&full).await;
    assert_eq!(digests(&by_full), a_digests);
    let (_, by_key) = h.get(&format!("/v1/subjects?subject={key}")).await;
    assert_eq!(digests(&by_key), a_digests);

    // Paging: limit 2 walks the same order with no gaps or repeats.
    let mut walked = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let path = match &cursor {
            None => format!("/v1/subjects?subject={key}&limit=2"),
            Some(c) => format!("/v1/subjects?subject={key}&limit=2&before={c}"),
        };
        let (status, page) = h.get(&path).await;
        assert_eq!(status, StatusCode::OK, "{page}");
        walked.extend(digests(&page));
        match page["next"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => break,
        }
    }
    assert_eq!(walked, a_digests);
    h.finish().await;
}

async fn history_queries_are_validated(db: Db) {
    let Some(h) = Harness::start(db).await else {
        return;
    };
    for (path, why) in [
        (
            "/v1/subjects?kind=process&host=node-a",
            "no pid: a host alone names no process",
        ),
        ("/v1/subjects?kind=process&pid=1", "no host"),
        ("/v1/subjects?kind=daemon&host=x", "unknown kind"),
        (
            "/v1/subjects?kind=process&host=a&pid=1&container=x",
            "not an identity field",
        ),
        (
            "/v1/subjects?kind=process&host=a&pid=x",
            "pid not an integer",
        ),
        (
            "/v1/subjects?kind=process&host=a&pid=1&limit=0",
            "limit out of range",
        ),
        (
            "/v1/subjects?kind=process&host=a&pid=1&before=garbage",
            "foreign cursor",
        ),
        ("/v1/subjects?host=a", "no kind"),
    ] {
        let (status, body) = h.get(path).await;
        assert_eq!(
            (status, code(&body)),
            (StatusCode::BAD_REQUEST, "invalid_query"),
            "{why}: {body}"
        );
    }
    let (status, body) = h.get("/v1/subjects?kind=host&host=node-a").await;
    assert_eq!(status, StatusCode::OK, "host subjects need no pid: {body}");
    h.finish().await;
}

async fn diff_and_handoff_use_the_envelope_crate(db: Db) {
    let Some(h) = Harness::start(db).await else {
        return;
    };
    let before = Capture::new("node-a", 4242, 1);
    let mut after = Capture::new("node-a", 4242, 2);
    after.blocked = false;
    let stranger = Capture::new("node-z", 9, 3);
    let (bd, _) = before.bytes().unwrap();
    let (ad, _) = after.bytes().unwrap();
    let (sd, _) = stranger.bytes().unwrap();
    h.post_batch(&[bytes(&before), bytes(&after), bytes(&stranger)])
        .await;

    let (status, d) = h.get(&format!("/v1/diff?before={bd}&after={ad}")).await;
    assert_eq!(status, StatusCode::OK, "{d}");
    assert_eq!(
        (d["before"].as_str(), d["after"].as_str()),
        (Some(bd.as_str()), Some(ad.as_str()))
    );
    assert_eq!(
        d["completeness"],
        serde_json::json!(["partial", "complete"])
    );
    assert!(
        d["surfaces_removed"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s == "task/4243/stack")
    );
    assert!(!d["unknowns_resolved"].as_array().unwrap().is_empty());

    let (status, body) = h.get(&format!("/v1/diff?before={bd}&after={sd}")).await;
    assert_eq!(
        (status, code(&body)),
        (StatusCode::UNPROCESSABLE_ENTITY, "subject_mismatch")
    );
    let missing = format!("sha256:{}", "1".repeat(64));
    let (status, body) = h
        .get(&format!("/v1/diff?before={bd}&after={missing}"))
        .await;
    assert_eq!(
        (status, code(&body)),
        (StatusCode::NOT_FOUND, "envelope_not_found")
    );
    let (status, body) = h.get(&format!("/v1/diff?before={bd}")).await;
    assert_eq!(
        (status, code(&body)),
        (StatusCode::BAD_REQUEST, "invalid_query")
    );

    let (status, ho) = h.get(&format!("/v1/handoff/{bd}")).await;
    assert_eq!(status, StatusCode::OK, "{ho}");
    assert_eq!(ho["schema"], "pstack.handoff/v1");
    assert_eq!(ho["digest"], bd.as_str());
    assert_eq!(ho["frontier"]["what"], "task/4243/stack");
    assert_eq!(
        ho["open_unknowns"][0]["probe"],
        "pstackctl capture --tid 4243 --surface-deadline 2s"
    );
    let (status, _) = h.get(&format!("/v1/handoff/{missing}")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    h.finish().await;
}

async fn open_unknowns_across_the_fleet(db: Db) {
    let Some(h) = Harness::start(db).await else {
        return;
    };
    // Subject A: newest capture is still blocked (one open unknown).
    let a_old = Capture::new("node-a", 100, 1);
    let a_new = Capture::new("node-a", 100, 5);
    // Subject B: blocked, then clear: its unknown is resolved.
    let b_old = Capture::new("node-b", 200, 2);
    let mut b_new = Capture::new("node-b", 200, 3);
    b_new.blocked = false;
    // Shipped newest-first for B to prove "newest" means capture time.
    h.post_batch(&[bytes(&a_old), bytes(&b_new), bytes(&b_old), bytes(&a_new)])
        .await;

    let (status, open) = h.get("/v1/unknowns?open=true").await;
    assert_eq!(status, StatusCode::OK, "{open}");
    let items = open["items"].as_array().unwrap();
    assert_eq!(items.len(), 1, "{open}");
    assert_eq!(items[0]["digest"], a_new.bytes().unwrap().0.as_str());
    assert_eq!(items[0]["owner"], "operator of node-a");
    assert_eq!(
        items[0]["probe"],
        "pstackctl capture --tid 101 --surface-deadline 2s"
    );
    assert_eq!(items[0]["open"], true);

    let (_, by_owner) = h.get("/v1/unknowns?owner=operator%20of%20node-b").await;
    assert!(by_owner["items"].as_array().unwrap().is_empty());

    let (_, all) = h.get("/v1/unknowns?open=false").await;
    let all = all["items"].as_array().unwrap();
    assert_eq!(all.len(), 3, "a_old, a_new and b_old each carry one");
    assert_eq!(all.iter().filter(|u| u["open"] == true).count(), 1);

    let (status, body) = h.get("/v1/unknowns?open=maybe").await;
    assert_eq!(
        (status, code(&body)),
        (StatusCode::BAD_REQUEST, "invalid_query")
    );
    h.finish().await;
}

async fn healthz_and_metrics(db: Db) {
    let Some(h) = Harness::start(db).await else {
        return;
    };
    let health: Value = h
        .client
        .get(h.url("/healthz"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(health["status"], "ok");
    assert_eq!(
        health["backend"],
        if db == Db::Sqlite {
            "sqlite"
        } else {
            "postgres"
        }
    );
    let (_, one) = crate::support::sealed("node-a", 1, 1);
    h.post_batch(&[one.clone(), one, br#"{"schema":"x"}"#.to_vec()])
        .await;
    let resp = h.client.get(h.url("/metrics")).send().await.unwrap();
    assert_eq!(
        resp.headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok()),
        Some("text/plain; version=0.0.4; charset=utf-8")
    );
    let text = resp.text().await.unwrap();
    // Prometheus's own linter is the oracle for the exposition format and naming.
    pstack_testkit::require!(
        pstack_testkit::have_tool("promtool"),
        "promtool is not installed (scripts/setup.d/60-oracles.sh installs Debian's prometheus)"
    );
    if let Err(said) = pstack_testkit::promtool_check_metrics(&text) {
        panic!("promtool check metrics on the store's /metrics:\n{said}\n---\n{text}");
    }
    for line in [
        "pstack_store_ingest_items_total{status=\"accepted\"} 1",
        "pstack_store_ingest_items_total{status=\"duplicate\"} 1",
        "pstack_store_ingest_items_total{status=\"rejected\"} 1",
        "pstack_store_ingest_rejections_total{rule=\"wrong_schema\"}",
        "pstack_store_http_responses_total{route=\"/v1/envelopes\",status=\"200\"} 1",
        "# TYPE pstack_store_http_request_duration_seconds histogram",
    ] {
        assert!(text.contains(line), "metrics lack {line:?}:\n{text}");
    }
    h.finish().await;
}
