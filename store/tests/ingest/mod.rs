//! Ingest: hostile inputs first, each refused with its precise status and
//! typed reason, nothing partial stored; then batches, replay, concurrency.

use pstack_envelope::Envelope;
use pstack_store_core::ingest::IngestLimits;
use pstack_store_core::keys::{Scope, ScopeSet};
use pstack_store_core::synthetic::Capture;
use pstack_testkit::verify;
use reqwest::StatusCode;
use serde_json::Value;

use crate::on_both_backends;
use crate::support::{Db, Harness, array, code, gzip, sealed};

mod stored_bodies;

on_both_backends!(
    tampered_envelope_is_rejected_with_bad_digest,
    unknown_field_is_rejected,
    float_in_a_fact_is_rejected,
    wrong_api_key_is_refused,
    revoked_key_is_refused_from_its_next_request,
    oversized_bodies_are_refused_with_413,
    malformed_gzip_is_refused,
    malformed_batch_is_refused_whole,
    batch_with_one_bad_item_stores_the_good_ones,
    round_trip_returns_the_exact_sealed_bytes,
    ndjson_and_plain_bodies_are_accepted,
    replay_of_a_batch_stores_nothing_new,
    concurrent_overlapping_batches_store_each_digest_once,
    store_rules_reject_what_the_envelope_crate_admits,
    a_foreign_envelope_is_held_to_the_builders_rules,
);

fn tamper(bytes: &[u8]) -> Vec<u8> {
    // Change one fact value after sealing: the digest no longer matches.
    let text = String::from_utf8(bytes.to_vec()).unwrap();
    let out = text.replacen(
        "\"wchan\":\"fuse_request_send\"",
        "\"wchan\":\"do_nanosleep\"",
        1,
    );
    assert_ne!(out, text, "fixture must change something");
    out.into_bytes()
}

async fn single_rejection(h: &Harness, body: Vec<u8>) -> Vec<String> {
    let (status, resp) = h.post_raw(body, &[]).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{resp}");
    assert_eq!(resp["rejected"], 1);
    assert_eq!(resp["results"][0]["status"], "rejected");
    assert_eq!(h.count().await, 0, "a rejected envelope must not be stored");
    resp["results"][0]["reasons"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["rule"].as_str().unwrap().to_string())
        .collect()
}

async fn tampered_envelope_is_rejected_with_bad_digest(db: Db) {
    let Some(h) = Harness::start(db).await else {
        return;
    };
    let (digest, bytes) = sealed("node-a", 4242, 1);
    let (status, resp) = h.post_raw(tamper(&bytes), &[]).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(resp["results"][0]["reasons"][0]["rule"], "bad_digest");
    assert_eq!(
        resp["results"][0]["digest"],
        digest.as_str(),
        "declared digest echoed for the shipper"
    );
    assert_eq!(h.count().await, 0);
    h.finish().await;
}

async fn unknown_field_is_rejected(db: Db) {
    let Some(h) = Harness::start(db).await else {
        return;
    };
    let (_, bytes) = sealed("node-a", 4242, 1);
    let mut v: Value = serde_json::from_slice(&bytes).unwrap();
    v["subject"]["identity"]["container"] = "abc".into();
    let rules = single_rejection(&h, serde_json::to_vec(&v).unwrap()).await;
    assert_eq!(rules, vec!["unknown_field"]);
    h.finish().await;
}

async fn float_in_a_fact_is_rejected(db: Db) {
    let Some(h) = Harness::start(db).await else {
        return;
    };
    let (_, bytes) = sealed("node-a", 4242, 1);
    let text = String::from_utf8(bytes).unwrap();
    let text = text.replacen("\"last_cpu\":0", "\"last_cpu\":0.5", 1);
    let rules = single_rejection(&h, text.into_bytes()).await;
    assert_eq!(rules, vec!["float"]);
    h.finish().await;
}

async fn wrong_api_key_is_refused(db: Db) {
    let Some(h) = Harness::start(db).await else {
        return;
    };
    let (_, bytes) = sealed("node-a", 4242, 1);
    let wrong = format!("psk_{}_{}", &h.key_id, "0".repeat(64));
    let cases: [(Option<&str>, &str); 4] = [
        (None, "missing_api_key"),
        (Some("Basic dXNlcjpwYXNz"), "missing_api_key"),
        (Some("Bearer not-a-key"), "unknown_api_key"),
        (Some(&format!("Bearer {wrong}")), "unknown_api_key"),
    ];
    for (auth, expected) in cases {
        let mut req = h.client.post(h.url("/v1/envelopes")).body(bytes.clone());
        if let Some(a) = auth {
            req = req.header("authorization", a);
        }
        let resp = req.send().await.unwrap();
        assert_eq!(resp.status(), StatusCode::UNAUTHORIZED, "{auth:?}");
        let body: Value = resp.json().await.unwrap();
        assert_eq!(code(&body), expected, "{auth:?}");
    }
    // Reads need a key too.
    let resp = h.client.get(h.url("/v1/unknowns")).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(h.count().await, 0);
    h.finish().await;
}

async fn revoked_key_is_refused_from_its_next_request(db: Db) {
    let Some(h) = Harness::start(db).await else {
        return;
    };
    let (_, one) = sealed("node-a", 4242, 1);
    let (_, two) = sealed("node-a", 4242, 2);
    let (status, _) = h.post_raw(one, &[]).await;
    assert_eq!(status, StatusCode::CREATED);
    h.store.revoke_key(&h.key_id).await.unwrap();
    let (status, body) = h.post_raw(two, &[]).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(code(&body), "revoked_api_key");
    assert_eq!(h.count().await, 1, "nothing from a revoked key is stored");
    h.finish().await;
}

async fn oversized_bodies_are_refused_with_413(db: Db) {
    let limits = IngestLimits {
        max_body_bytes: 64 << 10,
        max_decoded_bytes: 128 << 10,
        max_items: 4,
        max_envelope_bytes: 4 << 20,
        ..IngestLimits::default()
    };
    let Some(h) = Harness::start_with(db, limits).await else {
        return;
    };
    let items: Vec<Vec<u8>> = (0..5).map(|i| sealed("node-a", 4242, i).1).collect();
    // On the wire: five 20 KiB envelopes, uncompressed.
    let (status, body) = h.post_raw(array(&items), &[]).await;
    assert_eq!(
        (status, code(&body)),
        (StatusCode::PAYLOAD_TOO_LARGE, "body_too_large")
    );
    // After decoding: a small gzip that inflates past the decoded cap.
    let bomb = gzip(&vec![b' '; 1 << 20]);
    let (status, body) = h.post_raw(bomb, &[("content-encoding", "gzip")]).await;
    assert_eq!(
        (status, code(&body)),
        (StatusCode::PAYLOAD_TOO_LARGE, "decoded_body_too_large")
    );
    // Too many items (small ones, each would be rejected anyway).
    let (status, body) = h.post_raw(b"[{},{},{},{},{}]".to_vec(), &[]).await;
    assert_eq!(
        (status, code(&body)),
        (StatusCode::PAYLOAD_TOO_LARGE, "too_many_items")
    );
    assert_eq!(h.count().await, 0);
    h.finish().await;
}

async fn malformed_gzip_is_refused(db: Db) {
    let Some(h) = Harness::start(db).await else {
        return;
    };
    let (_, bytes) = sealed("node-a", 4242, 1);
    let mut gz = gzip(&array(std::slice::from_ref(&bytes)));
    let n = gz.len();
    gz[n / 2] ^= 0xff; // corrupt the deflate stream / CRC
    let (status, body) = h.post_raw(gz, &[("content-encoding", "gzip")]).await;
    assert_eq!(
        (status, code(&body)),
        (StatusCode::BAD_REQUEST, "malformed_gzip")
    );
    let (status, body) = h.post_raw(bytes, &[("content-encoding", "br")]).await;
    assert_eq!(
        (status, code(&body)),
        (
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_content_encoding"
        )
    );
    assert_eq!(h.count().await, 0);
    h.finish().await;
}

async fn malformed_batch_is_refused_whole(db: Db) {
    let Some(h) = Harness::start(db).await else {
        return;
    };
    let (_, a) = sealed("node-a", 4242, 1);
    let (_, b) = sealed("node-a", 4242, 2);
    let mut body = array(&[a, b]);
    body.pop(); // truncated array: cannot be split into items
    let (status, resp) = h.post_raw(body, &[]).await;
    assert_eq!(
        (status, code(&resp)),
        (StatusCode::BAD_REQUEST, "malformed_batch")
    );
    assert_eq!(h.count().await, 0);
    h.finish().await;
}

async fn batch_with_one_bad_item_stores_the_good_ones(db: Db) {
    let Some(h) = Harness::start(db).await else {
        return;
    };
    let good: Vec<(String, Vec<u8>)> = (0..5).map(|i| sealed("node-a", 4242, i)).collect();
    let mut items: Vec<Vec<u8>> = good.iter().map(|g| g.1.clone()).collect();
    items.insert(2, tamper(&sealed("node-a", 4242, 99).1));
    let (_, resp) = h.post_batch(&items).await;
    assert_eq!((resp.accepted, resp.duplicate, resp.rejected), (5, 0, 1));
    let statuses: Vec<&str> = resp.results.iter().map(|r| r.status.as_str()).collect();
    assert_eq!(
        statuses,
        [
            "accepted", "accepted", "rejected", "accepted", "accepted", "accepted"
        ]
    );
    assert_eq!(resp.results[2].index, 2);
    assert_eq!(resp.results[2].reasons[0].rule, "bad_digest");
    let mut expected: Vec<String> = good.iter().map(|g| g.0.clone()).collect();
    expected.sort();
    assert_eq!(
        h.store.all_digests().await.unwrap(),
        expected,
        "exactly the good ones are stored"
    );
    for (i, r) in resp.results.iter().enumerate().filter(|(i, _)| *i != 2) {
        let g = &good[if i < 2 { i } else { i - 1 }];
        assert_eq!(r.digest.as_deref(), Some(g.0.as_str()));
        assert_eq!(
            r.key_id.as_deref(),
            Some(h.key_id.as_str()),
            "the shipping key is recorded"
        );
    }
    h.finish().await;
}

async fn round_trip_returns_the_exact_sealed_bytes(db: Db) {
    let Some(h) = Harness::start(db).await else {
        return;
    };
    // Pretty-printed, as a spool file holds it: formatting must survive too.
    let env: Envelope = Capture::new("node-a", 4242, 1).seal().unwrap();
    let bytes = env.to_json_pretty();
    let (status, resp) = h.post_raw(bytes.clone(), &[]).await;
    assert_eq!(status, StatusCode::CREATED, "{resp}");
    let got = h
        .client
        .get(h.url(&format!("/v1/envelopes/{}", env.digest)))
        .bearer_auth(&h.key)
        .send()
        .await
        .unwrap();
    assert_eq!(got.status(), StatusCode::OK);
    assert_eq!(
        got.headers()["etag"],
        format!("\"{}\"", env.digest).as_str()
    );
    let back = got.bytes().await.unwrap();
    assert_eq!(back.as_ref(), bytes.as_slice(), "byte-for-byte");
    assert_eq!(verify(&back).unwrap().digest, env.digest);
    let (status, body) = h
        .get(&format!("/v1/envelopes/sha256:{}", "0".repeat(64)))
        .await;
    assert_eq!(
        (status, code(&body)),
        (StatusCode::NOT_FOUND, "envelope_not_found")
    );
    let (status, body) = h.get("/v1/envelopes/md5:abc").await;
    assert_eq!(
        (status, code(&body)),
        (StatusCode::BAD_REQUEST, "invalid_digest")
    );
    h.finish().await;
}

async fn ndjson_and_plain_bodies_are_accepted(db: Db) {
    let Some(h) = Harness::start(db).await else {
        return;
    };
    let items: Vec<(String, Vec<u8>)> = (0..3).map(|i| sealed("node-b", 77, i)).collect();
    let mut nd = Vec::new();
    for (_, b) in &items {
        nd.extend_from_slice(b);
        nd.extend_from_slice(b"\r\n");
    }
    let (status, resp) = h
        .post_raw(
            gzip(&nd),
            &[
                ("content-type", "application/x-ndjson"),
                ("content-encoding", "gzip"),
            ],
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{resp}");
    assert_eq!(resp["accepted"], 3);
    // A single envelope already stored answers 200 with the existing record.
    let (status, resp) = h.post_raw(items[0].1.clone(), &[]).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(resp["results"][0]["status"], "duplicate");
    assert_eq!(h.count().await, 3);
    h.finish().await;
}

async fn replay_of_a_batch_stores_nothing_new(db: Db) {
    let Some(h) = Harness::start(db).await else {
        return;
    };
    let items: Vec<Vec<u8>> = (0..20).map(|i| sealed("node-a", 4242, i).1).collect();
    let (_, first) = h.post_batch(&items).await;
    assert_eq!(first.accepted, 20);
    let other = h
        .store
        .create_key("other-node", &ScopeSet::of([Scope::Ingest, Scope::Read]))
        .await
        .unwrap();
    let (status, body) = {
        let resp = h
            .client
            .post(h.url("/v1/envelopes"))
            .bearer_auth(&other.plaintext)
            .header("content-encoding", "gzip")
            .body(gzip(&array(&items)))
            .send()
            .await
            .unwrap();
        (resp.status(), resp.json::<Value>().await.unwrap())
    };
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        (body["accepted"].as_u64(), body["duplicate"].as_u64()),
        (Some(0), Some(20))
    );
    for (a, b) in first
        .results
        .iter()
        .zip(body["results"].as_array().unwrap())
    {
        assert_eq!(b["status"], "duplicate");
        assert_eq!(
            b["received_at"].as_str(),
            a.received_at.as_deref(),
            "answers with the stored record"
        );
        assert_eq!(
            b["key_id"].as_str(),
            Some(h.key_id.as_str()),
            "first shipper stays recorded"
        );
    }
    // A batch that repeats a digest within itself stores it once.
    let new = sealed("node-a", 4242, 100).1;
    let (_, resp) = h.post_batch(&[new.clone(), new]).await;
    assert_eq!((resp.accepted, resp.duplicate), (1, 1));
    assert_eq!(h.count().await, 21);
    h.finish().await;
}

async fn concurrent_overlapping_batches_store_each_digest_once(db: Db) {
    let Some(h) = Harness::start(db).await else {
        return;
    };
    let pool: Vec<(String, Vec<u8>)> = (0..120)
        .map(|i| sealed(&format!("node-{}", i % 7), 1000 + (i % 13) as u32, i))
        .collect();
    let pool = std::sync::Arc::new(pool);
    let h = std::sync::Arc::new(h);
    let mut tasks = Vec::new();
    for client in 0..16usize {
        let pool = pool.clone();
        let h = h.clone();
        tasks.push(tokio::spawn(async move {
            // Each client ships overlapping windows, in its own order.
            let mut accepted = Vec::new();
            for round in 0..3usize {
                let start = (client * 7 + round * 29) % pool.len();
                let mut items: Vec<Vec<u8>> = (0..40)
                    .map(|k| pool[(start + k) % pool.len()].1.clone())
                    .collect();
                if client % 2 == 1 {
                    items.reverse();
                }
                let (_, resp) = h.post_batch(&items).await;
                assert_eq!(resp.rejected, 0);
                accepted.extend(
                    resp.results
                        .into_iter()
                        .filter(|r| r.status == "accepted")
                        .filter_map(|r| r.digest),
                );
            }
            accepted
        }));
    }
    let mut accepted: Vec<String> = Vec::new();
    for t in tasks {
        accepted.extend(t.await.unwrap());
    }
    accepted.sort();
    let stored = h.store.all_digests().await.unwrap();
    let mut unique = accepted.clone();
    unique.dedup();
    assert_eq!(
        accepted.len(),
        unique.len(),
        "a digest was reported accepted twice"
    );
    assert_eq!(
        accepted, stored,
        "every stored digest was accepted exactly once"
    );
    // Every digest shipped by someone is stored.
    let mut shipped: std::collections::BTreeSet<String> = Default::default();
    for client in 0..16usize {
        for round in 0..3usize {
            let start = (client * 7 + round * 29) % pool.len();
            shipped.extend((0..40).map(|k| pool[(start + k) % pool.len()].0.clone()));
        }
    }
    assert_eq!(stored, shipped.into_iter().collect::<Vec<_>>());
    let h = std::sync::Arc::into_inner(h).expect("all clients done");
    h.finish().await;
}

async fn store_rules_reject_what_the_envelope_crate_admits(db: Db) {
    let limits = IngestLimits {
        max_envelope_bytes: 16 << 10,
        ..IngestLimits::default()
    };
    let Some(h) = Harness::start_with(db, limits).await else {
        return;
    };
    // A real date the envelope admits but the store cannot order in time:
    // past 2262 it overflows the i64 nanoseconds the store indexes by.
    // (An impossible date such as Feb 30 is already refused by the envelope.)
    let mut c = Capture::new("node-a", 4242, 1);
    c.threads = 2;
    let mut env = c.unsealed();
    env.clock.wall_time = "3000-01-01T00:00:00Z".into();
    let far_future =
        serde_json::to_vec(&env.seal().expect("the envelope crate admits the shape")).unwrap();
    let (big_digest, big) = sealed("node-a", 4242, 2); // ~20 KiB > 16 KiB cap
    let (small_digest, small) = {
        let mut c = Capture::new("node-a", 4242, 3);
        c.threads = 2;
        c.bytes().unwrap()
    };
    let (_, resp) = h.post_batch(&[far_future, big, small]).await;
    let rules: Vec<&str> = resp
        .results
        .iter()
        .map(|r| r.reasons.first().map_or("-", |x| x.rule.as_str()))
        .collect();
    assert_eq!(rules, ["invalid_wall_time", "envelope_too_large", "-"]);
    assert_eq!(resp.results[2].status, "accepted");
    assert_eq!(h.store.all_digests().await.unwrap(), vec![small_digest]);
    assert_ne!(big_digest, "");
    h.finish().await;
}

/// A collector that is not pstack can seal whatever it likes; ingest holds
/// its envelopes to what pstack's own builder refuses (an unknown no one
/// owns, a next transition with no receipt or abort condition), each refused
/// with the rule named and nothing stored.
async fn a_foreign_envelope_is_held_to_the_builders_rules(db: Db) {
    let Some(h) = Harness::start(db).await else {
        return;
    };
    let (_, bytes) = sealed("node-a", 4242, 1);
    let base: Value = serde_json::from_slice(&bytes).unwrap();
    let reseal = |mut v: Value| {
        v["digest"] = Value::String(pstack_envelope::compute_digest(&v).unwrap());
        serde_json::to_vec(&v).unwrap()
    };
    let unknown = serde_json::json!({
        "id": "u-foreign",
        "owner": "",
        "question": "Which peer reset the stream?",
        "probe": "pstackctl trace tcp --window 10s",
        "blocks": "confirm_transport_fault",
    });
    let mut v = base.clone();
    v["unknowns"] = serde_json::json!([unknown]);
    // Without the empty owner the same envelope is stored: the refusal is
    // the owner's and nothing else's.
    let mut owned = v.clone();
    owned["unknowns"][0]["owner"] = "the node's SRE".into();
    assert_eq!(
        single_rejection(&h, reseal(v)).await,
        vec!["unknown_incomplete"]
    );
    let mut v = base.clone();
    v["next_transition"]["success_receipt"] = "".into();
    assert_eq!(
        single_rejection(&h, reseal(v)).await,
        vec!["next_without_receipt"]
    );
    let mut v = base.clone();
    v["next_transition"]["abort_conditions"] = serde_json::json!([]);
    assert_eq!(
        single_rejection(&h, reseal(v)).await,
        vec!["next_without_abort"]
    );
    let (status, resp) = h.post_raw(reseal(owned), &[]).await;
    assert_eq!(status, StatusCode::CREATED, "{resp}");
    assert_eq!(resp["accepted"], 1, "{resp}");
    h.finish().await;
}
