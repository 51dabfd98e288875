//! Grant webhooks against a real local receiver (loopback only): HMAC
//! signature over the raw body, retries on 5xx, 4xx and redirects final,
//! stored vs request callbacks, failed delivery keeps the approval, and the
//! SSRF guard (private, loopback by name, IPv4-mapped and other forms)
//! with and without `ALERT_WEBHOOK_ALLOW_PRIVATE`.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode as AxStatus, Uri};
use axum::response::{IntoResponse, Response};
use pstack_store_core::ingest::IngestLimits;
use reqwest::StatusCode;
use serde_json::{Value, json};

use super::{deploy, finding, open_incident, post, proposal};
use crate::on_both_backends;
use crate::support::{Db, Harness};

#[derive(Debug, Clone)]
struct Received {
    path: String,
    signature: Option<String>,
    body: Vec<u8>,
}

#[derive(Clone, Default)]
struct Receiver {
    got: Arc<Mutex<Vec<Received>>>,
    hits: Arc<Mutex<BTreeMap<String, u32>>>,
}

async fn receive(State(r): State<Receiver>, uri: Uri, headers: HeaderMap, body: Bytes) -> Response {
    let path = uri.path().to_string();
    let n = {
        let mut hits = r.hits.lock().unwrap();
        let n = hits.entry(path.clone()).or_insert(0);
        *n += 1;
        *n
    };
    r.got.lock().unwrap().push(Received {
        path: uri
            .path_and_query()
            .map(|p| p.to_string())
            .unwrap_or_default(),
        signature: headers
            .get("x-obs-signature-256")
            .map(|v| v.to_str().unwrap().to_string()),
        body: body.to_vec(),
    });
    if path == "/slow" {
        tokio::time::sleep(std::time::Duration::from_secs(6)).await;
    }
    match path.as_str() {
        "/flaky" if n == 1 => AxStatus::INTERNAL_SERVER_ERROR.into_response(),
        "/always500" => AxStatus::BAD_GATEWAY.into_response(),
        "/gone" => AxStatus::NOT_FOUND.into_response(),
        "/redirect" => (AxStatus::FOUND, [("location", "/hook-7f3")]).into_response(),
        _ => AxStatus::OK.into_response(),
    }
}

impl Receiver {
    async fn start() -> (Receiver, u16) {
        let r = Receiver::default();
        let app = axum::Router::new().fallback(receive).with_state(r.clone());
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        tokio::spawn(async move { axum::serve(l, app).await });
        (r, port)
    }

    fn hits(&self, path: &str) -> u32 {
        self.hits.lock().unwrap().get(path).copied().unwrap_or(0)
    }

    fn last(&self, path: &str) -> Received {
        self.got
            .lock()
            .unwrap()
            .iter()
            .rev()
            .find(|g| g.path.split('?').next() == Some(path))
            .cloned()
            .expect("a request")
    }
}

async fn harness(db: Db, allow_private: bool) -> Option<Harness> {
    Harness::start_custom(db, IngestLimits::default(), |s| {
        s.gate.allow_private_webhooks = allow_private;
    })
    .await
}

fn hmac_hex(secret: &str, body: &[u8]) -> String {
    let k = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, secret.as_bytes());
    format!(
        "sha256={}",
        hex::encode(ring::hmac::sign(&k, body).as_ref())
    )
}

async fn webhook_signed_delivery_stored_and_request_callbacks(db: Db) {
    let (rx, port) = Receiver::start().await;
    let Some(h) = harness(db, true).await else {
        return;
    };
    deploy(&h, "2.4.1", "8f3a1b2").await;
    let inc = open_incident(&h, "hooks").await;
    // Autonomous propose with a callback: delivered at once, signed.
    let f = finding(&h, &inc, "counterfactual_verified", "fp_h1").await;
    let mut body = proposal(&inc, &f, "rollback_deploy", "h1");
    body["webhookUrl"] = json!(format!("http://127.0.0.1:{port}/hook-7f3?q=qsecret"));
    // The seed's name; `secret` (below, on a parked proposal) is its alias.
    body["webhookSecret"] = json!("s3cret-hmac");
    let (st, b) = post(&h, "/internal/remediations/propose", &body).await;
    assert_eq!(st, StatusCode::CREATED, "{b}");
    let d = &b["grantDelivery"];
    assert_eq!(
        (
            d["attempted"].as_bool(),
            d["delivered"].as_bool(),
            d["attempts"].as_u64()
        ),
        (Some(true), Some(true), Some(1)),
        "{b}"
    );
    assert_eq!(d["host"], "127.0.0.1");
    let got = rx.last("/hook-7f3");
    assert_eq!(
        got.signature.as_deref(),
        Some(hmac_hex("s3cret-hmac", &got.body).as_str())
    );
    let sent: Value = serde_json::from_slice(&got.body).unwrap();
    assert_eq!(sent["event"], "autosre.remediation.grant_issued");
    assert_eq!(sent["proposalId"], b["proposal"]["id"]);
    assert_eq!(sent["status"], "grant_issued");
    assert_eq!(sent["grantToken"], b["grantToken"]);
    assert_eq!(sent["incident"]["id"], inc.as_str());
    // A wrong secret would not verify.
    assert_ne!(
        got.signature.as_deref(),
        Some(hmac_hex("other", &got.body).as_str())
    );

    // Parked with a stored callback: GETs show only the host.
    let f2 = finding(&h, &inc, "corroborated_candidate", "fp_h2").await;
    let mut body = proposal(&inc, &f2, "rollback_deploy", "h2");
    body["webhookUrl"] = json!(format!("http://127.0.0.1:{port}/stored-path?q=qsecret"));
    body["secret"] = json!("stored-secret");
    // Both names at once is ambiguous: refused before anything is stored.
    let mut both = body.clone();
    both["webhookSecret"] = json!("other-secret");
    both["idempotencyKey"] = json!("h2-both");
    let (st, e) = post(&h, "/internal/remediations/propose", &both).await;
    assert!(st.is_client_error(), "{st} {e}");
    assert!(!e.to_string().contains("other-secret"), "{e}");
    let (_, b2) = post(&h, "/internal/remediations/propose", &body).await;
    let id2 = b2["proposal"]["id"].as_str().unwrap().to_string();
    assert_eq!(b2["proposal"]["callbackHost"], "127.0.0.1");
    assert!(b2.get("grantDelivery").is_none());
    let (_, g) = h.get(&format!("/internal/remediations/{id2}")).await;
    let text = g.to_string();
    for hidden in ["stored-path", "qsecret", "stored-secret"] {
        assert!(!text.contains(hidden), "{hidden} in {text}");
    }
    assert_eq!(rx.hits("/stored-path"), 0, "parked: nothing delivered");
    let (st, a) = post(
        &h,
        &format!("/internal/remediations/{id2}/approve"),
        &json!({}),
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{a}");
    assert_eq!(a["grantDelivery"]["delivered"], true, "{a}");
    let got = rx.last("/stored-path");
    assert_eq!(
        got.signature.as_deref(),
        Some(hmac_hex("stored-secret", &got.body).as_str())
    );
    assert_eq!(
        serde_json::from_slice::<Value>(&got.body).unwrap()["grantToken"],
        a["grantToken"]
    );
    let (_, g) = h.get(&format!("/internal/remediations/{id2}")).await;
    assert_eq!(g["proposal"]["callbackDelivery"]["status"], "delivered");
    assert_eq!(g["proposal"]["callbackDelivery"]["attempts"], 1);
    let row = h.store.proposal(&id2).await.unwrap().unwrap();
    assert_eq!(
        row.callback_sealed, None,
        "the stored callback is cleared on approve"
    );

    // The approve request's callback wins over the stored one.
    let f3 = finding(&h, &inc, "corroborated_candidate", "fp_h3").await;
    let mut body = proposal(&inc, &f3, "rollback_deploy", "h3");
    body["webhookUrl"] = json!(format!("http://127.0.0.1:{port}/stored-loses"));
    let (_, b3) = post(&h, "/internal/remediations/propose", &body).await;
    let id3 = b3["proposal"]["id"].as_str().unwrap();
    let (_, a3) = post(
        &h,
        &format!("/internal/remediations/{id3}/approve"),
        &json!({"webhookUrl": format!("http://127.0.0.1:{port}/request-wins")}),
    )
    .await;
    assert_eq!(a3["grantDelivery"]["delivered"], true, "{a3}");
    assert_eq!((rx.hits("/request-wins"), rx.hits("/stored-loses")), (1, 0));
    assert_eq!(
        rx.last("/request-wins").signature,
        None,
        "no secret: unsigned"
    );
    // Rejecting clears a stored callback too.
    let f4 = finding(&h, &inc, "corroborated_candidate", "fp_h4").await;
    let mut body = proposal(&inc, &f4, "rollback_deploy", "h4");
    body["webhookUrl"] = json!(format!("http://127.0.0.1:{port}/never"));
    let (_, b4) = post(&h, "/internal/remediations/propose", &body).await;
    let id4 = b4["proposal"]["id"].as_str().unwrap();
    assert!(
        h.store
            .proposal(id4)
            .await
            .unwrap()
            .unwrap()
            .callback_sealed
            .is_some()
    );
    let _ = post(
        &h,
        &format!("/internal/remediations/{id4}/reject"),
        &json!({}),
    )
    .await;
    assert_eq!(
        h.store
            .proposal(id4)
            .await
            .unwrap()
            .unwrap()
            .callback_sealed,
        None
    );
    h.finish().await;
}

/// Approve a parked rollback with `url`: the approve response.
async fn approve_to(h: &Harness, inc: &str, key: &str, url: &str) -> (StatusCode, Value) {
    let f = finding(h, inc, "corroborated_candidate", &format!("fp_{key}")).await;
    let (_, b) = post(
        h,
        "/internal/remediations/propose",
        &proposal(inc, &f, "rollback_deploy", key),
    )
    .await;
    let id = b["proposal"]["id"].as_str().unwrap();
    post(
        h,
        &format!("/internal/remediations/{id}/approve"),
        &json!({"webhookUrl": url, "secret": "k"}),
    )
    .await
}

async fn webhook_retries_5xx_and_stops_on_4xx_and_redirects(db: Db) {
    let (rx, port) = Receiver::start().await;
    let Some(h) = harness(db, true).await else {
        return;
    };
    deploy(&h, "2.4.1", "8f3a1b2").await;
    let inc = open_incident(&h, "retries").await;
    let base = format!("http://127.0.0.1:{port}");
    // 500, then 200: two attempts, 500 ms apart.
    let t = Instant::now();
    let (st, a) = approve_to(&h, &inc, "r1", &format!("{base}/flaky")).await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(
        (
            a["grantDelivery"]["delivered"].as_bool(),
            a["grantDelivery"]["attempts"].as_u64()
        ),
        (Some(true), Some(2)),
        "{a}"
    );
    assert!(t.elapsed() >= std::time::Duration::from_millis(500));
    assert_eq!(rx.hits("/flaky"), 2);
    // Always 5xx: three attempts (500 ms + 1500 ms), the approval stands
    // and the token is still in the response.
    let t = Instant::now();
    let (st, a) = approve_to(&h, &inc, "r2", &format!("{base}/always500")).await;
    assert_eq!(st, StatusCode::OK);
    let d = &a["grantDelivery"];
    assert_eq!(
        (d["delivered"].as_bool(), d["attempts"].as_u64()),
        (Some(false), Some(3)),
        "{a}"
    );
    assert_eq!(d["error"], "HTTP 502");
    assert!(t.elapsed() >= std::time::Duration::from_millis(2000));
    assert_eq!(rx.hits("/always500"), 3);
    assert!(a["grantToken"].as_str().unwrap().starts_with("rgt_"));
    assert_eq!(a["proposal"]["status"], "grant_issued");
    let (_, g) = h
        .get(&format!(
            "/internal/remediations/{}",
            a["proposal"]["id"].as_str().unwrap()
        ))
        .await;
    assert_eq!(g["proposal"]["callbackDelivery"]["status"], "failed");
    assert_eq!(g["proposal"]["callbackDelivery"]["lastError"], "HTTP 502");
    // 4xx: final after one attempt.
    let (_, a) = approve_to(&h, &inc, "r3", &format!("{base}/gone")).await;
    assert_eq!(
        (
            a["grantDelivery"]["attempts"].as_u64(),
            a["grantDelivery"]["error"].as_str()
        ),
        (Some(1), Some("HTTP 404"))
    );
    assert_eq!(rx.hits("/gone"), 1);
    // Redirect: final, not followed.
    let before = rx.hits("/hook-7f3");
    let (_, a) = approve_to(&h, &inc, "r4", &format!("{base}/redirect")).await;
    assert_eq!(a["grantDelivery"]["attempts"], 1);
    assert_eq!(a["grantDelivery"]["delivered"], false);
    assert!(
        a["grantDelivery"]["error"]
            .as_str()
            .unwrap()
            .contains("302"),
        "{a}"
    );
    assert_eq!(
        rx.hits("/hook-7f3"),
        before,
        "the redirect was not followed"
    );
    h.finish().await;
}

async fn webhook_ssrf_guard(db: Db) {
    let (rx, port) = Receiver::start().await;
    let Some(h) = harness(db, false).await else {
        return;
    };
    deploy(&h, "2.4.1", "8f3a1b2").await;
    let inc = open_incident(&h, "ssrf").await;
    let refused = [
        format!("http://127.0.0.1:{port}/guard"),
        format!("http://localhost:{port}/guard"),
        format!("http://[::ffff:127.0.0.1]:{port}/guard"),
        format!("http://[::ffff:7f00:1]:{port}/guard"),
        format!("http://[::127.0.0.1]:{port}/guard"),
        format!("http://[64:ff9b::7f00:1]:{port}/guard"),
        format!("http://[::1]:{port}/guard"),
        "http://10.0.0.1/guard".to_string(),
        "http://192.168.1.10/guard".to_string(),
        "http://169.254.169.254/latest/meta-data".to_string(),
        "http://100.64.0.1/guard".to_string(),
        "http://[fd00::1]/guard".to_string(),
        "http://0.0.0.0/guard".to_string(),
        "http://224.0.0.1/guard".to_string(),
    ];
    for (i, url) in refused.iter().enumerate() {
        let (st, a) = approve_to(&h, &inc, &format!("s{i}"), url).await;
        assert_eq!(st, StatusCode::OK, "{url}: {a}");
        let d = &a["grantDelivery"];
        assert_eq!(d["delivered"], false, "{url}: {a}");
        assert_eq!(d["attempts"], 0, "{url}: refused before any connection");
        assert!(d["error"].as_str().unwrap().contains("SSRF"), "{url}: {a}");
        assert!(a["grantToken"].as_str().is_some(), "the approval stands");
    }
    assert_eq!(rx.hits("/guard"), 0);
    h.finish().await;
    // With the override, loopback by address and by name are allowed.
    let Some(h) = harness(db, true).await else {
        return;
    };
    deploy(&h, "2.4.1", "8f3a1b2").await;
    let inc = open_incident(&h, "ssrf-allowed").await;
    for (i, url) in [
        format!("http://127.0.0.1:{port}/guard"),
        format!("http://localhost:{port}/guard"),
    ]
    .iter()
    .enumerate()
    {
        let (_, a) = approve_to(&h, &inc, &format!("o{i}"), url).await;
        assert_eq!(a["grantDelivery"]["delivered"], true, "{url}: {a}");
    }
    assert_eq!(rx.hits("/guard"), 2);
    // Malformed callbacks are refused before anything is stored.
    let f = finding(&h, &inc, "corroborated_candidate", "fp_bad").await;
    for (url, field) in [
        ("ftp://x/y", "webhookUrl"),
        ("http://user:pw@host/", "webhookUrl"),
    ] {
        let mut body = proposal(&inc, &f, "rollback_deploy", "bad");
        body["webhookUrl"] = json!(url);
        let (st, e) = post(&h, "/internal/remediations/propose", &body).await;
        assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY, "{url}");
        assert_eq!(e["error"]["field"], field);
    }
    h.finish().await;
}

// Regression (issue 28): `::ffff:0:a.b.c.d` (IPv4-translated) and Teredo
// `2001::/32` passed the SSRF guard. Each IPv6 form embedding an IPv4
// address — with the loopback address inside, toward a listening receiver —
// is refused before any connection, on the path every delivery takes.
async fn webhook_ssrf_guard_refuses_every_ipv4_embedding_form(db: Db) {
    let (rx, port) = Receiver::start().await;
    let Some(h) = harness(db, false).await else {
        return;
    };
    deploy(&h, "2.4.1", "8f3a1b2").await;
    let inc = open_incident(&h, "ssrf-embedded").await;
    for (i, (host, form)) in [
        ("[::ffff:0:127.0.0.1]", "IPv4-translated"),
        ("[::ffff:0:7f00:1]", "IPv4-translated"),
        ("[2001:0:7f00:1::]", "Teredo"),
        // Teredo with client 127.0.0.1 (stored XOR 0xffffffff) behind port 0.
        ("[2001:0:4136:e378:8000:ffff:80ff:fffe]", "Teredo"),
        ("[::ffff:127.0.0.1]", "loopback"),
        ("[::127.0.0.1]", "IPv4-compatible"),
        ("[64:ff9b::127.0.0.1]", "NAT64"),
        ("[64:ff9b:1::7f00:1]", "NAT64"),
        ("[2002:7f00:1::1]", "6to4"),
    ]
    .iter()
    .enumerate()
    {
        let url = format!("http://{host}:{port}/embedded");
        let (st, a) = approve_to(&h, &inc, &format!("e{i}"), &url).await;
        assert_eq!(st, StatusCode::OK, "{url}: {a}");
        let d = &a["grantDelivery"];
        assert_eq!(
            (d["delivered"].as_bool(), d["attempts"].as_u64()),
            (Some(false), Some(0)),
            "{url}: refused before any connection: {a}"
        );
        let error = d["error"].as_str().unwrap_or_default();
        assert!(
            error.contains("SSRF") && error.contains(form),
            "{url}: {error}"
        );
    }
    assert_eq!(rx.hits("/embedded"), 0);
    h.finish().await;
}

// Regression (issue 28): a callback sealed on a replica with another gate
// key was silently not delivered on approve — no `grantDelivery`, no
// stored outcome, no log line. Here a second server on the same database
// with its own (random) gate key approves it: the delivery is a failure
// with its reason, stored and logged, the approval stands, and nothing is
// sent. The same approval on the sealing server delivers (the control).
async fn stored_callback_sealed_under_another_key_is_a_failed_delivery(db: Db) {
    let logs = crate::support::captured_logs();
    let (rx, port) = Receiver::start().await;
    let Some(h) = harness(db, true).await else {
        return;
    };
    deploy(&h, "2.4.1", "8f3a1b2").await;
    let inc = open_incident(&h, "unsealable").await;
    let park = |fp: &'static str, key: &'static str| {
        let (h, inc) = (&h, inc.clone());
        async move {
            let f = finding(h, &inc, "corroborated_candidate", fp).await;
            let mut body = proposal(&inc, &f, "rollback_deploy", key);
            body["webhookUrl"] = json!(format!("http://127.0.0.1:{port}/sealed-{key}"));
            body["secret"] = json!("sealed-secret");
            let (st, b) = post(h, "/internal/remediations/propose", &body).await;
            assert_eq!(st, StatusCode::CREATED, "{b}");
            assert_eq!(b["proposal"]["status"], "pending_human_approval");
            b["proposal"]["id"].as_str().unwrap().to_string()
        }
    };
    let other_key = park("fp_u1", "u1").await;
    let same_key = park("fp_u2", "u2").await;
    // Another server over the same database, its gate key its own.
    let mut state = pstack_store::http::AppState::new(h.store.clone(), IngestLimits::default());
    state.gate.allow_private_webhooks = true;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let other = format!("http://{}", listener.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(pstack_store::service::serve(listener, state, async move {
        let _ = stopped.await;
    }));
    let (cookie, csrf) = h.human_session().await;
    let log_start = logs.lock().unwrap().len();
    let resp = h
        .client
        .post(format!("{other}/internal/remediations/{other_key}/approve"))
        .header("cookie", format!("pstack_session={cookie}"))
        .header("x-csrf-token", csrf)
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let a: Value = resp.json().await.unwrap();
    assert!(
        a["grantToken"]
            .as_str()
            .is_some_and(|t| t.starts_with("rgt_")),
        "the approval stands: {a}"
    );
    let d = &a["grantDelivery"];
    assert_eq!(
        (
            d["attempted"].as_bool(),
            d["delivered"].as_bool(),
            d["attempts"].as_u64(),
            d["host"].as_str()
        ),
        (Some(true), Some(false), Some(0), Some("127.0.0.1")),
        "a failed delivery, not a silent none: {a}"
    );
    let error = d["error"].as_str().unwrap_or_default();
    assert!(error.contains("another gate key"), "{error}");
    let (_, g) = h.get(&format!("/internal/remediations/{other_key}")).await;
    let stored = &g["proposal"]["callbackDelivery"];
    assert_eq!(stored["status"], "failed", "{g}");
    assert_eq!(stored["attempts"], 0);
    assert!(
        stored["lastError"]
            .as_str()
            .is_some_and(|e| e.contains("another gate key")),
        "{g}"
    );
    assert_eq!(rx.hits("/sealed-u1"), 0, "nothing was sent");
    let text = String::from_utf8_lossy(&logs.lock().unwrap()[log_start..]).to_string();
    assert!(
        text.lines()
            .any(|l| l.contains(&other_key) && l.contains("the stored callback does not open")),
        "logged with the proposal: {text}"
    );
    assert!(
        !text.contains("sealed-secret"),
        "the secret is never logged"
    );
    // Control: the sealing server opens its own seal and delivers.
    let (st, a) = post(
        &h,
        &format!("/internal/remediations/{same_key}/approve"),
        &json!({}),
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{a}");
    assert_eq!(a["grantDelivery"]["delivered"], true, "{a}");
    assert_eq!(rx.hits("/sealed-u2"), 1);
    let _ = stop.send(());
    let _ = server.await;
    h.finish().await;
}

on_both_backends!(
    webhook_signed_delivery_stored_and_request_callbacks,
    webhook_retries_5xx_and_stops_on_4xx_and_redirects,
    webhook_ssrf_guard,
    webhook_ssrf_guard_refuses_every_ipv4_embedding_form,
    stored_callback_sealed_under_another_key_is_a_failed_delivery,
);

/// Each attempt times out after 5 s and a timeout is retried: 3 × 5 s +
/// 0.5 s + 1.5 s. One backend: the delivery path does not touch the database.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn webhook_attempts_time_out_after_5_s_and_are_retried() {
    let (rx, port) = Receiver::start().await;
    let Some(h) = harness(Db::Sqlite, true).await else {
        return;
    };
    deploy(&h, "2.4.1", "8f3a1b2").await;
    let inc = open_incident(&h, "slow").await;
    let t = Instant::now();
    let (st, a) = approve_to(&h, &inc, "slow", &format!("http://127.0.0.1:{port}/slow")).await;
    let took = t.elapsed();
    assert_eq!(st, StatusCode::OK);
    let d = &a["grantDelivery"];
    assert_eq!(
        (d["delivered"].as_bool(), d["attempts"].as_u64()),
        (Some(false), Some(3)),
        "{a}"
    );
    assert_eq!(d["error"], "timed out after 5 s");
    assert!(took >= std::time::Duration::from_secs(17), "{took:?}");
    assert!(took < std::time::Duration::from_secs(25), "{took:?}");
    assert_eq!(rx.hits("/slow"), 3);
    h.finish().await;
}
