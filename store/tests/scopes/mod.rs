//! Scoped API keys (issue 28): every documented route × every scope against
//! `openapi.json`'s `security`; MCP tools acting with the key's scopes over
//! HTTP and stdio; a store made before scopes keeps its keys, as `legacy`.

use std::collections::BTreeMap;

use pstack_store::http::AppState;
use pstack_store::service::serve;
use pstack_store_core::db::{KeyCheck, OpenOptions, Store};
use pstack_store_core::ingest::IngestLimits;
use pstack_store_core::keys::{Scope, ScopeSet};
use reqwest::StatusCode;
use rmcp::ServiceExt;
use rmcp::model::CallToolRequestParams;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use serde_json::{Value, json};

use crate::on_both_backends;
use crate::support::{Db, Harness, code, drop_schema, fresh_store};

const SCOPES: [Scope; 5] = [
    Scope::Ingest,
    Scope::Telemetry,
    Scope::Analysis,
    Scope::Runner,
    Scope::Read,
];

/// (method, path) → the scope `openapi.json` documents for it; routes
/// without an API key (open, or an operator session) are left out.
fn documented_scopes(doc: &Value) -> BTreeMap<(String, String), String> {
    let mut out = BTreeMap::new();
    for (path, ops) in doc["paths"].as_object().unwrap() {
        for (method, op) in ops.as_object().unwrap() {
            let security = op.get("security").unwrap_or(&doc["security"]);
            let Some(scopes) = security
                .as_array()
                .and_then(|s| s.iter().find_map(|req| req.get("apiKey")))
            else {
                continue;
            };
            let scopes = scopes.as_array().unwrap();
            assert_eq!(scopes.len(), 1, "{method} {path}: exactly one scope each");
            out.insert(
                (method.clone(), path.clone()),
                scopes[0].as_str().unwrap().to_string(),
            );
        }
    }
    out
}

// Every route needs its documented scope: a key holding any other one
// scope is refused 403 insufficient_scope naming it, before the body is
// read; a key holding it (or legacy) is never refused for scope.
async fn every_route_requires_its_documented_scope(db: Db) {
    let Some(h) = Harness::start(db).await else {
        return;
    };
    let doc: Value = h
        .client
        .get(h.url("/openapi.json"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let routes = documented_scopes(&doc);
    assert!(routes.len() >= 40, "{routes:?}");
    let mut keys = Vec::new();
    for s in SCOPES {
        let (key, _) = h.scoped_key(&format!("only-{s}"), &[s]).await;
        keys.push((s.as_str().to_string(), key));
    }
    keys.push(("legacy".into(), h.key.clone()));
    let mut by_scope: BTreeMap<&str, usize> = BTreeMap::new();
    for ((method, path), need) in &routes {
        assert!(
            Scope::parse(need).is_some_and(|s| s != Scope::Legacy),
            "{method} {path}: {need}"
        );
        *by_scope.entry(need.as_str()).or_default() += 1;
        let concrete = path
            .replace("{digest}", &format!("sha256:{}", "0".repeat(64)))
            .replace("{id}", "x");
        for (held, key) in &keys {
            let req = match method.as_str() {
                "get" => h.client.get(h.url(&concrete)),
                _ => h
                    .client
                    .post(h.url(&concrete))
                    .header("content-type", "application/json")
                    .body("{}"),
            };
            let resp = req.bearer_auth(key).send().await.unwrap();
            let status = resp.status();
            let www = resp
                .headers()
                .get("www-authenticate")
                .map(|v| v.to_str().unwrap().to_string());
            let body: Value = resp.json().await.unwrap_or(Value::Null);
            let allowed = held == need || held == "legacy";
            if allowed {
                assert_ne!(
                    code(&body),
                    "insufficient_scope",
                    "{method} {path} with {held}: {body}"
                );
            } else {
                assert_eq!(
                    (status, code(&body)),
                    (StatusCode::FORBIDDEN, "insufficient_scope"),
                    "{method} {path} with {held}: {body}"
                );
                assert_eq!(body["error"]["detail"]["requiredScope"], need.as_str());
                assert_eq!(body["error"]["detail"]["keyScopes"], json!([held]));
                let message = body["error"]["message"].as_str().unwrap();
                assert!(
                    message.contains(&format!("needs scope {need}")),
                    "{message}"
                );
                assert_eq!(
                    www.as_deref(),
                    Some(format!("Bearer error=\"insufficient_scope\", scope=\"{need}\"").as_str())
                );
            }
        }
    }
    // Each scope guards something.
    for s in SCOPES {
        assert!(by_scope.contains_key(s.as_str()), "{s}: {by_scope:?}");
    }
    assert_eq!(by_scope["ingest"], 1, "nodes hold ingest: envelopes only");
    // Refusals are counted.
    let metrics = h
        .client
        .get(h.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("pstack_store_auth_failures_total{reason=\"insufficient_scope\"}"),
        "{metrics}"
    );
    h.finish().await;
}

/// A database holding the v1–v5 schema, made by v5's own migration files
/// (as a store made before scopes holds it), with one key row written the
/// way v5 wrote keys.
struct V5Store {
    url: String,
    opts: OpenOptions,
    /// The key, as the node holds it.
    key: String,
    _dir: Option<tempfile::TempDir>,
    /// (url, schema) to drop at the end (PostgreSQL).
    pg: Option<(String, String)>,
}

async fn v5_store(db: Db) -> Option<V5Store> {
    const V5: [(&str, &str); 5] = [
        (
            include_str!("../../../store-core/migrations/sqlite/0001_core.sql"),
            include_str!("../../../store-core/migrations/postgres/0001_core.sql"),
        ),
        (
            include_str!("../../../store-core/migrations/sqlite/0002_analysis.sql"),
            include_str!("../../../store-core/migrations/postgres/0002_analysis.sql"),
        ),
        (
            include_str!("../../../store-core/migrations/sqlite/0003_gate.sql"),
            include_str!("../../../store-core/migrations/postgres/0003_gate.sql"),
        ),
        (
            include_str!("../../../store-core/migrations/sqlite/0004_runs.sql"),
            include_str!("../../../store-core/migrations/postgres/0004_runs.sql"),
        ),
        (
            include_str!("../../../store-core/migrations/sqlite/0005_transfers.sql"),
            include_str!("../../../store-core/migrations/postgres/0005_transfers.sql"),
        ),
    ];
    use sqlx::Connection;
    // fresh_store decides whether this backend runs here (PostgreSQL
    // unreachable: a reported skip); its own database is not used.
    let (store, dir, pg) = fresh_store(db).await?;
    store.close().await;
    drop_schema(pg.clone()).await;
    let key = pstack_store_core::keys::generate().unwrap();
    let postgres = pg.is_some();
    let mut script = String::from(
        "CREATE TABLE pstack_schema_migrations (version BIGINT PRIMARY KEY, name TEXT NOT NULL, applied_ns BIGINT NOT NULL);\n",
    );
    for (i, (lite, post)) in V5.iter().enumerate() {
        script.push_str(if postgres { post } else { lite });
        script.push_str(&format!(
            "\nINSERT INTO pstack_schema_migrations VALUES ({}, 'v{}', 0);\n",
            i + 1,
            i + 1
        ));
    }
    script.push_str(&format!(
        "INSERT INTO api_keys (id, name, key_hash, created_ns) VALUES ('{}', 'old-node', '{}', 1);\n",
        key.id, key.hash
    ));
    let v5 = match pg {
        Some((url, schema)) => {
            let schema = format!("{schema}_v5");
            let mut c = sqlx::PgConnection::connect(&url).await.unwrap();
            sqlx::raw_sql(&format!(
                "CREATE SCHEMA {schema}; SET search_path TO {schema};\n{script}"
            ))
            .execute(&mut c)
            .await
            .unwrap();
            c.close().await.unwrap();
            V5Store {
                url: url.clone(),
                opts: OpenOptions {
                    pg_schema: Some(schema.clone()),
                    pg_max_connections: 4,
                    ..OpenOptions::default()
                },
                key: key.plaintext,
                _dir: dir,
                pg: Some((url, schema)),
            }
        }
        None => {
            let path = dir.as_ref().unwrap().path().join("v5.db");
            let path = path.to_str().unwrap().to_string();
            let mut c = sqlx::SqliteConnection::connect(&format!("sqlite://{path}?mode=rwc"))
                .await
                .unwrap();
            sqlx::raw_sql(&script).execute(&mut c).await.unwrap();
            c.close().await.unwrap();
            V5Store {
                url: path,
                opts: OpenOptions::default(),
                key: key.plaintext,
                _dir: dir,
                pg: None,
            }
        }
    };
    Some(v5)
}

// Regression (issue 28): keys made before scopes migrate to `legacy` (every
// scope, as before) and keep working on every route until narrowed.
async fn keys_made_before_scopes_keep_working_as_legacy(db: Db) {
    let Some(v5) = v5_store(db).await else {
        return;
    };
    let key = v5.key.as_str();
    let store = Store::open(&v5.url, &v5.opts)
        .await
        .expect("migrate v5 → now");
    assert!(store.schema_version().await.unwrap() >= 6);
    let id = key[4..20].to_string();
    assert_eq!(
        store.check_key(key).await.unwrap(),
        KeyCheck::Valid(id.clone(), ScopeSet::legacy())
    );
    assert_eq!(store.list_keys().await.unwrap()[0].scopes, vec!["legacy"]);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(serve(
        listener,
        AppState::new(store.clone(), IngestLimits::default()),
        async move {
            let _ = rx.await;
        },
    ));
    let client = reqwest::Client::new();
    let change =
        json!({"environment": "prod", "kind": "deploy", "service": "checkout-api", "version": "1"});
    let post = |path: &str, body: &Value| {
        client
            .post(format!("{base}{path}"))
            .bearer_auth(key)
            .json(body)
            .send()
    };
    // One route of each scope answers as before.
    let r = post("/v1/changes", &change).await.unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    let r = post(
        "/internal/incidents",
        &json!({"project": "p", "environment": "prod", "dedupKey": "k", "title": "t"}),
    )
    .await
    .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    let r = client
        .get(format!("{base}/v1/changes"))
        .bearer_auth(key)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let r = post("/v1/envelopes", &json!([])).await.unwrap();
    assert_ne!(r.status(), StatusCode::FORBIDDEN);
    let r = post("/internal/remediations/x/grant", &json!({}))
        .await
        .unwrap();
    assert_ne!(r.status(), StatusCode::FORBIDDEN);
    // Narrowed to ingest by the operator: the next request sees it.
    store
        .set_key_scopes(&id, &ScopeSet::of([Scope::Ingest]))
        .await
        .unwrap();
    let r = post("/v1/changes", &change).await.unwrap();
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    let r = post("/v1/envelopes", &json!([])).await.unwrap();
    assert_ne!(r.status(), StatusCode::FORBIDDEN);
    let _ = tx.send(());
    let _ = server.await;
    store.close().await;
    drop_schema(v5.pg.clone()).await;
}

on_both_backends!(
    every_route_requires_its_documented_scope,
    keys_made_before_scopes_keep_working_as_legacy,
);

fn tool_error_code(r: &rmcp::model::CallToolResult) -> String {
    let text = serde_json::to_value(r).unwrap().to_string();
    let v: Value = r
        .content
        .first()
        .and_then(|c| c.as_text())
        .and_then(|t| serde_json::from_str(&t.text).ok())
        .unwrap_or(Value::Null);
    v["error"]["code"]
        .as_str()
        .map(str::to_string)
        .unwrap_or(text)
}

async fn call(
    c: &rmcp::service::RunningService<rmcp::service::RoleClient, ()>,
    tool: &'static str,
    a: Value,
) -> rmcp::model::CallToolResult {
    c.call_tool(CallToolRequestParams::new(tool).with_arguments(a.as_object().cloned().unwrap()))
        .await
        .expect("tool call")
}

// MCP tools act with the scopes of the key that opened the session: a
// write tool needs OBS_MCP_ENABLE_WRITES=true *and* the route's scope; a
// read tool needs read.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mcp_tools_act_with_the_keys_scopes() {
    let Some(h) =
        Harness::start_custom(Db::Sqlite, Default::default(), |s| s.mcp_writes = true).await
    else {
        return;
    };
    let open = json!({"project": "p", "environment": "prod", "dedupKey": "mcp", "title": "disk"});
    let session = |key: String| {
        let t = StreamableHttpClientTransport::from_config(
            StreamableHttpClientTransportConfig::with_uri(h.url("/mcp")).auth_header(key),
        );
        ().serve(t)
    };
    // A reader: reads, and is refused the write even with writes enabled.
    let (reader, _) = h.scoped_key("dashboard", &[Scope::Read]).await;
    let c = session(reader).await.expect("initialize");
    let r = call(&c, "list_incidents", json!({})).await;
    assert_ne!(r.is_error, Some(true), "{r:?}");
    let r = call(&c, "open_incident", open.clone()).await;
    assert_eq!(r.is_error, Some(true));
    assert_eq!(tool_error_code(&r), "insufficient_scope", "{r:?}");
    c.cancel().await.ok();
    // A node's key opens a session and can do nothing with it.
    let (node, _) = h.scoped_key("node", &[Scope::Ingest]).await;
    let c = session(node).await.expect("initialize");
    let r = call(&c, "list_incidents", json!({})).await;
    assert_eq!(tool_error_code(&r), "insufficient_scope", "{r:?}");
    c.cancel().await.ok();
    // The agent (analysis + read) writes and reads, but does not claim.
    let (agent, _) = h.scoped_key("agent", &[Scope::Analysis, Scope::Read]).await;
    let c = session(agent).await.expect("initialize");
    let r = call(&c, "open_incident", open.clone()).await;
    assert_ne!(r.is_error, Some(true), "{r:?}");
    let r = call(&c, "list_incidents", json!({})).await;
    assert_eq!(r.structured_content.unwrap()["items"][0]["dedupKey"], "mcp");
    let r = call(
        &c,
        "claim_remediation_grant",
        json!({"proposalId": "rem_x", "grantToken": "rgt_x", "runnerId": "r"}),
    )
    .await;
    assert_eq!(tool_error_code(&r), "insufficient_scope", "{r:?}");
    c.cancel().await.ok();
    h.finish().await;

    // stdio: the process's key, the same rule.
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("store.db");
    let db = db.to_str().unwrap().to_string();
    let store = Store::open(&db, &OpenOptions::default()).await.unwrap();
    let reader = store
        .create_key("mcp-reader", &ScopeSet::of([Scope::Read]))
        .await
        .unwrap()
        .plaintext;
    store.close().await;
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_pstack-store"));
    cmd.args(["--db", &db, "mcp"])
        .env("PSTACK_STORE_API_KEY", &reader)
        .env("OBS_MCP_ENABLE_WRITES", "true")
        .stderr(std::process::Stdio::null());
    let c = ().serve(TokioChildProcess::new(cmd).unwrap()).await.unwrap();
    let r = call(&c, "list_incidents", json!({})).await;
    assert_ne!(r.is_error, Some(true), "{r:?}");
    let r = call(&c, "open_incident", open).await;
    assert_eq!(tool_error_code(&r), "insufficient_scope", "{r:?}");
    c.cancel().await.ok();
}
