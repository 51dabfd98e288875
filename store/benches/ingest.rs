//! pstack-store benchmarks (not part of `cargo test`):
//!
//! ```text
//! cargo bench -p pstack-store --bench ingest -- [--backend sqlite|postgres|both]
//!     [--mode ingest|external|history|scale|all] [--clients N] [--stored N]
//! ```
//!
//! - **ingest**: `--clients` (default 16) concurrent HTTP clients POST gzip
//!   JSON-array batches of 100 distinct ~20 KiB sealed envelopes (what the
//!   daemon ships; 32,000 in all, split between the clients) to a real server
//!   on 127.0.0.1; prints envelopes/s, MB/s (decoded JSON) and batch latency.
//!   With `--stored N` the store first holds N synthetic envelopes (generated
//!   by the database, 512-byte bodies), so the indexes are that deep.
//!   Side by side, the same envelopes through `pstack_envelope::verify` alone on
//!   every core: the CPU ceiling of any verifying store on this machine, and
//!   the ratio of the two.
//! - **scale**: the ingest run at 1, 4 and 16 clients into an empty store, then
//!   at 16 clients into a store already holding 1,000,000 and 10,000,000
//!   envelopes (about 12 GB of disk per backend at the largest).
//! - **external**: the same load against `pstack-store serve` run as its own
//!   process (SQLite in a tempdir, or PostgreSQL in a fresh schema passed as
//!   the URL's `options[search_path]`), to measure the server's CPU per
//!   envelope apart from the clients'. `--store-bin A,B` runs it against
//!   other builds of the binary too, interleaved A, B, A, B (`--rounds`,
//!   default 1): how a change to the server costs, in one run. A binary
//!   older than key scopes is given its key without `--scope`. With
//!   `--mode all` it runs on SQLite only.
//! - **history**: bulk-inserts 1,000,000 synthetic rows directly via SQL
//!   (multi-row INSERTs, bypassing verification; 1,000 subjects x 1,000
//!   captures, small bodies because the history query never reads bodies),
//!   then times 2,000 `GET /v1/subjects` history queries (first page of 50,
//!   random subject, over HTTP) and prints p50/p99/max.
//!
//! PostgreSQL: `PSTACK_BENCH_PG_URL`, default
//! `postgres://pstack:pstack@127.0.0.1:5432/pstack_bench` (created by
//! `scripts/setup.d/20-postgres.sh`); each run uses and drops a fresh schema.

use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use pstack_store::http::AppState;
use pstack_store::service::serve;
use pstack_store_core::db::Store;
use pstack_store_core::ingest::IngestLimits;
use pstack_store_core::keys::{Scope, ScopeSet};
use pstack_store_core::synthetic::Capture;

mod common;
use common::{close, cpu_time, cpu_time_of, open, percentile};

const DEFAULT_CLIENTS: usize = 16;
const BATCH: usize = 100;
/// Batches per run, split evenly between the clients (1, 2, 4, 8, 16, 32...).
const BATCHES: usize = 320;
const HISTORY_ROWS: u64 = 1_000_000;
const HISTORY_SUBJECTS: u64 = 1_000;
const HISTORY_QUERIES: usize = 2_000;

async fn start(
    store: Store,
) -> anyhow::Result<(
    String,
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<std::io::Result<()>>,
)> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let state = AppState::new(store, IngestLimits::default());
    let server = tokio::spawn(serve(listener, state, async move {
        let _ = rx.await;
    }));
    Ok((format!("http://{addr}"), tx, server))
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    let _ = enc.write_all(bytes);
    enc.finish().unwrap_or_default()
}

struct Batches {
    gz: Vec<Vec<Vec<u8>>>,
    raw_bytes: usize,
    envelopes: usize,
    items: Arc<Vec<Vec<u8>>>,
}

fn make_batches(run: u64, clients: usize) -> Batches {
    let per_client = BATCHES / clients;
    let total = clients * per_client * BATCH;
    let items: Vec<Vec<u8>> = (0..total)
        .map(|i| {
            let c = Capture::new(
                &format!("node-{}", i % 64),
                1000 + (i % 997) as u32,
                run * 10_000_000 + i as u64,
            );
            c.bytes().map(|(_, b)| b).unwrap_or_default()
        })
        .collect();
    let raw_bytes = items.iter().map(Vec::len).sum();
    let mut gz = Vec::new();
    for c in 0..clients {
        let mut mine = Vec::new();
        for b in 0..per_client {
            let start = (c * per_client + b) * BATCH;
            let mut body = vec![b'['];
            for (k, item) in items[start..start + BATCH].iter().enumerate() {
                if k > 0 {
                    body.push(b',');
                }
                body.extend_from_slice(item);
            }
            body.push(b']');
            mine.push(gzip(&body));
        }
        gz.push(mine);
    }
    Batches {
        gz,
        raw_bytes,
        envelopes: total,
        items: Arc::new(items),
    }
}

fn verify_ceiling(items: Arc<Vec<Vec<u8>>>) -> f64 {
    let threads = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let started = Instant::now();
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let items = items.clone();
            std::thread::spawn(move || {
                let mut ok = 0usize;
                for item in items.iter().skip(t).step_by(threads) {
                    ok += usize::from(pstack_envelope::verify(item).is_ok());
                }
                ok
            })
        })
        .collect();
    let ok: usize = handles.into_iter().map(|h| h.join().unwrap_or(0)).sum();
    assert_eq!(ok, items.len());
    items.len() as f64 / started.elapsed().as_secs_f64()
}

async fn bench_ingest(backend: &str, run: u64, clients: usize, stored: u64) -> anyhow::Result<()> {
    let t = open(backend).await?;
    if stored > 0 {
        eprintln!("[{}] generating {stored} stored envelopes...", t.name);
        let t0 = Instant::now();
        t.store
            .bench_fill_history(stored, HISTORY_SUBJECTS, &[b' '; 512], |done| {
                eprintln!("  {done} rows ({:.0} s)", t0.elapsed().as_secs_f64());
            })
            .await?;
        t.store.bench_analyze().await?;
    }
    eprintln!(
        "[{}] preparing {} envelopes...",
        t.name,
        BATCHES / clients * clients * BATCH
    );
    let batches = make_batches(run, clients);
    let (base, stop, server) = start(t.store.clone()).await?;
    let key = t
        .store
        .create_key("bench", &ScopeSet::of([Scope::Ingest]))
        .await?
        .plaintext;
    let client = reqwest::Client::builder()
        .no_gzip()
        .pool_max_idle_per_host(clients)
        .build()?;
    eprintln!("[{}] ingesting...", t.name);
    let started = Instant::now();
    let cpu0 = cpu_time();
    let mut tasks = Vec::new();
    for mine in batches.gz {
        let client = client.clone();
        let url = format!("{base}/v1/envelopes");
        let key = key.clone();
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            let mut accepted = 0u64;
            for body in mine {
                let t0 = Instant::now();
                let resp = client
                    .post(&url)
                    .bearer_auth(&key)
                    .header("content-type", "application/json")
                    .header("content-encoding", "gzip")
                    .body(body)
                    .send()
                    .await?;
                let status = resp.status();
                let v: serde_json::Value = resp.json().await?;
                anyhow::ensure!(status.is_success(), "HTTP {status}: {v}");
                accepted += v["accepted"].as_u64().unwrap_or(0);
                lat.push(t0.elapsed());
            }
            Ok::<_, anyhow::Error>((lat, accepted))
        }));
    }
    let mut lat = Vec::new();
    let mut accepted = 0;
    for task in tasks {
        let (l, a) = task.await??;
        lat.extend(l);
        accepted += a;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let cpu = (cpu_time() - cpu0).as_secs_f64();
    anyhow::ensure!(
        accepted as usize == batches.envelopes,
        "accepted {accepted} of {}",
        batches.envelopes
    );
    lat.sort();
    let eps = batches.envelopes as f64 / elapsed;
    let mbps = batches.raw_bytes as f64 / elapsed / 1e6;
    let _ = stop.send(());
    let _ = server.await;
    let cpu1 = cpu_time();
    let t1 = Instant::now();
    let ceiling = verify_ceiling(batches.items.clone());
    let verify_cpu_us = (cpu_time() - cpu1).as_secs_f64() * 1e6 / batches.envelopes as f64;
    let _ = t1;
    println!(
        "ingest {:<8} {} envelopes ({:.1} KiB avg) from {clients} clients into {stored} stored, batches of {BATCH} gzip: {:.0} envelopes/s, {:.1} MB/s; batch latency p50 {:.1} ms p99 {:.1} ms; CPU {:.0} us/envelope (server + clients)",
        t.name,
        batches.envelopes,
        batches.raw_bytes as f64 / batches.envelopes as f64 / 1024.0,
        eps,
        mbps,
        percentile(&lat, 0.5).as_secs_f64() * 1e3,
        percentile(&lat, 0.99).as_secs_f64() * 1e3,
        cpu * 1e6 / batches.envelopes as f64,
    );
    println!(
        "       {:<8} side by side: pstack_envelope::verify alone on all cores {:.0} envelopes/s (CPU {:.0} us/envelope); store/verify-only ratio {:.2}",
        t.name,
        ceiling,
        verify_cpu_us,
        eps / ceiling
    );
    close(t).await;
    Ok(())
}

/// A fresh, empty schema at `PSTACK_BENCH_PG_URL` for a store in another
/// process: (url, schema). Drop it with [`drop_pg_schema`].
pub async fn pg_schema() -> anyhow::Result<(String, String)> {
    use sqlx::Connection;
    let url = common::pg_url();
    let schema = common::random_schema()?;
    let mut c = sqlx::PgConnection::connect(&url).await?;
    sqlx::query(&format!("CREATE SCHEMA {schema}"))
        .execute(&mut c)
        .await?;
    Ok((url, schema))
}

/// CPU time of every `postgres` process on the host (the PostgreSQL
/// server's backends, checkpointer, WAL writer): what a PostgreSQL-backed
/// ingest costs beside the store's own process. Other clients of the same
/// server are counted too.
pub fn postgres_cpu_time() -> Duration {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Duration::ZERO;
    };
    dir.filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str().map(str::to_string))
        .filter(|pid| pid.bytes().all(|b| b.is_ascii_digit()))
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|c| c.trim_end() == "postgres")
        })
        .map(|pid| cpu_time_of(&pid))
        .sum()
}

/// Ingest into the `pstack-store serve` binary in its own process (SQLite, or
/// PostgreSQL in a fresh schema), so the server's CPU per envelope is
/// measured apart from the clients'.
async fn bench_ingest_external(run: u64, bin: &str, backend: &str) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let pg = if backend == "postgres" {
        Some(pg_schema().await?)
    } else {
        None
    };
    let db = match &pg {
        // The binary takes the schema as the connection's search path.
        Some((url, schema)) => {
            let sep = if url.contains('?') { '&' } else { '?' };
            format!("{url}{sep}options[search_path]={schema}")
        }
        None => {
            let db = dir.path().join("external.db");
            db.to_str().unwrap_or_default().to_string()
        }
    };
    let create = |scoped: bool| {
        let mut args = vec!["--db", &db, "keys", "create", "--name", "bench"];
        if scoped {
            args.extend(["--scope", "ingest"]);
        }
        std::process::Command::new(bin).args(args).output()
    };
    let mut out = create(true)?;
    if !out.status.success() {
        // A build from before key scopes knows no `--scope`.
        out = create(false)?;
    }
    anyhow::ensure!(out.status.success(), "keys create failed ({bin})");
    let key = String::from_utf8(out.stdout)?.trim().to_string();
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let listen = format!("127.0.0.1:{port}");
    let mut child = std::process::Command::new(bin)
        .args(["--db", &db, "serve", "--listen", &listen])
        .env("PSTACK_STORE_LOG", "warn")
        .stderr(std::process::Stdio::null())
        .spawn()?;
    let pid = child.id().to_string();
    let client = reqwest::Client::builder()
        .no_gzip()
        .pool_max_idle_per_host(DEFAULT_CLIENTS)
        .build()?;
    let base = format!("http://{listen}");
    for _ in 0..200 {
        if client.get(format!("{base}/healthz")).send().await.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eprintln!("[{backend}, separate server process] preparing...");
    let batches = make_batches(run, DEFAULT_CLIENTS);
    let server0 = cpu_time_of(&pid);
    let postgres0 = postgres_cpu_time();
    let client0 = cpu_time();
    let started = Instant::now();
    let mut tasks = Vec::new();
    for mine in batches.gz {
        let client = client.clone();
        let url = format!("{base}/v1/envelopes");
        let key = key.clone();
        tasks.push(tokio::spawn(async move {
            let mut accepted = 0u64;
            for body in mine {
                let resp = client
                    .post(&url)
                    .bearer_auth(&key)
                    .header("content-type", "application/json")
                    .header("content-encoding", "gzip")
                    .body(body)
                    .send()
                    .await?;
                anyhow::ensure!(resp.status().is_success(), "HTTP {}", resp.status());
                let v: serde_json::Value = resp.json().await?;
                accepted += v["accepted"].as_u64().unwrap_or(0);
            }
            Ok::<_, anyhow::Error>(accepted)
        }));
    }
    let mut accepted = 0;
    for t in tasks {
        accepted += t.await??;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let server_cpu = (cpu_time_of(&pid) - server0).as_secs_f64();
    let postgres_cpu = (postgres_cpu_time().saturating_sub(postgres0)).as_secs_f64();
    let client_cpu = (cpu_time() - client0).as_secs_f64();
    anyhow::ensure!(
        accepted as usize == batches.envelopes,
        "accepted {accepted}"
    );
    let n = batches.envelopes as f64;
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load = load.split_whitespace().next().unwrap_or("?");
    let postgres = if pg.is_some() {
        format!(
            ", PostgreSQL processes CPU {:.0} us/envelope",
            postgres_cpu * 1e6 / n
        )
    } else {
        String::new()
    };
    println!(
        "ingest {backend:<8} ({bin} serve in its own process) {:.0} envelopes/s, {:.1} MB/s; server CPU {:.0} us/envelope{postgres}, clients CPU {:.0} us/envelope; load average {load}",
        n / elapsed,
        batches.raw_bytes as f64 / elapsed / 1e6,
        server_cpu * 1e6 / n,
        client_cpu * 1e6 / n,
    );
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status();
    let _ = child.wait();
    if let Some((url, schema)) = pg {
        common::drop_pg_schema(&url, &schema).await;
    }
    Ok(())
}

async fn bench_history(backend: &str) -> anyhow::Result<()> {
    let t = open(backend).await?;
    let body = vec![b' '; 512];
    eprintln!(
        "[{}] bulk-inserting {HISTORY_ROWS} synthetic rows...",
        t.name
    );
    let t0 = Instant::now();
    t.store
        .bench_fill_history(HISTORY_ROWS, HISTORY_SUBJECTS, &body, |done| {
            if done % 100_000 == 0 {
                eprintln!("  {done} rows ({:.0} s)", t0.elapsed().as_secs_f64());
            }
        })
        .await?;
    let fill = t0.elapsed().as_secs_f64();
    if t.name == "postgres" {
        // Fresh statistics, as autovacuum would eventually provide.
        t.store.bench_analyze().await?;
    }
    let (base, stop, server) = start(t.store.clone()).await?;
    let key = t
        .store
        .create_key("bench", &ScopeSet::of([Scope::Ingest]))
        .await?
        .plaintext;
    let client = reqwest::Client::builder().no_gzip().build()?;
    let mut lat = Vec::with_capacity(HISTORY_QUERIES);
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    for i in 0..HISTORY_QUERIES + 100 {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let s = seed % HISTORY_SUBJECTS;
        let url = format!(
            "{base}/v1/subjects?kind=process&host=bench-host&pid={}&start_ticks={s}&limit=50",
            1000 + s
        );
        let q0 = Instant::now();
        let resp = client.get(&url).bearer_auth(&key).send().await?;
        anyhow::ensure!(resp.status().is_success(), "HTTP {}", resp.status());
        let v: serde_json::Value = resp.json().await?;
        let n = v["items"].as_array().map(Vec::len).unwrap_or(0);
        anyhow::ensure!(n == 50, "expected a full page, got {n}");
        if i >= 100 {
            lat.push(q0.elapsed()); // the first 100 warm the caches
        }
    }
    lat.sort();
    println!(
        "history {:<8} {HISTORY_ROWS} rows ({HISTORY_SUBJECTS} subjects; filled in {fill:.0} s): {HISTORY_QUERIES} GET /v1/subjects (page of 50, newest first) p50 {:.2} ms p99 {:.2} ms max {:.2} ms",
        t.name,
        percentile(&lat, 0.5).as_secs_f64() * 1e3,
        percentile(&lat, 0.99).as_secs_f64() * 1e3,
        lat.last().copied().unwrap_or_default().as_secs_f64() * 1e3,
    );
    let _ = stop.send(());
    let _ = server.await;
    close(t).await;
    Ok(())
}

fn arg(name: &str, default: &str) -> String {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
        .unwrap_or_else(|| default.to_string())
}

fn main() -> anyhow::Result<()> {
    let backend = arg("--backend", "both");
    let mode = arg("--mode", "all");
    let clients: usize = arg("--clients", "16").parse()?;
    anyhow::ensure!(
        (1..=BATCHES).contains(&clients),
        "--clients {clients}: between 1 and {BATCHES}"
    );
    let stored: u64 = arg("--stored", "0").parse()?;
    let backends: Vec<&str> = match backend.as_str() {
        "both" => vec!["sqlite", "postgres"],
        "sqlite" => vec!["sqlite"],
        "postgres" => vec!["postgres"],
        other => anyhow::bail!("--backend {other}: sqlite, postgres or both"),
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        for (i, b) in backends.iter().enumerate() {
            if mode == "ingest" || mode == "all" {
                bench_ingest(b, i as u64 + 1, clients, stored).await?;
            }
            if mode == "scale" {
                for (k, n) in [1, 4, 16].into_iter().enumerate() {
                    bench_ingest(b, 10 * (i as u64 + 1) + k as u64, n, 0).await?;
                }
                for (k, n) in [1_000_000, 10_000_000].into_iter().enumerate() {
                    bench_ingest(b, 20 * (i as u64 + 1) + k as u64, DEFAULT_CLIENTS, n).await?;
                }
            }
            if mode == "external" || (*b == "sqlite" && mode == "all") {
                let own = env!("CARGO_BIN_EXE_pstack-store").to_string();
                let bins: Vec<String> = match arg("--store-bin", "").as_str() {
                    "" => vec![own],
                    list => list.split(',').map(str::to_string).collect(),
                };
                let rounds: usize = arg("--rounds", "1").parse()?;
                for round in 0..rounds {
                    for bin in &bins {
                        bench_ingest_external(7 + round as u64, bin, b).await?;
                    }
                }
            }
            if mode == "history" || mode == "all" {
                bench_history(b).await?;
            }
        }
        Ok(())
    })
}
