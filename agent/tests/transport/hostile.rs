//! Hostile and edge inputs: a peer that matches no socket, a netns PID that is
//! gone, ports outside range, IPv6 peers (and capture by PID).

use pstack_envelope::{ClaimKind, Completeness, Scope, Subject};

use crate::testbed::*;

/// A peer with no socket yields a sealed `host` envelope saying so, not silence.
#[test]
fn root_peer_matching_no_socket_is_a_complete_no_match_envelope() {
    if !root_or_skip("root_peer_matching_no_socket_is_a_complete_no_match_envelope") {
        return;
    }
    let _s = serial();
    let bed = Testbed::new("nomatch");
    let _t = Transfer::start(&bed, false, None);
    let envs = capture(&bed.a, "10.77.0.99", "200ms", &["--no-ebpf"]);
    assert_eq!(envs.len(), 1);
    let e = &envs[0];
    assert!(matches!(e.subject, Subject::Host(_)));
    assert_eq!(e.universe.expected_count, 0);
    assert_eq!(e.completeness, Completeness::Complete);
    let c = &e.claims[0];
    assert_eq!(
        (c.code.as_str(), c.kind, c.scope),
        ("no_matching_flow", ClaimKind::Fact, Scope::Universal)
    );
    assert!(!e.unknowns.is_empty() && !e.unknowns[0].probe.is_empty());
}

/// Issue 19: `capture transport` with no matching flow waited the whole 30 s
/// window before saying so. It now stops after the first sample (and says
/// why); `--wait` watches the whole window.
#[test]
fn root_no_matching_flow_returns_early_unless_asked_to_wait() {
    if !root_or_skip("root_no_matching_flow_returns_early_unless_asked_to_wait") {
        return;
    }
    let started = std::time::Instant::now();
    let (code, out, err) = pstackctl(&[
        "capture",
        "transport",
        "--peer",
        "192.0.2.77",
        "--window",
        "30s",
        "--no-ebpf",
        "--json",
    ]);
    let took = started.elapsed();
    assert_eq!(code, 0, "{err}");
    assert!(took < std::time::Duration::from_secs(15), "took {took:?}");
    assert!(err.contains("no TCP flow matches"), "{err}");
    assert!(err.contains("--wait"), "{err}");
    let envs = envelopes(&out);
    assert_eq!(envs.len(), 1);
    assert_eq!(envs[0].completeness, Completeness::Complete);
    assert_eq!(envs[0].claims[0].code, "no_matching_flow");
    assert!(envs[0].claims[0].statement.contains("first sample"));

    let started = std::time::Instant::now();
    let (code, out, err) = pstackctl(&[
        "capture",
        "transport",
        "--peer",
        "192.0.2.77",
        "--window",
        "2s",
        "--wait",
        "--no-ebpf",
        "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(started.elapsed() >= std::time::Duration::from_secs(2));
    assert!(!err.contains("no TCP flow matches"), "{err}");
    assert_eq!(envelopes(&out)[0].claims[0].code, "no_matching_flow");
}

#[test]
fn root_netns_pid_that_is_gone_is_a_typed_usage_error() {
    if !root_or_skip("root_netns_pid_that_is_gone_is_a_typed_usage_error") {
        return;
    }
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let pid = child.id();
    child.wait().unwrap();
    let (code, out, err) = pstackctl(&[
        "capture",
        "transport",
        "--netns-pid",
        &pid.to_string(),
        "--peer",
        B_V4,
        "--window",
        "200ms",
        "--json",
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(
        out.is_empty(),
        "no envelope for a namespace that cannot be entered"
    );
    assert!(err.contains(&format!("process {pid} is gone")), "{err}");
}

#[test]
fn ports_outside_range_are_refused_with_the_parameter_named() {
    let (code, _, err) = pstackctl(&[
        "capture",
        "transport",
        "--peer",
        "10.77.0.2:70000",
        "--window",
        "1s",
    ]);
    assert_eq!(code, 2);
    assert!(
        err.contains("invalid --peer") && err.contains("outside 1–65535"),
        "{err}"
    );
    let (code, _, err) = pstackctl(&[
        "capture",
        "transport",
        "--peer",
        "10.77.0.2",
        "--ports",
        "0-10",
    ]);
    assert_eq!(code, 2);
    assert!(err.contains("invalid --ports"), "{err}");
    let (code, _, err) = pstackctl(&[
        "capture",
        "longhorn",
        "--volume",
        "pvc-1",
        "--engine",
        "pvc-1-e-0",
        "--source-node",
        "a",
        "--target-node",
        "b",
        "--peer",
        "10.77.0.2:8080",
        "--window",
        "1s",
    ]);
    assert_eq!(code, 2);
    assert!(
        err.contains("outside the Longhorn data port range 10000–20000"),
        "{err}"
    );
    let (code, _, err) = pstackctl(&[
        "capture",
        "transport",
        "--peer",
        "10.77.0.2",
        "--netns",
        "../etc",
        "--window",
        "1s",
    ]);
    assert_eq!(code, 2);
    assert!(err.contains("invalid netns name"), "{err}");
}

/// IPv6 peers, captured by the PID of a process living in node A's netns.
#[test]
fn root_ipv6_peer_captured_by_netns_pid() {
    if !root_or_skip("root_ipv6_peer_captured_by_netns_pid") {
        return;
    }
    let _s = serial();
    let bed = Testbed::new("v6");
    let _t = Transfer::start(&bed, true, None);
    let mut sleeper = std::process::Command::new("ip")
        .args(["netns", "exec", &bed.a.name, "sleep", "30"])
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(200));
    let pid = sleeper.id().to_string();
    let (code, out, err) = pstackctl(&[
        "capture",
        "transport",
        "--netns-pid",
        &pid,
        "--peer",
        &format!("[{B_V6}]:{DATA_PORT}"),
        "--window",
        "1s",
        "--json",
        "--no-ebpf",
    ]);
    let _ = sleeper.kill();
    let _ = sleeper.wait();
    assert_eq!(code, 0, "{err}");
    let envs = envelopes(&out);
    assert_eq!(envs.len(), 1, "the port pins the data flow only");
    let Subject::NetworkStream(s) = &envs[0].subject else {
        panic!("not a stream")
    };
    assert_eq!(s.dst, format!("[{B_V6}]:{DATA_PORT}"));
    assert!(s.src.starts_with(&format!("[{A_V6}]:")));
    assert_eq!(s.protocol, "tcp");
    let ns_ino = std::fs::metadata(format!("/run/netns/{}", bed.a.name))
        .map(|m| std::os::unix::fs::MetadataExt::ino(&m))
        .unwrap();
    assert_eq!(s.net_ns.as_deref(), Some(ns_ino.to_string().as_str()));
    assert!(s.flow_id.parse::<u64>().is_ok());
    assert_eq!(
        envs[0].completeness,
        Completeness::Complete,
        "{:#?}",
        envs[0].surfaces
    );
}
