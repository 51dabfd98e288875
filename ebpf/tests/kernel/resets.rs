//! Resets (root, netns, nftables): a connect rejected by `reject with tcp
//! reset` is a reset *received* by the client from the server's address; a
//! close with SO_LINGER {1,0} is a reset *sent* by the closer and received by
//! its peer. Directions and senders must be right.

use std::os::fd::AsFd;
use std::time::Duration;

use pstack_ebpf::aggregate::TcpSurface;
use pstack_ebpf::{EbpfConfig, TcpEventKind};

use crate::fixtures::{NetNs, connect, in_port_window};
use crate::require_kernel;

#[test]
fn nft_reject_and_linger_zero_close_are_seen_with_the_right_direction() {
    require_kernel!();
    let ns = NetNs::new();
    let ns_name = ns.name.clone();
    // One port P for both cases, so the session can filter on it in the kernel:
    // first P is rejected by nftables, then the rule goes and P listens.
    let (report, (rejected, client, server), _s) =
        in_port_window(&ns, many_samples(), Duration::from_secs(2), move |l| {
            let rejected = l.local_addr().expect("addr");
            drop(l);
            NetNs::nft_input_rule(
                &ns_name,
                &format!("tcp dport {} reject with tcp reset", rejected.port()),
            );
            let err = connect(rejected).expect_err("the rule rejects the connect");
            assert_eq!(err.kind(), std::io::ErrorKind::ConnectionRefused);
            crate::fixtures::sh(
                "ip",
                &[
                    "netns",
                    "exec",
                    &ns_name,
                    "nft",
                    "delete",
                    "table",
                    "inet",
                    "pstack_test",
                ],
                None,
            );

            let l = std::net::TcpListener::bind(rejected).expect("rebind P");
            let server = l.local_addr().expect("addr");
            let c = connect(server).expect("connect");
            let client = c.local_addr().expect("local");
            let (srv, _) = l.accept().expect("accept");
            nix::sys::socket::setsockopt(
                &c.as_fd(),
                nix::sys::socket::sockopt::Linger,
                &libc::linger {
                    l_onoff: 1,
                    l_linger: 0,
                },
            )
            .expect("SO_LINGER");
            drop(c); // RST, not FIN
            std::thread::sleep(Duration::from_millis(100));
            drop(srv);
            (rejected, client, server)
        });
    let resets: Vec<_> = report
        .tcp
        .as_ref()
        .expect("tcp")
        .events(TcpSurface::Resets)
        .filter(|e| e.netns_ino == Some(ns.ino) || !e.has_sock)
        .cloned()
        .collect();

    // 1. Rejected by nftables: the client socket received a RST sent by the server's address.
    let rej: Vec<_> = resets
        .iter()
        .filter(|e| e.local != endpoint(client) && e.local != endpoint(server))
        .collect();
    assert!(
        rej.iter().any(|e| e.kind == TcpEventKind::ReceiveReset
            && e.remote == endpoint(rejected)
            && e.state.name() == "SYN_SENT"),
        "client in SYN_SENT received the RST from {rejected}: {rej:?}"
    );
    assert!(
        rej.iter().all(|e| e.kind != TcpEventKind::SendReset),
        "netfilter's reject is not the TCP stack sending a reset: {rej:?}"
    );

    // 2. SO_LINGER 0: the client sent it (with its socket), the server received it.
    let sent: Vec<_> = resets
        .iter()
        .filter(|e| e.kind == TcpEventKind::SendReset && e.local == endpoint(client))
        .collect();
    assert_eq!(
        sent.len(),
        1,
        "one RST sent by the closing client: {resets:?}"
    );
    assert_eq!(sent[0].remote, endpoint(server));
    assert!(sent[0].has_sock);
    let reason = pstack_ebpf::record::reset_reason_name(sent[0].detail.expect("6.10+ reason"));
    // 6.18 reports TCP_STATE for a linger-0 close of an established socket.
    assert!(
        ["TCP_STATE", "TCP_ABORT_ON_CLOSE", "TCP_ABORT_ON_LINGER"].contains(&reason.as_str()),
        "reason {reason}"
    );
    let received: Vec<_> = resets
        .iter()
        .filter(|e| e.kind == TcpEventKind::ReceiveReset && e.local == endpoint(server))
        .collect();
    assert_eq!(
        received.len(),
        1,
        "one RST received by the server: {resets:?}"
    );
    assert_eq!(received[0].remote, endpoint(client));

    // The surface says who reset the stream.
    let sf = report
        .surfaces()
        .into_iter()
        .find(|s| s.id == "ebpf:tcp_resets")
        .expect("surface");
    // Resets are rare records (always sent, kept apart from the sample).
    let sample: Vec<_> = sf.facts["rare_events"]
        .as_array()
        .expect("rare_events")
        .iter()
        .chain(sf.facts["sample"].as_array().expect("sample"))
        .collect();
    assert!(sample.iter().any(|e| e["direction"] == "sent"
        && e["rst_sender"] == client.to_string()
        && e["rst_receiver"] == server.to_string()));
    assert!(
        sample
            .iter()
            .any(|e| e["direction"] == "received" && e["rst_sender"] == rejected.to_string())
    );
}

#[test]
fn syn_to_a_closed_port_is_a_socketless_reset_sent_from_that_port_in_its_namespace() {
    require_kernel!();
    let ns = NetNs::new();
    let (report, (closed, client_err), _s) =
        in_port_window(&ns, many_samples(), Duration::from_secs(2), |l| {
            let closed = l.local_addr().expect("addr");
            drop(l); // nothing listens on it any more
            let err = connect(closed).expect_err("closed port");
            (closed, err.kind())
        });
    assert_eq!(client_err, std::io::ErrorKind::ConnectionRefused);
    let agg = report.tcp.as_ref().expect("tcp");
    let sent: Vec<_> = agg
        .events(TcpSurface::Resets)
        .filter(|e| e.kind == TcpEventKind::SendReset)
        .collect();
    assert_eq!(sent.len(), 1, "{sent:?}");
    let e = sent[0];
    assert!(!e.has_sock, "no socket answered the SYN");
    assert_eq!(
        e.local,
        endpoint(closed),
        "the RST's sender is the closed port"
    );
    assert_eq!(
        pstack_ebpf::record::reset_reason_name(e.detail.expect("reason")),
        "NO_SOCKET"
    );
    assert_eq!(
        e.netns_ino,
        Some(ns.ino),
        "namespace from the answered packet's device"
    );
    assert!(e.netns_cookie.is_some());
    let received = agg
        .events(TcpSurface::Resets)
        .find(|x| x.kind == TcpEventKind::ReceiveReset)
        .expect("the client received it");
    assert_eq!(received.remote, endpoint(closed));
    assert_eq!(received.state.name(), "SYN_SENT");
}

fn endpoint(a: std::net::SocketAddr) -> pstack_ebpf::Endpoint {
    pstack_ebpf::Endpoint {
        addr: a.ip(),
        port: a.port(),
    }
}

/// TCP programs with a sample cap large enough to hold every event of the fixture.
fn many_samples() -> EbpfConfig {
    let mut cfg = EbpfConfig::tcp();
    cfg.limits.max_samples = 100_000;
    cfg
}
