//! Integration tests of `pstack-envelope`, one binary of modules.

mod fixtures;
mod jcs_reference;
mod properties;
mod rules;
mod schema;
mod strict;
mod views;
