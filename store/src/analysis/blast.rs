//! Assemble a change's blast radius: read the cohorts from the store, hand
//! them to the pure [`verdict`](super::verdict) rules, and shape the answer.
//!
//! Windows: the change's window is `[at, at + window)` (default `window` =
//! now − at); the pre-change baseline is the equally long `[at − window, at)`.
//! Service changes are judged over version cohorts: `new` = the change's
//! `version` (else `commitSha`), `previous` = `previousVersion` (else every
//! other version of the service), `preBaseline` = every version of the
//! service before the change. A change with neither version nor commit
//! (config, feature flag) has no version cohorts: `new` is all of the
//! service's traffic after it and it is judged against the baseline only.
//! Host changes are judged over node cohorts ([`fleet`](super::fleet)).

use serde::Serialize;
use serde_json::{Value, json};

use super::fleet::{self, FleetMetric, NodeCohort};
use super::ledger::{ChangeRecord, rfc3339};
use super::otlp::{is_contended_kind, p95_ms};
use super::verdict::{self, BlastInput, CallCounts, CohortCounts, Judgement, SharedResource};
use crate::db::analysis::{RequestTotals, VersionFilter};
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

/// One request cohort as the API shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CohortView {
    /// Version (None: every version).
    pub version: Option<String>,
    /// Requests.
    pub request_count: i64,
    /// Failed requests.
    pub error_count: i64,
    /// errorCount / requestCount (0 when empty).
    pub error_rate: f64,
    /// p95 latency, ms.
    pub p95_ms: Option<f64>,
}

impl CohortView {
    fn of(version: Option<String>, t: &RequestTotals) -> CohortView {
        let counts = counts(t);
        CohortView {
            version,
            request_count: t.requests,
            error_count: t.errors,
            error_rate: counts.rate(),
            p95_ms: counts.p95_ms,
        }
    }
}

fn counts(t: &RequestTotals) -> CohortCounts {
    CohortCounts {
        requests: t.requests as f64,
        errors: t.errors as f64,
        p95_ms: p95_ms(&t.histogram),
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
        "p95Ratio": j.p95_ratio,
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
    let new_version = change.version.as_deref().or(change.commit_sha.as_deref());
    let (new_f, prev_f) = match (new_version, change.previous_version.as_deref()) {
        (Some(v), Some(pv)) => (VersionFilter::Is(v), Some(VersionFilter::Is(pv))),
        (Some(v), None) => (VersionFilter::Is(v), Some(VersionFilter::Not(v))),
        (None, _) => (VersionFilter::Any, None),
    };
    // The cohort reads are independent: run them at once (each on its own
    // pooled connection), so the answer costs the slowest, not the sum.
    let prev_or_new = prev_f.unwrap_or(new_f);
    let (new_t, prev_t, base_t, new_calls, prev_calls) = tokio::try_join!(
        store.request_totals(env, service, new_f, at, end),
        async {
            match prev_f {
                Some(f) => store.request_totals(env, service, f, at, end).await,
                None => Ok(RequestTotals::default()),
            }
        },
        store.request_totals(env, service, VersionFilter::Any, base_start, at),
        store.call_totals(env, service, new_f, at, end),
        store.call_totals(env, service, prev_or_new, at, end),
    )?;
    let mut resources = Vec::new();
    let mut exemplars = std::collections::BTreeMap::new();
    if prev_f.is_some() {
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
        .failing_code_paths(env, service, new_f, at, end)
        .await?;
    let overlap: Vec<String> = change
        .touched_paths
        .iter()
        .filter(|t| failing.iter().any(|f| path_matches(f, t)))
        .cloned()
        .collect();
    let prev_label = match prev_f {
        Some(VersionFilter::Is(v)) => Some(v.to_string()),
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
                "version": new_version,
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
            "cohorts": {
                "new": CohortView::of(new_version.map(str::to_string), &new_t),
                "previous": CohortView::of(prev_label, &prev_t),
                "preBaseline": CohortView::of(None, &base_t),
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
