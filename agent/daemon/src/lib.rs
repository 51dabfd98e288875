//! `pstackd`: the privileged node daemon.
//!
//! It serves HTTP/1.1 on a Unix socket (`curl --unix-socket` is enough):
//! `POST /v1/captures` runs the capture supervisor and answers the sealed
//! envelope once it is durably spooled; `GET /v1/envelopes/{digest}`,
//! `GET /v1/status` and `GET /metrics` describe what it holds. The shipper
//! delivers spooled envelopes to the collector and deletes each only after
//! the collector acknowledges its digest.
//!
//! ```text
//! curl --unix-socket /run/pstack/pstackd.sock -X POST \
//!      -d '{"subject":{"pid":4242},"deadlines":{"surface_ms":250,"bundle_ms":2000}}' \
//!      http://pstackd/v1/captures                      # -> the sealed envelope (200)
//! curl --unix-socket /run/pstack/pstackd.sock -X POST \
//!      -d '{"subject":{"pid":4242},"surfaces":["task/*/stack","task/*/wchan"]}' \
//!      http://pstackd/v1/captures                      # only those (and thread states)
//! curl --unix-socket /run/pstack/pstackd.sock http://pstackd/v1/status
//! curl --unix-socket /run/pstack/pstackd.sock http://pstackd/metrics
//! ```
//!
//! Request body: `subject` is exactly one of `{"pid": N}`, `{"tid": N}`,
//! `{"host": true}`; optional `deadlines` (`surface_ms`, `bundle_ms`) and
//! `caps` (`max_threads`, `max_bytes_per_surface`) may only narrow the
//! configured values; optional `window_ms` (pid/tid only) adds the
//! `ebpf:offcpu` surface observed over that window; optional `surfaces` lists
//! the surface families to read (`["task/*/stack", "proc/fd"]`; see
//! [`pstack_capture::process::SurfaceFamily`]) — thread states are always read and
//! the universe selector records the selection; an unknown or misfit name is
//! a 400 `bad_surfaces` naming the valid ones. Unknown members are refused.
//!
//! Data flows one way: supervisor → envelope → [`spool`] → [`shipper`] →
//! collector. Invariants of each stage are stated in its module:
//! - [`peer`]: who may call (SO_PEERCRED uid/gid; the PID is never identity);
//! - [`privilege`]: the capability set kept and why; `no_new_privs`;
//! - [`api`]: status codes; a 200 means "spooled"; no queueing past the limit;
//! - [`spool`]: on-disk format, durability window, who deletes what;
//! - [`shipper`]: delete only after per-item ack; retry and backoff;
//! - [`notify`]: readiness and watchdog semantics;
//! - [`ebpf`]: the eBPF programs kept attached, never fatal, lent to windowed captures;
//! - [`run`]: startup order, drain and reload.

pub mod api;
pub mod capture;
pub mod captures;
pub mod config;
pub mod ebpf;
pub mod engines;
pub mod listener;
pub mod notify;
pub mod peer;
pub mod privilege;
pub mod run;
pub mod shipper;
pub mod spool;
pub mod state;
pub mod watch;
