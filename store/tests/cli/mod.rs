//! The `pstack-store` binary: key management, and `serve` exiting cleanly on SIGTERM.

use std::process::{Command, Stdio};
use std::time::Duration;

use pstack_store_core::db::{KeyCheck, OpenOptions, Store};
use pstack_store_core::keys::{Scope, ScopeSet};

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_pstack-store"))
}

#[tokio::test]
async fn keys_create_list_revoke_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("s.db");
    let db = db.to_str().unwrap();
    // No default scope: without --scope the command refuses (usage, exit
    // 2) and lists the scopes with who holds each.
    let out = bin()
        .args(["--db", db, "keys", "create", "--name", "node-a"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    for scope in ["ingest", "telemetry", "analysis", "runner", "read"] {
        assert!(err.contains(&format!("  {scope} ")), "{scope}: {err}");
    }
    // legacy is only what old keys hold; an unknown scope names itself.
    for bad in ["legacy", "admin"] {
        let out = bin()
            .args(["--db", db, "keys", "create", "--name", "x", "--scope", bad])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{bad}: {out:?}");
        assert!(String::from_utf8_lossy(&out.stderr).contains(bad));
    }
    let out = bin()
        .args([
            "--db", db, "keys", "create", "--name", "node-a", "--scope", "ingest",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let key = String::from_utf8(out.stdout).unwrap().trim().to_string();
    assert!(key.starts_with("psk_"), "{key}");
    let id = key[4..20].to_string();
    assert!(String::from_utf8_lossy(&out.stderr).contains("with scope ingest"));
    let out = bin()
        .args([
            "--db", db, "keys", "create", "--name", "agent", "--scope", "analysis", "--scope",
            "read",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");

    let out = bin().args(["--db", db, "keys", "list"]).output().unwrap();
    let listing = String::from_utf8(out.stdout).unwrap();
    assert!(
        listing.contains(&id) && listing.contains("node-a"),
        "{listing}"
    );
    assert!(listing.contains("SCOPES"), "{listing}");
    assert!(listing.contains(" ingest "), "{listing}");
    assert!(listing.contains(" analysis,read "), "{listing}");
    assert!(!listing.contains(&key[21..]), "the secret is never listed");
    let out = bin()
        .args(["--db", db, "keys", "list", "--json"])
        .output()
        .unwrap();
    let keys: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(keys[0]["scopes"], serde_json::json!(["ingest"]));
    assert_eq!(keys[1]["scopes"], serde_json::json!(["analysis", "read"]));

    let store = Store::open(db, &OpenOptions::default()).await.unwrap();
    assert_eq!(
        store.check_key(&key).await.unwrap(),
        KeyCheck::Valid(id.clone(), ScopeSet::of([Scope::Ingest]))
    );
    // `keys scope` replaces the set, effective on the next check.
    let out = bin()
        .args(["--db", db, "keys", "scope", &id, "--scope", "ingest,read"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("key {id}: scope ingest -> ingest,read")
    );
    assert_eq!(
        store.check_key(&key).await.unwrap(),
        KeyCheck::Valid(id.clone(), ScopeSet::of([Scope::Ingest, Scope::Read]))
    );
    let out = bin()
        .args(["--db", db, "keys", "scope", &id])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "no --scope: {out:?}");
    let out = bin()
        .args([
            "--db",
            db,
            "keys",
            "scope",
            "0000000000000000",
            "--scope",
            "read",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no API key"));
    let out = bin()
        .args(["--db", db, "keys", "revoke", &id])
        .output()
        .unwrap();
    assert!(out.status.success());
    assert_eq!(
        store.check_key(&key).await.unwrap(),
        KeyCheck::Revoked(id.clone())
    );

    let out = bin()
        .args(["--db", db, "keys", "revoke", "0000000000000000"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no API key"));
    let out = bin().args(["--db", db, "retention"]).output().unwrap();
    assert!(!out.status.success(), "retention needs a limit");
    store.close().await;
}

#[tokio::test]
async fn serve_exits_cleanly_on_sigterm_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("s.db");
    let client = reqwest::Client::new();
    // The port is picked by binding :0 and released before the server binds
    // it; if another process takes it meanwhile the server exits, and we pick
    // again rather than flake.
    let mut started = None;
    for _ in 0..5 {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let listen = format!("127.0.0.1:{port}");
        let mut child = bin()
            .args(["--db", db.to_str().unwrap(), "serve", "--listen", &listen])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut healthy = false;
        for _ in 0..300 {
            if let Ok(r) = client.get(format!("http://{listen}/healthz")).send().await
                && r.status().is_success()
            {
                healthy = true;
                break;
            }
            if child.try_wait().unwrap().is_some() {
                break; // lost the port race: try another
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        if healthy {
            started = Some(child);
            break;
        }
        let _ = child.kill();
        let _ = child.wait();
    }
    let up = started.is_some();
    assert!(up, "server did not come up");
    let mut child = started.unwrap();
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    for _ in 0..300 {
        if let Some(st) = child.try_wait().unwrap() {
            assert!(st.success(), "exit status {st}");
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = child.kill();
    panic!("serve did not exit within 15 s of SIGTERM");
}
