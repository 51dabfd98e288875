//! Integration tests of `pstackd`: the real binary, a real Unix socket, real
//! captures through `pstack-helper`, a real collector over TCP on 127.0.0.1
//! (a contract server until the store binary is available, then the store).
//!
//! The helper binary must be built next to `pstackd` (`cargo test
//! --workspace` builds it; the harness runs `cargo build -p pstack-helper`
//! when it is missing). Tests that need root (setuid peers, tmpfs mounts,
//! capability checks) say so in their names and skip with a printed reason
//! when not root.

mod auth;
mod collector;
mod common;
mod ebpf;
mod eio_fuse;
mod faults;
mod helper_status;
mod host_snapshot;
mod hostile_spool;
mod lifecycle;
mod limits;
mod secrets;
mod spool;
mod store_e2e;
mod tls;
mod unit_files;
mod watch;
