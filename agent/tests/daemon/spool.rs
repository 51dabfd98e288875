//! The spool on disk: corruption, a large backlog, and a filesystem that
//! fills up.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use super::collector::Collector;
use super::common::*;

#[test]
fn spool_corruption_matrix_each_file_quarantined_and_counted_shipping_continues() {
    let dir = tempfile::tempdir().unwrap();
    let spool = dir.path().join("spool");
    let good: Vec<(String, Vec<u8>)> = (0..6).map(|n| sealed_example(1_000 + n)).collect();
    for (d, b) in &good {
        write_spool_file(&spool, d, b);
    }
    // A bit-flipped file: valid name, one bit changed inside a string value.
    let (flip_d, mut flip_b) = sealed_example(2_000);
    let at = flip_b.windows(6).position(|w| w == b"node-a").unwrap();
    flip_b[at] ^= 0x01;
    write_spool_file(&spool, &flip_d, &flip_b);
    // A truncated file.
    let (trunc_d, trunc_b) = sealed_example(2_001);
    write_spool_file(&spool, &trunc_d, &trunc_b[..trunc_b.len() / 2]);
    // A zero-length file.
    let (zero_d, _) = sealed_example(2_002);
    write_spool_file(&spool, &zero_d, b"");
    // A stray tmp file from an interrupted write.
    std::fs::write(
        spool.join(format!(".tmp-{}-1-0", "a".repeat(64))),
        b"{\"partial",
    )
    .unwrap();
    // A valid envelope under the wrong name (digest mismatch).
    let (_, other_b) = sealed_example(2_003);
    let wrong_name = format!("sha256:{}", "b".repeat(64));
    write_spool_file(&spool, &wrong_name, &other_b);

    let collector = Collector::start();
    let d = Daemon::start(
        dir.path(),
        &Settings {
            collector_url: Some(collector.url()),
            batch_max_items: 4,
            ..Settings::default()
        },
    );
    let s = d.wait_status(Duration::from_secs(15), "spool drained", |s| {
        s["spool"]["files"] == 0
    });
    assert_eq!(s["spool"]["quarantined_total"], 5, "{s:#}");
    for (dg, _) in &good {
        assert!(collector.has(dg), "{dg} not shipped");
    }
    assert_eq!(collector.stored(), good.len());
    assert_eq!(collector.torn(), 0, "a corrupt file was shipped");
    let mut q: Vec<String> = std::fs::read_dir(spool.join("quarantine"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        // Quarantine names are `<name>.<reason>.<unique suffix>`.
        .map(|n| n.rsplit_once('.').map(|(a, _)| a.to_string()).unwrap_or(n))
        .collect();
    q.sort();
    let hex = |d: &str| d.strip_prefix("sha256:").unwrap().to_string();
    let mut expected = vec![
        format!("{}.json.invalid", hex(&flip_d)),
        format!("{}.json.invalid", hex(&trunc_d)),
        format!("{}.json.empty", hex(&zero_d)),
        format!(".tmp-{}-1-0.stray_tmp", "a".repeat(64)),
        format!("{}.json.invalid", hex(&wrong_name)),
    ];
    expected.sort();
    assert_eq!(q, expected);
    // Still serving and capturing after all that.
    let target = Sleeper::spawn();
    d.capture_pid(target.pid())
        .expect("capture after quarantine");
}

#[test]
fn restart_with_10000_spooled_envelopes_drains_with_bounded_memory_and_fds() {
    let dir = tempfile::tempdir().unwrap();
    let spool = dir.path().join("spool");
    let n = 10_000u64;
    let mut total_bytes = 0u64;
    let mut digests = Vec::with_capacity(n as usize);
    for i in 0..n {
        let (d, b) = sealed_example(50_000 + i);
        total_bytes += b.len() as u64;
        write_spool_file(&spool, &d, &b);
        digests.push(d);
    }
    // The collector is down at first: the restart's accounting is checked
    // before anything ships.
    let addr = Collector::reserve_port();
    let d = Daemon::start(
        dir.path(),
        &Settings {
            collector_url: Some(format!("http://{addr}")),
            batch_max_items: 200,
            backoff_initial_ms: 20,
            backoff_max_ms: 50,
            // The bound is the drain's: with eBPF on, the BTF parse of the
            // programs' load runs at the same time and alone took the peak
            // to 65.8 MiB in a CI run (its memory is the eBPF tests' to bound).
            extra: "[ebpf]\nenabled = false\n".into(),
            ..Settings::default()
        },
    );
    let s = d.status();
    assert_eq!(s["ebpf"]["state"], "disabled", "{:#}", s["ebpf"]);
    assert_eq!(s["spool"]["files"], n, "file accounting after restart");
    assert_eq!(
        s["spool"]["bytes"], total_bytes,
        "byte accounting after restart"
    );
    let collector = Collector::start_on(addr);
    let (mut max_rss, mut max_fds) = (0, 0);
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    loop {
        max_rss = max_rss.max(d.rss_kib());
        max_fds = max_fds.max(d.open_fds());
        let files = d.status()["spool"]["files"].as_u64().unwrap();
        if files == 0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "backlog not drained: {files} left"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    eprintln!("10,000 backlog drained: peak RSS {max_rss} KiB, peak fds {max_fds}");
    assert!(max_rss < 64 * 1024, "RSS {max_rss} KiB while draining");
    assert!(max_fds < 64, "{max_fds} fds open while draining");
    assert_eq!(collector.stored(), n as usize);
    assert_eq!(collector.torn(), 0);
    // The shipper counts a batch as accepted just after it removes the
    // batch's files, so the last batch's count may lag the empty spool by
    // a moment (seen under load: 9,800).
    wait_until(
        Duration::from_secs(5),
        "every envelope counted accepted",
        || d.status()["shipping"]["accepted_total"] == n,
    );
    let s = d.status();
    assert_eq!(s["spool"]["bytes"], 0);
    assert_eq!(s["shipping"]["accepted_total"], n);
}

/// A tmpfs mounted for one test, unmounted on drop.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(at: &Path, size: &str) -> Option<Tmpfs> {
        std::fs::create_dir_all(at).unwrap();
        let ok = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0700"),
                "tmpfs",
            ])
            .arg(at)
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        ok.then(|| Tmpfs(at.to_owned()))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

fn files_in(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .map(|e| e.file_name().to_string_lossy().ends_with(".json"))
                .unwrap_or(false)
        })
        .count()
}

/// A daemon whose spool sits on a 160 KiB tmpfs, with this overflow policy.
/// The byte bound is far above the filesystem: ENOSPC is what stops writes.
/// `None` (a reported skip; a failure in strict mode) when not root.
fn daemon_on_tiny_tmpfs(
    overflow: &'static str,
) -> Option<(tempfile::TempDir, Tmpfs, std::path::PathBuf, Daemon)> {
    pstack_testkit::require!(is_root(), "needs root to mount a tmpfs");
    let dir = tempfile::tempdir().unwrap();
    let Some(fs) = Tmpfs::mount(&dir.path().join("spoolfs"), "160k") else {
        panic!("mount -t tmpfs failed as root");
    };
    let spool = fs.0.join("spool");
    let d = Daemon::start(
        dir.path(),
        &Settings {
            spool_dir: Some(spool.clone()),
            spool_max_bytes: 64 << 20,
            overflow,
            ..Settings::default()
        },
    );
    Some((dir, fs, spool, d))
}

#[test]
fn root_only_tiny_tmpfs_spool_fills_drop_oldest_counts_and_keeps_serving() {
    let Some((_dir, _fs, spool, d)) = daemon_on_tiny_tmpfs("drop_oldest") else {
        return;
    };
    let target = Sleeper::spawn();
    let mut last = None;
    for _ in 0..40 {
        last = Some(
            d.capture_pid(target.pid())
                .expect("drop_oldest keeps accepting")
                .digest,
        );
    }
    let s = d.status();
    let dropped = s["spool"]["dropped_total"].as_u64().unwrap();
    assert!(
        dropped > 0,
        "the filesystem filled but nothing was dropped: {s:#}"
    );
    assert_eq!(s["spool"]["written_total"], 40);
    assert_eq!(
        s["spool"]["files"].as_u64().unwrap() as usize,
        files_in(&spool),
        "accounting matches the disk"
    );
    assert_eq!(s["spool"]["files"].as_u64().unwrap() + dropped, 40);
    // The newest is kept; drops are journaled.
    assert!(
        spool
            .join(format!("{}.json", &last.unwrap()[7..]))
            .is_file()
    );
    let log = d.log_text();
    assert_eq!(
        log.lines()
            .filter(|l| l.contains("dropped the oldest unshipped envelope"))
            .count() as u64,
        dropped,
        "every drop journaled"
    );
    assert_eq!(d.metric("pstackd_spool_dropped_total"), dropped);
}

#[test]
fn root_only_tiny_tmpfs_spool_fills_refuse_new_refuses_and_keeps_what_it_holds() {
    let Some((_dir, _fs, spool, d)) = daemon_on_tiny_tmpfs("refuse_new") else {
        return;
    };
    let target = Sleeper::spawn();
    let mut ok = Vec::new();
    let mut refused = 0;
    for _ in 0..40 {
        match d.capture_pid(target.pid()) {
            Ok(e) => ok.push(e.digest),
            Err(pstackctl::client::ClientError::Api {
                status: 507, code, ..
            }) => {
                assert_eq!(code, "spool_full");
                refused += 1;
            }
            Err(e) => panic!("unexpected: {e}"),
        }
    }
    assert!(refused > 0, "the filesystem never filled");
    for dg in &ok {
        assert!(
            spool.join(format!("{}.json", &dg[7..])).is_file(),
            "an acknowledged envelope was lost"
        );
    }
    let s = d.status();
    assert_eq!(s["spool"]["dropped_total"], 0);
    assert_eq!(s["spool"]["files"].as_u64().unwrap() as usize, ok.len());
    // Still serving.
    d.status();
}
