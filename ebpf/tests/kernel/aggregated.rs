//! The aggregated recording mode against the per-event debug mode (root,
//! netns, nftables): two sessions attached at the same time to the same
//! flood — short connections (half closed with RST), a lossy stream
//! (retransmits) — must agree on every per-flow count; and however small the
//! sample, every reset is a record.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::os::fd::AsFd;
use std::time::Duration;

use pstack_ebpf::aggregate::Flow;
use pstack_ebpf::{EbpfConfig, Endpoint, TcpEventKind, TcpSurface, WindowReport};

use crate::fixtures::{NetNs, connect, listener};
use crate::require_kernel;

/// Run `work` in `ns` while one session per config watches the listener's
/// port, each in its own window started before the traffic and ended 300 ms
/// after it.
fn side_by_side<T: Send + 'static>(
    ns: &NetNs,
    cfgs: Vec<EbpfConfig>,
    work: impl FnOnce(TcpListener) -> T + Send + 'static,
) -> (Vec<WindowReport>, T) {
    let (port_tx, port_rx) = std::sync::mpsc::channel();
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let h = ns.run(move || {
        let (l, a) = listener();
        port_tx.send(a.port()).expect("send port");
        go_rx.recv().expect("go");
        let out = work(l);
        std::thread::sleep(Duration::from_millis(300));
        drop(done_tx);
        out
    });
    let port = port_rx.recv().expect("port");
    let mut stops = Vec::new();
    let windows: Vec<_> = cfgs
        .into_iter()
        .map(|mut cfg| {
            cfg.port = Some(port);
            let mut s = crate::session(cfg);
            let (tx, rx) = tokio::sync::oneshot::channel::<()>();
            stops.push(tx);
            std::thread::spawn(move || {
                s.run_window_blocking_until(Duration::from_secs(120), |_| {}, rx)
                    .expect("window")
            })
        })
        .collect();
    // Both windows have drained their stale records well before this.
    std::thread::sleep(Duration::from_millis(300));
    go_tx.send(()).expect("go");
    let _ = done_rx.recv();
    let out = h.join().unwrap_or_else(|e| std::panic::resume_unwind(e));
    for s in stops {
        let _ = s.send(());
    }
    let reports = windows
        .into_iter()
        .map(|w| w.join().expect("window thread"))
        .collect();
    (reports, out)
}

fn linger_zero(c: &std::net::TcpStream) {
    nix::sys::socket::setsockopt(
        &c.as_fd(),
        nix::sys::socket::sockopt::Linger,
        &libc::linger {
            l_onoff: 1,
            l_linger: 0,
        },
    )
    .expect("SO_LINGER");
}

/// `n` short connections to `l`; those with `rst(i)` are closed with a RST.
/// Returns the client addresses of the RST-closed ones.
fn short_connections(l: &TcpListener, n: usize, rst: impl Fn(usize) -> bool) -> Vec<SocketAddr> {
    let server = l.local_addr().expect("addr");
    let mut reset_by = Vec::new();
    for i in 0..n {
        let c = connect(server).expect("connect");
        let (s, _) = l.accept().expect("accept");
        if rst(i) {
            reset_by.push(c.local_addr().expect("local"));
            linger_zero(&c);
        }
        drop(c);
        drop(s);
    }
    reset_by
}

/// 200 small writes through a fresh connection while 20% of the segments
/// arriving at the server port are dropped (retransmits).
fn lossy_stream(l: &TcpListener, ns_name: &str) {
    drop_input(l, ns_name, 20);
    stream_through(l, 200);
}

/// Drop `pct`% of the non-SYN segments arriving at `l`'s port.
fn drop_input(l: &TcpListener, ns_name: &str, pct: u32) {
    let server = l.local_addr().expect("addr");
    NetNs::nft_input_rule(
        ns_name,
        &format!(
            "tcp dport {} tcp flags & syn == 0 numgen random mod 100 < {pct} drop",
            server.port()
        ),
    );
}

/// `writes` small writes through a fresh connection to `l`, read to the end.
fn stream_through(l: &TcpListener, writes: usize) {
    let server = l.local_addr().expect("addr");
    let mut c = connect(server).expect("connect");
    c.set_nodelay(true).expect("nodelay");
    let (mut s, _) = l.accept().expect("accept");
    let reader = std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        let mut n = 0usize;
        while let Ok(k) = s.read(&mut buf) {
            if k == 0 {
                break;
            }
            n += k;
        }
        n
    });
    for _ in 0..writes {
        c.write_all(&[7u8; 256]).expect("write");
        std::thread::sleep(Duration::from_micros(500));
    }
    c.shutdown(std::net::Shutdown::Write).expect("shutdown");
    assert_eq!(reader.join().expect("reader"), writes * 256);
}

/// Everything a flow summary counts, without times (the two sessions' programs
/// read the clock at different instants).
type Counts = (u64, u64, u64, u64, u64, u64, u64, u64, Vec<(u8, u8)>);

fn counts(f: &Flow) -> Counts {
    (
        f.retransmits,
        f.rtos,
        f.fast_retransmits,
        f.other_retransmits,
        f.resets_sent,
        f.resets_received,
        f.state_changes,
        f.transitions_dropped,
        f.transitions.iter().map(|t| (t.from.0, t.to.0)).collect(),
    )
}

/// Flows by endpoints (a multiset: an ephemeral port can come back).
fn by_endpoints(r: &WindowReport) -> BTreeMap<(Endpoint, Endpoint), Vec<Counts>> {
    let mut m: BTreeMap<_, Vec<Counts>> = BTreeMap::new();
    for f in r.tcp.as_ref().expect("tcp").flows() {
        m.entry((f.local, f.remote)).or_default().push(counts(f));
    }
    for v in m.values_mut() {
        v.sort();
    }
    m
}

fn mode(per_event: bool) -> EbpfConfig {
    let mut cfg = EbpfConfig::tcp();
    cfg.tcp_per_event = per_event;
    cfg.ring_bytes = 4 << 20;
    cfg.wakeup_bytes = 64 << 10;
    cfg.limits.max_flows = 100_000;
    cfg.limits.max_samples = 100_000;
    // The kernel keeps 8 transitions per flow: compare like with like.
    cfg.limits.max_transitions_per_flow = 8;
    cfg
}

/// The two windows (aggregated, per-event) of one flood agree: the same events
/// reached both, none lost or left out, every flow with every count, every
/// flow leaving ESTABLISHED a record. Returns the number of flows.
fn assert_agree(agg: &WindowReport, per: &WindowReport) -> usize {
    let a = agg.tcp.as_ref().expect("aggregated");
    let p = per.tcp.as_ref().expect("per-event");
    assert!(a.is_aggregated() && !p.is_aggregated());

    // Both saw the same events, nothing was lost or left out on either side.
    let (ka, kp) = (
        agg.tcp_kernel.expect("kernel counts"),
        per.tcp_kernel.expect("kernel counts"),
    );
    assert_eq!(ka.seen, kp.seen, "the same events reached both sessions");
    assert_eq!(kp.lost, [0; 4], "per-event ring never full");
    assert_eq!(ka.lost, [0; 4], "aggregated ring never full");
    assert_eq!(ka.flow_records_lost + ka.flow_map_refused, 0);
    for s in TcpSurface::ALL {
        assert_eq!(a.untracked(s), 0, "{s:?}: every event is in a flow");
        assert_eq!(p.untracked(s), 0, "{s:?}");
    }
    for kind in TcpEventKind::ALL {
        assert_eq!(a.seen(kind), p.seen(kind), "{kind:?} totals");
    }
    // Every flow, every count.
    let (fa, fp) = (by_endpoints(agg), by_endpoints(per));
    let only_a: Vec<_> = fa.keys().filter(|k| !fp.contains_key(k)).collect();
    let only_p: Vec<_> = fp.keys().filter(|k| !fa.contains_key(k)).collect();
    assert!(
        only_a.is_empty() && only_p.is_empty(),
        "same flows: only aggregated {only_a:?}, only per-event {only_p:?}"
    );
    for (k, vp) in &fp {
        assert_eq!(
            &fa[k], vp,
            "flow {} -> {}: aggregated vs per-event",
            k.0, k.1
        );
    }

    // Every flow leaving ESTABLISHED is a rare record (or the flow record of
    // a flow that went straight to CLOSE stands for it), none sampled away.
    let left = |evs: Vec<&pstack_ebpf::TcpEvent>| {
        let mut v: Vec<_> = evs
            .iter()
            .filter(|e| e.state.0 == 1)
            .map(|e| (e.local, e.remote, e.new_state.map(|s| s.0)))
            .collect();
        v.sort();
        v
    };
    let a_left = left(a.rare[2].iter().collect());
    let p_left = left(p.samples(TcpSurface::Lifecycle).iter().collect());
    assert_eq!(a_left.len(), p_left.len(), "flows leaving ESTABLISHED");
    assert_eq!(a_left, p_left);

    fp.len()
}

#[test]
fn aggregated_and_per_event_modes_agree_on_every_flow_count() {
    require_kernel!();
    let ns = NetNs::new();
    let ns_name = ns.name.clone();
    let (reports, resets) = side_by_side(&ns, vec![mode(false), mode(true)], move |l| {
        let resets = short_connections(&l, 150, |i| i % 2 == 0);
        lossy_stream(&l, &ns_name);
        drop(l); // the listener's own LISTEN -> CLOSE
        resets
    });
    let (agg, per) = (&reports[0], &reports[1]);
    let flows = assert_agree(agg, per);
    assert!(flows >= 300, "both ends of 150 connections: {flows}");
    let p = per.tcp.as_ref().expect("per-event");
    let retransmits = p.seen(TcpEventKind::Retransmit);
    assert!(retransmits > 0, "the lossy stream retransmitted");
    assert_eq!(
        p.seen(TcpEventKind::SendReset),
        resets.len() as u64,
        "one RST per linger-0 close"
    );

    // And the aggregated mode sent a fraction of the records.
    let records = |r: &WindowReport| -> u64 {
        TcpSurface::ALL
            .iter()
            .map(|s| r.tcp.as_ref().expect("tcp").raw(*s).bytes)
            .sum()
    };
    assert!(
        records(agg) < records(per),
        "aggregated {} bytes of records vs per-event {}",
        records(agg),
        records(per)
    );
    let ka = agg.tcp_kernel.expect("kernel counts");
    println!(
        "AGREE flows={} seen={:?} rare={:?} sampled={:?} flow_records={}",
        flows, ka.seen, ka.rare, ka.sampled, ka.flow_records
    );
}

#[test]
fn sampling_never_hides_a_reset_and_the_surface_states_rate_and_drops() {
    require_kernel!();
    let ns = NetNs::new();
    let mut cfg = mode(false);
    cfg.sample_one_in = 4;
    cfg.limits.max_samples = 3;
    let (reports, resets) = side_by_side(&ns, vec![cfg], move |l| {
        // 400 connections, every tenth closed with a RST: ~2 000 ordinary
        // state changes, 40 resets sent (and 40 received).
        short_connections(&l, 400, |i| i % 10 == 3)
    });
    let r = &reports[0];
    let a = r.tcp.as_ref().expect("tcp");
    assert_eq!(resets.len(), 40);
    let k = r.tcp_kernel.expect("kernel");
    assert_eq!(k.lost, [0; 4]);

    // Every reset is a record, whatever the sample.
    let sent: Vec<_> = a
        .events(TcpSurface::Resets)
        .filter(|e| e.kind == TcpEventKind::SendReset)
        .collect();
    let received = a
        .events(TcpSurface::Resets)
        .filter(|e| e.kind == TcpEventKind::ReceiveReset)
        .count();
    assert_eq!(sent.len(), 40, "every reset sent is a record");
    assert_eq!(received, 40, "every reset received is a record");
    let mut senders: Vec<_> = sent.iter().map(|e| e.local.port).collect();
    senders.sort_unstable();
    let mut want: Vec<_> = resets.iter().map(|a| a.port()).collect();
    want.sort_unstable();
    assert_eq!(senders, want, "each RST-closed client's reset, no other");

    // The sample is small and its cut is counted.
    for s in TcpSurface::ALL {
        assert!(a.samples(s).len() <= 3, "{s:?}");
    }
    assert!(a.samples_dropped(TcpSurface::Lifecycle) > 0);
    assert!(k.sampled[3] > 3, "the kernel sampled state changes");

    // The surface says all of it.
    let surfaces = r.surfaces();
    for id in ["ebpf:tcp_resets", "ebpf:tcp_lifecycle"] {
        let sf = surfaces.iter().find(|s| s.id == id).expect("surface");
        assert_eq!(sf.facts["mode"], "aggregated", "{id}");
        let sm = &sf.facts["sampling"];
        assert_eq!(sm["sample_one_in"], 4, "{id}: {sm}");
        for field in [
            "rare_records_sent",
            "rare_records_dropped",
            "sampled_records_sent",
            "sampled_records_dropped",
            "records_lost_in_kernel",
            "flow_records_lost",
            "flow_map_refused",
        ] {
            assert!(sm[field].is_u64(), "{id}: {field} in {sm}");
        }
    }
    let life = surfaces
        .iter()
        .find(|s| s.id == "ebpf:tcp_lifecycle")
        .expect("lifecycle");
    assert!(life.facts["sampling"]["sampled_records_dropped"].as_u64() > Some(0));
    assert_eq!(life.facts["sample_truncated"], true);
    let rs = surfaces
        .iter()
        .find(|s| s.id == "ebpf:tcp_resets")
        .expect("resets");
    assert_eq!(rs.facts["sampling"]["rare_records_sent"], 80);
    assert_eq!(rs.facts["sampling"]["rare_records_dropped"], 0);
    assert_eq!(
        rs.facts["rare_events"].as_array().map(Vec::len),
        Some(80),
        "all 80 reset records in the surface"
    );
    assert_eq!(rs.facts["sent"], 40);
    assert_eq!(rs.facts["received"], 40);
}

/// The retransmit storm, the case aggregation exists for: eight streams at
/// once through a 30% input drop; every flow's retransmit counts (RTO, fast,
/// other) agree with the per-event mode's.
#[test]
fn aggregated_and_per_event_modes_agree_on_a_retransmit_storm() {
    require_kernel!();
    let ns = NetNs::new();
    let ns_name = ns.name.clone();
    let (reports, ()) = side_by_side(&ns, vec![mode(false), mode(true)], move |l| {
        drop_input(&l, &ns_name, 30);
        let l = std::sync::Arc::new(l);
        let streams: Vec<_> = (0..8)
            .map(|_| {
                let l = l.clone();
                std::thread::spawn(move || stream_through(&l, 300))
            })
            .collect();
        for s in streams {
            s.join().expect("stream");
        }
    });
    let (agg, per) = (&reports[0], &reports[1]);
    let flows = assert_agree(agg, per);
    let p = per.tcp.as_ref().expect("per-event");
    let retransmits = p.seen(TcpEventKind::Retransmit);
    assert!(retransmits >= 20, "a storm: {retransmits} retransmits");
    // Each stream's two ends; retransmits on the clients, spread over them.
    assert!(flows >= 16, "{flows} flows");
    let a = agg.tcp.as_ref().expect("aggregated");
    let with_retrans = a.flows().iter().filter(|f| f.retransmits > 0).count();
    assert!(
        with_retrans >= 4,
        "flows that retransmitted: {with_retrans}"
    );
    println!("STORM flows={flows} retransmits={retransmits}");
}
