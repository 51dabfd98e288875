//! Mutation discipline over HTTP (issue 29 item 6, seed 001 AG5/AG9/AG10):
//! MUTATE needs a `complete` or `bounded` pre-mutation envelope of the
//! subject within the one freshness rule the gate also judges by, and the
//! post-mutation capture moves the subject's hypothesis ledger.

use pstack_envelope::{
    Claim, ClaimKind, Completeness, Envelope, Scope, StatusCause, SurfaceStatus,
};
use pstack_store_core::synthetic::Capture;
use reqwest::StatusCode;
use serde_json::{Value, json};

use super::{post, start, step};
use crate::on_both_backends;
use crate::support::{Db, Harness, code};

const S: i64 = 1_000_000_000;
const PID: u32 = 4242;

/// A whole second `back_s` seconds before the real now (the synthetic
/// captures' wall times are whole seconds after their base).
pub(crate) fn past_second(back_s: i64) -> i64 {
    (pstack_store_core::now_ns() / S - back_s) * S
}

/// An envelope of process 4242 on node-a observed at `wall_ns` (a whole
/// second), with `completeness`, the threads `d_tids` in D (a
/// `thread_in_d_state` fact on each one's stat surface) and `claims`;
/// sealed the way a foreign collector would (digest recomputed), so only
/// the store's validator judges it.
pub(crate) fn envelope(
    wall_ns: i64,
    completeness: Completeness,
    d_tids: &[u32],
    claims: Vec<Claim>,
) -> (String, Vec<u8>) {
    let seq = wall_ns / S - 1_796_000_000;
    let mut c = Capture::new("node-a", PID, u64::try_from(seq).expect("after the base"));
    c.blocked = false;
    let mut env: Envelope = c.unsealed();
    env.claims.clear();
    env.unknowns.clear();
    if completeness != Completeness::IdentityRace {
        for tid in d_tids {
            env.claims.push(Claim {
                id: format!("d-{tid}"),
                kind: ClaimKind::Fact,
                code: "thread_in_d_state".into(),
                statement: format!("thread {tid} is in D"),
                surfaces: vec![format!("task/{tid}/stat")],
                scope: Scope::Existential,
                falsifier: None,
            });
        }
    }
    env.claims.extend(claims);
    let last = env.surfaces.len() - 1;
    match completeness {
        Completeness::Bounded => env.surfaces[last].truncated = true,
        Completeness::Partial => {
            let s = &mut env.surfaces[last];
            s.status = SurfaceStatus::Timeout;
            s.cause = Some(StatusCause {
                errno: None,
                message: "helper killed after 250 ms and reaped".into(),
            });
            s.facts.clear();
            s.digest = None;
            s.bytes = 0;
        }
        _ => {}
    }
    env.completeness = completeness;
    let mut v = serde_json::to_value(&env).expect("JSON");
    v["digest"] = Value::String(pstack_envelope::compute_digest(&v).expect("digest"));
    let digest = v["digest"].as_str().unwrap().to_string();
    (digest, serde_json::to_vec(&v).unwrap())
}

/// Ingest one envelope; its digest.
pub(crate) async fn ingest(h: &Harness, (digest, bytes): (String, Vec<u8>)) -> String {
    let (_, r) = h.post_batch(&[bytes]).await;
    assert_eq!(r.accepted, 1, "{:?}", r.results);
    digest
}

/// A hypothesis `code` about thread `tid` (bound to its stat surface).
pub(crate) fn hypothesis(code: &str, tid: u32) -> Claim {
    Claim {
        id: format!("{code}-{tid}"),
        kind: ClaimKind::Hypothesis,
        code: code.into(),
        statement: format!("thread {tid} is in D because {code}"),
        surfaces: vec![format!("task/{tid}/stat")],
        scope: Scope::Existential,
        falsifier: Some(format!(
            "thread {tid} stays in D while {code} does not hold"
        )),
    }
}

/// A run that recorded `digest` in CAPTURE and stands at CHOOSE FALSIFIER.
pub(crate) async fn at_choose_falsifier(h: &Harness, digest: &str) -> String {
    let run = start(h, json!({})).await;
    super::to_choose_falsifier(h, &run, Some(digest)).await;
    run
}

on_both_backends!(
    mutate_refuses_partial_and_identity_race_naming_the_completeness,
    mutate_and_the_gate_judge_freshness_alike_at_the_threshold,
    the_post_mutation_capture_falsifies_confirms_and_leaves_standing,
    retention_keeps_the_envelopes_that_moved_a_hypothesis,
);

/// A MUTATE step is refused on an `identity_race` and on a `partial`
/// pre-mutation envelope, with the typed error naming the completeness, and
/// accepted on `complete` and `bounded` ones of the same age (regression:
/// the run's rule checked the subject and freshness, never completeness).
async fn mutate_refuses_partial_and_identity_race_naming_the_completeness(db: Db) {
    let Some(h) = Harness::start(db).await else {
        return;
    };
    let wall = past_second(30);
    for (completeness, permitted) in [
        (Completeness::IdentityRace, false),
        (Completeness::Partial, false),
        (Completeness::Complete, true),
        (Completeness::Bounded, true),
    ] {
        let d = ingest(&h, envelope(wall, completeness, &[], vec![])).await;
        let run = at_choose_falsifier(&h, &d).await;
        let r = step(&h, &run, json!({"kind": "advance", "step": "mutate"})).await;
        let what = completeness.as_str();
        if permitted {
            assert_eq!(r["verdict"], "permit", "{what}: {r}");
            assert_eq!(r["run"]["current"], "mutate", "{what}");
            assert!(r.get("refusal").is_none(), "{what}: {r}");
            continue;
        }
        assert_eq!(r["verdict"], "block", "{what}: {r}");
        assert_eq!(r["run"]["current"], "choose-falsifier", "{what}");
        let refusal = &r["refusal"];
        assert_eq!(refusal["code"], "pre_mutation_envelope_incomplete", "{r}");
        assert_eq!(refusal["completeness"], what);
        assert_eq!(refusal["field"], "step");
        assert!(
            refusal["message"].as_str().unwrap().contains(what),
            "{refusal}"
        );
        let codes: Vec<&str> = r["events"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|e| e["code"].as_str())
            .collect();
        assert!(codes.contains(&"run/pre-mutation-incomplete"), "{codes:?}");
        // The run records it (a payload-free event naming the completeness).
        let (_, got) = h.get(&format!("/internal/runs/{run}")).await;
        let dev = got["run"]["events"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["code"] == "run/pre-mutation-incomplete")
            .cloned()
            .unwrap();
        assert!(dev["message"].as_str().unwrap().contains(what), "{dev}");
    }
    // None of these envelopes put a hypothesis forward: a known subject
    // with an empty ledger.
    let (d, _) = envelope(wall, Completeness::Complete, &[], vec![]);
    let subject = h.store.envelope_meta(&d).await.unwrap().unwrap().0;
    let (st, ledger) = h
        .get(&format!("/internal/subjects/{subject}/hypotheses"))
        .await;
    assert_eq!(st, StatusCode::OK, "{ledger}");
    assert_eq!(ledger["hypotheses"], json!([]));
    h.finish().await;
}

/// Freshness at, just below and just above the threshold (a process: 120
/// s), judged to the nanosecond on a pinned server clock — the same for a
/// run's MUTATE and the gate's pre-mutation envelope (regression: runs said
/// 120 s, the gate 10 min).
async fn mutate_and_the_gate_judge_freshness_alike_at_the_threshold(db: Db) {
    let Some(h) = Harness::start(db).await else {
        return;
    };
    let wall = past_second(1000);
    let d = ingest(&h, envelope(wall, Completeness::Complete, &[], vec![])).await;
    let subject = h.store.envelope_meta(&d).await.unwrap().unwrap().0;
    let inc = crate::gate::open_incident(&h, "fresh-threshold").await;
    let f = crate::gate::finding(&h, &inc, "counterfactual_verified", "fp_fresh").await;
    let fresh = 120 * S;
    for (age, ok) in [(fresh - 1, true), (fresh, false), (fresh + 1, false)] {
        h.clock.pin(wall + S);
        let run = at_choose_falsifier(&h, &d).await;
        h.clock.pin(wall + age);
        let r = step(&h, &run, json!({"kind": "advance", "step": "mutate"})).await;
        assert_eq!(r["verdict"] == "permit", ok, "age {age} ns: {r}");
        if !ok {
            assert_eq!(r["refusal"]["code"], "pre_mutation_envelope_stale", "{r}");
            assert!(r["refusal"].get("completeness").is_none());
        }
        let (st, p) = post(
            &h,
            "/internal/remediations/propose",
            &json!({
                "incidentId": inc, "findingId": f, "action": "apply_config",
                "target": {"subject": subject}, "expectedCurrentState": {},
                "preMutationEnvelope": d, "idempotencyKey": format!("fresh-{age}"),
            }),
        )
        .await;
        if ok {
            assert_eq!(st, StatusCode::CREATED, "age {age} ns: {p}");
        } else {
            assert_eq!(
                (st, code(&p)),
                (
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "pre_mutation_envelope_stale"
                ),
                "age {age} ns: {p}"
            );
        }
    }
    // The gate refuses an identity race like the run does.
    h.clock.pin(wall + 2 * S);
    let race = ingest(
        &h,
        envelope(wall + S, Completeness::IdentityRace, &[], vec![]),
    )
    .await;
    let (st, p) = post(
        &h,
        "/internal/remediations/propose",
        &json!({
            "incidentId": inc, "findingId": f, "action": "apply_config",
            "target": {"subject": subject}, "expectedCurrentState": {},
            "preMutationEnvelope": race, "idempotencyKey": "fresh-race",
        }),
    )
    .await;
    assert_eq!(
        (st, code(&p)),
        (
            StatusCode::UNPROCESSABLE_ENTITY,
            "pre_mutation_envelope_incomplete"
        ),
        "{p}"
    );
    assert!(
        p["error"]["message"]
            .as_str()
            .unwrap()
            .contains("identity_race")
    );
    h.clock.unpin();
    h.finish().await;
}

/// The ledger of a subject after one run: the post-mutation capture
/// falsifies one hypothesis (its effect persists without it), confirms
/// another (an inference with its code's confirming code) and leaves a
/// third standing (asserted again), each with the digests that moved it —
/// on the ledger route and in the run report (regression: no ledger; the
/// diff listed claims new and resolved only).
async fn the_post_mutation_capture_falsifies_confirms_and_leaves_standing(db: Db) {
    let Some(h) = Harness::start(db).await else {
        return;
    };
    let fuse = "fuse_server_not_answering";
    let frozen = "cgroup_frozen";
    let (a, b, c) = (PID + 1, PID + 2, PID + 3);
    let pre_wall = past_second(1000);
    h.clock.pin(pre_wall + 10 * S);
    let pre = ingest(
        &h,
        envelope(
            pre_wall,
            Completeness::Complete,
            &[a, b, c],
            vec![
                hypothesis(fuse, a),
                hypothesis(frozen, b),
                hypothesis(fuse, c),
            ],
        ),
    )
    .await;
    let run = at_choose_falsifier(&h, &pre).await;
    let subject = h.store.envelope_meta(&pre).await.unwrap().unwrap().0;
    let r = step(&h, &run, json!({"kind": "advance", "step": "mutate"})).await;
    assert_eq!(r["verdict"], "permit", "{r}");
    step(
        &h,
        &run,
        json!({"kind": "advance", "step": "capture-again"}),
    )
    .await;
    // After the mutation: a still in D but no longer in the FUSE wait; b's
    // freezer reads frozen (the confirming inference); c unchanged.
    let post_wall = pre_wall + 20 * S;
    h.clock.pin(pre_wall + 30 * S);
    let post_env = ingest(
        &h,
        envelope(
            post_wall,
            Completeness::Complete,
            &[a, b, c],
            vec![
                Claim {
                    id: "frozen-b".into(),
                    kind: ClaimKind::Inference,
                    code: "d_state_from_cgroup_freezer".into(),
                    statement: format!("thread {b} is in D because its cgroup is frozen"),
                    surfaces: vec![format!("task/{b}/stat")],
                    scope: Scope::Existential,
                    falsifier: None,
                },
                hypothesis(fuse, c),
            ],
        ),
    )
    .await;
    let r = step(&h, &run, json!({"kind": "observe", "envelope": post_env})).await;
    assert_eq!(r["verdict"], "permit", "{r}");

    let (st, ledger) = h
        .get(&format!("/internal/subjects/{subject}/hypotheses"))
        .await;
    assert_eq!(st, StatusCode::OK, "{ledger}");
    let by_code_tid = |code: &str, tid: u32| -> Value {
        ledger["hypotheses"]
            .as_array()
            .unwrap()
            .iter()
            .find(|x| x["code"] == code && x["surfaces"] == json!([format!("task/{tid}/stat")]))
            .cloned()
            .unwrap_or_else(|| panic!("{code} on {tid}: {ledger}"))
    };
    let moves = |x: &Value| -> Vec<(String, String, String)> {
        x["moves"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| {
                (
                    m["digest"].as_str().unwrap().to_string(),
                    m["to"].as_str().unwrap().to_string(),
                    m["rule"].as_str().unwrap().to_string(),
                )
            })
            .collect()
    };
    let opened = (pre.clone(), "standing".to_string(), "opened".to_string());
    let falsified = by_code_tid(fuse, a);
    assert_eq!(falsified["state"], "falsified");
    assert_eq!(
        moves(&falsified),
        [
            opened.clone(),
            (
                post_env.clone(),
                "falsified".into(),
                "falsified_effect_persists".into()
            )
        ]
    );
    let confirmed = by_code_tid(frozen, b);
    assert_eq!(confirmed["state"], "confirmed");
    assert_eq!(
        moves(&confirmed),
        [
            opened.clone(),
            (
                post_env.clone(),
                "confirmed".into(),
                "confirmed_by_claim".into()
            )
        ]
    );
    let standing = by_code_tid(fuse, c);
    assert_eq!(standing["state"], "standing");
    assert_eq!(moves(&standing), [opened]);
    assert_eq!(
        ledger["counts"],
        json!({"confirmed": 1, "falsified": 1, "standing": 1})
    );
    assert_eq!(falsified["moves"][1]["run"], run.as_str());

    // Filter, and typed refusals.
    let (_, only) = h
        .get(&format!(
            "/internal/subjects/{subject}/hypotheses?state=falsified"
        ))
        .await;
    assert_eq!(only["hypotheses"].as_array().unwrap().len(), 1);
    let (st, e) = h
        .get(&format!(
            "/internal/subjects/{subject}/hypotheses?state=dead"
        ))
        .await;
    assert_eq!((st, code(&e)), (StatusCode::BAD_REQUEST, "invalid_query"));
    let (st, e) = h.get("/internal/subjects/pid-4242/hypotheses").await;
    assert_eq!((st, code(&e)), (StatusCode::BAD_REQUEST, "invalid_subject"));
    let nobody = format!("sha256:{}", "e".repeat(64));
    let (st, e) = h
        .get(&format!("/internal/subjects/{nobody}/hypotheses"))
        .await;
    assert_eq!((st, code(&e)), (StatusCode::NOT_FOUND, "subject_not_found"));

    // The run report carries the same, as keys, states and digests.
    let (st, report) = h
        .get(&format!(
            "/internal/runs/{run}/report?executorKind=autonomous&envClass=ci"
        ))
        .await;
    assert_eq!(st, StatusCode::OK, "{report}");
    let reported: Vec<(String, String, Vec<String>)> = report["hypotheses"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| {
            (
                x["hypothesis"].as_str().unwrap().to_string(),
                x["state"].as_str().unwrap().to_string(),
                x["moved_by"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|d| d.as_str().unwrap().to_string())
                    .collect(),
            )
        })
        .collect();
    for (x, state, by) in [
        (&falsified, "falsified", vec![pre.clone(), post_env.clone()]),
        (&confirmed, "confirmed", vec![pre.clone(), post_env.clone()]),
        (&standing, "standing", vec![pre.clone()]),
    ] {
        let key = x["key"].as_str().unwrap().to_string();
        assert!(
            reported.contains(&(key.clone(), state.to_string(), by)),
            "{key} {state}: {reported:?}"
        );
    }
    assert!(
        !report.to_string().contains(fuse),
        "no code leaves: {report}"
    );
    // 20 s from the run's start to the post-mutation capture's record.
    assert_eq!(
        report["acceptance"]["first_discriminating_observation_bucket"],
        "<1m"
    );
    h.clock.unpin();
    h.finish().await;
}

/// The ledger says which envelopes moved a hypothesis: retention keeps
/// them, as it keeps what receipts cite.
async fn retention_keeps_the_envelopes_that_moved_a_hypothesis(db: Db) {
    let Some(h) = Harness::start(db).await else {
        return;
    };
    let cited = ingest(
        &h,
        envelope(
            past_second(100),
            Completeness::Complete,
            &[PID + 1],
            vec![hypothesis("fuse_server_not_answering", PID + 1)],
        ),
    )
    .await;
    let uncited = ingest(
        &h,
        envelope(past_second(99), Completeness::Complete, &[], vec![]),
    )
    .await;
    let run = start(&h, json!({})).await;
    step(&h, &run, json!({"kind": "observe", "envelope": cited})).await;
    let report = h
        .store
        .apply_retention(
            &pstack_store_core::db::RetentionPolicy {
                max_age: Some(std::time::Duration::from_secs(3600)),
                max_bytes: None,
            },
            pstack_store_core::now_ns() + 86_400 * S,
        )
        .await
        .unwrap();
    assert_eq!(report.deleted, 1, "{report:?}");
    assert_eq!(h.store.all_digests().await.unwrap(), vec![cited]);
    assert_ne!(uncited, "");
    h.finish().await;
}
