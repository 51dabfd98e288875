//! Operator accounts and the login throttle (issue 28): the throttle lives
//! in the database and two replicas on one database share it; a full table
//! evicts instead of clearing; a lockout at one source leaves the operator
//! free at another; `users disable|enable|passwd|revoke-sessions` end
//! sessions; CSRF tokens are stored only hashed.
//!
//! Each test runs two store servers ("replicas") in this process on one
//! database (one SQLite file; one PostgreSQL schema), each with its own pool,
//! sharing a clock. Both trust 127.0.0.1 as a proxy, so a test picks the
//! client source of each login with `X-Forwarded-For`.

use std::process::{Command, Stdio};
use std::time::Duration;

use pstack_store::http::AppState;
use pstack_store::service::serve;
use pstack_store_core::clock::Clock;
use pstack_store_core::db::{OpenOptions, Store};
use pstack_store_core::ingest::IngestLimits;
use pstack_store_core::login::{ClientSource, LoginControls, LoginLimits, ThrottleKeys};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::on_both_backends;
use crate::support::{Db, code, drop_schema, fresh_store};

const PASSWORD: &str = "operator password 1";
const WRONG: &str = "not the password at all";

struct Replica {
    base: String,
    store: Store,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
}

struct Replicas {
    r: [Replica; 2],
    clock: Clock,
    limits: LoginLimits,
    client: reqwest::Client,
    /// The SQLite file (SQLite runs only).
    sqlite_path: Option<std::path::PathBuf>,
    _dir: Option<tempfile::TempDir>,
    pg: Option<(String, String)>,
}

/// A login's outcome: status, error code (or ""), Retry-After, cookie value,
/// CSRF token.
struct Login {
    status: StatusCode,
    code: String,
    retry_after: Option<u64>,
    cookie: Option<String>,
    csrf: Option<String>,
}

impl Replicas {
    async fn start(db: Db, limits: LoginLimits) -> Option<Replicas> {
        let (store_a, dir, pg) = fresh_store(db).await?;
        let sqlite_path = dir.as_ref().map(|d| d.path().join("store.db"));
        let store_b = match (&sqlite_path, &pg) {
            (Some(path), _) => Store::open(path.to_str().unwrap(), &OpenOptions::default())
                .await
                .expect("second store on the SQLite file"),
            (None, Some((url, schema))) => Store::open(
                url,
                &OpenOptions {
                    pg_schema: Some(schema.clone()),
                    pg_max_connections: 8,
                    ..OpenOptions::default()
                },
            )
            .await
            .expect("second store on the PostgreSQL schema"),
            (None, None) => unreachable!("a fresh store is SQLite or PostgreSQL"),
        };
        let clock = Clock::system();
        let mut replicas = Vec::new();
        for store in [store_a, store_b] {
            let mut state = AppState::new(store.clone(), IngestLimits::default());
            state.clock = clock.clone();
            state.login = LoginControls::new(limits, vec!["127.0.0.1".parse().unwrap()]);
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            let (tx, rx) = tokio::sync::oneshot::channel::<()>();
            let task = tokio::spawn(serve(listener, state, async move {
                let _ = rx.await;
            }));
            replicas.push(Replica {
                base: format!("http://{addr}"),
                store,
                stop: Some(tx),
                task: Some(task),
            });
        }
        let [a, b]: [Replica; 2] = replicas.try_into().ok().unwrap();
        a.store
            .create_operator(
                "alice",
                &pstack_store_core::operators::hash_password(PASSWORD).unwrap(),
                pstack_store_core::now_ns(),
            )
            .await
            .unwrap();
        Some(Replicas {
            r: [a, b],
            clock,
            limits,
            client: reqwest::Client::new(),
            sqlite_path,
            _dir: dir,
            pg,
        })
    }

    /// Log in at replica `i` as `user` from client address `source`.
    async fn login(&self, i: usize, user: &str, password: &str, source: &str) -> Login {
        let resp = self
            .client
            .post(format!("{}/ui/login", self.r[i].base))
            .header("x-forwarded-for", source)
            .json(&json!({"username": user, "password": password}))
            .send()
            .await
            .unwrap();
        let status = resp.status();
        let retry_after = resp
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok());
        let cookie = resp
            .headers()
            .get("set-cookie")
            .and_then(|v| v.to_str().ok())
            .and_then(|c| c.split(';').next())
            .and_then(|kv| kv.strip_prefix("pstack_session="))
            .map(str::to_string);
        let body: Value = resp.json().await.unwrap_or(Value::Null);
        Login {
            status,
            code: code(&body).to_string(),
            retry_after,
            cookie,
            csrf: body["csrfToken"].as_str().map(str::to_string),
        }
    }

    /// `/ui/api/session` at replica `i` with this cookie: the status.
    async fn session(&self, i: usize, cookie: &str) -> (StatusCode, Value) {
        let resp = self
            .client
            .get(format!("{}/ui/api/session", self.r[i].base))
            .header("cookie", format!("pstack_session={cookie}"))
            .send()
            .await
            .unwrap();
        let st = resp.status();
        (st, resp.json().await.unwrap_or(Value::Null))
    }

    /// Failures counted on the throttle key of `kind` for (`user`, `source`).
    async fn count(&self, kind: &str, user: &str, source: &str) -> Option<i64> {
        let keys = ThrottleKeys::new(user, &resolved(source));
        let key = match kind {
            "source" => keys.source,
            "pair" => keys.pair,
            "name" => keys.name,
            _ => unreachable!(),
        };
        self.r[1]
            .store
            .login_throttle_failures(&key, &self.limits, self.clock.now_ns())
            .await
            .unwrap()
    }

    async fn finish(mut self) {
        for r in &mut self.r {
            if let Some(tx) = r.stop.take() {
                let _ = tx.send(());
            }
            if let Some(t) = r.task.take() {
                let _ = t.await;
            }
            r.store.close().await;
        }
        drop_schema(self.pg.take()).await;
    }
}

/// The source the store derives for a client at `addr` behind the trusted
/// loopback proxy.
fn resolved(addr: &str) -> ClientSource {
    ClientSource::resolve(
        Some("127.0.0.1".parse().unwrap()),
        std::iter::once(addr),
        &["127.0.0.1".parse().unwrap()],
    )
}

fn assert_refused(l: &Login, code: &str) {
    assert_eq!(
        (l.status, l.code.as_str()),
        (StatusCode::TOO_MANY_REQUESTS, code)
    );
    assert!(
        l.retry_after.is_some_and(|s| s >= 1),
        "429 {code} without Retry-After"
    );
}

// Regression (issue 28): the throttle was per process (N replicas allowed
// 5N guesses) and five anonymous failures locked a name out from everywhere.
async fn failures_on_one_replica_count_on_the_other_and_lock_only_their_source(db: Db) {
    let Some(rs) = Replicas::start(db, LoginLimits::default()).await else {
        return;
    };
    let (s1, s2) = ("198.51.100.1", "198.51.100.2");
    // Below the threshold: four failures (on both replicas), then the right
    // password from the same source still logs in.
    for i in 0..4 {
        let l = rs.login(i % 2, "alice", WRONG, s1).await;
        assert_eq!(
            (l.status, l.code.as_str()),
            (StatusCode::UNAUTHORIZED, "invalid_credentials")
        );
    }
    assert_eq!(rs.count("pair", "alice", s1).await, Some(4));
    assert_eq!(
        rs.login(1, "alice", PASSWORD, s1).await.status,
        StatusCode::OK
    );
    assert_eq!(
        rs.count("pair", "alice", s1).await,
        None,
        "a success forgets the pair"
    );
    // At the threshold: five failures, alternating replicas (3 on A, 2 on
    // B); each replica alone has seen fewer than five.
    for i in 0..5 {
        let l = rs.login(i % 2, "alice", WRONG, s1).await;
        assert_eq!(l.status, StatusCode::UNAUTHORIZED, "failure {i}");
    }
    assert_eq!(rs.count("pair", "alice", s1).await, Some(5));
    // Above it: the right password from s1 is refused on either replica.
    for i in [1, 0] {
        let l = rs.login(i, "alice", PASSWORD, s1).await;
        assert_refused(&l, "too_many_login_failures");
        assert!(l.retry_after.unwrap() <= 15 * 60);
    }
    // Another source is not locked out, on either replica.
    for i in [0, 1] {
        let l = rs.login(i, "alice", PASSWORD, s2).await;
        assert_eq!(l.status, StatusCode::OK, "{}", l.code);
        assert!(l.cookie.is_some());
    }
    // The window passes: s1 logs in again.
    rs.clock.advance(Duration::from_secs(15 * 60));
    assert_eq!(
        rs.login(0, "alice", PASSWORD, s1).await.status,
        StatusCode::OK
    );
    rs.finish().await;
}

// Regression (issue 28): anonymous requests could lock an operator out
// from everywhere. The per-name budget refuses only sources the operator
// has not logged in from.
async fn the_name_budget_refuses_unknown_sources_only(db: Db) {
    let limits = LoginLimits {
        name_failures: 6,
        ..LoginLimits::default()
    };
    let Some(rs) = Replicas::start(db, limits).await else {
        return;
    };
    let known = "203.0.113.10";
    assert_eq!(
        rs.login(0, "alice", PASSWORD, known).await.status,
        StatusCode::OK
    );
    // Five strangers fail once each (below the budget of 6).
    for i in 0..5 {
        let l = rs
            .login(i % 2, "alice", WRONG, &format!("192.0.2.{}", 1 + i))
            .await;
        assert_eq!(l.status, StatusCode::UNAUTHORIZED);
    }
    assert_eq!(rs.count("name", "alice", "192.0.2.1").await, Some(5));
    // A new source with the right password: the 6th charge, at the budget,
    // is allowed (and refunded on success).
    let fresh = "203.0.113.20";
    assert_eq!(
        rs.login(1, "alice", PASSWORD, fresh).await.status,
        StatusCode::OK
    );
    assert_eq!(rs.count("name", "alice", fresh).await, Some(5));
    // One more stranger: 6, at the budget; verified, refused as wrong.
    assert_eq!(
        rs.login(0, "alice", WRONG, "192.0.2.6").await.status,
        StatusCode::UNAUTHORIZED
    );
    // Above the budget: a new source is refused even with the password...
    let l = rs.login(1, "alice", PASSWORD, "203.0.113.30").await;
    assert_refused(&l, "login_user_throttled");
    // ...but the sources alice has logged in from are not.
    assert_eq!(
        rs.login(0, "alice", PASSWORD, known).await.status,
        StatusCode::OK
    );
    assert_eq!(
        rs.login(1, "alice", PASSWORD, fresh).await.status,
        StatusCode::OK
    );
    // Another name is untouched.
    assert_eq!(rs.count("name", "bob", known).await, None);
    rs.finish().await;
}

// One address spraying names is refused for every name, itself only.
async fn one_source_spraying_names_is_refused_for_all_names(db: Db) {
    let limits = LoginLimits {
        source_failures: 6,
        ..LoginLimits::default()
    };
    let Some(rs) = Replicas::start(db, limits).await else {
        return;
    };
    let sprayer = "198.51.100.66";
    for i in 0..6 {
        let l = rs.login(i % 2, &format!("user{i}"), WRONG, sprayer).await;
        assert_eq!(l.status, StatusCode::UNAUTHORIZED, "attempt {i}");
    }
    assert_eq!(rs.count("source", "x", sprayer).await, Some(6));
    let l = rs.login(0, "alice", PASSWORD, sprayer).await;
    assert_refused(&l, "login_source_throttled");
    assert_eq!(
        rs.login(1, "alice", PASSWORD, "198.51.100.67").await.status,
        StatusCode::OK
    );
    rs.finish().await;
}

// Regression (issue 28): at 10,000 names the in-memory table was cleared,
// so junk failures bought fresh guesses at a real name. Now the table is
// bounded by eviction: rows whose window passed go first, then junk evicts
// junk, oldest first; a real name's count survives and still locks.
async fn a_full_throttle_table_evicts_junk_oldest_first_and_keeps_counts(db: Db) {
    let limits = LoginLimits {
        max_entries: 40,
        evict_check_every: 1,
        ..LoginLimits::default()
    };
    let Some(rs) = Replicas::start(db, limits).await else {
        return;
    };
    // Four failures whose window then passes: the first rows to go, though
    // they count more failures than any junk.
    let stale = "198.51.100.99";
    for i in 0..4 {
        assert_eq!(
            rs.login(i % 2, "olduser", WRONG, stale).await.status,
            StatusCode::UNAUTHORIZED
        );
    }
    rs.clock.advance(Duration::from_secs(16 * 60));
    let s1 = "198.51.100.1";
    for i in 0..3 {
        assert_eq!(
            rs.login(i % 2, "alice", WRONG, s1).await.status,
            StatusCode::UNAUTHORIZED
        );
    }
    // 20 junk names from 20 addresses: 60 rows of one failure each, past
    // the bound of 40.
    let junk = |i: usize| (format!("junk{i}"), format!("10.1.0.{}", i + 1));
    for i in 0..20 {
        let (name, src) = junk(i);
        assert_eq!(
            rs.login(i % 2, &name, WRONG, &src).await.status,
            StatusCode::UNAUTHORIZED
        );
    }
    // Each eviction goes 1/16 below the bound (40 - 2).
    let rows = rs.r[0].store.login_throttle_rows().await.unwrap();
    assert!(
        (38..=40).contains(&rows),
        "{rows} rows: bounded, not cleared"
    );
    assert_eq!(rs.count("pair", "alice", s1).await, Some(3));
    assert_eq!(rs.count("name", "alice", s1).await, Some(3));
    assert_eq!(rs.count("source", "alice", s1).await, Some(3));
    let keys: Vec<(String,)> = raw_rows(&rs, "SELECT throttle_key FROM login_throttle").await;
    let stale_keys = ThrottleKeys::new("olduser", &resolved(stale));
    for gone in [&stale_keys.source, &stale_keys.pair, &stale_keys.name] {
        assert!(!keys.iter().any(|(k,)| k == gone), "expired {gone} kept");
    }
    // The oldest junk went, the newest stayed.
    let (old, old_src) = junk(0);
    let (new, new_src) = junk(19);
    assert_eq!(rs.count("name", &old, &old_src).await, None);
    assert_eq!(rs.count("pair", &old, &old_src).await, None);
    assert_eq!(rs.count("name", &new, &new_src).await, Some(1));
    assert_eq!(rs.count("pair", &new, &new_src).await, Some(1));
    // The survivor still locks at five: two more failures, then refused.
    for i in 0..2 {
        assert_eq!(
            rs.login(i, "alice", WRONG, s1).await.status,
            StatusCode::UNAUTHORIZED
        );
    }
    assert_refused(
        &rs.login(0, "alice", PASSWORD, s1).await,
        "too_many_login_failures",
    );
    rs.finish().await;
}

/// Rows of `sql`, read with a connection of the test's own (not the
/// store's API).
async fn raw_rows<T>(rs: &Replicas, sql: &str) -> Vec<T>
where
    T: Send
        + Unpin
        + for<'r> sqlx::FromRow<'r, sqlx::sqlite::SqliteRow>
        + for<'r> sqlx::FromRow<'r, sqlx::postgres::PgRow>,
{
    use sqlx::Connection;
    match (&rs.sqlite_path, &rs.pg) {
        (Some(path), _) => {
            let mut c = sqlx::SqliteConnection::connect(&format!("sqlite://{}", path.display()))
                .await
                .unwrap();
            sqlx::query_as(sql).fetch_all(&mut c).await.unwrap()
        }
        (None, Some((url, schema))) => {
            let mut c = sqlx::PgConnection::connect(url).await.unwrap();
            sqlx::query(&format!("SET search_path TO {schema}"))
                .execute(&mut c)
                .await
                .unwrap();
            sqlx::query_as(sql).fetch_all(&mut c).await.unwrap()
        }
        (None, None) => unreachable!(),
    }
}

/// The `operator_sessions` rows: (username, id_hash, csrf_hash).
async fn session_rows(rs: &Replicas) -> Vec<(String, String, String)> {
    raw_rows(
        rs,
        "SELECT username, id_hash, csrf_hash FROM operator_sessions",
    )
    .await
}

fn sha256_hex(s: &str) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(s.as_bytes()))
}

// Regression (issue 28): CSRF tokens were stored in the clear, and an
// operator could not be disabled, given a new password or logged out
// everywhere.
async fn disable_passwd_and_revoke_end_sessions_and_csrf_is_stored_hashed(db: Db) {
    let Some(rs) = Replicas::start(db, LoginLimits::default()).await else {
        return;
    };
    let src = "198.51.100.5";
    let first = rs.login(0, "alice", PASSWORD, src).await;
    assert_eq!(first.status, StatusCode::OK);
    let (cookie, csrf) = (first.cookie.unwrap(), first.csrf.unwrap());
    // The database holds the SHA-256 of the session id and of the token,
    // never either in the clear.
    let rows = session_rows(&rs).await;
    assert_eq!(rows.len(), 1);
    let (user, id_hash, csrf_hash) = &rows[0];
    assert_eq!(user, "alice");
    assert_eq!(id_hash, &sha256_hex(&cookie));
    assert_eq!(csrf_hash, &sha256_hex(&csrf));
    assert!(!csrf_hash.contains(&csrf) && !id_hash.contains(&cookie));
    // The page gets its token back from the cookie alone (after a reload),
    // and the token works for a state-changing request.
    let (st, s) = rs.session(1, &cookie).await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(s["csrfToken"].as_str(), Some(csrf.as_str()));
    let logout = |cookie: String, token: String, i: usize| {
        let client = rs.client.clone();
        let url = format!("{}/ui/logout", rs.r[i].base);
        async move {
            client
                .post(url)
                .header("cookie", format!("pstack_session={cookie}"))
                .header("x-csrf-token", token)
                .send()
                .await
                .unwrap()
                .status()
        }
    };
    assert_eq!(
        logout(cookie.clone(), "0".repeat(64), 0).await,
        StatusCode::FORBIDDEN,
        "a wrong token"
    );
    assert_eq!(
        logout(cookie.clone(), csrf_hash.clone(), 0).await,
        StatusCode::FORBIDDEN,
        "the stored hash is not the token"
    );

    // Disable: the live session stops at once, on both replicas; the right
    // password gets 403 operator_disabled; a wrong one the usual 401.
    let store = &rs.r[1].store;
    let now = rs.clock.now_ns();
    assert_eq!(
        store
            .set_operator_disabled("alice", true, now)
            .await
            .unwrap(),
        pstack_store_core::db::operators::OperatorChange::Done { sessions_ended: 1 }
    );
    for i in [0, 1] {
        assert_eq!(rs.session(i, &cookie).await.0, StatusCode::UNAUTHORIZED);
    }
    let l = rs.login(0, "alice", PASSWORD, src).await;
    assert_eq!(
        (l.status, l.code.as_str()),
        (StatusCode::FORBIDDEN, "operator_disabled")
    );
    assert!(l.cookie.is_none());
    assert_eq!(
        rs.login(0, "alice", WRONG, src).await.status,
        StatusCode::UNAUTHORIZED
    );
    // A session row planted for a disabled operator does not authenticate.
    let (planted, planted_hash, planted_csrf) =
        pstack_store_core::operators::new_session().unwrap();
    store
        .create_session(
            &planted_hash,
            "alice",
            &pstack_store_core::operators::csrf_hash(&planted_csrf),
            now,
            now + pstack_store_core::operators::SESSION_NS,
        )
        .await
        .unwrap();
    assert_eq!(rs.session(0, &planted).await.0, StatusCode::UNAUTHORIZED);
    // Enable: a new login works (the planted session too: it is live).
    assert_eq!(
        store
            .set_operator_disabled("alice", false, now)
            .await
            .unwrap(),
        pstack_store_core::db::operators::OperatorChange::Done { sessions_ended: 0 }
    );
    let second = rs.login(1, "alice", PASSWORD, src).await;
    assert_eq!(second.status, StatusCode::OK);
    let second = second.cookie.unwrap();
    assert_eq!(rs.session(0, &second).await.0, StatusCode::OK);

    // Passwd: every session ends; the old password stops, the new works.
    let new_hash = pstack_store_core::operators::hash_password("a brand new passphrase").unwrap();
    assert_eq!(
        store
            .set_operator_password("alice", &new_hash)
            .await
            .unwrap(),
        pstack_store_core::db::operators::OperatorChange::Done { sessions_ended: 2 }
    );
    assert_eq!(rs.session(0, &second).await.0, StatusCode::UNAUTHORIZED);
    assert_eq!(rs.session(1, &planted).await.0, StatusCode::UNAUTHORIZED);
    assert_eq!(
        rs.login(0, "alice", PASSWORD, src).await.status,
        StatusCode::UNAUTHORIZED
    );
    let third = rs.login(0, "alice", "a brand new passphrase", src).await;
    assert_eq!(third.status, StatusCode::OK);
    let third = third.cookie.unwrap();

    // Revoke: the session ends; the operator can log in again.
    assert_eq!(
        store.revoke_operator_sessions("alice").await.unwrap(),
        pstack_store_core::db::operators::OperatorChange::Done { sessions_ended: 1 }
    );
    assert_eq!(rs.session(1, &third).await.0, StatusCode::UNAUTHORIZED);
    assert_eq!(
        store.revoke_operator_sessions("nobody").await.unwrap(),
        pstack_store_core::db::operators::OperatorChange::NoSuchOperator
    );
    assert_eq!(
        store
            .set_operator_disabled("nobody", true, now)
            .await
            .unwrap(),
        pstack_store_core::db::operators::OperatorChange::NoSuchOperator
    );
    rs.finish().await;
}

on_both_backends!(
    failures_on_one_replica_count_on_the_other_and_lock_only_their_source,
    the_name_budget_refuses_unknown_sources_only,
    one_source_spraying_names_is_refused_for_all_names,
    a_full_throttle_table_evicts_junk_oldest_first_and_keeps_counts,
    disable_passwd_and_revoke_end_sessions_and_csrf_is_stored_hashed,
);

/// Run `pstack-store --db DB users ARGS…` with `stdin` as its input.
fn users(db: &std::path::Path, args: &[&str], stdin: &str) -> std::process::Output {
    use std::io::Write;
    let mut child = Command::new(env!("CARGO_BIN_EXE_pstack-store"))
        .arg("--db")
        .arg(db)
        .arg("users")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

// The operator commands of the real binary, against a database a running
// server uses: each takes effect on the server's next request.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn users_cli_disables_enables_changes_passwords_and_revokes_sessions() {
    let Some(rs) = Replicas::start(Db::Sqlite, LoginLimits::default()).await else {
        return;
    };
    let db = rs.sqlite_path.clone().unwrap();
    let src = "198.51.100.9";
    let ok = |o: &std::process::Output| {
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stderr).to_string()
    };
    let cookie = rs.login(0, "alice", PASSWORD, src).await.cookie.unwrap();
    assert_eq!(rs.session(0, &cookie).await.0, StatusCode::OK);

    let said = ok(&users(&db, &["disable", "alice"], ""));
    assert!(said.contains("1 session(s) ended"), "{said}");
    assert_eq!(rs.session(0, &cookie).await.0, StatusCode::UNAUTHORIZED);
    assert_eq!(
        rs.login(1, "alice", PASSWORD, src).await.code,
        "operator_disabled"
    );
    let listed: Value =
        serde_json::from_slice(&users(&db, &["list", "--json"], "").stdout).unwrap();
    assert_eq!(listed[0]["username"], "alice");
    assert!(listed[0]["disabledAt"].is_string(), "{listed}");

    ok(&users(&db, &["enable", "alice"], ""));
    let cookie = rs.login(1, "alice", PASSWORD, src).await.cookie.unwrap();
    assert_eq!(rs.session(0, &cookie).await.0, StatusCode::OK);

    let short = users(&db, &["passwd", "alice"], "short\n");
    assert!(!short.status.success());
    assert!(String::from_utf8_lossy(&short.stderr).contains("12 characters"));
    assert_eq!(
        rs.session(0, &cookie).await.0,
        StatusCode::OK,
        "a refused passwd changes nothing"
    );
    let said = ok(&users(&db, &["passwd", "alice"], "the second passphrase\n"));
    assert!(said.contains("1 session(s) ended"), "{said}");
    assert_eq!(rs.session(0, &cookie).await.0, StatusCode::UNAUTHORIZED);
    assert_eq!(
        rs.login(0, "alice", PASSWORD, src).await.status,
        StatusCode::UNAUTHORIZED
    );
    let cookie = rs
        .login(0, "alice", "the second passphrase", src)
        .await
        .cookie
        .unwrap();

    ok(&users(&db, &["revoke-sessions", "alice"], ""));
    assert_eq!(rs.session(1, &cookie).await.0, StatusCode::UNAUTHORIZED);

    for cmd in ["disable", "enable", "revoke-sessions"] {
        let o = users(&db, &[cmd, "nobody"], "");
        assert!(!o.status.success());
        assert!(
            String::from_utf8_lossy(&o.stderr).contains("no operator named \"nobody\""),
            "{cmd}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    rs.finish().await;
}
