//! Storage of the analysis half, one concern a file: `ledger` (the
//! change ledger), `otlp_write` and `otlp_read` (OTLP aggregates:
//! requests, calls, cohorts), `fleet` (the envelope reads the fleet
//! verdicts need), `eval_runs` and `findings`. Each opens with its
//! invariants; the types are re-exported here, where their callers name
//! them.
//!
//! Invariant shared by all: ids are a prefix (`chg_`, `fnd_`, `evr_`) + 16
//! random hex digits ([`new_id`]); JSON columns are stored as text and a
//! text that does not parse reads as `null` or empty, never an error.

use serde_json::Value;
use sqlx::Row;

use super::StoreError;

mod eval_runs;
mod findings;
mod fleet;
mod ledger;
mod otlp_read;
mod otlp_write;

pub use findings::FindingRow;
pub use otlp_read::{CallTotals, CohortFilter, RequestTotals, VersionFilter};

/// A fresh id with `prefix`.
pub fn new_id(prefix: &str) -> Result<String, StoreError> {
    let mut b = [0u8; 8];
    getrandom::fill(&mut b)
        .map_err(|e| StoreError::Key(crate::keys::KeyError::Random(e.to_string())))?;
    Ok(format!("{prefix}_{}", hex::encode(b)))
}

fn json_text(v: &Value) -> String {
    v.to_string()
}

fn parse_json(s: &str) -> Value {
    serde_json::from_str(s).unwrap_or(Value::Null)
}

/// A JSON text column decoded; text that does not parse reads as the
/// default (empty list / map).
fn json_column<'r, R, T>(row: &'r R, name: &'r str) -> Result<T, sqlx::Error>
where
    R: Row,
    &'r str: sqlx::ColumnIndex<R>,
    String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    T: serde::de::DeserializeOwned + Default,
{
    Ok(serde_json::from_str(&row.try_get::<String, _>(name)?).unwrap_or_default())
}
