//! Bounded OTLP ingest (issue 28, item 3), through real HTTP into a real
//! server on SQLite and PostgreSQL: the per-request span cap at, below and
//! above it (protobuf and JSON); every string the store keeps capped, the
//! refusal naming the field; `/v1/traces` sharing `/v1/envelopes`'s
//! per-key concurrency (429 with Retry-After) and in-flight memory budget
//! (503 with Retry-After while held, 413 when a body's decoding could never
//! fit).
//! The RSS drill against the real binary is `hostile::otlp`.

use std::io::{Read, Write};
use std::sync::Arc;
use std::time::Duration;

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};
use prost::Message;
use pstack_store::conn::{ConnLimits, Guards};
use pstack_store_core::ingest::IngestLimits;
use reqwest::StatusCode;
use serde_json::Value;

use crate::on_both_backends;
use crate::support::{Db, Harness, code};

fn kv(k: &str, v: &str) -> KeyValue {
    KeyValue {
        key: k.into(),
        value: Some(AnyValue {
            value: Some(any_value::Value::StringValue(v.into())),
        }),
        ..Default::default()
    }
}

/// `n` SERVER spans of checkout-api (a minute ago).
fn spans(n: usize) -> Vec<Span> {
    let start = (pstack_store_core::now_ns() - 60_000_000_000) as u64;
    (0..n as u64)
        .map(|i| Span {
            trace_id: (i + 1).to_be_bytes().repeat(2),
            span_id: (i + 1).to_be_bytes().to_vec(),
            name: "GET /cart".into(),
            kind: 2,
            start_time_unix_nano: start + i,
            end_time_unix_nano: start + i + 5_000_000,
            ..Default::default()
        })
        .collect()
}

fn request(spans: Vec<Span>, resource: Vec<KeyValue>) -> ExportTraceServiceRequest {
    ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(Resource {
                attributes: resource,
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

fn service() -> Vec<KeyValue> {
    vec![
        kv("service.name", "checkout-api"),
        kv("deployment.environment.name", "prod"),
    ]
}

async fn post(h: &Harness, req: &ExportTraceServiceRequest, json: bool) -> (StatusCode, Value) {
    let (ct, body) = if json {
        ("application/json", serde_json::to_vec(req).unwrap())
    } else {
        ("application/x-protobuf", req.encode_to_vec())
    };
    let resp = h
        .client
        .post(h.url("/v1/traces"))
        .bearer_auth(&h.key)
        .header("content-type", ct)
        .body(body)
        .send()
        .await
        .expect("POST /v1/traces");
    let status = resp.status();
    let retry = resp.headers().get("retry-after").cloned();
    let bytes = resp.bytes().await.unwrap();
    let mut v: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    if let Some(r) = retry {
        v["retryAfterHeader"] = Value::String(r.to_str().unwrap().into());
    }
    (status, v)
}

// The per-request span cap: at and below it accepted, one above refused
// whole with 413 too_many_spans naming the cap, in both encodings.
async fn span_cap_at_below_and_above(db: Db) {
    let limits = IngestLimits {
        max_spans: 100,
        ..IngestLimits::default()
    };
    let Some(h) = Harness::start_with(db, limits).await else {
        return;
    };
    for json in [false, true] {
        for n in [99, 100] {
            let (st, b) = post(&h, &request(spans(n), service()), json).await;
            assert_eq!(st, StatusCode::OK, "{n} spans (json {json}): {b}");
        }
        let (st, b) = post(&h, &request(spans(101), service()), json).await;
        assert_eq!(
            (st, code(&b)),
            (StatusCode::PAYLOAD_TOO_LARGE, "too_many_spans"),
            "json {json}: {b}"
        );
        let msg = b["error"]["message"].as_str().unwrap();
        assert!(
            msg.contains("101 spans") && msg.contains("at most 100"),
            "{msg}"
        );
    }
    h.finish().await;
}

// Strings the store keeps are capped (service.name and the other
// identities at 256 bytes, descriptive text at 1024), ids at the spec's
// lengths, flags per failed request at 64; past a cap the request is
// refused whole, the field named.
async fn kept_strings_past_their_cap_are_refused_with_the_field_named(db: Db) {
    let Some(h) = Harness::start(db).await else {
        return;
    };
    let at_cap = vec![kv("service.name", &"s".repeat(256))];
    let (st, b) = post(&h, &request(spans(3), at_cap), false).await;
    assert_eq!(st, StatusCode::OK, "{b}");
    let span0 = "resourceSpans[0].scopeSpans[0].spans[0]";
    let mut named_span = spans(1);
    named_span[0].name = "n".repeat(1025);
    let mut long_version = spans(1);
    long_version[0].attributes = vec![kv("service.version", &"v".repeat(257))];
    let mut long_trace = spans(1);
    long_trace[0].trace_id = vec![1; 17];
    let mut flags = spans(1);
    flags[0].attributes = (0..65)
        .map(|i| kv(&format!("obs.feature_flags.f{i}"), "on"))
        .collect();
    let mut long_path = spans(1);
    long_path[0].events = vec![opentelemetry_proto::tonic::trace::v1::span::Event {
        name: "exception".into(),
        attributes: vec![kv("code.filepath", &"p".repeat(1025))],
        ..Default::default()
    }];
    let cases: Vec<(ExportTraceServiceRequest, &str, String)> = vec![
        (
            request(spans(1), vec![kv("service.name", &"s".repeat(257))]),
            "field_too_long",
            "resourceSpans[0].resource.attributes[service.name]".into(),
        ),
        (
            request(spans(1), vec![kv("service.name", &"s".repeat(1 << 20))]),
            "field_too_long",
            "resourceSpans[0].resource.attributes[service.name]".into(),
        ),
        (
            request(
                spans(1),
                vec![kv("deployment.environment.name", &"e".repeat(300))],
            ),
            "field_too_long",
            "resourceSpans[0].resource.attributes[deployment.environment.name]".into(),
        ),
        (
            request(long_version, service()),
            "field_too_long",
            format!("{span0}.attributes[service.version]"),
        ),
        (
            request(named_span, service()),
            "field_too_long",
            format!("{span0}.name"),
        ),
        (
            request(long_trace, service()),
            "field_too_long",
            format!("{span0}.traceId"),
        ),
        (
            request(long_path, service()),
            "field_too_long",
            format!("{span0}.events[0].attributes[code.filepath]"),
        ),
        (
            request(flags, service()),
            "too_many_values",
            span0.to_string(),
        ),
    ];
    for (req, want, field) in cases {
        for json in [false, true] {
            let (st, b) = post(&h, &req, json).await;
            assert_eq!(
                (st, code(&b)),
                (StatusCode::BAD_REQUEST, want),
                "{field}: {b}"
            );
            assert_eq!(b["error"]["field"], field.as_str(), "{b}");
        }
    }
    h.finish().await;
}

// /v1/traces holds a slot of the key's concurrency like /v1/envelopes: a
// second request of the key past the limit is 429 key_busy + Retry-After.
async fn traces_share_the_per_key_limit(db: Db) {
    let Some(h) = Harness::start_custom(db, IngestLimits::default(), |s| {
        s.guards = Arc::new(Guards::new(ConnLimits {
            per_key_concurrency: 1,
            ..ConnLimits::default()
        }));
    })
    .await
    else {
        return;
    };
    // A request that is admitted and then waits for the rest of its body.
    let addr = h.base.trim_start_matches("http://").to_string();
    let key = h.key.clone();
    let mut slow = tokio::task::spawn_blocking(move || {
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        write!(
            s,
            "POST /v1/traces HTTP/1.1\r\nHost: s\r\nAuthorization: Bearer {key}\r\nContent-Type: application/x-protobuf\r\nContent-Length: 1000\r\n\r\n"
        )
        .unwrap();
        s.write_all(&[0u8; 10]).unwrap();
        s
    })
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (st, b) = post(&h, &request(spans(1), service()), false).await;
    assert_eq!(
        (st, code(&b)),
        (StatusCode::TOO_MANY_REQUESTS, "key_busy"),
        "{b}"
    );
    assert_eq!(b["retryAfterHeader"], "1", "{b}");
    // The slot comes back when the slow request ends.
    slow.shutdown(std::net::Shutdown::Write).unwrap();
    let mut rest = Vec::new();
    let _ = slow.read_to_end(&mut rest);
    drop(slow);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let (st, b) = post(&h, &request(spans(1), service()), false).await;
    assert_eq!(st, StatusCode::OK, "{b}");
    h.finish().await;
}

// OTLP decoding is charged to the in-flight budget by its decoded size:
// a body whose decoding could never fit the budget is 413; one that fits
// only when other requests let go is 503 + Retry-After, and counted.
async fn traces_are_charged_to_the_in_flight_budget(db: Db) {
    let Some(h) = Harness::start_custom(db, IngestLimits::default(), |s| {
        s.guards = Arc::new(Guards::new(ConnLimits {
            inflight_budget_bytes: 4 << 20,
            ..ConnLimits::default()
        }));
    })
    .await
    else {
        return;
    };
    // 20,000 empty spans: 40 KB on the wire, ~16 MB decoded.
    let empty = request(vec![Span::default(); 20_000], vec![]);
    assert!(empty.encoded_len() < 100_000);
    let (st, b) = post(&h, &empty, false).await;
    assert_eq!(
        (st, code(&b)),
        (StatusCode::PAYLOAD_TOO_LARGE, "otlp_decode_too_large"),
        "{b}"
    );
    // An envelope request declaring 3 MiB holds most of the budget while
    // its body trickles in.
    let addr = h.base.trim_start_matches("http://").to_string();
    let key = h.key.clone();
    let mut holder = tokio::task::spawn_blocking(move || {
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        write!(
            s,
            "POST /v1/envelopes HTTP/1.1\r\nHost: s\r\nAuthorization: Bearer {key}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n[",
            3 << 20
        )
        .unwrap();
        s
    })
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    // 2,000 empty spans: ~1.6 MB decoded, more than the budget has free.
    let (st, b) = post(&h, &request(vec![Span::default(); 2_000], vec![]), false).await;
    assert_eq!(
        (st, code(&b)),
        (StatusCode::SERVICE_UNAVAILABLE, "busy"),
        "{b}"
    );
    assert_eq!(b["retryAfterHeader"], "1", "{b}");
    let metrics = h
        .client
        .get(h.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let refused: u64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("pstack_store_budget_refused_total "))
        .and_then(|v| v.trim().parse().ok())
        .expect("budget counter");
    assert!(refused >= 1, "{metrics}");
    holder.shutdown(std::net::Shutdown::Write).unwrap();
    let mut rest = Vec::new();
    let _ = holder.read_to_end(&mut rest);
    drop(holder);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let (st, b) = post(&h, &request(vec![Span::default(); 2_000], vec![]), false).await;
    assert_eq!(st, StatusCode::OK, "{b}");
    h.finish().await;
}

on_both_backends!(
    span_cap_at_below_and_above,
    kept_strings_past_their_cap_are_refused_with_the_field_named,
    traces_share_the_per_key_limit,
    traces_are_charged_to_the_in_flight_budget,
);
