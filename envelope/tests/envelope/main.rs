//! Integration tests of `pstack-envelope`, one binary of modules.

mod fast_path;
mod fixtures;
mod jcs_reference;
mod properties;
mod rules;
mod schema;
mod strict;
mod views;
