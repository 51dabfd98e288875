//! The Longhorn engine: a Longhorn replica rebuild as a
//! `storage_transfer` envelope linked, by digest, to the `network_stream`
//! envelopes of its TCP flows.
//!
//! The transport side is [`transport::capture_with`] with Longhorn's
//! instance-manager data ports (10000–30000) as the default filter. The
//! storage side — engine rebuild progress and terminal state — comes from the
//! Longhorn manager API (`GET {api}/v1/volumes/{volume}`) when `--longhorn-api`
//! is given; otherwise it is an unknown carrying the exact `kubectl` probe.
//! A Cilium verdict comes from Hubble when `--hubble-server` is given: the
//! `hubble observe … --verdict DROPPED -o jsonpb` CLI runs as a child process
//! under a hard deadline (killed and reaped when it passes); otherwise — or
//! when it fails — it is an unknown carrying that probe.
//!
//! Invariants:
//! - **Links are digests.** The `streams` surface lists each stream
//!   envelope's digest, flow id and completeness; the transfer envelope never
//!   copies stream facts, so a reader follows the digest to the evidence.
//! - **The manager's word is the manager's.** Progress and state read from the
//!   API are facts about what the manager reports (`longhorn_manager_reports_*`),
//!   not about the bytes on the wire.
//! - **Bounded API read.** Plain `http://` only (the in-cluster
//!   `longhorn-backend:9500` service) through `reqwest` (no hand-written
//!   HTTP, no proxy from the environment), 5 s connect and whole-request
//!   deadlines, 4 MiB cap;
//!   a timeout or refusal becomes the surface's status, never a hang.

use std::io::Read;
use std::time::{Duration, Instant};

use pstack_envelope::{
    Claim, ClaimKind, Envelope, EnvelopeBuilder, NextTransition, Scope, StatusCause, Subject,
    Surface, SurfaceStatus, Termination, TransferIdentity, Universe, Unknown, sha256_digest,
};
use serde_json::{Map, Value, json};

use std::path::Path;

use crate::Progress;
use crate::request::{LonghornRequest, RequestError, invalid};
use crate::supervisor::{LeakBudget, SupervisorConfig};
use crate::transport::{self, CaptureResult, LONGHORN_PORTS, Plan, TransportError};

/// Most bytes read from the manager API.
pub const MAX_API_BYTES: usize = 4 << 20;
/// Connect and read deadline for the manager API.
pub const API_DEADLINE: Duration = Duration::from_secs(5);

/// A validated Longhorn request: the transport plan of its streams and the
/// transfer's identity and sources.
#[derive(Debug, Clone)]
pub struct LonghornPlan {
    /// The stream flows and the window.
    pub transport: Plan,
    /// The request it came from (names, API, Hubble).
    pub request: LonghornRequest,
}

/// One Longhorn capture: the stream envelopes and the transfer envelope
/// linking them.
#[derive(Debug, Clone)]
pub struct LonghornResult {
    /// The `network_stream` envelopes (or the no-match envelope).
    pub streams: CaptureResult,
    /// The `storage_transfer` envelope.
    pub transfer: Envelope,
}

fn name_ok(param: &'static str, v: &str) -> Result<(), RequestError> {
    if v.trim().is_empty()
        || v.len() > 253
        || !v
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._".contains(&b))
    {
        return Err(invalid(
            param,
            format!("{v:?} is not a Kubernetes object name (1–253 of [A-Za-z0-9-._])"),
        ));
    }
    Ok(())
}

/// Validate a request into a Longhorn plan.
pub fn plan(a: &LonghornRequest) -> Result<LonghornPlan, RequestError> {
    for (p, v) in [
        ("volume", &a.volume),
        ("engine", &a.engine),
        ("source_node", &a.source_node),
        ("target_node", &a.target_node),
    ] {
        name_ok(p, v)?;
    }
    if let Some(t) = &a.transfer {
        name_ok("transfer", t)?;
    }
    let plan = Plan::from_selection(&a.flows(), a.ebpf)?;
    let range = plan.filter.either_port_in.unwrap_or(LONGHORN_PORTS);
    for (param, port) in [
        ("peer", plan.filter.peer_port),
        ("local", plan.filter.local_port),
    ] {
        if let Some(p) = port
            && !range.contains(p)
        {
            return Err(invalid(
                param,
                format!(
                    "port {p} is outside the Longhorn data port range {}–{} (instance-manager); pass --ports to widen it",
                    range.lo, range.hi
                ),
            ));
        }
    }
    if let Some(api) = &a.longhorn_api {
        parse_http_url(api).map_err(|reason| invalid("longhorn_api", reason))?;
    }
    if let Some(h) = &a.hubble_server {
        hubble_server_ok(h)?;
    }
    Ok(LonghornPlan {
        transport: plan,
        request: a.clone(),
    })
}

/// `http://host[:port][/base]` → (host, port, base path). Anything else is refused.
pub fn parse_http_url(u: &str) -> Result<(String, u16, String), String> {
    let rest = u.strip_prefix("http://").ok_or_else(|| {
        format!("{u:?}: only http:// URLs (the in-cluster manager service) are supported")
    })?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], rest[i..].trim_end_matches('/').to_string()),
        None => (rest, String::new()),
    };
    if authority.is_empty() || authority.contains('@') {
        return Err(format!("{u:?}: host required, credentials not allowed"));
    }
    if !path.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(format!("{u:?}: path has non-printable characters"));
    }
    let (host, port) = match authority.rsplit_once(':') {
        Some((h, p)) if !h.ends_with(']') || h.starts_with('[') => match p.parse::<u16>() {
            Ok(p) if p > 0 => (
                h.trim_start_matches('[').trim_end_matches(']').to_string(),
                p,
            ),
            _ => return Err(format!("{u:?}: bad port {p:?}")),
        },
        _ => (authority.to_string(), 80),
    };
    if host.is_empty()
        || host
            .bytes()
            .any(|b| b.is_ascii_whitespace() || b.is_ascii_control())
    {
        return Err(format!("{u:?}: bad host"));
    }
    Ok((host, port, path))
}

/// Why an API read failed, mapped to a surface status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiFailure {
    /// Status to record.
    pub status: SurfaceStatus,
    /// errno, if any.
    pub errno: Option<i32>,
    /// What happened.
    pub message: String,
}

/// GET `{api}/v1/volumes/{volume}` under [`API_DEADLINE`]; raw body and elapsed µs.
pub fn fetch_volume(api: &str, volume: &str) -> (Result<Vec<u8>, ApiFailure>, u64) {
    let t = Instant::now();
    let fail = |status, errno, message: String| ApiFailure {
        status,
        errno,
        message,
    };
    let r = (|| {
        let (host, port, base) =
            parse_http_url(api).map_err(|m| fail(SurfaceStatus::Error, None, m))?;
        let host = if host.contains(':') {
            format!("[{host}]")
        } else {
            host
        };
        let url = format!("http://{host}:{port}{base}/v1/volumes/{volume}");
        // Captures run on blocking threads, never inside an async task: the
        // read gets a runtime of its own (as the kubelet read does).
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| fail(SurfaceStatus::Error, None, format!("runtime: {e}")))?;
        rt.block_on(async {
            let client = reqwest::Client::builder()
                .connect_timeout(API_DEADLINE)
                .timeout(API_DEADLINE)
                // The manager is a node-local call: no proxy from the environment.
                .no_proxy()
                .build()
                .map_err(|e| fail(SurfaceStatus::Error, None, e.to_string()))?;
            let mut resp = client
                .get(&url)
                .header(reqwest::header::ACCEPT, "application/json")
                .send()
                .await
                .map_err(|e| http_failure(&e, &url))?;
            let code = resp.status().as_u16();
            let mut body = Vec::new();
            while let Some(chunk) = resp.chunk().await.map_err(|e| http_failure(&e, &url))? {
                body.extend_from_slice(&chunk);
                if body.len() > MAX_API_BYTES {
                    return Err(fail(
                        SurfaceStatus::Truncated,
                        None,
                        format!("answer exceeds {MAX_API_BYTES} bytes"),
                    ));
                }
            }
            match code {
                200 => Ok(body),
                401 | 403 => Err(fail(
                    SurfaceStatus::PermissionDenied,
                    None,
                    format!("HTTP {code}"),
                )),
                404 => Err(fail(
                    SurfaceStatus::Vanished,
                    None,
                    format!("HTTP 404: no volume {volume}"),
                )),
                c => Err(fail(SurfaceStatus::Error, None, format!("HTTP {c}"))),
            }
        })
    })();
    (r, t.elapsed().as_micros() as u64)
}

/// A failed manager request as a surface status: a timeout is `timeout`;
/// otherwise the OS error under it (errno kept), else `error`.
fn http_failure(e: &reqwest::Error, url: &str) -> ApiFailure {
    let mut io: Option<&std::io::Error> = None;
    let mut cause: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(e);
    while let Some(c) = cause {
        if let Some(x) = c.downcast_ref::<std::io::Error>() {
            io = Some(x);
            break;
        }
        cause = c.source();
    }
    let status = if e.is_timeout() {
        SurfaceStatus::Timeout
    } else if io.is_some_and(|x| x.kind() == std::io::ErrorKind::PermissionDenied) {
        SurfaceStatus::PermissionDenied
    } else {
        SurfaceStatus::Error
    };
    let detail = io.map(|x| format!(": {x}")).unwrap_or_default();
    ApiFailure {
        status,
        errno: io.and_then(std::io::Error::raw_os_error),
        message: format!("GET {url}: {e}{detail}"),
    }
}

/// Manager-reported rebuild facts out of a `/v1/volumes/{name}` body.
pub fn volume_facts(body: &[u8], engine: &str) -> Result<Map<String, Value>, String> {
    let v: Value = serde_json::from_slice(body).map_err(|e| format!("not JSON: {e}"))?;
    let s = |p: &str| v.pointer(p).and_then(Value::as_str).map(str::to_string);
    let mut m = Map::new();
    m.insert("state".into(), json!(s("/state")));
    m.insert("robustness".into(), json!(s("/robustness")));
    let rebuild: Vec<Value> = v
        .get("rebuildStatus")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .map(|r| {
                    json!({
                        "replica": r.get("replica").and_then(Value::as_str),
                        "from_replica_address": r.get("fromReplicaAddress").and_then(Value::as_str),
                        "state": r.get("state").and_then(Value::as_str),
                        "progress_percent": r.get("progress").and_then(Value::as_i64),
                        "is_rebuilding": r.get("isRebuilding").and_then(Value::as_bool),
                        "error": r.get("error").and_then(Value::as_str),
                    })
                })
                .collect()
        })
        .unwrap_or_default();
    m.insert("rebuild_status".into(), Value::Array(rebuild));
    let engine_seen = v
        .get("controllers")
        .and_then(Value::as_array)
        .is_some_and(|a| {
            a.iter()
                .any(|c| c.get("name").and_then(Value::as_str) == Some(engine))
        });
    m.insert("engine_listed".into(), json!(engine_seen));
    Ok(m)
}

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

/// Run `hubble observe` for `peer` over the last `window` with a hard deadline.
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
        "--verdict".into(),
        "DROPPED".into(),
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

/// Facts from `hubble observe -o jsonpb` lines: DROPPED flows by reason, and a sample.
pub fn hubble_facts(stdout: &[u8]) -> Result<Map<String, Value>, String> {
    let text = std::str::from_utf8(stdout).map_err(|_| "hubble output is not UTF-8")?;
    let mut reasons: std::collections::BTreeMap<String, u64> = Default::default();
    let mut sample = Vec::new();
    let mut dropped = 0u64;
    for (n, line) in text.lines().filter(|l| !l.trim().is_empty()).enumerate() {
        let v: Value = serde_json::from_str(line).map_err(|e| format!("line {}: {e}", n + 1))?;
        let f = v
            .get("flow")
            .ok_or_else(|| format!("line {}: no `flow`", n + 1))?;
        if f.get("verdict").and_then(Value::as_str) != Some("DROPPED") {
            continue;
        }
        dropped += 1;
        let reason = f
            .get("drop_reason_desc")
            .and_then(Value::as_str)
            .unwrap_or("UNKNOWN")
            .to_string();
        *reasons.entry(reason.clone()).or_default() += 1;
        if sample.len() < 10 {
            let tcp = f.pointer("/l4/TCP");
            sample.push(json!({
                "time": f.get("time").and_then(Value::as_str),
                "source": f.pointer("/IP/source").and_then(Value::as_str),
                "destination": f.pointer("/IP/destination").and_then(Value::as_str),
                "source_port": tcp.and_then(|t| t.get("source_port")).and_then(Value::as_u64),
                "destination_port": tcp.and_then(|t| t.get("destination_port")).and_then(Value::as_u64),
                "reason": reason,
            }));
        }
    }
    let mut m = Map::new();
    m.insert("dropped_flows".into(), json!(dropped));
    m.insert("reasons".into(), json!(reasons));
    m.insert("sample".into(), Value::Array(sample));
    Ok(m)
}

/// Build the sealed `storage_transfer` envelope linking `streams`.
pub fn transfer_envelope(
    a: &LonghornRequest,
    plan: &Plan,
    streams: &CaptureResult,
    manager: Option<(Result<Vec<u8>, ApiFailure>, u64)>,
    hubble: Option<HubbleRead>,
) -> Result<Envelope, TransportError> {
    let linked: Vec<&Envelope> = streams
        .flows
        .iter()
        .chain(streams.no_match.iter())
        .collect();
    let transfer_id = a.transfer.clone().unwrap_or_else(|| {
        let mut ids: Vec<String> = streams
            .flows
            .iter()
            .filter_map(|e| match &e.subject {
                Subject::NetworkStream(s) => Some(s.flow_id.clone()),
                _ => None,
            })
            .collect();
        ids.sort();
        let d = sha256_digest(format!("{}|{}|{}", a.volume, a.engine, ids.join(",")).as_bytes());
        format!("derived-{}", &d[7..23])
    });
    let links: Vec<Value> = linked
        .iter()
        .map(|e| {
            let (flow, src, dst) = match &e.subject {
                Subject::NetworkStream(s) => (Some(s.flow_id.clone()), Some(s.src.clone()), Some(s.dst.clone())),
                _ => (None, None, None),
            };
            json!({
                "digest": e.digest, "kind": e.subject.kind(), "flow_id": flow, "src": src, "dst": dst,
                "completeness": e.completeness.as_str(),
                "claims": e.claims.iter().map(|c| format!("{}:{}", c.kind.as_str(), c.code)).collect::<Vec<_>>(),
            })
        })
        .collect();
    let joined: String = linked
        .iter()
        .map(|e| e.digest.as_str())
        .collect::<Vec<_>>()
        .join("\n");
    let mut surfaces = vec![Surface {
        id: "streams".into(),
        authority: format!("pstack:network_stream envelopes, netns {}", streams.net_ns),
        status: SurfaceStatus::Ok,
        cause: None,
        deadline_ms: transport::SURFACE_DEADLINE_MS,
        elapsed_us: 0,
        digest: Some(sha256_digest(joined.as_bytes())),
        bytes: joined.len() as u64,
        truncated: false,
        facts: {
            let mut m = Map::new();
            m.insert("links".into(), Value::Array(links));
            m.insert("stream_count".into(), json!(streams.flows.len()));
            m.insert("net_ns".into(), json!(streams.net_ns.to_string()));
            m
        },
    }];
    let mut claims = Vec::new();
    let mut unknowns = Vec::new();
    let faulted: Vec<String> = streams
        .flows
        .iter()
        .filter(|e| {
            e.claims
                .iter()
                .any(|c| c.code != "no_fault_observed" && c.kind == ClaimKind::Fact)
        })
        .map(|e| e.digest.clone())
        .collect();
    claims.push(Claim {
        id: "c1".into(),
        kind: ClaimKind::Fact,
        code: if streams.flows.is_empty() {
            "no_stream_linked"
        } else {
            "streams_linked"
        }
        .into(),
        statement: if streams.flows.is_empty() {
            format!(
                "no TCP flow to {} matched in netns {}",
                plan.filter.peer, streams.net_ns
            )
        } else {
            format!(
                "{} stream envelope(s) linked; {} carry transport fault facts: {}",
                streams.flows.len(),
                faulted.len(),
                faulted.join(", ")
            )
        },
        surfaces: vec!["streams".into()],
        scope: Scope::Existential,
        falsifier: None,
    });
    let kubectl = format!(
        "kubectl -n longhorn-system get volumes.longhorn.io {v} -o jsonpath='{{.status.state}} {{.status.robustness}}'; kubectl -n longhorn-system get engines.longhorn.io {e} -o jsonpath='{{.status.rebuildStatus}}'",
        v = a.volume,
        e = a.engine
    );
    match manager {
        None => unknowns.push(Unknown {
            id: "u1".into(),
            question: format!(
                "what rebuild progress and terminal state does Longhorn report for engine {}?",
                a.engine
            ),
            blocks: "CLASSIFY_TRANSFER_TERMINAL".into(),
            owner: "cluster operator".into(),
            probe: kubectl.clone(),
            surface: None,
        }),
        Some((res, elapsed)) => {
            let api = a.longhorn_api.clone().unwrap_or_default();
            let auth = format!("http:{api}/v1/volumes/{}", a.volume);
            match res.and_then(|body| {
                volume_facts(&body, &a.engine)
                    .map(|f| (f, body))
                    .map_err(|m| ApiFailure {
                        status: SurfaceStatus::Error,
                        errno: None,
                        message: m,
                    })
            }) {
                Ok((facts, body)) => {
                    let rebuild = facts.get("rebuild_status").cloned().unwrap_or(Value::Null);
                    surfaces.push(Surface {
                        id: "longhorn/manager".into(),
                        authority: auth,
                        status: SurfaceStatus::Ok,
                        cause: None,
                        deadline_ms: API_DEADLINE.as_millis() as u64,
                        elapsed_us: elapsed,
                        digest: Some(sha256_digest(&body)),
                        bytes: body.len() as u64,
                        truncated: false,
                        facts,
                    });
                    claims.push(Claim {
                        id: "c2".into(),
                        kind: ClaimKind::Fact,
                        code: "longhorn_manager_reports_rebuild".into(),
                        statement: format!(
                            "the Longhorn manager reports for volume {}: rebuild status {rebuild}",
                            a.volume
                        ),
                        surfaces: vec!["longhorn/manager".into()],
                        scope: Scope::Existential,
                        falsifier: None,
                    });
                }
                Err(f) => {
                    surfaces.push(Surface {
                        id: "longhorn/manager".into(),
                        authority: auth,
                        status: f.status,
                        cause: Some(StatusCause {
                            errno: f.errno,
                            message: f.message,
                        }),
                        deadline_ms: API_DEADLINE.as_millis() as u64,
                        elapsed_us: elapsed,
                        digest: None,
                        bytes: 0,
                        truncated: false,
                        facts: Map::new(),
                    });
                    unknowns.push(Unknown {
                        id: "u1".into(),
                        question: format!("what rebuild progress and terminal state does Longhorn report for engine {}?", a.engine),
                        blocks: "CLASSIFY_TRANSFER_TERMINAL".into(),
                        owner: "cluster operator".into(),
                        probe: kubectl.clone(),
                        surface: Some("longhorn/manager".into()),
                    });
                }
            }
        }
    }
    let port = plan
        .filter
        .peer_port
        .map(|p| format!(" --port {p}"))
        .unwrap_or_default();
    let hubble_probe = format!(
        "hubble observe --ip {}{port} --verdict DROPPED --since 30m -o jsonpb",
        plan.filter.peer
    );
    let mut hubble_answered = false;
    if let Some(h) = hubble {
        let auth = format!("exec:{}", h.command);
        match h.result.and_then(|out| {
            hubble_facts(&out)
                .map(|f| (f, out))
                .map_err(|m| ApiFailure {
                    status: SurfaceStatus::Error,
                    errno: None,
                    message: m,
                })
        }) {
            Ok((facts, out)) => {
                let dropped = facts["dropped_flows"].as_u64().unwrap_or(0);
                let reasons = facts["reasons"].to_string();
                surfaces.push(Surface {
                    id: "cilium/hubble".into(),
                    authority: auth,
                    status: SurfaceStatus::Ok,
                    cause: None,
                    deadline_ms: HUBBLE_DEADLINE.as_millis() as u64,
                    elapsed_us: h.elapsed_us,
                    digest: Some(sha256_digest(&out)),
                    bytes: out.len() as u64,
                    truncated: false,
                    facts,
                });
                let n = claims.len() + 1;
                claims.push(Claim {
                    id: format!("c{n}"),
                    kind: ClaimKind::Fact,
                    code: if dropped > 0 { "hubble_reports_drops" } else { "hubble_reports_no_drops" }.into(),
                    statement: if dropped > 0 {
                        format!("Hubble reports {dropped} DROPPED flow(s) involving {} over the window: {reasons}", plan.filter.peer)
                    } else {
                        format!("Hubble reports no DROPPED flow involving {} over the window", plan.filter.peer)
                    },
                    surfaces: vec!["cilium/hubble".into()],
                    scope: Scope::Existential,
                    falsifier: None,
                });
                hubble_answered = true;
            }
            Err(f) => surfaces.push(Surface {
                id: "cilium/hubble".into(),
                authority: auth,
                status: f.status,
                cause: Some(StatusCause {
                    errno: f.errno,
                    message: f.message,
                }),
                deadline_ms: HUBBLE_DEADLINE.as_millis() as u64,
                elapsed_us: h.elapsed_us,
                digest: None,
                bytes: 0,
                truncated: false,
                facts: Map::new(),
            }),
        }
    }
    if !hubble_answered {
        let has = surfaces.iter().any(|s| s.id == "cilium/hubble");
        unknowns.push(Unknown {
            id: format!("u{}", unknowns.len() + 1),
            question: format!(
                "did Cilium drop or deny traffic between this node and {}?",
                plan.filter.peer
            ),
            blocks: "EXCLUDE_POLICY_DROP".into(),
            owner: "cluster operator".into(),
            probe: hubble_probe,
            surface: has.then(|| "cilium/hubble".to_string()),
        });
    }
    let selector = format!(
        "longhorn volume={} engine={} {}",
        a.volume,
        a.engine,
        plan.filter.selector()
    );
    let next = if faulted.is_empty() {
        NextTransition {
            action: "READ_ENGINE_TERMINAL".into(),
            success_receipt:
                "the engine's rebuild terminal state from the manager, bound to this transfer"
                    .into(),
            abort_conditions: vec!["the rebuild was restarted under a new replica".into()],
        }
    } else {
        NextTransition {
            action: "CAPTURE_PEER_SIDE".into(),
            success_receipt: format!(
                "a storage_transfer envelope of transfer {transfer_id} captured on the other node, linking the same flows"
            ),
            abort_conditions: vec!["the rebuild was restarted under a new replica".into()],
        }
    };
    let mut builder = EnvelopeBuilder::new(
        Subject::StorageTransfer(TransferIdentity {
            volume: a.volume.clone(),
            engine: a.engine.clone(),
            source_node: a.source_node.clone(),
            target_node: a.target_node.clone(),
            transfer_id,
        }),
        pstack_envelope::Collector {
            name: "pstackctl capture longhorn".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            source_commit: transport::SOURCE_COMMIT.into(),
        },
        linked
            .first()
            .map(|e| e.clock.clone())
            .unwrap_or_else(|| pstack_envelope::Clock {
                wall_time: crate::supervisor::clock::wall_time_now(),
                monotonic_start_ns: crate::supervisor::clock::monotonic_ns().to_string(),
                monotonic_end_ns: crate::supervisor::clock::monotonic_ns().to_string(),
                bundle_deadline_ms: 0,
            }),
        Universe {
            selector: selector.clone(),
            selector_digest: sha256_digest(selector.as_bytes()),
            expected_count: linked.len() as u64,
            observed_count: linked.len() as u64,
            termination: Termination::Exhausted,
        },
        linked
            .first()
            .map(|e| e.bounds.clone())
            .unwrap_or(pstack_envelope::Bounds {
                surface_deadline_ms: transport::SURFACE_DEADLINE_MS,
                bundle_deadline_ms: 0,
                max_threads: plan.max_flows as u64,
                max_bytes_per_surface: MAX_API_BYTES as u64,
                leak_budget: 0,
                caps: Default::default(),
            }),
    );
    for x in surfaces {
        builder.surface(x)?;
    }
    for c in claims {
        builder.claim(c)?;
    }
    for u in unknowns {
        builder.unknown(u)?;
    }
    Ok(builder.seal(next)?)
}

/// Run a Longhorn capture: the manager API read (concurrently with the
/// window), the transport capture of the streams with the net helper of
/// `config` under `budget`, then Hubble (it reports the window's past, so it
/// runs after it) with the `hubble` CLI at `hubble_bin`, and the transfer
/// envelope linking the streams.
pub fn capture(
    plan: &LonghornPlan,
    config: &SupervisorConfig,
    budget: &LeakBudget,
    hubble_bin: &Path,
    progress: &dyn Fn(Progress<'_>),
) -> Result<LonghornResult, TransportError> {
    let r = &plan.request;
    let manager = r.longhorn_api.clone().map(|u| {
        let volume = r.volume.clone();
        std::thread::spawn(move || fetch_volume(&u, &volume))
    });
    let streams = transport::capture_with(&plan.transport, config, budget, progress)?;
    let hubble = r.hubble_server.clone().map(|server| {
        let bin = hubble_bin.to_path_buf();
        let (peer, window) = (plan.transport.filter.peer, plan.transport.window);
        std::thread::spawn(move || read_hubble(&bin, &server, peer, window))
    });
    let manager = manager.map(|h| {
        h.join().unwrap_or((
            Err(ApiFailure {
                status: SurfaceStatus::Error,
                errno: None,
                message: "API reader panicked".into(),
            }),
            0,
        ))
    });
    if hubble.is_some() {
        progress(Progress::Phase {
            what: "reading Hubble flows",
            expected: HUBBLE_DEADLINE,
        });
    }
    let hubble = hubble.map(|h| {
        h.join().unwrap_or(HubbleRead {
            command: String::new(),
            result: Err(ApiFailure {
                status: SurfaceStatus::Error,
                errno: None,
                message: "hubble reader panicked".into(),
            }),
            elapsed_us: 0,
        })
    });
    if hubble.is_some() {
        progress(Progress::PhaseDone);
    }
    let transfer = transfer_envelope(r, &plan.transport, &streams, manager, hubble)?;
    Ok(LonghornResult { streams, transfer })
}

/// A Hubble Relay address is `HOST:PORT` of plain name characters: it
/// becomes one argument of a child process and must not read as a flag.
fn hubble_server_ok(s: &str) -> Result<(), RequestError> {
    let ok = !s.is_empty()
        && s.len() <= 260
        && !s.starts_with('-')
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._:[]".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(invalid("hubble_server", format!("{s:?} is not HOST:PORT")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_plain_http_without_credentials() {
        assert_eq!(
            parse_http_url("http://longhorn-backend:9500").unwrap(),
            ("longhorn-backend".into(), 9500, String::new())
        );
        assert_eq!(
            parse_http_url("http://10.0.0.1/api/").unwrap(),
            ("10.0.0.1".into(), 80, "/api".into())
        );
        for bad in [
            "https://x",
            "http://u:p@x",
            "http://",
            "http://x:0",
            "http://x:99999",
            "ftp://x",
        ] {
            assert!(parse_http_url(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_refused_manager_read_is_an_error_surface_with_its_errno() {
        // A loopback port nothing listens on (bound, then released).
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let (r, _) = fetch_volume(&format!("http://127.0.0.1:{port}"), "pvc-1");
        let f = r.unwrap_err();
        assert_eq!(f.status, SurfaceStatus::Error, "{}", f.message);
        assert_eq!(f.errno, Some(libc::ECONNREFUSED), "{}", f.message);
    }

    #[test]
    fn hubble_lines_count_drops_by_reason_and_refuse_garbage() {
        let out = br#"{"flow":{"verdict":"DROPPED","drop_reason_desc":"POLICY_DENIED","IP":{"source":"10.0.0.1","destination":"10.0.0.2"},"l4":{"TCP":{"source_port":1,"destination_port":10001}}}}
{"flow":{"verdict":"FORWARDED"}}
{"flow":{"verdict":"DROPPED"}}
"#;
        let f = hubble_facts(out).unwrap();
        assert_eq!(f["dropped_flows"], json!(2));
        assert_eq!(f["reasons"]["POLICY_DENIED"], json!(1));
        assert_eq!(f["reasons"]["UNKNOWN"], json!(1));
        assert_eq!(f["sample"][0]["destination_port"], json!(10001));
        assert!(hubble_facts(b"not json\n").is_err());
        assert!(hubble_facts(b"{\"no_flow\":1}\n").is_err());
        assert_eq!(hubble_facts(b"").unwrap()["dropped_flows"], json!(0));
    }

    #[test]
    fn volume_facts_read_rebuild_status() {
        let body = br#"{"name":"pvc-1","state":"attached","robustness":"degraded",
            "controllers":[{"name":"pvc-1-e-0"}],
            "rebuildStatus":[{"replica":"pvc-1-r-2","fromReplicaAddress":"tcp://10.0.0.2:10001","state":"in_progress","progress":42,"isRebuilding":true,"error":""}]}"#;
        let f = volume_facts(body, "pvc-1-e-0").unwrap();
        assert_eq!(f["robustness"], json!("degraded"));
        assert_eq!(f["engine_listed"], json!(true));
        assert_eq!(f["rebuild_status"][0]["progress_percent"], json!(42));
        assert!(volume_facts(b"not json", "e").is_err());
    }

    /// Owned inputs of [`transfer_envelope`], streams linked and no reads.
    #[derive(Clone)]
    struct Readings {
        streams: CaptureResult,
        manager: Option<(Result<Vec<u8>, ApiFailure>, u64)>,
        hubble: Option<HubbleRead>,
    }

    const VOLUME: &[u8] = br#"{"name":"pvc-1","state":"attached","robustness":"degraded","controllers":[{"name":"pvc-1-e-0"}],"rebuildStatus":[{"replica":"pvc-1-r-2","fromReplicaAddress":"tcp://10.0.0.2:10001","state":"in_progress","progress":42,"isRebuilding":true,"error":""}]}"#;
    const DROP: &[u8] = br#"{"flow":{"verdict":"DROPPED","drop_reason_desc":"POLICY_DENIED"}}"#;

    fn request() -> LonghornRequest {
        serde_json::from_value(json!({
            "volume": "pvc-1", "engine": "pvc-1-e-0", "source_node": "a",
            "target_node": "b", "peer": "10.0.0.2", "longhorn_api": "http://lh:9500",
            "hubble_server": "relay:4245"
        }))
        .unwrap()
    }

    fn linked() -> Readings {
        Readings {
            streams: CaptureResult {
                net_ns: 4026531840,
                flows: vec![pstack_envelope::example::example_sealed()],
                no_match: None,
            },
            manager: None,
            hubble: None,
        }
    }

    fn with(f: impl FnOnce(&mut Readings)) -> Readings {
        let mut r = linked();
        f(&mut r);
        r
    }

    fn hubble(out: Result<&[u8], SurfaceStatus>) -> Option<HubbleRead> {
        Some(HubbleRead {
            command: "hubble observe".into(),
            result: out.map(<[u8]>::to_vec).map_err(|status| ApiFailure {
                status,
                errno: None,
                message: "failed".into(),
            }),
            elapsed_us: 5,
        })
    }

    impl Readings {
        fn envelope(&self) -> Envelope {
            let r = request();
            let plan = plan(&r).unwrap();
            let r = self.clone();
            transfer_envelope(&request(), &plan.transport, &r.streams, r.manager, r.hubble).unwrap()
        }
        fn codes(&self) -> Vec<String> {
            self.envelope().claims.into_iter().map(|c| c.code).collect()
        }
    }

    /// Every Longhorn claim code: one reading set that produces it, a near
    /// miss that does not (no root, no cluster).
    #[test]
    fn every_longhorn_claim_code_has_a_reading_set_and_a_near_miss() {
        let no_streams = with(|r| {
            r.streams.no_match = r.streams.flows.pop();
        });
        let table: Vec<(&str, Readings, Readings)> = vec![
            ("streams_linked", linked(), no_streams.clone()),
            ("no_stream_linked", no_streams, linked()),
            (
                "longhorn_manager_reports_rebuild",
                with(|r| r.manager = Some((Ok(VOLUME.to_vec()), 7))),
                // The manager answered, but not with a volume document.
                with(|r| r.manager = Some((Ok(b"<html>".to_vec()), 7))),
            ),
            (
                "hubble_reports_drops",
                with(|r| r.hubble = hubble(Ok(DROP))),
                with(|r| r.hubble = hubble(Ok(b""))),
            ),
            (
                "hubble_reports_no_drops",
                with(|r| r.hubble = hubble(Ok(b""))),
                with(|r| r.hubble = hubble(Err(SurfaceStatus::Timeout))),
            ),
        ];
        for (code, hit, miss) in &table {
            let env = hit.envelope();
            assert!(
                env.claims.iter().any(|c| c.code == *code),
                "{code}: not produced: {:?}",
                hit.codes()
            );
            assert!(
                !miss.codes().iter().any(|c| c == code),
                "{code}: near miss produced it"
            );
            for c in &env.claims {
                for s in &c.surfaces {
                    let sf = env.surfaces.iter().find(|x| x.id == *s).unwrap();
                    assert_eq!(sf.status, SurfaceStatus::Ok, "{code}: binds unread {s}");
                }
            }
        }
        // Every code the builder can write has a row.
        let source = include_str!("longhorn.rs");
        let builder = &source[source.find("pub fn transfer_envelope").unwrap()
            ..source.find("pub fn capture(").unwrap()];
        for code in [
            "streams_linked",
            "no_stream_linked",
            "longhorn_manager_reports_rebuild",
            "hubble_reports_drops",
            "hubble_reports_no_drops",
        ] {
            assert!(
                builder.contains(&format!("\"{code}\"")),
                "{code} not in the builder"
            );
        }
        let rows: Vec<&str> = table.iter().map(|(c, _, _)| *c).collect();
        let quoted = builder.matches("\"").count();
        assert!(quoted > 0);
        for w in builder.split('"').skip(1).step_by(2) {
            let claim_like = w.contains('_')
                && w.bytes().all(|b| b.is_ascii_lowercase() || b == b'_')
                && (w.starts_with("longhorn_")
                    || w.starts_with("hubble_")
                    || w.ends_with("_linked"));
            assert!(
                !claim_like || rows.contains(&w),
                "claim code {w:?} has no table row"
            );
        }
        // A failed manager read is an unknown with the kubectl probe, never a claim.
        let failed = with(|r| {
            r.manager = Some((
                Err(ApiFailure {
                    status: SurfaceStatus::Timeout,
                    errno: None,
                    message: "deadline".into(),
                }),
                5_000_000,
            ))
        })
        .envelope();
        assert!(
            failed
                .unknowns
                .iter()
                .any(|u| u.probe.starts_with("kubectl"))
        );
        assert_eq!(failed.completeness, pstack_envelope::Completeness::Partial);
    }
}
