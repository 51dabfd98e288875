//! A small, valid, realistic envelope for documentation, examples and tests
//! in every crate: a process with one thread in uninterruptible sleep whose
//! kernel stack read timed out. Values are plausible, not captured.

use serde_json::{Map, Value, json};

use crate::model::*;
use crate::seal::sha256_digest;

fn facts(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => Map::new(),
    }
}

/// An unsealed example: a `partial` process envelope (digest empty).
pub fn example_unsealed() -> Envelope {
    let selector = "/proc/4242/task/*";
    Envelope {
        schema: SCHEMA_ID.into(),
        completeness: Completeness::Partial,
        subject: Subject::Process(ProcessIdentity {
            host: "node-a".into(),
            boot_id: "0f3c2f4e-8a51-4d4c-9d64-0c1f1c7e6a11".into(),
            pid: 4242,
            start_ticks: 1_234_567,
            uid: 0,
            pid_ns: "4026531836".into(),
            cgroup: "0::/system.slice/postgres.service".into(),
        }),
        collector: Collector {
            name: "pstackctl".into(),
            version: "0.1.0".into(),
            source_commit: "0000000000000000000000000000000000000000".into(),
            trigger: None,
        },
        clock: Clock {
            wall_time: "2026-12-02T11:00:00.123Z".into(),
            monotonic_start_ns: "98765432100000".into(),
            monotonic_end_ns: "98765682100000".into(),
            bundle_deadline_ms: 2000,
        },
        universe: Universe {
            selector: selector.into(),
            selector_digest: sha256_digest(selector.as_bytes()),
            expected_count: 2,
            observed_count: 2,
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
        surfaces: vec![
            Surface {
                id: "task/4242/stat".into(),
                authority: "procfs:/proc/4242/task/4242/stat".into(),
                status: SurfaceStatus::Ok,
                cause: None,
                deadline_ms: 250,
                elapsed_us: 41,
                digest: Some(sha256_digest(b"4242 (postgres) S")),
                bytes: 17,
                truncated: false,
                facts: facts(
                    json!({"state": "S", "voluntary_ctxt_switches": 1021, "nonvoluntary_ctxt_switches": 3}),
                ),
            },
            Surface {
                id: "task/4243/stat".into(),
                authority: "procfs:/proc/4242/task/4243/stat".into(),
                status: SurfaceStatus::Ok,
                cause: None,
                deadline_ms: 250,
                elapsed_us: 38,
                digest: Some(sha256_digest(b"4243 (postgres) D")),
                bytes: 17,
                truncated: false,
                facts: facts(json!({"state": "D", "wchan": "fuse_request_send", "syscall": 4})),
            },
            Surface {
                id: "task/4243/stack".into(),
                authority: "procfs:/proc/4242/task/4243/stack".into(),
                status: SurfaceStatus::Timeout,
                cause: Some(StatusCause {
                    errno: None,
                    message: "helper killed after 250 ms and reaped".into(),
                }),
                deadline_ms: 250,
                elapsed_us: 250_412,
                digest: None,
                bytes: 0,
                truncated: false,
                facts: Map::new(),
            },
        ],
        claims: vec![
            Claim {
                id: "c1".into(),
                kind: ClaimKind::Fact,
                code: "thread_in_d_state".into(),
                statement: "thread 4243 is in D, wchan fuse_request_send, syscall 4 (stat)".into(),
                surfaces: vec!["task/4243/stat".into()],
                scope: Scope::Existential,
                falsifier: None,
            },
            Claim {
                id: "c2".into(),
                kind: ClaimKind::Hypothesis,
                code: "blocked_on_fuse_server".into(),
                statement: "thread 4243 waits on a FUSE server that stopped answering".into(),
                surfaces: vec!["task/4243/stat".into()],
                scope: Scope::Existential,
                falsifier: Some(
                    "the FUSE server's /dev/fuse reader is runnable and the request queue is empty"
                        .into(),
                ),
            },
        ],
        unknowns: vec![Unknown {
            id: "u1".into(),
            question: "what is thread 4243's kernel stack?".into(),
            blocks: "CLASSIFY_BLOCKER".into(),
            owner: "node operator".into(),
            probe: "pstackctl capture --tid 4243 --surface-deadline 2s".into(),
            surface: Some("task/4243/stack".into()),
        }],
        next_transition: NextTransition {
            action: "CAPTURE_AGAIN".into(),
            success_receipt: "a sealed envelope of the same subject with task/4243/stack ok".into(),
            abort_conditions: vec!["subject identity changes".into()],
        },
        digest: String::new(),
    }
}

/// The example, sealed.
pub fn example_sealed() -> Envelope {
    example_unsealed()
        .seal()
        .expect("the built-in example envelope is valid")
}

/// The example grown by `threads` thread surfaces, each with 24 stack-frame
/// strings, state, wchan and a counter (760 threads make about 1 MiB),
/// unsealed: what the benchmarks, the perf probe and the large-input tests
/// measure.
pub fn example_with_threads(threads: u32) -> Envelope {
    let mut e = example_unsealed();
    let template = e.surfaces[0].clone();
    for i in 0..threads {
        let mut s = template.clone();
        s.id = format!("task/{}/stack", 5000 + i);
        s.authority = format!("procfs:/proc/4242/task/{}/stack", 5000 + i);
        s.facts.insert(
            "frames".into(),
            serde_json::json!(
                (0..24)
                    .map(|f| format!("[<0>] some_kernel_function_{f}+0x{:x}/0x200", f * 16))
                    .collect::<Vec<_>>()
            ),
        );
        s.facts.insert("state".into(), serde_json::json!("S"));
        s.facts.insert(
            "voluntary_ctxt_switches".into(),
            serde_json::json!(i * 1000),
        );
        s.facts
            .insert("wchan".into(), serde_json::json!("futex_wait_queue"));
        e.surfaces.push(s);
    }
    e
}
