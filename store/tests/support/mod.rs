//! Test harness: a real `pstack-store` HTTP server on 127.0.0.1:0 over a real
//! database — a fresh SQLite file, or a fresh schema in the PostgreSQL server
//! at `PSTACK_TEST_PG_URL` (default [`DEFAULT_PG_URL`], which
//! `scripts/setup.d/20-postgres.sh` makes work). PostgreSQL unreachable: with
//! `PSTACK_STRICT=1` or `CI=true` the test fails; otherwise it reports a skip
//! (stderr and the skip log, see pstack-testkit) and returns.

use std::io::Write;

use pstack_store::http::{AppState, IngestResponse};
use pstack_store::service::serve;
use pstack_store_core::db::{OpenOptions, Store};
use pstack_store_core::ingest::IngestLimits;
use pstack_store_core::keys::{Scope, ScopeSet};
use pstack_store_core::synthetic::Capture;
use reqwest::StatusCode;
use serde_json::Value;

/// The URL the setup script provisions.
pub const DEFAULT_PG_URL: &str = "postgres://pstack:pstack@127.0.0.1:5432/pstack_test";

/// Which database a test runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Db {
    Sqlite,
    Postgres,
}

/// Run a test body once per backend, as two named tests.
#[macro_export]
macro_rules! on_both_backends {
    ($($name:ident),* $(,)?) => {
        $(
            mod $name {
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn sqlite() {
                    super::$name($crate::support::Db::Sqlite).await
                }
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn postgres() {
                    super::$name($crate::support::Db::Postgres).await
                }
            }
        )*
    };
}

pub struct Harness {
    /// An operator session (cookie value, CSRF token), made on first use.
    pub human: std::sync::Mutex<Option<(String, String)>>,
    /// The server's clock (tests move it instead of sleeping).
    pub clock: pstack_store_core::clock::Clock,
    pub base: String,
    /// A `legacy` key (every scope, as keys made before scopes): what the
    /// tests that predate scopes act with.
    pub key: String,
    pub key_id: String,
    /// A `runner` key: claims, completes and fails grants (an autonomous
    /// grant is never claimed by the key that proposed it).
    pub runner_key: String,
    pub store: Store,
    /// The SQLite database file (SQLite harnesses only): for a second
    /// process on the same store (`pstack-store mcp`).
    pub sqlite_path: Option<String>,
    pub client: reqwest::Client,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    server: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
    _dir: Option<tempfile::TempDir>,
    pg: Option<(String, String)>,
}

/// The URL without its password, for messages.
fn redacted(url: &str) -> String {
    match (url.find("://"), url.find('@')) {
        (Some(s), Some(at)) if at > s => {
            let userinfo = &url[s + 3..at];
            let user = userinfo.split(':').next().unwrap_or("");
            format!("{}{user}:***{}", &url[..s + 3], &url[at..])
        }
        _ => url.to_string(),
    }
}

fn pg_url() -> String {
    std::env::var("PSTACK_TEST_PG_URL").unwrap_or_else(|_| DEFAULT_PG_URL.to_string())
}

/// Open a fresh store on `db`, or `None` (PostgreSQL unreachable, not CI).
pub async fn fresh_store(
    db: Db,
) -> Option<(Store, Option<tempfile::TempDir>, Option<(String, String)>)> {
    match db {
        Db::Sqlite => {
            let dir = tempfile::tempdir().expect("tempdir");
            let path = dir.path().join("store.db");
            let store = Store::open(path.to_str().expect("utf-8 path"), &OpenOptions::default())
                .await
                .expect("open sqlite store");
            Some((store, Some(dir), None))
        }
        Db::Postgres => {
            let url = pg_url();
            let schema = format!("t_{}", hex::encode(rand_bytes()));
            let opts = OpenOptions {
                pg_schema: Some(schema.clone()),
                pg_max_connections: 8,
                ..OpenOptions::default()
            };
            let opened =
                tokio::time::timeout(std::time::Duration::from_secs(15), Store::open(&url, &opts))
                    .await;
            match opened {
                Ok(Ok(store)) => Some((store, None, Some((url, schema)))),
                other => {
                    let shown = redacted(&url);
                    let why = match other {
                        Ok(Err(e)) => e.to_string(),
                        Err(_) => "timed out after 15 s".to_string(),
                        Ok(Ok(_)) => unreachable!(),
                    };
                    // Under PSTACK_STRICT=1 / CI=true this panics with the reason; otherwise
                    // it is a reported, logged skip (pstack-testkit).
                    pstack_testkit::precondition(
                        false,
                        &format!(
                            "PostgreSQL unreachable at {shown}: {why}; run scripts/setup.d/20-postgres.sh or set PSTACK_TEST_PG_URL"
                        ),
                    );
                    None
                }
            }
        }
    }
}

/// Drop a test schema made by [`fresh_store`].
pub async fn drop_schema(pg: Option<(String, String)>) {
    use sqlx::Connection;
    if let Some((url, schema)) = pg
        && let Ok(mut c) = sqlx::PgConnection::connect(&url).await
    {
        let _ = sqlx::query(&format!("DROP SCHEMA {schema} CASCADE"))
            .execute(&mut c)
            .await;
        let _ = c.close().await;
    }
}

/// A connection of its own to the database of a store made by
/// [`fresh_store`], outside the store (to age a store back to an older
/// schema, damage it, or read what it wrote).
pub enum RawDb {
    Sqlite(sqlx::SqliteConnection),
    Postgres(sqlx::PgConnection),
}

impl RawDb {
    pub async fn connect(dir: &Option<tempfile::TempDir>, pg: &Option<(String, String)>) -> RawDb {
        use sqlx::Connection;
        match (dir, pg) {
            (Some(d), _) => {
                let url = format!("sqlite://{}", d.path().join("store.db").display());
                RawDb::Sqlite(sqlx::SqliteConnection::connect(&url).await.unwrap())
            }
            (_, Some((url, schema))) => {
                let mut c = sqlx::PgConnection::connect(url).await.unwrap();
                sqlx::raw_sql(&format!("SET search_path TO {schema}"))
                    .execute(&mut c)
                    .await
                    .unwrap();
                RawDb::Postgres(c)
            }
            _ => unreachable!("a fresh store has a file or a schema"),
        }
    }

    pub async fn close(self) {
        use sqlx::Connection;
        match self {
            RawDb::Sqlite(c) => c.close().await.unwrap(),
            RawDb::Postgres(c) => c.close().await.unwrap(),
        }
    }
}

/// Run `sql` on a store's database through a [`RawDb`].
pub async fn run_sql(dir: &Option<tempfile::TempDir>, pg: &Option<(String, String)>, sql: &str) {
    let mut db = RawDb::connect(dir, pg).await;
    match &mut db {
        RawDb::Sqlite(c) => sqlx::raw_sql(sql).execute(c).await.map(drop),
        RawDb::Postgres(c) => sqlx::raw_sql(sql).execute(c).await.map(drop),
    }
    .unwrap();
    db.close().await;
}

/// A synthetic capture through ingest's verification, as ingest stores it.
pub fn verified(c: &Capture) -> pstack_store_core::ingest::VerifiedItem {
    use pstack_store_core::ingest::{ItemVerdict, verify_item};
    match verify_item(c.bytes().unwrap().1.into(), &IngestLimits::default()) {
        ItemVerdict::Verified(v) => *v,
        ItemVerdict::Rejected(r) => panic!("fixture rejected: {:?}", r.reasons),
    }
}

/// Open again the store [`fresh_store`] made (its migrations run again).
pub async fn reopen(dir: &Option<tempfile::TempDir>, pg: &Option<(String, String)>) -> Store {
    let url = match (dir, pg) {
        (Some(d), _) => d.path().join("store.db").to_str().unwrap().to_string(),
        (_, Some((url, _))) => url.clone(),
        _ => unreachable!("a fresh store has a file or a schema"),
    };
    let opts = OpenOptions {
        pg_schema: pg.as_ref().map(|(_, s)| s.clone()),
        ..Default::default()
    };
    Store::open(&url, &opts).await.unwrap()
}

fn rand_bytes() -> [u8; 6] {
    let mut b = [0u8; 6];
    getrandom::fill(&mut b).expect("random");
    b
}

impl Harness {
    pub async fn start(db: Db) -> Option<Harness> {
        Harness::start_with(db, IngestLimits::default()).await
    }

    pub async fn start_with(db: Db, limits: IngestLimits) -> Option<Harness> {
        Harness::start_custom(db, limits, |_| {}).await
    }

    /// A harness whose server state `configure` adjusts first (gate knobs).
    pub async fn start_custom(
        db: Db,
        limits: IngestLimits,
        configure: impl FnOnce(&mut AppState),
    ) -> Option<Harness> {
        let (store, dir, pg) = fresh_store(db).await?;
        let sqlite_path = dir
            .as_ref()
            .map(|d| d.path().join("store.db").to_string_lossy().into_owned());
        let key = store
            .create_key("test-node", &ScopeSet::legacy())
            .await
            .expect("create key");
        let runner_key = store
            .create_key("test-runner", &ScopeSet::of([Scope::Runner]))
            .await
            .expect("create runner key");
        let mut state = AppState::new(store.clone(), limits);
        configure(&mut state);
        let clock = state.clock.clone();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve(listener, state, async move {
            let _ = rx.await;
        }));
        Some(Harness {
            human: std::sync::Mutex::new(None),
            clock,
            base: format!("http://{addr}"),
            key: key.plaintext,
            key_id: key.id,
            runner_key: runner_key.plaintext,
            store,
            sqlite_path,

            client: reqwest::Client::builder()
                .no_gzip()
                .build()
                .expect("client"),
            shutdown: Some(tx),
            server: Some(server),
            _dir: dir,
            pg,
        })
    }

    /// Log an operator in through `/ui/login` (created in the database on
    /// first use): (session cookie value, CSRF token).
    pub async fn human_session(&self) -> (String, String) {
        if let Some(s) = self.human.lock().unwrap().clone() {
            return s;
        }
        let hash = pstack_store_core::operators::hash_password("operator password 1").unwrap();
        let _ = self
            .store
            .create_operator("ops", &hash, pstack_store_core::now_ns())
            .await
            .unwrap();
        let resp = self
            .client
            .post(self.url("/ui/login"))
            .json(&serde_json::json!({"username": "ops", "password": "operator password 1"}))
            .send()
            .await
            .expect("login");
        assert_eq!(resp.status(), StatusCode::OK);
        let cookie = resp
            .headers()
            .get("set-cookie")
            .and_then(|v| v.to_str().ok())
            .and_then(|c| c.split(';').next())
            .and_then(|kv| kv.strip_prefix("pstack_session="))
            .expect("session cookie")
            .to_string();
        let body: Value = resp.json().await.unwrap();
        let s = (cookie, body["csrfToken"].as_str().unwrap().to_string());
        *self.human.lock().unwrap() = Some(s.clone());
        s
    }

    /// A fresh key holding `scopes`: (plaintext, id).
    pub async fn scoped_key(&self, name: &str, scopes: &[Scope]) -> (String, String) {
        let k = self
            .store
            .create_key(name, &ScopeSet::of(scopes.iter().copied()))
            .await
            .expect("create key");
        (k.plaintext, k.id)
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// Trigger graceful shutdown; returns the server task.
    pub fn begin_shutdown(&mut self) -> tokio::task::JoinHandle<std::io::Result<()>> {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        self.server.take().expect("server running")
    }

    /// Stop the server, close the pools, drop the PostgreSQL schema.
    pub async fn finish(mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(s) = self.server.take() {
            let _ = s.await;
        }
        self.store.close().await;
        if let Some((url, schema)) = self.pg.take() {
            use sqlx::Connection;
            if let Ok(mut c) = sqlx::PgConnection::connect(&url).await {
                let _ = sqlx::query(&format!("DROP SCHEMA {schema} CASCADE"))
                    .execute(&mut c)
                    .await;
                let _ = c.close().await;
            }
        }
    }

    /// POST raw bytes to /v1/envelopes with the harness key.
    pub async fn post_raw(&self, body: Vec<u8>, headers: &[(&str, &str)]) -> (StatusCode, Value) {
        let mut req = self
            .client
            .post(self.url("/v1/envelopes"))
            .bearer_auth(&self.key);
        if !headers
            .iter()
            .any(|(k, _)| k.eq_ignore_ascii_case("content-type"))
        {
            req = req.header("content-type", "application/json");
        }
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let resp = req.body(body).send().await.expect("POST /v1/envelopes");
        let status = resp.status();
        let body: Value = resp.json().await.expect("JSON response");
        (status, body)
    }

    /// POST a JSON array of envelope bytes, gzip-compressed, as the daemon does.
    pub async fn post_batch(&self, items: &[Vec<u8>]) -> (StatusCode, IngestResponse) {
        let (status, body) = self
            .post_raw(gzip(&array(items)), &[("content-encoding", "gzip")])
            .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        (
            status,
            serde_json::from_value(body).expect("ingest response"),
        )
    }

    pub async fn get(&self, path: &str) -> (StatusCode, Value) {
        let resp = self
            .client
            .get(self.url(path))
            .bearer_auth(&self.key)
            .send()
            .await
            .expect("GET");
        let status = resp.status();
        let body = resp.json().await.unwrap_or(Value::Null);
        (status, body)
    }

    pub async fn count(&self) -> i64 {
        self.store.count_envelopes().await.expect("count")
    }
}

pub fn array(items: &[Vec<u8>]) -> Vec<u8> {
    let mut out = vec![b'['];
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(item);
    }
    out.push(b']');
    out
}

pub fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    enc.write_all(bytes).expect("gzip");
    enc.finish().expect("gzip")
}

/// Sealed capture bytes (digest, bytes).
pub fn sealed(host: &str, pid: u32, seq: u64) -> (String, Vec<u8>) {
    Capture::new(host, pid, seq).bytes().expect("valid capture")
}

/// Error code of an error response.
pub fn code(body: &Value) -> &str {
    body["error"]["code"].as_str().unwrap_or("<no error code>")
}

/// Everything the server logs (every level the store emits), from the first
/// call on, for tests that scan the log output. One global subscriber for
/// the test binary.
pub fn captured_logs() -> &'static std::sync::Mutex<Vec<u8>> {
    static BUF: std::sync::OnceLock<&'static std::sync::Mutex<Vec<u8>>> =
        std::sync::OnceLock::new();
    BUF.get_or_init(|| {
        let buf: &'static std::sync::Mutex<Vec<u8>> =
            Box::leak(Box::new(std::sync::Mutex::new(Vec::new())));
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(
                "debug,pstack_store=trace",
            ))
            .with_ansi(false)
            .with_writer(move || LogWriter(buf))
            .try_init();
        buf
    })
}

struct LogWriter(&'static std::sync::Mutex<Vec<u8>>);

impl std::io::Write for LogWriter {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A Python interpreter that can import `imports`: `$env_var`, else
/// `default` (the venv a `scripts/setup.d` script makes). None when it
/// cannot: a reported skip, a failure under PSTACK_STRICT=1 / CI=true,
/// naming `setup_script`.
pub fn python_with(
    env_var: &str,
    default: &str,
    imports: &str,
    what: &str,
    setup_script: &str,
) -> Option<String> {
    let py = std::env::var(env_var).unwrap_or_else(|_| default.to_string());
    let ok = std::process::Command::new(&py)
        .args(["-c", &format!("import {imports}")])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    pstack_testkit::precondition(
        ok,
        &format!("no {what} at {py}: run {setup_script} or set {env_var}"),
    )
    .then_some(py)
}
