//! `pstack-capture`: every capture engine pstack has — process, thread and
//! host (the supervisor), transport, Longhorn and the eBPF TCP trace — behind
//! one typed [`request::CaptureRequest`].
//!
//! The crate is synchronous and has no clap or tokio type in its API: the
//! CLI turns arguments into a request, the daemon turns an HTTP body into the
//! same request and runs the engine on its blocking pool. Both validate
//! through [`request::CaptureRequest::validate`], the one place a field is
//! checked, and both get sealed envelopes back. What validation returns
//! ([`request::ValidRequest`]: a `process::ProcessPlan`, `transport::Plan`,
//! `longhorn::LonghornPlan` or `tcp_trace::TracePlan`) is the only thing an
//! engine accepts, and none of those can be built outside this crate: their
//! fields are crate-private and they have no `Default`, so no caller can
//! hand an engine a request that skipped the validator.
//!
//! Long engines report what they are doing through a [`Progress`] callback
//! instead of writing to a terminal: the CLI draws it, the daemon logs it.

use std::time::Duration;

pub mod clock;
pub mod digest_key;
pub mod envelope_file;
pub mod helpers;
pub mod longhorn;
pub mod probes;
pub mod process;
pub mod request;
/// The process engine at its former path (pstack-agent and its tests use it).
pub mod tcp_trace;
pub mod transport;
pub mod validation;

/// What a long capture is doing, for whoever shows it.
#[derive(Debug, Clone, Copy)]
pub enum Progress<'a> {
    /// A phase started that is expected to last about `expected`.
    Phase {
        /// What is happening.
        what: &'a str,
        /// How long it should take.
        expected: Duration,
    },
    /// The current phase ended.
    PhaseDone,
    /// Something the operator should read (e.g. why a window was cut short).
    Note(&'a str),
}

/// A [`Progress`] sink that drops everything.
pub fn no_progress(_: Progress<'_>) {}
