//! Assemble a change's blast radius: read the cohorts from the store, hand
//! them to the pure [`verdict`](super::verdict) rules, and shape the answer.
//!
//! Windows, exact to the second: the window starts at the change's `at`
//! truncated to its second, `S`, and lasts `window` (default now − at)
//! rounded up to whole seconds, `W`: `[S, S + W)`. The pre-change baseline
//! is the equally long `[S − W, S)`. Requests count per second
//! ([`super::sketch`]): a second belongs to a cohort when it starts inside
//! its window. The answer states the window it used.
//!
//! Service changes are judged over cohorts of one dimension
//! ([`super::cohort`]), chosen by the change:
//! - `feature_flag` with `flags`: the first flag by name; `new` = requests
//!   that evaluated it to the change's value, `previous` = its other
//!   variants, `preBaseline` = its other variants before the change;
//! - `config` with `configDigest`: `new` = that digest, `previous` = other
//!   digests, `preBaseline` = other digests before;
//! - otherwise a `version` (else `commitSha`): `new` = that version,
//!   `previous` = `previousVersion` (else every other version),
//!   `preBaseline` = every other version before the change;
//! - a change with none of these has no cohorts: `new` is all of the
//!   service's traffic after it, judged against all of it before.
//!
//! The new cohort's own value is never in `preBaseline` (a canary started
//! before its change was recorded is not the baseline).
//! Host changes are judged over node cohorts ([`fleet`](super::fleet)).

use serde_json::{Value, json};

use super::cohort::Dimension;
use super::fleet::{self, FleetMetric, NodeCohort};
use super::ledger::{ChangeRecord, rfc3339};
use super::otlp::is_contended_kind;
use super::sketch::{self, Quantile, SECOND_NS};
use super::verdict::{self, BlastInput, CallCounts, CohortCounts, Judgement, SharedResource};
use crate::db::analysis::{CohortFilter, RequestTotals, VersionFilter};
use crate::db::{Store, StoreError};

/// Most envelopes a fleet blast radius reads.
pub const FLEET_ENVELOPE_CAP: i64 = 200_000;

/// Query parameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BlastParams {
    /// Minimum sample per cohort (requests, or node-hours).
    pub min_sample: u64,
    /// Window length, ns; None = from the change to now.
    pub window_ns: Option<i64>,
    /// Event family for host changes.
    pub metric: FleetMetric,
}

impl Default for BlastParams {
    fn default() -> Self {
        BlastParams {
            min_sample: verdict::DEFAULT_MIN_SAMPLE,
            window_ns: None,
            metric: FleetMetric::Resets,
        }
    }
}

/// Rows converted from minute-resolution aggregates recorded a latency at
/// its 2^(1/4)-wide bin's geometric middle: the true value is within this
/// factor of it, so their cohort's p95 bounds widen by it.
pub const LEGACY_BIN_HALF_WIDTH: f64 = 1.090_507_732_665_257_7;

/// p95 of a cohort's requests with its error bound.
pub fn p95_of(t: &RequestTotals) -> Option<Quantile> {
    let mut q = t.latency.quantile(0.95)?;
    if t.legacy_rows > 0 {
        q.lower_ms /= LEGACY_BIN_HALF_WIDTH;
        q.upper_ms = q.upper_ms.map(|u| u * LEGACY_BIN_HALF_WIDTH);
    }
    Some(q)
}

fn counts(t: &RequestTotals) -> CohortCounts {
    CohortCounts {
        requests: t.requests as f64,
        errors: t.errors as f64,
        p95: p95_of(t),
    }
}

/// One request cohort as the API shows it.
fn cohort_view(label: &CohortLabel<'_>, t: &RequestTotals) -> Value {
    let c = counts(t);
    let mut v = json!({
        "version": label.version,
        "requestCount": t.requests,
        "errorCount": t.errors,
        "errorRate": c.rate(),
        "p95Ms": c.p95.map(|q| q.estimate_ms),
        "p95MsBounds": c.p95.map(|q| json!({"lower": q.lower_ms, "upper": q.upper_ms})),
        "p95RelativeError": c.p95.and_then(|q| q.relative_error()),
    });
    if let Some(flag) = label.flag {
        v["flag"] = json!(flag);
        v["variant"] = json!(label.value);
    }
    if label.config {
        v["configDigest"] = json!(label.value);
    }
    if t.legacy_rows > 0 {
        v["legacyMinuteRows"] = json!(t.legacy_rows);
    }
    v
}

/// What a cohort is labelled with in the answer.
struct CohortLabel<'a> {
    version: Option<&'a str>,
    flag: Option<&'a str>,
    config: bool,
    value: Option<&'a str>,
}

/// The cohorts a service change is judged over (see the module doc).
#[derive(Debug, Clone, PartialEq)]
struct CohortPlan {
    /// `version`, `feature_flag`, `config` or `all`.
    kind: &'static str,
    dimension: Dimension,
    /// Flag key.
    name: String,
    /// The new cohort's value (None: all traffic).
    new: Option<String>,
    /// The previous cohort's value (None: every other value).
    previous: Option<String>,
}

impl CohortPlan {
    fn of(change: &ChangeRecord) -> CohortPlan {
        let flag = change.flags.iter().next().map(|(k, v)| {
            let variant = match v {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            (k.clone(), variant)
        });
        let version = change.version.as_deref().or(change.commit_sha.as_deref());
        let by_flag = |(name, variant): (String, String)| CohortPlan {
            kind: "feature_flag",
            dimension: Dimension::Flag,
            name,
            new: Some(variant),
            previous: None,
        };
        let by_config = |digest: &str| CohortPlan {
            kind: "config",
            dimension: Dimension::Config,
            name: String::new(),
            new: Some(digest.to_string()),
            previous: None,
        };
        match (change.kind.as_str(), flag, change.config_digest.as_deref()) {
            ("feature_flag", Some(f), _) => by_flag(f),
            ("config", _, Some(d)) => by_config(d),
            (_, flag, digest) => match (version, flag, digest) {
                (Some(v), _, _) => CohortPlan {
                    kind: "version",
                    dimension: Dimension::Version,
                    name: String::new(),
                    new: Some(v.to_string()),
                    previous: change.previous_version.clone(),
                },
                (None, Some(f), _) => by_flag(f),
                (None, None, Some(d)) => by_config(d),
                (None, None, None) => CohortPlan {
                    kind: "all",
                    dimension: Dimension::Version,
                    name: String::new(),
                    new: None,
                    previous: None,
                },
            },
        }
    }

    fn filter<'a>(&'a self, values: VersionFilter<'a>) -> CohortFilter<'a> {
        CohortFilter {
            dimension: self.dimension,
            name: &self.name,
            values,
        }
    }

    fn label<'a>(&'a self, value: Option<&'a str>) -> CohortLabel<'a> {
        CohortLabel {
            version: (self.dimension == Dimension::Version)
                .then_some(value)
                .flatten(),
            flag: (self.dimension == Dimension::Flag).then_some(self.name.as_str()),
            config: self.dimension == Dimension::Config,
            value,
        }
    }
}

/// The answer: the verdict and its evidence, as JSON.
#[derive(Debug, Clone, PartialEq)]
pub struct BlastRadius {
    /// The verdict.
    pub verdict: verdict::Verdict,
    /// Code paths both touched by the change and on failing stacks.
    pub touched_paths_overlap: Vec<String>,
    /// The whole answer.
    pub body: Value,
}

fn judgement_json(j: &Judgement) -> Value {
    json!({
        "verdict": j.verdict.as_str(),
        "cohortVerdict": j.verdict.as_str(),
        "comparedWith": j.compared_with,
        "relativeRisk": j.relative_risk,
        "absoluteRateDifference": j.absolute_rate_difference,
        "p95Ratio": j.p95_ratio.map(|r| r.estimate),
        "p95RatioBounds": j.p95_ratio.map(|r| json!({"lower": r.lower, "upper": r.upper})),
        "p95RatioWithinErrorOfThreshold": j.p95_ratio.is_some_and(|r| r.within_error_of_threshold),
        "errorRateDifferenceCi95": j.difference_interval.map(|i| json!({
            "method": "newcombe_hybrid_score",
            "lower": i.lower,
            "upper": i.upper,
        })),
    })
}

fn merge(into: &mut Value, from: Value) {
    if let (Some(a), Value::Object(b)) = (into.as_object_mut(), from) {
        a.extend(b);
    }
}

/// Judge `change`.
pub async fn blast_radius(
    store: &Store,
    change: &ChangeRecord,
    p: &BlastParams,
    now_ns: i64,
) -> Result<BlastRadius, StoreError> {
    let at = change.at_ns;
    let window = p
        .window_ns
        .unwrap_or_else(|| now_ns.saturating_sub(at))
        .max(0);
    let end = at.saturating_add(window);
    let base_start = at.saturating_sub(window);
    let mut body = json!({
        "changeId": change.id,
        "kind": change.kind,
        "environment": change.environment,
        "service": change.service,
        "minSample": p.min_sample,
        "window": {"start": rfc3339(at), "end": rfc3339(end), "preBaselineStart": rfc3339(base_start)},
        "thresholds": {
            "absoluteRateDifference": verdict::ABS_DIFF_MIN,
            "relativeRisk": verdict::RELATIVE_RISK_MIN,
            "p95Ratio": verdict::P95_RATIO_MIN,
            "sharedErrorRate": verdict::SHARED_ERROR_RATE_MIN,
            "fanoutRatio": verdict::AMPLIFICATION_MIN,
            "durationRatio": verdict::AMPLIFICATION_MIN,
            "relativeRiskFloor": verdict::RATE_FLOOR,
        },
    });
    if change.is_host_change() {
        // Each changed node's own baseline may start before `base_start`.
        let earliest = change
            .node_times()
            .values()
            .map(|t| t - (end - t).max(0))
            .min()
            .unwrap_or(base_start)
            .min(base_start);
        let (envs, cut) = store
            .node_envelopes(earliest, end, FLEET_ENVELOPE_CAP)
            .await?;
        let c = fleet::cohorts(&envs, &change.node_times(), at, end, p.metric);
        let j = verdict::judge(&BlastInput {
            min_sample: p.min_sample as f64,
            new: c.new.counts(),
            previous: c.previous.counts(),
            pre_baseline: c.pre_baseline.counts(),
            resources: Vec::new(),
        });
        let view = |k: &NodeCohort| {
            json!({
                "nodes": k.nodes,
                "nodeHours": k.node_hours,
                "eventCount": k.events,
                "eventsPerNodeHour": k.counts().rate(),
                "envelopes": k.envelopes,
                "evidenceDigests": k.evidence_digests,
            })
        };
        let mut j_json = judgement_json(&j);
        // Rates per node-hour are not proportions: no Newcombe interval.
        j_json["errorRateDifferenceCi95"] = Value::Null;
        merge(&mut body, j_json);
        merge(
            &mut body,
            json!({
                "unit": "node_hours",
                "metric": p.metric,
                "claimCodes": p.metric.codes(),
                "envelopeCapReached": cut,
                "cohorts": {"new": view(&c.new), "previous": view(&c.previous), "preBaseline": view(&c.pre_baseline)},
                "sharedResourceAggressors": [],
                "touchedPathsOverlap": [],
            }),
        );
        return Ok(BlastRadius {
            verdict: j.verdict,
            touched_paths_overlap: Vec::new(),
            body,
        });
    }
    let env = change.environment.as_str();
    let service = change.service.as_deref().unwrap_or_default();
    // The window to the second (module doc).
    let start = at - at.rem_euclid(SECOND_NS);
    let window = window.saturating_add(SECOND_NS - 1) / SECOND_NS * SECOND_NS;
    let end = start.saturating_add(window);
    let base_start = start.saturating_sub(window);
    body["window"] = json!({
        "start": rfc3339(start),
        "end": rfc3339(end),
        "preBaselineStart": rfc3339(base_start),
        "preBaselineEnd": rfc3339(start),
        "startNs": start,
        "endNs": end,
        "preBaselineStartNs": base_start,
        "resolution": "1s",
        "changeAt": change.at,
    });
    body["thresholds"]["p95RatioRule"] = json!(
        "met only when the whole error interval of the ratio is at or above p95Ratio; a ratio within error of it is not met and is flagged (p95RatioWithinErrorOfThreshold)"
    );
    body["latencySketch"] = json!({
        "kind": "ddsketch_log_buckets",
        "relativeAccuracy": sketch::RELATIVE_ACCURACY,
        "gamma": sketch::gamma(),
        "quantileRank": "0-based rank floor(0.95 * (n - 1))",
    });
    let plan = CohortPlan::of(change);
    let new_v = plan.new.as_deref();
    let (new_f, prev_f, base_f) = match (new_v, plan.previous.as_deref()) {
        (Some(v), Some(pv)) => (
            VersionFilter::Is(v),
            Some(VersionFilter::Is(pv)),
            VersionFilter::Not(v),
        ),
        (Some(v), None) => (
            VersionFilter::Is(v),
            Some(VersionFilter::Not(v)),
            VersionFilter::Not(v),
        ),
        (None, _) => (VersionFilter::Any, None, VersionFilter::Any),
    };
    // Shared resources and code paths are recorded per version only.
    let by_version = plan.dimension == Dimension::Version;
    let (calls_new_f, calls_prev_f) = if by_version {
        (new_f, prev_f)
    } else {
        (VersionFilter::Any, None)
    };
    // The cohort reads are independent: run them at once (each on its own
    // pooled connection), so the answer costs the slowest, not the sum.
    let prev_or_new = calls_prev_f.unwrap_or(calls_new_f);
    let (new_t, prev_t, base_t, new_calls, prev_calls, overflow) = tokio::try_join!(
        store.cohort_totals(env, service, plan.filter(new_f), start, end),
        async {
            match prev_f {
                Some(f) => {
                    store
                        .cohort_totals(env, service, plan.filter(f), start, end)
                        .await
                }
                None => Ok(RequestTotals::default()),
            }
        },
        store.cohort_totals(env, service, plan.filter(base_f), base_start, start),
        store.call_totals(env, service, calls_new_f, start, end),
        store.call_totals(env, service, prev_or_new, start, end),
        async {
            match plan.dimension {
                Dimension::Version => Ok(0),
                d => {
                    store
                        .cohort_overflow(env, service, d, base_start, end)
                        .await
                }
            }
        },
    )?;
    let mut resources = Vec::new();
    let mut exemplars = std::collections::BTreeMap::new();
    if calls_prev_f.is_some() {
        for (res, n) in &new_calls {
            let Some(o) = prev_calls.get(res) else {
                continue;
            };
            let cc = |t: &crate::db::analysis::CallTotals| CallCounts {
                calls: t.calls as f64,
                errors: t.errors as f64,
                duration_ms: t.duration_us as f64 / 1000.0,
            };
            exemplars.insert(res.clone(), n.exemplar.clone());
            resources.push(SharedResource {
                resource: res.clone(),
                contended_kind: is_contended_kind(res),
                new: cc(n),
                previous: cc(o),
            });
        }
    }
    let j = verdict::judge(&BlastInput {
        min_sample: p.min_sample as f64,
        new: counts(&new_t),
        previous: counts(&prev_t),
        pre_baseline: counts(&base_t),
        resources,
    });
    let failing = store
        .failing_code_paths(env, service, calls_new_f, start, end)
        .await?;
    let overlap: Vec<String> = change
        .touched_paths
        .iter()
        .filter(|t| failing.iter().any(|f| path_matches(f, t)))
        .cloned()
        .collect();
    let prev_label = match prev_f {
        Some(VersionFilter::Is(v)) => Some(v),
        _ => None,
    };
    let aggressors: Vec<Value> = j
        .resources
        .iter()
        .filter(|r| r.aggressor)
        .map(|r| {
            let ex = exemplars.get(&r.resource).cloned().unwrap_or_default();
            let (trace, span) = ex.split_once('/').unwrap_or(("", ""));
            json!({
                "resource": r.resource,
                "version": new_v,
                "fanoutRatio": r.fanout_ratio,
                "durationRatio": r.duration_ratio,
                "previousCallErrorRate": r.previous_call_error_rate,
                "traceId": trace,
                "spanId": span,
                "relations": ["induced_shared_resource_contention", "contended_on_shared_resource"],
            })
        })
        .collect();
    merge(&mut body, judgement_json(&j));
    merge(
        &mut body,
        json!({
            "unit": "requests",
            "cohortDimension": {
                "kind": plan.kind,
                "flag": (plan.dimension == Dimension::Flag).then_some(plan.name.as_str()),
                "new": new_v,
                "previous": plan.previous,
                "overflowCount": overflow,
            },
            "cohorts": {
                "new": cohort_view(&plan.label(new_v), &new_t),
                "previous": cohort_view(&plan.label(prev_label), &prev_t),
                "preBaseline": cohort_view(&plan.label(None), &base_t),
            },
            "sharedResources": j.resources,
            "sharedResourceAggressors": aggressors,
            "touchedPathsOverlap": overlap,
        }),
    );
    Ok(BlastRadius {
        verdict: j.verdict,
        touched_paths_overlap: overlap,
        body,
    })
}

/// A stack frame's `code.filepath` matches a touched path when equal, or
/// when it ends with it at a `/` boundary (frames often carry absolute paths).
pub fn path_matches(frame: &str, touched: &str) -> bool {
    let touched = touched.trim_start_matches("./");
    frame == touched
        || frame
            .strip_suffix(touched)
            .is_some_and(|head| head.ends_with('/'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_match_exactly_or_at_a_directory_boundary() {
        assert!(path_matches(
            "src/checkout/charge.ts",
            "src/checkout/charge.ts"
        ));
        assert!(path_matches(
            "/app/src/checkout/charge.ts",
            "src/checkout/charge.ts"
        ));
        assert!(!path_matches("/app/src/checkout/xcharge.ts", "charge.ts"));
        assert!(!path_matches(
            "src/checkout/charge.tsx",
            "src/checkout/charge.ts"
        ));
    }
}
