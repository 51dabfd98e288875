//! `pstackd-api`: the contract between `pstackd` and its clients
//! (`pstackctl`, tests, anyone on the Unix socket). Every type that crosses
//! the socket lives here, and nothing else: no I/O, no runtime, no engine.
//!
//! Invariants:
//! - **One definition per wire shape.** The daemon serializes these types
//!   and clients deserialize the same types; neither side builds or reads
//!   the documents by string key.
//! - **A missing field is an error.** Every field a document always carries
//!   is required when read (`Option` fields that the daemon writes as `null`
//!   included); only fields the daemon omits on purpose default.
//! - Adding a field is compatible (readers ignore members they do not know);
//!   renaming or removing one is not.

pub mod error;
pub mod events;
pub mod limits;
pub mod request;
pub mod status;
pub mod watch_events;

pub use error::{ErrorBody, ErrorDetail};
pub use events::{
    CaptureEvent, CaptureOutcome, CaptureStarted, CaptureState, CaptureStatus, PhaseStatus,
    TraceLine,
};
pub use request::CaptureRequest;
pub use status::DaemonStatus;
pub use watch_events::{WatchEvent, WatchEventKind};

/// Read an `Option` field that must be present (as a value or `null`):
/// serde otherwise reads a missing `Option` as `None`, silently.
pub(crate) fn required<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: serde::Deserialize<'de>,
{
    <Option<T> as serde::Deserialize>::deserialize(d)
}
