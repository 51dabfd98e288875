//! The agent↔helper protocol: length-bounded frames carrying JSON.
//!
//! Frame: `u32` big-endian payload length, then the payload (UTF-8 JSON of a
//! [`Request`] from agent to helper, or of a [`Response`] from helper to agent;
//! a helper started with `--net` speaks [`NetRequest`] / [`NetResponse`]
//! instead, over the same framing).
//! A zero length or a length above the receiver's cap is refused from the
//! 4-byte header alone, so a hostile peer cannot make the receiver allocate.
//! Every message type is closed-world (`deny_unknown_fields`).
//!
//! Fuzzing: `fuzz/fuzz_targets/framing.rs` feeds arbitrary bytes to
//! [`decode`] and round-trips whatever decodes. It needs the nightly-only
//! sanitizer flags of `cargo-fuzz`; the bounded run on stable is
//! `cd helper/fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz run framing -- -max_total_time=60 -max_len=65536`
//! (`scripts/fuzz` runs every target this way, bounded).
//! The same property (decode never panics; decode∘encode is the identity) runs
//! in `cargo test` as a proptest.

use std::io::{Read, Write};

use pstack_collectors::net::{FlowFilter, NetSample};
use pstack_collectors::procfs::parse::{StackFacts, SyscallFacts};
use pstack_collectors::procfs::read::{FdTable, ThreadWchans, WchanFacts};
use pstack_collectors::procfs::{RawMeta, ReadError, json_safe};
use pstack_envelope::{DigestKey, RedactedCommand, RedactedEnviron};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Protocol version carried by every request. 2: process readings cross the
/// pipe typed (`ProcReading`), and a sockopt profile exists; a helper and a
/// caller of different builds refuse each other with a clear reason.
pub const PROTOCOL_VERSION: u32 = 2;

/// Largest frame either side accepts by default (8 MiB).
pub const MAX_FRAME: u32 = 8 << 20;

/// Largest [`NetResponse`] frame (64 MiB). A sample carries every socket
/// that matched the flow filter, ~1.3 KB of JSON each with full `tcp_info`:
/// this fits ~50,000 matching sockets. Larger costs the agent that much
/// memory per sample; a sample that does not fit is refused by the helper
/// with the reason (narrow `--peer`/`--ports`), never cut silently.
pub const NET_MAX_FRAME: u32 = 64 << 20;

/// Exit status of `pstack-helper --net` when the kernel refused `setns` into
/// the target netns (EPERM/EACCES).
pub const EXIT_NETNS_DENIED: i32 = 5;

/// Exit status of `pstack-helper --net` when it could not enter the target
/// netns otherwise (not a namespace descriptor, a different inode entered).
pub const EXIT_NETNS_FAILED: i32 = 6;

/// Exit status of a helper that panicked after confinement (it cannot say
/// more: stderr is not writable under its seccomp filter).
pub const EXIT_PANIC: i32 = 7;

/// Largest per-surface byte cap a request may ask for (16 MiB).
pub const MAX_SURFACE_BYTES: u64 = 16 << 20;

/// A framing failure.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// The header announced more than the receiver accepts.
    #[error("frame of {len} bytes exceeds the cap of {max}")]
    TooLarge {
        /// Announced length.
        len: u64,
        /// The cap.
        max: u32,
    },
    /// The header announced an empty payload.
    #[error("empty frame")]
    Empty,
    /// The stream ended inside a frame.
    #[error("stream ended inside a frame: wanted {wanted} bytes, got {got}")]
    Truncated {
        /// Bytes the frame needed.
        wanted: u64,
        /// Bytes that arrived.
        got: u64,
    },
    /// The payload was not a valid message.
    #[error("bad payload: {0}")]
    Decode(String),
    /// Reading or writing the stream failed.
    #[error("i/o: {0}")]
    Io(String),
}

/// A batch of surfaces for the helper to read, in order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Request {
    /// Must be [`PROTOCOL_VERSION`].
    pub version: u32,
    /// The host's digest key: `cmdline` arguments and `environ` blocks are
    /// digested under it (HMAC-SHA-256), never with a bare hash. Travels
    /// only over the helper's private stdin pipe.
    pub digest_key: DigestKey,
    /// Surfaces, performed in this order.
    pub surfaces: Vec<SurfaceRequest>,
}

/// One surface to read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SurfaceRequest {
    /// Echoed in the response.
    pub seq: u32,
    /// Process the surface belongs to.
    pub pid: u32,
    /// What to read.
    pub kind: SurfaceKind,
    /// Deadline the agent enforces, ms. Zero is refused.
    pub deadline_ms: u64,
    /// Most raw bytes to keep (1..=[`MAX_SURFACE_BYTES`]).
    pub max_bytes: u64,
}

/// The risky surfaces the helper can read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "surface", rename_all = "snake_case", deny_unknown_fields)]
pub enum SurfaceKind {
    /// `/proc/<pid>/task/<tid>/wchan`.
    Wchan {
        /// Thread id.
        tid: u32,
    },
    /// `/proc/<pid>/task/<tid>/stack`.
    Stack {
        /// Thread id.
        tid: u32,
    },
    /// `/proc/<pid>/task/<tid>/syscall`.
    Syscall {
        /// Thread id.
        tid: u32,
    },
    /// `/proc/<pid>/cmdline`, redacted.
    Cmdline,
    /// `/proc/<pid>/environ`, redacted.
    Environ,
    /// `/proc/<pid>/fd/*`: readlink + stat of each target.
    FdTargets {
        /// Most descriptors read.
        max_fds: u64,
    },
    /// `wchan` of many threads of one process (host-wide sweeps).
    ThreadWchans {
        /// Thread ids.
        tids: Vec<u32>,
    },
    /// Confinement self-check: attempt a syscall the seccomp filter forbids.
    /// A confined helper is killed by SIGSYS; an unconfined one reports it.
    ForbiddenSyscall {
        /// Which syscall.
        syscall: ForbiddenSyscall,
    },
}

/// Syscalls the helper must never be able to make.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ForbiddenSyscall {
    /// `socket(2)`.
    Socket,
    /// `execve(2)`.
    Execve,
}

impl SurfaceKind {
    /// Short name of the surface (`wchan`, `stack`, ...).
    pub fn name(&self) -> &'static str {
        match self {
            SurfaceKind::Wchan { .. } => "wchan",
            SurfaceKind::Stack { .. } => "stack",
            SurfaceKind::Syscall { .. } => "syscall",
            SurfaceKind::Cmdline => "cmdline",
            SurfaceKind::Environ => "environ",
            SurfaceKind::FdTargets { .. } => "fd",
            SurfaceKind::ThreadWchans { .. } => "wchan",
            SurfaceKind::ForbiddenSyscall { .. } => "forbidden_syscall",
        }
    }

    /// Where the bytes come from, e.g. `procfs:/proc/42/task/43/stack`.
    pub fn authority(&self, pid: u32) -> String {
        match self {
            SurfaceKind::Wchan { tid }
            | SurfaceKind::Stack { tid }
            | SurfaceKind::Syscall { tid } => {
                format!("procfs:/proc/{pid}/task/{tid}/{}", self.name())
            }
            SurfaceKind::Cmdline | SurfaceKind::Environ => {
                format!("procfs:/proc/{pid}/{}", self.name())
            }
            SurfaceKind::FdTargets { .. } => format!("procfs:/proc/{pid}/fd/*"),
            SurfaceKind::ThreadWchans { .. } => format!("procfs:/proc/{pid}/task/*/wchan"),
            SurfaceKind::ForbiddenSyscall { syscall } => {
                format!("helper:seccomp/{syscall:?}").to_lowercase()
            }
        }
    }
}

/// The result of one surface, sent as soon as it completes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Response {
    /// The request's `seq`.
    pub seq: u32,
    /// Time the read took inside the helper, µs.
    pub elapsed_us: u64,
    /// What happened.
    pub outcome: Outcome,
}

/// A procfs helper's typed reading of one surface: the collector's own type
/// crosses the pipe, so the agent's claim rules read fields, not string keys.
/// Externally tagged (`{"wchan": {..}}`), one variant per [`SurfaceKind`]
/// that reads (the forbidden-syscall probe reads nothing).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum ProcReading {
    /// Answer to [`SurfaceKind::Wchan`].
    Wchan(WchanFacts),
    /// Answer to [`SurfaceKind::Stack`].
    Stack(StackFacts),
    /// Answer to [`SurfaceKind::Syscall`].
    Syscall(SyscallFacts),
    /// Answer to [`SurfaceKind::Cmdline`] (redacted).
    Cmdline(RedactedCommand),
    /// Answer to [`SurfaceKind::Environ`] (redacted).
    Environ(RedactedEnviron),
    /// Answer to [`SurfaceKind::FdTargets`].
    FdTargets(FdTable),
    /// Answer to [`SurfaceKind::ThreadWchans`].
    ThreadWchans(ThreadWchans),
}

impl ProcReading {
    /// Whether this reading answers `kind` (a helper that answers a `wchan`
    /// request with a stack is refused by the agent, not believed).
    pub fn answers(&self, kind: &SurfaceKind) -> bool {
        matches!(
            (self, kind),
            (ProcReading::Wchan(_), SurfaceKind::Wchan { .. })
                | (ProcReading::Stack(_), SurfaceKind::Stack { .. })
                | (ProcReading::Syscall(_), SurfaceKind::Syscall { .. })
                | (ProcReading::Cmdline(_), SurfaceKind::Cmdline)
                | (ProcReading::Environ(_), SurfaceKind::Environ)
                | (ProcReading::FdTargets(_), SurfaceKind::FdTargets { .. })
                | (
                    ProcReading::ThreadWchans(_),
                    SurfaceKind::ThreadWchans { .. }
                )
        )
    }

    /// The envelope's rendering of the reading: its fields as a JSON object,
    /// integers beyond 2^53 as strings ([`json_safe`]).
    pub fn envelope_facts(&self) -> serde_json::Map<String, Value> {
        let value = match self {
            ProcReading::Wchan(f) => serde_json::to_value(f),
            ProcReading::Stack(f) => serde_json::to_value(f),
            ProcReading::Syscall(f) => serde_json::to_value(f),
            ProcReading::Cmdline(f) => serde_json::to_value(f),
            ProcReading::Environ(f) => serde_json::to_value(f),
            ProcReading::FdTargets(f) => serde_json::to_value(f),
            ProcReading::ThreadWchans(f) => serde_json::to_value(f),
        };
        match value.map(json_safe) {
            Ok(Value::Object(m)) => m,
            Ok(other) => serde_json::Map::from_iter([("value".to_string(), other)]),
            Err(e) => serde_json::Map::from_iter([(
                "encode_error".to_string(),
                Value::String(e.to_string()),
            )]),
        }
    }
}

/// Outcome of one surface.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "result", rename_all = "snake_case", deny_unknown_fields)]
pub enum Outcome {
    /// Read and parsed.
    Ok {
        /// The typed reading.
        reading: ProcReading,
        /// Digest/length/truncation of the raw bytes.
        raw: RawMeta,
    },
    /// The read failed (vanished, denied, I/O, parse).
    Failed {
        /// Why.
        error: ReadError,
    },
    /// The helper refused the request (no deadline, bad cap, bad version...).
    Refused {
        /// Why.
        reason: String,
    },
}

/// One request to a net helper (`pstack-helper --net`), answered by exactly
/// one [`NetResponse`] with the same `seq`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetRequest {
    /// Must be [`PROTOCOL_VERSION`].
    pub version: u32,
    /// Echoed in the response.
    pub seq: u32,
    /// What to do.
    pub kind: NetRequestKind,
    /// Deadline the agent enforces on the whole request, ms. Zero is refused.
    pub deadline_ms: u64,
}

/// What a net helper can be asked.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "request", rename_all = "snake_case", deny_unknown_fields)]
pub enum NetRequestKind {
    /// One [`NetSample`] of the helper's netns, keeping the sockets that match.
    Sample {
        /// Which flows to keep.
        filter: FlowFilter,
    },
    /// Confinement self-check, as [`SurfaceKind::ForbiddenSyscall`]: `socket`
    /// tries `AF_INET`, which the net profile forbids.
    ForbiddenSyscall {
        /// Which syscall.
        syscall: ForbiddenSyscall,
    },
}

/// A net helper's answer to one [`NetRequest`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetResponse {
    /// The request's `seq`.
    pub seq: u32,
    /// Time the request took inside the helper, µs.
    pub elapsed_us: u64,
    /// What happened.
    pub outcome: NetOutcome,
}

/// Outcome of one [`NetRequest`]. Externally tagged (`{"sample": {..}}`):
/// an internally tagged enum is buffered by serde, and that buffer cannot
/// hold the `i128` counters of a [`NetSample`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum NetOutcome {
    /// The sample (each read inside it succeeds or fails on its own).
    Sample {
        /// Inode of the netns the helper read, from its own
        /// `/proc/thread-self/ns/net` at the time of the read.
        net_ns: u64,
        /// The readings.
        sample: Box<NetSample>,
    },
    /// The helper refused the request (no deadline, bad version...).
    Refused {
        /// Why.
        reason: String,
    },
}

/// Encode `msg` as one frame, refusing payloads above `max`.
pub fn encode<T: Serialize>(msg: &T, max: u32) -> Result<Vec<u8>, FrameError> {
    let payload = serde_json::to_vec(msg).map_err(|e| FrameError::Decode(e.to_string()))?;
    let len = payload.len() as u64;
    if len > u64::from(max) {
        return Err(FrameError::TooLarge { len, max });
    }
    let mut out = Vec::with_capacity(payload.len() + 4);
    out.extend_from_slice(&(len as u32).to_be_bytes());
    out.extend_from_slice(&payload);
    Ok(out)
}

/// Check a frame header; the payload length it announces.
pub fn check_header(header: [u8; 4], max: u32) -> Result<usize, FrameError> {
    let len = u32::from_be_bytes(header);
    if len == 0 {
        return Err(FrameError::Empty);
    }
    if len > max {
        return Err(FrameError::TooLarge {
            len: u64::from(len),
            max,
        });
    }
    Ok(len as usize)
}

/// Decode one frame from the front of `buf`: `Ok(None)` when more bytes are
/// needed, else the message and how many bytes it used. Never panics.
pub fn decode<T: DeserializeOwned>(buf: &[u8], max: u32) -> Result<Option<(T, usize)>, FrameError> {
    let Some(header) = buf.get(..4) else {
        return Ok(None);
    };
    let len = check_header([header[0], header[1], header[2], header[3]], max)?;
    let Some(payload) = buf.get(4..4 + len) else {
        return Ok(None);
    };
    let msg = serde_json::from_slice(payload).map_err(|e| FrameError::Decode(e.to_string()))?;
    Ok(Some((msg, 4 + len)))
}

/// Read one frame (blocking). `Ok(None)` on a clean EOF between frames.
pub fn read_frame<T: DeserializeOwned>(
    r: &mut impl Read,
    max: u32,
) -> Result<Option<T>, FrameError> {
    let mut header = [0u8; 4];
    let got = read_full(r, &mut header)?;
    if got == 0 {
        return Ok(None);
    }
    if got < 4 {
        return Err(FrameError::Truncated {
            wanted: 4,
            got: got as u64,
        });
    }
    let len = check_header(header, max)?;
    let mut payload = vec![0u8; len];
    let got = read_full(r, &mut payload)?;
    if got < len {
        return Err(FrameError::Truncated {
            wanted: len as u64,
            got: got as u64,
        });
    }
    serde_json::from_slice(&payload)
        .map(Some)
        .map_err(|e| FrameError::Decode(e.to_string()))
}

fn read_full(r: &mut impl Read, buf: &mut [u8]) -> Result<usize, FrameError> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(FrameError::Io(e.to_string())),
        }
    }
    Ok(got)
}

/// Write one frame and flush.
pub fn write_frame<T: Serialize>(w: &mut impl Write, msg: &T, max: u32) -> Result<(), FrameError> {
    let frame = encode(msg, max)?;
    w.write_all(&frame)
        .map_err(|e| FrameError::Io(e.to_string()))?;
    w.flush().map_err(|e| FrameError::Io(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn kind() -> impl Strategy<Value = SurfaceKind> {
        prop_oneof![
            any::<u32>().prop_map(|tid| SurfaceKind::Wchan { tid }),
            any::<u32>().prop_map(|tid| SurfaceKind::Stack { tid }),
            any::<u32>().prop_map(|tid| SurfaceKind::Syscall { tid }),
            Just(SurfaceKind::Cmdline),
            Just(SurfaceKind::Environ),
            any::<u64>().prop_map(|max_fds| SurfaceKind::FdTargets { max_fds }),
            proptest::collection::vec(any::<u32>(), 0..20)
                .prop_map(|tids| SurfaceKind::ThreadWchans { tids }),
            Just(SurfaceKind::ForbiddenSyscall {
                syscall: ForbiddenSyscall::Socket
            }),
        ]
    }

    fn request() -> impl Strategy<Value = Request> {
        let surface = (
            any::<u32>(),
            any::<u32>(),
            kind(),
            any::<u64>(),
            any::<u64>(),
        )
            .prop_map(|(seq, pid, kind, deadline_ms, max_bytes)| SurfaceRequest {
                seq,
                pid,
                kind,
                deadline_ms,
                max_bytes,
            });
        (any::<u32>(), proptest::collection::vec(surface, 0..8)).prop_map(|(version, surfaces)| {
            Request {
                version,
                digest_key: DigestKey::from_bytes([9; 32]),
                surfaces,
            }
        })
    }

    fn response() -> impl Strategy<Value = Response> {
        let outcome = prop_oneof![
            (
                proptest::option::of("[a-z_]{1,8}"),
                any::<u32>(),
                any::<bool>()
            )
                .prop_map(|(w, n, t)| Outcome::Ok {
                    reading: match n % 3 {
                        0 => ProcReading::Wchan(WchanFacts { wchan: w }),
                        1 => ProcReading::Stack(StackFacts {
                            frames: w.into_iter().collect(),
                        }),
                        _ => ProcReading::Syscall(SyscallFacts::InSyscall {
                            nr: i64::from(n),
                            name: w,
                        }),
                    },
                    raw: RawMeta::of(&n.to_be_bytes(), t),
                }),
            (".{0,20}", any::<i32>()).prop_map(|(path, errno)| Outcome::Failed {
                error: ReadError::Vanished { path, errno }
            }),
            ".{0,40}".prop_map(|reason| Outcome::Refused { reason }),
        ];
        (any::<u32>(), any::<u64>(), outcome).prop_map(|(seq, elapsed_us, outcome)| Response {
            seq,
            elapsed_us,
            outcome,
        })
    }

    proptest! {
        #[test]
        fn request_round_trips(req in request()) {
            let frame = encode(&req, MAX_FRAME).unwrap();
            let (back, used): (Request, usize) = decode(&frame, MAX_FRAME).unwrap().unwrap();
            prop_assert_eq!(used, frame.len());
            prop_assert_eq!(&back, &req);
            // Every strict prefix asks for more bytes rather than guessing.
            for cut in [0, 1, 3, frame.len() / 2, frame.len() - 1] {
                prop_assert!(decode::<Request>(&frame[..cut], MAX_FRAME).unwrap().is_none());
            }
            let mut cursor = std::io::Cursor::new(frame);
            prop_assert_eq!(read_frame::<Request>(&mut cursor, MAX_FRAME).unwrap(), Some(req));
        }

        #[test]
        fn response_round_trips(resp in response()) {
            let frame = encode(&resp, MAX_FRAME).unwrap();
            let (back, _): (Response, usize) = decode(&frame, MAX_FRAME).unwrap().unwrap();
            prop_assert_eq!(back, resp);
        }

        /// Bounded fuzz of the decoder: arbitrary bytes never panic, and
        /// whatever decodes re-encodes to a frame that decodes to the same
        /// message (the rustls round-trip move).
        #[test]
        fn arbitrary_bytes_never_panic_and_round_trip(bytes in proptest::collection::vec(any::<u8>(), 0..512), max in 1u32..1024) {
            if let Ok(Some((msg, used))) = decode::<Request>(&bytes, max) {
                prop_assert!(used <= bytes.len());
                let again = encode(&msg, MAX_FRAME).unwrap();
                let (back, _): (Request, usize) = decode(&again, MAX_FRAME).unwrap().unwrap();
                prop_assert_eq!(back, msg);
            }
            let _ = decode::<Response>(&bytes, max);
            if let Ok(Some((msg, _))) = decode::<NetRequest>(&bytes, max) {
                let again = encode(&msg, MAX_FRAME).unwrap();
                let (back, _): (NetRequest, usize) = decode(&again, MAX_FRAME).unwrap().unwrap();
                prop_assert_eq!(back, msg);
            }
            let _ = decode::<NetResponse>(&bytes, max);
            let _ = read_frame::<Request>(&mut std::io::Cursor::new(&bytes), max);
        }

        /// Structured fuzz: valid JSON payloads with a hostile header.
        #[test]
        fn json_payload_with_any_header(req in request(), header in any::<u32>()) {
            let mut frame = encode(&req, MAX_FRAME).unwrap();
            frame[..4].copy_from_slice(&header.to_be_bytes());
            let _ = decode::<Request>(&frame, 4096);
        }
    }

    #[test]
    fn oversized_header_is_refused_before_allocation() {
        let frame = [0xff, 0xff, 0xff, 0xff, b'{'];
        assert_eq!(
            decode::<Request>(&frame, MAX_FRAME).unwrap_err(),
            FrameError::TooLarge {
                len: u64::from(u32::MAX),
                max: MAX_FRAME
            }
        );
        let mut c = std::io::Cursor::new(frame);
        assert!(matches!(
            read_frame::<Request>(&mut c, MAX_FRAME),
            Err(FrameError::TooLarge { .. })
        ));
    }

    #[test]
    fn empty_and_truncated_frames_are_errors() {
        assert_eq!(
            decode::<Request>(&[0, 0, 0, 0], MAX_FRAME).unwrap_err(),
            FrameError::Empty
        );
        let mut c = std::io::Cursor::new(vec![0, 0, 0, 10, b'{']);
        assert_eq!(
            read_frame::<Request>(&mut c, MAX_FRAME).unwrap_err(),
            FrameError::Truncated { wanted: 10, got: 1 }
        );
        let mut c = std::io::Cursor::new(vec![0, 0]);
        assert_eq!(
            read_frame::<Request>(&mut c, MAX_FRAME).unwrap_err(),
            FrameError::Truncated { wanted: 4, got: 2 }
        );
        let mut c = std::io::Cursor::new(Vec::new());
        assert_eq!(read_frame::<Request>(&mut c, MAX_FRAME).unwrap(), None);
    }

    #[test]
    fn unknown_fields_are_refused() {
        let payload = br#"{"version":1,"surfaces":[],"extra":1}"#;
        let mut frame = (payload.len() as u32).to_be_bytes().to_vec();
        frame.extend_from_slice(payload);
        assert!(matches!(
            decode::<Request>(&frame, MAX_FRAME),
            Err(FrameError::Decode(_))
        ));
    }

    #[test]
    fn net_messages_round_trip_and_are_closed_world() {
        let req = NetRequest {
            version: PROTOCOL_VERSION,
            seq: 3,
            kind: NetRequestKind::Sample {
                filter: FlowFilter {
                    peer: "10.0.0.2".parse().unwrap(),
                    peer_port: Some(10001),
                    local: None,
                    local_port: None,
                    either_port_in: None,
                },
            },
            deadline_ms: 2000,
        };
        let frame = encode(&req, MAX_FRAME).unwrap();
        let (back, _): (NetRequest, usize) = decode(&frame, MAX_FRAME).unwrap().unwrap();
        assert_eq!(back, req);
        let mut v = serde_json::to_value(&req).unwrap();
        v["kind"]["filter"]["extra"] = serde_json::json!(1);
        assert!(serde_json::from_value::<NetRequest>(v).is_err());
        // A procfs request is not a net request, and vice versa.
        let procfs = encode(
            &Request {
                version: PROTOCOL_VERSION,
                digest_key: DigestKey::from_bytes([9; 32]),
                surfaces: vec![],
            },
            MAX_FRAME,
        )
        .unwrap();
        assert!(decode::<NetRequest>(&procfs, MAX_FRAME).is_err());
        assert!(decode::<Request>(&frame, MAX_FRAME).is_err());
    }

    #[test]
    fn a_reading_answers_only_its_own_kind_and_renders_envelope_safe_facts() {
        let wchan = ProcReading::Wchan(WchanFacts {
            wchan: Some("request_wait_answer".into()),
        });
        assert!(wchan.answers(&SurfaceKind::Wchan { tid: 1 }));
        assert!(!wchan.answers(&SurfaceKind::Stack { tid: 1 }));
        assert!(!wchan.answers(&SurfaceKind::ThreadWchans { tids: vec![1] }));
        assert_eq!(
            serde_json::Value::Object(wchan.envelope_facts()),
            serde_json::json!({"wchan": "request_wait_answer"})
        );
        // Integers past 2^53 become strings in the envelope's rendering.
        let sc = ProcReading::Syscall(SyscallFacts::InSyscall {
            nr: i64::MAX,
            name: None,
        });
        assert_eq!(
            sc.envelope_facts().get("nr"),
            Some(&serde_json::json!(i64::MAX.to_string()))
        );
        // The typed reading crosses the pipe as itself, closed-world.
        let frame = encode(
            &Response {
                seq: 1,
                elapsed_us: 2,
                outcome: Outcome::Ok {
                    reading: wchan.clone(),
                    raw: RawMeta::of(b"request_wait_answer", false),
                },
            },
            MAX_FRAME,
        )
        .unwrap();
        let (back, _): (Response, usize) = decode(&frame, MAX_FRAME).unwrap().unwrap();
        assert!(matches!(back.outcome, Outcome::Ok { reading, .. } if reading == wchan));
        let untyped = br#"{"seq":1,"elapsed_us":2,"outcome":{"result":"ok","facts":{"wchan":"x"},"raw":{"digest":"sha256:00","bytes":1,"truncated":false}}}"#;
        let mut f = (untyped.len() as u32).to_be_bytes().to_vec();
        f.extend_from_slice(untyped);
        assert!(
            decode::<Response>(&f, MAX_FRAME).is_err(),
            "untyped facts are refused"
        );
    }

    #[test]
    fn encode_refuses_above_cap() {
        let req = Request {
            version: PROTOCOL_VERSION,
            digest_key: DigestKey::from_bytes([9; 32]),
            surfaces: vec![],
        };
        assert!(matches!(encode(&req, 4), Err(FrameError::TooLarge { .. })));
    }
}
