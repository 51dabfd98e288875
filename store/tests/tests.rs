//! pstack-store integration tests: one binary, every test through real HTTP
//! against a real server, each run on SQLite and on PostgreSQL.

mod support;

mod accounts;
mod analysis;
mod cli;
mod forged_grant;
mod gate;
mod hostile;
mod ingest;
mod lifecycle;
mod logs;
mod mcp;
mod otlp_limits;
mod queries;
mod query_cli;
mod receipts;
mod replicas;
mod retention;
mod runs;
mod scopes;
mod tls_proxy;
mod transfers;
mod ui;
