//! OTLP/HTTP trace ingest, the pure part: decode a body (protobuf or JSON,
//! through `opentelemetry-proto`'s generated types, never hand-parsed) and
//! fold its spans into the compact aggregates the verdicts read.
//!
//! Invariants:
//! - A body that does not decode is refused whole (nothing is aggregated).
//! - Only aggregates leave this module: request cohorts per (environment,
//!   service, version | config digest | flag variant, minute), each to the
//!   second with a latency sketch ([`super::cohort`], [`super::sketch`]);
//!   per (environment, service, version, minute, resource) client-call
//!   counts, errors and duration; and a bounded sample of failed requests
//!   (span ids, error signature, code paths) for fingerprints and code-path
//!   overlap.
//! - A request is a SERVER-kind span or a root span; it failed when its
//!   status is ERROR or `http.response.status_code` (or the older
//!   `http.status_code`) is ≥ 500; its latency is end − start.
//! - **Bounded** (issue 28). Before decoding, `otlp_cost` counts the spans
//!   (more than the per-request cap: [`OtlpError::TooManySpans`]) and bounds
//!   the decoded size, which is charged to the in-flight budget; aggregation
//!   charges every row it adds ([`aggregate_within`]). Every string the store
//!   keeps is capped — identities ([`MAX_IDENTITY_BYTES`]: `service.name`,
//!   versions, environment, resource identity parts, config digest, feature
//!   flags) and descriptive text ([`MAX_TEXT_BYTES`]: span name, exception
//!   type, code path) — and a failed request carries at most
//!   [`MAX_FEATURE_FLAGS`] flags and [`MAX_CODE_PATHS`] code paths; past a cap
//!   the request is refused whole ([`check`]), naming the field. Work per
//!   span is independent of the resource's size: resource attributes are
//!   read once per resource.

use std::collections::{BTreeMap, HashMap};
use std::mem::size_of;

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::trace::v1::{Span, span::SpanKind, status::StatusCode};
use prost::Message;

use super::cohort::{CohortRows, Dimension};
use super::sketch::{self, SECOND_NS};
use crate::analysis::otlp_cost::{self, ALLOC_OVERHEAD, Meter, VEC_PEAK};

/// Aggregation bucket width (one row per minute; requests to the second inside it).
pub const BUCKET_NS: i64 = 60_000_000_000;
/// Failed requests kept per request body (the sample for fingerprints).
pub const MAX_ERROR_SAMPLES: usize = 1000;
/// Spans one request may carry unless configured (`--max-spans`): an SDK
/// batch is 512 by default, a collector's batch processor 8192.
pub const DEFAULT_MAX_SPANS: usize = 100_000;
/// Longest identity the store keeps, bytes: `service.name`,
/// `service.version`, `vcs.commit.id`, the environment, the resource
/// identity parts (`server.address`, `db.system`, ...), `obs.config.digest`,
/// feature flag names and variants.
pub const MAX_IDENTITY_BYTES: usize = 256;
/// Longest descriptive text the store keeps, bytes: span name,
/// `exception.type`, `code.filepath`.
pub const MAX_TEXT_BYTES: usize = 1024;
/// Most feature flags one failed request carries (its resource's, its own
/// and its events').
pub const MAX_FEATURE_FLAGS: usize = 64;
/// Most code paths one failed request carries.
pub const MAX_CODE_PATHS: usize = 64;

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
    /// Not a valid protobuf ExportTraceServiceRequest (HTTP 400).
    #[error("body is not an OTLP protobuf ExportTraceServiceRequest: {0}")]
    Protobuf(String),
    /// Not a valid OTLP JSON ExportTraceServiceRequest (HTTP 400).
    #[error("body is not an OTLP JSON ExportTraceServiceRequest: {0}")]
    Json(String),
    /// More spans than the per-request cap (HTTP 413).
    #[error(
        "the request holds {count} spans; at most {limit} are accepted per request (the store's --max-spans): send smaller batches"
    )]
    TooManySpans {
        /// Spans in the body.
        count: usize,
        /// The cap.
        limit: usize,
    },
    /// Decoding needs more memory than the store's whole in-flight budget
    /// (HTTP 413).
    #[error(
        "decoding this body takes at least {needed} bytes, more than the store's whole in-flight memory budget ({budget} bytes): send fewer spans or attributes per request"
    )]
    DecodeTooLarge {
        /// Bytes needed when refused.
        needed: usize,
        /// The whole budget.
        budget: u64,
    },
    /// Decoding needs memory other requests hold now (HTTP 503 + Retry-After).
    #[error("the store's in-flight memory budget cannot hold this body decoded right now")]
    Busy,
    /// A string the store keeps is longer than its cap (HTTP 400).
    #[error("{what} is {len} bytes; at most {limit} are accepted")]
    TooLong {
        /// Where, e.g. `resourceSpans[0].resource.attributes[service.name]`.
        field: String,
        /// What it is.
        what: &'static str,
        /// Its length.
        len: usize,
        /// The cap.
        limit: usize,
    },
    /// More of something than its cap (HTTP 400).
    #[error("{what}: {count}; at most {limit} are accepted")]
    TooMany {
        /// Where.
        field: String,
        /// What is counted.
        what: &'static str,
        /// How many.
        count: usize,
        /// The cap.
        limit: usize,
    },
}

impl OtlpError {
    /// Stable error code.
    pub fn code(&self) -> &'static str {
        match self {
            OtlpError::Protobuf(_) => "malformed_otlp_protobuf",
            OtlpError::Json(_) => "malformed_otlp_json",
            OtlpError::TooManySpans { .. } => "too_many_spans",
            OtlpError::DecodeTooLarge { .. } => "otlp_decode_too_large",
            OtlpError::Busy => "busy",
            OtlpError::TooLong { .. } => "field_too_long",
            OtlpError::TooMany { .. } => "too_many_values",
        }
    }

    /// The field it names, if one.
    pub fn field(&self) -> Option<&str> {
        match self {
            OtlpError::Protobuf(_) | OtlpError::Json(_) => Some("body"),
            OtlpError::TooLong { field, .. } | OtlpError::TooMany { field, .. } => Some(field),
            OtlpError::TooManySpans { .. } | OtlpError::DecodeTooLarge { .. } | OtlpError::Busy => {
                None
            }
        }
    }
}

impl From<crate::analysis::otlp_cost::MeterRefusal> for OtlpError {
    fn from(r: crate::analysis::otlp_cost::MeterRefusal) -> OtlpError {
        match r {
            crate::analysis::otlp_cost::MeterRefusal::Busy => OtlpError::Busy,
            crate::analysis::otlp_cost::MeterRefusal::OverBudget { needed, budget } => {
                OtlpError::DecodeTooLarge { needed, budget }
            }
        }
    }
}

/// Decode one body, unbounded (tests and benches; the server uses
/// [`decode_within`]).
pub fn decode(body: &[u8], encoding: Encoding) -> Result<ExportTraceServiceRequest, OtlpError> {
    match encoding {
        Encoding::Protobuf => {
            ExportTraceServiceRequest::decode(body).map_err(|e| OtlpError::Protobuf(e.to_string()))
        }
        Encoding::Json => serde_json::from_slice(body).map_err(|e| OtlpError::Json(e.to_string())),
    }
}

/// Decode one body of at most `max_spans` spans, its decoded size charged
/// to `meter` before anything is allocated (`otlp_cost`).
pub fn decode_within(
    body: &[u8],
    encoding: Encoding,
    max_spans: usize,
    meter: &mut Meter<'_>,
) -> Result<ExportTraceServiceRequest, OtlpError> {
    let census = match encoding {
        Encoding::Protobuf => {
            otlp_cost::protobuf(body).map_err(|e| OtlpError::Protobuf(e.to_string()))?
        }
        Encoding::Json => otlp_cost::json(body),
    };
    if census.spans > max_spans {
        return Err(OtlpError::TooManySpans {
            count: census.spans,
            limit: max_spans,
        });
    }
    meter.charge(census.decoded_bytes)?;
    decode(body, encoding)
}

fn too_long(field: String, what: &'static str, len: usize, limit: usize) -> OtlpError {
    OtlpError::TooLong {
        field,
        what,
        len,
        limit,
    }
}

/// The cap of an attribute the store reads, if it reads it.
fn kept_cap(key: &str) -> Option<usize> {
    match key {
        "deployment.environment.name"
        | "deployment.environment"
        | "service.name"
        | "service.version"
        | "vcs.commit.id"
        | "obs.config.digest"
        | "server.address"
        | "server.port"
        | "net.peer.name"
        | "net.peer.port"
        | "db.system.name"
        | "db.system"
        | "db.namespace"
        | "db.name"
        | "messaging.system"
        | "messaging.destination.name"
        | "feature_flag.key"
        | "feature_flag.variant"
        | "feature_flag.result.variant" => Some(MAX_IDENTITY_BYTES),
        "exception.type" | "code.filepath" | "code.file.path" => Some(MAX_TEXT_BYTES),
        k if k.starts_with(FLAG_PREFIX) => Some(MAX_IDENTITY_BYTES),
        _ => None,
    }
}

const FLAG_PREFIX: &str = "obs.feature_flags.";

/// Check the kept attributes of one list; the flags and code paths in it.
fn check_attributes(
    attrs: &[KeyValue],
    at: &dyn Fn() -> String,
) -> Result<(usize, usize), OtlpError> {
    let (mut flags, mut paths) = (0, 0);
    for (i, kv) in attrs.iter().enumerate() {
        let Some(cap) = kept_cap(&kv.key) else {
            continue;
        };
        let name = |kv: &KeyValue| {
            if kv.key.len() <= MAX_IDENTITY_BYTES + FLAG_PREFIX.len() {
                format!("{}[{}]", at(), kv.key)
            } else {
                format!("{}[{i}]", at())
            }
        };
        if let Some(flag) = kv.key.strip_prefix(FLAG_PREFIX) {
            flags += 1;
            if flag.len() > MAX_IDENTITY_BYTES {
                return Err(too_long(
                    name(kv),
                    "a feature flag name",
                    flag.len(),
                    MAX_IDENTITY_BYTES,
                ));
            }
        }
        match kv.key.as_str() {
            "feature_flag.key" => flags += 1,
            "code.filepath" | "code.file.path" => paths += 1,
            _ => {}
        }
        let len = match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
            Some(any_value::Value::StringValue(s)) => s.len(),
            _ => kv.value.as_ref().and_then(text).map_or(0, |t| t.len()),
        };
        if len > cap {
            return Err(too_long(name(kv), "an attribute the store keeps", len, cap));
        }
    }
    Ok((flags, paths))
}

/// Refuse a request carrying a kept string past its cap, or a span whose
/// failed request would carry too many flags or code paths (module doc).
pub fn check(req: &ExportTraceServiceRequest) -> Result<(), OtlpError> {
    for (r, rs) in req.resource_spans.iter().enumerate() {
        let res: &[KeyValue] = rs
            .resource
            .as_ref()
            .map(|r| r.attributes.as_slice())
            .unwrap_or(&[]);
        let (res_flags, _) =
            check_attributes(res, &|| format!("resourceSpans[{r}].resource.attributes"))?;
        for (s, ss) in rs.scope_spans.iter().enumerate() {
            for (k, span) in ss.spans.iter().enumerate() {
                let at = || format!("resourceSpans[{r}].scopeSpans[{s}].spans[{k}]");
                for (name, id, limit) in [
                    ("traceId", &span.trace_id, 16),
                    ("spanId", &span.span_id, 8),
                    ("parentSpanId", &span.parent_span_id, 8),
                ] {
                    if id.len() > limit {
                        return Err(too_long(
                            format!("{}.{name}", at()),
                            "an id (the OTLP spec's trace id is 16 bytes, span id 8)",
                            id.len(),
                            limit,
                        ));
                    }
                }
                if span.name.len() > MAX_TEXT_BYTES {
                    return Err(too_long(
                        format!("{}.name", at()),
                        "the span name",
                        span.name.len(),
                        MAX_TEXT_BYTES,
                    ));
                }
                let (mut flags, mut paths) =
                    check_attributes(&span.attributes, &|| format!("{}.attributes", at()))?;
                flags += res_flags;
                for (e, event) in span.events.iter().enumerate() {
                    let (f, p) = check_attributes(&event.attributes, &|| {
                        format!("{}.events[{e}].attributes", at())
                    })?;
                    flags += f;
                    paths += p;
                }
                if flags > MAX_FEATURE_FLAGS {
                    return Err(OtlpError::TooMany {
                        field: at(),
                        what: "feature flags on the span, its events and its resource",
                        count: flags,
                        limit: MAX_FEATURE_FLAGS,
                    });
                }
                if paths > MAX_CODE_PATHS {
                    return Err(OtlpError::TooMany {
                        field: at(),
                        what: "code paths on the span and its events",
                        count: paths,
                        limit: MAX_CODE_PATHS,
                    });
                }
            }
        }
    }
    Ok(())
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
    /// Request cohorts (version, config digest, flag variant), to the second.
    pub cohorts: CohortRows,
    /// Call counters.
    pub calls: HashMap<CallKey, CallAgg>,
    /// Failed requests (at most [`MAX_ERROR_SAMPLES`]).
    pub failed: Vec<FailedRequest>,
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

/// Feature flags in effect on a request: `obs.feature_flags.<key>` (resource,
/// then span), then `feature_flag.key` + `feature_flag.variant` (or
/// `feature_flag.result.variant`) on the span or its events (an evaluation
/// event per flag, as OpenFeature hooks record them). Empty keys are skipped.
fn feature_flags(resource: &BTreeMap<String, String>, span: &Span) -> BTreeMap<String, String> {
    let mut flags: BTreeMap<String, String> = resource
        .iter()
        .filter(|(k, _)| !k.is_empty())
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    for kv in span.attributes.iter() {
        if let Some(flag) = kv.key.strip_prefix(FLAG_PREFIX)
            && !flag.is_empty()
            && let Some(v) = kv.value.as_ref().and_then(text)
        {
            flags.insert(flag.to_string(), v);
        }
    }
    for attrs in std::iter::once(span.attributes.as_slice())
        .chain(span.events.iter().map(|e| e.attributes.as_slice()))
    {
        if let Some(k) = attr_text(attrs, "feature_flag.key") {
            let v = attr_text(attrs, "feature_flag.variant")
                .or_else(|| attr_text(attrs, "feature_flag.result.variant"))
                .unwrap_or_default();
            flags.insert(k, v);
        }
    }
    flags
}

fn ns(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// Fold a decoded request into aggregates, unmetered (benches).
pub fn aggregate(req: &ExportTraceServiceRequest) -> Batch {
    let mut grant = otlp_cost::unmetered;
    // An unmetered meter never refuses.
    aggregate_within(req, &mut Meter::new(&mut grant)).unwrap_or_default()
}

/// Peak bytes a map entry costs, in multiples of its size (capacity up to
/// twice the entries, the old table during a resize, control bytes).
const MAP_PEAK: usize = 4;

fn heap(s: &str) -> usize {
    s.len() + ALLOC_OVERHEAD
}

/// What a resource says, read once for all its spans.
struct ResourceView {
    env: Option<String>,
    service: Option<String>,
    version: Option<String>,
    config_digest: Option<String>,
    flags: BTreeMap<String, String>,
}

impl ResourceView {
    fn of(res: &[KeyValue]) -> ResourceView {
        let first = |keys: &[&str]| keys.iter().find_map(|k| attr_text(res, k));
        let mut flags = BTreeMap::new();
        for kv in res {
            if let Some(flag) = kv.key.strip_prefix(FLAG_PREFIX)
                && let Some(v) = kv.value.as_ref().and_then(text)
            {
                flags.insert(flag.to_string(), v);
            }
        }
        ResourceView {
            env: first(&["deployment.environment.name", "deployment.environment"]),
            service: first(&["service.name"]),
            version: first(&["service.version", "vcs.commit.id"]),
            config_digest: first(&["obs.config.digest"]),
            flags,
        }
    }

    fn cost(&self) -> usize {
        [&self.env, &self.service, &self.version, &self.config_digest]
            .into_iter()
            .flatten()
            .map(|s| heap(s))
            .sum::<usize>()
            + self
                .flags
                .iter()
                .map(|(k, v)| 2 * size_of::<String>() + heap(k) + heap(v) + ALLOC_OVERHEAD)
                .sum::<usize>()
    }
}

/// First of `keys` on the span, else the resource's value.
fn on_span_or(span: &[KeyValue], keys: &[&str], resource: &Option<String>) -> Option<String> {
    keys.iter()
        .find_map(|k| attr_text(span, k))
        .or_else(|| resource.clone())
}

/// Fold a decoded request into aggregates, charging every row, map entry
/// and kept string it adds to `meter`.
pub fn aggregate_within(
    req: &ExportTraceServiceRequest,
    meter: &mut Meter<'_>,
) -> Result<Batch, OtlpError> {
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
        let view = ResourceView::of(res);
        meter.charge(view.cost())?;
        for ss in &rs.scope_spans {
            for span in &ss.spans {
                batch.spans += 1;
                let a = &span.attributes;
                let env = on_span_or(
                    a,
                    &["deployment.environment.name", "deployment.environment"],
                    &view.env,
                )
                .unwrap_or_else(|| "default".into());
                let service = on_span_or(a, &["service.name"], &view.service)
                    .unwrap_or_else(|| "unknown_service".into());
                let version = on_span_or(a, &["service.version", "vcs.commit.id"], &view.version)
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
                        meter.charge(
                            MAP_PEAK * size_of::<(Vec<u8>, String)>()
                                + span.parent_span_id.len()
                                + ALLOC_OVERHEAD
                                + heap(&resource),
                        )?;
                        failed_child.insert(span.parent_span_id.clone(), resource.clone());
                    }
                    let key = CallKey {
                        environment: env.clone(),
                        service: service.clone(),
                        version: version.clone(),
                        bucket_ns,
                        resource,
                    };
                    if !batch.calls.contains_key(&key) {
                        meter.charge(
                            MAP_PEAK * size_of::<(CallKey, CallAgg)>()
                                + heap(&key.environment)
                                + heap(&key.service)
                                + heap(&key.version)
                                + heap(&key.resource)
                                + 2 * (span.trace_id.len() + span.span_id.len())
                                + 1
                                + ALLOC_OVERHEAD,
                        )?;
                    }
                    let agg = batch.calls.entry(key).or_default();
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
                let second = u8::try_from((start - bucket_ns) / SECOND_NS).unwrap_or(59);
                let latency = sketch::key_of_ns(dur);
                let config_digest = on_span_or(a, &["obs.config.digest"], &view.config_digest);
                let feature_flags = feature_flags(&view.flags, span);
                let mut added = 0;
                let mut count = |dimension, name: &str, value: &str| {
                    added += batch.cohorts.record(
                        &env, &service, dimension, name, value, bucket_ns, second, latency, failed,
                    );
                };
                count(Dimension::Version, "", &version);
                if let Some(d) = &config_digest {
                    count(Dimension::Config, "", d);
                }
                for (flag, variant) in &feature_flags {
                    count(Dimension::Flag, flag, variant);
                }
                // Charged just after the few hundred bytes one span can add
                // (attribute counts and lengths were bounded before decoding).
                meter.charge(added)?;
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
                    let failed = FailedRequest {
                        span_id: hex::encode(&span.span_id),
                        trace_id: hex::encode(&span.trace_id),
                        environment: env,
                        service,
                        version,
                        operation: span.name.clone(),
                        error_signature: error_signature(span),
                        downstream: None,
                        code_paths,
                        config_digest,
                        feature_flags,
                        start_ns: start,
                    };
                    meter.charge(failed_cost(&failed) + span.span_id.len() + ALLOC_OVERHEAD)?;
                    pending.push((span.span_id.clone(), failed));
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
    Ok(batch)
}

/// What one kept failed request holds (its downstream, filled in later, is
/// a resource already charged).
fn failed_cost(f: &FailedRequest) -> usize {
    VEC_PEAK * size_of::<(Vec<u8>, FailedRequest)>()
        + [
            &f.span_id,
            &f.trace_id,
            &f.environment,
            &f.service,
            &f.version,
            &f.operation,
            &f.error_signature,
        ]
        .into_iter()
        .map(|s| heap(s))
        .sum::<usize>()
        + f.config_digest.as_deref().map_or(0, heap)
        + f.downstream.as_deref().map_or(0, heap)
        + f.code_paths
            .iter()
            .map(|p| VEC_PEAK * size_of::<String>() + heap(p))
            .sum::<usize>()
        + f.feature_flags
            .iter()
            .map(|(k, v)| 2 * size_of::<String>() + heap(k) + heap(v) + ALLOC_OVERHEAD)
            .sum::<usize>()
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
    fn requests_are_counted_per_version_config_and_flag_to_the_second() {
        use opentelemetry_proto::tonic::resource::v1::Resource;
        use opentelemetry_proto::tonic::trace::v1::span::Event;
        use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans};
        let minute = 1_000 * BUCKET_NS;
        let span = |i: u64, variant: &str| Span {
            span_id: vec![1, 2, 3, 4, 5, 6, 7, i as u8],
            kind: SpanKind::Server as i32,
            start_time_unix_nano: (minute + 37 * SECOND_NS) as u64 + i,
            end_time_unix_nano: (minute + 37 * SECOND_NS) as u64 + i + 250_000_000,
            events: vec![Event {
                name: "feature_flag.evaluation".into(),
                attributes: vec![
                    kv("feature_flag.key", "new_tax"),
                    kv("feature_flag.result.variant", variant),
                ],
                ..Default::default()
            }],
            ..Default::default()
        };
        let req = ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                resource: Some(Resource {
                    attributes: vec![
                        kv("service.name", "checkout-api"),
                        kv("service.version", "2.4.1"),
                        kv("obs.config.digest", "cfg_99a1"),
                        kv("obs.feature_flags.dark_mode", "on"),
                    ],
                    ..Default::default()
                }),
                scope_spans: vec![ScopeSpans {
                    spans: vec![span(1, "on"), span(2, "off"), span(3, "on")],
                    ..Default::default()
                }],
                ..Default::default()
            }],
        };
        let b = aggregate(&req);
        let rows: Vec<(Dimension, &str, &str, u64)> = b
            .cohorts
            .rows
            .iter()
            .map(|(k, c)| {
                assert_eq!(k.bucket_ns, minute);
                assert_eq!(c.seconds.keys().copied().collect::<Vec<_>>(), vec![37]);
                (k.dimension, k.name.as_str(), k.value.as_str(), c.totals().0)
            })
            .collect();
        assert_eq!(
            rows,
            vec![
                (Dimension::Version, "", "2.4.1", 3),
                (Dimension::Config, "", "cfg_99a1", 3),
                (Dimension::Flag, "dark_mode", "on", 3),
                (Dimension::Flag, "new_tax", "off", 1),
                (Dimension::Flag, "new_tax", "on", 2),
            ]
        );
        let q = b
            .cohorts
            .rows
            .values()
            .next()
            .unwrap()
            .sketch()
            .quantile(0.95)
            .unwrap();
        assert!(q.lower_ms <= 250.0 && q.upper_ms.unwrap() > 250.0, "{q:?}");
    }
}
