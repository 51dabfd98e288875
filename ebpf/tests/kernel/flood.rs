//! Bounds under a flood (root, netns): 10 000 short connections against a
//! 4 KiB ring buffer and a 64-flow cap. The ring overflows and every lost
//! event is counted (kernel seen = read + lost, exactly), the surface is
//! `truncated`, summaries stay within their caps and memory stays flat.

use std::time::{Duration, Instant};

use pstack_ebpf::aggregate::TcpSurface;
use pstack_ebpf::{EbpfConfig, TcpEventKind};
use pstack_envelope::SurfaceStatus;

use crate::fixtures::{NetNs, connect, in_port_window, rss_bytes};
use crate::require_kernel;

const CONNECTIONS: usize = 10_000;

const FLOOD_CHILD: &str = "PSTACK_EBPF_TEST_FLOOD_CHILD";

/// Runs the flood in a process of its own (re-exec of this binary), so its RSS
/// measures this session alone and not the other tests' sessions.
#[test]
fn flood_of_short_connections_keeps_maps_and_memory_bounded_and_counts_losses() {
    require_kernel!();
    let out = std::process::Command::new(std::env::current_exe().expect("exe"))
        .args([
            "--exact",
            "flood::flood_child_half",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(FLOOD_CHILD, "1")
        .output()
        .expect("spawn flood child");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && text.contains("FLOOD-OK"),
        "flood child failed:\n{text}"
    );
}

#[test]
fn flood_child_half() {
    if std::env::var_os(FLOOD_CHILD).is_none() {
        return;
    }
    let ns = NetNs::new();
    let mut cfg = EbpfConfig::tcp();
    // Every event a record, so "seen = read + lost" can be checked exactly.
    cfg.tcp_per_event = true;
    cfg.ring_bytes = 4096;
    cfg.wakeup_bytes = 2048;
    cfg.limits.max_flows = 64;
    cfg.limits.max_samples = 32;
    let window = Duration::from_secs(120);
    let (report, (flood_took, rss0, rss1), s) = in_port_window(&ns, cfg, window, |l| {
        let rss0 = rss_bytes();
        let t = Instant::now();
        let server = l.local_addr().expect("addr");
        // The connector never runs more than MAX_PENDING connections ahead of
        // the acceptor: a connection reset while it waits in a full accept
        // queue is never accepted, and an acceptor counting to CONNECTIONS
        // would then wait forever (seen on a loaded machine). The listener's
        // backlog is larger than MAX_PENDING, so no connection is lost.
        const MAX_PENDING: usize = 64;
        let accepted = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let acceptor = {
            let accepted = accepted.clone();
            std::thread::spawn(move || {
                for _ in 0..CONNECTIONS {
                    drop(l.accept().expect("accept"));
                    accepted.fetch_add(1, std::sync::atomic::Ordering::Release);
                }
            })
        };
        for n in 0..CONNECTIONS {
            let paced = Instant::now();
            while n - accepted.load(std::sync::atomic::Ordering::Acquire) >= MAX_PENDING {
                assert!(
                    paced.elapsed() < Duration::from_secs(30),
                    "acceptor stuck at {} of {n} connections",
                    accepted.load(std::sync::atomic::Ordering::Acquire)
                );
                std::thread::yield_now();
            }
            let c = connect(server).expect("connect");
            nix::sys::socket::setsockopt(
                &std::os::fd::AsFd::as_fd(&c),
                nix::sys::socket::sockopt::Linger,
                &libc::linger {
                    l_onoff: 1,
                    l_linger: 0,
                },
            )
            .expect("linger"); // RST close: no TIME_WAIT pile-up, and reset events too
            drop(c);
        }
        acceptor.join().expect("acceptor");
        (t.elapsed(), rss0, rss_bytes())
    });
    assert!(
        flood_took + Duration::from_millis(500) < window,
        "flood ({flood_took:?}) ended well inside the window"
    );
    let agg = report.tcp.as_ref().expect("tcp");
    let k = report.tcp_kernel.expect("kernel counts");

    // Losses are counted, exactly: what the programs saw = what we read + what the ring refused.
    for (j, kind) in TcpEventKind::ALL.into_iter().enumerate() {
        assert_eq!(
            k.seen[j],
            agg.seen(kind) + k.lost[j],
            "{kind:?}: kernel {} = read {} + lost {}",
            k.seen[j],
            agg.seen(kind),
            k.lost[j]
        );
    }
    let lost: u64 = k.lost.iter().sum();
    assert!(lost > 0, "a 4 KiB ring cannot hold a 10k-connection flood");
    assert!(
        k.seen[3] >= (CONNECTIONS * 4) as u64,
        "every connection changed state at least 4 times"
    );
    let status = s.status().expect("status");
    assert!(
        status.tcp_lost.values().sum::<u64>() >= lost,
        "losses show in the cumulative status too"
    );

    // Caps hold.
    assert!(agg.flows().len() <= 64);
    for sf in TcpSurface::ALL {
        assert!(agg.samples(sf).len() <= 32);
    }
    assert!(
        agg.truncated(TcpSurface::Lifecycle),
        "flows beyond the cap are counted as untracked"
    );
    let surfaces = report.surfaces();
    let life = surfaces
        .iter()
        .find(|s| s.id == "ebpf:tcp_lifecycle")
        .expect("lifecycle");
    assert_eq!(life.status, SurfaceStatus::Truncated);
    assert!(life.truncated);
    assert!(
        life.facts["lost_events"].as_u64().unwrap_or(0) > 0
            || life.facts["untracked_events"].as_u64().unwrap_or(0) > 0
    );
    assert_eq!(life.facts["sample_truncated"], true);
    assert!(
        life.facts["flows"]
            .as_array()
            .is_some_and(|f| f.len() <= 64)
    );

    // Memory stays flat while the flood is aggregated (the caps allow a few hundred KiB).
    let grew = rss1.saturating_sub(rss0);
    assert!(grew < 8 << 20, "RSS grew by {grew} bytes during the flood");
    println!(
        "FLOOD-OK took={flood_took:?} rss_growth={grew} lost={lost} seen={:?}",
        k.seen
    );
}
