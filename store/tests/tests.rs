//! pstack-store integration tests: one binary, every test through real HTTP
//! against a real server, each run on SQLite and on PostgreSQL.

mod support;

mod cli;
mod ingest;
mod lifecycle;
mod queries;
mod receipts;
mod retention;
