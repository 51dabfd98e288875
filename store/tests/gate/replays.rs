//! Idempotent proposals under concurrency (issue 28): many requests with
//! one `idempotencyKey` racing each other all get the one proposal — one
//! `201`, the rest `200 replayed` — never the database's constraint error
//! (503) nor the breaker counting the winner against its own replays (429).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use reqwest::StatusCode;

use super::{finding, open_incident, post, proposal};
use crate::on_both_backends;
use crate::support::{Db, Harness};

/// Concurrent requests per race (`PSTACK_REPLAY_RACE_N` overrides it, for
/// the BENCHMARKS measurement).
fn race_size() -> usize {
    std::env::var("PSTACK_REPLAY_RACE_N")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(20)
}

// Regression (issue 28): losers of a same-key race got 503 with the unique
// constraint's text, or 429 from the breaker. The breaker is left one slot
// (two live proposals on the fingerprint), so a loser that counted the
// winner is refused; and half the racers cite a finding of another
// fingerprint, so on PostgreSQL they are not serialized by the breaker's
// lock and meet the winner on the unique index instead.
async fn concurrent_same_key_proposals_all_get_the_one_proposal(db: Db) {
    let Some(h) = Harness::start(db).await else {
        return;
    };
    let inc = open_incident(&h, "replays").await;
    let f = finding(&h, &inc, "corroborated_candidate", "fp_replays").await;
    let g = finding(&h, &inc, "corroborated_candidate", "fp_replays_other").await;
    for key in ["pre-1", "pre-2"] {
        let (st, b) = post(
            &h,
            "/internal/remediations/propose",
            &proposal(&inc, &f, "rollback_deploy", key),
        )
        .await;
        assert_eq!(st, StatusCode::CREATED, "{b}");
    }
    let n = race_size();
    let h = Arc::new(h);
    let barrier = Arc::new(tokio::sync::Barrier::new(n));
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let (h, barrier) = (h.clone(), barrier.clone());
            let cited = if i % 2 == 0 { &f } else { &g };
            let body = proposal(&inc, cited, "rollback_deploy", "the-one-key");
            tokio::spawn(async move {
                barrier.wait().await;
                post(&h, "/internal/remediations/propose", &body).await
            })
        })
        .collect();
    let mut histogram = BTreeMap::<u16, usize>::new();
    let mut ids = BTreeSet::new();
    let mut odd = Vec::new();
    for t in tasks {
        let (st, b) = t.await.unwrap();
        *histogram.entry(st.as_u16()).or_default() += 1;
        match st {
            StatusCode::OK => {
                assert_eq!(b["replayed"], true, "{b}");
                assert!(b["grantToken"].is_null(), "a replay carries no token");
                ids.insert(b["proposal"]["id"].as_str().unwrap_or_default().to_string());
            }
            StatusCode::CREATED => {
                ids.insert(b["proposal"]["id"].as_str().unwrap_or_default().to_string());
            }
            _ => odd.push(format!("{st} {b}")),
        }
    }
    eprintln!("REPLAY-RACE {db:?} n={n}: {histogram:?}");
    assert_eq!(
        histogram,
        [(200, n - 1), (201, 1)].into_iter().collect(),
        "one created, the rest replays: {odd:?}"
    );
    assert_eq!(ids.len(), 1, "{ids:?}");
    Arc::into_inner(h).unwrap().finish().await;
}

on_both_backends!(concurrent_same_key_proposals_all_get_the_one_proposal);
