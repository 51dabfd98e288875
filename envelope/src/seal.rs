//! Sealing and verification.
//!
//! The digest is `sha256:<lowercase hex>` over the RFC 8785 canonical form of
//! the envelope object with its `digest` member removed. Verification hashes the
//! canonical form of the *parsed bytes* (not of a re-serialized model), so an
//! envelope written by another implementation verifies as long as it is valid
//! JSON with the same members. Sealing refuses an envelope that breaks a rule:
//! a sealed envelope is a valid one.

use serde::Serialize;
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::canonical::write_canonical;
use crate::error::EnvelopeError;
use crate::form::DIGEST_PREFIX;
use crate::model::{Envelope, SCHEMA_ID};
use crate::rules::check_rules;
use crate::strict::parse_strict;

/// An envelope refused, with every rule it broke (structural failures stop at
/// the first; semantic rules are all reported).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, serde::Serialize)]
#[error("{}", .errors.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("; "))]
pub struct Rejection {
    /// What was wrong, in the order found.
    pub errors: Vec<EnvelopeError>,
}

impl From<EnvelopeError> for Rejection {
    fn from(e: EnvelopeError) -> Self {
        Rejection { errors: vec![e] }
    }
}

/// `sha256:<hex>` of arbitrary bytes.
pub fn sha256_digest(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(DIGEST_PREFIX.len() + 64);
    out.push_str(DIGEST_PREFIX);
    out.push_str(&hex::encode(Sha256::digest(bytes)));
    out
}

/// Canonical bytes of an envelope value without its `digest` member.
pub fn canonical_without_digest(value: &Value) -> Result<Vec<u8>, EnvelopeError> {
    let Value::Object(map) = value else {
        return Err(EnvelopeError::InvalidField {
            path: "$".into(),
            reason: "an envelope is a JSON object".into(),
        });
    };
    // Write the members minus `digest` from borrowed references rather than
    // cloning a possibly large object.
    let mut out = Vec::with_capacity(estimate_size(value));
    let mut stripped: Vec<(&String, &Value)> = map.iter().filter(|(k, _)| *k != "digest").collect();
    stripped.sort_by(|a, b| a.0.encode_utf16().cmp(b.0.encode_utf16()));
    out.push(b'{');
    for (i, (k, v)) in stripped.into_iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        write_canonical(&Value::String(k.clone()), &mut out)?;
        out.push(b':');
        write_canonical(v, &mut out).map_err(|mut e| {
            e.prefix_path(&format!(".{k}"));
            e
        })?;
    }
    out.push(b'}');
    Ok(out)
}

fn estimate_map_size(map: &serde_json::Map<String, Value>) -> usize {
    map.iter()
        .map(|(k, v)| k.len() + 3 + estimate_size(v))
        .sum::<usize>()
        + map.len()
        + 2
}

fn estimate_size(value: &Value) -> usize {
    // Cheap lower bound so large envelopes do not regrow the buffer many times.
    match value {
        Value::String(s) => s.len() + 2,
        Value::Array(a) => a.iter().map(estimate_size).sum::<usize>() + a.len() + 2,
        Value::Object(m) => estimate_map_size(m),
        _ => 8,
    }
}

/// Digest of the canonical form of `value` minus its `digest` member.
pub fn compute_digest(value: &Value) -> Result<String, EnvelopeError> {
    Ok(sha256_digest(&canonical_without_digest(value)?))
}

impl Envelope {
    /// Check every rule, then fill in `digest`. An envelope that breaks a rule is
    /// refused: sealing is the promise that it is valid.
    pub fn seal(self) -> Result<Envelope, Rejection> {
        let errors = check_rules(&self);
        if !errors.is_empty() {
            return Err(Rejection { errors });
        }
        Ok(self.seal_unchecked()?)
    }

    /// Fill in `digest` without checking rules. For building hostile fixtures
    /// and for tools that re-seal on purpose; never for evidence.
    pub fn seal_unchecked(mut self) -> Result<Envelope, EnvelopeError> {
        self.digest = self.canonical_digest()?;
        Ok(self)
    }

    /// `sha256:` of the canonical form minus `digest`.
    pub fn canonical_digest(&self) -> Result<String, EnvelopeError> {
        match fast_canonical_digest(self) {
            Some(d) => Ok(d),
            None => {
                // A float, an unsafe integer or a key beyond U+FFFF: take the
                // general path, which names the problem and where it is.
                let value =
                    serde_json::to_value(self).map_err(|e| EnvelopeError::InvalidField {
                        path: "$".into(),
                        reason: e.to_string(),
                    })?;
                compute_digest(&value)
            }
        }
    }

    /// Canonical bytes of the envelope minus its digest.
    pub fn canonical_body(&self) -> Result<Vec<u8>, EnvelopeError> {
        let value = serde_json::to_value(self).map_err(|e| EnvelopeError::InvalidField {
            path: "$".into(),
            reason: e.to_string(),
        })?;
        canonical_without_digest(&value)
    }

    /// Canonical bytes through the fast path, `None` where it must defer to
    /// the general canonicalizer. Exposed for the agreement test.
    #[doc(hidden)]
    pub fn fast_canonical_body(&self) -> Option<Vec<u8>> {
        // Size the buffer up front: regrowing a 1 MiB buffer by doubling copies
        // about as many bytes again as the envelope holds.
        let surfaces: usize = self
            .surfaces
            .iter()
            .map(|s| 256 + s.id.len() + s.authority.len() + estimate_map_size(&s.facts))
            .sum();
        let mut out =
            Vec::with_capacity(4096 + surfaces + 512 * (self.claims.len() + self.unknowns.len()));
        let mut ser =
            serde_json::Serializer::with_formatter(&mut out, CanonicalFormatter::default());
        Body::of(self).serialize(&mut ser).ok()?;
        Some(out)
    }

    /// The JSON bytes to store or ship (pretty, newline-terminated). The digest
    /// does not depend on formatting, so any rendering verifies.
    pub fn to_json_pretty(&self) -> Vec<u8> {
        let mut out = serde_json::to_vec_pretty(self).unwrap_or_default();
        out.push(b'\n');
        out
    }

    /// The envelope rendered canonically (digest included).
    pub fn to_canonical_json(&self) -> Result<Vec<u8>, EnvelopeError> {
        let value = serde_json::to_value(self).map_err(|e| EnvelopeError::InvalidField {
            path: "$".into(),
            reason: e.to_string(),
        })?;
        crate::canonical::to_canonical(&value)
    }
}

/// The envelope minus `digest`, fields in canonical (alphabetical) order.
#[derive(serde::Serialize)]
struct Body<'a> {
    bounds: &'a crate::model::Bounds,
    claims: &'a [crate::model::Claim],
    clock: &'a crate::model::Clock,
    collector: &'a crate::model::Collector,
    completeness: crate::model::Completeness,
    next_transition: &'a crate::model::NextTransition,
    schema: &'a str,
    subject: &'a crate::model::Subject,
    surfaces: &'a [crate::model::Surface],
    universe: &'a crate::model::Universe,
    unknowns: &'a [crate::model::Unknown],
}

impl<'a> Body<'a> {
    fn of(e: &'a Envelope) -> Self {
        Body {
            bounds: &e.bounds,
            claims: &e.claims,
            clock: &e.clock,
            collector: &e.collector,
            completeness: e.completeness,
            next_transition: &e.next_transition,
            schema: &e.schema,
            subject: &e.subject,
            surfaces: &e.surfaces,
            universe: &e.universe,
            unknowns: &e.unknowns,
        }
    }
}

/// serde_json's compact output is RFC 8785 for our model (alphabetical fields,
/// BTreeMap facts, JCS-identical string escapes) except for what this
/// formatter refuses: floats, unsafe integers, and member names holding a
/// character above U+FFFF (whose UTF-16 order can differ from UTF-8 order).
#[derive(Default)]
struct CanonicalFormatter {
    in_key: bool,
}

fn refuse() -> std::io::Error {
    std::io::Error::other("needs the general canonicalizer")
}

impl serde_json::ser::Formatter for CanonicalFormatter {
    fn write_f32<W: ?Sized + std::io::Write>(&mut self, _: &mut W, _: f32) -> std::io::Result<()> {
        Err(refuse())
    }
    fn write_f64<W: ?Sized + std::io::Write>(&mut self, _: &mut W, _: f64) -> std::io::Result<()> {
        Err(refuse())
    }
    fn write_u64<W: ?Sized + std::io::Write>(&mut self, w: &mut W, v: u64) -> std::io::Result<()> {
        if v > crate::strict::MAX_SAFE_INTEGER {
            return Err(refuse());
        }
        w.write_all(itoa::Buffer::new().format(v).as_bytes())
    }
    fn write_i64<W: ?Sized + std::io::Write>(&mut self, w: &mut W, v: i64) -> std::io::Result<()> {
        if v.unsigned_abs() > crate::strict::MAX_SAFE_INTEGER {
            return Err(refuse());
        }
        w.write_all(itoa::Buffer::new().format(v).as_bytes())
    }
    fn write_u128<W: ?Sized + std::io::Write>(
        &mut self,
        _: &mut W,
        _: u128,
    ) -> std::io::Result<()> {
        Err(refuse())
    }
    fn write_i128<W: ?Sized + std::io::Write>(
        &mut self,
        _: &mut W,
        _: i128,
    ) -> std::io::Result<()> {
        Err(refuse())
    }
    fn write_number_str<W: ?Sized + std::io::Write>(
        &mut self,
        _: &mut W,
        _: &str,
    ) -> std::io::Result<()> {
        Err(refuse())
    }
    fn begin_object_key<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        self.in_key = true;
        if first { Ok(()) } else { w.write_all(b",") }
    }
    fn end_object_key<W: ?Sized + std::io::Write>(&mut self, _: &mut W) -> std::io::Result<()> {
        self.in_key = false;
        Ok(())
    }
    fn write_string_fragment<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        fragment: &str,
    ) -> std::io::Result<()> {
        // 4-byte UTF-8 sequences start with 0xF0..=0xF4.
        if self.in_key && fragment.bytes().any(|b| b >= 0xF0) {
            return Err(refuse());
        }
        w.write_all(fragment.as_bytes())
    }
}

/// Digest via the fast path, or `None` when the general path must decide.
/// (Streaming into the hasher in blocks, and hashing on a second thread, were
/// both measured slower here than one buffer hashed once: see BENCHMARKS.md.)
fn fast_canonical_digest(e: &Envelope) -> Option<String> {
    e.fast_canonical_body().map(|body| sha256_digest(&body))
}

/// Parse bytes into a typed envelope: strict JSON, schema id, closed world.
/// Does not check semantic rules or the digest; see [`verify`].
pub fn parse(bytes: &[u8]) -> Result<(Envelope, Value), EnvelopeError> {
    let value = parse_strict(bytes)?;
    let envelope = crate::rules::from_value(&value)?;
    Ok((envelope, value))
}

/// Parse, check every rule, and check the digest against the canonical form of
/// the bytes as given. This is what anything receiving an envelope calls.
pub fn verify(bytes: &[u8]) -> Result<Envelope, Rejection> {
    let envelope = match parse_typed(bytes) {
        Some(envelope) => envelope,
        // Something is wrong with the bytes: the strict two-stage parse names
        // what and where.
        None => match parse(bytes) {
            Err(e) => return Err(e.into()),
            Ok((envelope, _)) => envelope,
        },
    };
    if envelope.schema != SCHEMA_ID {
        return Err(EnvelopeError::WrongSchema {
            found: envelope.schema.clone(),
        }
        .into());
    }
    let mut errors = check_rules(&envelope);
    // The typed model is a lossless reading of the bytes (closed world, no
    // duplicate keys, no nulls outside facts, facts kept as parsed), so its
    // canonical form is the canonical form of the bytes.
    let computed = envelope.canonical_digest()?;
    if computed != envelope.digest {
        errors.push(EnvelopeError::BadDigest {
            declared: envelope.digest.clone(),
            computed,
        });
    }
    if errors.is_empty() {
        Ok(envelope)
    } else {
        Err(Rejection { errors })
    }
}

/// The fast single-pass typed parse; `None` on any problem (the caller then
/// takes the strict path to name it).
fn parse_typed(bytes: &[u8]) -> Option<Envelope> {
    std::str::from_utf8(bytes).ok()?;
    let _stale = crate::strict::take_facts_failure();
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let envelope = <Envelope as serde::Deserialize>::deserialize(&mut de).ok()?;
    de.end().ok()?;
    Some(envelope)
}
