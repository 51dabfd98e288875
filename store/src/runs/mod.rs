//! Supervised investigation runs (seed 003 on seed 001's agent loop):
//! [`graph`] the declared step graphs, [`deviation`] the seven classes and
//! the escalation policy, [`supervisor`] the pure run core, [`report`] the
//! payload-free `runbook-run-report/v1`.
//!
//! Invariant shared by all four: nothing here reads a clock, and nothing
//! here keeps what an agent attempted — only classes, step ids, sequence
//! numbers and codes from closed sets.

pub mod deviation;
pub mod freshness;
pub mod graph;
pub mod report;
pub mod supervisor;

#[cfg(test)]
mod taxonomy_tests;
