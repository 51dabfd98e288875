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
