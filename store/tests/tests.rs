//! pstack-store integration tests: one binary, every test through real HTTP
//! against a real server, each run on SQLite and on PostgreSQL.

mod support;

mod accounts;
mod analysis;
mod cli;
mod gate;
mod hostile;
mod ingest;
mod lifecycle;
mod mcp;
mod queries;
mod query_cli;
mod receipts;
mod retention;
mod runs;
mod tls_proxy;
mod transfers;
mod ui;
