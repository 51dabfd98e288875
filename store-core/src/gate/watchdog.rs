//! The post-remediation watchdog's rules (seed 000): checkpoints at +2 m,
//! +5 m and +15 m after completion; a checkpoint is healthy with an error
//! rate under 5 % over at least 50 comparable requests; two consecutive
//! healthy checkpoints mean operational recovery — which corroborates the
//! causal story operationally and never counts as counterfactual proof.
//!
//! Pure: the database layer supplies counts, this module decides.

/// Checkpoint offsets after completion, ns.
pub const CHECKPOINTS_NS: [i64; 3] = [120_000_000_000, 300_000_000_000, 900_000_000_000];
/// Fewest comparable requests for a verdict.
pub const MIN_REQUESTS: i64 = 50;
/// Healthy: errors / requests strictly below this many percent.
pub const MAX_ERROR_PERCENT: i64 = 5;

/// One checkpoint's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Enough traffic, error rate under 5 %.
    Healthy,
    /// Enough traffic, error rate at or over 5 %.
    Degraded,
    /// Fewer than 50 comparable requests.
    LowTraffic,
}

impl Verdict {
    /// Wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Healthy => "healthy",
            Verdict::Degraded => "degraded",
            Verdict::LowTraffic => "low_traffic",
        }
    }

    /// Parse a wire name.
    pub fn parse(s: &str) -> Option<Verdict> {
        [Verdict::Healthy, Verdict::Degraded, Verdict::LowTraffic]
            .into_iter()
            .find(|v| v.as_str() == s)
    }
}

/// The verdict on `requests` with `errors` among them (integer arithmetic:
/// `errors / requests < 5 %` ⇔ `100 · errors < 5 · requests`).
pub fn verdict(requests: i64, errors: i64) -> Verdict {
    if requests < MIN_REQUESTS {
        Verdict::LowTraffic
    } else if errors.saturating_mul(100) < requests.saturating_mul(MAX_ERROR_PERCENT) {
        Verdict::Healthy
    } else {
        Verdict::Degraded
    }
}

/// (`recoveryStatus`, `causalVerificationStatus`) after the checkpoints
/// evaluated so far (in order), of `total`.
///
/// - Two consecutive healthy → `recovered` / `operationally_corroborated`.
/// - Checkpoints still to come → `monitoring` / `pending`.
/// - All evaluated, fewer than two with enough traffic →
///   `inconclusive_low_traffic` / `inconclusive_low_traffic`.
/// - All evaluated, every one with enough traffic degraded →
///   `still_degraded` / `refuted`.
/// - Otherwise (mixed, never two healthy in a row) → `still_degraded` /
///   `unverified`.
pub fn recovery(evaluated: &[Verdict], total: usize) -> (&'static str, &'static str) {
    if evaluated
        .windows(2)
        .any(|w| w[0] == Verdict::Healthy && w[1] == Verdict::Healthy)
    {
        return ("recovered", "operationally_corroborated");
    }
    if evaluated.len() < total {
        return ("monitoring", "pending");
    }
    let sufficient: Vec<Verdict> = evaluated
        .iter()
        .copied()
        .filter(|v| *v != Verdict::LowTraffic)
        .collect();
    if sufficient.len() < 2 {
        ("inconclusive_low_traffic", "inconclusive_low_traffic")
    } else if sufficient.iter().all(|v| *v == Verdict::Degraded) {
        ("still_degraded", "refuted")
    } else {
        ("still_degraded", "unverified")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Verdict::*;

    #[test]
    fn thresholds_and_sequences() {
        assert_eq!(verdict(49, 0), LowTraffic);
        assert_eq!(verdict(50, 2), Healthy);
        assert_eq!(verdict(100, 4), Healthy);
        assert_eq!(verdict(100, 5), Degraded);
        assert_eq!(recovery(&[Healthy, Healthy], 3).0, "recovered");
        assert_eq!(recovery(&[Healthy, Degraded], 3).0, "monitoring");
        assert_eq!(
            recovery(&[Healthy, Degraded, Healthy], 3),
            ("still_degraded", "unverified")
        );
        assert_eq!(
            recovery(&[Degraded, Degraded, LowTraffic], 3),
            ("still_degraded", "refuted")
        );
        assert_eq!(
            recovery(&[LowTraffic, Healthy, LowTraffic], 3).0,
            "inconclusive_low_traffic"
        );
        for seq in [[Healthy; 3], [Degraded; 3], [LowTraffic; 3]] {
            assert_ne!(recovery(&seq, 3).1, "counterfactual_verified");
        }
    }
}
