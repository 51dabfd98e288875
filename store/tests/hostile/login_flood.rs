//! A flood of unauthenticated logins against the real binary (issue 28).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use super::{healthz, request, rss_kib, start_with};

/// A line of /proc/PID/status in KiB.
fn status_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

fn create_operator(db: &std::path::Path, name: &str, password: &str) {
    use std::io::Write;
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_pstack-store"))
        .arg("--db")
        .arg(db)
        .args(["users", "create", name])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(format!("{password}\n").as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
}

/// One login: (status, error code, Retry-After present).
fn login(addr: std::net::SocketAddr, user: &str, source: &str) -> (u16, String, bool) {
    let body =
        serde_json::json!({"username": user, "password": "a wrong password 123"}).to_string();
    let head = format!(
        "POST /ui/login HTTP/1.1\r\nHost: s\r\nConnection: close\r\nContent-Type: application/json\r\nX-Forwarded-For: {source}\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    let (code, resp, text) = request(addr, &head, body.as_bytes());
    let err = serde_json::from_slice::<serde_json::Value>(&resp)
        .ok()
        .and_then(|v| v["error"]["code"].as_str().map(str::to_string))
        .unwrap_or_default();
    (
        code,
        err,
        text.to_ascii_lowercase().contains("\r\nretry-after:"),
    )
}

// Regression (issue 28): 120 concurrent bad logins (unknown names mixed in)
// each ran argon2id (19 MiB) with no cap: 2.95 GB peak, 888 MB resident 10
// minutes later. Now at most 4 verify at once, the rest get 429
// `login_verifier_busy` + Retry-After and retry; RSS stays bounded, comes
// back down, and /healthz answers within 1 s throughout.
#[test]
fn a_flood_of_120_concurrent_bad_logins_keeps_rss_bounded_and_healthz_answering() {
    // Each client its own address, through the trusted loopback proxy, so
    // the global verifier slots (not the per-source share) are what bind.
    let server = start_with(&["--trusted-proxy", "127.0.0.1"]);
    create_operator(&server.db, "alice", "the operator password");
    let (addr, pid) = (server.addr, server.child.id());
    // Warm up once (first use makes the unknown-name dummy hash).
    assert_eq!(login(addr, "warmup", "192.0.2.1").0, 401);
    std::thread::sleep(Duration::from_millis(300));
    let idle = rss_kib(pid);
    let done = Arc::new(AtomicBool::new(false));
    let peak_rss = Arc::new(AtomicU64::new(0));
    let sampler = {
        let (done, peak_rss) = (done.clone(), peak_rss.clone());
        std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                peak_rss.fetch_max(rss_kib(pid), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(5));
            }
        })
    };
    let prober = {
        let done = done.clone();
        std::thread::spawn(move || {
            let (mut worst, mut failed, mut probes) = (Duration::ZERO, 0, 0);
            while !done.load(Ordering::Relaxed) {
                match healthz(addr) {
                    Some(lat) => worst = worst.max(lat),
                    None => failed += 1,
                }
                probes += 1;
                std::thread::sleep(Duration::from_millis(50));
            }
            (worst, failed, probes)
        })
    };
    let n = 120;
    let gate = Arc::new(Barrier::new(n));
    let started = Instant::now();
    let clients: Vec<_> = (0..n)
        .map(|i| {
            let gate = gate.clone();
            std::thread::spawn(move || {
                let user = if i % 3 == 0 {
                    "alice".to_string()
                } else {
                    format!("nobody{i}")
                };
                let source = format!("10.0.{}.{}", i / 200, i % 200 + 1);
                gate.wait();
                let mut busy = Vec::new();
                for _ in 0..2000 {
                    let (code, err, retry) = login(addr, &user, &source);
                    if code == 429 && err == "login_verifier_busy" {
                        busy.push(retry);
                        // Sooner than the Retry-After (1 s) says: hostile.
                        std::thread::sleep(Duration::from_millis(250));
                        continue;
                    }
                    return (code, err, busy);
                }
                (0, "never verified".to_string(), busy)
            })
        })
        .collect();
    let results: Vec<_> = clients.into_iter().map(|c| c.join().unwrap()).collect();
    let flood = started.elapsed();
    done.store(true, Ordering::Relaxed);
    sampler.join().unwrap();
    let (worst, failed, probes) = prober.join().unwrap();
    let peak = status_kib(pid, "VmHWM:").max(peak_rss.load(Ordering::Relaxed));
    std::thread::sleep(Duration::from_secs(1));
    let after = rss_kib(pid);
    let busy: Vec<bool> = results.iter().flat_map(|r| r.2.clone()).collect();
    eprintln!(
        "{n} concurrent bad logins in {flood:?}: idle {} MiB, peak {} MiB (+{} MiB), 1 s after {} MiB; \
         {} busy refusals; /healthz worst {worst:?} over {probes} probes, {failed} failed",
        idle >> 10,
        peak >> 10,
        (peak.saturating_sub(idle)) >> 10,
        after >> 10,
        busy.len(),
    );
    // Every login was verified in the end and refused as a bad password.
    for (code, err, _) in &results {
        assert_eq!((*code, err.as_str()), (401, "invalid_credentials"));
    }
    // The slots bound: refusals named the verifier, each with Retry-After,
    // and /metrics counted each.
    assert!(!busy.is_empty(), "no login_verifier_busy under 120 at once");
    assert!(busy.iter().all(|r| *r), "429 without Retry-After");
    let (_, metrics, _) = request(
        addr,
        "GET /metrics HTTP/1.1\r\nHost: s\r\nConnection: close\r\n\r\n",
        b"",
    );
    let counted = String::from_utf8_lossy(&metrics)
        .lines()
        .find_map(|l| l.strip_prefix("pstack_store_login_verifier_busy_total "))
        .and_then(|v| v.trim().parse::<usize>().ok());
    assert_eq!(counted, Some(busy.len()), "/metrics login_verifier_busy");
    assert!(
        peak < idle + (256 << 10),
        "peak RSS {} MiB over an idle {} MiB",
        peak >> 10,
        idle >> 10
    );
    assert_eq!(failed, 0, "/healthz failed {failed} of {probes} probes");
    assert!(worst < Duration::from_secs(1), "worst /healthz {worst:?}");
    assert!(
        after < idle + (64 << 10),
        "RSS stayed at {} MiB (idle {} MiB) after the flood",
        after >> 10,
        idle >> 10
    );
}
