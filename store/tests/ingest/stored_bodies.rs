//! How bodies are kept (schema v11): LZ4 blocks read back as the exact bytes
//! received, claim codes beside them, rows stored before v11 read and found
//! as before, and a damaged block refused as corrupt.

use pstack_store_core::db::{Store, StoreError};
use pstack_store_core::synthetic::Capture;

use crate::on_both_backends;
use crate::support::{Db, RawDb, drop_schema, fresh_store, reopen, run_sql as raw, verified};

on_both_backends!(
    bodies_are_kept_compressed_and_read_back_exactly,
    rows_stored_before_the_codec_read_and_are_found_by_claim_as_before,
    a_damaged_stored_body_is_corrupt_not_served,
);

type PgAt = Option<(String, String)>;

/// A capture with a thread in D: two claims.
fn blocked(pid: u32, seq: u64) -> Capture {
    Capture {
        blocked: true,
        ..Capture::new("node-a", pid, seq)
    }
}

/// A capture with every thread well: one claim, `no_thread_in_d_state`
/// (which holds another code's name: a search by that one must not find it).
fn plain(pid: u32, seq: u64) -> Capture {
    Capture {
        blocked: false,
        ..Capture::new("node-a", pid, seq)
    }
}

/// Digests of the envelopes carrying claim `code`, sorted (the list not cut).
async fn with_claim(store: &Store, code: &str) -> Vec<String> {
    let (found, cut) = store.envelopes_with_claim(code, 0, 10).await.unwrap();
    assert!(!cut);
    let mut digests: Vec<String> = found.into_iter().map(|f| f.1).collect();
    digests.sort();
    digests
}

/// (size, stored length, codec, claim_codes) of a row, read outside the store.
async fn row(
    dir: &Option<tempfile::TempDir>,
    pg: &PgAt,
    digest: &str,
) -> (i64, i64, i64, Option<String>) {
    const SQL: &str = "SELECT size, CAST(length(body) AS BIGINT), body_codec, claim_codes
                       FROM envelopes WHERE digest = $1";
    let mut db = RawDb::connect(dir, pg).await;
    let row = match &mut db {
        RawDb::Sqlite(c) => sqlx::query_as(SQL).bind(digest).fetch_one(c).await,
        RawDb::Postgres(c) => sqlx::query_as(SQL).bind(digest).fetch_one(c).await,
    }
    .unwrap();
    db.close().await;
    row
}

async fn bodies_are_kept_compressed_and_read_back_exactly(db: Db) {
    let Some((store, dir, pg)) = fresh_store(db).await else {
        return;
    };
    let plain = verified(&plain(10, 1));
    let with_claims = verified(&blocked(11, 1));
    store.ingest(&[&plain, &with_claims], "k", 1).await.unwrap();
    for item in [&plain, &with_claims] {
        assert_eq!(
            store.envelope_bytes(&item.digest).await.unwrap().unwrap(),
            item.bytes.as_ref(),
            "the exact bytes received"
        );
        let (size, stored, codec, _) = row(&dir, &pg, &item.digest).await;
        assert_eq!(size, item.bytes.len() as i64, "size is the received size");
        assert_eq!(codec, 1, "kept as an LZ4 block");
        assert!(
            stored * 2 < size,
            "the block is well under half the envelope: {stored} of {size}"
        );
    }
    assert_eq!(
        row(&dir, &pg, &plain.digest).await.3.as_deref(),
        Some(r#"["no_thread_in_d_state"]"#)
    );
    assert_eq!(
        row(&dir, &pg, &with_claims.digest).await.3.as_deref(),
        Some(r#"["thread_in_d_state","blocked_on_fuse_server"]"#)
    );
    assert_eq!(
        with_claim(&store, "blocked_on_fuse_server").await,
        vec![with_claims.digest.clone()]
    );
    // `no_thread_in_d_state` holds this code's name; only the real one counts.
    assert_eq!(
        with_claim(&store, "thread_in_d_state").await,
        vec![with_claims.digest.clone()]
    );
    // A code that is a substring of a stored one is not a match.
    assert!(with_claim(&store, "blocked_on_fuse").await.is_empty());
    store.close().await;
    drop_schema(pg).await;
}

async fn rows_stored_before_the_codec_read_and_are_found_by_claim_as_before(db: Db) {
    let Some((store, dir, pg)) = fresh_store(db).await else {
        return;
    };
    let old = verified(&blocked(20, 1));
    let old_plain = verified(&plain(21, 1));
    store.ingest(&[&old, &old_plain], "k", 1).await.unwrap();
    store.close().await;
    // Back to what v10 wrote: raw bodies, no codec or claim columns, no v11
    // record. Reopening runs v11 alone over these rows.
    let mut sql = String::new();
    for item in [&old, &old_plain] {
        sql.push_str(&format!(
            "UPDATE envelopes SET body = {} WHERE digest = '{}';\n",
            match &pg {
                Some(_) => format!("'\\x{}'::bytea", hex::encode(&item.bytes)),
                None => format!("X'{}'", hex::encode(&item.bytes)),
            },
            item.digest
        ));
    }
    sql.push_str(
        "ALTER TABLE envelopes DROP COLUMN body_codec;
         ALTER TABLE envelopes DROP COLUMN claim_codes;
         DELETE FROM pstack_schema_migrations WHERE version = 11;",
    );
    raw(&dir, &pg, &sql).await;
    let again = reopen(&dir, &pg).await;
    assert_eq!(
        again.schema_version().await.unwrap(),
        pstack_store_core::db::SCHEMA_VERSION
    );
    let (size, stored, codec, claims) = row(&dir, &pg, &old.digest).await;
    assert_eq!(
        (stored, codec, claims),
        (size, 0, None),
        "a v10 row as it was"
    );
    // A new capture beside them is kept the v11 way.
    let new = verified(&blocked(22, 1));
    again.ingest(&[&new], "k", 2).await.unwrap();
    assert_eq!(row(&dir, &pg, &new.digest).await.2, 1);
    for item in [&old, &old_plain, &new] {
        assert_eq!(
            again.envelope_bytes(&item.digest).await.unwrap().unwrap(),
            item.bytes.as_ref()
        );
    }
    let digests = with_claim(&again, "thread_in_d_state").await;
    let mut want = vec![old.digest.clone(), new.digest.clone()];
    want.sort();
    assert_eq!(digests, want, "the v10 row and the v11 row");
    // Both kinds of row give their codes to the fleet read.
    let (nodes, _) = again.node_envelopes(0, i64::MAX, 10).await.unwrap();
    let codes_of = |d: &str| {
        nodes
            .iter()
            .find(|n| n.digest == d)
            .map(|n| n.codes.clone())
            .unwrap()
    };
    let blocked_codes = vec![
        "thread_in_d_state".to_string(),
        "blocked_on_fuse_server".to_string(),
    ];
    assert_eq!(codes_of(&old.digest), blocked_codes);
    assert_eq!(codes_of(&new.digest), blocked_codes);
    assert_eq!(codes_of(&old_plain.digest), ["no_thread_in_d_state"]);
    again.close().await;
    drop_schema(pg).await;
}

async fn a_damaged_stored_body_is_corrupt_not_served(db: Db) {
    let Some((store, dir, pg)) = fresh_store(db).await else {
        return;
    };
    let item = verified(&Capture::new("node-a", 30, 1));
    store.ingest(&[&item], "k", 1).await.unwrap();
    // Cut the block to its first 40 bytes: the length it declares stays.
    let cut = match &pg {
        Some(_) => "substring(body from 1 for 40)",
        None => "substr(body, 1, 40)",
    };
    raw(
        &dir,
        &pg,
        &format!(
            "UPDATE envelopes SET body = {cut} WHERE digest = '{}'",
            item.digest
        ),
    )
    .await;
    match store.envelope_bytes(&item.digest).await {
        Err(StoreError::Corrupt { digest, reason }) => {
            assert_eq!(digest, item.digest);
            assert!(reason.contains("LZ4"), "{reason}");
        }
        other => panic!("a damaged block must be corrupt: {other:?}"),
    }
    store.close().await;
    drop_schema(pg).await;
}
