//! Request cohorts as stored: one row per (environment, service, dimension,
//! name, minute, value), each holding that minute's requests to the second
//! with their latency sketch ([`super::sketch`]). Pure.
//!
//! Dimensions, each a partition of a service's requests:
//! - `version`: `service.version` (else `vcs.commit.id`, else `unknown`);
//! - `config`: `obs.config.digest` (requests without one are in no row);
//! - `flag`: per flag key (`name`), the variant (`feature_flag.key` +
//!   `feature_flag.variant` / `feature_flag.result.variant`, or
//!   `obs.feature_flags.<key>`).
//!
//! Invariants:
//! - Bounded: at most [`MAX_CONFIG_DIGESTS`] digests and
//!   [`MAX_FLAG_VARIANTS`] (flag, variant) pairs per (environment, service,
//!   minute), and keys/values of at most [`MAX_COHORT_TEXT`] bytes. What
//!   does not fit is counted, not dropped, in the dimension's overflow row
//!   (`name` = `value` = ""; no digest, flag or variant is empty, so it
//!   never collides with a cohort). The store enforces the same caps across
//!   bodies (`crate::db::analysis`).
//! - Versions are not capped (as before this module): a service's versions
//!   are few, and the version cohorts are what deploys are judged on.

use std::collections::{BTreeMap, HashMap};

use super::otlp_cost::{ALLOC_OVERHEAD, NODE_PEAK};
use super::sketch::MinuteCells;

/// Distinct config digests kept per (environment, service, minute).
pub const MAX_CONFIG_DIGESTS: usize = 16;
/// Distinct (flag key, variant) pairs kept per (environment, service, minute).
pub const MAX_FLAG_VARIANTS: usize = 64;
/// Longest flag key, variant or digest kept as a cohort (bytes).
pub const MAX_COHORT_TEXT: usize = 256;

/// What a cohort row partitions requests by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Dimension {
    /// Service version.
    Version,
    /// Config digest.
    Config,
    /// Feature-flag variant (name = the flag key).
    Flag,
}

impl Dimension {
    /// Stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            Dimension::Version => "version",
            Dimension::Config => "config",
            Dimension::Flag => "flag",
        }
    }

    /// From the stored name.
    pub fn parse(s: &str) -> Option<Dimension> {
        match s {
            "version" => Some(Dimension::Version),
            "config" => Some(Dimension::Config),
            "flag" => Some(Dimension::Flag),
            _ => None,
        }
    }

    /// The cap on distinct values per (environment, service, minute), if any.
    pub fn cap(self) -> Option<usize> {
        match self {
            Dimension::Version => None,
            Dimension::Config => Some(MAX_CONFIG_DIGESTS),
            Dimension::Flag => Some(MAX_FLAG_VARIANTS),
        }
    }
}

/// Key of a cohort row (field order = the table's primary key order).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CohortKey {
    /// `deployment.environment.name`.
    pub environment: String,
    /// `service.name`.
    pub service: String,
    /// What the row partitions by.
    pub dimension: Dimension,
    /// Flag key for [`Dimension::Flag`], else "" (also "" in the overflow row).
    pub name: String,
    /// Minute start, ns.
    pub bucket_ns: i64,
    /// Version, digest or variant ("" = the overflow row).
    pub value: String,
}

impl CohortKey {
    /// Whether this is a dimension's overflow row.
    pub fn is_overflow(&self) -> bool {
        self.dimension != Dimension::Version && self.value.is_empty()
    }

    /// The overflow row of this key's (environment, service, dimension, minute).
    pub fn overflow(&self) -> CohortKey {
        CohortKey {
            environment: self.environment.clone(),
            service: self.service.clone(),
            dimension: self.dimension,
            name: String::new(),
            bucket_ns: self.bucket_ns,
            value: String::new(),
        }
    }
}

/// The cohort rows one body adds, capped as the module says.
#[derive(Debug, Clone, Default)]
pub struct CohortRows {
    /// Row → its requests.
    pub rows: BTreeMap<CohortKey, MinuteCells>,
    /// Distinct capped values per (environment, service, dimension, minute).
    distinct: HashMap<(String, String, Dimension, i64), usize>,
}

impl CohortRows {
    /// Count one request in `(dimension, name, value)`; returns an estimate
    /// of the bytes this added (new row, key strings, second cell, bucket),
    /// which the OTLP decoder charges to its memory budget.
    #[allow(
        clippy::too_many_arguments,
        reason = "one request's coordinates, all needed"
    )]
    pub fn record(
        &mut self,
        environment: &str,
        service: &str,
        dimension: Dimension,
        name: &str,
        value: &str,
        bucket_ns: i64,
        second: u8,
        latency_key: u16,
        failed: bool,
    ) -> usize {
        let mut added = 0;
        let mut key = CohortKey {
            environment: environment.to_string(),
            service: service.to_string(),
            dimension,
            name: name.to_string(),
            bucket_ns,
            value: value.to_string(),
        };
        if let Some(cap) = dimension.cap()
            && !self.rows.contains_key(&key)
        {
            let too_long = name.len() > MAX_COHORT_TEXT
                || value.len() > MAX_COHORT_TEXT
                || value.is_empty()
                || (dimension == Dimension::Flag && name.is_empty());
            let seen = self
                .distinct
                .entry((
                    environment.to_string(),
                    service.to_string(),
                    dimension,
                    bucket_ns,
                ))
                .or_default();
            if *seen == 0 {
                added += NODE_PEAK * size_of::<((String, String, Dimension, i64), usize)>()
                    + environment.len()
                    + service.len()
                    + 2 * ALLOC_OVERHEAD;
            }
            if too_long || *seen >= cap {
                key = key.overflow();
            } else {
                *seen += 1;
            }
        }
        if !self.rows.contains_key(&key) {
            added += NODE_PEAK * size_of::<(CohortKey, MinuteCells)>()
                + [&key.environment, &key.service, &key.name, &key.value]
                    .iter()
                    .map(|s| s.len() + ALLOC_OVERHEAD)
                    .sum::<usize>();
        }
        added
            + self
                .rows
                .entry(key)
                .or_default()
                .record(second, latency_key, failed)
    }

    /// Rows held.
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn variants_beyond_the_cap_are_counted_in_the_overflow_row() {
        let mut rows = CohortRows::default();
        for i in 0..(MAX_FLAG_VARIANTS + 10) {
            for _ in 0..3 {
                rows.record(
                    "prod",
                    "svc",
                    Dimension::Flag,
                    "f",
                    &format!("v{i}"),
                    0,
                    5,
                    7,
                    i % 2 == 0,
                );
            }
        }
        // The next minute has its own budget.
        rows.record("prod", "svc", Dimension::Flag, "f", "late", 60, 0, 7, false);
        let overflow = CohortKey {
            environment: "prod".into(),
            service: "svc".into(),
            dimension: Dimension::Flag,
            name: String::new(),
            bucket_ns: 0,
            value: String::new(),
        };
        assert_eq!(rows.rows[&overflow].totals(), (30, 15));
        let kept = rows
            .rows
            .keys()
            .filter(|k| k.bucket_ns == 0 && !k.is_overflow())
            .count();
        assert_eq!(kept, MAX_FLAG_VARIANTS);
        let total: u64 = rows.rows.values().map(|c| c.totals().0).sum();
        assert_eq!(
            total,
            3 * (MAX_FLAG_VARIANTS as u64 + 10) + 1,
            "nothing lost"
        );
        // Versions are not capped; an over-long digest is overflow.
        for i in 0..100 {
            rows.record(
                "prod",
                "svc",
                Dimension::Version,
                "",
                &format!("{i}"),
                0,
                0,
                1,
                false,
            );
        }
        rows.record(
            "prod",
            "svc",
            Dimension::Config,
            "",
            &"x".repeat(300),
            0,
            0,
            1,
            false,
        );
        assert_eq!(
            rows.rows
                .keys()
                .filter(|k| k.dimension == Dimension::Version)
                .count(),
            100
        );
        assert!(
            rows.rows
                .keys()
                .any(|k| k.dimension == Dimension::Config && k.is_overflow())
        );
    }
}
