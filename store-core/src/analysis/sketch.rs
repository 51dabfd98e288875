//! Request latency as a quantile sketch with a stated relative error, and
//! request counts to the second: what the blast-radius verdicts read (pure).
//!
//! Invariants:
//! - A latency lands in the DDSketch log bucket `k = ⌊log_γ(µs)⌋`,
//!   `γ = (1+α)/(1−α)`, α = [`RELATIVE_ACCURACY`] (0.4 %, γ ≈ 1.00803), with
//!   the mapping of the `sketches-ddsketch` crate. A quantile is reported as
//!   its bucket's representative with the bucket's bounds: the true value
//!   (of the same rank) lies within them, so the estimate is within α of it.
//!   Latencies below 1 µs read as bucket 0, at or above [`MAX_US`] (~71.6
//!   min) as the top bucket, whose upper bound is unknown (reported `None`).
//! - Buckets hold counts: sketches merge by addition, in any order, across
//!   minutes, bodies, nodes and replicas, and merging loses nothing.
//! - One stored row covers one minute: per second with traffic, its failed
//!   requests and latency buckets (the second's requests are their sum).
//!   So a cohort can start and end at any second. A row holds at most
//!   60 × ([`max_key`] + 1) cells, and never more cells than requests.
//! - Encodings start with a version byte; decoding refuses anything
//!   malformed with a typed error (never panics, never allocates beyond the
//!   input's size).

use std::collections::BTreeMap;
use std::sync::LazyLock;

use sketches_ddsketch::{Config, DDSketch};

use super::otlp_cost::NODE_PEAK;

/// α: every reported quantile is within this relative error of the true one.
pub const RELATIVE_ACCURACY: f64 = 0.004;
/// Latencies at or above this (2^32 µs ≈ 71.6 min) share the top bucket.
pub const MAX_US: f64 = 4_294_967_296.0;
/// Seconds per stored row.
pub const SECONDS_PER_ROW: u8 = 60;
/// ns per second.
pub const SECOND_NS: i64 = 1_000_000_000;

const FORMAT_SECONDS: u8 = 1;
const FORMAT_SKETCH: u8 = 1;

struct Mapping {
    config: Config,
    max_key: u16,
}

static MAPPING: LazyLock<Mapping> = LazyLock::new(|| {
    // 4096 bins: more than the key range, so the crate's store never collapses.
    let config = Config::new(RELATIVE_ACCURACY, 4096, 1e-9);
    let top = config.key(MAX_US).clamp(0, i32::from(u16::MAX - 1));
    Mapping {
        config,
        max_key: u16::try_from(top).unwrap_or(u16::MAX - 1),
    }
});

/// γ, the ratio of consecutive bucket bounds.
pub fn gamma() -> f64 {
    MAPPING.config.gamma
}

/// The highest bucket key (latencies ≥ [`MAX_US`]).
pub fn max_key() -> u16 {
    MAPPING.max_key
}

/// The bucket of a duration in ns.
pub fn key_of_ns(duration_ns: i64) -> u16 {
    let us = duration_ns as f64 / 1000.0;
    if us.is_nan() || us < 1.0 {
        return 0;
    }
    let k = MAPPING.config.key(us.min(MAX_US));
    u16::try_from(k.max(0)).map_or(MAPPING.max_key, |k| k.min(MAPPING.max_key))
}

/// Lower bound of a bucket, µs (0 for bucket 0, which holds everything below γ µs).
fn lower_us(key: u16) -> f64 {
    if key == 0 {
        0.0
    } else {
        MAPPING.config.pow_gamma(i32::from(key))
    }
}

/// Upper bound of a bucket, µs (None for the top bucket).
fn upper_us(key: u16) -> Option<f64> {
    (key < MAPPING.max_key).then(|| MAPPING.config.pow_gamma(i32::from(key) + 1))
}

/// Why an encoded sketch or row did not decode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SketchError {
    /// Unknown format byte.
    #[error("unknown latency encoding version {0}")]
    Version(u8),
    /// Ran out of bytes or a varint overflowed.
    #[error("truncated or overlong latency encoding")]
    Truncated,
    /// Keys or seconds out of order or range, or more errors than requests.
    #[error("inconsistent latency encoding: {0}")]
    Inconsistent(&'static str),
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8 & 0x7f) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

struct Reader<'a> {
    bytes: &'a [u8],
}

impl Reader<'_> {
    fn byte(&mut self) -> Result<u8, SketchError> {
        let (&b, rest) = self.bytes.split_first().ok_or(SketchError::Truncated)?;
        self.bytes = rest;
        Ok(b)
    }

    fn varint(&mut self) -> Result<u64, SketchError> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.byte()?;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(SketchError::Truncated)
    }

    fn done(&self) -> bool {
        self.bytes.is_empty()
    }
}

/// Reads sparse (key delta, count) pairs, calling `f(key, count)`.
fn read_keys(r: &mut Reader<'_>, mut f: impl FnMut(u16, u64)) -> Result<u64, SketchError> {
    let n = r.varint()?;
    let mut key: i64 = -1;
    let mut total = 0u64;
    for _ in 0..n {
        key += i64::try_from(r.varint()?).map_err(|_| SketchError::Truncated)? + 1;
        let k = u16::try_from(key)
            .ok()
            .filter(|k| *k <= MAPPING.max_key)
            .ok_or(SketchError::Inconsistent("bucket key out of range"))?;
        let count = r.varint()?;
        if count == 0 {
            return Err(SketchError::Inconsistent("empty bucket"));
        }
        total = total
            .checked_add(count)
            .ok_or(SketchError::Inconsistent("count overflow"))?;
        f(k, count);
    }
    Ok(total)
}

fn write_keys<'a>(out: &mut Vec<u8>, keys: impl ExactSizeIterator<Item = (u16, &'a u64)>) {
    put_varint(out, keys.len() as u64);
    let mut last: i64 = -1;
    for (k, n) in keys {
        put_varint(out, (i64::from(k) - last - 1) as u64);
        put_varint(out, *n);
        last = i64::from(k);
    }
}

/// A p-quantile with its error bound, ms.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Quantile {
    /// The bucket's representative (within α of the true value).
    pub estimate_ms: f64,
    /// The true value is at least this.
    pub lower_ms: f64,
    /// The true value is below this (None: the top bucket, no upper bound).
    pub upper_ms: Option<f64>,
}

impl Quantile {
    /// An exactly known value (no error).
    pub fn exact(ms: f64) -> Quantile {
        Quantile {
            estimate_ms: ms,
            lower_ms: ms,
            upper_ms: Some(ms),
        }
    }

    /// The largest relative error |estimate − v| / v over every true value
    /// v the bounds allow: α for an ordinary bucket; None when a bound is
    /// open (the top bucket, or bucket 0 which reaches down to 0).
    pub fn relative_error(&self) -> Option<f64> {
        let u = self.upper_ms?;
        if self.lower_ms <= 0.0 || u <= 0.0 {
            return (self.lower_ms == u).then_some(0.0);
        }
        Some(((self.estimate_ms - self.lower_ms) / self.lower_ms).max((u - self.estimate_ms) / u))
    }
}

/// A mergeable latency sketch: bucket → count (dense, one slot per key).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sketch {
    counts: Vec<u64>,
    total: u64,
}

impl Default for Sketch {
    fn default() -> Self {
        Sketch {
            counts: vec![0; usize::from(MAPPING.max_key) + 1],
            total: 0,
        }
    }
}

impl Sketch {
    /// Add `n` requests in bucket `key`.
    pub fn add(&mut self, key: u16, n: u64) {
        let k = usize::from(key.min(MAPPING.max_key));
        self.counts[k] = self.counts[k].saturating_add(n);
        self.total = self.total.saturating_add(n);
    }

    /// Add every request of `other`.
    pub fn merge(&mut self, other: &Sketch) {
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            *a = a.saturating_add(*b);
        }
        self.total = self.total.saturating_add(other.total);
    }

    /// Requests in the sketch.
    pub fn count(&self) -> u64 {
        self.total
    }

    /// Non-empty buckets, ascending.
    pub fn buckets(&self) -> impl ExactSizeIterator<Item = (u16, &u64)> + '_ {
        let nonzero: Vec<(u16, &u64)> = self
            .counts
            .iter()
            .enumerate()
            .filter(|(_, n)| **n > 0)
            .map(|(k, n)| (u16::try_from(k).unwrap_or(u16::MAX), n))
            .collect();
        nonzero.into_iter()
    }

    /// The q-quantile (`0 < q < 1`) in the crate's rank definition (the
    /// value at 0-based rank ⌊q·(n−1)⌋), with its bucket's bounds.
    pub fn quantile(&self, q: f64) -> Option<Quantile> {
        if self.total == 0 || !(0.0..=1.0).contains(&q) {
            return None;
        }
        let mut dd = DDSketch::new(MAPPING.config);
        for (k, n) in self.buckets() {
            // The representative maps back to its own bucket (it lies strictly inside).
            dd.add_with_count(MAPPING.config.value(i32::from(k)), *n);
        }
        let est_us = dd.quantile(q).ok().flatten()?;
        let key = u16::try_from(MAPPING.config.key(est_us).max(0)).unwrap_or(MAPPING.max_key);
        Some(Quantile {
            estimate_ms: est_us / 1000.0,
            lower_ms: lower_us(key) / 1000.0,
            upper_ms: upper_us(key).map(|u| u / 1000.0),
        })
    }

    /// Compact form: version, then (key delta, count) varints.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = vec![FORMAT_SKETCH];
        write_keys(&mut out, self.buckets());
        out
    }

    /// Add an encoded sketch into this one; returns the requests it held.
    /// On an error part of it may have been added: discard the sketch.
    pub fn merge_encoded(&mut self, bytes: &[u8]) -> Result<u64, SketchError> {
        let mut r = Reader { bytes };
        match r.byte()? {
            FORMAT_SKETCH => {}
            v => return Err(SketchError::Version(v)),
        }
        let n = read_keys(&mut r, |k, c| self.add(k, c))?;
        if !r.done() {
            return Err(SketchError::Inconsistent("trailing bytes"));
        }
        Ok(n)
    }
}

/// One second of one row.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SecondCell {
    /// Failed requests in this second.
    pub errors: u64,
    /// Latency bucket → requests.
    pub buckets: BTreeMap<u16, u64>,
}

impl SecondCell {
    /// Requests in this second.
    pub fn requests(&self) -> u64 {
        self.buckets.values().sum()
    }
}

/// One row: the requests of one minute, by second (0-59).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MinuteCells {
    /// Second of the minute → its cell.
    pub seconds: BTreeMap<u8, SecondCell>,
}

/// What part of a row a reader wants: seconds `[from, to)` of the minute.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SecondRange {
    /// First second included.
    pub from: u8,
    /// First second excluded (≤ 60).
    pub to: u8,
}

impl SecondRange {
    /// The whole minute.
    pub const ALL: SecondRange = SecondRange { from: 0, to: 60 };

    /// The seconds of the minute starting at `bucket_ns` that start in
    /// `[start_ns, end_ns)`.
    pub fn within(bucket_ns: i64, start_ns: i64, end_ns: i64) -> SecondRange {
        let first = |t: i64| -> u8 {
            // First second starting at or after t.
            let d = t.saturating_sub(bucket_ns);
            if d <= 0 {
                0
            } else {
                u8::try_from(((d - 1) / SECOND_NS + 1).min(60)).unwrap_or(60)
            }
        };
        SecondRange {
            from: first(start_ns),
            to: first(end_ns),
        }
    }
}

impl MinuteCells {
    /// Record one request; returns an estimate of the bytes it added (a
    /// new second cell, a new bucket), for the decoder's memory budget.
    pub fn record(&mut self, second: u8, key: u16, failed: bool) -> usize {
        let second = second.min(SECONDS_PER_ROW - 1);
        let key = key.min(MAPPING.max_key);
        let mut added = 0;
        if !self.seconds.contains_key(&second) {
            added += NODE_PEAK * size_of::<(u8, SecondCell)>();
        }
        let cell = self.seconds.entry(second).or_default();
        if !cell.buckets.contains_key(&key) {
            added += NODE_PEAK * size_of::<(u16, u64)>();
        }
        *cell.buckets.entry(key).or_default() += 1;
        cell.errors += u64::from(failed);
        added
    }

    /// Add `n` requests (`errors` of them failed) at once.
    pub fn record_many(&mut self, second: u8, key: u16, n: u64, errors: u64) {
        if n == 0 {
            return;
        }
        let cell = self
            .seconds
            .entry(second.min(SECONDS_PER_ROW - 1))
            .or_default();
        *cell.buckets.entry(key.min(MAPPING.max_key)).or_default() += n;
        cell.errors += errors.min(n);
    }

    /// Add every request of `other`.
    pub fn merge(&mut self, other: &MinuteCells) {
        for (s, cell) in &other.seconds {
            let mine = self.seconds.entry(*s).or_default();
            mine.errors = mine.errors.saturating_add(cell.errors);
            for (k, n) in &cell.buckets {
                let slot = mine.buckets.entry(*k).or_default();
                *slot = slot.saturating_add(*n);
            }
        }
    }

    /// (requests, errors).
    pub fn totals(&self) -> (u64, u64) {
        self.seconds.values().fold((0, 0), |(r, e), c| {
            (r.saturating_add(c.requests()), e.saturating_add(c.errors))
        })
    }

    /// The whole minute's latency sketch.
    pub fn sketch(&self) -> Sketch {
        let mut s = Sketch::default();
        for cell in self.seconds.values() {
            for (k, n) in &cell.buckets {
                s.add(*k, *n);
            }
        }
        s
    }

    /// Cells (second, bucket) held.
    pub fn cell_count(&self) -> usize {
        self.seconds.values().map(|c| c.buckets.len()).sum()
    }

    /// Compact form: version, then per second: second, errors, buckets.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(2 + self.cell_count() * 3);
        out.push(FORMAT_SECONDS);
        put_varint(&mut out, self.seconds.len() as u64);
        for (s, cell) in &self.seconds {
            out.push(*s);
            put_varint(&mut out, cell.errors);
            write_keys(&mut out, cell.buckets.iter().map(|(k, n)| (*k, n)));
        }
        out
    }

    /// Decode a row.
    pub fn decode(bytes: &[u8]) -> Result<MinuteCells, SketchError> {
        let mut m = MinuteCells::default();
        decode_seconds(bytes, SecondRange::ALL, |s, errors, buckets| {
            m.seconds.insert(
                s,
                SecondCell {
                    errors,
                    buckets: buckets.iter().copied().collect(),
                },
            );
        })?;
        Ok(m)
    }

    /// Add the seconds of an encoded row that fall in `range` into
    /// `sketch`; returns their (requests, errors). On an error part of the
    /// row may have been added: discard the sketch.
    pub fn read_into(
        bytes: &[u8],
        range: SecondRange,
        sketch: &mut Sketch,
    ) -> Result<(u64, u64), SketchError> {
        let (mut req, mut err) = (0u64, 0u64);
        decode_seconds(bytes, range, |_, errors, buckets| {
            for (k, n) in buckets {
                sketch.add(*k, *n);
                req = req.saturating_add(*n);
            }
            err = err.saturating_add(errors);
        })?;
        Ok((req, err))
    }
}

/// Walks an encoded row, validating all of it, and calls `f(second,
/// errors, buckets)` for the seconds in `range`.
fn decode_seconds(
    bytes: &[u8],
    range: SecondRange,
    mut f: impl FnMut(u8, u64, &[(u16, u64)]),
) -> Result<(), SketchError> {
    let mut r = Reader { bytes };
    match r.byte()? {
        FORMAT_SECONDS => {}
        v => return Err(SketchError::Version(v)),
    }
    let n = r.varint()?;
    if n > u64::from(SECONDS_PER_ROW) {
        return Err(SketchError::Inconsistent("more than 60 seconds in a row"));
    }
    let mut last: i16 = -1;
    let mut buckets: Vec<(u16, u64)> = Vec::new();
    for _ in 0..n {
        let s = r.byte()?;
        if s >= SECONDS_PER_ROW || i16::from(s) <= last {
            return Err(SketchError::Inconsistent("seconds out of order"));
        }
        last = i16::from(s);
        let errors = r.varint()?;
        buckets.clear();
        let requests = read_keys(&mut r, |k, c| buckets.push((k, c)))?;
        if errors > requests {
            return Err(SketchError::Inconsistent("more errors than requests"));
        }
        if s >= range.from && s < range.to {
            f(s, errors, &buckets);
        }
    }
    if !r.done() {
        return Err(SketchError::Inconsistent("trailing bytes"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gamma_is_at_most_1_02_and_every_key_round_trips() {
        assert!(gamma() <= 1.02 && gamma() > 1.0, "{}", gamma());
        // Keys cover 1 µs to 2^32 µs.
        assert_eq!(key_of_ns(0), 0);
        assert_eq!(key_of_ns(1000), 0);
        assert_eq!(key_of_ns(i64::MAX), max_key());
        let want = (MAX_US.ln() / gamma().ln()).floor() as u16;
        assert_eq!(max_key(), want);
        for k in 0..=max_key() {
            let v = MAPPING.config.value(i32::from(k));
            assert_eq!(MAPPING.config.key(v), i32::from(k), "key {k}");
            assert!(lower_us(k) <= v && upper_us(k).is_none_or(|u| v < u));
        }
    }

    /// Every latency from 1 µs to 1 h (geometric sweep): the bucket holds
    /// it, and the representative is within α.
    #[test]
    fn every_latency_is_within_alpha_of_its_bucket() {
        let mut us = 1.0f64;
        while us < 3.6e9 {
            let ns = (us * 1000.0).round() as i64;
            let k = key_of_ns(ns);
            let v = ns as f64 / 1000.0;
            assert!(lower_us(k) <= v, "{v} < lower of {k}");
            assert!(upper_us(k).is_some_and(|u| v < u), "{v} ≥ upper of {k}");
            let rep = MAPPING.config.value(i32::from(k));
            assert!(
                (rep - v).abs() / v <= RELATIVE_ACCURACY + 1e-12,
                "{v} -> {rep}"
            );
            us *= 1.000_731;
        }
    }

    #[test]
    fn p95_is_bounded_by_its_bucket_and_merge_is_addition() {
        let mut a = MinuteCells::default();
        let mut b = MinuteCells::default();
        // 0-based rank ⌊0.95·199⌋ = 189: the value 100 ms sits at ranks 185..195.
        for i in 0..200u32 {
            let ms = if (185..195).contains(&i) {
                100.0
            } else if i < 185 {
                10.0 + f64::from(i) * 0.4
            } else {
                500.0 + f64::from(i)
            };
            let cells = if i % 2 == 0 { &mut a } else { &mut b };
            cells.record(
                (i % 60) as u8,
                key_of_ns((ms * 1e6) as i64),
                i.is_multiple_of(10),
            );
        }
        let mut merged = a.clone();
        merged.merge(&b);
        assert_eq!(merged.totals(), (200, 20));
        let mut s = a.sketch();
        s.merge(&b.sketch());
        assert_eq!(s, merged.sketch());
        let q = s.quantile(0.95).unwrap();
        assert!(q.lower_ms <= 100.0 && q.upper_ms.unwrap() > 100.0, "{q:?}");
        assert!(
            (q.estimate_ms - 100.0).abs() / 100.0 <= RELATIVE_ACCURACY,
            "{q:?}"
        );
        assert!(q.relative_error().unwrap() <= RELATIVE_ACCURACY + 1e-12);
        assert_eq!(Sketch::default().quantile(0.95), None);
    }

    #[test]
    fn encodings_round_trip_and_refuse_garbage() {
        let mut m = MinuteCells::default();
        for i in 0..5000u32 {
            m.record(
                (i % 60) as u8,
                key_of_ns(i64::from(i) * 7_919_000),
                i % 13 == 0,
            );
        }
        let bytes = m.encode();
        assert_eq!(MinuteCells::decode(&bytes).unwrap(), m);
        let mut s = Sketch::default();
        let (req, err) =
            MinuteCells::read_into(&bytes, SecondRange { from: 10, to: 20 }, &mut s).unwrap();
        let want: u64 = m.seconds.range(10..20).map(|(_, c)| c.requests()).sum();
        let want_err: u64 = m.seconds.range(10..20).map(|(_, c)| c.errors).sum();
        assert_eq!((req, err), (want, want_err));
        assert_eq!(s.count(), want);
        let sk = m.sketch().encode();
        let mut back = Sketch::default();
        assert_eq!(back.merge_encoded(&sk).unwrap(), 5000);
        assert_eq!(back, m.sketch());
        // Every truncation is refused, never a panic.
        for cut in 0..bytes.len() {
            assert!(MinuteCells::decode(&bytes[..cut]).is_err(), "cut {cut}");
        }
        assert_eq!(
            MinuteCells::decode(&[9]).unwrap_err(),
            SketchError::Version(9)
        );
        // Second 60, errors above requests, an out-of-range key.
        assert!(MinuteCells::decode(&[1, 1, 60, 0, 0]).is_err());
        assert!(MinuteCells::decode(&[1, 1, 0, 2, 1, 0, 1]).is_err());
        let mut big = vec![1, 1, 0, 0, 1];
        put_varint(&mut big, u64::from(max_key()) + 1);
        big.push(1);
        assert!(MinuteCells::decode(&big).is_err());
        assert!(Sketch::default().merge_encoded(&[1, 1, 0]).is_err());
    }

    #[test]
    fn second_ranges_cover_exactly_the_seconds_that_start_in_the_window() {
        let b = 600 * SECOND_NS;
        assert_eq!(
            SecondRange::within(b, b, b + 60 * SECOND_NS),
            SecondRange::ALL
        );
        let r = SecondRange::within(b, b + 10 * SECOND_NS, b + 120 * SECOND_NS);
        assert_eq!((r.from, r.to), (10, 60));
        // A start inside second 10 excludes it (it started before the window).
        let r = SecondRange::within(b, b + 10 * SECOND_NS + 1, b + 35 * SECOND_NS);
        assert_eq!((r.from, r.to), (11, 35));
        let r = SecondRange::within(b, 0, b + 1);
        assert_eq!((r.from, r.to), (0, 1));
    }
}
