//! Retransmits (root, netns, nftables): an input-hook drop rule in a
//! namespace makes one flow retransmit; a control flow with the same traffic
//! to the same server port, before the rule, shows none.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::time::Duration;

use pstack_ebpf::{EbpfConfig, TcpEventKind, TcpSurface};

use crate::fixtures::{NetNs, connect, in_port_window};
use crate::require_kernel;

/// 300 small writes (TCP_NODELAY: one segment each) through a fresh connection
/// to `l`; every byte must arrive. Returns the client's address.
fn stream(l: &TcpListener) -> SocketAddr {
    let server = l.local_addr().expect("addr");
    let mut c = connect(server).expect("connect");
    c.set_nodelay(true).expect("nodelay");
    let client = c.local_addr().expect("local");
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
    for _ in 0..300 {
        c.write_all(&[7u8; 512]).expect("write");
        std::thread::sleep(Duration::from_micros(500));
    }
    c.shutdown(std::net::Shutdown::Write).expect("shutdown");
    assert_eq!(
        reader.join().expect("reader"),
        300 * 512,
        "every byte arrived despite drops"
    );
    client
}

#[test]
fn dropped_packets_produce_retransmits_for_exactly_that_flow_and_none_for_the_control_flow() {
    require_kernel!();
    let ns = NetNs::new();
    let ns_name = ns.name.clone();
    let mut cfg = EbpfConfig::tcp();
    // Compares the flow summary with every raw record: the per-event mode.
    cfg.tcp_per_event = true;
    cfg.limits.max_samples = 100_000;
    let (report, (server, control, lossy), _s) =
        in_port_window(&ns, cfg, Duration::from_secs(8), move |l| {
            let server = l.local_addr().expect("addr");
            let control = stream(&l);
            // Drop 30% of the non-SYN segments arriving for the server port (input hook:
            // a real loss the sender must recover from, not a local send error).
            NetNs::nft_input_rule(
                &ns_name,
                &format!(
                    "tcp dport {} tcp flags & syn == 0 numgen random mod 100 < 30 drop",
                    server.port()
                ),
            );
            let lossy = stream(&l);
            (server, control, lossy)
        });
    let agg = report.tcp.as_ref().expect("tcp aggregate");
    let ours: Vec<_> = agg
        .samples(TcpSurface::Retransmits)
        .iter()
        .filter(|e| e.netns_ino == Some(ns.ino))
        .collect();
    assert!(
        !ours.is_empty(),
        "the lossy flow retransmitted (30% input drops)"
    );
    // Either end of that one connection may retransmit (the client its data; the
    // server its FIN when the client's final ACK is dropped), nothing else may.
    let same_connection = |l: pstack_ebpf::Endpoint, r: pstack_ebpf::Endpoint| {
        (l, r) == (endpoint(lossy), endpoint(server))
            || (l, r) == (endpoint(server), endpoint(lossy))
    };
    for e in &ours {
        assert_eq!(e.kind, TcpEventKind::Retransmit);
        assert!(
            same_connection(e.local, e.remote),
            "a retransmit outside the lossy flow: {} -> {}",
            e.local,
            e.remote
        );
    }
    assert!(
        ours.iter()
            .any(|e| (e.local, e.remote) == (endpoint(lossy), endpoint(server))),
        "the sender of the dropped data retransmitted"
    );
    let flow = agg
        .flows()
        .iter()
        .find(|f| {
            f.netns_ino == Some(ns.ino)
                && f.local == endpoint(lossy)
                && f.remote == endpoint(server)
        })
        .expect("lossy flow summarized");
    // The summary is per direction: compare it with the sender's records only
    // (the server may also have retransmitted its FIN; regression seen in CI
    // when the client's last ACK was among the dropped packets).
    let sender_records = ours
        .iter()
        .filter(|e| (e.local, e.remote) == (endpoint(lossy), endpoint(server)))
        .count();
    assert_eq!(
        flow.retransmits as usize, sender_records,
        "summary count equals the raw records of that direction"
    );
    let control_flows: Vec<_> = agg
        .flows()
        .iter()
        .filter(|f| {
            f.netns_ino == Some(ns.ino)
                && (f.local == endpoint(control) || f.remote == endpoint(control))
        })
        .collect();
    assert!(
        !control_flows.is_empty(),
        "the control flow was seen (state changes)"
    );
    assert!(
        control_flows.iter().all(|f| f.retransmits == 0),
        "no drop rule, no retransmits: {control_flows:?}"
    );

    // The surface carries it, with a digest over the raw records.
    let surfaces = report.surfaces();
    let sf = surfaces
        .iter()
        .find(|s| s.id == "ebpf:tcp_retransmits")
        .expect("surface");
    assert_eq!(sf.status, pstack_envelope::SurfaceStatus::Ok);
    assert!(sf.digest.is_some() && sf.bytes >= 104 * ours.len() as u64);
    let flows = sf.facts["flows"].as_array().expect("flows");
    assert!(
        flows.iter().any(|f| f["local"] == lossy.to_string()
            && f["retransmits"].as_u64() == Some(flow.retransmits))
    );
    assert!(flows.iter().all(|f| f["local"] != control.to_string()));
}

fn endpoint(a: SocketAddr) -> pstack_ebpf::Endpoint {
    pstack_ebpf::Endpoint {
        addr: a.ip(),
        port: a.port(),
    }
}
