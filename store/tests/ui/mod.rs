//! The approval page: operator sessions distinct from API keys, cookie
//! attributes, CSRF on every state-changing request, and a headless
//! Chromium (Debian's `chromium` + `chromium-driver`, over WebDriver, on
//! loopback only) that logs in, approves, reads the token once, reloads and
//! finds it gone.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::gate::{finding, open_incident, post, proposal};
use crate::on_both_backends;
use crate::support::{Db, Harness, code};

async fn parked(h: &Harness, key: &str) -> String {
    let inc = open_incident(h, key).await;
    let f = finding(h, &inc, "corroborated_candidate", &format!("fp_{key}")).await;
    let (st, b) = post(
        h,
        "/internal/remediations/propose",
        &proposal(&inc, &f, "rollback_deploy", key),
    )
    .await;
    assert_eq!(st, StatusCode::CREATED, "{b}");
    b["proposal"]["id"].as_str().unwrap().to_string()
}

async fn raw(
    h: &Harness,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<Value>,
) -> (StatusCode, HeaderMapLite, Value) {
    let mut req = match body {
        Some(b) => h.client.post(h.url(path)).json(&b),
        None => h.client.get(h.url(path)),
    };
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = req.send().await.unwrap();
    let st = resp.status();
    let hs = HeaderMapLite(
        resp.headers()
            .iter()
            .map(|(k, v)| (k.as_str().to_string(), v.to_str().unwrap_or("").to_string()))
            .collect(),
    );
    (st, hs, resp.json().await.unwrap_or(Value::Null))
}

struct HeaderMapLite(Vec<(String, String)>);

impl HeaderMapLite {
    fn get(&self, k: &str) -> Option<&str> {
        self.0.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str())
    }
}

async fn sessions_are_not_keys_and_need_csrf(db: Db) {
    let Some(h) = Harness::start(db).await else {
        return;
    };
    let id = parked(&h, "csrf").await;
    let approve = format!("/internal/remediations/{id}/approve");
    // The page itself is open and locked down.
    let resp = h.client.get(h.url("/ui/")).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let csp = resp.headers()["content-security-policy"]
        .to_str()
        .unwrap()
        .to_string();
    assert!(csp.contains("script-src 'self'"), "{csp}");
    // An API key is not a human session.
    let auth = format!("Bearer {}", h.key);
    let (st, _, e) = raw(&h, &approve, &[("authorization", &auth)], Some(json!({}))).await;
    assert_eq!(
        (st, code(&e)),
        (StatusCode::UNAUTHORIZED, "human_session_required")
    );
    let (st, _, _) = raw(&h, "/ui/api/queue", &[("authorization", &auth)], None).await;
    assert_eq!(st, StatusCode::UNAUTHORIZED);
    // Login: JSON only; wrong passwords refused.
    let _ = h.human_session().await;
    let (st, _, e) = raw(
        &h,
        "/ui/login",
        &[],
        Some(json!({"username": "ops", "password": "wrong password 1"})),
    )
    .await;
    assert_eq!(
        (st, code(&e)),
        (StatusCode::UNAUTHORIZED, "invalid_credentials")
    );
    let (st, _, e) = raw(
        &h,
        "/ui/login",
        &[],
        Some(json!({"username": "nobody", "password": "operator password 1"})),
    )
    .await;
    assert_eq!(
        (st, code(&e)),
        (StatusCode::UNAUTHORIZED, "invalid_credentials")
    );
    let resp = h
        .client
        .post(h.url("/ui/login"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body("username=ops&password=operator+password+1")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);
    // Cookie attributes: HttpOnly, SameSite=Strict; Secure behind TLS.
    let (st, hs, s) = raw(
        &h,
        "/ui/login",
        &[],
        Some(json!({"username": "ops", "password": "operator password 1"})),
    )
    .await;
    assert_eq!(st, StatusCode::OK);
    let set = hs.get("set-cookie").unwrap().to_string();
    assert!(
        set.contains("HttpOnly") && set.contains("SameSite=Strict"),
        "{set}"
    );
    assert!(!set.contains("Secure"), "{set}");
    let (_, hs_tls, _) = raw(
        &h,
        "/ui/login",
        &[("x-forwarded-proto", "https")],
        Some(json!({"username": "ops", "password": "operator password 1"})),
    )
    .await;
    assert!(hs_tls.get("set-cookie").unwrap().contains("; Secure"));
    let cookie = set.split(';').next().unwrap().to_string();
    let csrf = s["csrfToken"].as_str().unwrap().to_string();
    // State changes without the CSRF token, or with another one: 403.
    for (path, hdrs) in [
        (approve.clone(), vec![("cookie", cookie.as_str())]),
        (
            approve.clone(),
            vec![("cookie", cookie.as_str()), ("x-csrf-token", "0000")],
        ),
        (
            format!("/internal/remediations/{id}/reject"),
            vec![("cookie", cookie.as_str())],
        ),
        ("/ui/logout".to_string(), vec![("cookie", cookie.as_str())]),
    ] {
        let (st, _, e) = raw(&h, &path, &hdrs, Some(json!({}))).await;
        assert_eq!(
            (st, code(&e)),
            (StatusCode::FORBIDDEN, "csrf_token_invalid"),
            "{path}"
        );
    }
    let (_, g) = h.get(&format!("/internal/remediations/{id}")).await;
    assert_eq!(
        g["proposal"]["status"], "pending_human_approval",
        "nothing happened"
    );
    // Reads need the session, not the token; the queue has no token.
    let (st, _, q) = raw(&h, "/ui/api/queue", &[("cookie", &cookie)], None).await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(q["items"][0]["id"], id.as_str());
    assert_eq!(
        q["items"][0]["finding"]["causalProofTier"],
        "corroborated_candidate"
    );
    // With it: approved, decided by the operator.
    let (st, _, a) = raw(
        &h,
        &approve,
        &[("cookie", &cookie), ("x-csrf-token", &csrf)],
        Some(json!({})),
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{a}");
    let token = a["grantToken"].as_str().unwrap().to_string();
    assert_eq!(a["proposal"]["decidedBy"], "user:ops");
    let (_, _, q) = raw(&h, "/ui/api/queue", &[("cookie", &cookie)], None).await;
    assert!(!q.to_string().contains(&token));
    // Logout ends the session; an expired session is refused too.
    let (st, _, _) = raw(
        &h,
        "/ui/logout",
        &[("cookie", &cookie), ("x-csrf-token", &csrf)],
        Some(json!({})),
    )
    .await;
    assert_eq!(st, StatusCode::OK);
    let (st, _, _) = raw(&h, "/ui/api/session", &[("cookie", &cookie)], None).await;
    assert_eq!(st, StatusCode::UNAUTHORIZED);
    let (c2, _) = h.human_session().await;
    let c2 = format!("pstack_session={c2}");
    let (st, _, _) = raw(&h, "/ui/api/session", &[("cookie", &c2)], None).await;
    assert_eq!(st, StatusCode::OK);
    h.clock.advance(Duration::from_secs(13 * 3600));
    let (st, _, _) = raw(&h, "/ui/api/session", &[("cookie", &c2)], None).await;
    assert_eq!(st, StatusCode::UNAUTHORIZED);
    // Throttle: five failures refuse the name, even with the right password,
    // until 15 minutes have passed.
    let good = json!({"username": "ops", "password": "operator password 1"});
    let bad = json!({"username": "ops", "password": "guess guess guess"});
    for _ in 0..5 {
        let (st, _, _) = raw(&h, "/ui/login", &[], Some(bad.clone())).await;
        assert_eq!(st, StatusCode::UNAUTHORIZED);
    }
    let (st, hs, e) = raw(&h, "/ui/login", &[], Some(good.clone())).await;
    assert_eq!(
        (st, code(&e)),
        (StatusCode::TOO_MANY_REQUESTS, "too_many_login_failures")
    );
    assert!(hs.get("retry-after").is_some());
    h.clock.advance(Duration::from_secs(15 * 60));
    let (st, _, _) = raw(&h, "/ui/login", &[], Some(good)).await;
    assert_eq!(st, StatusCode::OK);
    h.finish().await;
}

on_both_backends!(sessions_are_not_keys_and_need_csrf);

// ---- the browser ----

const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

struct Driver {
    child: Child,
    base: String,
    session: String,
    http: reqwest::Client,
    _profile: tempfile::TempDir,
}

impl Driver {
    async fn start() -> Option<Driver> {
        let bin = ["/usr/bin/chromedriver", "/usr/lib/chromium/chromedriver"]
            .into_iter()
            .find(|p| std::path::Path::new(p).exists());
        pstack_testkit::precondition(
            bin.is_some() && std::path::Path::new("/usr/bin/chromium").exists(),
            "chromium + chromium-driver not installed: run scripts/setup.d/70-chromium.sh",
        );
        let bin = bin?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        use std::os::unix::process::CommandExt;
        // Its own process group: Drop ends chromedriver and the browsers it
        // started, even when an assertion fails mid-test.
        let child = Command::new(bin)
            .process_group(0)
            .arg(format!("--port={port}"))
            .arg("--allowed-ips=127.0.0.1")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver");
        let http = reqwest::Client::builder().no_proxy().build().unwrap();
        let base = format!("http://127.0.0.1:{port}");
        for _ in 0..100 {
            if http.get(format!("{base}/status")).send().await.is_ok() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let profile = tempfile::tempdir().unwrap();
        // Loopback only: every other destination goes to a dead local proxy
        // and resolves to nothing; no background services.
        let args = vec![
            "--headless=new".to_string(),
            "--no-sandbox".into(),
            "--disable-gpu".into(),
            "--disable-dev-shm-usage".into(),
            "--no-first-run".into(),
            "--no-default-browser-check".into(),
            "--disable-background-networking".into(),
            "--disable-component-update".into(),
            "--disable-sync".into(),
            "--disable-extensions".into(),
            "--disable-default-apps".into(),
            "--no-pings".into(),
            "--metrics-recording-only".into(),
            "--proxy-server=http://127.0.0.1:9".into(),
            "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1".into(),
            format!("--user-data-dir={}", profile.path().display()),
        ];
        let resp: Value = http
            .post(format!("{base}/session"))
            .json(&json!({"capabilities": {"alwaysMatch": {
                "browserName": "chrome",
                "goog:chromeOptions": {"binary": "/usr/bin/chromium", "args": args}
            }}}))
            .send()
            .await
            .expect("new session")
            .json()
            .await
            .unwrap();
        let session = resp["value"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no WebDriver session: {resp}"))
            .to_string();
        Some(Driver {
            child,
            base,
            session,
            http,
            _profile: profile,
        })
    }

    async fn cmd(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let url = format!("{}/session/{}{path}", self.base, self.session);
        let mut req = self.http.request(method, url);
        if let Some(b) = body {
            req = req.json(&b);
        }
        let v: Value = req.send().await.unwrap().json().await.unwrap();
        v["value"].clone()
    }

    async fn go(&self, url: &str) {
        self.cmd(reqwest::Method::POST, "/url", Some(json!({"url": url})))
            .await;
    }

    async fn find(&self, css: &str) -> Option<String> {
        let v = self
            .cmd(
                reqwest::Method::POST,
                "/elements",
                Some(json!({"using": "css selector", "value": css})),
            )
            .await;
        v.as_array()?
            .first()?
            .get(ELEMENT)?
            .as_str()
            .map(str::to_string)
    }

    async fn wait(&self, css: &str) -> String {
        for _ in 0..150 {
            if let Some(e) = self.find(css).await {
                return e;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let raw = self
            .cmd(
                reqwest::Method::POST,
                "/elements",
                Some(json!({"using": "css selector", "value": css})),
            )
            .await;
        panic!("{css} never appeared ({raw}): {}", self.source().await);
    }

    async fn click(&self, css: &str) {
        let e = self.wait(css).await;
        self.cmd(
            reqwest::Method::POST,
            &format!("/element/{e}/click"),
            Some(json!({})),
        )
        .await;
    }

    async fn type_in(&self, css: &str, text: &str) {
        let e = self.wait(css).await;
        self.cmd(
            reqwest::Method::POST,
            &format!("/element/{e}/value"),
            Some(json!({"text": text})),
        )
        .await;
    }

    async fn text(&self, css: &str) -> String {
        let e = self.wait(css).await;
        self.cmd(reqwest::Method::GET, &format!("/element/{e}/text"), None)
            .await
            .as_str()
            .unwrap_or("")
            .to_string()
    }

    async fn source(&self) -> String {
        self.cmd(reqwest::Method::GET, "/source", None)
            .await
            .as_str()
            .unwrap_or("")
            .to_string()
    }

    /// End the browser session; Drop then ends the process group.
    async fn quit(self) {
        let _ = self
            .http
            .delete(format!("{}/session/{}", self.base, self.session))
            .send()
            .await;
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        if let Ok(pgid) = i32::try_from(self.child.id()) {
            // SAFETY: kill(2) on our own child's process group; no memory is touched.
            unsafe {
                libc::kill(-pgid, libc::SIGKILL);
            }
        }
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn chromium_approves_and_shows_the_token_once() {
    let Some(h) = Harness::start(Db::Sqlite).await else {
        return;
    };
    let Some(d) = Driver::start().await else {
        h.finish().await;
        return;
    };
    // A parked host-subject proposal citing a fresh sealed envelope (the
    // card renders its handoff), plus a service one.
    let inc = open_incident(&h, "browser").await;
    let (pre, pre_b) = crate::gate::grants::envelope_at(h.clock.now_ns(), 30, false);
    h.post_batch(&[pre_b]).await;
    let subject = h.store.envelope_meta(&pre).await.unwrap().unwrap().0;
    let f = finding(&h, &inc, "cohort_rate_isolated", "fp_browser").await;
    let (st, b) = post(
        &h,
        "/internal/remediations/propose",
        &json!({"incidentId": inc, "findingId": f, "action": "apply_config",
                "target": {"subject": subject}, "expectedCurrentState": {},
                "preMutationEnvelope": pre, "idempotencyKey": "browser"}),
    )
    .await;
    assert_eq!(st, StatusCode::CREATED, "{b}");
    assert_eq!(b["proposal"]["status"], "pending_human_approval");
    let id = b["proposal"]["id"].as_str().unwrap().to_string();
    let _ = h.human_session().await; // creates the operator "ops"

    d.go(&h.url("/ui/")).await;
    d.type_in("#username", "ops").await;
    d.type_in("#password", "operator password 1").await;
    d.click("#login-button").await;
    let row = format!("tr[data-proposal='{id}']");
    d.wait(&row).await;
    let card = d.text(&row).await;
    assert!(card.contains("cohort_rate_isolated"), "{card}");
    assert!(card.contains("pre-mutation"), "{card}");
    assert!(
        card.contains("completeness: complete"),
        "handoff rendered: {card}"
    );
    d.click(&format!("{row} button.approve")).await;
    d.click(&format!("{row} button.confirm-approve")).await;
    let mut token = String::new();
    for _ in 0..100 {
        token = d.text("#grant-token").await;
        if !token.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(token.starts_with("rgt_") && token.len() == 68, "{token:?}");
    let url = d.cmd(reqwest::Method::GET, "/url", None).await;
    assert!(
        url.as_str().unwrap().ends_with("#/autonomous-review"),
        "{url}"
    );
    // It is the real grant: the runner claims with it.
    let (st, c) = post(
        &h,
        &format!("/internal/remediations/{id}/grant"),
        &json!({"operation": "claim", "grantToken": token, "runnerId": "runner-1"}),
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{c}");
    // Reload: the session survives, the token does not.
    d.cmd(reqwest::Method::POST, "/refresh", Some(json!({})))
        .await;
    d.wait(&row).await;
    for _ in 0..50 {
        if d.text(&row).await.contains("claimed_executing") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(d.text(&row).await.contains("claimed_executing"));
    let src = d.source().await;
    assert!(!src.contains(&token), "the token survived a reload");
    assert!(!src.contains(&token[4..]));
    d.quit().await;
    h.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn users_create_stores_only_an_argon2_hash() {
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("s.db");
    let run = |name: &str, password: &str| {
        let mut child = Command::new(env!("CARGO_BIN_EXE_pstack-store"))
            .args(["--db", db.to_str().unwrap(), "users", "create", name])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(format!("{password}\n").as_bytes())
            .unwrap();
        child.wait_with_output().unwrap()
    };
    let out = run("alice", "a long passphrase 42");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !run("alice", "a long passphrase 42").status.success(),
        "duplicate name"
    );
    let short = run("bob", "short");
    assert!(!short.status.success());
    assert!(String::from_utf8_lossy(&short.stderr).contains("12 characters"));
    let store = pstack_store_core::db::Store::open(db.to_str().unwrap(), &Default::default())
        .await
        .unwrap();
    let phc = store.operator_hash("alice").await.unwrap().unwrap();
    assert!(phc.starts_with("$argon2id$") && !phc.contains("passphrase"));
    assert!(pstack_store_core::operators::verify_password(
        "a long passphrase 42",
        &phc
    ));
    store.close().await;
}
