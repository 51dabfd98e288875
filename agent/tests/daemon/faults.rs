//! Shipping under collector faults, collector outages across a daemon
//! restart, and kill -9 during spool writes.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use super::collector::{Collector, Fault};
use super::common::*;

fn spool_files(d: &Daemon) -> u64 {
    d.status()["spool"]["files"].as_u64().unwrap()
}

fn failures(d: &Daemon, class: &str) -> u64 {
    d.status()["shipping"]["failures_total"][class]
        .as_u64()
        .unwrap_or(0)
}

#[test]
fn collector_faults_are_classified_and_nothing_is_deleted_before_its_ack() {
    let dir = tempfile::tempdir().unwrap();
    let collector = Collector::start();
    // Faults first, so the first batch meets them in order.
    collector.push(Fault::Status(500, None));
    collector.push(Fault::Status(429, Some("1")));
    collector.push(Fault::Hang(Duration::from_secs(3)));
    collector.push(Fault::ResetMidBody);
    collector.push(Fault::Status(503, Some("1")));
    collector.push(Fault::Partial {
        reject: vec![0],
        omit_last: true,
    });
    // Prefill the spool so the batch is known before the daemon starts.
    let spool = dir.path().join("spool");
    let items: Vec<(String, Vec<u8>)> = (0..5).map(sealed_example).collect();
    for (dgst, bytes) in &items {
        write_spool_file(&spool, dgst, bytes);
    }
    let d = Daemon::start(
        dir.path(),
        &Settings {
            collector_url: Some(collector.url()),
            ship_timeout_ms: 500,
            backoff_initial_ms: 50,
            backoff_max_ms: 200,
            ..Settings::default()
        },
    );
    // Until the partial answer, nothing may be deleted.
    let start = Instant::now();
    wait_until(Duration::from_secs(20), "the partial answer", || {
        collector
            .record
            .lock()
            .unwrap()
            .requests
            .iter()
            .any(|(_, l)| *l == "partial")
    });
    let reqs = collector.record.lock().unwrap().requests.clone();
    let labels: Vec<&str> = reqs.iter().map(|(_, l)| *l).collect();
    assert_eq!(
        &labels[..6],
        &["status", "status", "hang", "reset", "status", "partial"],
        "{labels:?}"
    );
    // Retry-After: 1 was honoured (the next attempt came at least ~1 s later).
    let gap_after_429 = reqs[2].0 - reqs[1].0;
    assert!(
        gap_after_429 >= Duration::from_millis(950),
        "429 Retry-After ignored: {gap_after_429:?}"
    );
    let gap_after_503 = reqs[5].0 - reqs[4].0;
    assert!(
        gap_after_503 >= Duration::from_millis(950),
        "503 Retry-After ignored: {gap_after_503:?}"
    );
    // Then everything except the rejected one is delivered; the omitted item is re-sent.
    d.wait_status(Duration::from_secs(10), "spool drained", |s| {
        s["spool"]["files"] == 0
    });
    eprintln!("fault sequence took {:?}", start.elapsed());
    assert_eq!(failures(&d, "server_error"), 1);
    assert_eq!(failures(&d, "throttled"), 2);
    assert_eq!(failures(&d, "timeout"), 1);
    assert!(failures(&d, "transport") >= 1, "{:#}", d.status());
    let s = d.status();
    assert_eq!(s["shipping"]["rejected_total"], 1);
    assert_eq!(s["spool"]["quarantined_total"], 1);
    assert_eq!(s["shipping"]["accepted_total"], 4);
    // The rejected envelope is in quarantine, not deleted.
    let rejected_hex = items[0].0.strip_prefix("sha256:").unwrap();
    // Quarantine names are `<name>.<reason>.<unique suffix>`.
    let prefix = format!("{rejected_hex}.json.rejected.");
    assert!(
        std::fs::read_dir(spool.join("quarantine"))
            .unwrap()
            .flatten()
            .any(|e| e.file_name().to_string_lossy().starts_with(&prefix) && e.path().is_file())
    );
    for (dgst, _) in &items[1..] {
        assert!(collector.has(dgst), "{dgst} not delivered");
    }
    assert_eq!(collector.torn(), 0);
    assert_eq!(
        collector.record.lock().unwrap().bad_auth,
        0,
        "bearer key sent"
    );
}

#[test]
fn collector_faults_nothing_deleted_while_the_collector_keeps_failing() {
    let dir = tempfile::tempdir().unwrap();
    let collector = Collector::start();
    for _ in 0..1000 {
        collector.push(Fault::Status(500, None));
    }
    let spool = dir.path().join("spool");
    for n in 0..3 {
        let (dgst, bytes) = sealed_example(100 + n);
        write_spool_file(&spool, &dgst, &bytes);
    }
    let d = Daemon::start(
        dir.path(),
        &Settings {
            collector_url: Some(collector.url()),
            backoff_initial_ms: 10,
            backoff_max_ms: 40,
            ..Settings::default()
        },
    );
    wait_until(Duration::from_secs(10), "several failed attempts", || {
        failures(&d, "server_error") >= 5
    });
    assert_eq!(spool_files(&d), 3, "nothing deleted without an ack");
    let s = d.status();
    assert!(
        s["shipping"]["last_error"]
            .as_str()
            .unwrap()
            .contains("500"),
        "{s:#}"
    );
    assert_eq!(collector.stored(), 0);
}

#[test]
fn collector_down_then_up_across_a_pstackd_restart_delivers_each_envelope_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let addr = Collector::reserve_port(); // nothing listens yet: the collector is down
    let settings = Settings {
        collector_url: Some(format!("http://{addr}")),
        backoff_initial_ms: 50,
        backoff_max_ms: 200,
        ..Settings::default()
    };
    let target = Sleeper::spawn();
    let mut captured = HashSet::new();
    let mut d = Daemon::start(dir.path(), &settings);
    for _ in 0..5 {
        captured.insert(
            d.capture_pid(target.pid())
                .expect("capture while down")
                .digest,
        );
    }
    wait_until(Duration::from_secs(5), "a failed connect", || {
        failures(&d, "connect") >= 1
    });
    let (st, _) = d.terminate(Duration::from_secs(10));
    assert_eq!(st.code(), Some(0));
    let mut d = Daemon::start(dir.path(), &settings);
    assert_eq!(spool_files(&d), 5, "the backlog survived the restart");
    for _ in 0..5 {
        captured.insert(
            d.capture_pid(target.pid())
                .expect("capture after restart")
                .digest,
        );
    }
    assert_eq!(captured.len(), 10);
    // The collector comes up.
    let collector = Collector::start_on(addr);
    d.wait_status(Duration::from_secs(15), "spool drained", |s| {
        s["spool"]["files"] == 0
    });
    let stored = collector.arrived();
    assert_eq!(stored, captured, "every captured envelope arrived");
    eprintln!(
        "duplicates counted at the collector: {}",
        collector.duplicates()
    );
    assert_eq!(collector.torn(), 0);
    let (st, _) = d.terminate(Duration::from_secs(10));
    assert_eq!(st.code(), Some(0));
}

#[test]
fn kill9_during_spool_writes_repeated_never_ships_a_torn_envelope_and_loses_nothing_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    let addr = Collector::reserve_port();
    let settings = Settings {
        collector_url: Some(format!("http://{addr}")),
        max_concurrent: 8,
        backoff_initial_ms: 50,
        backoff_max_ms: 100,
        ..Settings::default()
    };
    let target = Sleeper::spawn();
    let mut acknowledged: HashSet<String> = HashSet::new();
    // Writes the kill interrupted: each leaves its `.tmp-` file, which the next start
    // quarantines as `stray_tmp` when torn or recovers when it holds a complete, valid
    // envelope (counted per process in quarantined_total / recovered_total). The test is
    // only meaningful if kills land inside writes many times: run at least 12 rounds and
    // until 10 interrupted writes were seen (at most 100 rounds: a loaded machine lands
    // fewer kills inside writes), then require >= 10.
    const WANTED: u64 = 10;
    let mut interrupted = 0;
    let mut rounds = 0;
    while rounds < 12 || (interrupted < WANTED && rounds < 100) {
        let round = rounds;
        rounds += 1;
        let mut d = Daemon::start(dir.path(), &settings);
        if round > 0 {
            d.wait_serving(Duration::from_secs(10));
            // A torn temp file is quarantined; one that was complete but not yet
            // renamed is verified and recovered (issue 10): both were interrupted.
            let spool = &d.status()["spool"];
            interrupted += spool["quarantined_total"].as_u64().unwrap()
                + spool["recovered_total"].as_u64().unwrap();
        }
        let socket = d.socket.clone();
        let pid = target.pid();
        let writers: Vec<_> = (0..6)
            .map(|_| {
                let socket = socket.clone();
                std::thread::spawn(move || {
                    let mut got = Vec::new();
                    for _ in 0..20 {
                        match capture(&socket, pid, 2_000) {
                            Ok(env) => got.push(env.digest),
                            Err(_) => break, // the daemon died mid-request: not acknowledged
                        }
                    }
                    got
                })
            })
            .collect();
        // Kill at a varying point inside the write storm.
        // (Long enough for captures to complete on a loaded debug build.)
        std::thread::sleep(Duration::from_millis(200 + (round as u64 * 37) % 300));
        d.kill9();
        for w in writers {
            acknowledged.extend(w.join().unwrap());
        }
    }
    assert!(!acknowledged.is_empty());
    let collector = Collector::start_on(addr);
    let d = Daemon::start(dir.path(), &settings);
    d.wait_status(Duration::from_secs(30), "spool drained", |s| {
        s["spool"]["files"] == 0
    });
    let stored = collector.arrived();
    let lost: Vec<_> = acknowledged.difference(&stored).collect();
    assert!(
        lost.is_empty(),
        "acknowledged but never delivered: {lost:?}"
    );
    assert_eq!(collector.torn(), 0, "a torn envelope was shipped");
    let st = d.status();
    let q = st["spool"]["quarantined_total"].as_u64().unwrap();
    interrupted += q;
    let recovered = st["spool"]["recovered_total"].as_u64().unwrap();
    interrupted += recovered;
    eprintln!(
        "DRILL pstackd: {rounds} kill -9 rounds: {} acknowledged, {} stored, {} lost, {} torn, {q} quarantined, {recovered} recovered at the final restart; {interrupted} writes interrupted in all",
        acknowledged.len(),
        stored.len(),
        lost.len(),
        collector.torn()
    );
    assert!(
        interrupted >= WANTED,
        "only {interrupted} writes were interrupted by {rounds} kill -9 rounds: the kills did not land inside writes"
    );
    // Only tmp leftovers may be quarantined; never a named (renamed) envelope.
    for e in std::fs::read_dir(dir.path().join("spool/quarantine")).unwrap() {
        let name = e.unwrap().file_name().into_string().unwrap();
        assert!(
            name.starts_with(".tmp-") && name.contains(".stray_tmp."),
            "unexpected quarantine: {name}"
        );
    }
}

#[test]
fn collector_faults_a_refused_api_key_is_classified_kept_and_the_key_never_logged() {
    let dir = tempfile::tempdir().unwrap();
    let collector = Collector::start();
    let spool = dir.path().join("spool");
    let (dgst, bytes) = sealed_example(300);
    write_spool_file(&spool, &dgst, &bytes);
    let wrong =
        "psk_ffffffffffffffff_0000000000000000000000000000000000000000000000000000000000000000";
    let d = Daemon::start(
        dir.path(),
        &Settings {
            collector_url: Some(collector.url()),
            api_key: Some(wrong.into()),
            backoff_initial_ms: 20,
            backoff_max_ms: 50,
            ..Settings::default()
        },
    );
    wait_until(Duration::from_secs(10), "401s", || {
        failures(&d, "client_error") >= 2
    });
    assert!(collector.record.lock().unwrap().bad_auth >= 2);
    let s = d.status();
    assert_eq!(s["spool"]["files"], 1, "kept until the key is fixed");
    assert!(
        s["shipping"]["last_error"]
            .as_str()
            .unwrap()
            .contains("401")
    );
    let everything = format!("{s}{}{}", d.log_text(), d.metric_text());
    assert!(!everything.contains(wrong), "the API key leaked");
}
