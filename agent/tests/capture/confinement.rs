//! Helper confinement seen from the agent: a forbidden syscall kills the
//! helper with SIGSYS, that surface is `error` with the cause, and the rest
//! of the batch goes to a fresh helper.

use std::time::{Duration, Instant};

use pstack_capture::process::{RiskyRead, run_risky};
use pstack_envelope::SurfaceStatus;
use pstack_helper::protocol::{ForbiddenSyscall, SurfaceKind};

use crate::fixtures::{budget, config};

#[test]
fn forbidden_socket_and_execve_are_error_with_sigsys_cause() {
    let me = std::process::id();
    let read = |id: &str, kind| RiskyRead {
        id: id.into(),
        pid: me,
        kind,
        deadline: Some(Duration::from_secs(2)),
        max_bytes: 4096,
    };
    let reads = vec![
        read(
            "socket",
            SurfaceKind::ForbiddenSyscall {
                syscall: ForbiddenSyscall::Socket,
            },
        ),
        read("wchan", SurfaceKind::Wchan { tid: me }),
        read(
            "execve",
            SurfaceKind::ForbiddenSyscall {
                syscall: ForbiddenSyscall::Execve,
            },
        ),
        read("cmdline", SurfaceKind::Cmdline),
    ];
    let dir = tempfile::tempdir().unwrap();
    let out = run_risky(
        reads,
        Instant::now() + Duration::from_secs(10),
        "self",
        &config(),
        &budget(dir.path(), 1),
    )
    .unwrap();
    for i in [0, 2] {
        assert_eq!(out[i].status, SurfaceStatus::Error, "{:?}", out[i]);
        let cause = out[i].cause.as_ref().unwrap();
        assert!(cause.message.contains("SIGSYS"), "{cause:?}");
    }
    for i in [1, 3] {
        assert_eq!(out[i].status, SurfaceStatus::Ok, "{:?}", out[i]);
    }
}
