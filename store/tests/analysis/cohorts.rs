//! Cohort rows at their bounds: the per-minute cap on distinct flag variants
//! holds across bodies (the rest counted as overflow, nothing lost), and
//! request aggregates stored before cohort rows existed are converted on
//! open (both backends) and still judged, with a wider stated error bound.

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};
use prost::Message;
use pstack_store_core::analysis::cohort::MAX_FLAG_VARIANTS;
use pstack_store_core::db::analysis::VersionFilter;
use pstack_store_core::db::{OpenOptions, Store};
use reqwest::StatusCode;
use serde_json::json;

use super::{MIN_NS, anchor, id_bytes, kv, post_json, post_traces, rfc};
use crate::on_both_backends;
use crate::support::{Db, Harness, drop_schema, fresh_store};

/// One body: `per_variant` requests for each of `variants` of flag `exp`.
fn flag_body(minute_ns: i64, variants: std::ops::Range<usize>, per_variant: usize) -> Vec<u8> {
    let mut spans = Vec::new();
    for v in variants {
        for r in 0..per_variant {
            let n = (v * 100 + r) as u64;
            let start = (minute_ns + 5_000_000_000 + n as i64 * 1_000_000) as u64;
            spans.push(Span {
                trace_id: id_bytes(n, 16),
                span_id: id_bytes(n, 8),
                name: "GET /price".into(),
                kind: SpanKind::Server as i32,
                start_time_unix_nano: start,
                end_time_unix_nano: start + 3_000_000,
                attributes: vec![kv("obs.feature_flags.exp", &format!("v{v:02}"))],
                ..Default::default()
            });
        }
    }
    ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(Resource {
                attributes: vec![
                    kv("service.name", "pricing-api"),
                    kv("service.version", "3.1.0"),
                    kv("deployment.environment.name", "prod"),
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
    .encode_to_vec()
}

async fn flag_variants_are_capped_per_minute(db: Db) {
    let Some(h) = Harness::start(db).await else {
        return;
    };
    let minute = anchor(1);
    // 80 variants in one minute over two bodies: 64 kept, 16 counted as overflow.
    for range in [0..40, 40..80] {
        let (st, body) = post_traces(
            &h,
            flag_body(minute, range, 2),
            "application/x-protobuf",
            false,
        )
        .await;
        assert_eq!(st, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    }
    let (st, c) = post_json(
        &h,
        "/v1/changes",
        &json!({"environment": "prod", "kind": "feature_flag", "service": "pricing-api",
                "flags": {"exp": "v00"}, "at": rfc(minute)}),
    )
    .await;
    assert_eq!(st, StatusCode::CREATED, "{c}");
    let (st, b) = h
        .get(&format!(
            "/internal/changes/{}/blast-radius?window=30m&minSample=1",
            c["id"].as_str().unwrap()
        ))
        .await;
    assert_eq!(st, StatusCode::OK, "{b}");
    let overflow = 2 * (80 - MAX_FLAG_VARIANTS as i64);
    assert_eq!(b["cohortDimension"]["overflowCount"], overflow, "{b:#}");
    assert_eq!(b["cohorts"]["new"]["requestCount"], 2, "{b:#}");
    assert_eq!(
        b["cohorts"]["previous"]["requestCount"],
        2 * (MAX_FLAG_VARIANTS as i64 - 1),
        "{b:#}"
    );
    // Every request is still in its version cohort.
    let t = h
        .store
        .request_totals(
            "prod",
            "pricing-api",
            VersionFilter::Any,
            minute,
            minute + MIN_NS,
        )
        .await
        .unwrap();
    assert_eq!(t.requests, 160);
    h.finish().await;
}

/// Reopen the store behind `url`/`opts`.
async fn reopen(url: &str, opts: &OpenOptions) -> Store {
    Store::open(url, opts).await.expect("reopen the store")
}

async fn legacy_request_stats_are_converted_on_open(db: Db) {
    let Some((store, dir, pg)) = fresh_store(db).await else {
        return;
    };
    store.close().await;
    let minute = anchor(2);
    // (version, minute offset, latency bin, requests, errors): as the store
    // wrote them before cohort rows, 4 bins per octave (bin 40 = 1.02-1.22 ms).
    let rows: Vec<(&str, i64, i64, i64, i64)> = vec![
        ("1.0.0", 0, 40, 900, 3),
        ("1.0.0", 0, 60, 50, 1),
        ("1.0.0", 1, 40, 500, 0),
        ("1.0.1", 1, 44, 300, 30),
    ];
    let insert = "INSERT INTO request_stats (environment, service, version, bucket_ns, latency_bin, requests, errors)
                  VALUES ($1, $2, $3, $4, $5, $6, $7)";
    let (url, opts) = match (&dir, &pg) {
        (Some(dir), _) => {
            use sqlx::Connection;
            let path = dir.path().join("store.db");
            let mut c = sqlx::SqliteConnection::connect(&format!("sqlite://{}", path.display()))
                .await
                .unwrap();
            for (v, m, bin, req, err) in &rows {
                sqlx::query(insert)
                    .bind("prod")
                    .bind("legacy-api")
                    .bind(*v)
                    .bind(minute + m * MIN_NS)
                    .bind(*bin)
                    .bind(*req)
                    .bind(*err)
                    .execute(&mut c)
                    .await
                    .unwrap();
            }
            c.close().await.unwrap();
            (path.to_str().unwrap().to_string(), OpenOptions::default())
        }
        (None, Some((url, schema))) => {
            use sqlx::Connection;
            let mut c = sqlx::PgConnection::connect(url).await.unwrap();
            sqlx::query(&format!("SET search_path TO {schema}"))
                .execute(&mut c)
                .await
                .unwrap();
            for (v, m, bin, req, err) in &rows {
                sqlx::query(insert)
                    .bind("prod")
                    .bind("legacy-api")
                    .bind(*v)
                    .bind(minute + m * MIN_NS)
                    .bind(*bin)
                    .bind(*req)
                    .bind(*err)
                    .execute(&mut c)
                    .await
                    .unwrap();
            }
            c.close().await.unwrap();
            (
                url.clone(),
                OpenOptions {
                    pg_schema: Some(schema.clone()),
                    pg_max_connections: 8,
                    ..OpenOptions::default()
                },
            )
        }
        _ => unreachable!("a fresh store is SQLite or PostgreSQL"),
    };
    let store = reopen(&url, &opts).await;
    // Converted on open: nothing left to convert, every count kept.
    assert_eq!(store.convert_legacy_request_stats().await.unwrap(), 0);
    let total = |v| {
        let store = store.clone();
        async move {
            store
                .request_totals("prod", "legacy-api", v, minute, minute + 2 * MIN_NS)
                .await
                .unwrap()
        }
    };
    let old = total(VersionFilter::Is("1.0.0")).await;
    assert_eq!((old.requests, old.errors), (1450, 4));
    assert_eq!(old.legacy_rows, 2);
    let new = total(VersionFilter::Is("1.0.1")).await;
    assert_eq!((new.requests, new.errors), (300, 30));
    // Minute resolution: a legacy minute counts where it starts.
    let first = store
        .request_totals("prod", "legacy-api", VersionFilter::Any, minute, minute + 1)
        .await
        .unwrap();
    assert_eq!(first.requests, 950);
    // The stated bound covers the legacy bin (2^(40/4)..2^(41/4) µs), and is wider than α.
    let q = pstack_store_core::analysis::blast::p95_of(&old).unwrap();
    assert!(
        q.lower_ms <= 1.024 && q.upper_ms.unwrap() >= 1.2177,
        "{q:?}"
    );
    assert!(q.relative_error().unwrap() > 0.09, "{q:?}");
    // New requests merge into a converted row; it stays marked legacy.
    let batch = pstack_store_core::analysis::otlp::aggregate(&ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(Resource {
                attributes: vec![
                    kv("service.name", "legacy-api"),
                    kv("service.version", "1.0.0"),
                    kv("deployment.environment.name", "prod"),
                ],
                ..Default::default()
            }),
            scope_spans: vec![ScopeSpans {
                spans: vec![Span {
                    span_id: id_bytes(1, 8),
                    kind: SpanKind::Server as i32,
                    start_time_unix_nano: (minute + 30_000_000_000) as u64,
                    end_time_unix_nano: (minute + 30_002_000_000) as u64,
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        }],
    });
    store.ingest_traces(&batch, "k_test").await.unwrap();
    let old = total(VersionFilter::Is("1.0.0")).await;
    assert_eq!(old.requests, 1451);
    assert_eq!(old.legacy_rows, 2);
    store.close().await;
    // Another open converts nothing more.
    let store = reopen(&url, &opts).await;
    assert_eq!(store.convert_legacy_request_stats().await.unwrap(), 0);
    let again = store
        .request_totals(
            "prod",
            "legacy-api",
            VersionFilter::Any,
            minute,
            minute + 2 * MIN_NS,
        )
        .await
        .unwrap();
    assert_eq!(again.requests, 1751);
    store.close().await;
    drop(dir);
    drop_schema(pg).await;
}

on_both_backends!(
    flag_variants_are_capped_per_minute,
    legacy_request_stats_are_converted_on_open,
);
