//! The one error type of the envelope crate: every way an envelope can be
//! malformed or invalid is its own variant, so callers (and tests) can match the
//! exact rule that fired. [`EnvelopeError::rule`] gives each a stable code for
//! machine output.

use serde::Serialize;
use thiserror::Error;

/// Every way bytes can fail to be a valid, sealed `pstack.envelope/v1`.
#[derive(Debug, Clone, PartialEq, Eq, Error, Serialize)]
#[serde(tag = "rule", rename_all = "snake_case")]
pub enum EnvelopeError {
    // --- parsing (strict JSON) ---
    /// The input is not UTF-8.
    #[error("input is not UTF-8 (first bad byte at offset {offset})")]
    NotUtf8 {
        /// Byte offset of the first invalid byte.
        offset: usize,
    },
    /// The input is not JSON at all.
    #[error("not valid JSON at line {line}, column {column}: {message}")]
    Json {
        /// 1-based line.
        line: usize,
        /// 1-based column.
        column: usize,
        /// The parser's message.
        message: String,
    },
    /// An object repeats a member name.
    #[error("duplicate key {key:?} in object at {path}")]
    DuplicateKey {
        /// JSON path where it broke (`$.a.b[0]`).
        path: String,
        /// The repeated member name.
        key: String,
    },
    /// A number with a fraction or exponent.
    #[error("float {value} at {path}: the envelope carries integers only")]
    Float {
        /// JSON path where it broke (`$.a.b[0]`).
        path: String,
        /// The offending value as written.
        value: String,
    },
    /// An integer outside ±(2^53-1); such values travel as decimal strings.
    #[error("integer {value} at {path} is outside ±(2^53-1); carry it as a decimal string")]
    NumberOutOfRange {
        /// JSON path where it broke (`$.a.b[0]`).
        path: String,
        /// The offending value as written.
        value: String,
    },
    /// Arrays/objects nested deeper than the limit.
    #[error("nesting deeper than {limit} levels")]
    TooDeep {
        /// The nesting limit.
        limit: usize,
    },

    // --- structure (closed world) ---
    /// `schema` is not `pstack.envelope/v1`.
    #[error("schema is {found:?}, expected \"pstack.envelope/v1\"")]
    WrongSchema {
        /// The schema id found.
        found: String,
    },
    /// A member the schema does not define.
    #[error("unknown field {field:?} at {path}")]
    UnknownField {
        /// JSON path where it broke (`$.a.b[0]`).
        path: String,
        /// The member name.
        field: String,
    },
    /// A required member is absent.
    #[error("missing field {field:?} at {path}")]
    MissingField {
        /// JSON path where it broke (`$.a.b[0]`).
        path: String,
        /// The member name.
        field: String,
    },
    /// A subject lacks (or has empty) an identity field its kind requires.
    #[error("subject of kind {kind} is missing identity field {field:?}")]
    MissingIdentityField {
        /// The subject kind.
        kind: String,
        /// The member name.
        field: String,
    },
    /// A surface status outside the closed vocabulary.
    #[error("unmapped surface status {value:?} at {path}")]
    UnmappedStatus {
        /// JSON path where it broke (`$.a.b[0]`).
        path: String,
        /// The offending value as written.
        value: String,
    },
    /// A member has the wrong type or format.
    #[error("invalid value at {path}: {reason}")]
    InvalidField {
        /// JSON path where it broke (`$.a.b[0]`).
        path: String,
        /// What is wrong with it.
        reason: String,
    },
    /// Two surfaces, claims or unknowns share an id.
    #[error("duplicate {what} id {id:?}")]
    DuplicateId {
        /// `surface`, `claim` or `unknown`.
        what: String,
        /// The repeated id.
        id: String,
    },

    // --- seal ---
    /// The declared digest does not match the canonical form.
    #[error("bad digest: declared {declared}, canonical form hashes to {computed}")]
    BadDigest {
        /// Digest the envelope declares.
        declared: String,
        /// Digest of its canonical form.
        computed: String,
    },

    // --- semantic rules ---
    /// A `complete` envelope holds a surface whose status is not `ok`.
    #[error("envelope is complete but surface {surface:?} has status {status}")]
    CompleteWithNonOkSurface {
        /// Surface id.
        surface: String,
        /// That surface's status.
        status: String,
    },
    /// A `complete` envelope holds a truncated surface.
    #[error("envelope is complete but surface {surface:?} is truncated")]
    CompleteWithTruncatedSurface {
        /// Surface id.
        surface: String,
    },
    /// A `complete` envelope whose universe was not exhausted.
    #[error("envelope is complete but its universe ended by {termination}, not exhausted")]
    CompleteWithNonExhaustedUniverse {
        /// How the universe ended.
        termination: String,
    },
    /// A fact claim that cites no surface.
    #[error("fact {claim:?} is bound to no surface")]
    FactUnbound {
        /// Claim id.
        claim: String,
    },
    /// A fact claim citing a surface that did not succeed.
    #[error("fact {claim:?} is bound to surface {surface:?} whose status is {status}")]
    FactBoundToNonOkSurface {
        /// Claim id.
        claim: String,
        /// Surface id.
        surface: String,
        /// That surface's status.
        status: String,
    },
    /// A claim citing a surface id the envelope does not have.
    #[error("claim {claim:?} cites surface {surface:?}, which is not in the envelope")]
    ClaimCitesMissingSurface {
        /// Claim id.
        claim: String,
        /// Surface id.
        surface: String,
    },
    /// A universal claim in an envelope that is not `complete`.
    #[error(
        "universal claim {claim:?} in a {completeness} envelope; only complete envelopes support universal claims"
    )]
    UniversalClaimOutsideComplete {
        /// Claim id.
        claim: String,
        /// The envelope's completeness.
        completeness: String,
    },
    /// A hypothesis that names nothing that would falsify it.
    #[error("hypothesis {claim:?} has no falsifier")]
    HypothesisWithoutFalsifier {
        /// Claim id.
        claim: String,
    },
    /// An unknown without a discriminating probe.
    #[error("unknown {unknown:?} has no probe")]
    UnknownWithoutProbe {
        /// Unknown id.
        unknown: String,
    },
    /// An unknown whose owner, question or blocked transition is empty: no
    /// one could act on it (the builder refuses the same).
    #[error("unknown {unknown:?} has an empty {field}")]
    UnknownIncomplete {
        /// Unknown id.
        unknown: String,
        /// `owner`, `question` or `blocks`.
        field: String,
    },
    /// An unknown raised by a surface the envelope does not have.
    #[error("unknown {unknown:?} names surface {surface:?}, which is not in the envelope")]
    UnknownCitesMissingSurface {
        /// Unknown id.
        unknown: String,
        /// The surface id it names.
        surface: String,
    },
    /// An inference or hypothesis that binds no surface.
    #[error("{kind} {claim:?} binds no surface")]
    ClaimUnbound {
        /// Claim id.
        claim: String,
        /// `inference` or `hypothesis`.
        kind: String,
    },
    /// A fact or inference that carries a falsifier (only a hypothesis does).
    #[error("{kind} {claim:?} carries a falsifier; only a hypothesis does")]
    FalsifierOutsideHypothesis {
        /// Claim id.
        claim: String,
        /// `fact` or `inference`.
        kind: String,
    },
    /// An inference bound to a surface that was not read.
    #[error("inference {claim:?} binds {surface:?}, which was not read (status {status})")]
    InferenceBoundToUnreadSurface {
        /// Claim id.
        claim: String,
        /// Surface id.
        surface: String,
        /// Its status.
        status: String,
    },
    /// A next transition that names no success receipt.
    #[error("the next transition names no success receipt")]
    NextWithoutReceipt,
    /// A next transition with no (non-empty) abort condition.
    #[error("the next transition names no abort condition")]
    NextWithoutAbort,
    /// An `identity_race` envelope that still attributes facts to the subject.
    #[error(
        "identity_race envelope attributes claim {claim:?} to a subject whose identity changed"
    )]
    AttributionInIdentityRace {
        /// Claim id.
        claim: String,
    },
    /// A surface with status `error` that names no cause.
    #[error("surface {surface:?} has status error but no cause")]
    ErrorWithoutCause {
        /// Surface id.
        surface: String,
    },

    // --- diff ---
    /// Diff of two envelopes about different subjects.
    #[error("cannot diff envelopes of different subjects: {before} vs {after}")]
    SubjectMismatch {
        /// The earlier subject.
        before: String,
        /// The later subject.
        after: String,
    },
}

impl EnvelopeError {
    /// Stable snake_case code of the rule that fired.
    pub fn rule(&self) -> &'static str {
        use EnvelopeError::*;
        match self {
            NotUtf8 { .. } => "not_utf8",
            Json { .. } => "json",
            DuplicateKey { .. } => "duplicate_key",
            Float { .. } => "float",
            NumberOutOfRange { .. } => "number_out_of_range",
            TooDeep { .. } => "too_deep",
            WrongSchema { .. } => "wrong_schema",
            UnknownField { .. } => "unknown_field",
            MissingField { .. } => "missing_field",
            MissingIdentityField { .. } => "missing_identity_field",
            UnmappedStatus { .. } => "unmapped_status",
            InvalidField { .. } => "invalid_field",
            DuplicateId { .. } => "duplicate_id",
            BadDigest { .. } => "bad_digest",
            CompleteWithNonOkSurface { .. } => "complete_with_non_ok_surface",
            CompleteWithTruncatedSurface { .. } => "complete_with_truncated_surface",
            CompleteWithNonExhaustedUniverse { .. } => "complete_with_non_exhausted_universe",
            FactUnbound { .. } => "fact_unbound",
            FactBoundToNonOkSurface { .. } => "fact_bound_to_non_ok_surface",
            ClaimCitesMissingSurface { .. } => "claim_cites_missing_surface",
            UniversalClaimOutsideComplete { .. } => "universal_claim_outside_complete",
            HypothesisWithoutFalsifier { .. } => "hypothesis_without_falsifier",
            UnknownWithoutProbe { .. } => "unknown_without_probe",
            UnknownIncomplete { .. } => "unknown_incomplete",
            UnknownCitesMissingSurface { .. } => "unknown_cites_missing_surface",
            ClaimUnbound { .. } => "claim_unbound",
            FalsifierOutsideHypothesis { .. } => "falsifier_outside_hypothesis",
            InferenceBoundToUnreadSurface { .. } => "inference_bound_to_unread_surface",
            NextWithoutReceipt => "next_without_receipt",
            NextWithoutAbort => "next_without_abort",
            AttributionInIdentityRace { .. } => "attribution_in_identity_race",
            ErrorWithoutCause { .. } => "error_without_cause",
            SubjectMismatch { .. } => "subject_mismatch",
        }
    }

    /// Every rule code the validator can report for an envelope (everything
    /// but `subject_mismatch`, which only diff raises). Tests use this to prove
    /// each rule has a fixture.
    pub const VALIDATION_RULES: &'static [&'static str] = &[
        "not_utf8",
        "json",
        "duplicate_key",
        "float",
        "number_out_of_range",
        "too_deep",
        "wrong_schema",
        "unknown_field",
        "missing_field",
        "missing_identity_field",
        "unmapped_status",
        "invalid_field",
        "duplicate_id",
        "bad_digest",
        "complete_with_non_ok_surface",
        "complete_with_truncated_surface",
        "complete_with_non_exhausted_universe",
        "fact_unbound",
        "fact_bound_to_non_ok_surface",
        "claim_cites_missing_surface",
        "universal_claim_outside_complete",
        "hypothesis_without_falsifier",
        "unknown_without_probe",
        "unknown_incomplete",
        "unknown_cites_missing_surface",
        "claim_unbound",
        "falsifier_outside_hypothesis",
        "inference_bound_to_unread_surface",
        "next_without_receipt",
        "next_without_abort",
        "attribution_in_identity_race",
        "error_without_cause",
    ];

    pub(crate) fn prefix_path(&mut self, step: &str) {
        use EnvelopeError::*;
        match self {
            DuplicateKey { path, .. } | Float { path, .. } | NumberOutOfRange { path, .. } => {
                path.insert_str(0, step);
            }
            _ => {}
        }
    }
}
