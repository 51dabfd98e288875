//! Hubble: every verdict Cilium recorded for the peer over the window,
//! grouped per connection (4-tuple), read with the `hubble observe` CLI as a
//! child process under [`HUBBLE_DEADLINE`] (killed and reaped when it
//! passes). All verdicts, not only DROPPED: "FORWARDED at the source, never
//! seen at the target" (#13703) needs the FORWARDED lines of both nodes.
//!
//! Invariants:
//! - The child is always reaped; its stdout is drained on a thread and capped
//!   at [`MAX_API_BYTES`], so a chatty or hung CLI cannot block the capture.
//! - No drop seen is not exculpatory: the claim says so.

use std::collections::BTreeMap;
use std::io::Read;
use std::time::{Duration, Instant};

use pstack_envelope::SurfaceStatus;
use serde_json::{Map, Value, json};

use super::client::{ApiFailure, MAX_API_BYTES};

/// Most connections listed in the facts.
pub const MAX_CONNECTIONS: usize = 64;

/// Deadline for the `hubble` CLI (a child process: killed when it passes).
pub const HUBBLE_DEADLINE: Duration = Duration::from_secs(10);

/// What `hubble observe` answered (or why it did not).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HubbleRead {
    /// The exact command run.
    pub command: String,
    /// stdout, or the failure.
    pub result: Result<Vec<u8>, ApiFailure>,
    /// µs.
    pub elapsed_us: u64,
}

/// Run `hubble observe --ip PEER` (all verdicts) over the last `window` with a hard deadline.
pub fn read_hubble(
    bin: &std::path::Path,
    server: &str,
    peer: std::net::IpAddr,
    window: Duration,
) -> HubbleRead {
    let since = format!("{}s", window.as_secs().max(1) + 5);
    let args = [
        "observe".to_string(),
        "--server".into(),
        server.to_string(),
        "--ip".into(),
        peer.to_string(),
        "--since".into(),
        since,
        "-o".into(),
        "jsonpb".into(),
    ];
    let command = format!("{} {}", bin.display(), args.join(" "));
    let t = Instant::now();
    let fail = |status, errno, message: String| ApiFailure {
        status,
        errno,
        message,
    };
    let result = (|| {
        let mut child = std::process::Command::new(bin)
            .args(&args)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::NotFound => fail(
                    SurfaceStatus::Unsupported,
                    e.raw_os_error(),
                    format!("{} is not installed", bin.display()),
                ),
                std::io::ErrorKind::PermissionDenied => fail(
                    SurfaceStatus::PermissionDenied,
                    e.raw_os_error(),
                    e.to_string(),
                ),
                _ => fail(SurfaceStatus::Error, e.raw_os_error(), e.to_string()),
            })?;
        // Drain stdout on a thread so a chatty child cannot block on a full pipe.
        let mut out = child.stdout.take().expect("piped");
        let reader = std::thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = (&mut out)
                .take(MAX_API_BYTES as u64 + 1)
                .read_to_end(&mut buf);
            buf
        });
        let deadline = Instant::now() + HUBBLE_DEADLINE;
        let status = loop {
            match child.try_wait() {
                Ok(Some(st)) => break st,
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                Ok(None) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(fail(
                        SurfaceStatus::Timeout,
                        None,
                        format!(
                            "hubble did not answer within {HUBBLE_DEADLINE:?}; killed and reaped"
                        ),
                    ));
                }
                Err(e) => return Err(fail(SurfaceStatus::Error, e.raw_os_error(), e.to_string())),
            }
        };
        let stdout = reader.join().unwrap_or_default();
        if !status.success() {
            let mut err = String::new();
            if let Some(mut e) = child.stderr.take() {
                let _ = (&mut e).take(4096).read_to_string(&mut err);
            }
            let first = err
                .lines()
                .next()
                .unwrap_or("")
                .chars()
                .take(300)
                .collect::<String>();
            return Err(fail(
                SurfaceStatus::Error,
                None,
                format!("hubble exited with {status}: {first}"),
            ));
        }
        if stdout.len() > MAX_API_BYTES {
            return Err(fail(
                SurfaceStatus::Truncated,
                None,
                format!("answer exceeds {MAX_API_BYTES} bytes"),
            ));
        }
        Ok(stdout)
    })();
    HubbleRead {
        command,
        result,
        elapsed_us: t.elapsed().as_micros() as u64,
    }
}

/// Facts from `hubble observe -o jsonpb` lines: verdict totals, DROPPED by
/// reason, and every connection (up to [`MAX_CONNECTIONS`]) with its verdict
/// counts and the TCP flags seen.
pub fn hubble_facts(stdout: &[u8]) -> Result<Map<String, Value>, String> {
    let text = std::str::from_utf8(stdout).map_err(|_| "hubble output is not UTF-8")?;
    let mut reasons: BTreeMap<String, u64> = BTreeMap::new();
    let mut verdicts: BTreeMap<String, u64> = BTreeMap::new();
    let mut conns: BTreeMap<String, Map<String, Value>> = BTreeMap::new();
    let mut dropped = 0u64;
    let mut flows = 0u64;
    for (n, line) in text.lines().filter(|l| !l.trim().is_empty()).enumerate() {
        let v: Value = serde_json::from_str(line).map_err(|e| format!("line {}: {e}", n + 1))?;
        let f = v
            .get("flow")
            .ok_or_else(|| format!("line {}: no `flow`", n + 1))?;
        flows += 1;
        let verdict = f
            .get("verdict")
            .and_then(Value::as_str)
            .unwrap_or("VERDICT_UNKNOWN")
            .to_string();
        *verdicts.entry(verdict.clone()).or_default() += 1;
        if verdict == "DROPPED" {
            dropped += 1;
            let reason = f
                .get("drop_reason_desc")
                .and_then(Value::as_str)
                .unwrap_or("UNKNOWN")
                .to_string();
            *reasons.entry(reason).or_default() += 1;
        }
        let tcp = f.pointer("/l4/TCP");
        let src = f
            .pointer("/IP/source")
            .and_then(Value::as_str)
            .unwrap_or("?");
        let dst = f
            .pointer("/IP/destination")
            .and_then(Value::as_str)
            .unwrap_or("?");
        let sp = tcp
            .and_then(|t| t.get("source_port"))
            .and_then(Value::as_u64);
        let dp = tcp
            .and_then(|t| t.get("destination_port"))
            .and_then(Value::as_u64);
        // Per observing node too: Relay merges every node's flows, and "FORWARDED
        // on S's node, never seen on T's" is the difference between two keys.
        let node = v
            .get("node_name")
            .or_else(|| f.get("node_name"))
            .and_then(Value::as_str)
            .unwrap_or("");
        let key = format!(
            "{node}|{src}:{}->{dst}:{}",
            sp.map(|p| p.to_string()).unwrap_or_default(),
            dp.map(|p| p.to_string()).unwrap_or_default()
        );
        if conns.len() >= MAX_CONNECTIONS && !conns.contains_key(&key) {
            continue;
        }
        let c = conns.entry(key).or_insert_with(|| {
            let mut m = Map::new();
            m.insert("node_name".into(), json!(node));
            m.insert("source".into(), json!(src));
            m.insert("destination".into(), json!(dst));
            m.insert("source_port".into(), json!(sp));
            m.insert("destination_port".into(), json!(dp));
            m.insert("verdicts".into(), json!({}));
            m.insert("tcp_flags".into(), json!({}));
            m.insert("first".into(), Value::Null);
            m.insert("last".into(), Value::Null);
            m
        });
        let time = f.get("time").and_then(Value::as_str);
        if c["first"].is_null() {
            c.insert("first".into(), json!(time));
        }
        c.insert("last".into(), json!(time));
        let vs = c["verdicts"].as_object_mut().expect("object");
        let n = vs.get(&verdict).and_then(Value::as_u64).unwrap_or(0);
        vs.insert(verdict, json!(n + 1));
        if let Some(flags) = tcp.and_then(|t| t.get("flags")).and_then(Value::as_object) {
            let fs = c["tcp_flags"].as_object_mut().expect("object");
            for (k, on) in flags {
                if on.as_bool() == Some(true) {
                    let n = fs.get(k).and_then(Value::as_u64).unwrap_or(0);
                    fs.insert(k.clone(), json!(n + 1));
                }
            }
        }
    }
    let mut m = Map::new();
    m.insert("flows".into(), json!(flows));
    m.insert("dropped_flows".into(), json!(dropped));
    m.insert("verdicts".into(), json!(verdicts));
    m.insert("reasons".into(), json!(reasons));
    m.insert("connections_listed".into(), json!(conns.len()));
    m.insert(
        "connections".into(),
        Value::Array(conns.into_values().map(Value::Object).collect()),
    );
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hung_hubble_cli_is_killed_at_the_deadline_and_is_a_timeout() {
        let dir = tempfile::tempdir().unwrap();
        let cli = dir.path().join("hubble");
        std::fs::write(&cli, "#!/bin/sh\nexec sleep 600\n").unwrap();
        std::fs::set_permissions(&cli, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        let t0 = Instant::now();
        let r = read_hubble(
            &cli,
            "relay:4245",
            "10.0.0.2".parse().unwrap(),
            Duration::from_secs(1),
        );
        assert!(t0.elapsed() < HUBBLE_DEADLINE + Duration::from_secs(3));
        let f = r.result.unwrap_err();
        assert_eq!(f.status, SurfaceStatus::Timeout, "{}", f.message);
        assert!(f.message.contains("killed and reaped"));
        assert!(
            !r.command.contains("--verdict"),
            "all verdicts: {}",
            r.command
        );
    }

    #[test]
    fn hubble_lines_keep_every_verdict_per_connection_and_refuse_garbage() {
        let out = br#"{"flow":{"time":"t1","verdict":"DROPPED","drop_reason_desc":"POLICY_DENIED","IP":{"source":"10.0.0.1","destination":"10.0.0.2"},"l4":{"TCP":{"source_port":1,"destination_port":10001}}}}
{"flow":{"time":"t2","verdict":"FORWARDED","IP":{"source":"10.0.0.2","destination":"10.0.0.1"},"l4":{"TCP":{"source_port":43126,"destination_port":10002,"flags":{"ACK":true}}}}}
{"flow":{"time":"t3","verdict":"FORWARDED","IP":{"source":"10.0.0.2","destination":"10.0.0.1"},"l4":{"TCP":{"source_port":43126,"destination_port":10002,"flags":{"RST":true,"ACK":true}}}}}
{"flow":{"verdict":"DROPPED"}}
"#;
        let f = hubble_facts(out).unwrap();
        assert_eq!(f["dropped_flows"], json!(2));
        assert_eq!(f["verdicts"]["FORWARDED"], json!(2));
        assert_eq!(f["reasons"]["POLICY_DENIED"], json!(1));
        assert_eq!(f["reasons"]["UNKNOWN"], json!(1));
        let c = f["connections"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["destination_port"] == json!(10002))
            .unwrap();
        assert_eq!(c["verdicts"]["FORWARDED"], json!(2));
        assert_eq!(c["tcp_flags"]["RST"], json!(1));
        assert_eq!(c["tcp_flags"]["ACK"], json!(2));
        assert_eq!(
            (c["first"].as_str(), c["last"].as_str()),
            (Some("t2"), Some("t3"))
        );
        // The same tuple seen by two nodes is two entries.
        let two = br#"{"flow":{"verdict":"FORWARDED","IP":{"source":"a","destination":"b"},"l4":{"TCP":{"source_port":1,"destination_port":2}}},"node_name":"s"}
{"flow":{"verdict":"FORWARDED","IP":{"source":"a","destination":"b"},"l4":{"TCP":{"source_port":1,"destination_port":2}}},"node_name":"t"}
"#;
        assert_eq!(hubble_facts(two).unwrap()["connections_listed"], json!(2));
        assert!(hubble_facts(b"not json\n").is_err());
        assert!(hubble_facts(b"{\"no_flow\":1}\n").is_err());
        assert_eq!(hubble_facts(b"").unwrap()["dropped_flows"], json!(0));
    }
}
