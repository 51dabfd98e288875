//! Performing surfaces: validate each request, read it with
//! `pstack-collectors`, send one [`Response`] per surface as soon as it is
//! done. Results go out in request order; the agent relies on that to know
//! which surface is in flight.
//!
//! A net helper ([`serve_net`]) answers each [`NetRequest`] with exactly one
//! [`NetResponse`]: a whole [`pstack_collectors::net::sample::sample`] of the
//! netns it entered at start-up, stamped with that netns's inode as the
//! helper sees it at the time of the read.

use std::io::{Read, Write};
use std::time::Instant;

use pstack_collectors::procfs::Reading;
use pstack_collectors::procfs::read::{self, TaskRef};
use pstack_envelope::DigestKey;

use crate::protocol::{
    ForbiddenSyscall, FrameError, MAX_FRAME, MAX_SURFACE_BYTES, NET_MAX_FRAME, NetOutcome,
    NetRequest, NetRequestKind, NetResponse, Outcome, PROTOCOL_VERSION, ProcReading, Request,
    Response, SurfaceKind, SurfaceRequest, read_frame, write_frame,
};

/// Why a request is refused before any read, or `None` when it is acceptable.
pub fn refusal(version: u32, req: &SurfaceRequest) -> Option<String> {
    if version != PROTOCOL_VERSION {
        return Some(format!(
            "protocol version {version} is not {PROTOCOL_VERSION}"
        ));
    }
    if req.deadline_ms == 0 {
        return Some("no deadline: every risky surface must carry one".into());
    }
    if req.max_bytes == 0 || req.max_bytes > MAX_SURFACE_BYTES {
        return Some(format!(
            "max_bytes {} outside 1..={MAX_SURFACE_BYTES}",
            req.max_bytes
        ));
    }
    if req.pid == 0 {
        return Some("pid 0 is not a process".into());
    }
    None
}

/// The outcome of one read: its typed facts wrapped as the [`ProcReading`]
/// variant `wrap` names, or the read's error.
fn done<T>(
    r: Result<Reading<T>, pstack_collectors::procfs::ReadError>,
    wrap: fn(T) -> ProcReading,
) -> Outcome {
    match r {
        Ok(r) => Outcome::Ok {
            reading: wrap(r.facts),
            raw: r.raw,
        },
        Err(error) => Outcome::Failed { error },
    }
}

/// Attempt a syscall the seccomp filter forbids. Under confinement the kernel
/// kills the process before this returns.
fn attempt_forbidden(which: ForbiddenSyscall) -> Outcome {
    match which {
        ForbiddenSyscall::Socket => {
            // SAFETY: socket(2) takes no pointers; a returned fd is closed below.
            let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0) };
            if fd >= 0 {
                // SAFETY: fd was just returned by socket(2) and is owned here.
                unsafe { libc::close(fd) };
            }
        }
        ForbiddenSyscall::Execve => {
            let path = c"/nonexistent/pstack-helper-probe";
            let argv = [path.as_ptr(), std::ptr::null()];
            let envp = [std::ptr::null()];
            // SAFETY: path, argv and envp are NUL-terminated and outlive the
            // call; the path does not exist, so an unconfined call returns ENOENT.
            unsafe { libc::execve(path.as_ptr(), argv.as_ptr(), envp.as_ptr()) };
        }
    }
    Outcome::Refused {
        reason: format!("forbidden syscall {which:?} was allowed: this helper is not confined"),
    }
}

/// Perform one surface (after [`refusal`] said it is acceptable); `key`
/// digests `cmdline` arguments and `environ` blocks.
pub fn perform(req: &SurfaceRequest, key: &DigestKey) -> Outcome {
    let max = req.max_bytes;
    match &req.kind {
        SurfaceKind::Wchan { tid } => done(
            read::read_wchan(TaskRef::thread(req.pid, *tid), max),
            ProcReading::Wchan,
        ),
        SurfaceKind::Stack { tid } => done(
            read::read_stack(TaskRef::thread(req.pid, *tid), max),
            ProcReading::Stack,
        ),
        SurfaceKind::Syscall { tid } => done(
            read::read_syscall(TaskRef::thread(req.pid, *tid), max),
            ProcReading::Syscall,
        ),
        SurfaceKind::Cmdline => done(read::read_cmdline(req.pid, max, key), ProcReading::Cmdline),
        SurfaceKind::Environ => done(read::read_environ(req.pid, max, key), ProcReading::Environ),
        SurfaceKind::FdTargets { max_fds } => done(
            read::read_fd_targets(req.pid, *max_fds, max),
            ProcReading::FdTargets,
        ),
        SurfaceKind::ThreadWchans { tids } => done(
            read::read_thread_wchans(req.pid, tids, max),
            ProcReading::ThreadWchans,
        ),
        SurfaceKind::ForbiddenSyscall { syscall } => attempt_forbidden(*syscall),
    }
}

/// Why a net request is refused before any read, or `None`.
pub fn net_refusal(req: &NetRequest) -> Option<String> {
    if req.version != PROTOCOL_VERSION {
        return Some(format!(
            "protocol version {} is not {PROTOCOL_VERSION}",
            req.version
        ));
    }
    if req.deadline_ms == 0 {
        return Some("no deadline: every net request must carry one".into());
    }
    None
}

/// Perform one net request (after [`net_refusal`] said it is acceptable).
pub fn perform_net(req: &NetRequest) -> NetOutcome {
    match &req.kind {
        NetRequestKind::Sample { filter } => {
            let sample = pstack_collectors::net::sample::sample(filter);
            match pstack_collectors::net::netns::current_inode() {
                Ok(net_ns) => NetOutcome::Sample {
                    net_ns,
                    sample: Box::new(sample),
                },
                Err(e) => NetOutcome::Refused {
                    reason: format!("cannot tell which netns was read: {e}"),
                },
            }
        }
        NetRequestKind::ForbiddenSyscall { syscall } => match attempt_forbidden(*syscall) {
            Outcome::Refused { reason } => NetOutcome::Refused { reason },
            other => NetOutcome::Refused {
                reason: format!("{other:?}"),
            },
        },
    }
}

/// Serve net requests from `input` until EOF, one response each, in order
/// (responses up to [`NET_MAX_FRAME`]).
pub fn serve_net(input: &mut impl Read, output: &mut impl Write) -> Result<(), FrameError> {
    serve_net_capped(input, output, NET_MAX_FRAME)
}

/// [`serve_net`] with responses capped at `max` bytes: an answer that would
/// not fit is replaced by a `refused` answer saying so.
pub fn serve_net_capped(
    input: &mut impl Read,
    output: &mut impl Write,
    max: u32,
) -> Result<(), FrameError> {
    while let Some(request) = read_frame::<NetRequest>(input, MAX_FRAME)? {
        let start = Instant::now();
        let outcome = match net_refusal(&request) {
            Some(reason) => NetOutcome::Refused { reason },
            None => perform_net(&request),
        };
        let mut response = NetResponse {
            seq: request.seq,
            elapsed_us: u64::try_from(start.elapsed().as_micros()).unwrap_or(u64::MAX),
            outcome,
        };
        if let Err(FrameError::TooLarge { len, max }) = crate::protocol::encode(&response, max) {
            let sockets = match &response.outcome {
                NetOutcome::Sample { sample, .. } => match &sample.tcp.value {
                    Ok(d) => d.sockets.len(),
                    Err(_) => 0,
                },
                NetOutcome::Refused { .. } => 0,
            };
            response.outcome = NetOutcome::Refused {
                reason: format!(
                    "the sample ({sockets} matching sockets) is {len} bytes, above the frame cap of {max}: narrow the flow filter (--peer ADDR:PORT, --local, --ports)"
                ),
            };
        }
        write_frame(output, &response, max)?;
    }
    Ok(())
}

/// Serve requests from `input` until EOF, writing one response per surface
/// to `output` as each completes.
pub fn serve(input: &mut impl Read, output: &mut impl Write) -> Result<(), FrameError> {
    while let Some(request) = read_frame::<Request>(input, MAX_FRAME)? {
        for surface in &request.surfaces {
            let start = Instant::now();
            let outcome = match refusal(request.version, surface) {
                Some(reason) => Outcome::Refused { reason },
                None => perform(surface, &request.digest_key),
            };
            let response = Response {
                seq: surface.seq,
                elapsed_us: u64::try_from(start.elapsed().as_micros()).unwrap_or(u64::MAX),
                outcome,
            };
            write_frame(output, &response, MAX_FRAME)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::encode;

    fn req(kind: SurfaceKind, deadline_ms: u64) -> SurfaceRequest {
        SurfaceRequest {
            seq: 7,
            pid: std::process::id(),
            kind,
            deadline_ms,
            max_bytes: 4096,
        }
    }

    #[test]
    fn a_request_without_deadline_is_refused() {
        let r = refusal(PROTOCOL_VERSION, &req(SurfaceKind::Cmdline, 0)).unwrap();
        assert!(r.contains("no deadline"), "{r}");
        assert!(refusal(PROTOCOL_VERSION, &req(SurfaceKind::Cmdline, 100)).is_none());
        assert!(refusal(PROTOCOL_VERSION + 1, &req(SurfaceKind::Cmdline, 100)).is_some());
        assert!(
            refusal(1, &req(SurfaceKind::Cmdline, 100)).is_some(),
            "version 1 had untyped readings"
        );
    }

    #[test]
    fn net_serve_answers_each_request_once_with_the_netns_it_read() {
        let filter = pstack_collectors::net::FlowFilter {
            peer: "127.0.0.1".parse().unwrap(),
            peer_port: None,
            local: None,
            local_port: None,
            either_port_in: None,
        };
        let mut input = Vec::new();
        for (seq, deadline_ms) in [(1, 1000), (2, 0)] {
            input.extend(
                encode(
                    &NetRequest {
                        version: PROTOCOL_VERSION,
                        seq,
                        kind: NetRequestKind::Sample {
                            filter: filter.clone(),
                        },
                        deadline_ms,
                    },
                    MAX_FRAME,
                )
                .unwrap(),
            );
        }
        let mut out = Vec::new();
        serve_net(&mut std::io::Cursor::new(input), &mut out).unwrap();
        let mut cursor = std::io::Cursor::new(out);
        let a: NetResponse = read_frame(&mut cursor, MAX_FRAME).unwrap().unwrap();
        let b: NetResponse = read_frame(&mut cursor, MAX_FRAME).unwrap().unwrap();
        let here = pstack_collectors::net::netns::current_inode().unwrap();
        match a.outcome {
            NetOutcome::Sample { net_ns, sample } => {
                assert_eq!(net_ns, here);
                assert!(sample.tcp.value.is_ok(), "{:?}", sample.tcp);
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(b.seq, 2);
        assert!(
            matches!(&b.outcome, NetOutcome::Refused { reason } if reason.contains("no deadline")),
            "{b:?}"
        );
        assert_eq!(
            read_frame::<NetResponse>(&mut cursor, MAX_FRAME).unwrap(),
            None
        );
    }

    #[test]
    fn a_net_sample_above_the_frame_cap_is_refused_with_the_reason_not_cut() {
        let request = NetRequest {
            version: PROTOCOL_VERSION,
            seq: 1,
            kind: NetRequestKind::Sample {
                filter: pstack_collectors::net::FlowFilter {
                    peer: "127.0.0.1".parse().unwrap(),
                    peer_port: None,
                    local: None,
                    local_port: None,
                    either_port_in: None,
                },
            },
            deadline_ms: 1000,
        };
        let input = encode(&request, MAX_FRAME).unwrap();
        let mut out = Vec::new();
        serve_net_capped(&mut std::io::Cursor::new(input), &mut out, 1024).unwrap();
        let r: NetResponse = read_frame(&mut std::io::Cursor::new(out), MAX_FRAME)
            .unwrap()
            .unwrap();
        match r.outcome {
            NetOutcome::Refused { reason } => {
                assert!(reason.contains("above the frame cap of 1024"), "{reason}")
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn serve_streams_one_response_per_surface_in_order() {
        let me = std::process::id();
        let request = Request {
            version: PROTOCOL_VERSION,
            digest_key: DigestKey::from_bytes([3; 32]),
            surfaces: vec![
                req(SurfaceKind::Wchan { tid: me }, 100),
                SurfaceRequest {
                    seq: 8,
                    ..req(SurfaceKind::Cmdline, 0)
                },
                SurfaceRequest {
                    seq: 9,
                    ..req(SurfaceKind::Environ, 100)
                },
            ],
        };
        let input = encode(&request, MAX_FRAME).unwrap();
        let mut out = Vec::new();
        serve(&mut std::io::Cursor::new(input), &mut out).unwrap();
        let mut cursor = std::io::Cursor::new(out);
        let a: Response = read_frame(&mut cursor, MAX_FRAME).unwrap().unwrap();
        let b: Response = read_frame(&mut cursor, MAX_FRAME).unwrap().unwrap();
        let c: Response = read_frame(&mut cursor, MAX_FRAME).unwrap().unwrap();
        assert_eq!((a.seq, b.seq, c.seq), (7, 8, 9));
        assert!(matches!(a.outcome, Outcome::Ok { .. }), "{a:?}");
        assert!(matches!(b.outcome, Outcome::Refused { .. }), "{b:?}");
        match c.outcome {
            Outcome::Ok {
                reading: ProcReading::Environ(env),
                ..
            } => {
                let text = serde_json::to_string(&env).unwrap();
                assert!(text.contains("names") && !text.contains('='), "{text}")
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            read_frame::<Response>(&mut cursor, MAX_FRAME).unwrap(),
            None
        );
    }
}
