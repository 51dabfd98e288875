//! Integration tests of `pstack-envelope`, one binary of modules.

mod fixtures;
mod properties;
mod rules;
mod schema;
mod strict;
mod views;
