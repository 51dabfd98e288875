//! The analysis half of the store (seed 000): which change caused it.
//!
//! Pure rule modules — [`verdict`] (the six blast-radius verdicts and the
//! Newcombe interval), [`proof`] (causal proof tier, fingerprint,
//! counterfactual pairing), [`fleet`] (node cohorts from envelope claims),
//! [`ledger`] (change validation), [`otlp`] (OTLP decode and aggregation),
//! [`cohort`] (request cohorts by version, config digest and flag variant),
//! [`sketch`] (latency with a stated relative error, counts to the second),
//! [`future`] (the bound on caller-supplied times),
//! [`otlp_cost`] (what an OTLP body costs decoded, read before decoding) —
//! and [`blast`], which assembles a blast radius from stored aggregates.
//! Storage is `crate::db::analysis`; routes are `pstack_store::http::analysis`.

pub mod blast;
pub mod cohort;
pub mod fleet;
pub mod future;
pub mod ledger;
pub mod otlp;
pub mod otlp_cost;
pub mod proof;
pub mod sketch;
pub mod verdict;
