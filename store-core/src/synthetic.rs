//! Realistic synthetic envelopes for the store's tests and benchmarks.
//!
//! A [`Capture`] describes one observation of a process: host, pid,
//! start_ticks, a sequence number (which fixes the wall time and every
//! counter), the number of threads read and whether a thread is blocked with
//! its stack read timed out. [`Capture::seal`] builds a valid envelope through
//! `pstack_envelope::Envelope::seal` (so it is exactly what an agent would
//! ship); with 25 threads it serializes to about 20 KiB. Deterministic: the
//! same capture always yields the same digest.

use pstack_envelope::{
    Bounds, Claim, ClaimKind, Clock, Collector, Completeness, Envelope, NextTransition,
    ProcessIdentity, Rejection, SCHEMA_ID, Scope, StatusCause, Subject, Surface, SurfaceStatus,
    Termination, Universe, Unknown, sha256_digest,
};
use serde_json::{Map, Value, json};

/// One observation of one process.
#[derive(Debug, Clone)]
pub struct Capture {
    /// Hostname.
    pub host: String,
    /// PID.
    pub pid: u32,
    /// Start time in ticks (with `pid`, the process identity).
    pub start_ticks: u64,
    /// Capture sequence: sets the wall time (one second apart) and counters.
    pub seq: u64,
    /// Threads read (each one `stat` surface).
    pub threads: u32,
    /// One thread is in D and its stack read timed out (`partial`, one
    /// unknown); otherwise every surface is ok (`complete`, no unknowns).
    pub blocked: bool,
}

impl Capture {
    /// A 25-thread capture (~20 KiB) of `pid` on `host`.
    pub fn new(host: &str, pid: u32, seq: u64) -> Capture {
        Capture {
            host: host.into(),
            pid,
            start_ticks: 1_000_000 + u64::from(pid),
            seq,
            threads: 25,
            blocked: true,
        }
    }

    /// Wall time of this capture.
    pub fn wall_time(&self) -> String {
        crate::ident::format_ns(
            1_796_000_000_000_000_000 + i64::try_from(self.seq).unwrap_or(0) * 1_000_000_000,
        )
    }

    /// The subject.
    pub fn subject(&self) -> Subject {
        Subject::Process(ProcessIdentity {
            host: self.host.clone(),
            boot_id: "0f3c2f4e-8a51-4d4c-9d64-0c1f1c7e6a11".into(),
            pid: self.pid,
            start_ticks: self.start_ticks,
            uid: 26,
            pid_ns: "4026531836".into(),
            cgroup: "0::/system.slice/postgresql.service".into(),
        })
    }

    /// Build and seal.
    pub fn seal(&self) -> Result<Envelope, Rejection> {
        self.unsealed().seal()
    }

    /// Build without sealing (for hostile fixtures).
    pub fn unsealed(&self) -> Envelope {
        let pid = self.pid;
        let selector = format!("/proc/{pid}/task/*");
        let blocked_tid = pid + 1;
        let mut surfaces = Vec::new();
        for t in 0..self.threads {
            let tid = pid + t;
            let state = if self.blocked && tid == blocked_tid {
                "D"
            } else {
                "S"
            };
            let stack: Vec<Value> = (0..8)
                .map(|f| {
                    json!(format!(
                        "[<0>] frame_{f}_of_{tid}+0x{:x}/0x{:x}",
                        0x40 + f * 3,
                        0x200 + f
                    ))
                })
                .collect();
            let facts = json!({
                "state": state,
                "wchan": if state == "D" { "fuse_request_send" } else { "do_epoll_wait" },
                "utime_ticks": 10_000 + self.seq * 7 + u64::from(t),
                "stime_ticks": 2_000 + self.seq * 3 + u64::from(t),
                "voluntary_ctxt_switches": 100_000 + self.seq * 31 + u64::from(t),
                "nonvoluntary_ctxt_switches": 50 + self.seq + u64::from(t),
                "last_cpu": t % 2,
                "syscall": [232, format!("0x{:x}", 0x7ffd_0000 + t), "0x10", "0xffffffff"],
                "comm": format!("postgres: worker {t}"),
                "sampled_stack": stack,
            });
            let Value::Object(facts) = facts else {
                unreachable!("json! object")
            };
            surfaces.push(Surface {
                id: format!("task/{tid}/stat"),
                authority: format!("procfs:/proc/{pid}/task/{tid}/stat"),
                status: SurfaceStatus::Ok,
                cause: None,
                deadline_ms: 250,
                elapsed_us: 30 + u64::from(t),
                digest: Some(sha256_digest(
                    format!("{tid} {state} {}", self.seq).as_bytes(),
                )),
                bytes: 312,
                truncated: false,
                facts,
            });
        }
        let mut claims = Vec::new();
        let mut unknowns = Vec::new();
        let completeness = if self.blocked {
            surfaces.push(Surface {
                id: format!("task/{blocked_tid}/stack"),
                authority: format!("procfs:/proc/{pid}/task/{blocked_tid}/stack"),
                status: SurfaceStatus::Timeout,
                cause: Some(StatusCause {
                    errno: None,
                    message: "helper killed after 250 ms and reaped".into(),
                }),
                deadline_ms: 250,
                elapsed_us: 250_400,
                digest: None,
                bytes: 0,
                truncated: false,
                facts: Map::new(),
            });
            claims.push(Claim {
                id: "c1".into(),
                kind: ClaimKind::Fact,
                code: "thread_in_d_state".into(),
                statement: format!("thread {blocked_tid} is in D, wchan fuse_request_send"),
                surfaces: vec![format!("task/{blocked_tid}/stat")],
                scope: Scope::Existential,
                falsifier: None,
            });
            claims.push(Claim {
                id: "c2".into(),
                kind: ClaimKind::Hypothesis,
                code: "blocked_on_fuse_server".into(),
                statement: format!(
                    "thread {blocked_tid} waits on a FUSE server that stopped answering"
                ),
                surfaces: vec![format!("task/{blocked_tid}/stat")],
                scope: Scope::Existential,
                falsifier: Some(
                    "the FUSE server's /dev/fuse reader is runnable and its queue is empty".into(),
                ),
            });
            unknowns.push(Unknown {
                id: "u1".into(),
                question: format!("what is thread {blocked_tid}'s kernel stack?"),
                blocks: "CLASSIFY_BLOCKER".into(),
                owner: format!("operator of {}", self.host),
                probe: format!("pstackctl capture --tid {blocked_tid} --surface-deadline 2s"),
                surface: Some(format!("task/{blocked_tid}/stack")),
            });
            Completeness::Partial
        } else {
            claims.push(Claim {
                id: "c1".into(),
                kind: ClaimKind::Fact,
                code: "no_thread_in_d_state".into(),
                statement: "no thread of the process is in D".into(),
                surfaces: surfaces.iter().map(|s| s.id.clone()).collect(),
                scope: Scope::Universal,
                falsifier: None,
            });
            Completeness::Complete
        };
        let wall = self.wall_time();
        let mono = 98_765_432_100_000u64 + self.seq * 1_000_000_000;
        Envelope {
            schema: SCHEMA_ID.into(),
            completeness,
            subject: self.subject(),
            collector: Collector {
                name: "pstackd".into(),
                version: "0.1.0".into(),
                source_commit: "3b06cc7a1e8c5d2f4b6a8c0e2d4f6a8b0c2e4d6f".into(),
                trigger: None,
            },
            clock: Clock {
                wall_time: wall,
                monotonic_start_ns: mono.to_string(),
                monotonic_end_ns: (mono + 251_000_000).to_string(),
                bundle_deadline_ms: 2000,
            },
            universe: Universe {
                selector_digest: sha256_digest(selector.as_bytes()),
                selector,
                expected_count: u64::from(self.threads),
                observed_count: u64::from(self.threads),
                termination: Termination::Exhausted,
            },
            bounds: Bounds {
                surface_deadline_ms: 250,
                bundle_deadline_ms: 2000,
                max_threads: 10_000,
                max_bytes_per_surface: 65_536,
                leak_budget: 4,
                caps: Default::default(),
            },
            surfaces,
            claims,
            unknowns,
            next_transition: NextTransition {
                action: if self.blocked {
                    "CAPTURE_AGAIN"
                } else {
                    "ISSUE_RECEIPT"
                }
                .into(),
                success_receipt: "a sealed envelope of the same subject with every surface ok"
                    .into(),
                abort_conditions: vec!["subject identity changes".into()],
            },
            digest: String::new(),
        }
    }

    /// Sealed envelope as the compact JSON bytes an agent ships.
    pub fn bytes(&self) -> Result<(String, Vec<u8>), Rejection> {
        let env = self.seal()?;
        let bytes = serde_json::to_vec(&env).unwrap_or_default();
        Ok((env.digest, bytes))
    }
}

/// One end of a TCP flow as the transport engine seals it: a
/// `network_stream` envelope with the engine's surface ids (`tcp/start`,
/// `tcp/end` with `tcp_info` and the window's `delta`, `ebpf/tcp`) and the
/// claim codes its rules write, built with `pstack_envelope::EnvelopeBuilder`.
#[derive(Debug, Clone)]
pub struct StreamEnd {
    /// Local endpoint `ADDR:PORT` (the subject's `src`).
    pub local: String,
    /// Remote endpoint (the subject's `dst`).
    pub remote: String,
    /// Network namespace of the view (`net:[inode]` style or the inode).
    pub net_ns: String,
    /// Socket cookie (the subject's `flow_id`).
    pub cookie: u64,
    /// Capture start, ns since the epoch.
    pub start_ns: i64,
    /// Window length, ms.
    pub window_ms: u64,
    /// Retransmits over the window (`delta.total_retrans`).
    pub retrans: u64,
    /// RTO timeouts over the window (`delta.total_rto`).
    pub rto: u64,
    /// eBPF saw this end send a RST (`rst_sent_by_local`).
    pub rst_sent: bool,
    /// eBPF saw this end receive a RST (`rst_received_from_peer`).
    pub rst_received: bool,
    /// This end advertises a zero receive window at window end.
    pub local_zero_window: bool,
    /// The peer advertises a zero window to this end.
    pub peer_zero_window: bool,
    /// Sealed from pstackd's flight recorder when a `tcp_reset` watch rule
    /// fired (one `ebpf/flight_recorder` surface, `collector.trigger` set)
    /// instead of a live transport window.
    pub recorded: bool,
}

impl StreamEnd {
    /// A healthy 10 s capture of `local -> remote` in `net_ns`.
    pub fn new(local: &str, remote: &str, net_ns: &str, cookie: u64, start_ns: i64) -> StreamEnd {
        StreamEnd {
            local: local.into(),
            remote: remote.into(),
            net_ns: net_ns.into(),
            cookie,
            start_ns,
            window_ms: 10_000,
            retrans: 0,
            rto: 0,
            rst_sent: false,
            rst_received: false,
            local_zero_window: false,
            peer_zero_window: false,
            recorded: false,
        }
    }

    /// Build and seal.
    pub fn seal(&self) -> Result<Envelope, pstack_envelope::BuildError> {
        use pstack_envelope::{EnvelopeBuilder, StreamIdentity};
        let selector = format!(
            "tcp peer {} netns={}",
            self.remote
                .rsplit_once(':')
                .map(|x| x.0)
                .unwrap_or(&self.remote),
            self.net_ns
        );
        let mono = 50_000_000_000u64 + self.cookie % 1_000_000;
        let window_ns = self.window_ms * 1_000_000;
        let mut b = EnvelopeBuilder::new(
            Subject::NetworkStream(StreamIdentity {
                src: self.local.clone(),
                dst: self.remote.clone(),
                protocol: "tcp".into(),
                flow_id: self.cookie.to_string(),
                net_ns: Some(self.net_ns.clone()),
            }),
            Collector {
                name: if self.recorded {
                    "pstackd flight recorder"
                } else {
                    "pstackctl capture transport"
                }
                .into(),
                version: "0.1.0".into(),
                source_commit: "3b06cc7a1e8c5d2f4b6a8c0e2d4f6a8b0c2e4d6f".into(),
                trigger: self.recorded.then(|| pstack_envelope::Trigger {
                    condition: [("flow".to_string(), self.cookie.to_string())].into(),
                    fired_at: crate::ident::format_ns(
                        self.start_ns + i64::try_from(window_ns).unwrap_or(0),
                    ),
                    kind: "tcp_reset".into(),
                    rule: "resets".into(),
                }),
            },
            Clock {
                wall_time: crate::ident::format_ns(self.start_ns),
                monotonic_start_ns: mono.to_string(),
                monotonic_end_ns: (mono + window_ns).to_string(),
                bundle_deadline_ms: self.window_ms + 8_000,
            },
            Universe {
                selector_digest: sha256_digest(selector.as_bytes()),
                selector,
                expected_count: 1,
                observed_count: 1,
                termination: Termination::Exhausted,
            },
            Bounds {
                surface_deadline_ms: 2000,
                bundle_deadline_ms: self.window_ms + 8_000,
                max_threads: 64,
                max_bytes_per_surface: 0,
                leak_budget: 2,
                caps: Default::default(),
            },
        );
        let auth = format!(
            "netlink:NETLINK_SOCK_DIAG inet_diag tcp cookie {} netns {}",
            self.cookie, self.net_ns
        );
        let info = |total_retrans: u64, end: bool| {
            json!({
                "state_name": "ESTABLISHED",
                "rto_us": if end && self.rto > 0 { 1_600_000 } else { 204_000 },
                "snd_wnd": if end && self.peer_zero_window { 0 } else { 64_256 },
                "rcv_wnd": if end && self.local_zero_window { 0 } else { 65_535 },
                "total_retrans": total_retrans,
                "bytes_acked": "1048576",
            })
        };
        let sock = |total_retrans: u64, end: bool| -> Map<String, Value> {
            let v = json!({
                "state": "ESTABLISHED",
                "timer": if end && self.peer_zero_window { "probe" } else { "on" },
                "rqueue": if end && self.local_zero_window { 212_992 } else { 0 },
                "wqueue": 0,
                "tcp_info": info(total_retrans, end),
            });
            match v {
                Value::Object(m) => m,
                _ => Map::new(),
            }
        };
        let surf = |id: &str, authority: String, facts: Map<String, Value>| Surface {
            id: id.into(),
            authority,
            status: SurfaceStatus::Ok,
            cause: None,
            deadline_ms: 2000,
            elapsed_us: 900,
            digest: Some(sha256_digest(
                format!("{id} {} {}", self.cookie, self.start_ns).as_bytes(),
            )),
            bytes: 4096,
            truncated: false,
            facts,
        };
        if self.recorded {
            let facts = json!({
                "totals": {
                    "retransmits": self.retrans,
                    "rto_retransmits": self.rto,
                    "resets_received": u64::from(self.rst_received),
                    "resets_sent": u64::from(self.rst_sent),
                    "state_changes": 2,
                    "zero_window_events": u64::from(self.peer_zero_window),
                    "last_state": "CLOSE",
                },
                "reached_back_before_last_ns": window_ns,
                "sock_cookie": self.cookie.to_string(),
                "horizon_seconds": 60,
            });
            b.surface(surf(
                "ebpf/flight_recorder",
                "ebpf:tracepoint/tcp/* (pstackd flight recorder)".into(),
                match facts {
                    Value::Object(m) => m,
                    _ => Map::new(),
                },
            ))?;
        }
        if !self.recorded {
            b.surface(surf("tcp/start", auth.clone(), sock(7, false)))?;
            let mut end = sock(7 + self.retrans, true);
            end.insert(
                "delta".into(),
                json!({
                    "total_retrans": self.retrans,
                    "total_rto": self.rto,
                    "bytes_acked": 524_288,
                    "bytes_received": 4096,
                    "bytes_retrans": self.retrans * 1448,
                }),
            );
            b.surface(surf("tcp/end", auth, end))?;
            let resets = u64::from(self.rst_sent) + u64::from(self.rst_received);
            let ebpf = json!({
                "cookie": self.cookie.to_string(),
                "retransmits": self.retrans,
                "resets_sent": u64::from(self.rst_sent),
                "resets_received": u64::from(self.rst_received),
                "last_reset_reason": if self.rst_sent { Value::from("NOT_SPECIFIED") } else { Value::Null },
                "transitions": resets,
                "resets": [],
            });
            b.surface(surf(
            "ebpf/tcp",
            "ebpf:tracepoint/tcp/{tcp_retransmit_skb,tcp_receive_reset,tcp_send_reset},sock/inet_sock_set_state".into(),
            match ebpf {
                Value::Object(m) => m,
                _ => Map::new(),
            },
        ))?;
        }
        let recorded = self.recorded;
        let faulty = self.retrans > 0
            || self.rto > 0
            || self.peer_zero_window
            || self.local_zero_window
            || self.rst_received
            || self.rst_sent;
        let mut n = 0;
        let mut claim = |b: &mut EnvelopeBuilder, code: &str, statement: String, on: &[&str]| {
            n += 1;
            b.claim(Claim {
                id: format!("c{n}"),
                kind: ClaimKind::Fact,
                code: code.into(),
                statement,
                surfaces: if recorded {
                    vec!["ebpf/flight_recorder".to_string()]
                } else {
                    on.iter().map(|s| s.to_string()).collect()
                },
                scope: Scope::Existential,
                falsifier: None,
            })
            .map(|_| ())
        };
        let (l, r) = (&self.local, &self.remote);
        if self.retrans > 0 {
            claim(
                &mut b,
                "flow_retransmits",
                format!(
                    "flow {l} -> {r} retransmitted {} segments in the window",
                    self.retrans
                ),
                &["tcp/start", "tcp/end"],
            )?;
        }
        if self.rto > 0 {
            claim(
                &mut b,
                "flow_rto_timeouts",
                format!(
                    "the retransmission timer fired {} times on this flow in the window",
                    self.rto
                ),
                &["tcp/start", "tcp/end"],
            )?;
        }
        if self.peer_zero_window {
            claim(
                &mut b,
                "peer_zero_window",
                format!("at window end the peer {r} advertises a zero receive window"),
                &["tcp/end"],
            )?;
        }
        if self.local_zero_window {
            claim(
                &mut b,
                "local_zero_window",
                format!("this end advertises a zero receive window to {r}"),
                &["tcp/end"],
            )?;
        }
        if self.rst_received {
            claim(
                &mut b,
                "rst_received_from_peer",
                format!("RST received from {r} on flow cookie {}", self.cookie),
                &["ebpf/tcp"],
            )?;
        }
        if self.rst_sent {
            claim(
                &mut b,
                "rst_sent_by_local",
                format!(
                    "this host ({l}) sent a RST to {r} on flow cookie {}",
                    self.cookie
                ),
                &["ebpf/tcp"],
            )?;
        }
        if !faulty {
            claim(
                &mut b,
                "no_fault_observed",
                format!("no fault on flow {l} -> {r}"),
                &["tcp/start", "tcp/end", "ebpf/tcp"],
            )?;
        }
        b.seal(NextTransition {
            action: "CAPTURE_PEER_SIDE".into(),
            success_receipt: format!(
                "a sealed envelope of the same flow captured on the node owning {r}"
            ),
            abort_conditions: vec!["the transfer has finished or was cancelled".into()],
        })
    }

    /// Sealed envelope as the compact JSON bytes an agent ships.
    pub fn bytes(&self) -> Result<(String, Vec<u8>), pstack_envelope::BuildError> {
        let env = self.seal()?;
        Ok((
            env.digest.clone(),
            serde_json::to_vec(&env).unwrap_or_default(),
        ))
    }
}

/// A stream envelope a storage transfer links, as its `streams` surface
/// lists it.
#[derive(Debug, Clone)]
pub struct StreamLink {
    /// The stream envelope's digest.
    pub digest: String,
    /// Its local endpoint.
    pub src: String,
    /// Its remote endpoint.
    pub dst: String,
    /// Its socket cookie.
    pub flow_id: String,
    /// Its claims as `kind:code`.
    pub claims: Vec<String>,
}

/// One node's `storage_transfer` envelope of a Longhorn rebuild, as the
/// Longhorn engine seals it: the rebuild identity, its capture role in the
/// selector, and a `streams` surface linking its stream envelopes.
#[derive(Debug, Clone)]
pub struct TransferEnd {
    /// The rebuild identity (`volume/replica`).
    pub transfer_id: String,
    /// This capture's role: `source`, `target`.
    pub role: String,
    /// Capture start, ns since the epoch.
    pub start_ns: i64,
    /// Linked streams.
    pub links: Vec<StreamLink>,
    /// Network namespace of the streams.
    pub net_ns: String,
}

impl TransferEnd {
    /// Build and seal.
    pub fn seal(&self) -> Result<Envelope, pstack_envelope::BuildError> {
        use pstack_envelope::{EnvelopeBuilder, TransferIdentity};
        let volume = self
            .transfer_id
            .split('/')
            .next()
            .unwrap_or("pvc")
            .to_string();
        let selector = format!(
            "longhorn volume={volume} engine={volume}-e-0 role={} tcp peer 10.42.1.7",
            self.role
        );
        let links: Vec<Value> = self
            .links
            .iter()
            .map(|l| {
                json!({"digest": l.digest, "kind": "network_stream", "flow_id": l.flow_id,
                       "src": l.src, "dst": l.dst, "role": "ssync_data",
                       "completeness": "complete", "claims": l.claims})
            })
            .collect();
        let mut b = EnvelopeBuilder::new(
            Subject::StorageTransfer(TransferIdentity {
                volume: volume.clone(),
                engine: format!("{volume}-e-0"),
                source_node: "node-s".into(),
                target_node: "node-t".into(),
                transfer_id: self.transfer_id.clone(),
            }),
            Collector {
                name: "pstackctl capture longhorn".into(),
                version: "0.1.0".into(),
                source_commit: "3b06cc7a1e8c5d2f4b6a8c0e2d4f6a8b0c2e4d6f".into(),
                trigger: None,
            },
            Clock {
                wall_time: crate::ident::format_ns(self.start_ns),
                monotonic_start_ns: "70000000000".into(),
                monotonic_end_ns: "80000000000".into(),
                bundle_deadline_ms: 20_000,
            },
            Universe {
                selector_digest: sha256_digest(selector.as_bytes()),
                selector,
                expected_count: self.links.len() as u64,
                observed_count: self.links.len() as u64,
                termination: Termination::Exhausted,
            },
            Bounds {
                surface_deadline_ms: 2000,
                bundle_deadline_ms: 20_000,
                max_threads: 64,
                max_bytes_per_surface: 1 << 20,
                leak_budget: 0,
                caps: Default::default(),
            },
        );
        let joined: String = self
            .links
            .iter()
            .map(|l| l.digest.as_str())
            .collect::<Vec<_>>()
            .join("\n");
        let facts = json!({"links": links, "stream_count": self.links.len(), "net_ns": self.net_ns,
                           "incomplete_links": [], "excluded_count": 0, "excluded_sample": []});
        b.surface(Surface {
            id: "streams".into(),
            authority: format!("pstack:network_stream envelopes, netns {}", self.net_ns),
            status: SurfaceStatus::Ok,
            cause: None,
            deadline_ms: 2000,
            elapsed_us: 0,
            digest: Some(sha256_digest(joined.as_bytes())),
            bytes: joined.len() as u64,
            truncated: false,
            facts: match facts {
                Value::Object(m) => m,
                _ => Map::new(),
            },
        })?;
        b.claim(Claim {
            id: "c1".into(),
            kind: ClaimKind::Fact,
            code: "longhorn_streams_linked".into(),
            statement: format!("{} stream(s) of the rebuild linked", self.links.len()),
            surfaces: vec!["streams".into()],
            scope: Scope::Existential,
            falsifier: None,
        })?;
        b.seal(NextTransition {
            action: "CAPTURE_PEER_SIDE".into(),
            success_receipt: format!(
                "a storage_transfer envelope of transfer {} captured on the other party's node",
                self.transfer_id
            ),
            abort_conditions: vec!["the rebuild was restarted under a new replica".into()],
        })
    }

    /// Sealed envelope as the compact JSON bytes an agent ships.
    pub fn bytes(&self) -> Result<(String, Vec<u8>), pstack_envelope::BuildError> {
        let env = self.seal()?;
        Ok((
            env.digest.clone(),
            serde_json::to_vec(&env).unwrap_or_default(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_default_capture_is_about_20_kib_and_verifies() {
        let (digest, bytes) = Capture::new("node-a", 4242, 1).bytes().unwrap();
        assert!(
            (16 << 10..24 << 10).contains(&bytes.len()),
            "{} bytes",
            bytes.len()
        );
        assert_eq!(pstack_envelope::verify(&bytes).unwrap().digest, digest);
        let mut clear = Capture::new("node-a", 4242, 2);
        clear.blocked = false;
        let env = pstack_envelope::verify(&clear.bytes().unwrap().1).unwrap();
        assert_eq!(env.completeness, Completeness::Complete);
    }
}
