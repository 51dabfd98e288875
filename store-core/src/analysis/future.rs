//! The future bound on caller-supplied times (pure).
//!
//! A change's `at` (and each host node's `at`) and every span's start and
//! end time may lie at most `skew` past the store's clock. Later ones are
//! refused whole, naming the first offending field: a deploy dated 2099
//! would otherwise stay the target's "current state" for ever (every later
//! real deploy is older), and spans dated ahead would answer the watchdog's
//! future checkpoints ("recovered") before they come. At the bound is
//! accepted; one nanosecond past it is not.

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;

use super::ledger::{NewChange, rfc3339};

/// The latest time a request may carry: the store's clock plus the skew.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FutureBound {
    /// The store's clock when the request was read, ns.
    pub now_ns: i64,
    /// Tolerated skew, ns (`serve --max-future-skew`).
    pub skew_ns: i64,
}

/// A time past the bound, naming its field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{field}: {} is {} s past the store's clock ({}); at most {} s ahead is accepted (serve --max-future-skew)",
    rfc3339(*at_ns),
    (at_ns - now_ns) / 1_000_000_000,
    rfc3339(*now_ns),
    skew_ns / 1_000_000_000
)]
pub struct FutureTime {
    /// camelCase field path.
    pub field: String,
    /// The refused time, ns.
    pub at_ns: i64,
    /// The store's clock, ns.
    pub now_ns: i64,
    /// The tolerated skew, ns.
    pub skew_ns: i64,
}

impl FutureBound {
    /// The bound at `now_ns` with `skew_ns` of tolerance.
    pub fn new(now_ns: i64, skew_ns: i64) -> FutureBound {
        FutureBound {
            now_ns,
            skew_ns: skew_ns.max(0),
        }
    }

    /// Refuse `at_ns` when it lies past `now + skew`.
    pub fn check(&self, field: impl FnOnce() -> String, at_ns: i64) -> Result<(), FutureTime> {
        if at_ns > self.now_ns.saturating_add(self.skew_ns) {
            return Err(FutureTime {
                field: field(),
                at_ns,
                now_ns: self.now_ns,
                skew_ns: self.skew_ns,
            });
        }
        Ok(())
    }

    /// A validated change: `at`, then each `nodes[i].at`.
    pub fn check_change(&self, c: &NewChange) -> Result<(), FutureTime> {
        self.check(|| "at".into(), c.at_ns)?;
        for (i, (_, at)) in c.nodes.iter().enumerate() {
            self.check(|| format!("nodes[{i}].at"), *at)?;
        }
        Ok(())
    }

    /// Every span's start and end time (OTLP/JSON field names).
    pub fn check_spans(&self, req: &ExportTraceServiceRequest) -> Result<(), FutureTime> {
        for (r, rs) in req.resource_spans.iter().enumerate() {
            for (s, ss) in rs.scope_spans.iter().enumerate() {
                for (k, span) in ss.spans.iter().enumerate() {
                    for (name, t) in [
                        ("startTimeUnixNano", span.start_time_unix_nano),
                        ("endTimeUnixNano", span.end_time_unix_nano),
                    ] {
                        let t = i64::try_from(t).unwrap_or(i64::MAX);
                        self.check(
                            || format!("resourceSpans[{r}].scopeSpans[{s}].spans[{k}].{name}"),
                            t,
                        )?;
                    }
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};

    const NOW: i64 = 1_800_000_000_000_000_000;
    const SKEW: i64 = 300_000_000_000;

    #[test]
    fn at_the_bound_passes_one_past_it_is_refused() {
        let b = FutureBound::new(NOW, SKEW);
        for (at, ok) in [
            (NOW - 86_400_000_000_000, true),
            (NOW, true),
            (NOW + SKEW - 1, true),
            (NOW + SKEW, true),
            (NOW + SKEW + 1, false),
            (NOW + SKEW + 1_000_000_000, false),
            (i64::MAX, false),
        ] {
            assert_eq!(
                b.check(|| "at".into(), at).is_ok(),
                ok,
                "at = now + {}",
                at - NOW
            );
        }
        // A negative skew is no skew, never a bound in the past.
        assert!(FutureBound::new(NOW, -5).check(|| "at".into(), NOW).is_ok());
        let e = b
            .check(|| "at".into(), NOW + SKEW + 1_000_000_000)
            .unwrap_err();
        assert_eq!(e.field, "at");
        assert!(e.to_string().contains("301 s past"), "{e}");
    }

    #[test]
    fn a_host_change_names_the_node() {
        let b = FutureBound::new(NOW, SKEW);
        let mut c = NewChange {
            environment: "prod".into(),
            kind: "kernel".into(),
            service: None,
            version: None,
            previous_version: None,
            commit_sha: None,
            previous_commit_sha: None,
            candidate_agent_version: None,
            config_digest: None,
            summary: None,
            touched_paths: Vec::new(),
            at_ns: NOW,
            nodes: vec![("a".into(), NOW), ("b".into(), NOW + SKEW + 1)],
            flags: Default::default(),
        };
        assert_eq!(b.check_change(&c).unwrap_err().field, "nodes[1].at");
        c.nodes[1].1 = NOW;
        c.at_ns = NOW + 2 * SKEW;
        assert_eq!(b.check_change(&c).unwrap_err().field, "at");
    }

    #[test]
    fn a_span_ending_in_the_future_is_named() {
        let span = |start: i64, end: i64| Span {
            start_time_unix_nano: start as u64,
            end_time_unix_nano: end as u64,
            ..Default::default()
        };
        let req = ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                scope_spans: vec![ScopeSpans {
                    spans: vec![span(NOW, NOW + 1), span(NOW + SKEW, NOW + SKEW + 1)],
                    ..Default::default()
                }],
                ..Default::default()
            }],
        };
        let b = FutureBound::new(NOW, SKEW);
        assert_eq!(
            b.check_spans(&req).unwrap_err().field,
            "resourceSpans[0].scopeSpans[0].spans[1].endTimeUnixNano"
        );
        // A start past u64 → i64 is refused, not wrapped into the past.
        let far = ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                scope_spans: vec![ScopeSpans {
                    spans: vec![Span {
                        start_time_unix_nano: u64::MAX,
                        end_time_unix_nano: u64::MAX,
                        ..Default::default()
                    }],
                    ..Default::default()
                }],
                ..Default::default()
            }],
        };
        assert!(b.check_spans(&far).is_err());
        assert!(FutureBound::new(NOW + SKEW, SKEW).check_spans(&req).is_ok());
    }
}
