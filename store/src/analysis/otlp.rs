//! OTLP/HTTP trace ingest, the pure part: decode a body (protobuf or JSON,
//! through `opentelemetry-proto`'s generated types, never hand-parsed) and
//! fold its spans into the compact aggregates the verdicts read.
//!
//! Invariants:
//! - A body that does not decode is refused whole (nothing is aggregated).
//! - Only aggregates leave this module: per (environment, service, version,
//!   minute, latency bin) request and error counts; per (environment,
//!   service, version, minute, resource) client-call counts, errors and
//!   duration; and a bounded sample of failed requests (span ids, error
//!   signature, code paths) for fingerprints and code-path overlap.
//! - A request is a SERVER-kind span or a root span; it failed when its
//!   status is ERROR or `http.response.status_code` (or the older
//!   `http.status_code`) is ≥ 500; its latency is end − start.

use std::collections::{BTreeMap, HashMap};

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::trace::v1::{Span, span::SpanKind, status::StatusCode};
use prost::Message;

/// Aggregation bucket width.
pub const BUCKET_NS: i64 = 60_000_000_000;
/// Latency bins per power of two (2^(1/4) ≈ 1.19: p95 within ~9 %).
pub const BINS_PER_OCTAVE: f64 = 4.0;
/// Highest latency bin (2^(128/4) µs ≈ 71 min; longer lands here).
pub const MAX_BIN: i64 = 127;
/// Failed requests kept per request body (the sample for fingerprints).
pub const MAX_ERROR_SAMPLES: usize = 1000;

/// The two OTLP/HTTP encodings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    /// `application/x-protobuf`.
    Protobuf,
    /// `application/json`.
    Json,
}

impl Encoding {
    /// From a Content-Type header value.
    pub fn from_content_type(ct: &str) -> Option<Encoding> {
        match ct
            .split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase()
            .as_str()
        {
            "application/x-protobuf" | "application/protobuf" => Some(Encoding::Protobuf),
            "application/json" => Some(Encoding::Json),
            _ => None,
        }
    }
}

/// Why a body was refused.
#[derive(Debug, thiserror::Error)]
pub enum OtlpError {
    /// Not a valid protobuf ExportTraceServiceRequest.
    #[error("body is not an OTLP protobuf ExportTraceServiceRequest: {0}")]
    Protobuf(String),
    /// Not a valid OTLP JSON ExportTraceServiceRequest.
    #[error("body is not an OTLP JSON ExportTraceServiceRequest: {0}")]
    Json(String),
}

impl OtlpError {
    /// Stable error code.
    pub fn code(&self) -> &'static str {
        match self {
            OtlpError::Protobuf(_) => "malformed_otlp_protobuf",
            OtlpError::Json(_) => "malformed_otlp_json",
        }
    }
}

/// Decode one body.
pub fn decode(body: &[u8], encoding: Encoding) -> Result<ExportTraceServiceRequest, OtlpError> {
    match encoding {
        Encoding::Protobuf => {
            ExportTraceServiceRequest::decode(body).map_err(|e| OtlpError::Protobuf(e.to_string()))
        }
        Encoding::Json => serde_json::from_slice(body).map_err(|e| OtlpError::Json(e.to_string())),
    }
}

/// Key of a request counter row.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RequestKey {
    /// `deployment.environment.name`.
    pub environment: String,
    /// `service.name`.
    pub service: String,
    /// `service.version` (else `vcs.commit.id`, else `unknown`).
    pub version: String,
    /// Minute bucket start, ns.
    pub bucket_ns: i64,
    /// Latency bin.
    pub latency_bin: i64,
}

/// Requests and errors in one row.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RequestAgg {
    /// Requests.
    pub requests: i64,
    /// Failed requests.
    pub errors: i64,
}

/// Key of a call counter row.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CallKey {
    /// Environment.
    pub environment: String,
    /// Calling service.
    pub service: String,
    /// Calling version.
    pub version: String,
    /// Minute bucket start, ns.
    pub bucket_ns: i64,
    /// Canonical resource identity.
    pub resource: String,
}

/// Calls in one row.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CallAgg {
    /// Calls.
    pub calls: i64,
    /// Failed calls.
    pub errors: i64,
    /// Sum of durations, µs.
    pub duration_us: i64,
    /// One contending span: `traceId/spanId` (hex).
    pub exemplar: String,
}

/// One failed request, kept for fingerprints and code-path overlap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailedRequest {
    /// Span id, hex.
    pub span_id: String,
    /// Trace id, hex.
    pub trace_id: String,
    /// Environment.
    pub environment: String,
    /// Service.
    pub service: String,
    /// Version.
    pub version: String,
    /// Span name.
    pub operation: String,
    /// Exception type, status message or HTTP status.
    pub error_signature: String,
    /// Resource of a failed CLIENT child in the same body, if any.
    pub downstream: Option<String>,
    /// `code.filepath` values on the span and its exception events.
    pub code_paths: Vec<String>,
    /// `obs.config.digest`.
    pub config_digest: Option<String>,
    /// Feature flags in effect (`feature_flag.key`=`variant`, `obs.feature_flags.<key>`).
    pub feature_flags: BTreeMap<String, String>,
    /// Start, ns.
    pub start_ns: i64,
}

/// What one body adds to the store.
#[derive(Debug, Clone, Default)]
pub struct Batch {
    /// Spans read.
    pub spans: usize,
    /// Request counters.
    pub requests: HashMap<RequestKey, RequestAgg>,
    /// Call counters.
    pub calls: HashMap<CallKey, CallAgg>,
    /// Failed requests (at most [`MAX_ERROR_SAMPLES`]).
    pub failed: Vec<FailedRequest>,
}

/// The latency bin of a duration.
pub fn latency_bin(duration_ns: i64) -> i64 {
    let us = duration_ns as f64 / 1000.0;
    if us < 1.0 {
        return 0;
    }
    ((us.log2() * BINS_PER_OCTAVE).floor() as i64).clamp(0, MAX_BIN)
}

/// A representative latency of a bin, ms (its geometric middle).
pub fn bin_ms(bin: i64) -> f64 {
    2f64.powf((bin as f64 + 0.5) / BINS_PER_OCTAVE) / 1000.0
}

/// p95 of a histogram (bin → count), ms.
pub fn p95_ms(hist: &BTreeMap<i64, i64>) -> Option<f64> {
    let total: i64 = hist.values().sum();
    if total <= 0 {
        return None;
    }
    let rank = ((total as f64) * 0.95).ceil() as i64;
    let mut seen = 0;
    for (bin, n) in hist {
        seen += n;
        if seen >= rank {
            return Some(bin_ms(*bin));
        }
    }
    hist.keys().last().map(|b| bin_ms(*b))
}

fn text(v: &AnyValue) -> Option<String> {
    match v.value.as_ref()? {
        any_value::Value::StringValue(s) => Some(s.clone()),
        any_value::Value::IntValue(i) => Some(i.to_string()),
        any_value::Value::BoolValue(b) => Some(b.to_string()),
        any_value::Value::DoubleValue(d) => Some(d.to_string()),
        _ => None,
    }
}

fn attr<'a>(attrs: &'a [KeyValue], key: &str) -> Option<&'a AnyValue> {
    attrs
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref())
}

fn attr_text(attrs: &[KeyValue], key: &str) -> Option<String> {
    attr(attrs, key).and_then(text).filter(|s| !s.is_empty())
}

/// First of `keys` on the span, then on the resource.
fn lookup(span: &[KeyValue], resource: &[KeyValue], keys: &[&str]) -> Option<String> {
    keys.iter()
        .find_map(|k| attr_text(span, k))
        .or_else(|| keys.iter().find_map(|k| attr_text(resource, k)))
}

fn http_status(attrs: &[KeyValue]) -> Option<i64> {
    ["http.response.status_code", "http.status_code"]
        .iter()
        .find_map(|k| attr(attrs, k).and_then(text))
        .and_then(|s| s.parse().ok())
}

/// The seed's canonical resource identity of a CLIENT/PRODUCER span's
/// downstream: `db:<env>:<system>:<address>:<port>/<namespace>`,
/// `queue:<env>:<system>:<destination>`, or `service:<env>:<address>:<port>`.
/// The flag says whether it is a database or queue (a contended kind).
pub fn resource_identity(env: &str, span: &[KeyValue]) -> Option<(String, bool)> {
    let addr = attr_text(span, "server.address").or_else(|| attr_text(span, "net.peer.name"));
    let port = attr_text(span, "server.port").or_else(|| attr_text(span, "net.peer.port"));
    if let Some(system) = attr_text(span, "db.system.name").or_else(|| attr_text(span, "db.system"))
    {
        let mut id = format!("db:{env}:{system}:{}", addr.as_deref().unwrap_or("unknown"));
        if let Some(p) = &port {
            id.push(':');
            id.push_str(p);
        }
        if let Some(ns) = attr_text(span, "db.namespace").or_else(|| attr_text(span, "db.name")) {
            id.push('/');
            id.push_str(&ns);
        }
        return Some((id, true));
    }
    if let Some(system) = attr_text(span, "messaging.system") {
        let dest =
            attr_text(span, "messaging.destination.name").unwrap_or_else(|| "unknown".into());
        return Some((format!("queue:{env}:{system}:{dest}"), true));
    }
    let addr = addr?;
    Some((
        match port {
            Some(p) => format!("service:{env}:{addr}:{p}"),
            None => format!("service:{env}:{addr}"),
        },
        false,
    ))
}

/// Whether a canonical identity names a database or queue.
pub fn is_contended_kind(resource: &str) -> bool {
    resource.starts_with("db:") || resource.starts_with("queue:")
}

fn span_failed(span: &Span) -> bool {
    span.status
        .as_ref()
        .is_some_and(|s| s.code == StatusCode::Error as i32)
        || http_status(&span.attributes).is_some_and(|c| c >= 500)
}

fn error_signature(span: &Span) -> String {
    if let Some(t) = span
        .events
        .iter()
        .filter(|e| e.name == "exception")
        .find_map(|e| attr_text(&e.attributes, "exception.type"))
    {
        return t;
    }
    if let Some(s) = span.status.as_ref().filter(|s| !s.message.is_empty()) {
        return s.message.chars().take(200).collect();
    }
    if let Some(c) = http_status(&span.attributes) {
        return format!("http_{c}");
    }
    "error".into()
}

fn ns(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// Fold a decoded request into aggregates.
pub fn aggregate(req: &ExportTraceServiceRequest) -> Batch {
    let mut batch = Batch::default();
    // Failed CLIENT spans by parent span id: the downstream of a failed request.
    let mut failed_child: HashMap<Vec<u8>, String> = HashMap::new();
    let mut pending: Vec<(Vec<u8>, FailedRequest)> = Vec::new();
    for rs in &req.resource_spans {
        let res: &[KeyValue] = rs
            .resource
            .as_ref()
            .map(|r| r.attributes.as_slice())
            .unwrap_or(&[]);
        for ss in &rs.scope_spans {
            for span in &ss.spans {
                batch.spans += 1;
                let a = &span.attributes;
                let env = lookup(
                    a,
                    res,
                    &["deployment.environment.name", "deployment.environment"],
                )
                .unwrap_or_else(|| "default".into());
                let service =
                    lookup(a, res, &["service.name"]).unwrap_or_else(|| "unknown_service".into());
                let version = lookup(a, res, &["service.version", "vcs.commit.id"])
                    .unwrap_or_else(|| "unknown".into());
                let start = ns(span.start_time_unix_nano);
                let dur = ns(span
                    .end_time_unix_nano
                    .saturating_sub(span.start_time_unix_nano));
                let bucket_ns = start - start.rem_euclid(BUCKET_NS);
                let failed = span_failed(span);
                let kind = span.kind;
                if (kind == SpanKind::Client as i32 || kind == SpanKind::Producer as i32)
                    && let Some((resource, _)) = resource_identity(&env, a)
                {
                    if failed {
                        failed_child.insert(span.parent_span_id.clone(), resource.clone());
                    }
                    let agg = batch
                        .calls
                        .entry(CallKey {
                            environment: env.clone(),
                            service: service.clone(),
                            version: version.clone(),
                            bucket_ns,
                            resource,
                        })
                        .or_default();
                    agg.calls += 1;
                    agg.errors += i64::from(failed);
                    agg.duration_us += dur / 1000;
                    if agg.exemplar.is_empty() {
                        agg.exemplar = format!(
                            "{}/{}",
                            hex::encode(&span.trace_id),
                            hex::encode(&span.span_id)
                        );
                    }
                }
                if kind != SpanKind::Server as i32 && !span.parent_span_id.is_empty() {
                    continue;
                }
                let agg = batch
                    .requests
                    .entry(RequestKey {
                        environment: env.clone(),
                        service: service.clone(),
                        version: version.clone(),
                        bucket_ns,
                        latency_bin: latency_bin(dur),
                    })
                    .or_default();
                agg.requests += 1;
                agg.errors += i64::from(failed);
                if failed && pending.len() < MAX_ERROR_SAMPLES {
                    let mut code_paths: Vec<String> = std::iter::once(a.as_slice())
                        .chain(
                            span.events
                                .iter()
                                .filter(|e| e.name == "exception")
                                .map(|e| e.attributes.as_slice()),
                        )
                        .filter_map(|attrs| {
                            attr_text(attrs, "code.filepath")
                                .or_else(|| attr_text(attrs, "code.file.path"))
                        })
                        .collect();
                    code_paths.sort();
                    code_paths.dedup();
                    let mut feature_flags = BTreeMap::new();
                    for kv in res.iter().chain(a.iter()) {
                        if let Some(flag) = kv.key.strip_prefix("obs.feature_flags.")
                            && let Some(v) = kv.value.as_ref().and_then(text)
                        {
                            feature_flags.insert(flag.to_string(), v);
                        }
                    }
                    for attrs in std::iter::once(a.as_slice())
                        .chain(span.events.iter().map(|e| e.attributes.as_slice()))
                    {
                        if let Some(k) = attr_text(attrs, "feature_flag.key") {
                            let v = attr_text(attrs, "feature_flag.variant")
                                .or_else(|| attr_text(attrs, "feature_flag.result.variant"))
                                .unwrap_or_default();
                            feature_flags.insert(k, v);
                        }
                    }
                    pending.push((
                        span.span_id.clone(),
                        FailedRequest {
                            span_id: hex::encode(&span.span_id),
                            trace_id: hex::encode(&span.trace_id),
                            environment: env,
                            service,
                            version,
                            operation: span.name.clone(),
                            error_signature: error_signature(span),
                            downstream: None,
                            code_paths,
                            config_digest: lookup(a, res, &["obs.config.digest"]),
                            feature_flags,
                            start_ns: start,
                        },
                    ));
                }
            }
        }
    }
    batch.failed = pending
        .into_iter()
        .map(|(id, mut f)| {
            f.downstream = failed_child.get(&id).cloned();
            f
        })
        .collect();
    batch
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv(k: &str, v: &str) -> KeyValue {
        KeyValue {
            key: k.into(),
            value: Some(AnyValue {
                value: Some(any_value::Value::StringValue(v.into())),
            }),
            ..Default::default()
        }
    }

    #[test]
    fn canonical_identity_matches_the_seed_example() {
        let span = [
            kv("db.system.name", "postgresql"),
            kv("server.address", "orders-primary"),
            KeyValue {
                key: "server.port".into(),
                value: Some(AnyValue {
                    value: Some(any_value::Value::IntValue(5432)),
                }),
                ..Default::default()
            },
            kv("db.namespace", "orders"),
        ];
        assert_eq!(
            resource_identity("prod", &span),
            Some(("db:prod:postgresql:orders-primary:5432/orders".into(), true))
        );
        let q = [
            kv("messaging.system", "kafka"),
            kv("messaging.destination.name", "orders"),
        ];
        assert_eq!(
            resource_identity("prod", &q),
            Some(("queue:prod:kafka:orders".into(), true))
        );
    }

    #[test]
    fn latency_bins_are_monotonic_and_p95_lands_in_the_right_bin() {
        let mut last = 0;
        for us in [1, 2, 10, 100, 1000, 10_000, 1_000_000] {
            let b = latency_bin(us * 1000);
            assert!(b >= last);
            last = b;
            // The representative of a bin is within 2^(1/4) of the value.
            let r = bin_ms(b) * 1000.0 / us as f64;
            assert!((0.84..1.19).contains(&r), "{us} µs -> bin {b} -> {r}");
        }
        let mut h = BTreeMap::new();
        h.insert(latency_bin(10_000_000), 95); // 10 ms
        h.insert(latency_bin(1_000_000_000), 5); // 1 s
        let p = p95_ms(&h).unwrap();
        assert!((8.0..12.0).contains(&p), "{p}");
        h.insert(latency_bin(1_000_000_000), 6);
        assert!(p95_ms(&h).unwrap() > 800.0);
        assert_eq!(p95_ms(&BTreeMap::new()), None);
    }
}
