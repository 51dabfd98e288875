//! OTLP decode amplification against the real `pstack-store` binary (issue
//! 28, item 3): an empty span is 2 bytes of protobuf and hundreds decoded,
//! and gzip makes the wire body ~1000× smaller still. A 15.6 KB body of
//! empty spans took the store to 2.05 GB; three concurrent 3.9 KB ones to
//! 1.7 GB. The bodies here are written byte by byte from the protobuf wire
//! format (building millions of `Span`s in the test would itself take GBs).
//! Then three bodies at the span cap at once: what the budget admits is
//! decoded, the rest is 503 + Retry-After, and RSS stays bounded.

use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::{healthz, request, start};

fn varint(mut n: u64, out: &mut Vec<u8>) {
    while n >= 0x80 {
        out.push((n as u8) | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
}

/// One length-delimited field (wire type 2).
fn field(number: u64, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(body.len() + 12);
    varint((number << 3) | 2, &mut out);
    varint(body.len() as u64, &mut out);
    out.extend_from_slice(body);
    out
}

/// `ExportTraceServiceRequest{resource_spans: [{scope_spans: [{spans: [{} × n]}]}]}`:
/// each empty span is `0x12 0x00` (field 2, length 0).
pub(crate) fn empty_spans(n: usize) -> Vec<u8> {
    let spans = [0x12u8, 0x00].repeat(n);
    field(1, &field(2, &spans))
}

/// One span with `n` empty attributes (`0x4a 0x00`: field 9, length 0):
/// the amplification moved from spans to key-values, under any span cap.
fn empty_attributes(n: usize) -> Vec<u8> {
    let attrs = [0x4au8, 0x00].repeat(n);
    field(1, &field(2, &field(2, &attrs)))
}

pub(crate) fn gzip_best(bytes: &[u8]) -> Vec<u8> {
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    enc.write_all(bytes).unwrap();
    enc.finish().unwrap()
}

/// VmRSS or VmHWM (peak) of `pid`, KiB.
fn status_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

fn post_traces(addr: std::net::SocketAddr, key: &str, gz: &[u8]) -> (u16, String) {
    let head = format!(
        "POST /v1/traces HTTP/1.1\r\nHost: s\r\nConnection: close\r\nAuthorization: Bearer {key}\r\nContent-Type: application/x-protobuf\r\nContent-Encoding: gzip\r\nContent-Length: {}\r\n\r\n",
        gz.len()
    );
    let (code, body, _) = request(addr, &head, gz);
    (code, String::from_utf8_lossy(&body).into_owned())
}

// Regression: /v1/traces had no memory budget, span cap or per-key limit; a
// 15.6 KB gzip body of empty spans took the store to 2.05 GB peak RSS.
#[test]
fn otlp_amplification_keeps_rss_bounded_and_healthz_answering() {
    let server = start();
    let pid = server.child.id();
    let one = gzip_best(&empty_spans(8_000_000));
    let small = gzip_best(&empty_spans(2_000_000));
    let attrs = gzip_best(&empty_attributes(8_000_000));
    eprintln!(
        "bodies: {} B gzip (8 M empty spans), {} B (2 M), {} B (1 span, 8 M empty attributes)",
        one.len(),
        small.len(),
        attrs.len()
    );
    assert!(
        one.len() < 20_000 && small.len() < 5_000,
        "the bodies stay tiny on the wire"
    );
    // Warm up (first request, connection pools), then read idle RSS.
    let (code, body) = post_traces(server.addr, &server.key, &gzip_best(&empty_spans(10)));
    assert_eq!(code, 200, "{body}");
    std::thread::sleep(Duration::from_millis(300));
    let idle = status_kib(pid, "VmRSS:");

    // /healthz answers within 1 s throughout.
    let stop = Arc::new(AtomicBool::new(false));
    let worst_ms = Arc::new(AtomicU64::new(0));
    let prober = {
        let (stop, worst_ms, addr) = (stop.clone(), worst_ms.clone(), server.addr);
        std::thread::spawn(move || {
            let mut probes = 0u32;
            while !stop.load(Ordering::Relaxed) {
                let ms = healthz(addr).map_or(u64::MAX, |d| d.as_millis() as u64);
                worst_ms.fetch_max(ms, Ordering::Relaxed);
                probes += 1;
                std::thread::sleep(Duration::from_millis(100));
            }
            probes
        })
    };
    let started = Instant::now();
    let mut answers = vec![post_traces(server.addr, &server.key, &one)];
    let concurrent: Vec<_> = [&small, &small, &small, &attrs]
        .into_iter()
        .map(|body| {
            let (addr, key, body) = (server.addr, server.key.clone(), body.clone());
            std::thread::spawn(move || post_traces(addr, &key, &body))
        })
        .collect();
    answers.extend(concurrent.into_iter().map(|t| t.join().unwrap()));
    // At the cap (100,000 spans, ~110 MB charged each): three at once do
    // not all fit the 256 MiB budget; what is admitted is decoded.
    let at_cap = gzip_best(&empty_spans(100_000));
    let concurrent: Vec<_> = (0..3)
        .map(|_| {
            let (addr, key, body) = (server.addr, server.key.clone(), at_cap.clone());
            std::thread::spawn(move || post_traces(addr, &key, &body))
        })
        .collect();
    let at_cap_answers: Vec<_> = concurrent.into_iter().map(|t| t.join().unwrap()).collect();
    let flood = started.elapsed();
    stop.store(true, Ordering::Relaxed);
    let probes = prober.join().unwrap();
    let peak = status_kib(pid, "VmHWM:");
    std::thread::sleep(Duration::from_secs(1));
    let after = status_kib(pid, "VmRSS:");
    let worst = worst_ms.load(Ordering::Relaxed);
    eprintln!(
        "OTLP flood: idle {} MiB, peak {} MiB (+{} MiB), after {} MiB; {probes} /healthz probes, worst {worst} ms; {flood:?}; answers {:?}",
        idle >> 10,
        peak >> 10,
        peak.saturating_sub(idle) >> 10,
        after >> 10,
        answers
            .iter()
            .map(|(c, b)| format!("{c} {b:.160}"))
            .collect::<Vec<_>>()
    );
    assert!(
        peak < idle + (256 << 10),
        "peak RSS {} MiB, {} MiB over idle",
        peak >> 10,
        peak.saturating_sub(idle) >> 10
    );
    assert!(worst < 1000, "worst /healthz {worst} ms");
    for (code, body) in &answers[..4] {
        assert_eq!(*code, 413, "{body}");
        let v: serde_json::Value = serde_json::from_str(body).expect("JSON error");
        assert_eq!(v["error"]["code"], "too_many_spans", "{body}");
    }
    let (code, body) = &answers[4];
    assert_eq!(*code, 413, "{body}");
    let v: serde_json::Value = serde_json::from_str(body).expect("JSON error");
    assert_eq!(v["error"]["code"], "otlp_decode_too_large", "{body}");
    let codes: Vec<u16> = at_cap_answers.iter().map(|(c, _)| *c).collect();
    eprintln!("at the cap, three at once: {codes:?}");
    assert!(
        codes.iter().all(|c| *c == 200 || *c == 503),
        "{at_cap_answers:?}"
    );
    assert!(codes.contains(&200), "{at_cap_answers:?}");
    assert!(
        after < idle + (64 << 10),
        "RSS stayed at {} MiB after the flood",
        after >> 10
    );
    assert!(healthz(server.addr).is_some());
}
