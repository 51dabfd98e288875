//! The pstack causal store: verified ingest, evidence queries, receipts.
