//! Retention by age and by size: oldest-received first, never an envelope a
//! receipt cites, subjects repointed to their newest surviving envelope.

use std::time::Duration;

use pstack_store_core::db::RetentionPolicy;
use pstack_store_core::ingest::VerifiedItem;
use pstack_store_core::receipts::{ReceiptKind, ReceiptRequest};
use pstack_store_core::synthetic::Capture;

use crate::on_both_backends;
use crate::support::{Db, drop_schema, fresh_store, verified};

on_both_backends!(
    retention_by_age_and_size_never_deletes_cited_evidence,
    reopening_keeps_data_and_applies_no_migration_twice,
);

async fn reopening_keeps_data_and_applies_no_migration_twice(db: Db) {
    let Some((store, dir, pg)) = fresh_store(db).await else {
        return;
    };
    assert_eq!(
        store.schema_version().await.unwrap(),
        pstack_store_core::db::SCHEMA_VERSION
    );
    let item = verified(&Capture::new("node-a", 1, 1));
    store.ingest(&[&item], "k", 1).await.unwrap();
    store.close().await;
    let again = crate::support::reopen(&dir, &pg).await;
    assert_eq!(
        again.schema_version().await.unwrap(),
        pstack_store_core::db::SCHEMA_VERSION
    );
    assert_eq!(
        again.all_digests().await.unwrap(),
        vec![item.digest.clone()]
    );
    assert_eq!(
        again.envelope_bytes(&item.digest).await.unwrap().unwrap(),
        item.bytes.as_ref()
    );
    again.close().await;
    drop_schema(pg).await;
}

const DAY: i64 = 86_400 * 1_000_000_000;

async fn retention_by_age_and_size_never_deletes_cited_evidence(db: Db) {
    let Some((store, _dir, pg)) = fresh_store(db).await else {
        return;
    };
    let now = 1_800_000_000 * 1_000_000_000i64;
    // Old: received 10 days ago. o1 is the newest capture of subject 700.
    let old: Vec<VerifiedItem> = [(700, 1), (701, 2), (700, 0)]
        .iter()
        .map(|(pid, seq)| verified(&Capture::new("node-a", *pid, *seq)))
        .collect();
    let o1 = old[0].digest.clone();
    for (i, item) in old.iter().enumerate() {
        store
            .ingest(&[item], "k-old", now - 10 * DAY + i as i64)
            .await
            .unwrap();
    }
    // New: received now, in order n1, n2, n3.
    let new: Vec<VerifiedItem> = (0..3)
        .map(|i| verified(&Capture::new("node-b", 800 + i, 10 + u64::from(i))))
        .collect();
    for (i, item) in new.iter().enumerate() {
        store
            .ingest(&[item], "k-new", now - 1000 + i as i64)
            .await
            .unwrap();
    }
    // A receipt cites o1 (the problem evidence of a change).
    store
        .record_receipt(
            &ReceiptRequest {
                kind: ReceiptKind::SourceFixed,
                change: "INC-1".into(),
                evidence: vec![o1.clone()],
                revision: Some("abc".into()),
                realized_at: None,
                soak_ms: None,
                note: None,
            },
            "k-op",
            now,
        )
        .await
        .unwrap();

    // Age: everything older than 7 days goes, except what is cited.
    let report = store
        .apply_retention(
            &RetentionPolicy {
                max_age: Some(Duration::from_secs(7 * 86_400)),
                max_bytes: None,
            },
            now,
        )
        .await
        .unwrap();
    assert_eq!((report.deleted, report.cited_kept), (2, 1), "{report:?}");
    let mut expected: Vec<String> = new
        .iter()
        .map(|n| n.digest.clone())
        .chain([o1.clone()])
        .collect();
    expected.sort();
    assert_eq!(store.all_digests().await.unwrap(), expected);
    // Subject 700 lost its older capture only; subject 701 is gone entirely.
    let open = store.unknowns(true, None, 100, 0).await.unwrap();
    let open_digests: Vec<&str> = open.iter().map(|u| u.digest.as_str()).collect();
    assert!(open_digests.contains(&o1.as_str()));
    assert!(
        !open_digests.contains(&old[1].digest.as_str()),
        "deleted envelope's unknown is gone"
    );
    assert_eq!(open.len(), 4, "o1 + n1..n3 each carry one open unknown");

    // Size: keep at most o1 + n3 worth of bytes; the oldest uncited go first.
    let size = |v: &VerifiedItem| v.bytes.len() as u64;
    let cap = size(&old[0]) + size(&new[2]) + 10;
    let report = store
        .apply_retention(
            &RetentionPolicy {
                max_age: None,
                max_bytes: Some(cap),
            },
            now,
        )
        .await
        .unwrap();
    assert_eq!(report.deleted, 2, "{report:?}");
    assert!(report.stored_bytes <= cap);
    let mut expected = vec![o1.clone(), new[2].digest.clone()];
    expected.sort();
    assert_eq!(store.all_digests().await.unwrap(), expected);

    // A cap below the cited evidence cannot delete it.
    let report = store
        .apply_retention(
            &RetentionPolicy {
                max_age: Some(Duration::ZERO),
                max_bytes: Some(0),
            },
            now + DAY,
        )
        .await
        .unwrap();
    assert_eq!(store.all_digests().await.unwrap(), vec![o1.clone()]);
    assert_eq!(report.cited_kept, 1);
    assert!(store.envelope_bytes(&o1).await.unwrap().is_some());
    store.close().await;
    drop_schema(pg).await;
}
