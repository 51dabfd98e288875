//! Sealing and verification.
//!
//! # Invariants
//!
//! - **What the digest covers.** `digest` is `sha256:<lowercase hex>` over the
//!   RFC 8785 canonical form of the envelope object with its `digest` member
//!   removed. Verification hashes the canonical form of the bytes as parsed,
//!   never a re-rendering that could hide a difference, so an envelope written
//!   by another implementation verifies as long as it is valid JSON with the
//!   same members.
//! - **Sealed means valid.** [`Envelope::seal`] checks every rule before it
//!   fills in `digest`; it refuses an envelope that breaks one.
//! - **One verdict, two paths.** [`verify`] first tries the single pass over
//!   canonical bytes (`canonical_read.rs`: parse, canonical-form and strict
//!   checks, hash of the bytes minus `digest`); bytes that are not canonical,
//!   or not valid, go to [`verify_general`] (typed parse, strict parse to name
//!   an error, digest of the model's canonical form). Where the fast path
//!   decides, the general path decides the same; it is tested to.
//! - **A verdict without a model.** [`verify_digest`] gives [`verify`]'s
//!   verdict and, on success, only the digest: canonical bytes of a valid
//!   envelope are checked and hashed in one pass that builds nothing
//!   (`canonical_check.rs`); everything else goes through [`verify`].
//!   [`verify_summary`] is the same pass plus the few members a store
//!   indexes (clock, subject, completeness, unknowns), parsed from the byte
//!   ranges the pass noted.
//! - **No `Value` tree on the way to a seal.** The canonical form of the typed
//!   model is written straight to bytes (`canonical_write.rs`); only an
//!   envelope the writer refuses (a float, an unsafe integer) is rendered as a
//!   `serde_json::Value`, so the general canonicalizer can name what and where.

use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::canonical::write_canonical;
use crate::error::EnvelopeError;
use crate::form::DIGEST_PREFIX;
use crate::model::{Clock, Completeness, Envelope, SCHEMA_ID, Subject, Unknown};
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
        match crate::canonical_write::body_digest(self) {
            Ok(d) => Ok(d),
            Err(crate::canonical_write::Refused) => {
                // A float or an unsafe integer: take the general path, which
                // names the problem and where it is.
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

    /// Canonical bytes through the typed writer, `None` where it must defer
    /// to the general canonicalizer. Exposed for the agreement test.
    #[doc(hidden)]
    pub fn fast_canonical_body(&self) -> Option<Vec<u8>> {
        crate::canonical_write::body_bytes(self).ok()
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

/// Parse bytes into a typed envelope: strict JSON, schema id, closed world.
/// Does not check semantic rules or the digest; see [`verify`].
pub fn parse(bytes: &[u8]) -> Result<(Envelope, Value), EnvelopeError> {
    let value = parse_strict(bytes)?;
    let envelope = crate::rules::from_value(&value)?;
    Ok((envelope, value))
}

/// Parse, check every rule, and check the digest against the canonical form of
/// the bytes as given. This is what anything receiving an envelope calls.
///
/// Bytes that are already canonical (what pstack writes) are checked in one
/// pass that parses, checks canonical form and strictness, and hashes them
/// (`canonical_read.rs`); anything else — non-canonical but valid (pretty,
/// members reordered), or invalid — takes the general path, which gives the
/// same verdict the fast path would have and names what is wrong.
pub fn verify(bytes: &[u8]) -> Result<Envelope, Rejection> {
    match verify_canonical(bytes) {
        Some(verdict) => verdict,
        None => verify_general(bytes),
    }
}

/// The digest of an envelope that verified, as [`verify_digest`] returns it:
/// 32 bytes, written `sha256:<lowercase hex>` (its `Display`), held without
/// allocating.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct VerifiedDigest([u8; 32]);

impl VerifiedDigest {
    /// The SHA-256 itself.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

impl std::fmt::Display for VerifiedDigest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(DIGEST_PREFIX)?;
        for b in self.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl PartialEq<str> for VerifiedDigest {
    /// Whether `other` is this digest written `sha256:<lowercase hex>`.
    fn eq(&self, other: &str) -> bool {
        crate::canonical_check::written_as(other.as_bytes(), &self.0)
    }
}

/// [`verify`] without the typed model: the same verdict (every rule, the
/// digest), and on success only the digest. For a caller that keeps the
/// bytes and needs nothing read out of them.
///
/// Canonical bytes (what pstack writes) are checked and hashed in one pass
/// that allocates nothing (`canonical_check.rs`); anything that pass does not
/// accept — not canonical, invalid, a wrong digest — goes through [`verify`],
/// whose verdict (and error list) this returns unchanged.
pub fn verify_digest(bytes: &[u8]) -> Result<VerifiedDigest, Rejection> {
    if let Some(digest) = verify_digest_fast(bytes) {
        return Ok(digest);
    }
    let envelope = verify(bytes)?;
    Ok(digest_of(&envelope)?)
}

/// The digest of an envelope [`verify`] accepted, as bytes.
fn digest_of(envelope: &Envelope) -> Result<VerifiedDigest, EnvelopeError> {
    // `verify` compared the declared digest to the one it computed, so it is
    // `sha256:` + 64 lowercase hex digits.
    let mut digest = [0u8; 32];
    envelope
        .digest
        .strip_prefix(DIGEST_PREFIX)
        .and_then(|hex| hex::decode_to_slice(hex, &mut digest).ok())
        .ok_or_else(|| EnvelopeError::BadDigest {
            declared: envelope.digest.clone(),
            computed: envelope.digest.clone(),
        })?;
    Ok(VerifiedDigest(digest))
}

/// What a store that keeps an envelope as bytes reads out of it to index it:
/// the digest, the clock, the subject, the completeness, the unknowns and
/// the claims' codes.
/// [`verify_summary`] returns it; [`VerifiedSummary::of`] takes it from a
/// verified model, and the two agree (tested on every mutation the verify
/// tests make).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifiedSummary {
    /// The digest, checked against the bytes.
    pub digest: VerifiedDigest,
    /// When the capture happened.
    pub clock: Clock,
    /// What it is about.
    pub subject: Subject,
    /// How complete it says it is.
    pub completeness: Completeness,
    /// Its unknowns, in order.
    pub unknowns: Vec<Unknown>,
    /// Its claims' codes, in claim order (a store finds envelopes by claim
    /// without reading their bodies).
    pub claim_codes: Vec<String>,
}

impl VerifiedSummary {
    /// The summary of an envelope [`verify`] accepted.
    pub fn of(envelope: Envelope) -> Result<VerifiedSummary, Rejection> {
        Ok(VerifiedSummary {
            digest: digest_of(&envelope)?,
            clock: envelope.clock,
            subject: envelope.subject,
            completeness: envelope.completeness,
            unknowns: envelope.unknowns,
            claim_codes: envelope.claims.into_iter().map(|c| c.code).collect(),
        })
    }
}

/// [`verify`]'s verdict (every rule, the digest) with only what a store
/// indexes ([`VerifiedSummary`]) read out, not the typed model.
///
/// Canonical bytes are checked and hashed by [`verify_digest`]'s single pass,
/// which also notes where `clock`, `subject`, `unknowns` and `claims` lie;
/// those few small members (of the claims only their codes) are then
/// parsed. Anything the pass does not accept goes through [`verify`], whose
/// verdict (and error list) this returns unchanged.
pub fn verify_summary(bytes: &[u8]) -> Result<VerifiedSummary, Rejection> {
    if let Some(summary) = verify_summary_fast(bytes) {
        return Ok(summary);
    }
    VerifiedSummary::of(verify(bytes)?)
}

/// [`verify_summary`]'s single pass alone: `Some` only where [`verify`] says
/// `Ok`, with what [`VerifiedSummary::of`] would read from its model; `None`
/// where [`verify`] must decide. Exposed for the equivalence tests.
#[doc(hidden)]
pub fn verify_summary_fast(bytes: &[u8]) -> Option<VerifiedSummary> {
    let (digest, picks) = crate::canonical_check::check_picks(bytes)?;
    // The pass checked each member against the model's rules already; a
    // member serde would still refuse (never expected) falls back to
    // `verify`, which then judges the whole envelope.
    let member = |(a, b): (usize, usize)| bytes.get(a..b);
    #[derive(serde::Deserialize)]
    struct CodeOnly {
        code: String,
    }
    let claims: Vec<CodeOnly> = serde_json::from_slice(member(picks.claims)?).ok()?;
    Some(VerifiedSummary {
        digest: VerifiedDigest(digest),
        clock: serde_json::from_slice(member(picks.clock)?).ok()?,
        subject: serde_json::from_slice(member(picks.subject)?).ok()?,
        completeness: picks.completeness,
        unknowns: serde_json::from_slice(member(picks.unknowns)?).ok()?,
        claim_codes: claims.into_iter().map(|c| c.code).collect(),
    })
}

/// [`verify_digest`]'s single pass alone: `Some` only for canonical bytes of
/// a valid envelope whose digest matches (where [`verify`] says `Ok` with
/// that digest), `None` where [`verify`] must decide. Exposed for the
/// equivalence tests.
#[doc(hidden)]
pub fn verify_digest_fast(bytes: &[u8]) -> Option<VerifiedDigest> {
    crate::canonical_check::check(bytes).map(VerifiedDigest)
}

/// Verify's fast path alone: `None` where the bytes are not the canonical
/// form of a well-formed envelope and the general path must decide. Exposed
/// for the equivalence tests.
#[doc(hidden)]
pub fn verify_canonical(bytes: &[u8]) -> Option<Result<Envelope, Rejection>> {
    let (envelope, computed) = crate::canonical_read::read_canonical(bytes)?;
    Some(judge(envelope, computed))
}

/// The rules and the digest comparison, shared by both paths.
fn judge(envelope: Envelope, computed: String) -> Result<Envelope, Rejection> {
    let mut errors = check_rules(&envelope);
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

/// Verify's general path alone (any rendering): typed parse, the strict
/// two-stage parse to name an error, rules, and the digest of the model's
/// canonical form. Exposed for the equivalence tests.
#[doc(hidden)]
pub fn verify_general(bytes: &[u8]) -> Result<Envelope, Rejection> {
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
    // The typed model is a lossless reading of the bytes (closed world, no
    // duplicate keys, no nulls outside facts, facts kept as parsed), so its
    // canonical form is the canonical form of the bytes.
    let computed = envelope.canonical_digest()?;
    judge(envelope, computed)
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
