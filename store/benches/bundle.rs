//! pstack-store evidence-bundle benchmark (not part of `cargo test`):
//!
//! ```text
//! cargo bench -p pstack-store --bench bundle -- [--backend sqlite|postgres]
//! ```
//!
//! An incident with 50 candidate changes in its environment and 10
//! findings citing 1,000 distinct sealed envelopes (100 each). Times
//! `GET /internal/bundles?intent=triage_incident` at two budgets (p50/p99
//! over 20 requests each) and prints the ratio against the plain
//! `GET /internal/incidents/{id}` it starts from, and the bundle's
//! estimated tokens against its budget.

use std::time::{Duration, Instant};

use pstack_store::http::AppState;
use pstack_store::service::serve;
use pstack_store_core::db::analysis::FindingRow;
use pstack_store_core::ingest::IngestLimits;
use pstack_store_core::keys::ScopeSet;
use pstack_store_core::synthetic::Capture;
use serde_json::{Value, json};

#[allow(
    dead_code,
    reason = "each bench uses its own part of the shared helpers"
)]
mod common;
use common::{close, open, percentile};

const ROUNDS: usize = 20;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let backend = args
        .iter()
        .position(|a| a == "--backend")
        .and_then(|i| args.get(i + 1))
        .cloned()
        .unwrap_or_else(|| "sqlite".into());
    let t = open(&backend).await?;
    let key = t.store.create_key("bench", &ScopeSet::legacy()).await?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}", listener.local_addr()?);
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let state = AppState::new(t.store.clone(), IngestLimits::default());
    tokio::spawn(serve(listener, state, async move {
        let _ = rx.await;
    }));
    let client = reqwest::Client::new();
    let post = |path: &str, body: Value| {
        client
            .post(format!("{base}{path}"))
            .bearer_auth(&key.plaintext)
            .json(&body)
            .send()
    };
    let inc: Value = post(
        "/internal/incidents",
        json!({"project": "p", "environment": "prod", "dedupKey": "bench", "title": "checkout slow", "faultLocusEntityId": "checkout-api"}),
    )
    .await?
    .json()
    .await?;
    let inc = inc["incident"]["id"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    for i in 0..50 {
        post(
            "/v1/changes",
            json!({"environment": "prod", "kind": "deploy", "service": format!("svc-{i}"), "version": format!("v{i}")}),
        )
        .await?
        .error_for_status()?;
    }
    let mut digests = Vec::new();
    for batch in 0..10u32 {
        let mut bodies = Vec::new();
        for j in 0..100u32 {
            let mut c = Capture::new("node-a", 10_000 + batch * 100 + j, 1);
            c.threads = 4;
            let (d, b) = c.bytes().map_err(|e| anyhow::anyhow!("{e:?}"))?;
            digests.push(d);
            bodies.push(b);
        }
        let mut array = b"[".to_vec();
        for (i, b) in bodies.iter().enumerate() {
            if i > 0 {
                array.push(b',');
            }
            array.extend_from_slice(b);
        }
        array.push(b']');
        client
            .post(format!("{base}/v1/envelopes"))
            .bearer_auth(&key.plaintext)
            .header("content-type", "application/json")
            .body(array)
            .send()
            .await?
            .error_for_status()?;
    }
    for (n, cited) in digests.chunks(100).enumerate() {
        let now = pstack_store_core::now_ns();
        let id = format!("fnd_bundle{n:04}");
        let row = FindingRow {
            id: id.clone(),
            environment: "prod".into(),
            incident_id: Some(inc.clone()),
            fault_locus_entity_id: "checkout-api".into(),
            causal_chain: json!([]),
            cited_evidence_ids: json!(cited),
            contributing_change_id: None,
            change_verdict: None,
            counterfactual: None,
            fingerprint: format!("fp_bundle_{n}"),
            fingerprint_input: json!({}),
            causal_proof_tier: "correlated".into(),
            idempotency_key: id,
            created_ns: now,
            updated_ns: now,
        };
        t.store.insert_finding(&row, cited, "bench").await?;
    }
    let get = |path: String| {
        let client = client.clone();
        let key = key.plaintext.clone();
        async move {
            let start = Instant::now();
            let r = client.get(path).bearer_auth(key).send().await?;
            let st = r.status();
            let v: Value = r.json().await?;
            anyhow::ensure!(st.is_success(), "{st}: {v}");
            Ok::<_, anyhow::Error>((start.elapsed(), v))
        }
    };
    let mut base_lat = Vec::new();
    for _ in 0..ROUNDS {
        base_lat.push(get(format!("{base}/internal/incidents/{inc}")).await?.0);
    }
    base_lat.sort();
    let base_p50 = percentile(&base_lat, 0.5);
    println!(
        "backend {backend}: 50 changes, {} cited envelopes; GET /internal/incidents/{{id}} p50 {:.2} ms p99 {:.2} ms",
        digests.len(),
        ms(base_p50),
        ms(percentile(&base_lat, 0.99))
    );
    for budget in [4_000usize, 64_000] {
        let mut lat = Vec::new();
        let mut last = Value::Null;
        for _ in 0..ROUNDS {
            let (d, v) = get(format!(
                "{base}/internal/bundles?intent=triage_incident&incident={inc}&budgetTokens={budget}"
            ))
            .await?;
            lat.push(d);
            last = v;
        }
        lat.sort();
        let p50 = percentile(&lat, 0.5);
        let size = last.to_string().len().div_ceil(4);
        let cut: Vec<String> = last["cut"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .iter()
            .map(|c| format!("{} -{}", c["section"].as_str().unwrap_or(""), c["dropped"]))
            .collect();
        println!(
            "bundle budget {budget} tokens: p50 {:.1} ms p99 {:.1} ms ({:.0}x the incident read); size {size} tokens ({:.0}% of budget), handoffs kept {}, changes kept {}, cut [{}]",
            ms(p50),
            ms(percentile(&lat, 0.99)),
            p50.as_secs_f64() / base_p50.as_secs_f64().max(1e-9),
            100.0 * size as f64 / budget as f64,
            last["handoffs"].as_array().map_or(0, Vec::len),
            last["bundle"]["autosre"]["candidateChanges"]
                .as_array()
                .map_or(0, Vec::len),
            cut.join(", ")
        );
    }
    let _ = tx.send(());
    close(t).await;
    Ok(())
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}
