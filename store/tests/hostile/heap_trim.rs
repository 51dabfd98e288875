//! Freed heap goes back to the OS once ingest is quiet, not after every
//! request: a trim flushes every core's TLB and the pages fault back in, and
//! under a steady load trimming after each request cost ~35 of ~190 µs of CPU
//! per envelope (issue 31 item 5).

use std::time::{Duration, Instant};

use super::{request, start};

fn heap_trims(addr: std::net::SocketAddr) -> u64 {
    let (code, metrics, _) = request(
        addr,
        "GET /metrics HTTP/1.1\r\nHost: s\r\nConnection: close\r\n\r\n",
        b"",
    );
    assert_eq!(code, 200);
    String::from_utf8_lossy(&metrics)
        .lines()
        .find_map(|l| l.strip_prefix("pstack_store_heap_trims_total "))
        .and_then(|v| v.trim().parse().ok())
        .expect("pstack_store_heap_trims_total in /metrics")
}

#[test]
fn freed_heap_is_given_back_once_ingest_goes_quiet_not_after_every_request() {
    let server = start();
    let quiet = Duration::from_millis(200); // pstack_store::conn::TRIM_QUIET
    let before = heap_trims(server.addr);
    // 40 ingest requests one after another: each ends with the whole
    // budget free, which used to trim every time.
    let body = b"[]";
    let head = format!(
        "POST /v1/envelopes HTTP/1.1\r\nHost: s\r\nConnection: close\r\nAuthorization: Bearer {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        server.key,
        body.len()
    );
    let mut quiet_gaps = 0;
    let mut last = Instant::now();
    for _ in 0..40 {
        let (code, _, text) = request(server.addr, &head, body);
        assert!(code == 200 || code == 400, "{text}");
        // A pause this long (a slow machine) lets a trim in; allow for it.
        if last.elapsed() >= quiet * 3 / 4 {
            quiet_gaps += 1;
        }
        last = Instant::now();
    }
    let during = heap_trims(server.addr) - before;
    std::thread::sleep(quiet * 4);
    let after = heap_trims(server.addr) - before;
    eprintln!(
        "trims: {during} during 40 requests ({quiet_gaps} pauses of 150 ms+), {after} once quiet"
    );
    assert!(
        during <= quiet_gaps + 1,
        "{during} trims during a steady run of 40 requests ({quiet_gaps} pauses)"
    );
    assert!(after >= 1, "no trim after ingest went quiet");
    assert!(
        after <= during + 1,
        "one trim once quiet, not {}",
        after - during
    );
}
