//! State changes (root, netns): a short exchange shows each side's full
//! sequence for its flow.

use std::io::{Read, Write};
use std::time::Duration;

use pstack_ebpf::EbpfConfig;

use crate::fixtures::{NetNs, connect, in_port_window};
use crate::require_kernel;

#[test]
fn short_exchange_shows_the_full_state_sequence_of_both_sides() {
    require_kernel!();
    let ns = NetNs::new();
    let (report, (client, server), _s) =
        in_port_window(&ns, EbpfConfig::tcp(), Duration::from_millis(1500), |l| {
            let server = l.local_addr().expect("addr");
            let mut c = connect(server).expect("connect");
            let client = c.local_addr().expect("local");
            let (mut srv, _) = l.accept().expect("accept");
            c.write_all(b"ping").expect("write");
            let mut b = [0u8; 4];
            srv.read_exact(&mut b).expect("read");
            srv.write_all(b"pong").expect("write");
            c.read_exact(&mut b).expect("read");
            drop(c); // client closes first: FIN_WAIT1 -> FIN_WAIT2 -> (TIME_WAIT) CLOSE
            let mut rest = Vec::new();
            srv.read_to_end(&mut rest).expect("eof");
            drop(srv); // CLOSE_WAIT -> LAST_ACK -> CLOSE
            (client, server)
        });
    let sf = report
        .surfaces()
        .into_iter()
        .find(|s| s.id == "ebpf:tcp_lifecycle")
        .expect("surface");
    let flows = sf.facts["flows"].as_array().expect("flows");
    let seq = |local: std::net::SocketAddr, remote: std::net::SocketAddr| {
        flows
            .iter()
            .find(|f| {
                f["local"] == local.to_string()
                    && f["remote"] == remote.to_string()
                    && f["netns_ino"] == ns.ino
            })
            .map(|f| f["sequence"].as_str().unwrap_or_default().to_string())
    };
    let all = serde_json::to_string(flows).unwrap_or_default();
    assert_eq!(
        seq(client, server).as_deref(),
        Some("CLOSE>SYN_SENT>ESTABLISHED>FIN_WAIT1>FIN_WAIT2>CLOSE"),
        "client flow (joined across its port-less SYN_SENT transition): {all}"
    );
    assert_eq!(
        seq(server, client).as_deref(),
        Some("LISTEN>SYN_RECV>ESTABLISHED>CLOSE_WAIT>LAST_ACK>CLOSE"),
        "accepted server socket: {all}"
    );
    let client_flow = flows
        .iter()
        .find(|f| f["local"] == client.to_string())
        .expect("client");
    let lifetime = client_flow["lifetime_ns"]
        .as_u64()
        .expect("opened and closed in the window: a lifetime");
    assert!(lifetime > 0 && lifetime < 1_500_000_000);
}

/// The same short exchange, once recording and once in count-only mode
/// (pstackd's always-attached setting): count-only emits no record and no
/// `ebpf:tcp_*` surface, and its kernel counts equal what the recording
/// session saw and read.
#[test]
fn count_only_mode_counts_what_recording_sees_and_emits_no_record() {
    require_kernel!();
    use pstack_ebpf::TcpEventKind;
    // Ten exchanges: ~100 state changes, more records than the one-page ring
    // of a counting session holds (39), so a kernel that still wrote records
    // would show losses.
    let exchange = |l: std::net::TcpListener| {
        for _ in 0..10 {
            let mut c = connect(l.local_addr().expect("addr")).expect("connect");
            let (mut srv, _) = l.accept().expect("accept");
            c.write_all(b"ping").expect("write");
            let mut b = [0u8; 4];
            srv.read_exact(&mut b).expect("read");
            drop(c);
            let mut rest = Vec::new();
            srv.read_to_end(&mut rest).expect("eof");
        }
    };
    let ns = NetNs::new();
    let (recorded, (), _s) = in_port_window(
        &ns,
        EbpfConfig::tcp(),
        Duration::from_millis(1500),
        exchange,
    );
    let mut cfg = EbpfConfig::tcp();
    cfg.tcp_count_only = true;
    let (counted, (), _s) = in_port_window(&ns, cfg, Duration::from_millis(1500), exchange);

    let agg = recorded.tcp.as_ref().expect("recording aggregates");
    let rec_kernel = recorded.tcp_kernel.expect("kernel counts");
    let state = TcpEventKind::ALL
        .iter()
        .position(|k| *k == TcpEventKind::StateChange)
        .expect("state kind");
    assert!(
        rec_kernel.seen[state] >= 100,
        "twenty sockets' lifecycles: {rec_kernel:?}"
    );
    assert_eq!(agg.seen(TcpEventKind::StateChange), rec_kernel.seen[state]);

    assert!(counted.tcp.is_none(), "count-only builds no aggregate");
    assert!(
        counted
            .surfaces()
            .iter()
            .all(|s| !s.id.starts_with("ebpf:tcp")),
        "count-only makes no TCP surface"
    );
    let cnt_kernel = counted.tcp_kernel.expect("kernel counts");
    assert_eq!(
        cnt_kernel.seen, rec_kernel.seen,
        "the same exchange is counted the same"
    );
    assert_eq!(cnt_kernel.lost, [0; 4], "nothing queued, nothing lost");
}
