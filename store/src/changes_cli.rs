//! `pstack-store changes …`: record and list changes over HTTP, for CI/CD
//! pipelines (seed 000: `changes record --url --api-key --environment --kind
//! deploy --service --version --previous-version --commit-sha
//! --previous-commit-sha --summary --touched-paths`). A client of the store's
//! API: it never opens a database.

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use serde_json::{Value, json};

use crate::client::StoreClient;
use crate::query::Connection;

/// `changes` subcommands.
// Parsed once per process: the size difference between variants is moot.
#[allow(
    clippy::large_enum_variant,
    reason = "parsed once per command line; boxing buys nothing"
)]
#[derive(Subcommand, Debug)]
pub enum ChangesCommand {
    /// Record a change; prints its id.
    Record(RecordArgs),
    /// List recent changes as JSON.
    List(ListArgs),
}

/// `changes record`.
#[derive(Args, Debug)]
pub struct RecordArgs {
    #[command(flatten)]
    pub endpoint: Connection,
    /// Environment, e.g. prod.
    #[arg(long)]
    pub environment: String,
    /// deploy, rollback, feature_flag, config, agent_prompt; host changes:
    /// kernel, node_image, cni, storage, sysctl.
    #[arg(long)]
    pub kind: String,
    /// The changed service (`service.name`); required for service changes.
    #[arg(long)]
    pub service: Option<String>,
    /// New `service.version`.
    #[arg(long)]
    pub version: Option<String>,
    /// The version it replaces.
    #[arg(long)]
    pub previous_version: Option<String>,
    /// New commit.
    #[arg(long)]
    pub commit_sha: Option<String>,
    /// The commit it replaces.
    #[arg(long)]
    pub previous_commit_sha: Option<String>,
    /// The agent version running in the changed state (an `agent_prompt`
    /// change: the new one); a counterfactual's baseline must match it.
    #[arg(long)]
    pub candidate_agent_version: Option<String>,
    /// `obs.config.digest` of the new config.
    #[arg(long)]
    pub config_digest: Option<String>,
    /// One line for humans.
    #[arg(long)]
    pub summary: Option<String>,
    /// Paths the change touched, comma separated.
    #[arg(long, value_delimiter = ',')]
    pub touched_paths: Vec<String>,
    /// When (RFC 3339 UTC, e.g. 2026-12-03T10:00:00Z); default now.
    #[arg(long)]
    pub at: Option<String>,
    /// Host changes: a node it reached, as NAME or NAME=RFC3339 (repeatable or comma separated).
    #[arg(long = "node", value_delimiter = ',')]
    pub nodes: Vec<String>,
}

/// `changes list`.
#[derive(Args, Debug)]
pub struct ListArgs {
    #[command(flatten)]
    pub endpoint: Connection,
    /// Only this environment.
    #[arg(long)]
    pub environment: Option<String>,
    /// Only this service.
    #[arg(long)]
    pub service: Option<String>,
    /// Only changes at or after this time (RFC 3339 UTC).
    #[arg(long)]
    pub since: Option<String>,
}

/// The JSON body `changes record` sends.
pub fn record_body(a: &RecordArgs) -> Value {
    let mut body = json!({"environment": a.environment, "kind": a.kind});
    for (k, v) in [
        ("service", &a.service),
        ("version", &a.version),
        ("previousVersion", &a.previous_version),
        ("commitSha", &a.commit_sha),
        ("previousCommitSha", &a.previous_commit_sha),
        ("candidateAgentVersion", &a.candidate_agent_version),
        ("configDigest", &a.config_digest),
        ("summary", &a.summary),
        ("at", &a.at),
    ] {
        if let Some(v) = v {
            body[k] = json!(v);
        }
    }
    let paths: Vec<&str> = a
        .touched_paths
        .iter()
        .map(|p| p.trim())
        .filter(|p| !p.is_empty())
        .collect();
    if !paths.is_empty() {
        body["touchedPaths"] = json!(paths);
    }
    if !a.nodes.is_empty() {
        body["nodes"] = a
            .nodes
            .iter()
            .map(|n| match n.split_once('=') {
                Some((node, at)) => json!({"node": node, "at": at}),
                None => json!({"node": n}),
            })
            .collect();
    }
    body
}

fn client(c: &Connection) -> Result<StoreClient> {
    Ok(crate::query::client(c)?)
}

/// Run a `changes` subcommand; prints to stdout.
pub async fn run(cmd: &ChangesCommand) -> Result<()> {
    match cmd {
        ChangesCommand::Record(a) => {
            let body = client(&a.endpoint)?
                .post_json("/v1/changes", &record_body(a))
                .await
                .context("recording the change")?;
            println!("{}", body["id"].as_str().unwrap_or_default());
        }
        ChangesCommand::List(a) => {
            let mut q: Vec<(&str, String)> = Vec::new();
            for (k, v) in [
                ("environment", &a.environment),
                ("service", &a.service),
                ("since", &a.since),
            ] {
                if let Some(v) = v {
                    q.push((k, v.clone()));
                }
            }
            let body = client(&a.endpoint)?
                .get_json("/v1/changes", &q)
                .await
                .context("listing changes")?;
            println!("{}", serde_json::to_string_pretty(&body)?);
        }
    }
    Ok(())
}
