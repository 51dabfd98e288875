//! Both ends of a transfer joined in the store (issue 12, item 4): real
//! sealed stream and storage-transfer envelopes shipped over HTTP by two
//! nodes (two API keys), joined at ingest, read back with
//! `GET /v1/transfers/{id}`, `GET /v1/envelopes/{digest}/transfer` and
//! `pstack-store transfer`.

use std::process::{Command, Output};

use pstack_store_core::keys::ScopeSet;
use pstack_store_core::synthetic::{StreamEnd, StreamLink, TransferEnd};
use reqwest::StatusCode;
use serde_json::Value;

use crate::on_both_backends;
use crate::support::{Db, Harness, code};

on_both_backends!(
    mirrored_pair_in_two_netns_is_joined_with_both_verdicts,
    arrival_order_does_not_change_the_transfer,
    a_peer_fact_alone_names_the_other_side_and_silence_is_unknown,
    non_mirrored_and_out_of_window_ends_are_not_joined,
    same_transfer_id_from_two_nodes_is_joined,
    reingest_is_idempotent,
    a_flight_recorded_end_joins_a_live_one,
    a_long_side_is_cut_to_its_newest_ends_and_says_so,
    envelopes_stored_before_the_migration_are_joined_by_it,
    ends_arriving_at_once_are_joined,
    retention_takes_the_ends_with_their_envelopes,
    unknown_and_malformed_ids_are_typed_errors,
    cli_shows_both_ends,
);

/// 2026-12-01T00:00:00Z, ns.
const T0: i64 = 1_796_083_200_000_000_000;
const S: i64 = 1_000_000_000;
const NS_A: &str = "4026532001";
const NS_B: &str = "4026532002";
const A_EP: &str = "10.77.0.1:40000";
const B_EP: &str = "10.77.0.2:10001";

/// A node that ships with its own API key.
struct Node {
    key: String,
}

async fn node(h: &Harness, name: &str) -> Node {
    let k = h
        .store
        .create_key(name, &ScopeSet::legacy())
        .await
        .expect("create key");
    Node { key: k.plaintext }
}

/// POST one envelope as `node`; the per-item status.
async fn ship(h: &Harness, node: &Node, bytes: &[u8]) -> String {
    ship_batch(h, node, &[bytes.to_vec()]).await.remove(0)
}

async fn ship_batch(h: &Harness, node: &Node, items: &[Vec<u8>]) -> Vec<String> {
    let resp = h
        .client
        .post(h.url("/v1/envelopes"))
        .bearer_auth(&node.key)
        .header("content-type", "application/json")
        .body(crate::support::array(items))
        .send()
        .await
        .expect("POST /v1/envelopes");
    let status = resp.status();
    let body: Value = resp.json().await.expect("JSON");
    assert_eq!(status, StatusCode::OK, "{body}");
    body["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            assert_ne!(r["status"], "rejected", "{r}");
            r["status"].as_str().unwrap().to_string()
        })
        .collect()
}

/// (digest, bytes) of a sealed envelope.
type Sealed = (String, Vec<u8>);

fn sealed(e: &StreamEnd) -> Sealed {
    e.bytes()
        .expect("the builder seals a valid stream envelope")
}

/// Node A's end: it received the RST and sees the peer's window at zero.
fn end_a() -> StreamEnd {
    let mut a = StreamEnd::new(A_EP, B_EP, NS_A, 0x1111_0001, T0);
    a.retrans = 12;
    a.rto = 3;
    a.rst_received = true;
    a.peer_zero_window = true;
    a
}

/// Node B's end, 4 s later: it sent the RST; its own window is at zero.
fn end_b() -> StreamEnd {
    let mut b = StreamEnd::new(B_EP, A_EP, NS_B, 0x2222_0002, T0 + 4 * S);
    b.rst_sent = true;
    b.local_zero_window = true;
    b
}

/// `GET /v1/envelopes/{digest}/transfer`.
async fn transfer_of(h: &Harness, digest: &str) -> (StatusCode, Value) {
    h.get(&format!("/v1/envelopes/{digest}/transfer")).await
}

/// The side (`a`/`b`) holding `digest`.
fn side_of(t: &Value, digest: &str) -> String {
    t["sides"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| {
            s["ends"]
                .as_array()
                .unwrap()
                .iter()
                .any(|e| e["envelope"] == digest)
        })
        .map(|s| s["side"].as_str().unwrap().to_string())
        .unwrap_or_else(|| panic!("{digest} is on no side of {t}"))
}

fn side<'a>(t: &'a Value, name: &str) -> &'a Value {
    t["sides"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["side"] == name)
        .unwrap()
}

async fn mirrored_pair_in_two_netns_is_joined_with_both_verdicts(db: Db) {
    let Some(h) = Harness::start(db).await else {
        return;
    };
    let (na, nb) = (node(&h, "node-a").await, node(&h, "node-b").await);
    let (da, ba) = sealed(&end_a());
    let (db_, bb) = sealed(&end_b());
    assert_eq!(ship(&h, &na, &ba).await, "accepted");
    let (status, body) = transfer_of(&h, &da).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "one end alone: {body}");
    assert_eq!(code(&body), "transfer_not_found");
    assert_eq!(ship(&h, &nb, &bb).await, "accepted");

    let (status, of_a) = transfer_of(&h, &da).await;
    assert_eq!(status, StatusCode::OK, "{of_a}");
    let id = of_a["transfer"]["id"].as_str().unwrap().to_string();
    let (status, of_b) = transfer_of(&h, &db_).await;
    assert_eq!(status, StatusCode::OK, "{of_b}");
    assert_eq!(of_b["transfer_ids"], serde_json::json!([id]));

    let (status, t) = h.get(&format!("/v1/transfers/{id}")).await;
    assert_eq!(status, StatusCode::OK, "{t}");
    assert_eq!(t["basis"], "mirrored_4tuple");
    assert_eq!(t["sides"].as_array().unwrap().len(), 2, "{t}");
    let (sa, sb) = (side_of(&t, &da), side_of(&t, &db_));
    assert_ne!(sa, sb);
    let a = side(&t, &sa);
    let b = side(&t, &sb);
    assert_eq!(a["nodes"], serde_json::json!(["node-a"]));
    assert_eq!(b["nodes"], serde_json::json!(["node-b"]));
    assert_eq!(a["netns"], serde_json::json!([NS_A]));
    assert_eq!(b["netns"], serde_json::json!([NS_B]));
    assert_eq!(a["local"], serde_json::json!([A_EP]));
    assert_eq!(a["remote"], serde_json::json!([B_EP]));
    assert_eq!(b["local"], serde_json::json!([B_EP]));
    let ca = &a["ends"][0]["counters"];
    assert_eq!(ca["tcp_delta"]["total_retrans"], 12, "{ca}");
    assert_eq!(ca["tcp_delta"]["total_rto"], 3, "{ca}");
    assert_eq!(
        ca["tcp_info_end"]["snd_wnd"], 0,
        "A sees B's window at zero"
    );
    assert_eq!(ca["ebpf"]["resets_received"], 1);
    let cb = &b["ends"][0]["counters"];
    assert_eq!(cb["ebpf"]["resets_sent"], 1);
    assert_eq!(cb["tcp_info_end"]["rcv_wnd"], 0);

    // B sent the RST (B says so, and A received it from its peer); B's
    // receive window was the zero one (B's own fact, A's view of its peer).
    let v = &t["verdicts"];
    assert_eq!(v["rst_sent_by"]["side"], sb.as_str(), "{v}");
    assert_eq!(v["zero_window_on"]["side"], sb.as_str(), "{v}");
    let because: Vec<(&str, &str)> = v["rst_sent_by"]["because"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| {
            (
                b["stated_by"].as_str().unwrap(),
                b["code"].as_str().unwrap(),
            )
        })
        .collect();
    assert!(
        because.contains(&(sb.as_str(), "rst_sent_by_local")),
        "{because:?}"
    );
    assert!(
        because.contains(&(sa.as_str(), "rst_received_from_peer")),
        "{because:?}"
    );
    h.finish().await;
}

async fn arrival_order_does_not_change_the_transfer(db: Db) {
    // The same two ends into two stores, in both orders: the same transfer.
    let mut ids = Vec::new();
    for reversed in [false, true] {
        let Some(h) = Harness::start(db).await else {
            return;
        };
        let (na, nb) = (node(&h, "node-a").await, node(&h, "node-b").await);
        let (da, ba) = sealed(&end_a());
        let (db_, bb) = sealed(&end_b());
        if reversed {
            ship(&h, &nb, &bb).await;
            ship(&h, &na, &ba).await;
        } else {
            ship(&h, &na, &ba).await;
            ship(&h, &nb, &bb).await;
        }
        let (status, of) = transfer_of(&h, &db_).await;
        assert_eq!(status, StatusCode::OK, "reversed={reversed}: {of}");
        let t = &of["transfer"];
        assert_eq!(
            t["verdicts"]["rst_sent_by"]["side"],
            side_of(t, &db_).as_str()
        );
        ids.push((
            t["id"].as_str().unwrap().to_string(),
            side_of(t, &da),
            side_of(t, &db_),
        ));
        h.finish().await;
    }
    assert_eq!(ids[0], ids[1], "id and sides are independent of arrival");

    // Both ends in one batch.
    let Some(h) = Harness::start(db).await else {
        return;
    };
    let na = node(&h, "node-a").await;
    let (da, ba) = sealed(&end_a());
    let (_, bb) = sealed(&end_b());
    ship_batch(&h, &na, &[bb, ba]).await;
    let (status, of) = transfer_of(&h, &da).await;
    assert_eq!(status, StatusCode::OK, "one batch: {of}");
    assert_eq!(of["transfer"]["id"], ids[0].0.as_str());
    h.finish().await;
}

async fn a_peer_fact_alone_names_the_other_side_and_silence_is_unknown(db: Db) {
    let Some(h) = Harness::start(db).await else {
        return;
    };
    let (na, nb) = (node(&h, "node-a").await, node(&h, "node-b").await);
    // A received a RST; B's capture says nothing about resets (no eBPF fact)
    // and neither side reports a zero window.
    let mut a = StreamEnd::new(A_EP, B_EP, NS_A, 77, T0);
    a.rst_received = true;
    let b = StreamEnd::new(B_EP, A_EP, NS_B, 88, T0 + S);
    let (da, ba) = sealed(&a);
    let (db_, bb) = sealed(&b);
    ship(&h, &na, &ba).await;
    ship(&h, &nb, &bb).await;
    let (status, of) = transfer_of(&h, &da).await;
    assert_eq!(status, StatusCode::OK, "{of}");
    let t = &of["transfer"];
    let v = &t["verdicts"];
    assert_eq!(
        v["rst_sent_by"]["side"],
        side_of(t, &db_).as_str(),
        "A received it from its peer: B sent it ({v})"
    );
    assert_eq!(v["zero_window_on"]["side"], "unknown", "{v}");
    assert_eq!(v["zero_window_on"]["because"], serde_json::json!([]));

    // Neither side says anything about a RST: unknown, not a guess.
    let c = StreamEnd::new("10.77.0.1:40001", B_EP, NS_A, 99, T0);
    let d = StreamEnd::new(B_EP, "10.77.0.1:40001", NS_B, 100, T0);
    let (dc, bc) = sealed(&c);
    ship(&h, &na, &bc).await;
    ship(&h, &nb, &sealed(&d).1).await;
    let (status, of) = transfer_of(&h, &dc).await;
    assert_eq!(status, StatusCode::OK, "{of}");
    assert_eq!(of["transfer"]["verdicts"]["rst_sent_by"]["side"], "unknown");
    h.finish().await;
}

async fn non_mirrored_and_out_of_window_ends_are_not_joined(db: Db) {
    let Some(h) = Harness::start(db).await else {
        return;
    };
    let (na, nb) = (node(&h, "node-a").await, node(&h, "node-b").await);
    let (da, ba) = sealed(&end_a());
    ship(&h, &na, &ba).await;
    // Same addresses, another client port: a different connection.
    let other_port = StreamEnd::new(B_EP, "10.77.0.1:40002", NS_B, 5, T0 + S);
    // Same direction as A (not mirrored), from another netns; captured well
    // before everything else so that it mirrors none of the later ends.
    let same_way = StreamEnd::new(A_EP, B_EP, NS_B, 6, T0 - 300 * S);
    // Mirrored, but captured after A's window and the 120 s join window:
    // A ends at T0 + 10 s; this one starts at T0 + 10 s + 121 s.
    let too_late = StreamEnd::new(B_EP, A_EP, NS_B, 7, T0 + 131 * S);
    let mut digests = Vec::new();
    for e in [&other_port, &same_way, &too_late] {
        let (d, b) = sealed(e);
        assert_eq!(ship(&h, &nb, &b).await, "accepted");
        digests.push(d);
    }
    for d in digests.iter().chain([&da]) {
        let (status, body) = transfer_of(&h, d).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{d} joined: {body}");
        assert_eq!(code(&body), "transfer_not_found", "{body}");
    }
    // At the edge of the window (starts 119 s after A's end): joined.
    let (dl, bl) = sealed(&StreamEnd::new(B_EP, A_EP, NS_B, 8, T0 + 129 * S));
    ship(&h, &nb, &bl).await;
    let (status, body) = transfer_of(&h, &dl).await;
    assert_eq!(status, StatusCode::OK, "within the join window: {body}");
    let t = &body["transfer"];
    assert_ne!(
        side_of(t, &da),
        side_of(t, &dl),
        "A and the late end: two sides"
    );
    h.finish().await;
}

fn transfer_end(id: &str, role: &str, start: i64, links: Vec<StreamLink>) -> (String, Vec<u8>) {
    TransferEnd {
        transfer_id: id.into(),
        role: role.into(),
        start_ns: start,
        links,
        net_ns: "4026532100".into(),
    }
    .bytes()
    .expect("the builder seals a valid storage_transfer envelope")
}

async fn same_transfer_id_from_two_nodes_is_joined(db: Db) {
    let Some(h) = Harness::start(db).await else {
        return;
    };
    let (ns_, nt) = (node(&h, "node-s").await, node(&h, "node-t").await);
    let link = |d: &str, s: &str, t: &str, claims: &[&str]| StreamLink {
        digest: d.to_string(),
        src: s.to_string(),
        dst: t.to_string(),
        flow_id: "4242".to_string(),
        claims: claims.iter().map(|c| c.to_string()).collect(),
    };
    let stream_s = format!("sha256:{}", "a".repeat(64));
    let stream_t = format!("sha256:{}", "b".repeat(64));
    // The source node's capture: its stream was reset by the peer.
    let (ds, bs) = transfer_end(
        "pvc-7/pvc-7-r-t",
        "source",
        T0,
        vec![link(
            &stream_s,
            "10.42.0.5:10001",
            "10.42.1.7:51000",
            &["fact:rst_received_from_peer", "fact:flow_retransmits"],
        )],
    );
    // The target node's capture, an hour later (no time window for a
    // transfer id): it sent the RST.
    let (dt, bt) = transfer_end(
        "pvc-7/pvc-7-r-t",
        "target",
        T0 + 3600 * S,
        vec![link(
            &stream_t,
            "10.42.1.7:51000",
            "10.42.0.5:10001",
            &["fact:rst_sent_by_local"],
        )],
    );
    // Another rebuild, and the same rebuild captured again by the source
    // node only: neither is joined to anything.
    let (dx, bx) = transfer_end("pvc-8/pvc-8-r-x", "target", T0, vec![]);
    let (ds2, bs2) = transfer_end("pvc-9/pvc-9-r-y", "source", T0, vec![]);
    let (ds3, bs3) = transfer_end("pvc-9/pvc-9-r-y", "source", T0 + S, vec![]);
    ship(&h, &ns_, &bs).await;
    ship(&h, &ns_, &bs2).await;
    ship(&h, &ns_, &bs3).await;
    ship(&h, &nt, &bx).await;
    let (status, _) = transfer_of(&h, &ds).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "one node's envelope alone");
    ship(&h, &nt, &bt).await;

    let (status, of) = transfer_of(&h, &dt).await;
    assert_eq!(status, StatusCode::OK, "{of}");
    let t = &of["transfer"];
    assert_eq!(t["basis"], "transfer_id");
    assert_eq!(t["join_key"], "pvc-7/pvc-7-r-t");
    let (ss, st) = (side_of(t, &ds), side_of(t, &dt));
    assert_ne!(ss, st);
    assert_eq!(side(t, &ss)["nodes"], serde_json::json!(["node-s"]));
    assert_eq!(side(t, &st)["nodes"], serde_json::json!(["node-t"]));
    assert_eq!(side(t, &ss)["roles"], serde_json::json!(["source"]));
    assert_eq!(
        side(t, &st)["ends"][0]["linked_streams"],
        serde_json::json!([stream_t])
    );
    assert_eq!(t["verdicts"]["rst_sent_by"]["side"], st.as_str(), "{t}");
    assert_eq!(t["verdicts"]["zero_window_on"]["side"], "unknown");
    for d in [&dx, &ds2, &ds3] {
        let (status, body) = transfer_of(&h, d).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{d}: {body}");
    }
    h.finish().await;
}

async fn ends_arriving_at_once_are_joined(db: Db) {
    // Each pair's two ends are shipped concurrently by their two nodes: on
    // PostgreSQL neither linking transaction may miss the other's row.
    let Some(h) = Harness::start(db).await else {
        return;
    };
    let (na, nb) = (node(&h, "node-a").await, node(&h, "node-b").await);
    let pairs: Vec<(Sealed, Sealed)> = (0..24u64)
        .map(|i| {
            let a_ep = format!("10.77.0.1:{}", 41_000 + i);
            let a = StreamEnd::new(&a_ep, B_EP, NS_A, 1_000 + i, T0 + i as i64 * S);
            let b = StreamEnd::new(B_EP, &a_ep, NS_B, 2_000 + i, T0 + i as i64 * S);
            (sealed(&a), sealed(&b))
        })
        .collect();
    let (h, na, nb) = (
        std::sync::Arc::new(h),
        std::sync::Arc::new(na),
        std::sync::Arc::new(nb),
    );
    let mut tasks = Vec::new();
    for ((_, ba), (_, bb)) in pairs.iter().cloned() {
        for (n, bytes) in [(na.clone(), ba), (nb.clone(), bb)] {
            let h = h.clone();
            tasks.push(tokio::spawn(async move { ship(&h, &n, &bytes).await }));
        }
    }
    for t in tasks {
        assert_eq!(t.await.unwrap(), "accepted");
    }
    let mut lost = Vec::new();
    for ((da, _), (db_, _)) in &pairs {
        let (status, of) = transfer_of(&h, da).await;
        if status != StatusCode::OK {
            lost.push(da.clone());
            continue;
        }
        assert_ne!(side_of(&of["transfer"], da), side_of(&of["transfer"], db_));
    }
    assert!(
        lost.is_empty(),
        "{} of {} pairs not joined",
        lost.len(),
        pairs.len()
    );
    let Ok(h) = std::sync::Arc::try_unwrap(h) else {
        panic!("every task ended")
    };
    h.finish().await;
}

/// Turn a fresh store back into one from before the transfer join: its
/// tables and its migration record (v5) gone. The later steps stay
/// applied; the store runs every unrecorded step, so reopening runs v5
/// alone, over the envelopes already stored.
async fn downgrade_to_v4(dir: &Option<tempfile::TempDir>, pg: &Option<(String, String)>) {
    crate::support::run_sql(
        dir,
        pg,
        "DROP TABLE transfer_ends; DROP TABLE transfers; DROP TABLE transfer_candidates;
         DELETE FROM pstack_schema_migrations WHERE version = 5;",
    )
    .await;
}

async fn envelopes_stored_before_the_migration_are_joined_by_it(db: Db) {
    let Some((store, dir, pg)) = crate::support::fresh_store(db).await else {
        return;
    };
    let verified = |bytes: Vec<u8>| match pstack_store_core::ingest::verify_item(
        bytes.into(),
        &pstack_store_core::ingest::IngestLimits::default(),
    ) {
        pstack_store_core::ingest::ItemVerdict::Verified(v) => *v,
        pstack_store_core::ingest::ItemVerdict::Rejected(r) => panic!("{:?}", r.reasons),
    };
    let ka = store
        .create_key("node-a", &ScopeSet::legacy())
        .await
        .unwrap();
    let kb = store
        .create_key("node-b", &ScopeSet::legacy())
        .await
        .unwrap();
    let (da, ba) = sealed(&end_a());
    let (db_, bb) = sealed(&end_b());
    let (a, b) = (verified(ba), verified(bb));
    store.ingest(&[&a], &ka.id, T0).await.unwrap();
    store.ingest(&[&b], &kb.id, T0).await.unwrap();
    store.close().await;
    downgrade_to_v4(&dir, &pg).await;
    let again = crate::support::reopen(&dir, &pg).await;
    assert_eq!(
        again.schema_version().await.unwrap(),
        pstack_store_core::db::SCHEMA_VERSION
    );
    let ids = again.transfers_of(&da).await.unwrap();
    assert_eq!(ids.len(), 1, "joined when the migration ran");
    assert_eq!(again.transfers_of(&db_).await.unwrap(), ids);
    let row = again.transfer(&ids[0]).await.unwrap().unwrap();
    assert_eq!(row.ends.len(), 2);
    again.close().await;
    crate::support::drop_schema(pg).await;
}

async fn a_long_side_is_cut_to_its_newest_ends_and_says_so(db: Db) {
    let Some(h) = Harness::start(db).await else {
        return;
    };
    let (na, nb) = (node(&h, "node-a").await, node(&h, "node-b").await);
    // 105 captures of A's socket, one a second, all within the join window
    // of B's one capture.
    let a: Vec<Sealed> = (0..105)
        .map(|i| sealed(&StreamEnd::new(A_EP, B_EP, NS_A, 31, T0 + i * S)))
        .collect();
    let items: Vec<Vec<u8>> = a.iter().map(|x| x.1.clone()).collect();
    ship_batch(&h, &na, &items).await;
    let (db_, bb) = sealed(&StreamEnd::new(B_EP, A_EP, NS_B, 32, T0 + 50 * S));
    ship(&h, &nb, &bb).await;
    let (status, of) = transfer_of(&h, &db_).await;
    assert_eq!(status, StatusCode::OK, "{of}");
    let t = &of["transfer"];
    let sa = side(t, &side_of(t, &a[104].0));
    assert_eq!(sa["ends_total"], 105);
    let shown: Vec<&str> = sa["ends"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["envelope"].as_str().unwrap())
        .collect();
    assert_eq!(shown.len(), 100);
    let newest: Vec<&str> = a[5..].iter().map(|x| x.0.as_str()).collect();
    assert_eq!(shown, newest, "the newest 100, oldest first");
    assert_eq!(side(t, &side_of(t, &db_))["ends_total"], 1);
    h.finish().await;
}

async fn a_flight_recorded_end_joins_a_live_one(db: Db) {
    // A's pstackd sealed its flight record of the flow when the reset fired
    // its tcp_reset rule; B's end is a live transport window.
    let Some(h) = Harness::start(db).await else {
        return;
    };
    let (na, nb) = (node(&h, "node-a").await, node(&h, "node-b").await);
    let mut a = StreamEnd::new(A_EP, B_EP, NS_A, 4_001, T0);
    a.recorded = true;
    a.window_ms = 60_000;
    a.retrans = 9;
    a.rst_received = true;
    let (da, ba) = sealed(&a);
    let mut b = StreamEnd::new(B_EP, A_EP, NS_B, 4_002, T0 + 30 * S);
    b.rst_sent = true;
    let (db_, bb) = sealed(&b);
    ship(&h, &nb, &bb).await;
    ship(&h, &na, &ba).await;
    let (status, of) = transfer_of(&h, &da).await;
    assert_eq!(status, StatusCode::OK, "{of}");
    let t = &of["transfer"];
    let (sa, sb) = (side_of(t, &da), side_of(t, &db_));
    let end_a = &side(t, &sa)["ends"][0];
    assert_eq!(end_a["fired_by"]["rule"], "resets", "{end_a}");
    assert_eq!(end_a["counters"]["flight_recorder"]["retransmits"], 9);
    assert_eq!(end_a["counters"]["flight_recorder"]["resets_received"], 1);
    assert!(side(t, &sb)["ends"][0].get("fired_by").is_none());
    assert_eq!(t["verdicts"]["rst_sent_by"]["side"], sb.as_str());
    assert_eq!(
        t["verdicts"]["rst_sent_by"]["because"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
    h.finish().await;
}

async fn reingest_is_idempotent(db: Db) {
    let Some(h) = Harness::start(db).await else {
        return;
    };
    let (na, nb) = (node(&h, "node-a").await, node(&h, "node-b").await);
    let (da, ba) = sealed(&end_a());
    let (_, bb) = sealed(&end_b());
    ship(&h, &na, &ba).await;
    ship(&h, &nb, &bb).await;
    let (_, first) = transfer_of(&h, &da).await;
    let id = first["transfer"]["id"].as_str().unwrap().to_string();
    // Replays: each alone, both in one batch, and by the other node's key.
    assert_eq!(ship(&h, &na, &ba).await, "duplicate");
    assert_eq!(ship(&h, &nb, &bb).await, "duplicate");
    assert_eq!(
        ship_batch(&h, &nb, &[ba.clone(), bb.clone(), ba.clone()]).await,
        ["duplicate", "duplicate", "duplicate"]
    );
    let (status, again) = h.get(&format!("/v1/transfers/{id}")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(again, first["transfer"], "a replay changes nothing");
    let row = h.store.transfer(&id).await.unwrap().unwrap();
    assert_eq!(
        row.ends.len(),
        2,
        "{:?}",
        row.ends.iter().map(|e| &e.digest).collect::<Vec<_>>()
    );
    let (_, of) = transfer_of(&h, &da).await;
    assert_eq!(of["transfer_ids"], serde_json::json!([id]));
    h.finish().await;
}

async fn retention_takes_the_ends_with_their_envelopes(db: Db) {
    let Some(h) = Harness::start(db).await else {
        return;
    };
    let (na, nb) = (node(&h, "node-a").await, node(&h, "node-b").await);
    let (da, ba) = sealed(&end_a());
    let (db_, bb) = sealed(&end_b());
    ship(&h, &na, &ba).await;
    ship(&h, &nb, &bb).await;
    let (_, of) = transfer_of(&h, &da).await;
    let id = of["transfer"]["id"].as_str().unwrap().to_string();
    let report = h
        .store
        .apply_retention(
            &pstack_store_core::db::RetentionPolicy {
                max_age: Some(std::time::Duration::from_secs(1)),
                max_bytes: None,
            },
            pstack_store_core::now_ns() + 3_600 * S,
        )
        .await
        .expect("retention deletes joined envelopes");
    assert!(report.deleted >= 2, "{report:?}");
    let (status, body) = h.get(&format!("/v1/transfers/{id}")).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    assert_eq!(code(&body), "transfer_not_found");
    for d in [&da, &db_] {
        let (status, body) = transfer_of(&h, d).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
        assert_eq!(code(&body), "envelope_not_found");
    }
    // Shipped again, they join again (the same transfer).
    ship(&h, &na, &ba).await;
    ship(&h, &nb, &bb).await;
    let (status, again) = transfer_of(&h, &db_).await;
    assert_eq!(status, StatusCode::OK, "{again}");
    assert_eq!(again["transfer"]["id"], id.as_str());
    h.finish().await;
}

async fn unknown_and_malformed_ids_are_typed_errors(db: Db) {
    let Some(h) = Harness::start(db).await else {
        return;
    };
    let (status, body) = h.get("/v1/transfers/trf_0123456789abcdef").await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    assert_eq!(code(&body), "transfer_not_found");
    for bad in [
        "x",
        "trf_0123",
        "trf_0123456789ABCDEF",
        "trf_0123456789abcdefg",
    ] {
        let (status, body) = h.get(&format!("/v1/transfers/{bad}")).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}: {body}");
        assert_eq!(code(&body), "invalid_transfer_id");
    }
    let (status, body) = transfer_of(&h, "sha256:xyz").await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(code(&body), "invalid_digest");
    let (status, body) = transfer_of(&h, &format!("sha256:{}", "0".repeat(64))).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    assert_eq!(code(&body), "envelope_not_found");
    let resp = h
        .client
        .get(h.url("/v1/transfers/trf_0123456789abcdef"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
    h.finish().await;
}

fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_pstack-store"));
    c.env_remove("PSTACK_STORE_DB")
        .env_remove("PSTACK_STORE_API_KEY")
        .env_remove("PSTACK_STORE_URL")
        .env_remove("STATE_DIRECTORY")
        .env("NO_COLOR", "1");
    c
}

async fn cli(h: &Harness, args: &[&str]) -> Output {
    let mut cmd = bin();
    cmd.args(args)
        .arg("--url")
        .arg(&h.base)
        .env("PSTACK_STORE_API_KEY", &h.key);
    tokio::task::spawn_blocking(move || cmd.output().expect("run pstack-store"))
        .await
        .expect("join")
}

async fn cli_shows_both_ends(db: Db) {
    let Some(h) = Harness::start(db).await else {
        return;
    };
    let (na, nb) = (node(&h, "node-a").await, node(&h, "node-b").await);
    let (da, ba) = sealed(&end_a());
    let (db_, bb) = sealed(&end_b());
    ship(&h, &na, &ba).await;
    ship(&h, &nb, &bb).await;
    let (_, of) = transfer_of(&h, &da).await;
    let id = of["transfer"]["id"].as_str().unwrap().to_string();
    let sb = side_of(&of["transfer"], &db_);

    let o = cli(&h, &["transfer", "show", &id]).await;
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(
        out.contains(&format!("transfer {id}  basis mirrored_4tuple")),
        "{out}"
    );
    assert!(
        out.lines()
            .any(|l| l.starts_with(&format!("RST sent by:    {sb} ("))),
        "{out}"
    );
    assert!(
        out.lines()
            .any(|l| l.starts_with(&format!("zero window on: {sb} ("))),
        "{out}"
    );
    assert!(out.contains("node-a") && out.contains("node-b"), "{out}");
    assert!(out.contains(&da) && out.contains(&db_), "{out}");

    let o = cli(&h, &["transfer", "show", &id, "--json"]).await;
    assert_eq!(o.status.code(), Some(0));
    let printed: Value = serde_json::from_slice(&o.stdout).expect("--json prints JSON");
    let (_, served) = h.get(&format!("/v1/transfers/{id}")).await;
    assert_eq!(printed, served);

    let o = cli(&h, &["transfer", "of-envelope", &db_, "--json"]).await;
    assert_eq!(o.status.code(), Some(0));
    let printed: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(printed["transfer"]["id"], id.as_str());

    let o = cli(&h, &["transfer", "show", "trf_0123456789abcdef"]).await;
    assert_eq!(o.status.code(), Some(3), "not found exits 3");
    let o = cli(&h, &["transfer", "show", "nope"]).await;
    assert_eq!(o.status.code(), Some(2), "malformed exits 2");
    h.finish().await;
}
