//! pstack-store remediation-gate benchmarks (not part of `cargo test`):
//!
//! ```text
//! cargo bench -p pstack-store --bench gate -- [--backend sqlite|postgres|both]
//! ```
//!
//! - **propose → grant**: 16 concurrent HTTP clients each send 100
//!   `POST /internal/remediations/propose` for `rollback_deploy` on findings
//!   of tier `counterfactual_verified` (each proposal on its own finding
//!   fingerprint, so the circuit breaker never holds), i.e. every response
//!   mints a grant: the incident and fence read, the breaker count under
//!   its lock, the insert, the token hash. Prints p50/p99 latency of the
//!   request and proposals/s.
//! - **claims under contention**: 200 rounds; each mints one grant, then 16
//!   clients claim it at once (one wins, 15 get 409). Prints claim requests/s
//!   and the p50/p99 latency of a claim request.
//!
//! PostgreSQL: `PSTACK_BENCH_PG_URL`, default
//! `postgres://pstack:pstack@127.0.0.1:5432/pstack_bench`; each run uses and
//! drops a fresh schema.

use std::sync::Arc;
use std::time::{Duration, Instant};

use pstack_store::http::AppState;
use pstack_store::service::serve;
use pstack_store_core::db::analysis::FindingRow;
use pstack_store_core::ingest::IngestLimits;
use pstack_store_core::keys::ScopeSet;
use serde_json::{Value, json};

// The CPU-time helpers serve the other benchmarks.
#[allow(
    dead_code,
    reason = "each bench uses its own part of the shared helpers"
)]
mod common;
use common::{Target, close, open, percentile};

const CLIENTS: usize = 16;
const PER_CLIENT: usize = 100;
const CLAIM_ROUNDS: usize = 200;

struct Server {
    base: String,
    key: String,
    client: reqwest::Client,
    _stop: tokio::sync::oneshot::Sender<()>,
}

impl Server {
    async fn post(&self, path: &str, body: &Value) -> anyhow::Result<(u16, Value)> {
        let r = self
            .client
            .post(format!("{}{path}", self.base))
            .bearer_auth(&self.key)
            .json(body)
            .send()
            .await?;
        let st = r.status().as_u16();
        Ok((st, r.json().await.unwrap_or(Value::Null)))
    }
}

async fn start(t: &Target) -> anyhow::Result<Server> {
    let key = t.store.create_key("bench", &ScopeSet::legacy()).await?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let state = AppState::new(t.store.clone(), IngestLimits::default());
    tokio::spawn(serve(listener, state, async move {
        let _ = rx.await;
    }));
    Ok(Server {
        base: format!("http://{addr}"),
        key: key.plaintext,
        client: reqwest::Client::builder()
            .pool_max_idle_per_host(64)
            .build()?,
        _stop: tx,
    })
}

async fn finding(t: &Target, incident: &str, n: usize) -> anyhow::Result<String> {
    let now = pstack_store_core::now_ns();
    let id = format!("fnd_bench{n:08}");
    let row = FindingRow {
        id: id.clone(),
        environment: "prod".into(),
        incident_id: Some(incident.into()),
        fault_locus_entity_id: "checkout-api".into(),
        causal_chain: json!([]),
        cited_evidence_ids: json!([]),
        contributing_change_id: None,
        change_verdict: None,
        counterfactual: None,
        fingerprint: format!("fp_bench_{n}"),
        fingerprint_input: json!({}),
        causal_proof_tier: "counterfactual_verified".into(),
        idempotency_key: id.clone(),
        created_ns: now,
        updated_ns: now,
    };
    t.store.insert_finding(&row, &[], "bench").await?;
    Ok(id)
}

fn propose_body(incident: &str, finding: &str, key: &str) -> Value {
    json!({
        "incidentId": incident, "findingId": finding, "action": "rollback_deploy",
        "target": {"service": "checkout-api", "environment": "prod"},
        "expectedCurrentState": {"version": "2.4.1", "commitSha": "8f3a1b2"},
        "idempotencyKey": key,
    })
}

async fn bench(t: &Target) -> anyhow::Result<()> {
    let s = Arc::new(start(t).await?);
    let (st, _) = s
        .post(
            "/v1/changes",
            &json!({"environment": "prod", "kind": "deploy", "service": "checkout-api",
                    "version": "2.4.1", "commitSha": "8f3a1b2"}),
        )
        .await?;
    anyhow::ensure!(st == 201, "deploy: {st}");
    let (_, inc) = s
        .post(
            "/internal/incidents",
            &json!({"project": "bench", "environment": "prod", "dedupKey": "bench", "title": "bench"}),
        )
        .await?;
    let inc = inc["incident"]["id"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let total = CLIENTS * PER_CLIENT + CLAIM_ROUNDS;
    let mut findings = Vec::with_capacity(total);
    for n in 0..total {
        findings.push(finding(t, &inc, n).await?);
    }
    let findings = Arc::new(findings);

    // Propose → grant, 16 concurrent proposers.
    let started = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..CLIENTS {
        let (s, inc, findings) = (s.clone(), inc.clone(), findings.clone());
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::with_capacity(PER_CLIENT);
            for i in 0..PER_CLIENT {
                let n = c * PER_CLIENT + i;
                let body = propose_body(&inc, &findings[n], &format!("p{n}"));
                let t0 = Instant::now();
                let (st, b) = s.post("/internal/remediations/propose", &body).await?;
                lat.push(t0.elapsed());
                anyhow::ensure!(
                    st == 201 && b["grantToken"].is_string(),
                    "propose {st}: {b}"
                );
            }
            Ok::<_, anyhow::Error>(lat)
        }));
    }
    let mut lat = Vec::new();
    for t in tasks {
        lat.extend(t.await??);
    }
    let wall = started.elapsed();
    lat.sort();
    println!(
        "{}: propose→grant, {CLIENTS} concurrent proposers, {} proposals: p50 {:.2} ms, p99 {:.2} ms, {:.0} proposals/s",
        t.name,
        lat.len(),
        ms(percentile(&lat, 0.50)),
        ms(percentile(&lat, 0.99)),
        lat.len() as f64 / wall.as_secs_f64()
    );

    // Claims with contention on one proposal per round.
    let mut claim_lat = Vec::new();
    let mut claim_wall = Duration::ZERO;
    let mut winners = 0;
    for r in 0..CLAIM_ROUNDS {
        let n = CLIENTS * PER_CLIENT + r;
        let (st, b) = s
            .post(
                "/internal/remediations/propose",
                &propose_body(&inc, &findings[n], &format!("c{r}")),
            )
            .await?;
        anyhow::ensure!(st == 201, "propose {st}: {b}");
        let id = b["proposal"]["id"].as_str().unwrap_or_default().to_string();
        let token = b["grantToken"].as_str().unwrap_or_default().to_string();
        let t0 = Instant::now();
        let mut tasks = Vec::new();
        for c in 0..CLIENTS {
            let (s, id, token) = (s.clone(), id.clone(), token.clone());
            tasks.push(tokio::spawn(async move {
                let t1 = Instant::now();
                let (st, _) = s
                    .post(
                        &format!("/internal/remediations/{id}/grant"),
                        &json!({"operation": "claim", "grantToken": token, "runnerId": format!("r{c}")}),
                    )
                    .await?;
                Ok::<_, anyhow::Error>((st, t1.elapsed()))
            }));
        }
        for t in tasks {
            let (st, d) = t.await??;
            anyhow::ensure!(st == 200 || st == 409, "claim {st}");
            winners += usize::from(st == 200);
            claim_lat.push(d);
        }
        claim_wall += t0.elapsed();
    }
    anyhow::ensure!(
        winners == CLAIM_ROUNDS,
        "{winners} winners in {CLAIM_ROUNDS} rounds"
    );
    claim_lat.sort();
    println!(
        "{}: claims, {CLIENTS} claimants per grant, {CLAIM_ROUNDS} grants: {:.0} claim requests/s, p50 {:.2} ms, p99 {:.2} ms, exactly one winner per grant",
        t.name,
        claim_lat.len() as f64 / claim_wall.as_secs_f64(),
        ms(percentile(&claim_lat, 0.50)),
        ms(percentile(&claim_lat, 0.99)),
    );
    Ok(())
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let backend = args
        .iter()
        .position(|a| a == "--backend")
        .and_then(|i| args.get(i + 1).cloned())
        .unwrap_or_else(|| "both".into());
    let backends: Vec<&str> = match backend.as_str() {
        "both" => vec!["sqlite", "postgres"],
        "sqlite" => vec!["sqlite"],
        "postgres" => vec!["postgres"],
        other => anyhow::bail!("--backend {other}: sqlite, postgres or both"),
    };
    for b in backends {
        let t = open(b).await?;
        bench(&t).await?;
        close(t).await;
    }
    Ok(())
}
