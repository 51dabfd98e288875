//! The pstack causal store: verified ingest, evidence queries, receipts.
pub mod db;
pub mod http;
pub mod ident;
pub mod ingest;
pub mod keys;
pub mod receipts;
pub mod synthetic;

/// Wall-clock now, ns since the Unix epoch.
pub fn now_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}
