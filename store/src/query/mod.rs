//! The query CLI: `pstack-store envelopes get|list`, `subjects history`,
//! `unknowns`, `receipts`, `transfer show|of-envelope` ([`crate::query::transfers`]) — what an operator asks the store from a shell,
//! over its HTTP API ([`crate::client`]), never by opening its database.
//!
//! Text output is a table cut to the terminal (full values with `--json`,
//! which prints the store's own JSON); `envelopes get` prints the stored
//! bytes exactly. Exit codes: 0 ok, 1 the store refused or could not be
//! reached, 2 a query the store calls malformed, 3 not found.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::Value;

pub mod output;
pub mod transfers;

pub use output::{QueryError, exit_code};
use output::{print_table, text};

use crate::client::{ClientConfig, ClientError, StoreClient};

/// Where the store is and how to authenticate (flags of every query command).
#[derive(Debug, Clone, clap::Args)]
pub struct Connection {
    /// The store's base URL (`https://` through a TLS proxy; see docs/store-tls.md).
    #[arg(
        long,
        env = "PSTACK_STORE_URL",
        default_value = "http://127.0.0.1:7470",
        global = true
    )]
    pub url: String,
    /// API key (`psk_...`). Prefer PSTACK_STORE_API_KEY or --api-key-file: a flag shows in `ps`.
    #[arg(
        long,
        env = "PSTACK_STORE_API_KEY",
        hide_env_values = true,
        global = true
    )]
    pub api_key: Option<String>,
    /// Read the API key from this file (first line).
    #[arg(long, value_name = "FILE", conflicts_with = "api_key", global = true)]
    pub api_key_file: Option<PathBuf>,
    /// Trust this CA (PEM) for an https:// URL, besides the public roots.
    #[arg(long, value_name = "PEM", env = "PSTACK_STORE_CA_CERT", global = true)]
    pub ca_cert: Option<PathBuf>,
    /// Give up on a request after this long (`10s`).
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = duration_arg, global = true)]
    pub timeout: Duration,
    /// Print the store's JSON instead of a table.
    #[arg(long, global = true)]
    pub json: bool,
}

fn duration_arg(s: &str) -> Result<Duration, String> {
    pstack_cli::parse_duration(s).map_err(|e| e.to_string())
}

/// `pstack-store envelopes ...`.
#[derive(Debug, clap::Subcommand)]
pub enum EnvelopesCommand {
    /// Print a stored envelope exactly as it was shipped (`--handoff`: its compact handoff).
    Get {
        /// `sha256:<64 hex>`.
        digest: String,
        /// Print the handoff (subject, completeness, first missing edge, unknowns, next step).
        #[arg(long)]
        handoff: bool,
    },
    /// Print the digests of a subject's envelopes, newest first, one per line.
    List(SubjectSelector),
}

/// `pstack-store subjects ...`.
#[derive(Debug, clap::Subcommand)]
pub enum SubjectsCommand {
    /// A subject's envelopes, newest first: time, completeness, size, digest.
    History(SubjectSelector),
}

/// Which subject: its key, or its kind and identity fields.
#[derive(Debug, Clone, clap::Args)]
#[command(group(clap::ArgGroup::new("which").required(true).args(["subject", "kind"])))]
pub struct SubjectSelector {
    /// The subject key (`sha256:...`, as the store reports it).
    #[arg(long, value_name = "KEY")]
    pub subject: Option<String>,
    /// The subject kind: process, thread, host, network_stream, storage_transfer.
    #[arg(long, value_name = "KIND")]
    pub kind: Option<String>,
    /// An identity field, repeatable: `--id host=node-a --id pid=1234`.
    #[arg(long = "id", value_name = "FIELD=VALUE", value_parser = field_arg, requires = "kind")]
    pub ids: Vec<(String, String)>,
    /// Most envelopes per page (1..=1000).
    #[arg(long, default_value_t = 50)]
    pub limit: u32,
    /// Continue after this cursor (printed as `next:` by the previous page).
    #[arg(long, value_name = "CURSOR")]
    pub before: Option<String>,
}

fn field_arg(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .filter(|(k, _)| !k.is_empty())
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .ok_or_else(|| format!("{s:?} is not FIELD=VALUE"))
}

/// `pstack-store unknowns`.
#[derive(Debug, Clone, clap::Args)]
pub struct UnknownsArgs {
    /// Include answered unknowns (not carried by their subject's newest envelope).
    #[arg(long)]
    pub all: bool,
    /// Only this owner's.
    #[arg(long)]
    pub owner: Option<String>,
    /// Most rows (1..=1000).
    #[arg(long, default_value_t = 100)]
    pub limit: u32,
    /// Skip this many rows.
    #[arg(long, default_value_t = 0)]
    pub offset: u64,
}

/// `pstack-store receipts`.
#[derive(Debug, Clone, clap::Args)]
pub struct ReceiptsArgs {
    /// The subject key.
    #[arg(long, value_name = "KEY")]
    pub subject: String,
}

/// One query.
#[derive(Debug)]
pub enum Query {
    /// `envelopes ...`.
    Envelopes(EnvelopesCommand),
    /// `subjects ...`.
    Subjects(SubjectsCommand),
    /// `unknowns`.
    Unknowns(UnknownsArgs),
    /// `receipts`.
    Receipts(ReceiptsArgs),
    /// `transfer ...`.
    Transfer(crate::query::transfers::TransferCommand),
}

pub(crate) fn client(c: &Connection) -> Result<StoreClient, QueryError> {
    let api_key = match (&c.api_key, &c.api_key_file) {
        (Some(k), _) => Some(k.trim().to_string()),
        (None, Some(path)) => {
            let text = std::fs::read_to_string(path).map_err(|source| QueryError::KeyFile {
                path: path.display().to_string(),
                source,
            })?;
            Some(text.lines().next().unwrap_or("").trim().to_string())
        }
        (None, None) => None,
    };
    let ca_cert_pem = match &c.ca_cert {
        Some(path) => Some((
            path.display().to_string(),
            std::fs::read(path).map_err(|e| ClientError::CaCert {
                path: path.display().to_string(),
                message: e.to_string(),
            })?,
        )),
        None => None,
    };
    Ok(StoreClient::new(&ClientConfig {
        url: c.url.clone(),
        api_key,
        ca_cert_pem,
        timeout: c.timeout,
    })?)
}

fn selector(s: &SubjectSelector) -> Vec<(String, String)> {
    match (&s.subject, &s.kind) {
        (Some(key), _) => vec![("subject".into(), key.clone())],
        (None, Some(kind)) => {
            let mut v = vec![("kind".to_string(), kind.clone())];
            v.extend(s.ids.iter().cloned());
            v
        }
        (None, None) => Vec::new(),
    }
}

/// `kind k=v k=v` of a flattened identity.
fn identity_line(kind: &Value, identity: &Value) -> String {
    let mut parts = vec![text(kind)];
    if let Some(map) = identity.as_object() {
        for key in ["host", "pid", "tid", "dst", "volume", "replica"] {
            if let Some(v) = map.get(key) {
                parts.push(format!("{key}={}", text(v)));
            }
        }
    }
    parts.join(" ")
}

/// Run one query; `Ok(())` printed its answer.
pub async fn run(conn: &Connection, query: Query) -> Result<(), QueryError> {
    let c = client(conn)?;
    let print_json = |v: &Value| -> Result<(), QueryError> {
        let mut bytes =
            serde_json::to_vec_pretty(v).map_err(|e| ClientError::Decode(e.to_string()))?;
        bytes.push(b'\n');
        pstack_cli::output::out_bytes(&bytes)?;
        Ok(())
    };
    match query {
        Query::Envelopes(EnvelopesCommand::Get { digest, handoff }) => {
            if handoff {
                // Verified here, not trusted: the handoff is computed from the bytes.
                let bytes = c.envelope(&digest).await?;
                let env = pstack_envelope::verify(&bytes).map_err(|r| {
                    ClientError::Decode(format!("the stored envelope does not verify: {r}"))
                })?;
                let h = pstack_envelope::handoff(&env);
                if conn.json {
                    return print_json(
                        &serde_json::to_value(&h)
                            .map_err(|e| ClientError::Decode(e.to_string()))?,
                    );
                }
                pstack_cli::output::out_bytes(h.render().as_bytes())?;
            } else {
                let mut bytes = c.envelope(&digest).await?;
                if bytes.last() != Some(&b'\n') {
                    bytes.push(b'\n');
                }
                pstack_cli::output::out_bytes(&bytes)?;
            }
        }
        Query::Envelopes(EnvelopesCommand::List(s)) => {
            let page = c
                .history(&selector(&s), s.limit, s.before.as_deref())
                .await?;
            if conn.json {
                return print_json(&page);
            }
            for item in page["items"].as_array().into_iter().flatten() {
                pstack_cli::outln!("{}", text(&item["digest"]))?;
            }
            if let Some(next) = page["next"].as_str() {
                eprintln!("more: --before {next}");
            }
        }
        Query::Subjects(SubjectsCommand::History(s)) => {
            let page = c
                .history(&selector(&s), s.limit, s.before.as_deref())
                .await?;
            if conn.json {
                return print_json(&page);
            }
            let items = page["items"].as_array().cloned().unwrap_or_default();
            if let Some(first) = items.first() {
                pstack_cli::outln!(
                    "subject {}  ({})",
                    text(&first["subject_key"]),
                    identity_line(&first["kind"], &first["identity"])
                )?;
            }
            let rows: Vec<Vec<String>> = items
                .iter()
                .map(|i| {
                    vec![
                        text(&i["wall_time"]),
                        text(&i["completeness"]),
                        text(&i["size"]),
                        text(&i["digest"]),
                    ]
                })
                .collect();
            print_table(
                &["CAPTURED", "COMPLETENESS", "BYTES", "DIGEST"],
                &[24, 14, 8],
                &rows,
            )?;
            if rows.is_empty() {
                pstack_cli::outln!("(no envelope of this subject in the store)")?;
            }
            if let Some(next) = page["next"].as_str() {
                pstack_cli::outln!("next: --before {next}")?;
            }
        }
        Query::Unknowns(a) => {
            let page = c
                .unknowns(!a.all, a.owner.as_deref(), a.limit, a.offset)
                .await?;
            if conn.json {
                return print_json(&page);
            }
            let rows: Vec<Vec<String>> = page["items"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|u| {
                    vec![
                        if u["open"] == Value::Bool(true) {
                            "open"
                        } else {
                            "answered"
                        }
                        .to_string(),
                        text(&u["owner"]),
                        identity_line(&u["kind"], &u["identity"]),
                        format!("{}  probe: {}", text(&u["question"]), text(&u["probe"])),
                    ]
                })
                .collect();
            print_table(
                &["STATE", "OWNER", "SUBJECT", "QUESTION / PROBE"],
                &[8, 16, 32],
                &rows,
            )?;
        }
        Query::Transfer(cmd) => crate::query::transfers::run(&c, conn.json, cmd).await?,
        Query::Receipts(a) => {
            let page = c.receipts(&a.subject).await?;
            if conn.json {
                return print_json(&page);
            }
            let rows: Vec<Vec<String>> = page["items"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|r| {
                    vec![
                        text(&r["id"]),
                        text(&r["kind"]),
                        text(&r["change"]),
                        text(&r["revision"]),
                        r["evidence"]
                            .as_array()
                            .map(|e| e.iter().map(text).collect::<Vec<_>>().join(", "))
                            .unwrap_or_default(),
                    ]
                })
                .collect();
            print_table(
                &["ID", "KIND", "CHANGE", "REVISION", "EVIDENCE"],
                &[6, 10, 20, 12],
                &rows,
            )?;
        }
    }
    Ok(())
}
