//! What every pstack command-line tool (`pstackctl`, `pstackd`, `pstack-store`)
//! shares with its operator, implemented once:
//!
//! - [`duration`]: the one parser of durations on the command line and in
//!   configuration; a duration always carries its unit (`5s`, `500ms`, `2m`)
//!   (the `pstack-units` crate, re-exported so the libraries below the tools
//!   can use it too).
//! - [`output`]: stdout that ends quietly when its reader is gone, colour only
//!   on a terminal without `NO_COLOR`, and table cells cut to fit with an ellipsis.
//! - [`progress`]: the countdown/phase line on a terminal's stderr during long work.

pub use pstack_units::duration;
pub mod output;
pub mod progress;

pub use duration::{DurationError, parse_duration, parse_millis};
