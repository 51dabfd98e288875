//! The form checks shared by the validator (`rules`) and the sealer
//! (`seal`): the digest's written form and the schema id. Both import this
//! module and neither imports the other's internals for it, so `rules` does
//! not depend on `seal` (which calls `rules::check_rules`).

use serde_json::Value;

use crate::error::EnvelopeError;
use crate::model::SCHEMA_ID;

/// Prefix of every digest this crate writes.
pub const DIGEST_PREFIX: &str = "sha256:";

/// Whether `s` has the form `sha256:` + 64 lowercase hex digits.
pub fn is_sha256_digest(s: &str) -> bool {
    s.strip_prefix(DIGEST_PREFIX).is_some_and(|h| {
        h.len() == 64
            && h.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

/// Schema id check used by `seal::parse` and the rules.
pub(crate) fn check_schema(value: &Value) -> Result<(), EnvelopeError> {
    match value.get("schema") {
        Some(Value::String(s)) if s == SCHEMA_ID => Ok(()),
        Some(Value::String(s)) => Err(EnvelopeError::WrongSchema { found: s.clone() }),
        Some(other) => Err(EnvelopeError::WrongSchema {
            found: other.to_string(),
        }),
        None => Err(EnvelopeError::MissingField {
            path: "$".into(),
            field: "schema".into(),
        }),
    }
}
