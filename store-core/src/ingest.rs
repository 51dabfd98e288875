//! Ingest, the pure part: turn one request body into verified envelopes and
//! per-item rejections, with no database and no clock.
//!
//! Invariants:
//! - **Bounded.** The body on the wire, the body after gzip, the number of
//!   items and each envelope are capped ([`IngestLimits`]); a gzip bomb stops at
//!   the decoded cap, never after allocating it.
//! - **Exact bytes.** Each item is the exact byte range the client sent (an
//!   array element's text, an NDJSON line, or the whole single body), so the
//!   store can return it byte-for-byte and its digest still verifies.
//! - **Every item judged alone.** One bad item never taints the others: it is
//!   rejected with every envelope rule it broke (`EnvelopeError::rule()` codes)
//!   or a store rule (`envelope_too_large`, `invalid_wall_time`).
//! - A body that cannot be split into items at all (bad gzip, a truncated JSON
//!   array) is refused as a whole with a [`BodyError`]; nothing is stored.

use std::io::Read;

use bytes::Bytes;
use pstack_envelope::{Completeness, Unknown, is_sha256_digest, verify_summary};
use serde::Serialize;
use serde_json::value::RawValue;

use crate::ident::{SubjectIndex, wall_time_ns};

/// Caps on one ingest request. Defaults trade memory per request (at most
/// `max_decoded_bytes` held at once, per concurrent request) for batch size.
#[derive(Debug, Clone, Copy)]
pub struct IngestLimits {
    /// Largest body on the wire (compressed or not). Default 16 MiB.
    pub max_body_bytes: usize,
    /// Largest body after gzip decoding. Default 64 MiB.
    pub max_decoded_bytes: usize,
    /// Most envelopes in one batch. Default 5,000.
    pub max_items: usize,
    /// Largest single envelope. Default 4 MiB.
    pub max_envelope_bytes: usize,
    /// Most spans in one OTLP request (`/v1/traces`). Default 100,000
    /// ([`crate::analysis::otlp::DEFAULT_MAX_SPANS`]); past it 413
    /// `too_many_spans`. Bounds a request's decoded spans (264 bytes each
    /// and up, decoded) whatever its size on the wire.
    pub max_spans: usize,
}

impl Default for IngestLimits {
    fn default() -> Self {
        IngestLimits {
            max_body_bytes: 16 << 20,
            max_decoded_bytes: 64 << 20,
            max_items: 5_000,
            max_envelope_bytes: 4 << 20,
            max_spans: crate::analysis::otlp::DEFAULT_MAX_SPANS,
        }
    }
}

/// A body refused as a whole.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BodyError {
    /// The body on the wire exceeds `max_body_bytes` (HTTP 413).
    #[error("request body exceeds {limit} bytes")]
    TooLarge { limit: usize },
    /// The gzip-decoded body exceeds `max_decoded_bytes` (HTTP 413).
    #[error("decoded request body exceeds {limit} bytes")]
    DecodedTooLarge { limit: usize },
    /// Decoding needs more memory than the store's in-flight budget has free
    /// now (HTTP 503 + Retry-After).
    #[error("the store's in-flight memory budget cannot hold this body decoded right now")]
    Busy,
    /// `Content-Encoding: gzip` but the body is not a valid gzip stream (HTTP 400).
    #[error("body is not valid gzip: {0}")]
    MalformedGzip(String),
    /// A content encoding other than identity or gzip (HTTP 415).
    #[error("unsupported content encoding {0:?} (use gzip or none)")]
    UnsupportedEncoding(String),
    /// Nothing to ingest (HTTP 400).
    #[error("empty body")]
    Empty,
    /// The body is neither an envelope object, a JSON array of them, nor NDJSON (HTTP 400).
    #[error("body cannot be split into envelopes: {0}")]
    MalformedBatch(String),
    /// More items than `max_items` (HTTP 413).
    #[error("batch holds {count} items; at most {limit} are accepted per request")]
    TooManyItems { count: usize, limit: usize },
}

impl BodyError {
    /// Stable code for the response body.
    pub fn code(&self) -> &'static str {
        match self {
            BodyError::TooLarge { .. } => "body_too_large",
            BodyError::DecodedTooLarge { .. } => "decoded_body_too_large",
            BodyError::MalformedGzip(_) => "malformed_gzip",
            BodyError::UnsupportedEncoding(_) => "unsupported_content_encoding",
            BodyError::Empty => "empty_body",
            BodyError::MalformedBatch(_) => "malformed_batch",
            BodyError::TooManyItems { .. } => "too_many_items",
            BodyError::Busy => "busy",
        }
    }
}

/// Decode the body per its `Content-Encoding`.
pub fn decode_body(
    body: Bytes,
    content_encoding: Option<&str>,
    limits: &IngestLimits,
) -> Result<Bytes, BodyError> {
    decode_body_within(body, content_encoding, limits, &mut |_| true)
}

/// Decoding step: at most this many decoded bytes per budget reservation.
const DECODE_CHUNK: usize = 1 << 20;

/// [`decode_body`] where every decoded megabyte is first reserved with
/// `reserve(bytes)`; a refused reservation stops decoding with
/// [`BodyError::Busy`]. Memory held by decoding is thus bounded by what the
/// caller's budget granted, not by `max_decoded_bytes` per request.
pub fn decode_body_within(
    body: Bytes,
    content_encoding: Option<&str>,
    limits: &IngestLimits,
    reserve: &mut dyn FnMut(usize) -> bool,
) -> Result<Bytes, BodyError> {
    if body.len() > limits.max_body_bytes {
        return Err(BodyError::TooLarge {
            limit: limits.max_body_bytes,
        });
    }
    match content_encoding.map(|e| e.trim().to_ascii_lowercase()) {
        None => Ok(body),
        Some(e) if e.is_empty() || e == "identity" => Ok(body),
        Some(e) if e == "gzip" || e == "x-gzip" => {
            let cap = limits.max_decoded_bytes as u64 + 1;
            let mut decoder = flate2::read::MultiGzDecoder::new(body.as_ref()).take(cap);
            let mut out: Vec<u8> = Vec::new();
            loop {
                if !reserve(DECODE_CHUNK) {
                    return Err(BodyError::Busy);
                }
                let start = out.len();
                out.resize(start + DECODE_CHUNK, 0);
                let mut filled = start;
                while filled < out.len() {
                    match decoder.read(&mut out[filled..]) {
                        Ok(0) => break,
                        Ok(n) => filled += n,
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                        Err(e) => return Err(BodyError::MalformedGzip(e.to_string())),
                    }
                }
                let done = filled < out.len();
                out.truncate(filled);
                if out.len() > limits.max_decoded_bytes {
                    return Err(BodyError::DecodedTooLarge {
                        limit: limits.max_decoded_bytes,
                    });
                }
                if done {
                    break;
                }
            }
            Ok(Bytes::from(out))
        }
        Some(other) => Err(BodyError::UnsupportedEncoding(other)),
    }
}

/// How the items were framed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Framing {
    /// One envelope object.
    Single,
    /// A JSON array of envelope objects.
    Array,
    /// One envelope per line.
    Ndjson,
}

/// Split a decoded body into item byte ranges.
pub fn split_items<'a>(
    body: &'a [u8],
    ndjson: bool,
    limits: &IngestLimits,
) -> Result<(Framing, Vec<&'a [u8]>), BodyError> {
    let first = body.iter().position(|b| !b.is_ascii_whitespace());
    let Some(first) = first else {
        return Err(BodyError::Empty);
    };
    let (framing, items): (Framing, Vec<&[u8]>) = if ndjson {
        let items = body
            .split(|&b| b == b'\n')
            .map(|line| line.strip_suffix(b"\r").unwrap_or(line))
            .filter(|line| line.iter().any(|b| !b.is_ascii_whitespace()))
            .collect();
        (Framing::Ndjson, items)
    } else if body[first] == b'[' {
        let raw: Vec<&RawValue> =
            serde_json::from_slice(body).map_err(|e| BodyError::MalformedBatch(e.to_string()))?;
        (
            Framing::Array,
            raw.into_iter().map(|r| r.get().as_bytes()).collect(),
        )
    } else {
        (Framing::Single, vec![body])
    };
    if items.is_empty() {
        return Err(BodyError::Empty);
    }
    if items.len() > limits.max_items {
        return Err(BodyError::TooManyItems {
            count: items.len(),
            limit: limits.max_items,
        });
    }
    Ok((framing, items))
}

/// Verify every item of a decoded body; each verified item's bytes share
/// `body`'s buffer.
pub fn verify_items(body: &Bytes, items: &[&[u8]], limits: &IngestLimits) -> Vec<ItemVerdict> {
    items
        .iter()
        .map(|item| {
            let shared = body.slice_ref(item);
            verify_item(shared, limits)
        })
        .collect()
}

/// One reason an item was refused.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Reason {
    /// Stable snake_case rule code (an `EnvelopeError::rule()` or a store rule).
    pub rule: String,
    /// What was wrong, for a person.
    pub message: String,
}

/// An envelope that verified, ready to store.
#[derive(Debug, Clone)]
pub struct VerifiedItem {
    /// Its digest (`sha256:<hex>`), checked against the bytes.
    pub digest: String,
    /// The exact bytes received (a zero-copy slice of the request body).
    pub bytes: Bytes,
    /// Their LZ4 block when it is smaller (`crate::db::body`), made here,
    /// on the verifying threads, not under the database's writer.
    pub lz4_block: Option<Vec<u8>>,
    /// Its claims' codes in `envelopes.claim_codes`' form.
    pub claim_codes: String,
    /// Its subject, flattened.
    pub subject: SubjectIndex,
    /// Capture wall time, ns since the epoch.
    pub wall_ns: i64,
    /// Completeness wire name.
    pub completeness: &'static str,
    /// Its unknowns.
    pub unknowns: Vec<Unknown>,
    /// What finds the other end of its transfer (stream and storage
    /// transfer envelopes only; `crate::transfers`).
    pub join: Option<crate::transfers::JoinCandidate>,
}

impl VerifiedItem {
    /// What `envelopes.body` and `envelopes.body_codec` get for it.
    pub fn stored_body(&self) -> (&[u8], i64) {
        crate::db::body::stored_form(&self.bytes, self.lz4_block.as_deref())
    }
}

/// An item refused.
#[derive(Debug, Clone)]
pub struct RejectedItem {
    /// The digest the item declares, when it declares a well-formed one (it
    /// lets a shipper find the spool file; for `bad_digest` it is *not* the
    /// digest of the bytes).
    pub declared_digest: Option<String>,
    /// Every rule it broke.
    pub reasons: Vec<Reason>,
}

/// The verdict on one item.
#[derive(Debug, Clone)]
pub enum ItemVerdict {
    /// Verified and valid.
    Verified(Box<VerifiedItem>),
    /// Refused, with reasons.
    Rejected(RejectedItem),
}

/// Verify one item: size, strict parse, closed world, every rule, the digest.
/// `bytes` is kept as the stored form (slice a shared body to avoid a copy).
pub fn verify_item(bytes: Bytes, limits: &IngestLimits) -> ItemVerdict {
    if bytes.len() > limits.max_envelope_bytes {
        return ItemVerdict::Rejected(RejectedItem {
            declared_digest: None,
            reasons: vec![Reason {
                rule: "envelope_too_large".into(),
                message: format!(
                    "envelope is {} bytes; at most {} are accepted",
                    bytes.len(),
                    limits.max_envelope_bytes
                ),
            }],
        });
    }
    // Only what the store indexes is read out; no typed model is built for
    // canonical bytes (`verify_summary`), with `verify`'s verdict.
    match verify_summary(&bytes) {
        Ok(env) => {
            let digest = env.digest.to_string();
            let Some(wall_ns) = wall_time_ns(&env.clock.wall_time) else {
                return ItemVerdict::Rejected(RejectedItem {
                    declared_digest: Some(digest),
                    reasons: vec![Reason {
                        rule: "invalid_wall_time".into(),
                        message: format!(
                            "clock.wall_time {:?} is not a real RFC 3339 UTC instant",
                            env.clock.wall_time
                        ),
                    }],
                });
            };
            ItemVerdict::Verified(Box::new(VerifiedItem {
                join: crate::transfers::candidate(&env.subject, &env.clock, wall_ns),
                subject: SubjectIndex::of(&env.subject),
                wall_ns,
                completeness: completeness_name(env.completeness),
                unknowns: env.unknowns,
                claim_codes: crate::db::body::claim_codes_column(&env.claim_codes),
                lz4_block: crate::db::body::compress(&bytes),
                digest,
                bytes,
            }))
        }
        Err(rejection) => ItemVerdict::Rejected(RejectedItem {
            declared_digest: declared_digest(&bytes),
            reasons: rejection
                .errors
                .iter()
                .map(|e| Reason {
                    rule: e.rule().to_string(),
                    message: e.to_string(),
                })
                .collect(),
        }),
    }
}

fn completeness_name(c: Completeness) -> &'static str {
    c.as_str()
}

/// The `digest` member of an item, if it is an object with a well-formed one.
fn declared_digest(bytes: &[u8]) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct DigestOnly {
        digest: Option<String>,
    }
    let d: DigestOnly = serde_json::from_slice(bytes).ok()?;
    d.digest.filter(|d| is_sha256_digest(d))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn gzip(bytes: &[u8]) -> Vec<u8> {
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        enc.write_all(bytes).unwrap();
        enc.finish().unwrap()
    }

    #[test]
    fn gzip_bomb_stops_at_the_decoded_cap() {
        let limits = IngestLimits {
            max_decoded_bytes: 1 << 20,
            ..IngestLimits::default()
        };
        let bomb = gzip(&vec![b' '; 8 << 20]);
        assert!(
            bomb.len() < 1 << 20,
            "the bomb is small on the wire: {}",
            bomb.len()
        );
        assert_eq!(
            decode_body(bomb.into(), Some("gzip"), &limits),
            Err(BodyError::DecodedTooLarge { limit: 1 << 20 })
        );
    }

    #[test]
    fn malformed_gzip_and_unknown_encoding_are_typed() {
        let limits = IngestLimits::default();
        let mut truncated = gzip(b"[{}]");
        truncated.truncate(truncated.len() - 6);
        assert_eq!(
            decode_body(Bytes::from_static(b"not gzip"), Some("gzip"), &limits)
                .unwrap_err()
                .code(),
            "malformed_gzip"
        );
        assert_eq!(
            decode_body(truncated.into(), Some("gzip"), &limits)
                .unwrap_err()
                .code(),
            "malformed_gzip"
        );
        assert_eq!(
            decode_body(Bytes::from_static(b"x"), Some("br"), &limits)
                .unwrap_err()
                .code(),
            "unsupported_content_encoding"
        );
    }

    #[test]
    fn array_items_keep_their_exact_bytes() {
        let body = b" [ {\"a\" : 1}\n, {\"b\":[2, 3]} ] ";
        let (framing, items) = split_items(body, false, &IngestLimits::default()).unwrap();
        assert_eq!(framing, Framing::Array);
        assert_eq!(items, vec![&b"{\"a\" : 1}"[..], &b"{\"b\":[2, 3]}"[..]]);
    }

    #[test]
    fn ndjson_skips_blank_lines_and_strips_cr() {
        let body = b"{\"a\":1}\r\n\n{\"b\":2}\n";
        let (framing, items) = split_items(body, true, &IngestLimits::default()).unwrap();
        assert_eq!(framing, Framing::Ndjson);
        assert_eq!(items, vec![&b"{\"a\":1}"[..], &b"{\"b\":2}"[..]]);
    }

    #[test]
    fn truncated_array_and_empty_body_are_refused_whole() {
        let limits = IngestLimits::default();
        assert_eq!(
            split_items(b"[{\"a\":1}", false, &limits)
                .unwrap_err()
                .code(),
            "malformed_batch"
        );
        assert_eq!(
            split_items(b"  \n", false, &limits).unwrap_err(),
            BodyError::Empty
        );
        assert_eq!(
            split_items(b"[]", false, &limits).unwrap_err(),
            BodyError::Empty
        );
        let many = format!("[{}]", ["{}"; 11].join(","));
        let small = IngestLimits {
            max_items: 10,
            ..limits
        };
        assert_eq!(
            split_items(many.as_bytes(), false, &small).unwrap_err(),
            BodyError::TooManyItems {
                count: 11,
                limit: 10
            }
        );
    }
}
