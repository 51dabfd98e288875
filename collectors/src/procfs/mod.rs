//! procfs readers: identity, per-process and per-thread state, and the risky
//! surfaces (kernel stack, wchan, syscall, cmdline, environ, fd targets).
//!
//! Invariants:
//! - **Pure parsers, thin readers.** [`parse`] turns captured bytes into typed
//!   facts and never touches `/proc`; [`read`] opens, reads (bounded) and calls
//!   the parser. Every parser is tested on captured text.
//! - **Every reading carries its raw evidence.** A [`Reading`] holds typed facts
//!   plus [`RawMeta`]: the SHA-256 digest and length of the bytes the facts were
//!   parsed from, and whether the byte cap cut them. Truncation is reported,
//!   never silent: a read keeps at most `max_bytes` and sets `truncated` when
//!   the file had more.
//! - **Expected outcomes are typed.** A task that went away is
//!   [`ReadError::Vanished`], a refused read [`ReadError::PermissionDenied`];
//!   neither is a failure of the collector. They become surface statuses.
//! - **No deadlines here.** `wchan`, `stack`, `syscall`, `cmdline`, `environ`
//!   and fd-target reads can block on the very task being diagnosed (its
//!   `mmap_lock`, a hung filesystem). They are only ever called inside
//!   `pstack-helper`, a process the agent can kill; [`RISKY`] lists them.
//! - **The thread universe is `/proc/<pid>/task/*`**, enumerated with a cap
//!   ([`read::list_tasks`]); the cap is reported, never silently applied.

pub mod container;
pub mod freezer;
pub mod identity;
pub mod parse;
pub mod raw;
pub mod read;

pub use identity::{HostFacts, IdentityReading, read_host_facts, read_identity};
pub use parse::{
    FdKind, FdTarget, IoCounters, SchedStat, StackFacts, StatusFacts, SyscallFacts, TaskStat,
    TaskState, syscall_name,
};
pub use raw::{ProcDir, RawMeta, RawRead, ReadError, Reading, json_safe};

/// Surfaces that can block on the task being diagnosed; they run only in the
/// helper process.
pub const RISKY: [&str; 6] = ["stack", "wchan", "syscall", "cmdline", "environ", "fd"];
