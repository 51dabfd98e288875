//! Issue 12: pstackd's TCP watch rules on the netns/veth testbed, with a
//! real `pstack-store` as the collector. A stream on a watched port loses
//! 30 % of its segments for 10 s and is then reset by its receiver: the
//! flight recorder's history of the flow (retransmits from before the
//! reset) reaches the store sealed, fired by the rule, with the RST facts.
//! A storm of resets is bounded by the rule's limit and the rest counted.
//! Root only (namespaces, nftables, eBPF).

use std::io::Read;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::MutexGuard;
use std::time::{Duration, Instant};

use pstack_envelope::{ClaimKind, Envelope, Subject};
use serde_json::Value;

use crate::daemon_common::{Daemon, Settings};
use crate::daemon_e2e::Store;
use crate::testbed::*;

/// Root, the serial lock, a store and a pstackd shipping to it with `rules`,
/// every rule armed; `None` when not root (skipped, or failed under CI).
fn watching(
    test: &str,
    rules: &str,
) -> Option<(MutexGuard<'static, ()>, tempfile::TempDir, Store, Daemon)> {
    if !root_or_skip(test) {
        return None;
    }
    let serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let store = Store::start(dir.path());
    let d = daemon_watching(dir.path(), &store, rules);
    for line in rules.lines() {
        if let Some(name) = line.strip_prefix("name = ") {
            wait_armed(&d, name.trim_matches('"'));
        }
    }
    Some((serial, dir, store, d))
}

fn daemon_watching(dir: &std::path::Path, store: &Store, rules: &str) -> Daemon {
    let settings = Settings {
        collector_url: Some(format!("http://{}", store.addr)),
        api_key: Some(store.key.clone()),
        backoff_initial_ms: 50,
        backoff_max_ms: 300,
        extra: rules.to_string(),
        ..Settings::default()
    };
    Daemon::start(&dir.join("d"), &settings)
}

fn wait_armed(d: &Daemon, name: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let r = d.watch_rule(name);
        if r["state"] == "armed" {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{name} never armed: {r:#}\n{}",
            d.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn facts(e: &Envelope) -> Vec<String> {
    e.claims
        .iter()
        .filter(|c| c.kind == ClaimKind::Fact)
        .map(|c| c.code.clone())
        .collect()
}

#[test]
fn root_a_reset_after_loss_is_sealed_from_the_flight_recorder_and_reaches_the_store() {
    let Some((_serial, _dir, store, d)) = watching(
        "root_a_reset_after_loss_is_sealed_from_the_flight_recorder_and_reaches_the_store",
        "[[watch]]\nname = \"rebuild-resets\"\nkind = \"tcp_reset\"\nports = \"10000-10010\"\n",
    ) else {
        return;
    };
    let bed = Testbed::new("wrst");
    let transfer = Transfer::start_paced(&bed, false, None, 200);
    // 30 % of B's inbound data segments dropped for 10 s: A retransmits.
    bed.b.nft(&format!(
        "table inet loss {{ chain input {{ type filter hook input priority 0; policy accept; tcp dport {DATA_PORT} tcp flags & syn == 0 numgen random mod 100 < 30 drop; }} }}"
    ));
    let loss_began = pstack_ebpf::monotonic_ns();
    std::thread::sleep(Duration::from_secs(10));
    // Then the receiver resets the stream.
    transfer
        .knobs
        .abort_data
        .store(true, std::sync::atomic::Ordering::Relaxed);
    let reset_at = Instant::now();
    // The sender's end (A, received the RST) is sealed from the recorder.
    let e = d.wait_captured(Duration::from_secs(20), "the sender's end", |e| {
        e["rule"] == "rebuild-resets"
            && e["subject"]
                .as_str()
                .is_some_and(|s| s.ends_with(&format!(">{B_V4}:{DATA_PORT}")))
    });
    let digest = e["envelopes"][0].as_str().unwrap().to_string();
    let took_ms = e["fault_to_sealed_ms"].as_u64().unwrap();
    drop(transfer);
    let env = store.envelope(&digest);
    let t = env.collector.trigger.as_ref().expect("fired by the rule");
    assert_eq!(
        (t.rule.as_str(), t.kind.as_str()),
        ("rebuild-resets", "tcp_reset")
    );
    assert_eq!(t.condition["reset"], "received_from_peer");
    match &env.subject {
        Subject::NetworkStream(s) => {
            assert_eq!(s.dst, format!("{B_V4}:{DATA_PORT}"));
            assert!(s.src.starts_with(A_V4), "{s:?}");
        }
        other => panic!("not a stream envelope: {other:?}"),
    }
    let codes = facts(&env);
    assert!(
        codes.contains(&"rst_received_from_peer".to_string()),
        "{codes:?}"
    );
    assert!(codes.contains(&"flow_retransmits".to_string()), "{codes:?}");
    let rec = &env
        .surfaces
        .iter()
        .find(|s| s.id == "ebpf/flight_recorder")
        .expect("flight record surface")
        .facts;
    let retrans = rec["totals"]["retransmits"].as_u64().unwrap();
    assert!(retrans > 0, "{rec:#?}");
    // The retransmits are from before the reset, and the record reaches back
    // to before the loss began (the flow was recorded since it opened).
    let last = rec["last_seen_ns"].as_u64().unwrap();
    let before_reset: u64 = rec["buckets"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|b| b["second_start_ns"].as_u64().unwrap() + 1_000_000_000 <= last)
        .map(|b| b["retransmits"].as_u64().unwrap())
        .sum();
    assert!(
        before_reset > 0,
        "retransmits recorded before the reset's second: {rec:#?}"
    );
    assert!(
        rec["reached_back_ns"].as_u64().unwrap() <= loss_began,
        "the record reaches back before the loss: {rec:#?}"
    );
    assert!(
        rec["reached_back_before_last_ns"].as_u64().unwrap() >= 10_000_000_000,
        "{rec:#?}"
    );
    eprintln!(
        "reset -> sealed: {took_ms} ms from the reset event (observed {} ms after the test's reset)",
        reset_at.elapsed().as_millis()
    );

    // The receiver's end (B, sent the RST) was sealed too; the store joins
    // the two recorded ends as one transfer and names B as the RST's sender.
    let b_end = format!("{B_V4}:{DATA_PORT}>");
    let b_digest = d.wait_captured(Duration::from_secs(20), "the receiver's end", |e| {
        e["subject"].as_str().is_some_and(|s| s.contains(&b_end))
    })["envelopes"][0]
        .as_str()
        .unwrap()
        .to_string();
    let b_env = store.envelope(&b_digest);
    assert!(
        facts(&b_env).contains(&"rst_sent_by_local".to_string()),
        "{:?}",
        facts(&b_env)
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    let transfer: Value = loop {
        if let Some((200, body)) = store.get(&format!("/v1/envelopes/{digest}/transfer")) {
            break serde_json::from_slice(&body).unwrap();
        }
        assert!(Instant::now() < deadline, "the two ends were never joined");
        std::thread::sleep(Duration::from_millis(200));
    };
    let t = &transfer["transfer"];
    assert_eq!(t["basis"], "mirrored_4tuple", "{t:#}");
    let sides = t["sides"].as_array().unwrap();
    assert_eq!(sides.len(), 2, "{t:#}");
    let b_side = sides
        .iter()
        .find(|s| {
            s["local"]
                .as_array()
                .unwrap()
                .iter()
                .any(|l| l == &Value::from(format!("{B_V4}:{DATA_PORT}")))
        })
        .unwrap_or_else(|| panic!("no side local to B: {t:#}"));
    assert_eq!(
        t["verdicts"]["rst_sent_by"]["side"], b_side["side"],
        "{t:#}"
    );
}

/// A listener in B on `port` that accepts `n` connections and closes each
/// with SO_LINGER {1,0} (a RST); A connects `n` times.
fn reset_storm(bed: &Testbed, port: u16, n: usize) {
    let addr: SocketAddr = format!("{B_V4}:{port}").parse().unwrap();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let server = bed.b.spawn(move || {
        let l = TcpListener::bind(addr).unwrap();
        ready_tx.send(()).unwrap();
        for _ in 0..n {
            let (s, _) = l.accept().unwrap();
            reset_on_close(&s);
            drop(s);
        }
    });
    ready_rx.recv_timeout(Duration::from_secs(5)).unwrap();
    bed.a.within(move || {
        for _ in 0..n {
            // The RST may arrive before connect returns: errors are the point.
            if let Ok(mut c) = TcpStream::connect_timeout(&addr, Duration::from_secs(5)) {
                let _ = c.set_read_timeout(Some(Duration::from_secs(5)));
                let mut b = [0u8; 1];
                let _ = c.read(&mut b);
            }
            std::thread::sleep(Duration::from_millis(40));
        }
    });
    server.join().unwrap();
}

#[test]
fn root_a_reset_storm_is_bounded_by_the_rule_limit_and_the_rest_counted() {
    let Some((_serial, _dir, _store, d)) = watching(
        "root_a_reset_storm_is_bounded_by_the_rule_limit_and_the_rest_counted",
        "[[watch]]\nname = \"storm\"\nkind = \"tcp_reset\"\nports = \"10005\"\nmax_per_hour = 5\nmax_per_subject_per_hour = 1\n",
    ) else {
        return;
    };
    let bed = Testbed::new("wstorm");
    let started = Instant::now();
    reset_storm(&bed, 10005, 200);
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "storm took {:?}",
        started.elapsed()
    );
    // Every reset is seen (each is sent by B and received by A: 400 firings).
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let r = d.watch_rule("storm");
        let fired = r["fired_total"].as_u64().unwrap();
        let done = r["captured_total"].as_u64().unwrap()
            + r["failed_total"].as_u64().unwrap()
            + r["suppressed_total"].as_u64().unwrap();
        if fired >= 400 && done == fired {
            break;
        }
        assert!(Instant::now() < deadline, "storm not settled: {r:#}");
        std::thread::sleep(Duration::from_millis(200));
    }
    let r = d.watch_rule("storm");
    let captured = r["captured_total"].as_u64().unwrap();
    assert!(
        (1..=5).contains(&(captured + r["failed_total"].as_u64().unwrap())),
        "captures bounded by max_per_hour = 5: {r:#}"
    );
    let metrics = d.metric_text();
    pstack_testkit::promtool_check_metrics(&metrics).expect("promtool accepts /metrics");
    let limited =
        d.metric("pstackd_watch_suppressed_total{rule=\"storm\",kind=\"tcp_reset\",reason=\"rate_limit_rule\"}");
    // Every firing not captured is counted under a reason: mostly the rule's
    // limit, some `busy` while the five captures held the slots.
    let busy = d.metric(
        "pstackd_watch_suppressed_total{rule=\"storm\",kind=\"tcp_reset\",reason=\"busy\"}",
    );
    assert!(limited >= 300, "{metrics}");
    assert_eq!(
        limited + busy,
        r["suppressed_total"].as_u64().unwrap(),
        "{metrics}"
    );
    assert_eq!(
        d.metric("pstackd_watch_fired_total{rule=\"storm\",kind=\"tcp_reset\"}"),
        r["fired_total"].as_u64().unwrap()
    );
    assert_eq!(
        d.metric("pstackd_flight_recorder_incidents_dropped_total"),
        0
    );
}

#[test]
fn root_an_rto_on_a_live_stream_starts_a_live_window_in_its_namespace() {
    let Some((_serial, _dir, store, d)) = watching(
        "root_an_rto_on_a_live_stream_starts_a_live_window_in_its_namespace",
        "[[watch]]\nname = \"rto\"\nkind = \"tcp_rto\"\nports = \"10001\"\nwindow = \"2s\"\n",
    ) else {
        return;
    };
    let bed = Testbed::new("wrto");
    let transfer = Transfer::start_paced(&bed, false, None, 500);
    // Every data segment into B dropped: A's retransmission timer fires.
    bed.b.nft(&format!(
        "table inet hole {{ chain input {{ type filter hook input priority 0; policy accept; tcp dport {DATA_PORT} tcp flags & syn == 0 drop; }} }}"
    ));
    let digests = d.wait_captured(Duration::from_secs(30), "a live window", |e| {
        e["rule"] == "rto"
    })["envelopes"]
        .as_array()
        .unwrap()
        .clone();
    drop(transfer);
    // The live window's envelope of the flow, from A's namespace, with the
    // rule in its collector.
    let env = digests
        .iter()
        .map(|v| store.envelope(v.as_str().unwrap()))
        .find(|e| matches!(&e.subject, Subject::NetworkStream(s) if s.dst == format!("{B_V4}:{DATA_PORT}")))
        .expect("an envelope of the stream to B");
    let t = env.collector.trigger.as_ref().expect("fired by the rule");
    assert_eq!((t.rule.as_str(), t.kind.as_str()), ("rto", "tcp_rto"));
    assert_eq!(
        env.collector.name, "pstackctl capture transport",
        "a live transport window"
    );
    let window_ms = env.clock.monotonic_end_ns.parse::<u64>().unwrap()
        - env.clock.monotonic_start_ns.parse::<u64>().unwrap();
    assert!(
        window_ms >= 2_000_000_000,
        "the live window ran its 2 s: {window_ms} ns"
    );
}
