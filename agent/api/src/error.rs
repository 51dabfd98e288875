//! The error body of every non-2xx answer: `{"error": {code, message, field?}}`.

use serde::{Deserialize, Serialize};

/// `{"error": {...}}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// The error.
    pub error: ErrorDetail,
}

/// What went wrong.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorDetail {
    /// Stable machine-readable code (`busy`, `malformed_request`, …).
    pub code: String,
    /// For a person.
    pub message: String,
    /// The request field at fault, when one is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
}
