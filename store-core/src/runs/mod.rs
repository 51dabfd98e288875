//! Supervised investigation runs (seed 003 on seed 001's agent loop):
//! [`graph`] the declared step graphs, [`deviation`] the seven classes and
//! the escalation policy, [`supervisor`] the pure run core, [`report`] the
//! payload-free `runbook-run-report/v1`, [`freshness`] the one freshness and
//! pre-mutation rule (runs and the gate), [`hypotheses`] the per-subject
//! hypothesis ledger, [`acceptance`] seed 001's AC1 metrics over
//! [`run_acceptance`], what each run accumulated.
//!
//! Invariant shared by all: nothing here reads a clock, and nothing here
//! keeps what an agent attempted — only classes, step ids, sequence numbers,
//! codes from closed sets, and (in the ledger) what sealed envelopes said.

pub mod acceptance;
pub mod deviation;
pub mod freshness;
pub mod graph;
pub mod hypotheses;
pub mod report;
pub mod run_acceptance;
pub mod supervisor;

#[cfg(test)]
mod taxonomy_tests;
