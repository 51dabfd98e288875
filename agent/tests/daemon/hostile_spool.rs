//! Hostile spool entries and a collector that refuses large batches
//! (issue 10): the shipper never blocks, never spins, and delivers the rest.
//!
//! - Entries replaced after pstackd indexed them — a FIFO, a directory, a
//!   symlink loop — are quarantined (each under its own name) while a real
//!   `pstack-store` receives the valid ones and a new capture; pstackd's CPU
//!   stays idle meanwhile.
//! - An entry that answers EIO (a one-file FUSE server mounted over it,
//!   `eio_fuse.rs`): the read fails once, the entry is forgotten with a log
//!   line naming it and the error (the rename into quarantine fails with
//!   EBUSY on a mount point, so it cannot be moved), the other entries ship,
//!   and pstackd neither retries it nor spins.
//! - A store started with `--max-items 5` answers 413 to a 20-item batch:
//!   the shipper splits it and all 20 arrive.

use std::os::unix::fs::FileTypeExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::collector::Collector;
use super::common::*;
use super::eio_fuse::EioFile;

struct Store(Child);

impl Drop for Store {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn store_key(store_bin: &Path, db: &Path) -> String {
    let out = Command::new(store_bin)
        .arg("--db")
        .arg(db)
        .args([
            "keys",
            "create",
            "--name",
            "hostile-spool",
            "--scope",
            "ingest,read",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

fn start_store(store_bin: &Path, db: &Path, addr: std::net::SocketAddr, extra: &[&str]) -> Store {
    Store(
        Command::new(store_bin)
            .arg("--db")
            .arg(db)
            .args(["serve", "--listen", &addr.to_string()])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    )
}

/// pstackd's share of one CPU over `window` (utime + stime).
fn cpu_share(pid: i32, window: Duration) -> f64 {
    let ticks_per_s = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .unwrap()
        .unwrap() as u64;
    let before = cpu_ticks(pid);
    let t = Instant::now();
    std::thread::sleep(window);
    let used = cpu_ticks(pid) - before;
    used as f64 / (t.elapsed().as_secs_f64() * ticks_per_s as f64)
}

/// utime + stime of `pid`, in clock ticks.
fn cpu_ticks(pid: i32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // rest[0] is field 3; utime is field 14, stime 15.
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

fn quarantined(spool: &Path) -> Vec<String> {
    std::fs::read_dir(spool.join("quarantine"))
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn fifo_directory_and_symlink_loop_entries_are_quarantined_while_shipping_continues_idle() {
    let Some(store_bin) = sibling_bin("pstack-store", "pstack-store") else {
        panic!("pstack-store could not be built (cargo build -p pstack-store)");
    };
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("store.db");
    let key = store_key(&store_bin, &db);
    let spool = dir.path().join("spool");
    let items: Vec<_> = (0..6).map(|n| sealed_example(700 + n)).collect();
    for (d, b) in &items {
        write_spool_file(&spool, d, b);
    }
    let addr = Collector::reserve_port(); // down while the entries are replaced
    let settings = Settings {
        collector_url: Some(format!("http://{addr}")),
        api_key: Some(key.clone()),
        backoff_initial_ms: 50,
        backoff_max_ms: 200,
        // The off-CPU programs drain every context switch of this (busy,
        // shared) host: that CPU is not the shipper's.
        extra: "[ebpf]\nenabled = false\n".into(),
        ..Settings::default()
    };
    let d = Daemon::start(dir.path(), &settings);
    assert_eq!(d.status()["spool"]["files"], 6);
    // Replace three indexed entries behind pstackd's back.
    let path_of = |digest: &str| spool.join(format!("{}.json", &digest[7..]));
    let fifo = path_of(&items[0].0);
    std::fs::remove_file(&fifo).unwrap();
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    assert!(std::fs::metadata(&fifo).unwrap().file_type().is_fifo());
    let as_dir = path_of(&items[1].0);
    std::fs::remove_file(&as_dir).unwrap();
    std::fs::create_dir(&as_dir).unwrap();
    let looped = path_of(&items[2].0);
    std::fs::remove_file(&looped).unwrap();
    std::os::unix::fs::symlink(&looped, &looped).unwrap();

    let _store = start_store(&store_bin, &db, addr, &[]);
    d.wait_status(Duration::from_secs(30), "valid entries shipped", |s| {
        s["spool"]["files"] == 0 && s["shipping"]["accepted_total"] == 3
    });
    let q = quarantined(&spool);
    assert_eq!(q.len(), 3, "{q:?}");
    for (digest, reason) in [
        (&items[0].0, "not_regular"),
        (&items[1].0, "not_regular"),
        (&items[2].0, "unreadable"),
    ] {
        let hex = &digest[7..];
        assert!(
            q.iter().any(|n| n.starts_with(hex) && n.contains(reason)),
            "{hex} {reason}: {q:?}"
        );
    }
    let s = d.status();
    assert_eq!(s["spool"]["quarantined_total"], 3, "{s:#}");
    assert!(s["shipping"]["last_error"].is_null(), "cleared: {s:#}");

    // Still shipping: a new capture arrives in the store.
    let target = Sleeper::spawn();
    d.capture_pid(target.pid()).expect("capture");
    d.wait_status(Duration::from_secs(30), "new capture shipped", |s| {
        s["shipping"]["accepted_total"] == 4
    });

    // And idle: with nothing to send, pstackd burns (almost) no CPU.
    let share = cpu_share(d.pid(), Duration::from_secs(2));
    assert!(
        share < 0.05,
        "pstackd used {:.0}% of a CPU while idle",
        share * 100.0
    );
}

#[test]
fn root_only_an_entry_that_answers_eio_is_forgotten_with_a_log_line_while_shipping_continues_idle()
{
    pstack_testkit::require!(is_root(), "mounting FUSE needs root");
    let Some(store_bin) = sibling_bin("pstack-store", "pstack-store") else {
        panic!("pstack-store could not be built (cargo build -p pstack-store)");
    };
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("store.db");
    let key = store_key(&store_bin, &db);
    let spool = dir.path().join("spool");
    let items: Vec<_> = (0..4).map(|n| sealed_example(800 + n)).collect();
    for (d, b) in &items {
        write_spool_file(&spool, d, b);
    }
    let addr = Collector::reserve_port(); // down while the entry goes bad
    let settings = Settings {
        collector_url: Some(format!("http://{addr}")),
        api_key: Some(key),
        backoff_initial_ms: 50,
        backoff_max_ms: 200,
        extra: "[ebpf]\nenabled = false\n".into(),
        ..Settings::default()
    };
    let d = Daemon::start(dir.path(), &settings);
    assert_eq!(d.status()["spool"]["files"], 4);
    // The oldest indexed entry starts answering EIO (same size, same name,
    // still a regular file: only the read fails).
    let bad = &items[0];
    let bad_path = spool.join(format!("{}.json", &bad.0[7..]));
    let fuse = EioFile::mount(&bad_path, bad.1.len() as u64);
    pstack_testkit::require!(
        fuse.is_ok(),
        "{} (scripts/setup.d/10-kernel.sh loads fuse)",
        fuse.as_ref().err().cloned().unwrap_or_default()
    );
    let fuse = fuse.unwrap();
    assert_eq!(
        std::fs::read(&bad_path).unwrap_err().raw_os_error(),
        Some(libc::EIO)
    );
    // pstackd may already have tried (and failed) to read it for a batch
    // while the store was down: only pstackd's reads count, not this test's.

    let _store = start_store(&store_bin, &db, addr, &[]);
    // The accepted count is published a moment before the shipper clears
    // the error of the attempts made while the store was down: wait for both.
    let s = d.wait_status(Duration::from_secs(30), "the other entries shipped", |s| {
        s["spool"]["files"] == 0
            && s["shipping"]["accepted_total"] == 3
            && s["shipping"]["last_success_unix"].as_u64() > Some(0)
    });
    assert_eq!(s["spool"]["quarantined_total"], 1, "{s:#}");
    assert!(s["shipping"]["last_error"].is_null(), "{s:#}");
    let log = d.log_text();
    let line = log
        .lines()
        .find(|l| l.contains("spool entry unreadable") && l.contains(&bad.0[7..]))
        .unwrap_or_else(|| panic!("no log line names the EIO entry:\n{log}"));
    assert!(line.contains("Input/output error"), "{line}");
    eprintln!("pstackd on the EIO entry: {line}");
    // Read once (the kernel may split or retry one read), never again.
    let reads = fuse.reads_by(d.pid() as u32);
    assert!((1..=4).contains(&reads), "{reads} reads of the EIO entry");

    // Still shipping: a new capture arrives in the store.
    let target = Sleeper::spawn();
    d.capture_pid(target.pid()).expect("capture");
    d.wait_status(Duration::from_secs(30), "new capture shipped", |s| {
        s["shipping"]["accepted_total"] == 4
    });
    // Idle, and the EIO entry is not retried.
    let share = cpu_share(d.pid(), Duration::from_secs(2));
    assert!(
        share < 0.05,
        "pstackd used {:.0}% of a CPU while idle",
        share * 100.0
    );
    let later = fuse.reads_by(d.pid() as u32);
    assert_eq!(later, reads, "the EIO entry was read again");
    let s = d.status();
    assert_eq!(s["spool"]["files"], 0, "{s:#}");
    assert_eq!(s["spool"]["quarantined_total"], 1, "{s:#}");
}

#[test]
fn a_batch_refused_with_413_is_split_until_the_store_takes_it() {
    let Some(store_bin) = sibling_bin("pstack-store", "pstack-store") else {
        panic!("pstack-store could not be built (cargo build -p pstack-store)");
    };
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("store.db");
    let key = store_key(&store_bin, &db);
    let spool = dir.path().join("spool");
    for n in 0..20 {
        let (d, b) = sealed_example(900 + n);
        write_spool_file(&spool, &d, &b);
    }
    let addr = Collector::reserve_port();
    let _store = start_store(&store_bin, &db, addr, &["--max-items", "5"]);
    let settings = Settings {
        collector_url: Some(format!("http://{addr}")),
        api_key: Some(key),
        backoff_initial_ms: 50,
        backoff_max_ms: 200,
        batch_max_items: 100,
        ..Settings::default()
    };
    let d = Daemon::start(dir.path(), &settings);
    d.wait_status(Duration::from_secs(45), "all 20 delivered", |s| {
        s["spool"]["files"] == 0 && s["shipping"]["accepted_total"] == 20
    });
    let s = d.status();
    assert_eq!(s["spool"]["quarantined_total"], 0, "{s:#}");
    assert!(s["shipping"]["last_error"].is_null(), "{s:#}");
}
