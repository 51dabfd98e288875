//! `/mcp` of the real `pstack-store serve` behind a reverse proxy (issue
//! 28): the `Host` the proxy forwards (`docs/store-tls.md`: `proxy_set_header
//! Host $host`) is accepted when configured (`--public-url`,
//! `--mcp-allowed-host`) and refused otherwise; a session belongs to the API
//! key that opened it. Every request goes to 127.0.0.1 — only the `Host`
//! header names another machine.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use rmcp::ServiceExt;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use serde_json::{Value, json};

use crate::replicas::{Started, serving, shared_db, start_with};
use crate::support::Db;

/// One HTTP/1.1 request to `/mcp` with this `Host` and key (and session):
/// (status, response head, body — up to the end of the stream or 5 s).
fn mcp(
    addr: SocketAddr,
    host: &str,
    method: &str,
    key: &str,
    session: Option<&str>,
    body: Option<&Value>,
) -> (u16, String, String) {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let payload = body.map(Value::to_string).unwrap_or_default();
    let mut head = format!(
        "{method} /mcp HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\nAuthorization: Bearer {key}\r\nAccept: application/json, text/event-stream\r\nContent-Type: application/json\r\nContent-Length: {}\r\n",
        payload.len()
    );
    if let Some(id) = session {
        head.push_str(&format!(
            "Mcp-Session-Id: {id}\r\nMCP-Protocol-Version: 2025-03-26\r\n"
        ));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes()).unwrap();
    s.write_all(payload.as_bytes()).unwrap();
    let mut out = Vec::new();
    let mut buf = [0u8; 8192];
    // An SSE answer may stay open: stop at EOF or at the read timeout.
    while let Ok(n) = s.read(&mut buf) {
        if n == 0 {
            break;
        }
        out.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8_lossy(&out).to_string();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    (status, head.to_string(), body.to_string())
}

fn initialize() -> Value {
    json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-03-26", "capabilities": {},
        "clientInfo": {"name": "proxy-test", "version": "1"}}})
}

/// The `Mcp-Session-Id` of a response head.
fn session_id(head: &str) -> Option<String> {
    head.lines().find_map(|l| {
        let (name, value) = l.split_once(':')?;
        name.eq_ignore_ascii_case("mcp-session-id")
            .then(|| value.trim().to_string())
    })
}

/// The store's JSON error code in an error body.
fn error_code(body: &str) -> String {
    serde_json::from_str::<Value>(body).map_or_else(
        |_| format!("<not JSON: {body}>"),
        |v| v["error"]["code"].as_str().unwrap_or_default().to_string(),
    )
}

// Regression (issue 28): `/mcp` accepted only loopback Host headers, so
// behind the nginx block of docs/store-tls.md every remote MCP client got
// 403. Configured hosts are accepted — by a real MCP client too — and
// anything else (or the same host on a store not configured for it) is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mcp_answers_a_configured_proxy_host_and_refuses_others() {
    let Some(db) = shared_db(Db::Sqlite).await else {
        return;
    };
    let key = db.api_key();
    let proxied = serving(
        start_with(
            &db,
            None,
            &[
                "--public-url",
                "https://store.example.internal",
                "--mcp-allowed-host",
                "mcp.example.internal:8443",
            ],
        ),
        "serve --public-url",
    );
    let addr = proxied.addr;
    let port = addr.port();
    for (host, want) in [
        ("store.example.internal".to_string(), 200),
        ("store.example.internal:443".to_string(), 200),
        ("STORE.example.internal".to_string(), 200),
        ("mcp.example.internal:8443".to_string(), 200),
        (format!("127.0.0.1:{port}"), 200),
        ("mcp.example.internal:9443".to_string(), 403),
        ("evil.example".to_string(), 403),
        ("store.example.internal.evil.example".to_string(), 403),
    ] {
        let init = initialize();
        let (host2, key2) = (host.clone(), key.clone());
        let (status, head, body) = tokio::task::spawn_blocking(move || {
            mcp(addr, &host2, "POST", &key2, None, Some(&init))
        })
        .await
        .unwrap();
        assert_eq!(status, want, "Host: {host}: {head}\n{body}");
        if want == 200 {
            assert!(session_id(&head).is_some(), "{head}");
        } else {
            assert_eq!(error_code(&body), "mcp_host_not_allowed", "{body}");
            assert!(body.contains("--public-url"), "{body}");
        }
    }
    // A real MCP client whose requests carry the proxy's Host.
    let config = StreamableHttpClientTransportConfig::with_uri(format!("http://{addr}/mcp"))
        .auth_header(key.clone())
        .custom_headers(HashMap::from([(
            axum::http::header::HOST,
            axum::http::HeaderValue::from_static("store.example.internal"),
        )]));
    let client =
        ().serve(StreamableHttpClientTransport::from_config(config))
            .await
            .expect("initialize through the proxy's Host");
    let tools = client.list_all_tools().await.expect("tools/list");
    assert_eq!(tools.len(), 10, "{tools:?}");
    client.cancel().await.ok();
    drop(proxied);
    // Not configured: the same Host is refused, loopback still answers.
    let plain = serving(start_with(&db, None, &[]), "serve");
    let addr = plain.addr;
    for (host, want) in [
        ("store.example.internal".to_string(), 403),
        (format!("localhost:{}", addr.port()), 200),
    ] {
        let (key2, host2) = (key.clone(), host.clone());
        let init = initialize();
        let (status, head, _) = tokio::task::spawn_blocking(move || {
            mcp(addr, &host2, "POST", &key2, None, Some(&init))
        })
        .await
        .unwrap();
        assert_eq!(status, want, "Host: {host}: {head}");
    }
    drop(plain);
    // A value that is not a URL / host is a start-up error naming the flag.
    for (flag, value) in [
        ("--public-url", "store.example.internal"),
        ("--mcp-allowed-host", "https://store.example.internal/"),
        ("--mcp-allowed-host", "*.example.internal"),
    ] {
        match start_with(&db, None, &[flag, value]) {
            Started::Exited(code, err) => {
                assert_eq!(code, Some(1), "{err}");
                assert!(err.contains(flag), "{flag} {value}: {err}");
            }
            Started::Serving(_) => panic!("{flag} {value} was accepted"),
        }
    }
}

// Regression (issue 28): MCP sessions were not bound to the key that
// opened them — any valid key could use another's session id. Now another
// key is refused before the session sees the request, an id this store did
// not hand out is 404, and only the owner can close a session.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_mcp_session_answers_only_the_key_that_opened_it() {
    let Some(db) = shared_db(Db::Sqlite).await else {
        return;
    };
    let (a, b) = (db.api_key(), db.api_key());
    let server = serving(start_with(&db, None, &[]), "serve");
    let addr = server.addr;
    let host = format!("127.0.0.1:{}", addr.port());
    tokio::task::spawn_blocking(move || {
        let (st, head, body) = mcp(addr, &host, "POST", &a, None, Some(&initialize()));
        assert_eq!(st, 200, "{head}\n{body}");
        let session = session_id(&head).expect("a session id");
        let s = Some(session.as_str());
        let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
        let (st, head, _) = mcp(addr, &host, "POST", &a, s, Some(&initialized));
        assert_eq!(st, 202, "{head}");
        let list = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"});
        // Another valid key with the session id: refused, typed.
        let (st, _, body) = mcp(addr, &host, "POST", &b, s, Some(&list));
        assert_eq!(
            (st, error_code(&body)),
            (403, "mcp_session_key_mismatch".to_string()),
            "{body}"
        );
        assert!(!body.contains("list_incidents"), "{body}");
        // The opener: served.
        let (st, _, body) = mcp(addr, &host, "POST", &a, s, Some(&list));
        assert_eq!(st, 200, "{body}");
        assert!(body.contains("list_incidents"), "{body}");
        // A session id this store never handed out.
        let (st, _, body) = mcp(addr, &host, "POST", &a, Some("not-a-session"), Some(&list));
        assert_eq!(
            (st, error_code(&body)),
            (404, "mcp_session_unknown".to_string())
        );
        // Only the opener closes it; after that it is gone.
        let (st, _, body) = mcp(addr, &host, "DELETE", &b, s, None);
        assert_eq!(
            (st, error_code(&body)),
            (403, "mcp_session_key_mismatch".to_string())
        );
        let (st, head, _) = mcp(addr, &host, "DELETE", &a, s, None);
        assert_eq!(st, 204, "closed (what MCP clients read as closed): {head}");
        let (st, _, body) = mcp(addr, &host, "POST", &a, s, Some(&list));
        assert_eq!(
            (st, error_code(&body)),
            (404, "mcp_session_unknown".to_string())
        );
    })
    .await
    .unwrap();
    drop(server);
}
