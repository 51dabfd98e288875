//! `pstack-store transfer show ID` and `transfer of-envelope DIGEST`: both
//! ends of a joined transfer, over the store's HTTP API.
//!
//! Invariants: the table is rendered from the store's JSON only (nothing is
//! recomputed here, so the CLI and `GET /v1/transfers/{id}` cannot
//! disagree); `--json` prints that JSON unchanged; a missing value is `-`,
//! never a zero.

use serde_json::Value;

use crate::client::{ClientError, StoreClient};
use crate::query::output::{QueryError, print_table, text};

/// `pstack-store transfer ...`.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum TransferCommand {
    /// Both ends of a transfer side by side: nodes, netns, endpoints,
    /// counters, and who sent the RST / whose window was zero.
    Show {
        /// `trf_` + 16 hex digits.
        id: String,
    },
    /// The transfer an envelope is an end of (same view).
    OfEnvelope {
        /// `sha256:<64 hex>`.
        digest: String,
    },
}

/// Run one transfer query.
pub async fn run(c: &StoreClient, json: bool, cmd: TransferCommand) -> Result<(), QueryError> {
    let (answer, view) = match &cmd {
        TransferCommand::Show { id } => {
            let v = c.get_json(&format!("/v1/transfers/{id}"), &[]).await?;
            (v.clone(), v)
        }
        TransferCommand::OfEnvelope { digest } => {
            let v = c
                .get_json(&format!("/v1/envelopes/{digest}/transfer"), &[])
                .await?;
            let t = v["transfer"].clone();
            (v, t)
        }
    };
    if json {
        let mut bytes =
            serde_json::to_vec_pretty(&answer).map_err(|e| ClientError::Decode(e.to_string()))?;
        bytes.push(b'\n');
        pstack_cli::output::out_bytes(&bytes)?;
        return Ok(());
    }
    if let TransferCommand::OfEnvelope { digest } = &cmd
        && let Some(ids) = answer["transfer_ids"].as_array()
        && ids.len() > 1
    {
        pstack_cli::outln!(
            "envelope {digest} is an end of {} transfers: {} (the first is shown)",
            ids.len(),
            ids.iter().map(text).collect::<Vec<_>>().join(", ")
        )?;
    }
    render(&view)?;
    Ok(())
}

fn verdict_line(v: &Value) -> String {
    let side = text(&v["side"]);
    let because: Vec<String> = v["because"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|b| {
            format!(
                "{} states {} in {}",
                text(&b["stated_by"]),
                text(&b["code"]),
                text(&b["envelope"])
            )
        })
        .collect();
    if because.is_empty() {
        format!("{side} (no side states it)")
    } else {
        format!("{side} ({})", because.join("; "))
    }
}

/// `x` of an object path, `-` when absent.
fn at(v: &Value, path: &[&str]) -> String {
    let mut cur = v;
    for p in path {
        cur = &cur[*p];
    }
    text(cur)
}

fn render(t: &Value) -> std::io::Result<()> {
    pstack_cli::outln!(
        "transfer {}  basis {}  linked {}",
        text(&t["id"]),
        text(&t["basis"]),
        text(&t["linked_at"])
    )?;
    pstack_cli::outln!(
        "RST sent by:    {}",
        verdict_line(&t["verdicts"]["rst_sent_by"])
    )?;
    pstack_cli::outln!(
        "zero window on: {}",
        verdict_line(&t["verdicts"]["zero_window_on"])
    )?;
    let mut rows = Vec::new();
    for s in t["sides"].as_array().into_iter().flatten() {
        let nodes = s["nodes"]
            .as_array()
            .map(|n| n.iter().map(text).collect::<Vec<_>>().join(","))
            .unwrap_or_default();
        for e in s["ends"].as_array().into_iter().flatten() {
            let c = &e["counters"];
            let list = |k: &str| {
                e[k].as_array()
                    .map(|x| x.iter().map(text).collect::<Vec<_>>().join(","))
                    .filter(|x| !x.is_empty())
                    .unwrap_or_else(|| "-".into())
            };
            let facts: Vec<String> = e["stated"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|x| {
                    if x["kind"] == "fact" {
                        text(&x["code"])
                    } else {
                        format!("{}?", text(&x["code"]))
                    }
                })
                .collect();
            rows.push(vec![
                text(&s["side"]),
                nodes.clone(),
                text(&e["netns"]),
                format!("{} -> {}", list("local"), list("remote")),
                at(c, &["tcp_delta", "total_retrans"]),
                at(c, &["tcp_delta", "total_rto"]),
                at(c, &["tcp_info_end", "rto_us"]),
                format!(
                    "{}/{}",
                    at(c, &["ebpf", "resets_sent"]),
                    at(c, &["ebpf", "resets_received"])
                ),
                format!(
                    "{}/{}",
                    at(c, &["tcp_info_end", "snd_wnd"]),
                    at(c, &["tcp_info_end", "rcv_wnd"])
                ),
                if facts.is_empty() {
                    "-".into()
                } else {
                    facts.join(",")
                },
                text(&e["envelope"]),
            ]);
        }
    }
    let cut: Vec<String> = t["sides"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| {
            let shown = s["ends"].as_array().map_or(0, Vec::len) as u64;
            let total = s["ends_total"].as_u64().unwrap_or(shown);
            (total > shown).then(|| {
                format!(
                    "side {}: the newest {shown} of {total} envelopes (the verdicts rest on these)",
                    text(&s["side"])
                )
            })
        })
        .collect();
    print_table(
        &[
            "SIDE",
            "NODE",
            "NETNS",
            "LOCAL -> REMOTE",
            "RETRANS",
            "RTO",
            "RTO_US",
            "RST S/R",
            "WND S/R",
            "FACTS",
            "ENVELOPE",
        ],
        &[4, 12, 12, 42, 7, 4, 8, 7, 13, 40],
        &rows,
    )?;
    for c in cut {
        pstack_cli::outln!("{c}")?;
    }
    pstack_cli::outln!(
        "RETRANS/RTO: tcp_info deltas over the window; RST S/R: eBPF resets sent/received; WND S/R: send/receive window at window end; FACT? is an inference"
    )
}
