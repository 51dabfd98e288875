//! The blast-radius verdict: a pure function of cohort readings (seed 000,
//! scenarios 1-2). No database, no clock.
//!
//! Rules, in the order they are applied (thresholds are the seed's; every
//! comparison is `>=`, so a value exactly at a threshold meets it):
//! 1. The new cohort below `minSample` → `insufficient_sample` (zero traffic
//!    included: no rate is ever divided by zero).
//! 2. The previous-version cohort at or above `minSample`: compare new with
//!    previous. Regression = (absolute rate difference ≥ 5 % or p95Ratio ≥
//!    2.5) and (RelativeRisk ≥ 5.0 or p95Ratio ≥ 2.5) → `isolated_to_new_version`.
//!    p95s come from a sketch with a stated error ([`super::sketch`]), so the
//!    ratio is an interval: "p95Ratio ≥ 2.5" holds only when the whole
//!    interval is at or above 2.5. A ratio whose interval contains 2.5 is
//!    *within error of the threshold*: it does not meet it (the store never
//!    claims a latency regression its numbers cannot prove; such a verdict
//!    can authorize an autonomous rollback), and the answer says so.
//!    Otherwise, both error rates ≥ 5 % → shared degradation: a database or
//!    queue resource on which the new version shows fanoutRatio ≥ 3 or
//!    durationRatio ≥ 3 while the previous version's calls to it fail (call
//!    error rate ≥ 5 %) makes it `shared_degradation_new_version_aggressor`;
//!    none → `shared_degradation_external_cause`. Else `no_regression_detected`.
//! 3. Previous cohort below `minSample` but the pre-change baseline at or
//!    above it (an instant cutover): the same regression test against the
//!    baseline → `sequential_post_cutover_regression`, else `no_regression_detected`.
//! 4. Neither comparison cohort large enough → `insufficient_sample`.
//!
//! The Newcombe interval (hybrid Wilson score, method 10 of Newcombe 1998)
//! for the error-rate difference is reported beside the verdict and never
//! decides it.

use serde::Serialize;

use super::sketch::Quantile;

/// The seed's default minimum sample per cohort.
pub const DEFAULT_MIN_SAMPLE: u64 = 50;
/// Absolute error-rate difference threshold.
pub const ABS_DIFF_MIN: f64 = 0.05;
/// Relative risk threshold.
pub const RELATIVE_RISK_MIN: f64 = 5.0;
/// p95 latency ratio threshold.
pub const P95_RATIO_MIN: f64 = 2.5;
/// Error rate at which a cohort counts as failing (shared degradation).
pub const SHARED_ERROR_RATE_MIN: f64 = 0.05;
/// Fan-out / duration amplification threshold on a shared resource.
pub const AMPLIFICATION_MIN: f64 = 3.0;
/// Floor of the previous error rate in RelativeRisk.
pub const RATE_FLOOR: f64 = 0.001;

/// Slack for float comparisons: a ratio computed from integers that equals a
/// threshold exactly in rational arithmetic must meet it.
const EPS: f64 = 1e-9;

fn at_least(value: f64, threshold: f64) -> bool {
    value >= threshold - EPS
}

/// One of the six verdicts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// New version's rate is out of line with the previous version's.
    IsolatedToNewVersion,
    /// Instant cutover; the new version is worse than the pre-change baseline.
    SequentialPostCutoverRegression,
    /// Both fail; the new version amplifies load on a shared resource.
    SharedDegradationNewVersionAggressor,
    /// Both fail alike; the cause is outside the change.
    SharedDegradationExternalCause,
    /// Enough traffic, no regression.
    NoRegressionDetected,
    /// Not enough traffic to judge.
    InsufficientSample,
}

impl Verdict {
    /// Wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::IsolatedToNewVersion => "isolated_to_new_version",
            Verdict::SequentialPostCutoverRegression => "sequential_post_cutover_regression",
            Verdict::SharedDegradationNewVersionAggressor => {
                "shared_degradation_new_version_aggressor"
            }
            Verdict::SharedDegradationExternalCause => "shared_degradation_external_cause",
            Verdict::NoRegressionDetected => "no_regression_detected",
            Verdict::InsufficientSample => "insufficient_sample",
        }
    }

    /// Parse a wire name.
    pub fn parse(s: &str) -> Option<Verdict> {
        [
            Verdict::IsolatedToNewVersion,
            Verdict::SequentialPostCutoverRegression,
            Verdict::SharedDegradationNewVersionAggressor,
            Verdict::SharedDegradationExternalCause,
            Verdict::NoRegressionDetected,
            Verdict::InsufficientSample,
        ]
        .into_iter()
        .find(|v| v.as_str() == s)
    }
}

/// Counts of one cohort. For request cohorts `requests` are requests and
/// `errors` failed requests; for node cohorts `requests` is node-hours
/// (exposure) and `errors` events, so the "rate" is events per node-hour.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CohortCounts {
    /// Sample size (requests, or node-hours).
    pub requests: f64,
    /// Errors (or events).
    pub errors: f64,
    /// p95 latency with its error bound (requests only).
    pub p95: Option<Quantile>,
}

impl CohortCounts {
    /// errors / requests; 0 for an empty cohort (never judged: rule 1).
    pub fn rate(&self) -> f64 {
        if self.requests > 0.0 {
            self.errors / self.requests
        } else {
            0.0
        }
    }
}

/// Calls from one cohort to one downstream resource.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CallCounts {
    /// Client calls made.
    pub calls: f64,
    /// Calls that failed.
    pub errors: f64,
    /// Sum of call durations, ms.
    pub duration_ms: f64,
}

/// One shared resource both versions call.
#[derive(Debug, Clone, PartialEq)]
pub struct SharedResource {
    /// Canonical identity, e.g. `db:prod:postgresql:orders-primary:5432/orders`.
    pub resource: String,
    /// Database or queue (the only kinds the contention join judges).
    pub contended_kind: bool,
    /// New version's calls.
    pub new: CallCounts,
    /// Previous version's calls.
    pub previous: CallCounts,
}

/// Everything the verdict reads.
#[derive(Debug, Clone, PartialEq)]
pub struct BlastInput {
    /// Minimum sample per cohort.
    pub min_sample: f64,
    /// The changed cohort.
    pub new: CohortCounts,
    /// The unchanged cohort in the same window.
    pub previous: CohortCounts,
    /// Everything before the change, an equal window.
    pub pre_baseline: CohortCounts,
    /// Resources called by both versions.
    pub resources: Vec<SharedResource>,
}

/// The ratios computed for one shared resource.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ResourceRatios {
    /// Canonical identity.
    pub resource: String,
    /// (calls/request new) / (calls/request previous); None when undefined.
    pub fanout_ratio: Option<f64>,
    /// (mean call duration new) / (mean previous); None when undefined.
    pub duration_ratio: Option<f64>,
    /// Previous version's call error rate on this resource.
    pub previous_call_error_rate: Option<f64>,
    /// Whether this resource makes the new version an aggressor.
    pub aggressor: bool,
}

/// A 95 % interval.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Interval {
    /// Lower bound.
    pub lower: f64,
    /// Upper bound.
    pub upper: f64,
}

/// The verdict and every number behind it.
#[derive(Debug, Clone, PartialEq)]
pub struct Judgement {
    /// The verdict.
    pub verdict: Verdict,
    /// Which cohort the new one was compared with: `previous`, `preBaseline` or none.
    pub compared_with: Option<&'static str>,
    /// ErrorRate(new) / max(ErrorRate(comparison), 0.001).
    pub relative_risk: Option<f64>,
    /// ErrorRate(new) − ErrorRate(comparison).
    pub absolute_rate_difference: Option<f64>,
    /// p95(new) / p95(comparison), with its error bound.
    pub p95_ratio: Option<P95Ratio>,
    /// Per shared resource.
    pub resources: Vec<ResourceRatios>,
    /// Newcombe 95 % interval of the error-rate difference (proportions only).
    pub difference_interval: Option<Interval>,
}

fn ratio(a: f64, b: f64) -> Option<f64> {
    (b > 0.0 && a.is_finite() && b.is_finite()).then(|| a / b)
}

/// p95(new) / p95(comparison) and what it proves against [`P95_RATIO_MIN`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct P95Ratio {
    /// Ratio of the estimates.
    pub estimate: f64,
    /// The true ratio is at least this.
    pub lower: f64,
    /// The true ratio is below this (None: unbounded, a p95 in the top bucket
    /// or a comparison p95 in bucket 0).
    pub upper: Option<f64>,
    /// The whole interval is at or above the threshold: the criterion holds.
    pub meets_threshold: bool,
    /// The interval contains the threshold: the sketch cannot tell which
    /// side the true ratio is on, and the criterion is not met.
    pub within_error_of_threshold: bool,
}

impl P95Ratio {
    /// The ratio of two p95s with error bounds.
    pub fn of(new: &Quantile, base: &Quantile) -> Option<P95Ratio> {
        let estimate = ratio(new.estimate_ms, base.estimate_ms)?;
        let lower = match base.upper_ms {
            Some(u) => ratio(new.lower_ms, u).unwrap_or(0.0),
            None => 0.0,
        };
        let upper = new.upper_ms.and_then(|u| ratio(u, base.lower_ms));
        let meets = at_least(lower, P95_RATIO_MIN);
        let below = upper.is_some_and(|u| u <= P95_RATIO_MIN);
        Some(P95Ratio {
            estimate,
            lower,
            upper,
            meets_threshold: meets,
            within_error_of_threshold: !meets && !below,
        })
    }
}

/// The seed's regression test of `new` against `base`.
pub fn regression(new: &CohortCounts, base: &CohortCounts) -> (bool, f64, f64, Option<P95Ratio>) {
    let diff = new.rate() - base.rate();
    let rr = new.rate() / base.rate().max(RATE_FLOOR);
    let p95 = match (&new.p95, &base.p95) {
        (Some(a), Some(b)) => P95Ratio::of(a, b),
        _ => None,
    };
    let p95_hit = p95.is_some_and(|r| r.meets_threshold);
    // The seed's (diff ≥ 5 % or p95 ≥ 2.5) and (RR ≥ 5 or p95 ≥ 2.5), simplified.
    let hit = p95_hit || (at_least(diff, ABS_DIFF_MIN) && at_least(rr, RELATIVE_RISK_MIN));
    (hit, diff, rr, p95)
}

/// Ratios for one shared resource, given each cohort's request count.
pub fn resource_ratios(
    r: &SharedResource,
    new_requests: f64,
    prev_requests: f64,
) -> ResourceRatios {
    let fanout = match (
        ratio(r.new.calls, new_requests),
        ratio(r.previous.calls, prev_requests),
    ) {
        (Some(a), Some(b)) => ratio(a, b),
        _ => None,
    };
    let duration = match (
        ratio(r.new.duration_ms, r.new.calls),
        ratio(r.previous.duration_ms, r.previous.calls),
    ) {
        (Some(a), Some(b)) => ratio(a, b),
        _ => None,
    };
    let prev_err = ratio(r.previous.errors, r.previous.calls);
    let amplified = fanout.is_some_and(|f| at_least(f, AMPLIFICATION_MIN))
        || duration.is_some_and(|d| at_least(d, AMPLIFICATION_MIN));
    let previous_fails = prev_err.is_some_and(|e| at_least(e, SHARED_ERROR_RATE_MIN));
    ResourceRatios {
        resource: r.resource.clone(),
        fanout_ratio: fanout,
        duration_ratio: duration,
        previous_call_error_rate: prev_err,
        aggressor: r.contended_kind && amplified && previous_fails,
    }
}

/// Judge a change.
pub fn judge(input: &BlastInput) -> Judgement {
    let n = input.min_sample;
    let resources: Vec<ResourceRatios> = input
        .resources
        .iter()
        .map(|r| resource_ratios(r, input.new.requests, input.previous.requests))
        .collect();
    let mut j = Judgement {
        verdict: Verdict::InsufficientSample,
        compared_with: None,
        relative_risk: None,
        absolute_rate_difference: None,
        p95_ratio: None,
        resources,
        difference_interval: None,
    };
    if input.new.requests < n || input.new.requests <= 0.0 {
        return j;
    }
    let (base, which) = if input.previous.requests >= n && input.previous.requests > 0.0 {
        (&input.previous, "previous")
    } else if input.pre_baseline.requests >= n && input.pre_baseline.requests > 0.0 {
        (&input.pre_baseline, "preBaseline")
    } else {
        return j;
    };
    let (hit, diff, rr, p95) = regression(&input.new, base);
    j.compared_with = Some(which);
    j.relative_risk = Some(rr);
    j.absolute_rate_difference = Some(diff);
    j.p95_ratio = p95;
    j.difference_interval = newcombe(
        input.new.errors,
        input.new.requests,
        base.errors,
        base.requests,
    );
    j.verdict = if which == "previous" {
        if hit {
            Verdict::IsolatedToNewVersion
        } else if at_least(input.new.rate(), SHARED_ERROR_RATE_MIN)
            && at_least(input.previous.rate(), SHARED_ERROR_RATE_MIN)
        {
            if j.resources.iter().any(|r| r.aggressor) {
                Verdict::SharedDegradationNewVersionAggressor
            } else {
                Verdict::SharedDegradationExternalCause
            }
        } else {
            Verdict::NoRegressionDetected
        }
    } else if hit {
        Verdict::SequentialPostCutoverRegression
    } else {
        Verdict::NoRegressionDetected
    };
    j
}

/// z for a two-sided 95 % interval.
const Z95: f64 = 1.959_963_984_540_054;

/// Wilson score interval of x successes in n trials (None for n = 0 or
/// counts that are not proportions).
pub fn wilson(x: f64, n: f64) -> Option<Interval> {
    if n <= 0.0 || x < 0.0 || x > n {
        return None;
    }
    let p = x / n;
    let z2 = Z95 * Z95;
    let denom = 1.0 + z2 / n;
    let centre = (p + z2 / (2.0 * n)) / denom;
    let half = Z95 * (p * (1.0 - p) / n + z2 / (4.0 * n * n)).sqrt() / denom;
    Some(Interval {
        lower: (centre - half).max(0.0),
        upper: (centre + half).min(1.0),
    })
}

/// Newcombe's hybrid score interval (method 10) for p1 − p2.
pub fn newcombe(x1: f64, n1: f64, x2: f64, n2: f64) -> Option<Interval> {
    let a = wilson(x1, n1)?;
    let b = wilson(x2, n2)?;
    let (p1, p2) = (x1 / n1, x2 / n2);
    let d = p1 - p2;
    Some(Interval {
        lower: d - ((p1 - a.lower).powi(2) + (b.upper - p2).powi(2)).sqrt(),
        upper: d + ((a.upper - p1).powi(2) + (p2 - b.lower).powi(2)).sqrt(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(requests: f64, errors: f64, p95: Option<f64>) -> CohortCounts {
        CohortCounts {
            requests,
            errors,
            p95: p95.map(Quantile::exact),
        }
    }

    fn input(new: CohortCounts, prev: CohortCounts, pre: CohortCounts) -> BlastInput {
        BlastInput {
            min_sample: 50.0,
            new,
            previous: prev,
            pre_baseline: pre,
            resources: Vec::new(),
        }
    }

    const NONE: CohortCounts = CohortCounts {
        requests: 0.0,
        errors: 0.0,
        p95: None,
    };

    /// (name, new, previous, preBaseline, expected verdict).
    #[test]
    fn verdict_table() {
        let p = Some(100.0);
        let rows: Vec<(&str, CohortCounts, CohortCounts, CohortCounts, Verdict)> = vec![
            // The seed's example: 12 % vs 0.08 %.
            (
                "seed example",
                c(10_000.0, 1200.0, p),
                c(10_000.0, 8.0, p),
                NONE,
                Verdict::IsolatedToNewVersion,
            ),
            // Absolute difference: just below / at / above 5 % (RR well above 5).
            (
                "diff 4.9%",
                c(1000.0, 49.0, p),
                c(1000.0, 0.0, p),
                NONE,
                Verdict::NoRegressionDetected,
            ),
            (
                "diff 5.0%",
                c(1000.0, 50.0, p),
                c(1000.0, 0.0, p),
                NONE,
                Verdict::IsolatedToNewVersion,
            ),
            (
                "diff 5.1%",
                c(1000.0, 51.0, p),
                c(1000.0, 0.0, p),
                NONE,
                Verdict::IsolatedToNewVersion,
            ),
            // RelativeRisk: just below / at / above 5.0 (difference above 5 %).
            (
                "rr 4.9",
                c(1000.0, 98.0, p),
                c(1000.0, 20.0, p),
                NONE,
                Verdict::NoRegressionDetected,
            ),
            (
                "rr 5.0",
                c(1000.0, 100.0, p),
                c(1000.0, 20.0, p),
                NONE,
                Verdict::IsolatedToNewVersion,
            ),
            (
                "rr 5.1",
                c(1000.0, 102.0, p),
                c(1000.0, 20.0, p),
                NONE,
                Verdict::IsolatedToNewVersion,
            ),
            // p95Ratio alone satisfies both clauses: below / at / above 2.5.
            (
                "p95 2.49",
                c(1000.0, 0.0, Some(249.0)),
                c(1000.0, 0.0, p),
                NONE,
                Verdict::NoRegressionDetected,
            ),
            (
                "p95 2.5",
                c(1000.0, 0.0, Some(250.0)),
                c(1000.0, 0.0, p),
                NONE,
                Verdict::IsolatedToNewVersion,
            ),
            (
                "p95 2.51",
                c(1000.0, 0.0, Some(251.0)),
                c(1000.0, 0.0, p),
                NONE,
                Verdict::IsolatedToNewVersion,
            ),
            // Traffic-share fallacy: 95 %/5 % split, equal per-request rates.
            (
                "fallacy",
                c(9500.0, 950.0, p),
                c(500.0, 50.0, p),
                NONE,
                Verdict::SharedDegradationExternalCause,
            ),
            // Shared-degradation edge: both at exactly 5 % / one just below.
            (
                "shared at 5%",
                c(1000.0, 50.0, p),
                c(1000.0, 50.0, p),
                NONE,
                Verdict::SharedDegradationExternalCause,
            ),
            (
                "prev 4.9%",
                c(1000.0, 50.0, p),
                c(1000.0, 49.0, p),
                NONE,
                Verdict::NoRegressionDetected,
            ),
            // minSample edges on the new cohort: 49 / 50 / 51.
            (
                "new 49",
                c(49.0, 49.0, p),
                c(1000.0, 0.0, p),
                NONE,
                Verdict::InsufficientSample,
            ),
            (
                "new 50",
                c(50.0, 50.0, p),
                c(1000.0, 0.0, p),
                NONE,
                Verdict::IsolatedToNewVersion,
            ),
            (
                "new 51",
                c(51.0, 51.0, p),
                c(1000.0, 0.0, p),
                NONE,
                Verdict::IsolatedToNewVersion,
            ),
            // Instant cutover: previous 49 / 50 with a baseline.
            (
                "cutover prev 49",
                c(1000.0, 200.0, p),
                c(49.0, 0.0, p),
                c(1000.0, 1.0, p),
                Verdict::SequentialPostCutoverRegression,
            ),
            (
                "cutover prev 50",
                c(1000.0, 200.0, p),
                c(50.0, 0.0, p),
                c(1000.0, 1.0, p),
                Verdict::IsolatedToNewVersion,
            ),
            (
                "cutover no regression",
                c(1000.0, 2.0, p),
                NONE,
                c(1000.0, 1.0, p),
                Verdict::NoRegressionDetected,
            ),
            // Baseline minSample edges: 49 / 50.
            (
                "baseline 49",
                c(1000.0, 200.0, p),
                NONE,
                c(49.0, 0.0, p),
                Verdict::InsufficientSample,
            ),
            (
                "baseline 50",
                c(1000.0, 200.0, p),
                NONE,
                c(50.0, 0.0, p),
                Verdict::SequentialPostCutoverRegression,
            ),
            // Zero traffic everywhere, or on the new cohort only.
            ("all zero", NONE, NONE, NONE, Verdict::InsufficientSample),
            (
                "new zero",
                NONE,
                c(1000.0, 10.0, p),
                c(1000.0, 10.0, p),
                Verdict::InsufficientSample,
            ),
            // Previous has zero errors: the 0.001 floor keeps RR finite.
            (
                "prev zero errors",
                c(1000.0, 60.0, p),
                c(1000.0, 0.0, p),
                NONE,
                Verdict::IsolatedToNewVersion,
            ),
        ];
        for (name, new, prev, pre, want) in rows {
            let j = judge(&input(new, prev, pre));
            assert_eq!(j.verdict, want, "{name}: {j:?}");
            if let Some(rr) = j.relative_risk {
                assert!(rr.is_finite(), "{name}: rr {rr}");
            }
        }
    }

    fn q(estimate_ms: f64, lower_ms: f64, upper_ms: f64) -> Quantile {
        Quantile {
            estimate_ms,
            lower_ms,
            upper_ms: Some(upper_ms),
        }
    }

    /// The sketch rule at, just below and just above 2.5 within the error
    /// bound, and just outside it: (name, new p95, expected verdict, within).
    #[test]
    fn p95_ratio_within_error_of_the_threshold_is_flagged_and_not_met() {
        let base = Quantile::exact(100.0);
        let rows = [
            (
                "at 2.5, within",
                q(250.0, 248.0, 252.0),
                Verdict::NoRegressionDetected,
                true,
            ),
            (
                "just below, within",
                q(249.0, 247.0, 251.0),
                Verdict::NoRegressionDetected,
                true,
            ),
            (
                "just above, within",
                q(251.0, 249.0, 253.0),
                Verdict::NoRegressionDetected,
                true,
            ),
            (
                "above, interval clear",
                q(256.0, 254.0, 258.0),
                Verdict::IsolatedToNewVersion,
                false,
            ),
            (
                "lower bound exactly 2.5",
                q(252.0, 250.0, 254.0),
                Verdict::IsolatedToNewVersion,
                false,
            ),
            (
                "below, interval clear",
                q(244.0, 242.0, 246.0),
                Verdict::NoRegressionDetected,
                false,
            ),
            (
                "upper bound exactly 2.5",
                q(248.0, 246.0, 250.0),
                Verdict::NoRegressionDetected,
                false,
            ),
        ];
        for (name, new_p95, want, within) in rows {
            let mut new = c(1000.0, 0.0, None);
            new.p95 = Some(new_p95);
            let mut prev = c(1000.0, 0.0, None);
            prev.p95 = Some(base);
            let j = judge(&input(new, prev, NONE));
            assert_eq!(j.verdict, want, "{name}: {j:?}");
            let r = j.p95_ratio.unwrap();
            assert_eq!(r.within_error_of_threshold, within, "{name}: {r:?}");
            assert!(
                r.lower <= r.estimate && r.estimate <= r.upper.unwrap(),
                "{name}"
            );
        }
    }

    /// The same rule on real sketches over 2,000 absolute scales (50 µs to
    /// 50 s): the true ratio is always inside the reported interval; a
    /// ratio of 2.45 is never a regression nor within error, 2.55 always
    /// a regression; at 2.49 / 2.5 / 2.51 the verdict is either proven and
    /// right, or flagged within error and not a regression.
    #[test]
    fn p95_ratio_from_sketches_lands_on_the_right_side_at_every_scale() {
        use super::super::sketch::{MinuteCells, key_of_ns};
        let p95_of = |p95_ns: f64| {
            // 200 requests; 0-based ranks 180..199 all at the p95 value.
            let mut m = MinuteCells::default();
            for i in 0..200u32 {
                let ns = if i >= 180 {
                    p95_ns
                } else {
                    p95_ns * f64::from(i + 1) / 400.0
                };
                m.record(0, key_of_ns(ns.round() as i64), false);
            }
            m.sketch().quantile(0.95).unwrap()
        };
        let gamma = super::super::sketch::gamma();
        let mut within_seen = 0;
        for step in 0..2000 {
            let base_ns = 50_000.0 * (1e6f64).powf(f64::from(step) / 2000.0);
            let base = p95_of(base_ns);
            for ratio in [2.45, 2.49, 2.5, 2.51, 2.55] {
                let new = p95_of(base_ns * ratio);
                let r = P95Ratio::of(&new, &base).unwrap();
                let truth = (base_ns * ratio).round() / base_ns.round();
                assert!(
                    r.lower <= truth + 1e-9 && r.upper.is_none_or(|u| truth < u + 1e-9),
                    "{base_ns} x{ratio}: {r:?}"
                );
                assert!((r.estimate / truth).max(truth / r.estimate) <= gamma + 1e-9);
                if r.meets_threshold {
                    assert!(
                        truth >= 2.5 - 1e-9,
                        "false regression at {base_ns} x{ratio}: {r:?}"
                    );
                }
                if ratio == 2.45 {
                    assert!(!r.meets_threshold && !r.within_error_of_threshold, "{r:?}");
                } else if ratio == 2.55 {
                    assert!(r.meets_threshold, "{base_ns} x2.55: {r:?}");
                } else if ratio < 2.5 {
                    // Proven below, or flagged: never a regression.
                    assert!(!r.meets_threshold, "{r:?}");
                    within_seen += usize::from(r.within_error_of_threshold);
                } else {
                    // At or above: proven (and true), or flagged.
                    assert!(r.meets_threshold || r.within_error_of_threshold, "{r:?}");
                    within_seen += usize::from(r.within_error_of_threshold);
                }
            }
        }
        assert!(within_seen > 1000, "{within_seen}");
    }

    fn db(new: CallCounts, previous: CallCounts) -> SharedResource {
        SharedResource {
            resource: "db:prod:postgresql:orders-primary:5432/orders".into(),
            contended_kind: true,
            new,
            previous,
        }
    }

    fn calls(calls: f64, errors: f64, duration_ms: f64) -> CallCounts {
        CallCounts {
            calls,
            errors,
            duration_ms,
        }
    }

    /// Fan-out and duration at 2.9 / 3.0 / 3.1, with the previous version
    /// failing on the resource (or not).
    #[test]
    fn aggressor_table() {
        let p = Some(100.0);
        let base = |resources| BlastInput {
            min_sample: 50.0,
            new: c(1000.0, 300.0, p),
            previous: c(1000.0, 200.0, p),
            pre_baseline: NONE,
            resources,
        };
        let rows = vec![
            (
                "fanout 2.9",
                db(calls(2900.0, 0.0, 2900.0), calls(1000.0, 100.0, 1000.0)),
                Verdict::SharedDegradationExternalCause,
            ),
            (
                "fanout 3.0",
                db(calls(3000.0, 0.0, 3000.0), calls(1000.0, 100.0, 1000.0)),
                Verdict::SharedDegradationNewVersionAggressor,
            ),
            (
                "fanout 3.1",
                db(calls(3100.0, 0.0, 3100.0), calls(1000.0, 100.0, 1000.0)),
                Verdict::SharedDegradationNewVersionAggressor,
            ),
            (
                "duration 2.9",
                db(calls(1000.0, 0.0, 2900.0), calls(1000.0, 100.0, 1000.0)),
                Verdict::SharedDegradationExternalCause,
            ),
            (
                "duration 3.0",
                db(calls(1000.0, 0.0, 3000.0), calls(1000.0, 100.0, 1000.0)),
                Verdict::SharedDegradationNewVersionAggressor,
            ),
            (
                "prev not failing there",
                db(calls(5000.0, 0.0, 5000.0), calls(1000.0, 0.0, 1000.0)),
                Verdict::SharedDegradationExternalCause,
            ),
            (
                "prev never called it",
                db(calls(5000.0, 0.0, 5000.0), calls(0.0, 0.0, 0.0)),
                Verdict::SharedDegradationExternalCause,
            ),
        ];
        for (name, r, want) in rows {
            let j = judge(&base(vec![r]));
            assert_eq!(j.verdict, want, "{name}: {j:?}");
        }
        // An HTTP dependency is not a contended database or queue.
        let mut http = db(calls(5000.0, 0.0, 5000.0), calls(1000.0, 100.0, 1000.0));
        http.contended_kind = false;
        assert_eq!(
            judge(&base(vec![http])).verdict,
            Verdict::SharedDegradationExternalCause
        );
    }

    /// Oracle: Newcombe (1998), Statistics in Medicine 17:873-890, Table II,
    /// method 10: 56/70 − 48/80 → (0.0524, 0.3339); 9/10 − 3/10 → (0.1705, 0.8090).
    #[test]
    fn newcombe_matches_the_published_examples() {
        let i = newcombe(56.0, 70.0, 48.0, 80.0).unwrap();
        assert!(
            (i.lower - 0.0524).abs() < 5e-4 && (i.upper - 0.3339).abs() < 5e-4,
            "{i:?}"
        );
        let i = newcombe(9.0, 10.0, 3.0, 10.0).unwrap();
        assert!(
            (i.lower - 0.1705).abs() < 5e-4 && (i.upper - 0.8090).abs() < 5e-4,
            "{i:?}"
        );
        assert!(newcombe(0.0, 0.0, 1.0, 10.0).is_none());
    }

    #[test]
    fn verdict_names_round_trip() {
        for v in [
            Verdict::IsolatedToNewVersion,
            Verdict::SequentialPostCutoverRegression,
            Verdict::SharedDegradationNewVersionAggressor,
            Verdict::SharedDegradationExternalCause,
            Verdict::NoRegressionDetected,
            Verdict::InsufficientSample,
        ] {
            assert_eq!(Verdict::parse(v.as_str()), Some(v));
            assert_eq!(serde_json::to_value(v).unwrap(), v.as_str());
        }
    }
}
