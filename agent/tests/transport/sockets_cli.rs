//! `pstackctl sockets` against `ss` (iproute2, written by others) in a private
//! named network namespace holding a known set of loopback connections: the
//! table lists exactly the sockets `ss -tn` lists (state, local, peer), the
//! JSON lines carry the same sockets with the MSS `ss -tin` reports, the
//! filters (`--peer`, `--port`, `--all`) keep what `ss`'s own filters keep,
//! and hostile arguments are usage errors naming what is wrong.

use std::collections::BTreeSet;
use std::net::{TcpListener, TcpStream};
use std::process::Command;

use pstack_collectors::net::netns::{NetnsTarget, run_in};

use crate::testbed::{pstackctl, root_or_skip};

/// A named netns removed on drop.
struct Netns(String);

impl Netns {
    fn new(tag: &str) -> Netns {
        let name = format!("pstack-sk-{tag}-{}", std::process::id());
        // A leftover of a killed run; absent is the usual case.
        let _ = Command::new("ip")
            .args(["netns", "del", &name])
            .stderr(std::process::Stdio::null())
            .status();
        let ok = Command::new("ip")
            .args(["netns", "add", &name])
            .status()
            .expect("ip netns add");
        assert!(ok.success(), "ip netns add {name}");
        let ok = Command::new("ip")
            .args(["-n", &name, "link", "set", "lo", "up"])
            .status()
            .expect("ip link");
        assert!(ok.success());
        Netns(name)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

/// Sockets held open in the namespace: one listener on `port`, `pairs`
/// connected pairs to it, and one more listener on `port + 1` with no
/// connection.
fn hold(ns: &Netns, port: u16, pairs: usize) -> Vec<Box<dyn std::any::Any + Send>> {
    let ((held, err), _) = run_in(&NetnsTarget::Named(ns.0.clone()), move || {
        let mut held: Vec<Box<dyn std::any::Any + Send>> = Vec::new();
        let l = match TcpListener::bind(("127.0.0.1", port)) {
            Ok(l) => l,
            Err(e) => return (held, Some(e.to_string())),
        };
        for _ in 0..pairs {
            let c = TcpStream::connect(("127.0.0.1", port)).expect("connect");
            let (s, _) = l.accept().expect("accept");
            held.push(Box::new(c));
            held.push(Box::new(s));
        }
        held.push(Box::new(l));
        held.push(Box::new(
            TcpListener::bind(("127.0.0.1", port + 1)).expect("bind idle listener"),
        ));
        (held, None)
    })
    .expect("enter the test netns");
    assert!(err.is_none(), "{err:?}");
    held
}

/// `(state, local, peer)` of every line `ss -tnH [-a] [filter]` prints in `ns`.
fn ss_set(ns: &str, all: bool, filter: &[&str]) -> BTreeSet<(String, String, String)> {
    let mut cmd = Command::new("ss");
    cmd.args(["-N", ns, if all { "-tanH" } else { "-tnH" }]);
    cmd.args(filter);
    let out = cmd.output().expect("ss runs");
    assert!(
        out.status.success(),
        "ss: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            // ss: State Recv-Q Send-Q Local Peer; its state names differ.
            let state = match f[0] {
                "ESTAB" => "ESTABLISHED",
                "LISTEN" => "LISTEN",
                other => other,
            };
            (state.to_string(), f[3].to_string(), f[4].to_string())
        })
        .collect()
}

/// `(state, local, peer)` of every row of pstackctl's table.
fn table_set(stdout: &str) -> BTreeSet<(String, String, String)> {
    let mut lines = stdout.lines();
    let header = lines.next().expect("a header line");
    assert!(header.starts_with("State"), "header: {header}");
    lines
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let peer = if f[4] == "0.0.0.0:0" {
                "0.0.0.0:*"
            } else {
                f[4]
            };
            (f[0].to_string(), f[3].to_string(), peer.to_string())
        })
        .collect()
}

#[test]
fn root_sockets_lists_what_ss_lists_and_filters_like_it() {
    if !root_or_skip("root_sockets_lists_what_ss_lists_and_filters_like_it") {
        return;
    }
    pstack_testkit::require!(
        pstack_testkit::have_tool("ss"),
        "ss is not installed (iproute2)"
    );
    let ns = Netns::new("list");
    let port = 10_411;
    let pairs = 40;
    let _held = hold(&ns, port, pairs);

    // Connected sockets (the default), all sockets, one peer, one port.
    let (code, out, err) = pstackctl(&["sockets", "--netns", &ns.0]);
    assert_eq!(code, 0, "{err}");
    let listed = table_set(&out);
    assert_eq!(listed.len(), pairs * 2, "{out}");
    assert_eq!(listed, ss_set(&ns.0, false, &[]), "table vs ss -tn");

    let (code, out, err) = pstackctl(&["sockets", "--netns", &ns.0, "--all"]);
    assert_eq!(code, 0, "{err}");
    let listed = table_set(&out);
    assert_eq!(listed.len(), pairs * 2 + 2, "two listeners more: {out}");
    assert_eq!(listed, ss_set(&ns.0, true, &[]), "--all vs ss -tan");

    let peer = format!("127.0.0.1:{port}");
    let (code, out, err) = pstackctl(&["sockets", "--netns", &ns.0, "--peer", &peer]);
    assert_eq!(code, 0, "{err}");
    let listed = table_set(&out);
    assert_eq!(listed.len(), pairs, "the connecting ends only: {out}");
    assert_eq!(
        listed,
        ss_set(&ns.0, false, &["dst", &peer]),
        "--peer vs ss dst"
    );

    let (code, out, err) = pstackctl(&[
        "sockets",
        "--netns",
        &ns.0,
        "--port",
        &(port + 1).to_string(),
        "--all",
    ]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(table_set(&out).len(), 1, "only the idle listener: {out}");

    // JSON lines: the same sockets, every one with the MSS ss reports.
    let (code, out, err) = pstackctl(&["sockets", "--netns", &ns.0, "--json"]);
    assert_eq!(code, 0, "{err}");
    let rows: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object a line"))
        .collect();
    assert_eq!(rows.len(), pairs * 2);
    let ss_mss = Command::new("ss")
        .args(["-N", &ns.0, "-tinH"])
        .output()
        .expect("ss -tin");
    let ss_text = String::from_utf8_lossy(&ss_mss.stdout);
    let mss: BTreeSet<u64> = ss_text
        .split_whitespace()
        .filter_map(|t| t.strip_prefix("mss:"))
        .map(|v| v.parse().expect("mss:N"))
        .collect();
    for r in &rows {
        let m = r["info"]["snd_mss"].as_u64().expect("tcp_info.snd_mss");
        assert!(mss.contains(&m), "mss {m} not among ss's {mss:?}");
    }
}

#[test]
fn root_sockets_refuses_hostile_arguments_with_usage_errors() {
    if !root_or_skip("root_sockets_refuses_hostile_arguments_with_usage_errors") {
        return;
    }
    let missing = format!("pstack-sk-absent-{}", std::process::id());
    let (code, _, err) = pstackctl(&["sockets", "--netns", &missing]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("no network namespace named"), "{err}");

    let (code, _, err) = pstackctl(&["sockets", "--netns", "../../etc"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("invalid netns name"), "{err}");

    let (code, _, err) = pstackctl(&["sockets", "--peer", "host.example:80"]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("is not ADDR, ADDR:PORT or [IPv6]:PORT"),
        "{err}"
    );

    let (code, _, err) = pstackctl(&["sockets", "--netns", "a", "--netns-pid", "1"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("cannot be used with"), "{err}");
}
