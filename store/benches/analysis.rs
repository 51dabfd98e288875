//! pstack-store analysis benchmarks (not part of `cargo test`):
//!
//! ```text
//! cargo bench -p pstack-store --bench analysis -- [--backend sqlite|postgres|both] [--mode ingest|blast|sketch|all]
//! ```
//!
//! - **sketch** (no database): 10^6 synthetic latencies (lognormal; and
//!   bimodal) through the store's latency sketch and, side by side, through
//!   the 4-bins-per-octave histogram it replaced; each quantile's relative
//!   error against the exact quantile of the sorted values (same rank
//!   rule), the encoded size, and that merging 1,000 partial sketches
//!   changes nothing.
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
//!   per-minute cohort rows, each request at its second with a latency
//!   spread over 6 octaves, exactly what OTLP ingest writes), then times 200
//!   `GET /internal/changes/{id}/blast-radius?window=24h` over HTTP; p50/p99.
//!   The change is at hh:mm:30, so every cohort has two edge minutes read
//!   to the second.
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
use pstack_store::http::AppState;
use pstack_store::service::serve;
use pstack_store_core::analysis::cohort::{CohortKey, Dimension};
use pstack_store_core::analysis::otlp::{self, Batch, CallKey};
use pstack_store_core::analysis::sketch::{self, MinuteCells, Sketch};
use pstack_store_core::db::Store;
use pstack_store_core::ingest::IngestLimits;
use pstack_store_core::keys::ScopeSet;

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
    let base_ns = pstack_store_core::now_ns() - 2 * 60 * MIN_NS;
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
        "[{}] storage: {} bytes more in the database = {:.2} MB per million spans (cohort rows of 20 services x 2 versions x the minutes their bodies touch, each holding per-second latency buckets, plus call counters and the 1 % failed requests sampled)",
        t.name,
        after - before,
        (after - before) as f64 / spans as f64
    );
    let _ = stop.send(());
    Ok(())
}

/// One minute of `per_minute` requests: spread evenly over its 60 seconds,
/// latencies log-uniform over 6 octaves (5.8 ms to 370 ms, the old bench's
/// 24 bins of 2^(1/4)), `error_permille` of each second's requests failed.
fn minute_template(per_minute: i64, error_permille: i64, seed: u64) -> MinuteCells {
    let mut rng = Rng(seed | 1);
    let mut m = MinuteCells::default();
    let mut errors_due = 0i64;
    for i in 0..per_minute {
        let second = u8::try_from(i * 60 / per_minute.max(1)).unwrap_or(59);
        let u = (rng.next() >> 11) as f64 / (1u64 << 53) as f64;
        let us = 2f64.powf((50.0 + 24.0 * u) / 4.0);
        errors_due += error_permille;
        let failed = errors_due >= 1000;
        if failed {
            errors_due -= 1000;
        }
        m.record(second, sketch::key_of_ns((us * 1000.0) as i64), failed);
    }
    m
}

/// Pre-aggregated cohort rows for `requests` requests of (service,
/// version) spread over `minutes` minute buckets from `start_ns`.
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
    let template = minute_template(per_minute, error_permille, start_ns as u64 ^ 0x9e37);
    for m in 0..minutes {
        let bucket_ns = start_ns + m * MIN_NS;
        let mut cells = template.clone();
        if m < requests % minutes {
            cells.record(59, sketch::key_of_ns(40_000_000), false);
        }
        batch.cohorts.rows.insert(
            CohortKey {
                environment: "prod".into(),
                service: service.into(),
                dimension: Dimension::Version,
                name: String::new(),
                bucket_ns,
                value: version.into(),
            },
            cells,
        );
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
    let at = (pstack_store_core::now_ns() / MIN_NS) * MIN_NS - 2 * day * MIN_NS;
    let fill = Instant::now();
    let bytes_before = t.store.bench_database_bytes().await?;
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
                total_rows += b.cohorts.len() + b.calls.len();
                t.store.ingest_traces(&b, "bench").await?;
            }
        }
    }
    t.store.bench_analyze().await?;
    let filled = t.store.bench_database_bytes().await? - bytes_before;
    println!(
        "[{}] blast radius: {total_rows} aggregate rows written in {:.1} s (10 services, each 10,000,000 requests after the change + 4,000,000 before), {:.1} MB in the database = {:.3} MB per million requests",
        t.name,
        fill.elapsed().as_secs_f64(),
        filled as f64 / 1e6,
        filled as f64 / 140.0 / 1e6
    );
    let change = pstack_store_core::analysis::ledger::validate(
        serde_json::from_value(serde_json::json!({
            "environment": "prod", "kind": "deploy", "service": "checkout-api",
            "version": "2.4.1", "previousVersion": "2.4.0", "at": pstack_store_core::ident::format_ns(at + 30 * 1_000_000_000),
        }))?,
        pstack_store_core::now_ns(),
    )?;
    let id = t
        .store
        .record_change(&change, "bench", pstack_store_core::now_ns())
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

/// A standard normal draw (Box-Muller).
fn normal(rng: &mut Rng) -> f64 {
    let u = ((rng.next() >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
    let v = ((rng.next() >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
    (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()
}

/// The replaced histogram (4 bins per octave of µs, bin 0..=127, each read
/// at its geometric middle, p at the nearest rank ⌈p·n⌉).
fn legacy_quantile(sorted_bins: &[i64], q: f64) -> f64 {
    let n = sorted_bins.len();
    let rank = ((n as f64) * q).ceil().max(1.0) as usize;
    let bin = sorted_bins[rank.min(n) - 1];
    2f64.powf((bin as f64 + 0.5) / 4.0) / 1000.0
}

fn bench_sketch() {
    const N: usize = 1_000_000;
    let quantiles = [0.5, 0.9, 0.95, 0.99, 0.999];
    type Gen = Box<dyn Fn(&mut Rng) -> f64>;
    let shapes: Vec<(&str, Gen)> = vec![
        (
            "lognormal (median 50 ms, sigma 1)",
            Box::new(|r: &mut Rng| 50.0 * normal(r).exp()),
        ),
        (
            "bimodal (90 % lognormal median 20 ms sigma 0.3, 10 % median 800 ms sigma 0.2)",
            Box::new(|r: &mut Rng| {
                if r.next().is_multiple_of(10) {
                    800.0 * (0.2 * normal(r)).exp()
                } else {
                    20.0 * (0.3 * normal(r)).exp()
                }
            }),
        ),
    ];
    println!(
        "sketch: relative accuracy {} (gamma {:.6}), quantile rank floor(q(n-1)); the replaced histogram: 4 bins per octave, nearest rank",
        sketch::RELATIVE_ACCURACY,
        sketch::gamma()
    );
    for (name, draw) in shapes {
        let mut rng = Rng(0x51f1_5eed_0000_0001);
        let values_ns: Vec<i64> = (0..N).map(|_| (draw(&mut rng) * 1e6) as i64).collect();
        let started = Instant::now();
        let mut whole = Sketch::default();
        for v in &values_ns {
            whole.add(sketch::key_of_ns(*v), 1);
        }
        let add_ns = started.elapsed().as_nanos() as f64 / N as f64;
        // The same values as 1,000 minutes of per-second rows, merged.
        let mut merged = Sketch::default();
        let mut row_bytes = 0usize;
        for (m, chunk) in values_ns.chunks(N / 1000).enumerate() {
            let mut cells = MinuteCells::default();
            for (i, v) in chunk.iter().enumerate() {
                cells.record(
                    ((i * 60) / chunk.len()) as u8,
                    sketch::key_of_ns(*v),
                    (m + i) % 100 == 0,
                );
            }
            let bytes = cells.encode();
            row_bytes += bytes.len();
            MinuteCells::read_into(&bytes, sketch::SecondRange::ALL, &mut merged)
                .expect("own encoding");
        }
        assert_eq!(merged, whole, "merging per-second rows changes nothing");
        let mut sorted = values_ns.clone();
        sorted.sort_unstable();
        let mut legacy_bins: Vec<i64> = sorted
            .iter()
            .map(|ns| {
                let us = *ns as f64 / 1000.0;
                if us < 1.0 {
                    0
                } else {
                    ((us.log2() * 4.0).floor() as i64).clamp(0, 127)
                }
            })
            .collect();
        legacy_bins.sort_unstable();
        println!(
            "[sketch] {name}: {N} latencies; add {add_ns:.1} ns each; whole sketch {} bytes encoded ({} buckets), as 1,000 per-second minute rows {} bytes ({:.2} bytes per request)",
            whole.encode().len(),
            whole.buckets().len(),
            row_bytes,
            row_bytes as f64 / N as f64
        );
        let (mut worst, mut worst_legacy) = (0f64, 0f64);
        for q in quantiles {
            let exact = sorted[((q * (N as f64 - 1.0)).floor()) as usize] as f64 / 1e6;
            let est = whole.quantile(q).expect("non-empty");
            let err = (est.estimate_ms - exact).abs() / exact;
            assert!(
                est.lower_ms <= exact && est.upper_ms.is_none_or(|u| exact < u),
                "bounds"
            );
            let exact_nearest = sorted[((q * N as f64).ceil() as usize).max(1) - 1] as f64 / 1e6;
            let legacy = legacy_quantile(&legacy_bins, q);
            let legacy_err = (legacy - exact_nearest).abs() / exact_nearest;
            worst = worst.max(err);
            worst_legacy = worst_legacy.max(legacy_err);
            println!(
                "[sketch]   p{:<5} exact {:>10.4} ms | sketch {:>10.4} ms, error {:.4} % (bound {:.2} %) | 4-per-octave bins {:>10.4} ms, error {:.3} %",
                q * 100.0,
                exact,
                est.estimate_ms,
                err * 100.0,
                sketch::RELATIVE_ACCURACY * 100.0,
                legacy,
                legacy_err * 100.0
            );
        }
        // Every percentile 1..99.9 in steps of 0.1: the largest error seen.
        let mut worst_all = 0f64;
        for k in 10..=999 {
            let q = k as f64 / 1000.0;
            let exact = sorted[((q * (N as f64 - 1.0)).floor()) as usize] as f64 / 1e6;
            let est = whole.quantile(q).expect("non-empty").estimate_ms;
            worst_all = worst_all.max((est - exact).abs() / exact);
        }
        println!(
            "[sketch]   largest error over p50..p99.9 above: sketch {:.4} %, bins {:.3} %; over every p1.0..p99.9 (step 0.1): sketch {:.4} %",
            worst * 100.0,
            worst_legacy * 100.0,
            worst_all * 100.0
        );
    }
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
    if mode == "sketch" || mode == "all" {
        bench_sketch();
        if mode == "sketch" {
            return Ok(());
        }
    }
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
