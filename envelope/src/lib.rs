//! `pstack-envelope`: the PStack evidence envelope (`pstack.envelope/v1`).
//!
//! Everything pstack observes is sealed into an envelope: an immutable subject
//! identity, the collector, the clock, the declared universe and its caps, the
//! typed surfaces read, claims kept apart by kind (fact, inference, hypothesis),
//! unknowns with their probes, one next transition, and a SHA-256 digest over
//! the RFC 8785 canonical form of all of it.
//!
//! Invariants this crate enforces, and on which every other part relies:
//! - **Pure.** No I/O, no clock, no threads: callers pass in everything.
//! - **Closed world.** Unknown members are rejected at every level; statuses,
//!   kinds and completeness are closed vocabularies.
//! - **Exact numbers.** Integers only, within ±(2^53-1); larger values travel as
//!   decimal strings. Floats are refused, never rounded.
//! - **One reading.** Duplicate object keys are refused at parse time, so two
//!   readers cannot disagree about what was sealed.
//! - **Sealed means valid.** [`Envelope::seal`] refuses an envelope that breaks
//!   a rule; [`verify`] re-checks every rule and the digest.

#![warn(missing_docs)]

mod builder;
mod canonical;
mod canonical_check;
mod canonical_cursor;
mod canonical_read;
mod canonical_write;
mod diff;
mod error;
pub mod example;
pub mod facts;
mod form;
mod handoff;
mod keyed;
mod model;
mod redact;
mod rules;
mod scan;
mod seal;
mod secrets;
mod strict;
mod surface;
pub mod vocab;
pub mod wall_time;

pub use builder::{BuildError, EnvelopeBuilder};
pub use canonical::{to_canonical, write_canonical};
pub use diff::{EnvelopeDiff, FactChange, StatusChange, diff};
pub use error::EnvelopeError;
pub use form::{DIGEST_PREFIX, is_sha256_digest};
pub use handoff::{Frontier, Handoff, LiveHypothesis, OpenUnknown, handoff};
pub use keyed::{BadDigestKey, DigestKey, HMAC_PREFIX, KEY_BYTES, is_hmac_digest};
pub use model::*;
pub use redact::{RedactedCommand, RedactedEnviron, redact_argv, redact_cmdline, redact_environ};
pub use rules::{check_rules, from_value};
pub use seal::{
    Rejection, VerifiedDigest, VerifiedSummary, canonical_without_digest, compute_digest, parse,
    sha256_digest, verify, verify_canonical, verify_digest, verify_digest_fast, verify_general,
    verify_summary, verify_summary_fast,
};
pub use secrets::{REDACTED, looks_secret, redact_text};
pub use strict::{MAX_DEPTH, MAX_SAFE_INTEGER, parse_strict};
pub use vocab::{ClaimCode, surface_id};

/// The JSON Schema of `pstack.envelope/v1`, published with the crate.
pub const JSON_SCHEMA: &str = include_str!("../schema/pstack.envelope.v1.schema.json");
