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
