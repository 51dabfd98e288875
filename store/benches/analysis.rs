//! pstack-store analysis benchmarks (not part of `cargo test`):
//!
//! ```text
//! cargo bench -p pstack-store --bench analysis -- [--backend sqlite|postgres|both] [--mode ingest|blast|all]
//! ```
//!
//! - **ingest**: 8 concurrent HTTP clients POST OTLP/HTTP protobuf bodies
//!   (each one exporter flush: 400 requests within 5 s, each one SERVER span
//!   and two CLIENT/PRODUCER spans, a database and a queue, 1 % failed; 20
//!   services x 2 versions, the 400 bodies 9 s apart over 60 minutes) to a
//!   real server on 127.0.0.1; prints spans/s and database bytes per million
//!   spans. Side by side in the same run: the same bodies decoded with
//!   `prost` and folded into aggregates on every core with no HTTP and no
//!   database (the CPU ceiling of this ingest design), and the ratios of
//!   throughput and of CPU per span (three interleaved rounds, medians).
//! - **blast**: records 10,000,000 requests of one service across both
//!   version cohorts over a 24 h window (plus a 24 h pre-change baseline and
//!   9 other services at the same density as noise) through the storage
//!   half of the ingest path (`Store::ingest_traces` with pre-aggregated
//!   per-minute rows, exactly what OTLP ingest writes), then times 200
//!   `GET /internal/changes/{id}/blast-radius?window=24h` over HTTP; p50/p99.
//!
//! PostgreSQL: `PSTACK_BENCH_PG_URL`, default
//! `postgres://pstack:pstack@127.0.0.1:5432/pstack_bench`; each run uses and
//! drops a fresh schema.

use std::sync::Arc;
use std::time::{Duration, Instant};

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use opentelemetry_proto::tonic::trace::v1::status::StatusCode as OtelStatus;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span, Status};
use prost::Message;
use pstack_store::analysis::otlp::{self, Batch, CallKey, RequestKey};
use pstack_store::db::Store;
use pstack_store::http::{AppState, serve};
use pstack_store::ingest::IngestLimits;
use pstack_store::keys::ScopeSet;

mod common;
use common::{Target, close, cpu_time, open, percentile};

const CLIENTS: usize = 8;
const BODIES: usize = 400;
const REQUESTS_PER_BODY: usize = 400;
const SPANS_PER_REQUEST: usize = 3;
const BLAST_REQUESTS: i64 = 10_000_000;
const BLAST_QUERIES: usize = 200;
const MIN_NS: i64 = 60_000_000_000;

async fn start(store: Store) -> anyhow::Result<(String, tokio::sync::oneshot::Sender<()>)> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let state = AppState::new(store, IngestLimits::default());
    tokio::spawn(serve(listener, state, async move {
        let _ = rx.await;
    }));
    Ok((format!("http://{addr}"), tx))
}

fn kv(k: &str, v: &str) -> KeyValue {
    KeyValue {
        key: k.into(),
        value: Some(AnyValue {
            value: Some(any_value::Value::StringValue(v.into())),
        }),
        ..Default::default()
    }
}

fn kv_int(k: &str, v: i64) -> KeyValue {
    KeyValue {
        key: k.into(),
        value: Some(AnyValue {
            value: Some(any_value::Value::IntValue(v)),
        }),
        ..Default::default()
    }
}

/// A small deterministic generator (xorshift64*).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

/// One OTLP body: 400 requests of one (service, version).
fn body(i: usize, base_ns: i64) -> ExportTraceServiceRequest {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ (i as u64 + 1));
    let service = format!("svc-{:02}", i % 20);
    let version = if (i / 20).is_multiple_of(2) {
        "1.0.0"
    } else {
        "1.1.0"
    };
    let mut spans = Vec::with_capacity(REQUESTS_PER_BODY * SPANS_PER_REQUEST);
    for r in 0..REQUESTS_PER_BODY {
        // One exporter flush: every request of the body within 5 s; the 400
        // bodies walk through 60 minutes, 9 s apart.
        let start = base_ns + i as i64 * 9_000_000_000 + (rng.next() % 5_000_000_000) as i64;
        let dur = 1_000_000 + (rng.next() % 200_000_000) as i64;
        let failed = rng.next().is_multiple_of(100);
        let trace_id = (rng.next() as u128 | ((rng.next() as u128) << 64))
            .to_be_bytes()
            .to_vec();
        let span_id = rng.next().to_be_bytes().to_vec();
        spans.push(Span {
            trace_id: trace_id.clone(),
            span_id: span_id.clone(),
            name: format!("GET /items/{}", r % 7),
            kind: SpanKind::Server as i32,
            start_time_unix_nano: start as u64,
            end_time_unix_nano: (start + dur) as u64,
            attributes: vec![
                kv("http.request.method", "GET"),
                kv_int("http.response.status_code", if failed { 500 } else { 200 }),
                kv("url.path", "/items"),
            ],
            status: Some(Status {
                code: if failed {
                    OtelStatus::Error
                } else {
                    OtelStatus::Unset
                } as i32,
                message: String::new(),
            }),
            ..Default::default()
        });
        let db = vec![
            kv("db.system.name", "postgresql"),
            kv("server.address", "orders-primary"),
            kv_int("server.port", 5432),
            kv("db.namespace", "orders"),
            kv("db.query.text", "SELECT * FROM orders WHERE id = $1"),
        ];
        let queue = vec![
            kv("messaging.system", "kafka"),
            kv("messaging.destination.name", "orders"),
        ];
        for (c, attrs) in [db, queue].into_iter().enumerate() {
            spans.push(Span {
                trace_id: trace_id.clone(),
                span_id: rng.next().to_be_bytes().to_vec(),
                parent_span_id: span_id.clone(),
                name: if c == 0 {
                    "SELECT orders"
                } else {
                    "publish orders"
                }
                .into(),
                kind: if c == 0 {
                    SpanKind::Client
                } else {
                    SpanKind::Producer
                } as i32,
                start_time_unix_nano: (start + 100_000) as u64,
                end_time_unix_nano: (start + 100_000 + dur / 4) as u64,
                attributes: attrs,
                ..Default::default()
            });
        }
    }
    ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(Resource {
                attributes: vec![
                    kv("service.name", &service),
                    kv("service.version", version),
                    kv("deployment.environment.name", "prod"),
                    kv("vcs.commit.id", "8f3a1b2c"),
                    kv("host.name", "node-7"),
                ],
                ..Default::default()
            }),
            scope_spans: vec![ScopeSpans {
                spans,
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
}

/// Decode + aggregate every body with as many threads as the store has
/// clients (on an oversubscribed machine the scheduler shares CPU per
/// runnable thread, so equal thread counts compare like with like): the
/// ceiling, in spans/s, and CPU per span.
fn decode_ceiling(bodies: Arc<Vec<Vec<u8>>>) -> (f64, Duration) {
    let threads = CLIENTS;
    let cpu = cpu_time();
    let started = Instant::now();
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let bodies = bodies.clone();
            std::thread::spawn(move || {
                let mut spans = 0usize;
                for b in bodies.iter().skip(t).step_by(threads) {
                    if let Ok(req) = otlp::decode(b, otlp::Encoding::Protobuf) {
                        spans += otlp::aggregate(&req).spans;
                    }
                }
                spans
            })
        })
        .collect();
    let spans: usize = handles.into_iter().map(|h| h.join().unwrap_or(0)).sum();
    let per_span = (cpu_time() - cpu) / u32::try_from(spans.max(1)).unwrap_or(u32::MAX);
    (spans as f64 / started.elapsed().as_secs_f64(), per_span)
}

async fn bench_ingest(t: &Target) -> anyhow::Result<()> {
    let key = t.store.create_key("bench", &ScopeSet::legacy()).await?;
    let (base, stop) = start(t.store.clone()).await?;
    let base_ns = pstack_store::now_ns() - 2 * 60 * MIN_NS;
    let bodies: Arc<Vec<Vec<u8>>> = Arc::new(
        (0..BODIES)
            .map(|i| body(i, base_ns).encode_to_vec())
            .collect(),
    );
    let wire_bytes: usize = bodies.iter().map(Vec::len).sum();
    let spans = BODIES * REQUESTS_PER_BODY * SPANS_PER_REQUEST;
    let before = t.store.bench_database_bytes().await?;
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(CLIENTS)
        .build()?;
    // Three rounds of (ceiling, store), interleaved: the machine is shared,
    // so the two sides see the same load; medians are reported.
    let mut ceilings = Vec::new();
    let mut rates = Vec::new();
    let mut ceiling_cpu = Vec::new();
    let mut store_cpu = Vec::new();
    let mut after = before;
    for round in 0..3 {
        let (c, c_cpu) = decode_ceiling(bodies.clone());
        ceilings.push(c);
        ceiling_cpu.push(c_cpu.as_secs_f64() * 1e6);
        let cpu = cpu_time();
        let started = Instant::now();
        let mut tasks = Vec::new();
        for c in 0..CLIENTS {
            let (client, bodies, base, key) = (
                client.clone(),
                bodies.clone(),
                base.clone(),
                key.plaintext.clone(),
            );
            tasks.push(tokio::spawn(async move {
                for b in bodies.iter().skip(c).step_by(CLIENTS) {
                    let resp = client
                        .post(format!("{base}/v1/traces"))
                        .bearer_auth(&key)
                        .header("content-type", "application/x-protobuf")
                        .body(b.clone())
                        .send()
                        .await?;
                    anyhow::ensure!(resp.status().is_success(), "HTTP {}", resp.status());
                }
                Ok::<(), anyhow::Error>(())
            }));
        }
        for task in tasks {
            task.await??;
        }
        rates.push(spans as f64 / started.elapsed().as_secs_f64());
        store_cpu.push((cpu_time() - cpu).as_secs_f64() * 1e6 / spans as f64);
        if round == 0 {
            // Storage of one pass (later rounds add to the same counters).
            after = t.store.bench_database_bytes().await?;
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let rounds = format!("{:.0?} / {:.0?}", rates, ceilings);
    let rate = median(&mut rates);
    let ceiling = median(&mut ceilings);
    let cpu_store = median(&mut store_cpu);
    let cpu_ceiling = median(&mut ceiling_cpu);
    println!(
        "[{}] OTLP protobuf ingest: {spans} spans in {BODIES} bodies ({:.1} MB on the wire) by {CLIENTS} clients, median of 3 rounds = {:.0} spans/s (rounds store / ceiling: {rounds})",
        t.name,
        wire_bytes as f64 / 1e6,
        rate
    );
    println!(
        "[{}] side by side: prost decode + aggregate alone, 8 threads (no HTTP, no database) = {:.0} spans/s; store / ceiling = {:.2}",
        t.name,
        ceiling,
        rate / ceiling
    );
    println!(
        "[{}] CPU per span (this process: server + clients; PostgreSQL's own CPU not included): store {:.2} µs, decode + aggregate alone {:.2} µs, ratio {:.2}",
        t.name,
        cpu_store,
        cpu_ceiling,
        cpu_store / cpu_ceiling
    );
    println!(
        "[{}] storage: {} bytes more in the database = {:.2} MB per million spans (aggregates of 20 services x 2 versions x 60 minutes x latency bins, plus the 1 % failed requests sampled; grows with distinct keys, not with spans)",
        t.name,
        after - before,
        (after - before) as f64 / spans as f64
    );
    let _ = stop.send(());
    Ok(())
}

/// Pre-aggregated rows for `requests` requests of (service, version) spread
/// over `minutes` minute buckets from `start_ns`, 24 latency bins a minute.
fn rows(
    batch: &mut Batch,
    service: &str,
    version: &str,
    start_ns: i64,
    minutes: i64,
    requests: i64,
    error_permille: i64,
) {
    let per_minute = requests / minutes;
    for m in 0..minutes {
        let bucket_ns = start_ns + m * MIN_NS;
        let mut left = per_minute + i64::from(m < requests % minutes);
        for bin in 0..24 {
            let n = if bin == 23 {
                left
            } else {
                (per_minute / 24).min(left)
            };
            left -= n;
            let agg = batch
                .requests
                .entry(RequestKey {
                    environment: "prod".into(),
                    service: service.into(),
                    version: version.into(),
                    bucket_ns,
                    latency_bin: 50 + bin,
                })
                .or_default();
            agg.requests += n;
            agg.errors += n * error_permille / 1000;
        }
        for (r, fanout) in [
            ("db:prod:postgresql:orders-primary:5432/orders", 3),
            ("queue:prod:kafka:orders", 1),
            ("service:prod:payments:443", 1),
        ] {
            let e = batch
                .calls
                .entry(CallKey {
                    environment: "prod".into(),
                    service: service.into(),
                    version: version.into(),
                    bucket_ns,
                    resource: r.into(),
                })
                .or_default();
            e.calls += per_minute * fanout;
            e.duration_us += per_minute * fanout * 2_000;
            e.exemplar = "5a000000000000000000000000000001/5a00000000000001".into();
        }
    }
}

async fn bench_blast(t: &Target) -> anyhow::Result<()> {
    let key = t.store.create_key("bench", &ScopeSet::legacy()).await?;
    let day = 24 * 60;
    let at = (pstack_store::now_ns() / MIN_NS) * MIN_NS - 2 * day * MIN_NS;
    let fill = Instant::now();
    let mut total_rows = 0usize;
    for s in 0..10 {
        let service = if s == 0 {
            "checkout-api".to_string()
        } else {
            format!("noise-{s:02}")
        };
        // Post-change: 10 M requests, 60 % new / 40 % previous; baseline 4 M on the previous version.
        for (version, start, requests, err) in [
            ("2.4.1", at, BLAST_REQUESTS * 6 / 10, 120),
            ("2.4.0", at, BLAST_REQUESTS * 4 / 10, 1),
            ("2.4.0", at - day * MIN_NS, BLAST_REQUESTS * 4 / 10, 1),
        ] {
            // One ingest transaction per 144 minutes of buckets.
            for chunk in 0..10 {
                let mut b = Batch::default();
                rows(
                    &mut b,
                    &service,
                    version,
                    start + chunk * 144 * MIN_NS,
                    144,
                    requests / 10,
                    err,
                );
                total_rows += b.requests.len() + b.calls.len();
                t.store.ingest_traces(&b, "bench").await?;
            }
        }
    }
    t.store.bench_analyze().await?;
    println!(
        "[{}] blast radius: {total_rows} aggregate rows written in {:.1} s (10 services, each 10,000,000 requests after the change + 4,000,000 before)",
        t.name,
        fill.elapsed().as_secs_f64()
    );
    let change = pstack_store::analysis::ledger::validate(
        serde_json::from_value(serde_json::json!({
            "environment": "prod", "kind": "deploy", "service": "checkout-api",
            "version": "2.4.1", "previousVersion": "2.4.0", "at": pstack_store::ident::format_ns(at),
        }))?,
        pstack_store::now_ns(),
    )?;
    let id = t
        .store
        .record_change(&change, "bench", pstack_store::now_ns())
        .await?;
    let (base, stop) = start(t.store.clone()).await?;
    let client = reqwest::Client::new();
    let url = format!("{base}/internal/changes/{id}/blast-radius?window=24h");
    let mut lat = Vec::with_capacity(BLAST_QUERIES);
    let mut verdict = String::new();
    let mut counted = 0;
    for _ in 0..BLAST_QUERIES {
        let started = Instant::now();
        let resp = client.get(&url).bearer_auth(&key.plaintext).send().await?;
        anyhow::ensure!(resp.status().is_success(), "HTTP {}", resp.status());
        let body: serde_json::Value = resp.json().await?;
        lat.push(started.elapsed());
        verdict = body["verdict"].as_str().unwrap_or_default().to_string();
        counted = body["cohorts"]["new"]["requestCount"].as_i64().unwrap_or(0)
            + body["cohorts"]["previous"]["requestCount"]
                .as_i64()
                .unwrap_or(0);
    }
    lat.sort();
    println!(
        "[{}] blast radius over {counted} requests in both cohorts ({verdict}): {BLAST_QUERIES} queries, p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        t.name,
        percentile(&lat, 0.5).as_secs_f64() * 1e3,
        percentile(&lat, 0.99).as_secs_f64() * 1e3,
        lat.last().copied().unwrap_or_default().as_secs_f64() * 1e3
    );
    let _ = stop.send(());
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let arg = |name: &str, default: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1).cloned())
            .unwrap_or_else(|| default.to_string())
    };
    let backend = arg("--backend", "both");
    let mode = arg("--mode", "all");
    let backends: Vec<&str> = match backend.as_str() {
        "both" => vec!["sqlite", "postgres"],
        "sqlite" => vec!["sqlite"],
        "postgres" => vec!["postgres"],
        other => anyhow::bail!("--backend {other}: sqlite, postgres or both"),
    };
    for b in backends {
        if mode == "ingest" || mode == "all" {
            let t = open(b).await?;
            bench_ingest(&t).await?;
            close(t).await;
        }
        if mode == "blast" || mode == "all" {
            let t = open(b).await?;
            bench_blast(&t).await?;
            close(t).await;
        }
    }
    Ok(())
}
