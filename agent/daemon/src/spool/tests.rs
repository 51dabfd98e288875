//! Unit tests of the spool over the real filesystem.

use super::*;
use pstack_envelope::example::example_unsealed;

fn sealed(n: u64) -> (String, Vec<u8>) {
    let mut e = example_unsealed();
    e.clock.monotonic_start_ns = (1_000 + n).to_string();
    let e = e.seal().unwrap();
    (e.digest.clone(), serde_json::to_vec(&e).unwrap())
}

fn limits(max_files: u64, overflow: OverflowPolicy) -> SpoolLimits {
    SpoolLimits {
        max_bytes: 1 << 30,
        max_files,
        overflow,
    }
}

#[test]
fn put_is_durable_and_reindexed_after_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let s = Spool::open(dir.path(), limits(10, OverflowPolicy::DropOldest)).unwrap();
    let (d, b) = sealed(1);
    assert_eq!(s.put(&d, &b).unwrap(), PutOutcome::Written { dropped: 0 });
    assert_eq!(s.put(&d, &b).unwrap(), PutOutcome::AlreadySpooled);
    drop(s);
    let s = Spool::open(dir.path(), limits(10, OverflowPolicy::DropOldest)).unwrap();
    let snap = s.snapshot();
    assert_eq!((snap.files, snap.bytes), (1, b.len() as u64));
    assert_eq!(s.read_verified(&d).unwrap().unwrap(), b);
}

#[test]
fn drop_oldest_drops_in_arrival_order_and_counts() {
    let dir = tempfile::tempdir().unwrap();
    let s = Spool::open(dir.path(), limits(2, OverflowPolicy::DropOldest)).unwrap();
    let items: Vec<_> = (0..3).map(sealed).collect();
    for (d, b) in &items {
        s.put(d, b).unwrap();
    }
    assert!(!s.contains(&items[0].0));
    assert!(s.contains(&items[1].0) && s.contains(&items[2].0));
    assert_eq!(s.snapshot().dropped_total, 1);
}

#[test]
fn refuse_new_refuses_and_keeps_what_it_has() {
    let dir = tempfile::tempdir().unwrap();
    let s = Spool::open(dir.path(), limits(1, OverflowPolicy::RefuseNew)).unwrap();
    let (d0, b0) = sealed(0);
    let (d1, b1) = sealed(1);
    s.put(&d0, &b0).unwrap();
    assert!(matches!(s.put(&d1, &b1), Err(SpoolError::Full { .. })));
    assert!(s.contains(&d0));
    assert_eq!(s.snapshot().refused_total, 1);
    assert!(!s.has_room_for(10));
}

#[test]
fn acknowledge_deletes_and_accounts() {
    let dir = tempfile::tempdir().unwrap();
    let s = Spool::open(dir.path(), limits(10, OverflowPolicy::DropOldest)).unwrap();
    let (d, b) = sealed(7);
    s.put(&d, &b).unwrap();
    s.acknowledge(&d).unwrap();
    let snap = s.snapshot();
    assert_eq!((snap.files, snap.bytes, snap.acknowledged_total), (0, 0, 1));
    assert!(!dir.path().join(format!("{}.json", &d[7..])).exists());
}

/// Torn writes at sector and page boundaries (what a lying disk or a
/// crash without our fsync discipline would leave): never served, always
/// quarantined, accounting follows.
#[test]
fn torn_files_at_512_and_4096_byte_boundaries_are_quarantined_not_served() {
    let dir = tempfile::tempdir().unwrap();
    let mut e = example_unsealed();
    // Make the envelope larger than two pages so every cut is inside it.
    e.surfaces[0].authority = format!("procfs:/proc/4242/{}", "x".repeat(9000));
    let e = e.seal().unwrap();
    let bytes = serde_json::to_vec(&e).unwrap();
    assert!(bytes.len() > 8192);
    for cut in [512usize, 4096, 8192, bytes.len() - 1] {
        let s = Spool::open(dir.path(), limits(10, OverflowPolicy::DropOldest)).unwrap();
        s.put(&e.digest, &bytes).unwrap();
        let path = dir.path().join(format!("{}.json", &e.digest[7..]));
        std::fs::write(&path, &bytes[..cut]).unwrap();
        assert_eq!(
            s.read_verified(&e.digest).unwrap(),
            None,
            "cut at {cut} was served"
        );
        assert!(!s.contains(&e.digest));
        assert_eq!(s.snapshot().files, 0);
        assert_eq!(s.snapshot().quarantined_total, 1);
        assert!(!path.exists());
    }
}

#[test]
fn a_complete_temp_file_is_recovered_and_a_torn_one_quarantined() {
    let dir = tempfile::tempdir().unwrap();
    let (d, b) = sealed(11);
    let (d2, b2) = sealed(12);
    // Killed between fsync and rename: a complete, valid envelope.
    std::fs::write(dir.path().join(format!(".tmp-{}-77-0", &d[7..])), &b).unwrap();
    // Killed mid-write: a torn one.
    std::fs::write(
        dir.path().join(format!(".tmp-{}-77-1", &d2[7..])),
        &b2[..b2.len() / 2],
    )
    .unwrap();
    let s = Spool::open(dir.path(), limits(10, OverflowPolicy::DropOldest)).unwrap();
    assert!(s.contains(&d));
    assert_eq!(s.read_verified(&d).unwrap().unwrap(), b);
    assert!(!s.contains(&d2));
    let snap = s.snapshot();
    assert_eq!((snap.recovered_total, snap.quarantined_total), (1, 1));
}

#[test]
fn quarantine_names_are_unique() {
    let dir = tempfile::tempdir().unwrap();
    let s = Spool::open(dir.path(), limits(10, OverflowPolicy::DropOldest)).unwrap();
    for _ in 0..2 {
        let p = dir.path().join("same");
        std::fs::write(&p, b"x").unwrap();
        s.quarantine_file(&p, "same", QuarantineReason::UnexpectedName);
    }
    assert_eq!(
        std::fs::read_dir(dir.path().join("quarantine"))
            .unwrap()
            .count(),
        2
    );
}

#[test]
fn bad_digest_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let s = Spool::open(dir.path(), limits(10, OverflowPolicy::DropOldest)).unwrap();
    assert!(matches!(
        s.put("sha256:../../etc/passwd", b"{}"),
        Err(SpoolError::BadDigest(_))
    ));
    assert!(matches!(
        s.put("md5:00", b"{}"),
        Err(SpoolError::BadDigest(_))
    ));
}

mod over_the_fault_double {
    use std::path::Path;
    use std::sync::Arc;

    use super::super::fault_fs::{Fault, FaultFs};
    use super::super::fs::SpoolFs;
    use super::*;

    const DIR: &str = "/spool";

    fn open(fs: &FaultFs) -> Spool {
        Spool::open_with(
            Arc::new(fs.clone()),
            Path::new(DIR),
            limits(10, OverflowPolicy::DropOldest),
        )
        .unwrap()
    }

    fn files(fs: &FaultFs) -> Vec<String> {
        let mut n = fs.names(Path::new(DIR));
        n.sort();
        n
    }

    /// Not durable, so not acknowledged, and nothing unaccounted left behind.
    #[test]
    fn a_failed_directory_fsync_fails_the_put_and_leaves_no_file() {
        let fs = FaultFs::new(1);
        let s = open(&fs);
        let (d, b) = sealed(21);
        fs.arm(Fault::DirFsyncEio);
        assert!(matches!(
            s.put(&d, &b),
            Err(SpoolError::Io {
                op: "fsync directory",
                ..
            })
        ));
        assert!(!s.contains(&d));
        assert_eq!(files(&fs), Vec::<String>::new());
        assert_eq!((s.snapshot().files, s.snapshot().refused_total), (0, 1));
    }

    /// The storage forgets a rename that was reported done and synced: the
    /// complete temp file is recovered at the next start, not quarantined.
    #[test]
    fn a_lost_rename_is_recovered_from_the_temp_file() {
        let fs = FaultFs::new(2);
        let s = open(&fs);
        let (d, b) = sealed(22);
        fs.arm(Fault::LostRename);
        assert_eq!(s.put(&d, &b).unwrap(), PutOutcome::Written { dropped: 0 });
        drop(s);
        fs.crash();
        assert!(files(&fs)[0].starts_with(".tmp-"), "{:?}", files(&fs));
        let s = open(&fs);
        assert_eq!(s.read_verified(&d).unwrap().unwrap(), b);
        let snap = s.snapshot();
        assert_eq!((snap.recovered_total, snap.quarantined_total), (1, 0));
        assert_eq!(files(&fs), vec![format!("{}.json", &d[7..])]);
    }

    /// A complete temp file whose fsync fails at recovery stays where it is
    /// (not indexed, not quarantined) and is recovered at the next start.
    #[test]
    fn a_recoverable_temp_file_whose_fsync_fails_waits_for_the_next_start() {
        let fs = FaultFs::new(3);
        fs.create_dir_all(Path::new(DIR)).unwrap();
        let (d, b) = sealed(23);
        let tmp = Path::new(DIR).join(format!(".tmp-{}-9-0", &d[7..]));
        let mut f = fs.create_new(&tmp).unwrap();
        f.write_all(&b).unwrap();
        f.sync().unwrap();
        fs.arm(Fault::FsyncEio);
        let s = open(&fs);
        assert!(!s.contains(&d));
        let snap = s.snapshot();
        assert_eq!((snap.recovered_total, snap.quarantined_total), (0, 0));
        assert_eq!(fs.peek(&tmp), Some(b.clone()));
        drop(s);
        let s = open(&fs);
        assert_eq!(s.read_verified(&d).unwrap().unwrap(), b);
        assert_eq!(s.snapshot().recovered_total, 1);
    }

    /// EIO reading an entry: quarantined with its bytes (evidence kept),
    /// never served, never retried.
    #[test]
    fn an_entry_that_fails_with_eio_is_quarantined_with_its_bytes() {
        let fs = FaultFs::new(4);
        let s = open(&fs);
        let (d, b) = sealed(24);
        s.put(&d, &b).unwrap();
        fs.arm(Fault::ReadEio);
        assert_eq!(s.read_verified(&d).unwrap(), None);
        assert!(!s.contains(&d));
        let q = Path::new(DIR).join("quarantine");
        let names = fs.names(&q);
        assert_eq!(names.len(), 1, "{names:?}");
        assert!(names[0].contains(".unreadable."), "{names:?}");
        assert_eq!(fs.peek(&q.join(&names[0])), Some(b));
        assert_eq!(s.snapshot().quarantined_total, 1);
    }
}
