//! End to end with the real store: pstackd ships to a `pstack-store` process
//! (SQLite) that was down while envelopes were captured, across a pstackd
//! restart; each envelope is then served back by the store byte-for-byte
//! verifiable, and a replay is counted as a duplicate, not stored twice.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::collector::Collector;
use super::common::*;

struct Store(Child);

impl Drop for Store {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    key: &str,
    body: &[u8],
) -> Option<(u16, Vec<u8>)> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .ok()?;
    rt.block_on(async {
        let r = reqwest::Client::new()
            .request(method.parse().ok()?, format!("http://{addr}{path}"))
            .bearer_auth(key)
            .header("content-type", "application/json")
            .body(body.to_vec())
            .timeout(Duration::from_secs(10))
            .send()
            .await
            .ok()?;
        let status = r.status().as_u16();
        Some((status, r.bytes().await.ok()?.to_vec()))
    })
}

#[test]
fn end_to_end_with_the_real_store_down_then_up_across_a_pstackd_restart() {
    let Some(store_bin) = sibling_bin("pstack-store", "pstack-store") else {
        panic!("pstack-store could not be built (cargo build -p pstack-store)");
    };
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("store.db");
    let out = Command::new(&store_bin)
        .arg("--db")
        .arg(&db)
        .args([
            "keys",
            "create",
            "--name",
            "pstackd-test-node",
            "--scope",
            "ingest,read",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let key = String::from_utf8(out.stdout).unwrap().trim().to_string();
    assert!(key.starts_with("psk_"));

    let addr = Collector::reserve_port(); // the store is down at first
    let settings = Settings {
        collector_url: Some(format!("http://{addr}")),
        api_key: Some(key.clone()),
        backoff_initial_ms: 50,
        backoff_max_ms: 200,
        ..Settings::default()
    };
    let target = Sleeper::spawn();
    let mut captured = HashSet::new();
    let mut d = Daemon::start(dir.path(), &settings);
    for _ in 0..3 {
        captured.insert(d.capture_pid(target.pid()).expect("capture").digest);
    }
    let (st, _) = d.terminate(Duration::from_secs(10));
    assert_eq!(st.code(), Some(0));
    let d = Daemon::start(dir.path(), &settings);
    for _ in 0..3 {
        captured.insert(d.capture_pid(target.pid()).expect("capture").digest);
    }
    let _store = Store(
        Command::new(&store_bin)
            .arg("--db")
            .arg(&db)
            .args(["serve", "--listen", &addr.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    d.wait_status(
        Duration::from_secs(30),
        "spool drained into the store",
        |s| s["spool"]["files"] == 0 && s["shipping"]["accepted_total"] == 6,
    );
    let s = d.status();
    assert_eq!(s["shipping"]["accepted_total"], 6, "{s:#}");
    assert_eq!(s["shipping"]["rejected_total"], 0);
    for digest in &captured {
        let (code, body) =
            http(addr, "GET", &format!("/v1/envelopes/{digest}"), &key, b"").unwrap();
        assert_eq!(code, 200, "{digest} not in the store");
        assert_eq!(&pstack_testkit::verify(&body).unwrap().digest, digest);
        // A replay (what a crash between ack and delete causes) is a duplicate.
        let (code, resp) = http(
            addr,
            "POST",
            "/v1/envelopes",
            &key,
            &[b"[", body.as_slice(), b"]"].concat(),
        )
        .unwrap();
        assert_eq!(code, 200);
        let v: serde_json::Value = serde_json::from_slice(&resp).unwrap();
        assert_eq!(v["results"][0]["status"], "duplicate", "{v}");
    }
}
