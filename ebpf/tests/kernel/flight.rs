//! The flight recorder on this kernel (root, netns + veth, nftables): a
//! stream on a watched port that loses 30 % of its segments and is then
//! reset by its receiver is sealed with its retransmits from before the
//! reset; a blackholed stream yields an RTO incident; a sender facing a full
//! receiver records the peer's zero window; flows on unwatched ports make no
//! records at all (the kernel filters them). Each test watches a port range
//! of its own, which no other test in this binary uses.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use pstack_ebpf::{
    EbpfError, FlightConfig, FlightRecorder, FlowHistory, FlowIncident, FlowKey, monotonic_ns,
};

use crate::fixtures::{NetNs, connect, sh};
use crate::require_kernel;

const S: u64 = 1_000_000_000;

fn recorder(ports: (u16, u16)) -> FlightRecorder {
    FlightRecorder::start(FlightConfig {
        ports,
        ..FlightConfig::default()
    })
    .unwrap_or_else(|e| panic!("FlightRecorder::start: {e}\n{e:?}"))
}

/// Two namespaces joined by a veth pair: `a` is 10.77.0.1, `b` 10.77.0.2.
fn veth_pair() -> (NetNs, NetNs) {
    let a = NetNs::new();
    let b = NetNs::new();
    sh(
        "ip",
        &[
            "-n", &a.name, "link", "add", "va", "type", "veth", "peer", "name", "vb", "netns",
            &b.name,
        ],
        None,
    );
    for (ns, dev, ip) in [(&a, "va", "10.77.0.1/24"), (&b, "vb", "10.77.0.2/24")] {
        sh("ip", &["-n", &ns.name, "addr", "add", ip, "dev", dev], None);
        sh("ip", &["-n", &ns.name, "link", "set", dev, "up"], None);
    }
    (a, b)
}

fn linger_zero(s: &TcpStream) {
    nix::sys::socket::setsockopt(
        &s.as_fd(),
        nix::sys::socket::sockopt::Linger,
        &libc::linger {
            l_onoff: 1,
            l_linger: 0,
        },
    )
    .expect("SO_LINGER");
}

/// Poll every 100 ms until `want` matches an incident (returned) or `limit` passes.
fn poll_until(
    r: &mut FlightRecorder,
    limit: Duration,
    seen: &mut Vec<FlowIncident>,
    want: impl Fn(&FlowIncident) -> bool,
) -> Option<FlowIncident> {
    let t = Instant::now();
    loop {
        seen.extend(r.poll());
        if let Some(i) = seen.iter().find(|i| want(i)) {
            return Some(i.clone());
        }
        if t.elapsed() > limit {
            return None;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn key(ns: &NetNs, local: SocketAddr, remote: SocketAddr) -> FlowKey {
    FlowKey {
        netns_ino: Some(ns.ino),
        local,
        remote,
    }
}

#[test]
fn a_reset_after_loss_is_sealed_with_the_retransmits_from_before_it() {
    require_kernel!();
    const PORT: u16 = 17042;
    let (a, b) = veth_pair();
    let b_name = b.name.clone();
    let mut rec = recorder((17000, 17099));
    let server = SocketAddr::from((Ipv4Addr::new(10, 77, 0, 2), PORT));

    // Receiver in b: reads until told to reset, then closes with SO_LINGER {1,0}.
    let reset_now = Arc::new(AtomicBool::new(false));
    let (bound_tx, bound_rx) = std::sync::mpsc::channel();
    let receiver = {
        let reset_now = reset_now.clone();
        b.run(move || {
            let l = TcpListener::bind(server).expect("bind watched port");
            bound_tx.send(()).expect("bound");
            let (mut s, peer) = l.accept().expect("accept");
            s.set_read_timeout(Some(Duration::from_millis(50)))
                .expect("timeout");
            let mut buf = [0u8; 4096];
            while !reset_now.load(Ordering::Acquire) {
                match s.read(&mut buf) {
                    Ok(0) => panic!("sender closed before the reset"),
                    Ok(_) => {}
                    Err(e)
                        if matches!(
                            e.kind(),
                            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                        ) => {}
                    Err(e) => panic!("read: {e}"),
                }
            }
            linger_zero(&s);
            let at = monotonic_ns();
            drop(s); // RST to the sender
            (peer, at)
        })
    };
    bound_rx.recv().expect("receiver bound");
    // Sender in a: small TCP_NODELAY writes (one segment each) until the reset.
    let (client_tx, client_rx) = std::sync::mpsc::channel();
    let sender = a.run(move || {
        let mut c = connect(server).expect("connect");
        c.set_nodelay(true).expect("nodelay");
        client_tx
            .send(c.local_addr().expect("local"))
            .expect("send");
        let t = Instant::now();
        loop {
            match c.write_all(&[7u8; 512]) {
                Ok(()) => std::thread::sleep(Duration::from_micros(500)),
                Err(e) => return e.kind(),
            }
            assert!(t.elapsed() < Duration::from_secs(30), "never reset");
        }
    });
    let client = client_rx.recv().expect("client address");
    let mut seen = Vec::new();
    let warm = Instant::now();
    while warm.elapsed() < Duration::from_secs(1) {
        seen.extend(rec.poll());
        std::thread::sleep(Duration::from_millis(200));
    }

    // 30 % of the data segments arriving at the receiver are dropped (input hook).
    let loss_began_ns = monotonic_ns();
    NetNs::nft_input_rule(
        &b_name,
        &format!("tcp dport {PORT} tcp flags & syn == 0 numgen random mod 100 < 30 drop"),
    );
    let lossy = Instant::now();
    while lossy.elapsed() < Duration::from_secs(4) {
        seen.extend(rec.poll());
        std::thread::sleep(Duration::from_millis(200));
    }
    reset_now.store(true, Ordering::Release);
    let (peer, reset_ns) = receiver
        .join()
        .unwrap_or_else(|e| std::panic::resume_unwind(e));
    assert_eq!(peer, client);
    let sender_err = sender
        .join()
        .unwrap_or_else(|e| std::panic::resume_unwind(e));
    assert!(
        matches!(
            sender_err,
            std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe
        ),
        "the sender saw the reset: {sender_err:?}"
    );

    let sender_key = key(&a, client, server);
    let receiver_key = key(&b, server, client);
    let got = poll_until(&mut rec, Duration::from_secs(5), &mut seen, |i| {
        matches!(i, FlowIncident::Reset { flow, received_from_peer: true, .. } if *flow == sender_key)
    })
    .unwrap_or_else(|| panic!("no Reset incident for {sender_key:?}: {seen:?}"));
    assert!(
        got.at_ns() >= reset_ns && got.at_ns() < reset_ns + S,
        "the reset's time"
    );
    let _ = poll_until(&mut rec, Duration::from_secs(2), &mut seen, |i| {
        matches!(i, FlowIncident::Reset { flow, received_from_peer: false, .. } if *flow == receiver_key)
    })
    .unwrap_or_else(|| panic!("the receiver's sent RST is an incident too: {seen:?}"));

    let h: FlowHistory = rec.history(&sender_key).expect("the sender's flow is held");
    let before: u64 = h
        .buckets
        .iter()
        .filter(|b| b.second_start_ns + S <= got.at_ns())
        .map(|b| b.retransmits)
        .sum();
    assert!(
        before > 0,
        "retransmits in the seconds before the reset: {h:#?}"
    );
    assert!(
        h.buckets
            .iter()
            .filter(|b| b.second_start_ns + S <= loss_began_ns)
            .all(|b| b.retransmits == 0),
        "no retransmits before the loss began: {h:#?}"
    );
    assert!(
        h.reached_back_ns <= loss_began_ns,
        "the recorder's knowledge reaches back before the loss ({} > {loss_began_ns})",
        h.reached_back_ns
    );
    assert!(h.reached_back_ns >= h.recorder_started_ns);
    assert_eq!(h.totals.resets_received, 1);
    assert_eq!(h.totals.resets_sent, 0);
    assert!(h.totals.rto_retransmits <= h.totals.retransmits);
    assert_eq!(h.totals.last_state.as_deref(), Some("CLOSE"));
    assert_eq!(
        h.transitions.first().map(|t| t.2.as_str()),
        Some("SYN_SENT"),
        "the history starts at the connect: {:?}",
        h.transitions
    );
    assert!(h.sock_cookie.is_some());
    assert!(
        h.buckets
            .iter()
            .any(|b| b.snd_wnd_min.is_some_and(|w| w > 0)),
        "windows read from the socket"
    );
    let rh = rec.history(&receiver_key).expect("the receiver's end");
    assert_eq!(rh.totals.resets_sent, 1);
    let j = serde_json::to_value(&h).expect("serializable");
    assert_eq!(j["flow"]["local"], client.to_string());
    assert!(j["reached_back_before_last_ns"].as_u64().unwrap() >= 4 * S);
    let st = rec.stats();
    assert_eq!(st.events_lost, 0, "{st:?}");
    assert!(st.kernel_events >= st.events_folded && st.events_folded > 0);
    println!(
        "FLIGHT reset: retransmits before reset {before}, rto {}, reached back {:.1} s before the reset, stats {st:?}",
        h.totals.rto_retransmits,
        (got.at_ns() - h.reached_back_ns) as f64 / 1e9
    );
}

#[test]
fn a_blackholed_stream_is_an_rto_incident() {
    require_kernel!();
    const PORT: u16 = 17242;
    let ns = NetNs::new();
    let ns_name = ns.name.clone();
    let mut rec = recorder((17200, 17299));
    let (tx, rx) = std::sync::mpsc::channel();
    let h = ns.run(move || {
        let l = TcpListener::bind(("127.0.0.1", PORT)).expect("bind");
        let mut c = connect(l.local_addr().expect("addr")).expect("connect");
        c.set_nodelay(true).expect("nodelay");
        let (s, _) = l.accept().expect("accept");
        // Every data segment to the server is dropped from now on.
        NetNs::nft_input_rule(
            &ns_name,
            &format!("tcp dport {PORT} tcp flags & syn == 0 drop"),
        );
        for _ in 0..5 {
            c.write_all(&[1u8; 100]).expect("write");
        }
        tx.send((
            c.local_addr().expect("local"),
            l.local_addr().expect("server"),
        ))
        .expect("send");
        std::thread::sleep(Duration::from_secs(3));
        linger_zero(&c);
        drop((c, s));
    });
    let (client, server) = rx.recv().expect("addresses");
    let want = key(&ns, client, server);
    let mut seen = Vec::new();
    let rto = poll_until(
        &mut rec,
        Duration::from_secs(4),
        &mut seen,
        |i| matches!(i, FlowIncident::Rto { flow, .. } if *flow == want),
    );
    h.join().unwrap_or_else(|e| std::panic::resume_unwind(e));
    let hist = rec.history(&want).expect("held");
    assert!(
        rto.is_some(),
        "an RTO incident for {want:?}: {seen:?}\n{hist:#?}"
    );
    assert!(hist.totals.rto_retransmits >= 1, "{hist:#?}");
    assert!(hist.totals.rto_retransmits <= hist.totals.retransmits);
}

#[test]
fn a_sender_facing_a_full_receiver_records_the_peers_zero_window() {
    require_kernel!();
    const PORT: u16 = 17342;
    let ns = NetNs::new();
    let mut rec = recorder((17300, 17399));
    let (client, server) = ns
        .run(move || {
            let l = TcpListener::bind(("127.0.0.1", PORT)).expect("bind");
            let mut c = connect(l.local_addr().expect("addr")).expect("connect");
            let (s, _) = l.accept().expect("accept");
            // The server never reads: fill its receive buffer and our send buffer.
            c.set_nonblocking(true).expect("nonblocking");
            let t = Instant::now();
            loop {
                match c.write(&[0u8; 65536]) {
                    Ok(_) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        if t.elapsed() > Duration::from_millis(500) {
                            break;
                        }
                        std::thread::sleep(Duration::from_millis(20));
                    }
                    Err(e) => panic!("write: {e}"),
                }
            }
            let addrs = (
                c.local_addr().expect("local"),
                l.local_addr().expect("server"),
            );
            linger_zero(&s);
            drop(s); // RST to the sender, whose peer window is zero
            std::thread::sleep(Duration::from_millis(100));
            addrs
        })
        .join()
        .unwrap_or_else(|e| std::panic::resume_unwind(e));
    let want = key(&ns, client, server);
    let mut seen = Vec::new();
    poll_until(&mut rec, Duration::from_secs(3), &mut seen, |i| {
        matches!(i, FlowIncident::Reset { flow, received_from_peer: true, .. } if *flow == want)
    })
    .unwrap_or_else(|| panic!("reset seen: {seen:?}"));
    let h = rec.history(&want).expect("held");
    assert!(
        h.totals.zero_window_events >= 1,
        "the RST arrived while the peer advertised a zero window: {h:#?}"
    );
    assert!(h.buckets.iter().any(|b| b.snd_wnd_min == Some(0)));
    // The receiver's own end: it advertised the zero window (rcv_wnd), its
    // peer did not (its snd_wnd stayed open).
    let rh = rec
        .history(&key(&ns, server, client))
        .expect("receiver held");
    assert_eq!(rh.totals.zero_window_events, 0, "{rh:#?}");
}

#[test]
fn flows_on_unwatched_ports_make_no_records_in_the_kernel() {
    require_kernel!();
    const WATCHED: u16 = 17100;
    let ns = NetNs::new();
    let mut rec = recorder((WATCHED, WATCHED));
    // Connect, exchange, reset: every kind of event the programs see, on one port.
    let churn = |port: u16| {
        move || {
            let l = TcpListener::bind(("127.0.0.1", port)).expect("bind");
            for _ in 0..3 {
                let mut c = connect(l.local_addr().expect("addr")).expect("connect");
                let (mut s, _) = l.accept().expect("accept");
                c.write_all(b"ping").expect("write");
                let mut b = [0u8; 4];
                s.read_exact(&mut b).expect("read");
                linger_zero(&c);
                drop((c, s));
            }
            // A SYN to a closed port: a socketless reset sent from it.
            drop(l);
            assert!(TcpStream::connect(("127.0.0.1", port)).is_err());
        }
    };
    for port in [WATCHED - 1, WATCHED + 1, 80, 40000] {
        ns.run(churn(port))
            .join()
            .unwrap_or_else(|e| std::panic::resume_unwind(e));
    }
    std::thread::sleep(Duration::from_millis(200));
    let incidents = rec.poll();
    let st = rec.stats();
    assert_eq!(
        st.kernel_events, 0,
        "the programs made no record for unwatched ports: {st:?}"
    );
    assert_eq!((rec.flows(), incidents.len()), (0, 0));

    // Control: the same churn on the watched port is recorded.
    ns.run(churn(WATCHED))
        .join()
        .unwrap_or_else(|e| std::panic::resume_unwind(e));
    std::thread::sleep(Duration::from_millis(200));
    let incidents = rec.poll();
    let st = rec.stats();
    assert!(st.kernel_events > 0 && st.events_folded > 0, "{st:?}");
    assert!(
        rec.keys().iter().all(|k| k.netns_ino == Some(ns.ino)
            && (k.local.port() == WATCHED || k.remote.port() == WATCHED)),
        "{:?}",
        rec.keys()
    );
    assert!(
        incidents
            .iter()
            .filter(|i| matches!(i, FlowIncident::Reset { .. }))
            .count()
            >= 3,
        "{incidents:?}"
    );
}

#[test]
fn start_without_btf_is_a_typed_unsupported_error_and_bad_config_names_the_field() {
    let err = FlightRecorder::start(FlightConfig {
        btf_path: "/nonexistent/pstack/vmlinux".into(),
        ..FlightConfig::default()
    })
    .expect_err("no BTF");
    assert!(matches!(err, EbpfError::NoBtf { .. }), "{err:?}");
    assert_eq!(err.status(), pstack_envelope::SurfaceStatus::Unsupported);
    let err = FlightRecorder::start(FlightConfig {
        ports: (20000, 10000),
        ..FlightConfig::default()
    })
    .expect_err("upside down");
    assert!(
        matches!(
            err,
            EbpfError::InvalidConfig {
                param: "flight.ports",
                ..
            }
        ),
        "{err:?}"
    );
}
