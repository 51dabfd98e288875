//! Receipts: the six transitions recorded in order against one subject, and
//! every forbidden substitution refused with its own reason. The table at the
//! end fails if a refusal rule has no fixture here.

use std::collections::BTreeSet;

use pstack_envelope::Completeness;
use pstack_store_core::receipts::ReceiptRefusal;
use pstack_store_core::synthetic::Capture;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::on_both_backends;
use crate::support::{Db, Harness, code};

on_both_backends!(receipt_chain_refuses_every_forbidden_substitution);

struct Ctx<'a> {
    h: &'a Harness,
    seen: BTreeSet<String>,
}

impl Ctx<'_> {
    async fn post(&self, body: Value) -> (StatusCode, Value) {
        let resp = self
            .h
            .client
            .post(self.h.url("/v1/receipts"))
            .bearer_auth(&self.h.key)
            .json(&body)
            .send()
            .await
            .unwrap();
        (resp.status(), resp.json().await.unwrap())
    }

    /// Expect a refusal with `rule`, and record that the rule has a fixture.
    async fn refused(&mut self, rule: &str, body: Value) {
        let (status, resp) = self.post(body.clone()).await;
        assert_eq!(
            (status, code(&resp)),
            (StatusCode::UNPROCESSABLE_ENTITY, rule),
            "request {body}\nresponse {resp}"
        );
        assert_eq!(resp["error"]["detail"]["rule"], rule);
        self.seen.insert(rule.to_string());
    }

    async fn recorded(&self, body: Value) -> Value {
        let (status, resp) = self.post(body.clone()).await;
        assert_eq!(
            status,
            StatusCode::CREATED,
            "request {body}\nresponse {resp}"
        );
        resp
    }
}

/// Ship a capture; return its digest.
async fn ship(h: &Harness, c: &Capture) -> String {
    let (digest, bytes) = c.bytes().unwrap();
    h.post_batch(&[bytes]).await;
    digest
}

/// A capture of the same subject, blocked = `blocked`, sequence `seq`.
fn cap(seq: u64, blocked: bool) -> Capture {
    let mut c = Capture::new("node-r", 500, seq);
    c.blocked = blocked;
    c
}

async fn receipt_chain_refuses_every_forbidden_substitution(db: Db) {
    let Some(h) = Harness::start(db).await else {
        return;
    };
    let mut t = Ctx {
        h: &h,
        seen: BTreeSet::new(),
    };
    let ch = "INC-42";

    // Evidence.
    let problem = ship(&h, &cap(10, true)).await;
    let stranger = ship(&h, &Capture::new("node-z", 9, 11)).await;
    let realized_at = cap(20, false).wall_time();
    let before_problem = cap(5, false).wall_time();
    let live = ship(&h, &cap(21, false)).await;
    // A post-change capture that shows exactly the problem again (same facts,
    // later clock): a later capture is not a verification.
    let mut same = cap(10, true).unsealed();
    same.clock.wall_time = cap(22, true).wall_time();
    let same_bytes = serde_json::to_vec(&same.seal().unwrap()).unwrap();
    let same = pstack_testkit::verify(&same_bytes).unwrap().digest;
    h.post_batch(&[same_bytes]).await;
    // An identity_race capture after the change: it attributes nothing.
    let mut race = cap(23, false).unsealed();
    race.completeness = Completeness::IdentityRace;
    race.claims.clear();
    let race_bytes =
        serde_json::to_vec(&race.seal().expect("identity_race fixture is valid")).unwrap();
    let race = pstack_testkit::verify(&race_bytes).unwrap().digest;
    h.post_batch(&[race_bytes]).await;
    let fixed = ship(&h, &cap(24, false)).await;
    let early_soak = ship(&h, &cap(30, false)).await;
    let soaked = ship(&h, &cap(90, false)).await;

    let missing = format!("sha256:{}", "e".repeat(64));

    // ---- refused before anything is recorded ----
    t.refused(
        "no_evidence",
        json!({"kind": "SOURCE_FIXED", "change": ch, "evidence": [], "revision": "abc"}),
    )
    .await;
    t.refused(
        "invalid_digest",
        json!({"kind": "SOURCE_FIXED", "change": ch, "evidence": ["md5:1"], "revision": "abc"}),
    )
    .await;
    t.refused(
        "missing_change",
        json!({"kind": "SOURCE_FIXED", "change": " ", "evidence": [problem], "revision": "abc"}),
    )
    .await;
    t.refused(
        "missing_revision",
        json!({"kind": "SOURCE_FIXED", "change": ch, "evidence": [problem]}),
    )
    .await;
    t.refused("field_not_allowed", json!({"kind": "SOURCE_FIXED", "change": ch, "evidence": [problem], "revision": "abc", "soak_ms": 5})).await;
    t.refused("evidence_not_found", json!({"kind": "SOURCE_FIXED", "change": ch, "evidence": [problem, missing], "revision": "abc"})).await;
    t.refused("evidence_subject_mismatch", json!({"kind": "SOURCE_FIXED", "change": ch, "evidence": [problem, stranger], "revision": "abc"})).await;
    // One layer cannot stand in for another: no MERGED (or VERIFIED) without what precedes it.
    t.refused(
        "missing_prior_receipt",
        json!({"kind": "MERGED", "change": ch, "evidence": [problem], "revision": "m1"}),
    )
    .await;
    t.refused(
        "missing_prior_receipt",
        json!({"kind": "VERIFIED", "change": ch, "evidence": [fixed]}),
    )
    .await;
    // Unknown kinds and members are malformed requests, not refusals.
    let (status, body) = t
        .post(json!({"kind": "DEPLOYED", "change": ch, "evidence": [problem]}))
        .await;
    assert_eq!(
        (status, code(&body)),
        (StatusCode::BAD_REQUEST, "invalid_receipt")
    );

    // ---- SOURCE_FIXED, MERGED ----
    let sf = t.recorded(json!({"kind": "SOURCE_FIXED", "change": ch, "evidence": [problem], "revision": "a1b2c3"})).await;
    let subject = sf["subject_key"].as_str().unwrap().to_string();
    t.refused(
        "already_recorded",
        json!({"kind": "SOURCE_FIXED", "change": ch, "evidence": [problem], "revision": "a1b2c3"}),
    )
    .await;
    t.recorded(
        json!({"kind": "MERGED", "change": ch, "evidence": [problem], "revision": "d4e5f6"}),
    )
    .await;

    // ---- REALIZED ----
    t.refused(
        "missing_realized_at",
        json!({"kind": "REALIZED", "change": ch, "evidence": [live]}),
    )
    .await;
    t.refused(
        "invalid_realized_at",
        json!({"kind": "REALIZED", "change": ch, "evidence": [live], "realized_at": "tuesday"}),
    )
    .await;
    t.refused("realized_before_problem", json!({"kind": "REALIZED", "change": ch, "evidence": [live], "realized_at": before_problem})).await;
    t.refused("not_post_change", json!({"kind": "REALIZED", "change": ch, "evidence": [problem], "realized_at": realized_at})).await;
    t.recorded(
        json!({"kind": "REALIZED", "change": ch, "evidence": [live], "realized_at": realized_at}),
    )
    .await;

    // ---- VERIFIED: needs a post-change envelope of the same subject ----
    t.refused(
        "not_post_change",
        json!({"kind": "VERIFIED", "change": ch, "evidence": [problem]}),
    )
    .await;
    t.refused(
        "evidence_subject_mismatch",
        json!({"kind": "VERIFIED", "change": ch, "evidence": [fixed, stranger]}),
    )
    .await;
    t.refused(
        "evidence_reused",
        json!({"kind": "VERIFIED", "change": ch, "evidence": [live]}),
    )
    .await;
    t.refused(
        "identity_race_evidence",
        json!({"kind": "VERIFIED", "change": ch, "evidence": [race]}),
    )
    .await;
    t.refused(
        "no_observed_change",
        json!({"kind": "VERIFIED", "change": ch, "evidence": [same]}),
    )
    .await;
    t.refused(
        "field_not_allowed",
        json!({"kind": "VERIFIED", "change": ch, "evidence": [fixed], "realized_at": realized_at}),
    )
    .await;
    t.refused(
        "missing_prior_receipt",
        json!({"kind": "SOAKED", "change": ch, "evidence": [soaked], "soak_ms": 60000}),
    )
    .await;
    t.recorded(json!({"kind": "VERIFIED", "change": ch, "evidence": [fixed]}))
        .await;

    // ---- SOAKED ----
    t.refused(
        "missing_soak",
        json!({"kind": "SOAKED", "change": ch, "evidence": [soaked]}),
    )
    .await;
    t.refused(
        "evidence_reused",
        json!({"kind": "SOAKED", "change": ch, "evidence": [fixed, soaked], "soak_ms": 60000}),
    )
    .await;
    t.refused(
        "soak_not_elapsed",
        json!({"kind": "SOAKED", "change": ch, "evidence": [early_soak], "soak_ms": 60000}),
    )
    .await;
    t.recorded(json!({"kind": "SOAKED", "change": ch, "evidence": [soaked], "soak_ms": 60000}))
        .await;

    // ---- CLOSED: the newest envelope, with nothing open ----
    let newest_blocked = ship(&h, &cap(95, true)).await;
    t.refused(
        "not_latest_evidence",
        json!({"kind": "CLOSED", "change": ch, "evidence": [soaked]}),
    )
    .await;
    t.refused(
        "open_unknowns",
        json!({"kind": "CLOSED", "change": ch, "evidence": [newest_blocked]}),
    )
    .await;
    let newest_clear = ship(&h, &cap(96, false)).await;
    let closed = t
        .recorded(
            json!({"kind": "CLOSED", "change": ch, "evidence": [newest_clear], "note": "done"}),
        )
        .await;
    assert_eq!(closed["subject_key"], subject.as_str());
    t.refused(
        "already_recorded",
        json!({"kind": "CLOSED", "change": ch, "evidence": [newest_clear]}),
    )
    .await;

    // The chain reads back in order.
    let (status, list) = h.get(&format!("/v1/receipts?subject={subject}")).await;
    assert_eq!(status, StatusCode::OK);
    let kinds: Vec<&str> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["kind"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds,
        [
            "SOURCE_FIXED",
            "MERGED",
            "REALIZED",
            "VERIFIED",
            "SOAKED",
            "CLOSED"
        ]
    );
    assert_eq!(list["items"][2]["realized_at"], realized_at.as_str());

    // Every refusal rule has a fixture above.
    let all: BTreeSet<String> = ReceiptRefusal::RULES
        .iter()
        .map(|r| r.to_string())
        .collect();
    let untested: Vec<&String> = all.difference(&t.seen).collect();
    assert!(
        untested.is_empty(),
        "refusal rules without a fixture: {untested:?}"
    );
    h.finish().await;
}
