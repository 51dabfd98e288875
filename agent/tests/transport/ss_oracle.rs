//! `ss -tin` (iproute2, written by others) as an oracle for the `tcp_info` the
//! transport capture reports: for the testbed's flows, the fields that do not move
//! while nothing changes on the path (MSS, window scales, PMTU, advertised MSS, the
//! idle control flow's congestion window) agree exactly, and the data flow's
//! `bytes_acked` read by `ss` just after the window is at least what the capture saw
//! at the window's end.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::testbed::*;

/// The first object in `v` (depth first) holding `snd_mss`: the tcp_info facts.
fn tcp_info(v: &Value) -> Option<&serde_json::Map<String, Value>> {
    match v {
        Value::Object(m) if m.contains_key("snd_mss") => Some(m),
        Value::Object(m) => m.values().find_map(tcp_info),
        Value::Array(a) => a.iter().find_map(tcp_info),
        _ => None,
    }
}

/// `ss -tin` in `ns` for the one flow to `dst:port`: its `key:value` fields.
fn ss_fields(ns: &str, dst: &str, port: u16) -> BTreeMap<String, String> {
    let out = std::process::Command::new("ip")
        .args(["netns", "exec", ns, "ss", "-tinH", "dst"])
        .arg(format!("{dst}:{port}"))
        .output()
        .expect("ss (iproute2) runs");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let mut fields = BTreeMap::new();
    for tok in text.split_whitespace() {
        if let Some((k, v)) = tok.split_once(':')
            && !k.is_empty()
            && k.chars().all(|c| c.is_ascii_lowercase() || c == '_')
        {
            fields.entry(k.to_string()).or_insert_with(|| v.to_string());
        }
    }
    assert!(
        fields.contains_key("mss"),
        "ss -tin found no flow to {dst}:{port} in {ns}:\n{text}"
    );
    fields
}

/// An integer field (u64 counters travel as decimal strings in the envelope).
fn num(info: &serde_json::Map<String, Value>, k: &str) -> u64 {
    info.get(k)
        .and_then(|v| {
            v.as_u64()
                .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
        })
        .unwrap_or_else(|| panic!("tcp_info has no integer {k}: {info:?}"))
}

#[test]
fn root_ss_agrees_with_the_captured_tcp_info_of_testbed_flows() {
    if !root_or_skip("root_ss_agrees_with_the_captured_tcp_info_of_testbed_flows") {
        return;
    }
    pstack_testkit::require!(
        pstack_testkit::have_tool("ss"),
        "ss is not installed (iproute2)"
    );
    let _s = serial();
    let bed = Testbed::new("ss");
    let _t = Transfer::start_paced(&bed, false, None, 500);
    let envs = capture(&bed.a, B_V4, "1s", &["--no-ebpf"]);
    for (port, idle) in [(CONTROL_PORT, true), (DATA_PORT, false)] {
        let ss = ss_fields(&bed.a.name, B_V4, port);
        let env = flow_to(&envs, port);
        let end = surface(env, "tcp/end");
        let info = tcp_info(&serde_json::Value::Object(end.facts.clone()))
            .unwrap_or_else(|| panic!("no tcp_info in tcp/end: {:?}", end.facts))
            .clone();
        let ss_num = |k: &str| -> u64 {
            ss.get(k)
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("ss has no {k}: {ss:?}"))
        };
        assert_eq!(
            num(&info, "snd_mss"),
            ss_num("mss"),
            "port {port}: mss; ss {ss:?}"
        );
        assert_eq!(
            num(&info, "advmss"),
            ss_num("advmss"),
            "port {port}: advmss"
        );
        assert_eq!(num(&info, "pmtu"), ss_num("pmtu"), "port {port}: pmtu");
        let (snd, rcv) = ss["wscale"].split_once(',').expect("wscale:S,R");
        assert_eq!(
            (num(&info, "snd_wscale"), num(&info, "rcv_wscale")),
            (snd.parse().unwrap(), rcv.parse().unwrap()),
            "port {port}: wscale"
        );
        if idle {
            assert_eq!(num(&info, "snd_cwnd"), ss_num("cwnd"), "idle flow: cwnd");
        } else {
            assert!(
                ss_num("bytes_acked") >= num(&info, "bytes_acked"),
                "ss read after the window cannot have fewer bytes acked: ss {ss:?}, capture {info:?}"
            );
        }
    }
}
