//! Proposals and grants: every policy-matrix cell and every lowering, the
//! circuit breaker, single-use hashed grants (claim, double claim,
//! concurrent claims, windows, runner identity), CAS at claim, human
//! approve/reject, host-subject evidence, and the token's absence from
//! every GET, list and log line.

use std::sync::Arc;

use pstack_store_core::synthetic::Capture;
use reqwest::StatusCode;
use serde_json::{Value, json};

use super::{MIN, deploy, finding, open_incident, post, proposal};
use crate::on_both_backends;
use crate::support::{Db, Harness, code};

const TIERS: [&str; 4] = [
    "counterfactual_verified",
    "cohort_rate_isolated",
    "corroborated_candidate",
    "unverified_locus",
];

/// The seed's matrix, written out independently of the code under test.
fn expected(action: &str, tier: usize) -> &'static str {
    const AUTO: &str = "autonomous_write";
    const HUMAN: &str = "human_approved_write";
    const BLOCKED: &str = "blocked_by_policy";
    let row: [&str; 4] = match action {
        "rollback_deploy" | "toggle_feature_flag" => [AUTO, AUTO, HUMAN, BLOCKED],
        "open_code_pr" => [AUTO, AUTO, AUTO, HUMAN],
        "apply_config" | "promote_agent_prompt" => [AUTO, HUMAN, HUMAN, BLOCKED],
        other => panic!("{other}"),
    };
    row[tier]
}

const ACTIONS: [&str; 5] = [
    "rollback_deploy",
    "toggle_feature_flag",
    "open_code_pr",
    "apply_config",
    "promote_agent_prompt",
];

fn status_for(autonomy: &str) -> &'static str {
    match autonomy {
        "autonomous_write" => "grant_issued",
        "blocked_by_policy" => "rejected",
        _ => "pending_human_approval",
    }
}

async fn policy_matrix_every_cell_and_every_lowering(db: Db) {
    let Some(h) = Harness::start(db).await else {
        return;
    };
    let inc = open_incident(&h, "matrix").await;
    let levels = [
        "read_only",
        "suggested_action",
        "human_approved_write",
        "autonomous_write",
    ];
    let rank = |a: &str| levels.iter().position(|l| *l == a);
    let mut n = 0;
    for action in ACTIONS {
        for (t, tier) in TIERS.iter().enumerate() {
            let policy = expected(action, t);
            // No request, then each requested level.
            let mut requests: Vec<Option<&str>> = vec![None];
            requests.extend(levels.iter().map(|l| Some(*l)));
            for req in requests {
                n += 1;
                // A fresh fingerprint per proposal: the breaker is not under test here.
                let f = finding(&h, &inc, tier, &format!("fp_matrix_{n}")).await;
                let mut body = proposal(&inc, &f, action, &format!("matrix-{n}"));
                if let Some(r) = req {
                    body["requestedAutonomy"] = json!(r);
                }
                let (st, out) = post(&h, "/internal/remediations/propose", &body).await;
                assert_eq!(st, StatusCode::CREATED, "{action} {tier} {req:?}: {out}");
                let want = match (req, rank(policy)) {
                    (_, None) => policy, // blocked stays blocked
                    (Some(r), Some(p)) if rank(r).unwrap() < p => r,
                    _ => policy,
                };
                let p = &out["proposal"];
                assert_eq!(p["effectiveAutonomy"], want, "{action} {tier} {req:?}");
                assert_eq!(p["status"], status_for(want), "{action} {tier} {req:?}");
                assert_eq!(p["causalProofTier"], *tier);
                let token = out["grantToken"].as_str();
                assert_eq!(
                    token.is_some(),
                    want == "autonomous_write",
                    "{action} {tier} {req:?}: {out}"
                );
                if let Some(t) = token {
                    assert!(t.starts_with("rgt_") && t.len() == 68, "{t}");
                    assert!(p["grantExpiresAt"].is_string());
                }
            }
        }
    }
    assert_eq!(n, 5 * 4 * 5);
    // blocked_by_policy is a decision, not a level a caller may request.
    let f = finding(&h, &inc, "counterfactual_verified", "fp_matrix_x").await;
    let mut body = proposal(&inc, &f, "rollback_deploy", "matrix-x");
    body["requestedAutonomy"] = json!("blocked_by_policy");
    let (st, e) = post(&h, "/internal/remediations/propose", &body).await;
    assert_eq!(
        (st, code(&e)),
        (
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_requested_autonomy"
        )
    );
    assert_eq!(e["error"]["field"], "requestedAutonomy");
    h.finish().await;
}

async fn circuit_breaker_blocks_the_fourth_live_proposal(db: Db) {
    let Some(h) = Harness::start(db).await else {
        return;
    };
    let inc = open_incident(&h, "breaker").await;
    // Two findings of one failure share a fingerprint, hence one budget.
    let f1 = finding(&h, &inc, "cohort_rate_isolated", "fp_breaker").await;
    let f2 = finding(&h, &inc, "corroborated_candidate", "fp_breaker").await;
    // A blocked (rejected) proposal takes no slot.
    let f0 = finding(&h, &inc, "unverified_locus", "fp_breaker").await;
    let (st, b) = post(
        &h,
        "/internal/remediations/propose",
        &proposal(&inc, &f0, "rollback_deploy", "b0"),
    )
    .await;
    assert_eq!(st, StatusCode::CREATED);
    assert_eq!(b["proposal"]["status"], "rejected");
    assert_eq!(b["proposal"]["effectiveAutonomy"], "blocked_by_policy");
    let mut ids = Vec::new();
    for (i, f) in [&f1, &f2, &f1].iter().enumerate() {
        let (st, b) = post(
            &h,
            "/internal/remediations/propose",
            &proposal(&inc, f, "rollback_deploy", &format!("b{}", i + 1)),
        )
        .await;
        assert_eq!(st, StatusCode::CREATED, "{b}");
        ids.push((
            b["proposal"]["id"].as_str().unwrap().to_string(),
            b["grantToken"].clone(),
        ));
    }
    let (st, e) = post(
        &h,
        "/internal/remediations/propose",
        &proposal(&inc, &f2, "rollback_deploy", "b4"),
    )
    .await;
    assert_eq!(st, StatusCode::TOO_MANY_REQUESTS, "{e}");
    assert_eq!(code(&e), "circuit_breaker_open");
    // Another action kind has its own budget.
    let (st, _) = post(
        &h,
        "/internal/remediations/propose",
        &proposal(&inc, &f1, "open_code_pr", "b-pr"),
    )
    .await;
    assert_eq!(st, StatusCode::CREATED);
    // Rejecting a live one (here a pending one) frees its slot.
    let pending = &ids[1].0;
    let (st, r) = post(
        &h,
        &format!("/internal/remediations/{pending}/reject"),
        &json!({}),
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{r}");
    assert_eq!(r["proposal"]["status"], "rejected");
    assert_eq!(
        r["proposal"]["effectiveAutonomy"], "human_approved_write",
        "keeps the original decision"
    );
    let (st, b5) = post(
        &h,
        "/internal/remediations/propose",
        &proposal(&inc, &f2, "rollback_deploy", "b5"),
    )
    .await;
    assert_eq!(st, StatusCode::CREATED, "{b5}");
    let (st, _) = post(
        &h,
        "/internal/remediations/propose",
        &proposal(&inc, &f2, "rollback_deploy", "b6"),
    )
    .await;
    assert_eq!(st, StatusCode::TOO_MANY_REQUESTS);
    // Letting the two unclaimed grants expire frees their slots (the
    // ticker marks them; the breaker does too when it counts).
    h.clock.advance(5 * MIN + std::time::Duration::from_secs(1));
    let (st, b7) = post(
        &h,
        "/internal/remediations/propose",
        &proposal(&inc, &f1, "rollback_deploy", "b7"),
    )
    .await;
    assert_eq!(st, StatusCode::CREATED, "{b7}");
    let (_, g) = h.get(&format!("/internal/remediations/{}", ids[0].0)).await;
    assert_eq!(g["proposal"]["status"], "expired");
    // An hour later the window is empty again.
    h.clock.advance(61 * MIN);
    for k in ["b8", "b9"] {
        let (st, b) = post(
            &h,
            "/internal/remediations/propose",
            &proposal(&inc, &f1, "rollback_deploy", k),
        )
        .await;
        assert_eq!(st, StatusCode::CREATED, "{k} {b}");
    }
    h.finish().await;
}

/// Propose an autonomous rollback against live 2.4.1: (proposal id, token).
pub(crate) async fn granted(h: &Harness, inc: &str, fp: &str, key: &str) -> (String, String) {
    let f = finding(h, inc, "counterfactual_verified", fp).await;
    let (st, b) = post(
        h,
        "/internal/remediations/propose",
        &proposal(inc, &f, "rollback_deploy", key),
    )
    .await;
    assert_eq!(st, StatusCode::CREATED, "{b}");
    assert_eq!(b["proposal"]["status"], "grant_issued");
    (
        b["proposal"]["id"].as_str().unwrap().to_string(),
        b["grantToken"].as_str().unwrap().to_string(),
    )
}

pub(crate) fn grant_op(op: &str, token: &str, runner: &str) -> Value {
    json!({"operation": op, "grantToken": token, "runnerId": runner})
}

async fn grant_lifecycle_single_use_and_windows(db: Db) {
    let Some(h) = Harness::start(db).await else {
        return;
    };
    deploy(&h, "2.4.1", "8f3a1b2").await;
    let inc = open_incident(&h, "grants").await;
    let (id, token) = granted(&h, &inc, "fp_g1", "g1").await;
    let path = format!("/internal/remediations/{id}/grant");
    // Replay: the proposal, never the token again.
    let f = h.get(&format!("/internal/remediations/{id}")).await.1["proposal"]["findingId"].clone();
    let (st, replay) = post(
        &h,
        "/internal/remediations/propose",
        &proposal(&inc, f.as_str().unwrap(), "rollback_deploy", "g1"),
    )
    .await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(replay["grantToken"], Value::Null);
    assert_eq!(replay["proposal"]["id"], id.as_str());
    // Approving a grant_issued proposal: 409.
    let (st, e) = post(
        &h,
        &format!("/internal/remediations/{id}/approve"),
        &json!({}),
    )
    .await;
    assert_eq!((st, code(&e)), (StatusCode::CONFLICT, "already_granted"));
    // A wrong token.
    let (st, e) = post(&h, &path, &grant_op("claim", "rgt_0000", "runner-1")).await;
    assert_eq!(
        (st, code(&e)),
        (StatusCode::FORBIDDEN, "invalid_grant_token")
    );
    // Claim, then claim again.
    let (st, c) = post(&h, &path, &grant_op("claim", &token, "runner-1")).await;
    assert_eq!(st, StatusCode::OK, "{c}");
    assert_eq!(c["proposal"]["status"], "claimed_executing");
    assert_eq!(c["proposal"]["runnerId"], "runner-1");
    let (st, e) = post(&h, &path, &grant_op("claim", &token, "runner-2")).await;
    assert_eq!(
        (st, code(&e)),
        (StatusCode::CONFLICT, "grant_already_claimed")
    );
    // Another runner cannot complete it.
    let (st, e) = post(&h, &path, &grant_op("complete", &token, "runner-2")).await;
    assert_eq!(
        (st, code(&e)),
        (StatusCode::FORBIDDEN, "not_claiming_runner")
    );
    // The claimant completes; the watchdog's checkpoints are armed.
    let (st, done) = post(&h, &path, &grant_op("complete", &token, "runner-1")).await;
    assert_eq!(st, StatusCode::OK, "{done}");
    assert_eq!(done["proposal"]["status"], "completed");
    assert_eq!(done["proposal"]["recoveryStatus"], "monitoring");
    let (_, g) = h.get(&format!("/internal/remediations/{id}")).await;
    assert_eq!(g["proposal"]["checkpoints"].as_array().unwrap().len(), 3);
    let (st, e) = post(&h, &path, &grant_op("fail", &token, "runner-1")).await;
    assert_eq!((st, code(&e)), (StatusCode::CONFLICT, "invalid_status"));

    // Claim after 5 minutes: expired.
    let (id2, token2) = granted(&h, &inc, "fp_g2", "g2").await;
    h.clock.advance(5 * MIN);
    let (st, e) = post(
        &h,
        &format!("/internal/remediations/{id2}/grant"),
        &grant_op("claim", &token2, "runner-1"),
    )
    .await;
    assert_eq!((st, code(&e)), (StatusCode::GONE, "grant_expired"), "{e}");
    let (_, g) = h.get(&format!("/internal/remediations/{id2}")).await;
    assert_eq!(g["proposal"]["status"], "expired");
    let (st, _) = post(
        &h,
        &format!("/internal/remediations/{id2}/reject"),
        &json!({}),
    )
    .await;
    assert_eq!(
        st,
        StatusCode::CONFLICT,
        "an expired grant is not rejectable"
    );

    // Complete after 5 minutes: execution_timed_out.
    let (id3, token3) = granted(&h, &inc, "fp_g3", "g3").await;
    let p3 = format!("/internal/remediations/{id3}/grant");
    let (st, _) = post(&h, &p3, &grant_op("claim", &token3, "runner-1")).await;
    assert_eq!(st, StatusCode::OK);
    h.clock.advance(5 * MIN);
    let (st, e) = post(&h, &p3, &grant_op("complete", &token3, "runner-1")).await;
    assert_eq!(
        (st, code(&e)),
        (StatusCode::GONE, "execution_timed_out"),
        "{e}"
    );
    let (_, g) = h.get(&format!("/internal/remediations/{id3}")).await;
    assert_eq!(g["proposal"]["status"], "execution_timed_out");

    // The ticker also moves overdue grants and claims.
    let (id4, _t4) = granted(&h, &inc, "fp_g4", "g4").await;
    let (id5, token5) = granted(&h, &inc, "fp_g5", "g5").await;
    let (st, _) = post(
        &h,
        &format!("/internal/remediations/{id5}/grant"),
        &grant_op("claim", &token5, "runner-9"),
    )
    .await;
    assert_eq!(st, StatusCode::OK);
    h.clock.advance(5 * MIN);
    let (st, tick) = post(&h, "/internal/remediations/watchdog", &json!({})).await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(
        (
            tick["expiredGrants"].as_u64(),
            tick["timedOutExecutions"].as_u64()
        ),
        (Some(1), Some(1)),
        "{tick}"
    );
    assert_eq!(
        h.get(&format!("/internal/remediations/{id4}")).await.1["proposal"]["status"],
        "expired"
    );
    assert_eq!(
        h.get(&format!("/internal/remediations/{id5}")).await.1["proposal"]["status"],
        "execution_timed_out"
    );
    h.finish().await;
}

async fn concurrent_claims_exactly_one_wins(db: Db) {
    let Some(h) = Harness::start(db).await else {
        return;
    };
    deploy(&h, "2.4.1", "8f3a1b2").await;
    let inc = open_incident(&h, "race").await;
    let (id, token) = granted(&h, &inc, "fp_race", "race").await;
    let h = Arc::new(h);
    let mut tasks = Vec::new();
    for i in 0..12 {
        let (h, token, id) = (h.clone(), token.clone(), id.clone());
        tasks.push(tokio::spawn(async move {
            post(
                &h,
                &format!("/internal/remediations/{id}/grant"),
                &grant_op("claim", &token, &format!("runner-{i}")),
            )
            .await
        }));
    }
    let mut won = Vec::new();
    for t in tasks {
        let (st, b) = t.await.unwrap();
        if st == StatusCode::OK {
            won.push(b["proposal"]["runnerId"].as_str().unwrap().to_string());
        } else {
            assert_eq!(
                (st, code(&b)),
                (StatusCode::CONFLICT, "grant_already_claimed"),
                "{b}"
            );
        }
    }
    assert_eq!(won.len(), 1, "{won:?}");
    let (_, g) = h.get(&format!("/internal/remediations/{id}")).await;
    assert_eq!(g["proposal"]["runnerId"], won[0].as_str());
    Arc::into_inner(h).unwrap().finish().await;
}

async fn cas_at_claim_refuses_a_moved_target(db: Db) {
    let Some(h) = Harness::start(db).await else {
        return;
    };
    deploy(&h, "2.4.1", "8f3a1b2").await;
    let inc = open_incident(&h, "cas").await;
    // Proposed against 2.4.1: accepted (the CAS is at claim, not propose).
    let (id, token) = granted(&h, &inc, "fp_cas", "cas").await;
    // Meanwhile a human deploys 2.4.2.
    deploy(&h, "2.4.2", "9c0d4e5").await;
    let (st, e) = post(
        &h,
        &format!("/internal/remediations/{id}/grant"),
        &grant_op("claim", &token, "runner-1"),
    )
    .await;
    assert_eq!(
        (st, code(&e)),
        (StatusCode::CONFLICT, "expected_state_mismatch"),
        "{e}"
    );
    assert_eq!(e["error"]["field"], "expectedCurrentState.commitSha");
    let detail = e["error"]["detail"].as_array().unwrap();
    assert!(
        detail
            .iter()
            .any(|d| d["field"] == "version" && d["actual"] == "2.4.2"),
        "{e}"
    );
    let (_, g) = h.get(&format!("/internal/remediations/{id}")).await;
    assert_eq!(
        g["proposal"]["status"], "grant_issued",
        "a refused claim consumes nothing"
    );
    // Flags: only the named flags must hold, each one exactly.
    let (st, b) = post(
        &h,
        "/v1/changes",
        &json!({"environment": "prod", "kind": "feature_flag", "service": "checkout-api",
                "flags": {"new-checkout": true, "tax-v2": "off"}}),
    )
    .await;
    assert_eq!(st, StatusCode::CREATED, "{b}");
    for (key, flags, ok) in [
        ("cas-f1", json!({"new-checkout": true}), true),
        ("cas-f2", json!({"new-checkout": "true"}), false),
        ("cas-f3", json!({"tax-v2": "off", "missing": 1}), false),
    ] {
        let f = finding(&h, &inc, "counterfactual_verified", &format!("fp_{key}")).await;
        let mut body = proposal(&inc, &f, "toggle_feature_flag", key);
        body["expectedCurrentState"] = json!({"flags": flags});
        let (st, b) = post(&h, "/internal/remediations/propose", &body).await;
        assert_eq!(st, StatusCode::CREATED, "{b}");
        let (st, e) = post(
            &h,
            &format!(
                "/internal/remediations/{}/grant",
                b["proposal"]["id"].as_str().unwrap()
            ),
            &grant_op("claim", b["grantToken"].as_str().unwrap(), "runner-1"),
        )
        .await;
        if ok {
            assert_eq!(st, StatusCode::OK, "{key}: {e}");
        } else {
            assert_eq!(
                (st, code(&e)),
                (StatusCode::CONFLICT, "expected_state_mismatch"),
                "{key}: {e}"
            );
            assert!(
                e["error"]["field"]
                    .as_str()
                    .unwrap()
                    .starts_with("expectedCurrentState.flags."),
                "{e}"
            );
        }
    }
    // A target the ledger never saw has no state to match.
    let f = finding(&h, &inc, "counterfactual_verified", "fp_cas2").await;
    let mut body = proposal(&inc, &f, "rollback_deploy", "cas2");
    body["target"]["service"] = json!("ledger-unknown");
    let (_, b) = post(&h, "/internal/remediations/propose", &body).await;
    let (st, e) = post(
        &h,
        &format!(
            "/internal/remediations/{}/grant",
            b["proposal"]["id"].as_str().unwrap()
        ),
        &grant_op("claim", b["grantToken"].as_str().unwrap(), "runner-1"),
    )
    .await;
    assert_eq!(
        (st, code(&e)),
        (StatusCode::CONFLICT, "expected_state_mismatch")
    );
    h.finish().await;
}

async fn human_approval_and_rejection(db: Db) {
    let Some(h) = Harness::start(db).await else {
        return;
    };
    deploy(&h, "2.4.1", "8f3a1b2").await;
    let inc = open_incident(&h, "approve").await;
    let f = finding(&h, &inc, "corroborated_candidate", "fp_appr").await;
    let (st, b) = post(
        &h,
        "/internal/remediations/propose",
        &proposal(&inc, &f, "rollback_deploy", "ap1"),
    )
    .await;
    assert_eq!(st, StatusCode::CREATED);
    assert_eq!(b["proposal"]["status"], "pending_human_approval");
    assert_eq!(b["grantToken"], Value::Null);
    let id = b["proposal"]["id"].as_str().unwrap();
    let (st, a) = post(
        &h,
        &format!("/internal/remediations/{id}/approve"),
        &json!({}),
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{a}");
    assert_eq!(a["proposal"]["status"], "grant_issued");
    let token = a["grantToken"].as_str().unwrap();
    assert!(token.starts_with("rgt_"));
    let (st, e) = post(
        &h,
        &format!("/internal/remediations/{id}/approve"),
        &json!({}),
    )
    .await;
    assert_eq!((st, code(&e)), (StatusCode::CONFLICT, "already_granted"));
    // A read_only request parks; a human can still approve it.
    let f2 = finding(&h, &inc, "counterfactual_verified", "fp_appr2").await;
    let mut body = proposal(&inc, &f2, "rollback_deploy", "ap2");
    body["requestedAutonomy"] = json!("read_only");
    let (_, b2) = post(&h, "/internal/remediations/propose", &body).await;
    assert_eq!(b2["proposal"]["status"], "pending_human_approval");
    let id2 = b2["proposal"]["id"].as_str().unwrap();
    let (st, a2) = post(
        &h,
        &format!("/internal/remediations/{id2}/approve"),
        &json!({}),
    )
    .await;
    assert_eq!(st, StatusCode::OK);
    // Reject an unclaimed grant: it can no longer be claimed.
    let (st, r) = post(
        &h,
        &format!("/internal/remediations/{id2}/reject"),
        &json!({}),
    )
    .await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(r["proposal"]["status"], "rejected");
    assert_eq!(r["proposal"]["effectiveAutonomy"], "read_only");
    let (st, _) = post(
        &h,
        &format!("/internal/remediations/{id2}/grant"),
        &grant_op("claim", a2["grantToken"].as_str().unwrap(), "runner-1"),
    )
    .await;
    assert_eq!(st, StatusCode::CONFLICT);
    // A claimed grant is not rejectable.
    let (st, _) = post(
        &h,
        &format!("/internal/remediations/{id}/grant"),
        &grant_op("claim", token, "runner-1"),
    )
    .await;
    assert_eq!(st, StatusCode::OK);
    let (st, e) = post(
        &h,
        &format!("/internal/remediations/{id}/reject"),
        &json!({}),
    )
    .await;
    assert_eq!((st, code(&e)), (StatusCode::CONFLICT, "invalid_status"));
    let (st, e) = post(&h, "/internal/remediations/rem_missing/approve", &json!({})).await;
    assert_eq!(
        (st, code(&e)),
        (StatusCode::NOT_FOUND, "proposal_not_found")
    );
    h.finish().await;
}

/// A sealed envelope of process 4242 on node-a captured `ago_s` seconds
/// before `now_ns`: (digest, bytes). `blocked`: partial (a timed-out stack).
pub(crate) fn envelope_at(now_ns: i64, ago_s: i64, blocked: bool) -> (String, Vec<u8>) {
    let base = 1_796_000_000i64;
    let seq = now_ns / 1_000_000_000 - ago_s - base;
    let mut c = Capture::new(
        "node-a",
        4242,
        u64::try_from(seq).expect("after the base time"),
    );
    c.blocked = blocked;
    c.bytes().expect("sealed")
}

async fn host_subject_needs_a_fresh_sealed_pre_mutation_envelope(db: Db) {
    let Some(h) = Harness::start(db).await else {
        return;
    };
    let inc = open_incident(&h, "host").await;
    let now = h.clock.now_ns();
    let (fresh, fresh_b) = envelope_at(now, 60, false);
    let (stale, stale_b) = envelope_at(now, 11 * 60, false);
    let (partial, partial_b) = envelope_at(now, 30, true);
    h.post_batch(&[fresh_b, stale_b, partial_b]).await;
    let subject = h.store.envelope_meta(&fresh).await.unwrap().unwrap().0;
    let mut other = Capture::new("node-b", 77, 1);
    other.blocked = false;
    let (other_d, other_b) = other.bytes().unwrap();
    h.post_batch(&[other_b]).await;
    let f = finding(&h, &inc, "counterfactual_verified", "fp_host").await;
    let body = |key: &str, env: Option<&str>| {
        let mut b = json!({
            "incidentId": inc, "findingId": f, "action": "apply_config",
            "target": {"subject": subject}, "expectedCurrentState": {},
            "idempotencyKey": key,
        });
        if let Some(e) = env {
            b["preMutationEnvelope"] = json!(e);
        }
        b
    };
    for (key, env, want) in [
        ("h1", None, "pre_mutation_envelope_required"),
        ("h2", Some(stale.as_str()), "pre_mutation_envelope_stale"),
        (
            "h3",
            Some(partial.as_str()),
            "pre_mutation_envelope_incomplete",
        ),
        (
            "h4",
            Some(other_d.as_str()),
            "pre_mutation_envelope_wrong_subject",
        ),
        (
            "h5",
            Some("sha256:0000000000000000000000000000000000000000000000000000000000000000"),
            "pre_mutation_envelope_unknown",
        ),
    ] {
        let (st, e) = post(&h, "/internal/remediations/propose", &body(key, env)).await;
        assert_eq!(
            (st, code(&e)),
            (StatusCode::UNPROCESSABLE_ENTITY, want),
            "{key}: {e}"
        );
        assert_eq!(e["error"]["field"], "preMutationEnvelope");
    }
    let (st, ok) = post(
        &h,
        "/internal/remediations/propose",
        &body("h6", Some(&fresh)),
    )
    .await;
    assert_eq!(st, StatusCode::CREATED, "{ok}");
    assert_eq!(ok["proposal"]["status"], "grant_issued");
    let id = ok["proposal"]["id"].as_str().unwrap();
    // Past its freshness the envelope no longer authorizes the claim.
    h.clock
        .advance(9 * MIN + std::time::Duration::from_secs(30));
    h.clock.advance(std::time::Duration::from_secs(45));
    let (st, e) = post(
        &h,
        &format!("/internal/remediations/{id}/grant"),
        &grant_op("claim", ok["grantToken"].as_str().unwrap(), "runner-1"),
    )
    .await;
    assert_eq!(
        (st, code(&e)),
        (
            StatusCode::UNPROCESSABLE_ENTITY,
            "pre_mutation_envelope_stale"
        ),
        "{e}"
    );
    h.finish().await;
}

async fn grant_token_never_in_gets_lists_or_logs(db: Db) {
    let logs = crate::support::captured_logs();
    let Some(h) = Harness::start(db).await else {
        return;
    };
    deploy(&h, "2.4.1", "8f3a1b2").await;
    let inc = open_incident(&h, "leak").await;
    let (id, token) = granted(&h, &inc, "fp_leak", "leak1").await;
    let f = finding(&h, &inc, "corroborated_candidate", "fp_leak2").await;
    let mut parked = proposal(&inc, &f, "rollback_deploy", "leak2");
    parked["webhookUrl"] = json!("https://hooks.example.invalid/grant?sig=query-secret");
    parked["secret"] = json!("webhook-secret-value");
    let (_, p2) = post(&h, "/internal/remediations/propose", &parked).await;
    let id2 = p2["proposal"]["id"].as_str().unwrap().to_string();
    assert_eq!(p2["proposal"]["callbackHost"], "hooks.example.invalid");
    let (_, a) = post(
        &h,
        &format!("/internal/remediations/{id2}/approve"),
        &json!({}),
    )
    .await;
    let token2 = a["grantToken"].as_str().unwrap().to_string();
    let (st, _) = post(
        &h,
        &format!("/internal/remediations/{id}/grant"),
        &grant_op("claim", &token, "runner-1"),
    )
    .await;
    assert_eq!(st, StatusCode::OK);
    let (st, _) = post(
        &h,
        &format!("/internal/remediations/{id}/grant"),
        &grant_op("complete", &token, "runner-1"),
    )
    .await;
    assert_eq!(st, StatusCode::OK);
    let replay = post(
        &h,
        "/internal/remediations/propose",
        &proposal(&inc, "x", "rollback_deploy", "leak1"),
    )
    .await
    .1;
    let mut bodies = vec![replay.to_string()];
    for path in [
        format!("/internal/remediations/{id}"),
        format!("/internal/remediations/{id2}"),
        "/internal/remediations".to_string(),
        format!("/internal/remediations?incidentId={inc}"),
        "/internal/remediations?status=grant_issued".to_string(),
        format!("/internal/incidents/{inc}"),
        "/internal/incidents".to_string(),
        format!("/internal/findings/{f}"),
        "/metrics".to_string(),
    ] {
        let resp = h
            .client
            .get(h.url(&path))
            .bearer_auth(&h.key)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::OK, "{path}");
        bodies.push(resp.text().await.unwrap());
    }
    let log = String::from_utf8_lossy(&logs.lock().unwrap()).into_owned();
    assert!(log.contains(&id), "the log capture sees this server");
    for secret in [
        &token,
        &token2,
        &token[4..].to_string(),
        &"webhook-secret-value".to_string(),
        &"query-secret".to_string(),
    ] {
        for b in &bodies {
            assert!(!b.contains(secret.as_str()), "{secret} in a GET body: {b}");
        }
        assert!(!log.contains(secret.as_str()), "{secret} in the server log");
    }
    h.finish().await;
}

on_both_backends!(
    policy_matrix_every_cell_and_every_lowering,
    circuit_breaker_blocks_the_fourth_live_proposal,
    grant_lifecycle_single_use_and_windows,
    concurrent_claims_exactly_one_wins,
    cas_at_claim_refuses_a_moved_target,
    human_approval_and_rejection,
    host_subject_needs_a_fresh_sealed_pre_mutation_envelope,
    grant_token_never_in_gets_lists_or_logs,
);

async fn concurrent_proposals_and_the_breaker_under_contention(db: Db) {
    let Some(h) = Harness::start(db).await else {
        return;
    };
    let inc = open_incident(&h, "contend").await;
    let shared = finding(&h, &inc, "counterfactual_verified", "fp_contend").await;
    let mut own = Vec::new();
    for i in 0..16 {
        own.push(finding(&h, &inc, "counterfactual_verified", &format!("fp_own_{i}")).await);
    }
    let h = Arc::new(h);
    let mut tasks = Vec::new();
    for (i, f) in own.iter().enumerate() {
        // 16 proposers on their own fingerprints, and 16 on one shared one.
        for (f, key) in [
            (f.clone(), format!("own-{i}")),
            (shared.clone(), format!("shared-{i}")),
        ] {
            let (h, inc) = (h.clone(), inc.clone());
            tasks.push(tokio::spawn(async move {
                let r = post(
                    &h,
                    "/internal/remediations/propose",
                    &proposal(&inc, &f, "rollback_deploy", &key),
                )
                .await;
                (key, r)
            }));
        }
    }
    let (mut own_ok, mut shared_ok, mut shared_blocked) = (0, 0, 0);
    for t in tasks {
        let (key, (st, b)) = t.await.unwrap();
        match (key.starts_with("own"), st) {
            (true, StatusCode::CREATED) => own_ok += 1,
            (false, StatusCode::CREATED) => shared_ok += 1,
            (false, StatusCode::TOO_MANY_REQUESTS) => shared_blocked += 1,
            _ => panic!("{key}: {st} {b}"),
        }
    }
    assert_eq!(own_ok, 16);
    assert_eq!(
        (shared_ok, shared_blocked),
        (3, 13),
        "the breaker holds under concurrency"
    );
    Arc::into_inner(h).unwrap().finish().await;
}

on_both_backends!(concurrent_proposals_and_the_breaker_under_contention);
