//! `pstack-store`: serve the causal store, manage API keys, run retention.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
use pstack_store::db::{OpenOptions, RetentionPolicy, Store};
use pstack_store::http::{AppState, serve};
use pstack_store::ingest::IngestLimits;

#[derive(Parser, Debug)]
#[command(name = "pstack-store", version, about = "The pstack causal store")]
struct Cli {
    /// Database: a SQLite file path (created if missing) or a postgres:// URL.
    #[arg(
        long,
        env = "PSTACK_STORE_DB",
        default_value = "pstack-store.db",
        global = true
    )]
    db: String,
    /// Log format.
    #[arg(long, value_parser = ["text", "json"], default_value = "text", global = true)]
    log_format: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Serve the HTTP API until SIGTERM/SIGINT, then drain and exit.
    Serve {
        /// SQLite only: fsync every commit so an acknowledged batch survives
        /// power loss (slower ingest). Off: a power loss may roll back the
        /// last ~200 ms of acknowledged batches.
        #[arg(long)]
        durable: bool,
        /// Address to listen on.
        #[arg(long, env = "PSTACK_STORE_LISTEN", default_value = "127.0.0.1:7470")]
        listen: SocketAddr,
        /// Largest request body on the wire, bytes (memory per request vs batch size).
        #[arg(long, default_value_t = 16 << 20)]
        max_body_bytes: usize,
        /// Largest body after gzip decoding, bytes.
        #[arg(long, default_value_t = 64 << 20)]
        max_decoded_bytes: usize,
        /// Most envelopes per request.
        #[arg(long, default_value_t = 5000)]
        max_items: usize,
        /// Delete envelopes received longer ago than this (e.g. 30d, 12h); off by default.
        #[arg(long, value_parser = parse_duration)]
        retention_max_age: Option<Duration>,
        /// Delete the oldest envelopes while stored bytes exceed this (e.g. 50G); off by default.
        #[arg(long, value_parser = parse_bytes)]
        retention_max_bytes: Option<u64>,
        /// How often retention runs.
        #[arg(long, value_parser = parse_duration, default_value = "10m")]
        retention_interval: Duration,
    },
    /// Manage API keys.
    Keys {
        #[command(subcommand)]
        command: KeysCommand,
    },
    /// Run one retention pass and print what it did.
    Retention {
        /// Delete envelopes received longer ago than this.
        #[arg(long, value_parser = parse_duration)]
        max_age: Option<Duration>,
        /// Delete the oldest envelopes while stored bytes exceed this.
        #[arg(long, value_parser = parse_bytes)]
        max_bytes: Option<u64>,
    },
    /// Apply pending migrations and print the schema version.
    Migrate,
}

#[derive(Subcommand, Debug)]
enum KeysCommand {
    /// Create a key and print it once (it is stored only hashed).
    Create {
        /// Who holds it, e.g. the node name.
        #[arg(long)]
        name: String,
    },
    /// List keys (ids, names, dates; never secrets).
    List {
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
    /// Revoke a key by id; effective on its next request.
    Revoke {
        /// Key id (the 16 hex digits after psk_).
        id: String,
    },
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    let (num, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{s:?}: expected e.g. 30d, 12h, 10m, 45s"))?;
    let secs = match unit {
        "s" | "" => n,
        "m" => n * 60,
        "h" => n * 3600,
        "d" => n * 86_400,
        _ => return Err(format!("{s:?}: unit must be s, m, h or d")),
    };
    Ok(Duration::from_secs(secs))
}

fn parse_bytes(s: &str) -> Result<u64, String> {
    let (num, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{s:?}: expected e.g. 500M, 50G"))?;
    let mult: u64 = match unit {
        "" | "B" => 1,
        "K" | "KiB" => 1 << 10,
        "M" | "MiB" => 1 << 20,
        "G" | "GiB" => 1 << 30,
        "T" | "TiB" => 1 << 40,
        _ => return Err(format!("{s:?}: unit must be K, M, G or T")),
    };
    n.checked_mul(mult)
        .ok_or_else(|| format!("{s:?} overflows"))
}

fn init_logs(format: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("PSTACK_STORE_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,sqlx=warn"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if format == "json" {
        builder.json().init();
    } else {
        builder.init();
    }
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(error = %e, "cannot install SIGTERM handler; only SIGINT stops the server");
            let _ = ctrl_c.await;
            return;
        }
    };
    tokio::select! {
        _ = ctrl_c => {},
        _ = term.recv() => {},
    }
    tracing::info!("shutdown requested; draining in-flight requests");
}

#[tokio::main]
async fn main() -> Result<()> {
    let cli = Cli::parse();
    init_logs(&cli.log_format);
    let durable = matches!(cli.command, Command::Serve { durable: true, .. });
    let opts = OpenOptions {
        sqlite_durable: durable,
        ..OpenOptions::default()
    };
    let store = Store::open(&cli.db, &opts)
        .await
        .with_context(|| "opening the database (check --db / PSTACK_STORE_DB)".to_string())?;
    match cli.command {
        Command::Migrate => {
            println!("schema version {}", store.schema_version().await?);
        }
        Command::Keys { command } => match command {
            KeysCommand::Create { name } => {
                if name.trim().is_empty() {
                    bail!("--name must not be empty");
                }
                let key = store.create_key(&name).await?;
                eprintln!(
                    "created key {} for {name:?}; it is shown once, store it now:",
                    key.id
                );
                println!("{}", key.plaintext);
            }
            KeysCommand::List { json } => {
                let keys = store.list_keys().await?;
                if json {
                    println!("{}", serde_json::to_string_pretty(&keys)?);
                } else {
                    println!("{:<18} {:<25} {:<25} NAME", "ID", "CREATED", "REVOKED");
                    for k in keys {
                        println!(
                            "{:<18} {:<25} {:<25} {}",
                            k.id,
                            k.created_at,
                            k.revoked_at.as_deref().unwrap_or("-"),
                            k.name
                        );
                    }
                }
            }
            KeysCommand::Revoke { id } => {
                store.revoke_key(&id).await?;
                println!("revoked {id}");
            }
        },
        Command::Retention { max_age, max_bytes } => {
            if max_age.is_none() && max_bytes.is_none() {
                bail!("give --max-age and/or --max-bytes");
            }
            let report = store
                .apply_retention(
                    &RetentionPolicy { max_age, max_bytes },
                    pstack_store::now_ns(),
                )
                .await?;
            println!("{}", serde_json::to_string_pretty(&report)?);
        }
        Command::Serve {
            durable: _,
            listen,
            max_body_bytes,
            max_decoded_bytes,
            max_items,
            retention_max_age,
            retention_max_bytes,
            retention_interval,
        } => {
            let limits = IngestLimits {
                max_body_bytes,
                max_decoded_bytes,
                max_items,
                ..IngestLimits::default()
            };
            let state = AppState::new(store.clone(), limits);
            let listener = tokio::net::TcpListener::bind(listen)
                .await
                .with_context(|| format!("binding {listen}"))?;
            tracing::info!(addr = %listener.local_addr()?, backend = ?store.backend(), "serving");
            let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
            let retention = if retention_max_age.is_some() || retention_max_bytes.is_some() {
                let policy = RetentionPolicy {
                    max_age: retention_max_age,
                    max_bytes: retention_max_bytes,
                };
                let store = store.clone();
                let metrics = state.metrics.clone();
                let mut stop = stop_rx.clone();
                Some(tokio::spawn(async move {
                    let mut tick = tokio::time::interval(retention_interval);
                    loop {
                        tokio::select! {
                            _ = tick.tick() => {
                                match store.apply_retention(&policy, pstack_store::now_ns()).await {
                                    Ok(r) => metrics.add_retention_deleted(r.deleted),
                                    Err(e) => tracing::error!(error = %e, "retention pass failed"),
                                }
                            }
                            _ = stop.changed() => break,
                        }
                    }
                }))
            } else {
                None
            };
            serve(listener, state, shutdown_signal()).await?;
            let _ = stop_tx.send(true);
            if let Some(r) = retention {
                let _ = r.await;
            }
            store.close().await;
            tracing::info!("stopped");
        }
    }
    Ok(())
}
