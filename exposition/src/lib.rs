//! `pstack-exposition`: the one writer of the Prometheus text exposition
//! format, version 0.0.4 ([`CONTENT_TYPE`]), behind pstackd's and the store's
//! `/metrics`. Callers declare each metric [`Family`] once as a constant (name,
//! type, help) and add samples to an [`Exposition`] from wherever the readings
//! live; [`Exposition::render`] writes the text.
//!
//! What the text always satisfies (the format's rules, and what `promtool check
//! metrics` reads):
//! - **One family, one block.** A family's `# HELP` and `# TYPE` lines are
//!   written once, directly followed by all of its samples, however many places
//!   add samples to it and in whatever order. Families appear in the order they
//!   were first declared, samples in the order they were added. A declared
//!   family with no sample is still written (HELP and TYPE), so a scraper sees
//!   that it exists before anything has been counted.
//! - **Names are names.** A metric name matches `[a-zA-Z_:][a-zA-Z0-9_:]*` and a
//!   counter's name ends in `_total`: [`Family::new`] refuses anything else, at
//!   compile time when the family is a `const` (every family in pstack is). A
//!   label name matches `[a-zA-Z_][a-zA-Z0-9_]*` and does not start with `__`
//!   (reserved); label names are literals at every call site and are checked by
//!   `debug_assert!` where a sample is added.
//! - **Values cannot break the text.** A label value is written with `\` as
//!   `\\`, `"` as `\"` and a newline as `\n`; every other character, non-ASCII
//!   included, as its UTF-8. HELP text is written with `\` as `\\` and a newline
//!   as `\n` and nothing else (Prometheus's parser refuses `\"` in HELP). So a
//!   label value taken from a caller cannot end its quotes, start a new line or
//!   forge a sample.
//! - **Numbers.** Integers in decimal; floats as Rust's shortest round-trip
//!   decimal (`0.0025`, `1`, no exponent), and non-finite values as `+Inf`,
//!   `-Inf`, `NaN`.
//! - **Histograms.** `<name>_bucket{…,le="<bound>"}` for each bound in
//!   increasing order with the cumulative count, then `le="+Inf"` equal to
//!   `<name>_count`, then `<name>_sum` and `<name>_count`; `le` follows the
//!   caller's labels.
//!
//! ```
//! use pstack_exposition::{Exposition, Family};
//!
//! const REQUESTS: Family = Family::counter("app_requests_total", "Requests, by route.");
//!
//! let mut e = Exposition::new();
//! e.sample(REQUESTS, &[("route", "/v1/\"x\"")], 3u64);
//! let text = e.render();
//! let lines: Vec<&str> = text.lines().collect();
//! assert_eq!(
//!     lines,
//!     [
//!         "# HELP app_requests_total Requests, by route.",
//!         "# TYPE app_requests_total counter",
//!         r#"app_requests_total{route="/v1/\"x\""} 3"#,
//!     ]
//! );
//! ```
//!
//! A bad name does not build:
//!
//! ```compile_fail
//! const REQUESTS: pstack_exposition::Family =
//!     pstack_exposition::Family::counter("app_requests", "A counter without _total.");
//! let _ = REQUESTS;
//! ```
//!
//! Why written here rather than taken from a crate: `prometheus-client` encodes
//! OpenMetrics (the family name without its `_total` on HELP and TYPE, a closing
//! `# EOF`) from a registry of metric objects that it owns, and the `prometheus`
//! crate likewise wants registered collectors. pstack's readings are atomics,
//! maps and snapshots read at scrape time in several crates (spool, shipper,
//! eBPF session, watch rules, store routes), and `/metrics` must stay what it
//! was, byte for byte. What that needs is this small writer with no
//! dependencies.

use std::fmt::{self, Write as _};

/// The `Content-Type` of a text exposition.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// A family's type, as written on its `# TYPE` line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricType {
    /// Only goes up (resets at restart); the name ends in `_total`.
    Counter,
    /// Goes up and down.
    Gauge,
    /// Observations in cumulative buckets, with their sum and count.
    Histogram,
    /// No type stated.
    Untyped,
}

impl MetricType {
    /// The word on the `# TYPE` line.
    pub const fn as_str(self) -> &'static str {
        match self {
            MetricType::Counter => "counter",
            MetricType::Gauge => "gauge",
            MetricType::Histogram => "histogram",
            MetricType::Untyped => "untyped",
        }
    }
}

/// A metric family: name, type and help, declared once (as a `const`, so that
/// a bad name fails the build).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Family {
    name: &'static str,
    kind: MetricType,
    help: &'static str,
}

impl Family {
    /// A family. Panics (a compile error in a `const`) unless `name` is a metric
    /// name, and unless a counter's name ends in `_total`.
    pub const fn new(name: &'static str, kind: MetricType, help: &'static str) -> Family {
        assert!(
            is_metric_name(name),
            "a metric name matches [a-zA-Z_:][a-zA-Z0-9_:]*"
        );
        if matches!(kind, MetricType::Counter) {
            assert!(ends_with(name, "_total"), "a counter's name ends in _total");
        }
        Family { name, kind, help }
    }

    /// A counter (`name` ends in `_total`).
    pub const fn counter(name: &'static str, help: &'static str) -> Family {
        Family::new(name, MetricType::Counter, help)
    }

    /// A gauge.
    pub const fn gauge(name: &'static str, help: &'static str) -> Family {
        Family::new(name, MetricType::Gauge, help)
    }

    /// A histogram (samples through [`Exposition::histogram`]).
    pub const fn histogram(name: &'static str, help: &'static str) -> Family {
        Family::new(name, MetricType::Histogram, help)
    }

    /// A family of no stated type.
    pub const fn untyped(name: &'static str, help: &'static str) -> Family {
        Family::new(name, MetricType::Untyped, help)
    }

    /// Its name.
    pub const fn name(&self) -> &'static str {
        self.name
    }

    /// Its type.
    pub const fn kind(&self) -> MetricType {
        self.kind
    }
}

/// Whether `name` is a Prometheus metric name: `[a-zA-Z_:][a-zA-Z0-9_:]*`.
pub const fn is_metric_name(name: &str) -> bool {
    let b = name.as_bytes();
    if b.is_empty() {
        return false;
    }
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if !(c.is_ascii_alphabetic() || c == b'_' || c == b':' || (i > 0 && c.is_ascii_digit())) {
            return false;
        }
        i += 1;
    }
    true
}

/// Whether `name` is a label name a caller may use: `[a-zA-Z_][a-zA-Z0-9_]*`,
/// not starting with `__` (reserved for Prometheus's own labels).
pub const fn is_label_name(name: &str) -> bool {
    let b = name.as_bytes();
    if b.is_empty() || (b.len() >= 2 && b[0] == b'_' && b[1] == b'_') {
        return false;
    }
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if !(c.is_ascii_alphabetic() || c == b'_' || (i > 0 && c.is_ascii_digit())) {
            return false;
        }
        i += 1;
    }
    true
}

const fn ends_with(s: &str, suffix: &str) -> bool {
    let (s, suffix) = (s.as_bytes(), suffix.as_bytes());
    if suffix.len() > s.len() {
        return false;
    }
    let start = s.len() - suffix.len();
    let mut i = 0;
    while i < suffix.len() {
        if s[start + i] != suffix[i] {
            return false;
        }
        i += 1;
    }
    true
}

/// A sample's value.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Value {
    /// A count or an integral gauge, written in decimal.
    Integer(u64),
    /// A float, written as its shortest round-trip decimal (`+Inf`, `-Inf`, `NaN`).
    Float(f64),
}

impl From<u64> for Value {
    fn from(v: u64) -> Value {
        Value::Integer(v)
    }
}

impl From<u32> for Value {
    fn from(v: u32) -> Value {
        Value::Integer(u64::from(v))
    }
}

impl From<u8> for Value {
    fn from(v: u8) -> Value {
        Value::Integer(u64::from(v))
    }
}

impl From<usize> for Value {
    fn from(v: usize) -> Value {
        Value::Integer(v as u64)
    }
}

impl From<bool> for Value {
    fn from(v: bool) -> Value {
        Value::Integer(u64::from(v))
    }
}

impl From<f64> for Value {
    fn from(v: f64) -> Value {
        Value::Float(v)
    }
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Value::Integer(v) => write!(f, "{v}"),
            Value::Float(v) if v.is_nan() => f.write_str("NaN"),
            Value::Float(v) if v == f64::INFINITY => f.write_str("+Inf"),
            Value::Float(v) if v == f64::NEG_INFINITY => f.write_str("-Inf"),
            Value::Float(v) => write!(f, "{v}"),
        }
    }
}

/// One histogram's readings (of one label set).
#[derive(Debug, Clone, Copy)]
pub struct HistogramSample<'a> {
    /// Bucket upper bounds, finite and increasing (`+Inf` is implied).
    pub bounds: &'a [f64],
    /// Observations ≤ each bound (cumulative), one per bound.
    pub cumulative: &'a [u64],
    /// All observations (the `+Inf` bucket).
    pub count: u64,
    /// The sum of all observations.
    pub sum: f64,
}

/// A text exposition being assembled: families in order of first declaration,
/// each with the sample lines added to it so far.
#[derive(Debug, Default)]
pub struct Exposition {
    families: Vec<Block>,
}

#[derive(Debug)]
struct Block {
    family: Family,
    samples: String,
}

impl Exposition {
    /// An empty exposition.
    pub fn new() -> Exposition {
        Exposition::default()
    }

    /// Declare `family`: its HELP and TYPE are written even if no sample is
    /// added. Declaring it again is harmless.
    pub fn declare(&mut self, family: Family) {
        self.block(family);
    }

    /// Add one sample of a counter, gauge or untyped family.
    pub fn sample(&mut self, family: Family, labels: &[(&str, &str)], value: impl Into<Value>) {
        debug_assert!(
            family.kind != MetricType::Histogram,
            "{}: a histogram's samples go through Exposition::histogram",
            family.name
        );
        let value = value.into();
        let out = self.block(family);
        write_series(out, family.name, "", labels, None, value);
    }

    /// Add one histogram (one label set) of a histogram family.
    pub fn histogram(&mut self, family: Family, labels: &[(&str, &str)], h: HistogramSample<'_>) {
        debug_assert!(
            family.kind == MetricType::Histogram,
            "{}: not a histogram family",
            family.name
        );
        debug_assert_eq!(h.bounds.len(), h.cumulative.len(), "{}", family.name);
        debug_assert!(
            h.bounds.windows(2).all(|w| w[0] < w[1]) && h.bounds.iter().all(|b| b.is_finite()),
            "{}: bounds are finite and increasing",
            family.name
        );
        debug_assert!(
            h.cumulative.windows(2).all(|w| w[0] <= w[1])
                && h.cumulative.last().is_none_or(|last| *last <= h.count),
            "{}: bucket counts are cumulative",
            family.name
        );
        debug_assert!(
            labels.iter().all(|(name, _)| *name != "le"),
            "{}: `le` is the bucket label",
            family.name
        );
        let out = self.block(family);
        let mut bound = String::new();
        for (le, n) in h.bounds.iter().zip(h.cumulative) {
            bound.clear();
            let _ = write!(bound, "{}", Value::Float(*le));
            write_series(
                out,
                family.name,
                "_bucket",
                labels,
                Some(&bound),
                Value::Integer(*n),
            );
        }
        write_series(
            out,
            family.name,
            "_bucket",
            labels,
            Some("+Inf"),
            Value::Integer(h.count),
        );
        write_series(out, family.name, "_sum", labels, None, Value::Float(h.sum));
        write_series(
            out,
            family.name,
            "_count",
            labels,
            None,
            Value::Integer(h.count),
        );
    }

    /// The text: each family's HELP, TYPE and samples.
    pub fn render(&self) -> String {
        let mut out =
            String::with_capacity(self.families.iter().map(|b| b.samples.len() + 128).sum());
        for b in &self.families {
            let Family { name, kind, help } = b.family;
            out.push_str("# HELP ");
            out.push_str(name);
            out.push(' ');
            push_escaped(&mut out, help, false);
            out.push_str("\n# TYPE ");
            out.push_str(name);
            out.push(' ');
            out.push_str(kind.as_str());
            out.push('\n');
            out.push_str(&b.samples);
        }
        out
    }

    fn block(&mut self, family: Family) -> &mut String {
        let i = match self
            .families
            .iter()
            .position(|b| b.family.name == family.name)
        {
            Some(i) => {
                debug_assert_eq!(
                    self.families[i].family, family,
                    "one family name, two declarations"
                );
                i
            }
            None => {
                self.families.push(Block {
                    family,
                    samples: String::new(),
                });
                self.families.len() - 1
            }
        };
        &mut self.families[i].samples
    }
}

/// `name+suffix{labels,le="…"} value\n`.
fn write_series(
    out: &mut String,
    name: &str,
    suffix: &str,
    labels: &[(&str, &str)],
    le: Option<&str>,
    value: Value,
) {
    out.push_str(name);
    out.push_str(suffix);
    let le = le.map(|v| ("le", v));
    let mut all = labels.iter().copied().chain(le).peekable();
    if all.peek().is_some() {
        out.push('{');
        for (i, (label, v)) in all.enumerate() {
            debug_assert!(is_label_name(label), "{name}: bad label name {label:?}");
            if i > 0 {
                out.push(',');
            }
            out.push_str(label);
            out.push_str("=\"");
            push_escaped(out, v, true);
            out.push('"');
        }
        out.push('}');
    }
    let _ = writeln!(out, " {value}");
}

/// `\` → `\\`, newline → `\n`, and in a label value also `"` → `\"`.
fn push_escaped(out: &mut String, text: &str, label_value: bool) {
    for c in text.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '"' if label_value => out.push_str("\\\""),
            c => out.push(c),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const REQUESTS: Family = Family::counter("t_requests_total", "Requests, by route.");
    const OPEN: Family = Family::gauge("t_open", "Open now.");
    const LATENCY: Family = Family::histogram("t_latency_seconds", "Latency.");

    #[test]
    fn hostile_label_values_are_escaped() {
        let mut e = Exposition::new();
        for v in [
            "plain",
            "a\"b",
            "back\\slash",
            "two\nlines",
            "\\\"",
            "\\n",
            "",
            "Grüße, 東京 🚀",
            "} 1\nforged_total 9",
            "tab\tcr\r",
        ] {
            e.sample(REQUESTS, &[("route", v)], 1u64);
        }
        let want = "# HELP t_requests_total Requests, by route.\n\
                    # TYPE t_requests_total counter\n\
                    t_requests_total{route=\"plain\"} 1\n\
                    t_requests_total{route=\"a\\\"b\"} 1\n\
                    t_requests_total{route=\"back\\\\slash\"} 1\n\
                    t_requests_total{route=\"two\\nlines\"} 1\n\
                    t_requests_total{route=\"\\\\\\\"\"} 1\n\
                    t_requests_total{route=\"\\\\n\"} 1\n\
                    t_requests_total{route=\"\"} 1\n\
                    t_requests_total{route=\"Grüße, 東京 🚀\"} 1\n\
                    t_requests_total{route=\"} 1\\nforged_total 9\"} 1\n\
                    t_requests_total{route=\"tab\tcr\r\"} 1\n";
        assert_eq!(e.render(), want);
        // Every sample is one line: nothing a value holds can start another.
        assert_eq!(e.render().lines().count(), 12);
    }

    #[test]
    fn help_escapes_backslash_and_newline_only() {
        const ODD: Family = Family::gauge("t_odd", "A \"quoted\" C:\\path\nsecond line.");
        let mut e = Exposition::new();
        e.sample(ODD, &[], 0u64);
        assert_eq!(
            e.render(),
            "# HELP t_odd A \"quoted\" C:\\\\path\\nsecond line.\n# TYPE t_odd gauge\nt_odd 0\n"
        );
    }

    #[test]
    fn a_family_is_written_once_with_its_samples_together() {
        let mut e = Exposition::new();
        e.sample(REQUESTS, &[("route", "/a")], 1u64);
        e.sample(OPEN, &[], 3u64);
        // A second site adds to the first family after another family began.
        e.declare(REQUESTS);
        e.sample(REQUESTS, &[("route", "/b")], 2u64);
        assert_eq!(
            e.render(),
            "# HELP t_requests_total Requests, by route.\n\
             # TYPE t_requests_total counter\n\
             t_requests_total{route=\"/a\"} 1\n\
             t_requests_total{route=\"/b\"} 2\n\
             # HELP t_open Open now.\n\
             # TYPE t_open gauge\n\
             t_open 3\n"
        );
    }

    #[test]
    fn a_declared_family_without_samples_is_still_written() {
        let mut e = Exposition::new();
        e.declare(REQUESTS);
        assert_eq!(
            e.render(),
            "# HELP t_requests_total Requests, by route.\n# TYPE t_requests_total counter\n"
        );
    }

    #[test]
    fn histogram_buckets_then_inf_then_sum_then_count() {
        let mut e = Exposition::new();
        e.histogram(
            LATENCY,
            &[("route", "/x")],
            HistogramSample {
                bounds: &[0.001, 0.25, 1.0, 5.0],
                cumulative: &[0, 2, 3, 3],
                count: 4,
                sum: 7.5,
            },
        );
        e.histogram(
            LATENCY,
            &[],
            HistogramSample {
                bounds: &[60.0],
                cumulative: &[0],
                count: 0,
                sum: 0.0,
            },
        );
        assert_eq!(
            e.render(),
            "# HELP t_latency_seconds Latency.\n\
             # TYPE t_latency_seconds histogram\n\
             t_latency_seconds_bucket{route=\"/x\",le=\"0.001\"} 0\n\
             t_latency_seconds_bucket{route=\"/x\",le=\"0.25\"} 2\n\
             t_latency_seconds_bucket{route=\"/x\",le=\"1\"} 3\n\
             t_latency_seconds_bucket{route=\"/x\",le=\"5\"} 3\n\
             t_latency_seconds_bucket{route=\"/x\",le=\"+Inf\"} 4\n\
             t_latency_seconds_sum{route=\"/x\"} 7.5\n\
             t_latency_seconds_count{route=\"/x\"} 4\n\
             t_latency_seconds_bucket{le=\"60\"} 0\n\
             t_latency_seconds_bucket{le=\"+Inf\"} 0\n\
             t_latency_seconds_sum 0\n\
             t_latency_seconds_count 0\n"
        );
    }

    #[test]
    fn values_are_written_as_prometheus_reads_them() {
        for (v, want) in [
            (Value::from(0u64), "0"),
            (Value::from(u64::MAX), "18446744073709551615"),
            (Value::from(true), "1"),
            (Value::from(0.0025), "0.0025"),
            (Value::from(1.0), "1"),
            (Value::from(1e21), "1000000000000000000000"),
            (Value::from(f64::INFINITY), "+Inf"),
            (Value::from(f64::NEG_INFINITY), "-Inf"),
            (Value::from(f64::NAN), "NaN"),
        ] {
            assert_eq!(v.to_string(), want, "{v:?}");
        }
    }

    #[test]
    fn names_are_checked() {
        for (name, metric, label) in [
            ("a", true, true),
            ("pstackd_captures_total", true, true),
            ("_x", true, true),
            ("a:b", true, false),
            ("__name__", true, false),
            ("__x", true, false),
            ("", false, false),
            ("1a", false, false),
            ("a1", true, true),
            ("a-b", false, false),
            ("a b", false, false),
            ("é", false, false),
            ("a\"", false, false),
        ] {
            assert_eq!(is_metric_name(name), metric, "metric name {name:?}");
            assert_eq!(is_label_name(name), label, "label name {name:?}");
        }
    }

    #[test]
    #[should_panic(expected = "a counter's name ends in _total")]
    fn a_counter_without_total_is_refused() {
        let _ = Family::counter(std::hint::black_box("t_requests"), "x");
    }

    #[test]
    #[should_panic(expected = "a metric name matches")]
    fn a_bad_metric_name_is_refused() {
        let _ = Family::gauge(std::hint::black_box("t-open"), "x");
    }

    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "bad label name")]
    fn a_bad_label_name_is_caught_in_debug_builds() {
        let mut e = Exposition::new();
        e.sample(OPEN, &[("bad-label", "v")], 1u64);
    }
}
