//! `pstack-units`: the units pstack reads from and writes for people, below
//! every crate that needs them (the capture library as much as the
//! command-line tools, which re-export it through `pstack-cli`).
//!
//! - [`duration`]: the one parser of durations on the command line and in
//!   configuration, and the one formatter; a duration always carries its
//!   unit (`5s`, `500ms`, `2m`).

pub mod duration;

pub use duration::{DurationError, format_duration, parse_duration, parse_millis};
