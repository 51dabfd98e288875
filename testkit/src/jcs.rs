//! A second, independent RFC 8785 canonicalizer (`serde_json_canonicalizer`, written by
//! others) as the oracle for pstack's own: every envelope the suite seals or verifies goes
//! through [`verify`] or [`check_envelope`], which recompute the digest from the oracle's
//! canonical bytes and require it to equal the envelope's own digest. Equal SHA-256
//! digests mean byte-identical canonical forms. [`verify`] also requires the verdict of
//! `pstack_envelope::verify` (single-pass fast path for canonical bytes) to equal the
//! general path's on every input the suite feeds it, hostile or not.

use pstack_envelope::{Envelope, Rejection};
use serde_json::Value;
use sha2::{Digest, Sha256};

/// The oracle's canonical bytes of `value`.
pub fn jcs_oracle(value: &Value) -> Vec<u8> {
    serde_json_canonicalizer::to_vec(value).expect("the oracle canonicalizes any serde_json value")
}

/// `sha256:<hex>` of the oracle's canonical form of an envelope without its `digest`.
pub fn jcs_oracle_digest(envelope: &Value) -> String {
    let mut body = envelope.clone();
    if let Some(map) = body.as_object_mut() {
        map.remove("digest");
    }
    format!("sha256:{}", hex::encode(Sha256::digest(jcs_oracle(&body))))
}

fn assert_digest_agrees(value: &Value) {
    let ours = value.get("digest").and_then(Value::as_str).unwrap_or("");
    let theirs = jcs_oracle_digest(value);
    assert_eq!(
        ours, theirs,
        "pstack's RFC 8785 canonical form differs from serde_json_canonicalizer's for this envelope"
    );
}

/// `pstack_envelope::verify`, plus: its verdict is the general path's (so where
/// verify's single-pass fast path decided, it decided as the general path does),
/// `verify_digest` (no model) gives the same verdict and digest, and an envelope that verifies has the digest the independent canonicalizer
/// computes.
#[track_caller]
pub fn verify(bytes: &[u8]) -> Result<Envelope, Rejection> {
    let verdict = pstack_envelope::verify(bytes);
    let general = pstack_envelope::verify_general(bytes);
    assert_eq!(
        verdict,
        general,
        "verify (fast path: {}) and the general path disagree",
        pstack_envelope::verify_canonical(bytes).is_some()
    );
    // Without the model (issue 31): the same verdict, the same digest.
    assert_eq!(
        pstack_envelope::verify_digest(bytes).map(|d| d.to_string()),
        verdict
            .as_ref()
            .map(|e| e.digest.clone())
            .map_err(Clone::clone),
        "verify_digest (single pass: {}) and verify disagree",
        pstack_envelope::verify_digest_fast(bytes).is_some()
    );
    if verdict.is_ok() {
        match serde_json::from_slice::<Value>(bytes) {
            Ok(value) => assert_digest_agrees(&value),
            Err(e) => panic!("pstack verified bytes serde_json cannot parse: {e}"),
        }
    }
    verdict
}

/// A sealed envelope (e.g. from an in-process capture) has the oracle's digest.
#[track_caller]
pub fn check_envelope(env: &Envelope) {
    let value = serde_json::to_value(env).expect("an envelope serializes");
    assert_digest_agrees(&value);
}
