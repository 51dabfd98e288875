//! Integration tests of `pstackctl capture` and the capture supervisor, on
//! real processes and the real kernel. One test binary of modules.
//!
//! Most tests need root (cgroup-v1 freezer, FUSE mounts, `/proc/<pid>/stack`,
//! pid reuse through `ns_last_pid`); each says so in its name and skips with a
//! printed reason only when the kernel feature is truly absent.
//!
//! The helper binary must be built (`cargo test --workspace` builds it; with
//! `-p pstack-agent` alone run `cargo build -p pstack-helper` first).
#![allow(
    clippy::unwrap_in_result,
    reason = "fixtures panic on setup failure by design"
)]

mod bad_input;
// The pstackd harness of the daemon tests (one leak budget per host).
mod caps;
mod confinement;
#[path = "../daemon/common.rs"]
#[allow(dead_code, reason = "shared harness; this binary uses part of it")]
mod daemon_common;
mod deadlines;
mod durations;
mod fixtures;
mod fuse_hang;
mod host;
mod host_view;
mod identity_race;
mod isolation;
mod offcpu_window;
mod output;
mod pod_identity;
mod probes;
mod selection;
mod shared_leak_budget;
mod states;
mod unreapable;
