//! Replicas of the real `pstack-store` binary on one database (issue 28):
//! a replica whose gate key differs from the one the database records
//! refuses to start, naming both fingerprints, while one with the same key
//! starts; and concurrent proposals with one `idempotencyKey` spread over
//! two PostgreSQL replicas all get the one proposal.

use std::io::Read;
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use pstack_store_core::db::analysis::FindingRow;
use pstack_store_core::db::{OpenOptions, Store};
use pstack_store_core::gate::keys::GateKeys;
use serde_json::{Value, json};

use crate::support::{DEFAULT_PG_URL, Db};

/// A database several `serve` processes share: a SQLite file, or a fresh
/// schema of the test PostgreSQL server (its URL carries the search path).
pub(crate) struct SharedDb {
    url: String,
    dir: tempfile::TempDir,
    pg: Option<(String, String)>,
}

impl Drop for SharedDb {
    fn drop(&mut self) {
        if let Some((url, schema)) = self.pg.take() {
            // Best effort, on a thread of its own (Drop is not async).
            let _ = std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("runtime");
                rt.block_on(crate::support::drop_schema(Some((url, schema))));
            })
            .join();
        }
    }
}

/// A shared database on `db`, or `None` when PostgreSQL is unreachable
/// (a reported skip, as the harness does).
pub(crate) async fn shared_db(db: Db) -> Option<SharedDb> {
    let dir = tempfile::tempdir().expect("tempdir");
    match db {
        Db::Sqlite => Some(SharedDb {
            url: dir.path().join("store.db").to_str()?.to_string(),
            dir,
            pg: None,
        }),
        Db::Postgres => {
            use sqlx::Connection;
            let base =
                std::env::var("PSTACK_TEST_PG_URL").unwrap_or_else(|_| DEFAULT_PG_URL.to_string());
            let schema = format!("r_{:012x}", crate::gate::rand_u64() >> 16);
            let connected =
                tokio::time::timeout(Duration::from_secs(15), sqlx::PgConnection::connect(&base))
                    .await;
            let Ok(Ok(mut c)) = connected else {
                pstack_testkit::precondition(
                    false,
                    "PostgreSQL unreachable for the replica tests; run scripts/setup.d/20-postgres.sh or set PSTACK_TEST_PG_URL",
                );
                return None;
            };
            sqlx::query(&format!("CREATE SCHEMA {schema}"))
                .execute(&mut c)
                .await
                .expect("create schema");
            let _ = c.close().await;
            let sep = if base.contains('?') { '&' } else { '?' };
            Some(SharedDb {
                url: format!("{base}{sep}options=-c%20search_path%3D{schema}"),
                dir,
                pg: Some((base, schema)),
            })
        }
    }
}

impl SharedDb {
    /// The database opened in this process (to plant rows the HTTP API
    /// derives server-side, such as a finding's tier).
    async fn open(&self) -> Store {
        let opts = OpenOptions {
            pg_schema: self.pg.as_ref().map(|(_, s)| s.clone()),
            pg_max_connections: 2,
            ..OpenOptions::default()
        };
        let url = match &self.pg {
            Some((base, _)) => base.as_str(),
            None => self.url.as_str(),
        };
        Store::open(url, &opts)
            .await
            .expect("open the shared database")
    }

    /// A gate key file (mode 0600) holding 64 hex digits: (path, keys).
    fn gate_key(&self, name: &str) -> (PathBuf, GateKeys) {
        let mut master = [0u8; 32];
        getrandom::fill(&mut master).expect("random");
        let text = hex::encode(master);
        let path = self.dir.path().join(name);
        std::fs::write(&path, format!("{text}\n")).expect("write key");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        (path, GateKeys::from_hex(&text).expect("key"))
    }

    fn command(&self) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_pstack-store"));
        c.arg("--db").arg(&self.url);
        c
    }

    /// `pstack-store keys create`: the key.
    pub(crate) fn api_key(&self) -> String {
        let out = self
            .command()
            .args([
                "keys",
                "create",
                "--name",
                "replica-test",
                "--scope",
                "ingest,telemetry,analysis,runner,read",
            ])
            .output()
            .expect("keys create");
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout).unwrap().trim().to_string()
    }
}

/// A `serve` process; killed when dropped.
pub(crate) struct Replica {
    child: Child,
    pub(crate) addr: SocketAddr,
}

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// How a `serve` start ended.
pub(crate) enum Started {
    /// It answers `/healthz`.
    Serving(Replica),
    /// It exited: (exit code, standard error).
    Exited(Option<i32>, String),
}

fn free_addr() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap()
}

fn healthy(addr: SocketAddr) -> bool {
    use std::io::Write;
    let Ok(mut s) = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    if s.write_all(b"GET /healthz HTTP/1.1\r\nHost: s\r\nConnection: close\r\n\r\n")
        .is_err()
    {
        return false;
    }
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    out.starts_with(b"HTTP/1.1 200")
}

/// Start `serve` on `db` with this gate key file (or none) and wait until
/// it serves or exits.
fn start(db: &SharedDb, gate_key: Option<&Path>) -> Started {
    start_with(db, gate_key, &[])
}

/// [`start`] with extra `serve` flags.
pub(crate) fn start_with(db: &SharedDb, gate_key: Option<&Path>, flags: &[&str]) -> Started {
    let addr = free_addr();
    let mut cmd = db.command();
    cmd.args(["serve", "--listen", &addr.to_string()])
        .args(flags);
    if let Some(k) = gate_key {
        cmd.arg("--gate-key-file").arg(k);
    }
    // No one reads stdout; stderr is read only once the process has exited
    // (a serving replica logs little, far below a pipe's buffer).
    let mut child = cmd
        .env("PSTACK_STORE_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn pstack-store serve");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            let mut err = String::new();
            if let Some(mut e) = child.stderr.take() {
                let _ = e.read_to_string(&mut err);
            }
            return Started::Exited(status.code(), err);
        }
        if healthy(addr) {
            return Started::Serving(Replica { child, addr });
        }
        assert!(
            Instant::now() < deadline,
            "serve neither started nor exited"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

pub(crate) fn serving(s: Started, what: &str) -> Replica {
    match s {
        Started::Serving(r) => r,
        Started::Exited(code, err) => panic!("{what}: exited {code:?}: {err}"),
    }
}

pub(crate) fn refused(s: Started, what: &str) -> String {
    match s {
        Started::Exited(code, err) => {
            assert_eq!(code, Some(1), "{what}: {err}");
            err
        }
        Started::Serving(r) => panic!("{what}: serves at {} with a mismatched key", r.addr),
    }
}

// Regression (issue 28): nothing checked that replicas share the gate key,
// so a grant approved on one replica was `403 invalid_grant_token` on
// another. A replica with another key (or none) must refuse to start,
// naming both fingerprints; one with the same key starts beside the first.
async fn a_replica_with_another_gate_key_refuses_to_start(db: Db) {
    let Some(shared) = shared_db(db).await else {
        return;
    };
    let (k1, keys1) = shared.gate_key("gate1.key");
    let (k2, keys2) = shared.gate_key("gate2.key");
    let (fp1, fp2) = (keys1.fingerprint(), keys2.fingerprint());
    assert_ne!(fp1, fp2);
    let first = serving(start(&shared, Some(&k1)), "the first replica");
    let err = refused(start(&shared, Some(&k2)), "a replica with another key");
    assert!(
        err.contains(fp1) && err.contains(fp2),
        "names both fingerprints: {err}"
    );
    assert!(
        err.contains("--gate-key-file") && err.contains("gate-key adopt"),
        "says how to fix it: {err}"
    );
    // Without a key file the run's random key cannot honour the stored
    // grants either.
    let err = refused(start(&shared, None), "a replica without a key file");
    assert!(err.contains(fp1), "{err}");
    // The same key: a second replica beside the first.
    let second = serving(start(&shared, Some(&k1)), "a replica with the same key");
    drop((first, second));
    // `gate-key show` prints the recorded fingerprint and a file's.
    let out = shared
        .command()
        .args(["gate-key", "show", "--gate-key-file"])
        .arg(&k2)
        .output()
        .expect("gate-key show");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains(fp1) && text.contains(fp2),
        "{out:?}"
    );
    // A deliberate replacement: adopt the new key; then the old one is
    // the stranger.
    let out = shared
        .command()
        .args(["gate-key", "adopt", "--gate-key-file"])
        .arg(&k2)
        .output()
        .expect("gate-key adopt");
    assert!(out.status.success(), "{out:?}");
    let replaced = serving(start(&shared, Some(&k2)), "the adopted key");
    let err = refused(start(&shared, Some(&k1)), "the old key after adopt");
    assert!(err.contains(fp1) && err.contains(fp2), "{err}");
    drop(replaced);
}

// Two replicas starting at once on a fresh database with different keys:
// the first to record wins and exactly one serves.
async fn replicas_racing_to_record_different_keys_leave_one_serving(db: Db) {
    let Some(shared) = shared_db(db).await else {
        return;
    };
    let (k1, _) = shared.gate_key("gate1.key");
    let (k2, _) = shared.gate_key("gate2.key");
    let shared = std::sync::Arc::new(shared);
    let starts: Vec<_> = [k1, k2]
        .into_iter()
        .map(|k| {
            let shared = shared.clone();
            std::thread::spawn(move || start(&shared, Some(&k)))
        })
        .collect();
    let outcomes: Vec<Started> = starts.into_iter().map(|t| t.join().unwrap()).collect();
    let serving_count = outcomes
        .iter()
        .filter(|s| matches!(s, Started::Serving(_)))
        .count();
    let exits: Vec<String> = outcomes
        .iter()
        .filter_map(|s| match s {
            Started::Exited(code, err) => Some(format!("{code:?} {err}")),
            Started::Serving(_) => None,
        })
        .collect();
    assert_eq!(serving_count, 1, "exactly one serves: {exits:?}");
    assert!(exits[0].contains("refusing to start"), "{exits:?}");
    drop(outcomes);
}

crate::on_both_backends!(
    a_replica_with_another_gate_key_refuses_to_start,
    replicas_racing_to_record_different_keys_leave_one_serving,
);

/// POST `body` to `addr` with the API key: (status, body).
async fn post(
    client: &reqwest::Client,
    addr: SocketAddr,
    key: &str,
    path: &str,
    body: &Value,
) -> (u16, Value) {
    let resp = client
        .post(format!("http://{addr}{path}"))
        .bearer_auth(key)
        .json(body)
        .send()
        .await
        .expect("POST");
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

// Regression (issue 28): concurrent proposals with one idempotencyKey gave
// the losers 503 (the unique constraint's text) or 429 (the breaker
// counting the winner) instead of the one proposal. Here 20 of them are
// spread over two PostgreSQL replicas (real processes, one gate key).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_idempotent_proposals_across_two_replicas_all_get_the_one_proposal() {
    let Some(shared) = shared_db(Db::Postgres).await else {
        return;
    };
    let (k, _) = shared.gate_key("gate.key");
    let key = shared.api_key();
    let replicas = [
        serving(start(&shared, Some(&k)), "replica A"),
        serving(start(&shared, Some(&k)), "replica B"),
    ];
    let client = reqwest::Client::new();
    let (st, inc) = post(
        &client,
        replicas[0].addr,
        &key,
        "/internal/incidents",
        &json!({"project": "shop", "environment": "prod", "dedupKey": "replicas", "title": "5xx"}),
    )
    .await;
    assert_eq!(st, 201, "{inc}");
    let incident = inc["incident"]["id"].as_str().unwrap().to_string();
    // The finding's tier is server-derived; plant one directly. Two live
    // proposals on its fingerprint leave the breaker one slot: the winner
    // takes it, and a loser that counted it would be refused 429.
    let store = shared.open().await;
    let finding = format!("fnd_{:016x}", crate::gate::rand_u64());
    let now = pstack_store_core::now_ns();
    let row = FindingRow {
        id: finding.clone(),
        environment: "prod".into(),
        incident_id: Some(incident.clone()),
        fault_locus_entity_id: "checkout-api".into(),
        causal_chain: json!([]),
        cited_evidence_ids: json!([]),
        contributing_change_id: None,
        change_verdict: None,
        counterfactual: None,
        fingerprint: "fp_replicas".into(),
        fingerprint_input: json!({}),
        causal_proof_tier: "corroborated_candidate".into(),
        idempotency_key: finding.clone(),
        created_ns: now,
        updated_ns: now,
    };
    store
        .insert_finding(&row, &[], "planted")
        .await
        .expect("finding");
    store.close().await;
    let body = |idem: &str| {
        json!({
            "incidentId": incident, "findingId": finding, "action": "rollback_deploy",
            "target": {"service": "checkout-api", "environment": "prod"},
            "expectedCurrentState": {"version": "2.4.1", "commitSha": "8f3a1b2"},
            "idempotencyKey": idem,
        })
    };
    for idem in ["pre-1", "pre-2"] {
        let (st, b) = post(
            &client,
            replicas[0].addr,
            &key,
            "/internal/remediations/propose",
            &body(idem),
        )
        .await;
        assert_eq!(st, 201, "{b}");
    }
    let n = 20;
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(n));
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let (client, key, body, barrier) = (
                client.clone(),
                key.clone(),
                body("race-across-replicas"),
                barrier.clone(),
            );
            let addr = replicas[i % 2].addr;
            tokio::spawn(async move {
                barrier.wait().await;
                post(&client, addr, &key, "/internal/remediations/propose", &body).await
            })
        })
        .collect();
    let mut histogram = std::collections::BTreeMap::<u16, usize>::new();
    let mut ids = std::collections::BTreeSet::new();
    let mut odd = Vec::new();
    for t in tasks {
        let (st, b) = t.await.unwrap();
        *histogram.entry(st).or_default() += 1;
        match st {
            200 | 201 => {
                ids.insert(b["proposal"]["id"].as_str().unwrap_or_default().to_string());
            }
            _ => odd.push(b),
        }
    }
    eprintln!("REPLAY-RACE postgres two replicas n={n}: {histogram:?}");
    assert_eq!(
        histogram,
        [(200, n - 1), (201, 1)].into_iter().collect(),
        "one created, the rest replays: {odd:?}"
    );
    assert_eq!(ids.len(), 1, "{ids:?}");
    drop(replicas);
}
