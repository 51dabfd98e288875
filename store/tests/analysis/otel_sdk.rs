//! Blast radius driven by a client the store never saw: the OpenTelemetry
//! Python SDK with its real OTLP/HTTP protobuf exporter
//! (`otel_export.py`, venv from `scripts/setup.d/61-otel-python.sh`; env
//! `PSTACK_OTEL_PYTHON` names another interpreter). The SDK makes the ids,
//! the protobuf and the HTTP requests; the tests only place spans in time.
//!
//! - p95 ratios of 2.45x and 2.55x land on the right side of 2.5 at five
//!   absolute scales (0.75 ms to 2.3 s), with the error bound reported;
//! - a change at hh:mm:10: every request of the new version in its first
//!   50 s is in `new`, no request of it is in `preBaseline`, and the
//!   window is stated to the second;
//! - an exact 5.0-point difference (5.5 % vs 0.5 %) is a regression
//!   whatever the second of the minute the change happened at;
//! - a feature-flag flip and a config change judged over their variant /
//!   digest cohorts (`isolated_to_new_version`, `cohort_rate_isolated`),
//!   and the flag's no-regression twin.

use std::io::Write;
use std::process::{Command, Stdio};

use reqwest::StatusCode;
use serde_json::{Value, json};

use super::{MIN_NS, anchor, deploy, post_json, rfc};
use crate::on_both_backends;
use crate::support::{Db, Harness};

const SEC_NS: i64 = 1_000_000_000;
const MS_NS: i64 = 1_000_000;
const DEFAULT_PYTHON: &str = "/opt/pstack-otel-python-1.45.2/bin/python";

/// One span to emit.
#[derive(Clone)]
struct Req {
    start_ns: i64,
    duration_ns: i64,
    error: bool,
    attributes: Value,
    events: Value,
}

impl Req {
    fn at(start_ns: i64, duration_ns: i64, error: bool) -> Req {
        Req {
            start_ns,
            duration_ns,
            error,
            attributes: json!({}),
            events: json!([]),
        }
    }
}

/// `n` requests from `start_ns`, `gap_ns` apart, the first `errors` failed.
fn series(start_ns: i64, gap_ns: i64, n: usize, errors: usize, duration_ns: i64) -> Vec<Req> {
    (0..n)
        .map(|i| Req::at(start_ns + i as i64 * gap_ns, duration_ns, i < errors))
        .collect()
}

/// A resource (one SDK process) and its spans.
fn resource(service: &str, version: &str, extra: Value, reqs: &[Req]) -> Value {
    let mut attributes = json!({
        "service.name": service,
        "service.version": version,
        "deployment.environment.name": "prod",
    });
    if let (Some(a), Value::Object(e)) = (attributes.as_object_mut(), extra) {
        a.extend(e);
    }
    let spans: Vec<Value> = reqs
        .iter()
        .map(|r| {
            let mut attrs = json!({
                "http.request.method": "POST",
                "http.route": "/checkout",
                "http.response.status_code": if r.error { 503 } else { 200 },
            });
            if let (Some(a), Value::Object(e)) = (attrs.as_object_mut(), r.attributes.clone()) {
                a.extend(e);
            }
            json!({
                "name": "POST /checkout",
                "startNs": r.start_ns,
                "endNs": r.start_ns + r.duration_ns,
                "error": r.error,
                "attributes": attrs,
                "events": r.events,
            })
        })
        .collect();
    json!({"attributes": attributes, "spans": spans})
}

/// The interpreter with the SDK, or None (a reported skip; a failure under
/// PSTACK_STRICT=1 / CI=true).
fn python() -> Option<String> {
    crate::support::python_with(
        "PSTACK_OTEL_PYTHON",
        DEFAULT_PYTHON,
        "opentelemetry.sdk, opentelemetry.exporter.otlp.proto.http.trace_exporter",
        "OpenTelemetry Python SDK",
        "scripts/setup.d/61-otel-python.sh",
    )
}

/// Export `resources` through the SDK into the harness; every span must be accepted.
async fn export(h: &Harness, py: &str, resources: Vec<Value>, gzip: bool) {
    let planned: usize = resources
        .iter()
        .map(|r| r["spans"].as_array().map_or(0, Vec::len))
        .sum();
    let plan = json!({
        "endpoint": h.url("/v1/traces"),
        "apiKey": h.key,
        "gzip": gzip,
        "resources": resources,
    });
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/analysis/otel_export.py");
    let py = py.to_string();
    let out = tokio::task::spawn_blocking(move || {
        let mut child = Command::new(py)
            .arg(script)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn the OpenTelemetry SDK exporter");
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(plan.to_string().as_bytes())
            .expect("write the plan");
        child.wait_with_output().expect("exporter output")
    })
    .await
    .expect("exporter task");
    assert!(
        out.status.success(),
        "SDK export failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let summary: Value = serde_json::from_slice(&out.stdout).expect("exporter summary");
    assert_eq!(summary["exported"], planned, "{summary}");
}

async fn blast(h: &Harness, id: &str) -> Value {
    let (status, body) = h
        .get(&format!("/internal/changes/{id}/blast-radius?window=30m"))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    body
}

/// 200 latencies whose p95 is exactly `p95_ns` under any rank rule between
/// the 0-based ranks 180 and 199 (the slowest 20 are all at it).
fn latencies(p95_ns: i64) -> Vec<i64> {
    (0..200)
        .map(|i| {
            if i >= 180 {
                p95_ns
            } else {
                p95_ns * (i + 1) / 400
            }
        })
        .collect()
}

// ---- p95 ratios either side of 2.5, at several absolute scales ----

async fn otel_sdk_p95_ratio_sides(db: Db) {
    let Some(py) = python() else {
        return;
    };
    let Some(h) = Harness::start(db).await else {
        return;
    };
    let at = anchor(2);
    let scales_us = [750, 1_197, 12_000, 160_000, 2_300_000];
    let mut resources = Vec::new();
    let mut cases = Vec::new();
    for (i, base_us) in scales_us.into_iter().enumerate() {
        for (ratio_permille, want) in [
            (2450, "no_regression_detected"),
            (2550, "isolated_to_new_version"),
        ] {
            let service = format!("p95-{i}-{ratio_permille}");
            let base_ns = base_us * 1000;
            let new_ns = base_ns * ratio_permille / 1000;
            let place = |lat: Vec<i64>| -> Vec<Req> {
                lat.into_iter()
                    .enumerate()
                    .map(|(k, d)| Req::at(at + MIN_NS + k as i64 * 50 * MS_NS, d, false))
                    .collect()
            };
            resources.push(resource(
                &service,
                "2.0.0",
                json!({}),
                &place(latencies(base_ns)),
            ));
            resources.push(resource(
                &service,
                "2.0.1",
                json!({}),
                &place(latencies(new_ns)),
            ));
            let id = deploy(
                &h,
                at,
                json!({"service": service, "version": "2.0.1", "previousVersion": "2.0.0"}),
            )
            .await;
            cases.push((id, base_us, ratio_permille, want));
        }
    }
    export(&h, &py, resources, false).await;
    for (id, base_us, ratio_permille, want) in cases {
        let b = blast(&h, &id).await;
        let truth = ratio_permille as f64 / 1000.0;
        let what = format!("p95 {base_us} µs x{truth}");
        assert_eq!(b["verdict"], want, "{what}: {b:#}");
        assert_eq!(b["cohorts"]["new"]["requestCount"], 200, "{what}");
        assert_eq!(b["p95RatioWithinErrorOfThreshold"], false, "{what}: {b:#}");
        let (lo, hi) = (
            b["p95RatioBounds"]["lower"].as_f64().unwrap(),
            b["p95RatioBounds"]["upper"].as_f64().unwrap(),
        );
        assert!(lo <= truth && truth < hi, "{what}: bounds {lo}..{hi}");
        for cohort in ["new", "previous"] {
            let c = &b["cohorts"][cohort];
            let want_ms = if cohort == "new" {
                base_us as f64 * truth / 1000.0
            } else {
                base_us as f64 / 1000.0
            };
            let (l, u) = (
                c["p95MsBounds"]["lower"].as_f64().unwrap(),
                c["p95MsBounds"]["upper"].as_f64().unwrap(),
            );
            assert!(l <= want_ms && want_ms < u, "{what} {cohort}: {c}");
            assert!(
                c["p95RelativeError"].as_f64().unwrap() <= 0.004 + 1e-9,
                "{c}"
            );
        }
        assert_eq!(b["latencySketch"]["relativeAccuracy"], 0.004);
    }
    h.finish().await;
}

// ---- a change at hh:mm:10 ----

async fn otel_sdk_change_mid_minute(db: Db) {
    let Some(py) = python() else {
        return;
    };
    let Some(h) = Harness::start(db).await else {
        return;
    };
    let at = anchor(1) + 10 * SEC_NS;
    let id = deploy(&h, at, json!({})).await;
    // The previous version: 800 requests in the 10 minutes before the
    // change (its last ones in the change's own minute), 600 after.
    let mut old = series(at - 10 * MIN_NS, 750 * MS_NS, 800, 2, 20 * MS_NS);
    old.extend(series(at, 500 * MS_NS, 600, 1, 20 * MS_NS));
    // The new version: 400 requests in its first 50 s (hh:mm:10 to
    // hh:mm+1:00), and 5 canary requests 3 s before the change was recorded.
    let mut new = series(at, 125 * MS_NS, 400, 60, 20 * MS_NS);
    new.extend(series(at - 3 * SEC_NS, 100 * MS_NS, 5, 0, 20 * MS_NS));
    export(
        &h,
        &py,
        vec![
            resource("checkout-api", "2.4.0", json!({}), &old),
            resource("checkout-api", "2.4.1", json!({}), &new),
        ],
        true,
    )
    .await;
    let b = blast(&h, &id).await;
    assert_eq!(b["cohorts"]["new"]["requestCount"], 400, "{b:#}");
    assert_eq!(b["cohorts"]["new"]["errorCount"], 60, "{b:#}");
    assert_eq!(b["cohorts"]["previous"]["requestCount"], 600, "{b:#}");
    assert_eq!(b["cohorts"]["previous"]["errorCount"], 1, "{b:#}");
    assert_eq!(b["cohorts"]["preBaseline"]["requestCount"], 800, "{b:#}");
    assert_eq!(b["cohorts"]["preBaseline"]["errorCount"], 2, "{b:#}");
    assert_eq!(b["verdict"], "isolated_to_new_version", "{b:#}");
    let w = &b["window"];
    assert_eq!(w["start"], rfc(at), "{w}");
    assert_eq!(w["end"], rfc(at + 30 * MIN_NS), "{w}");
    assert_eq!(w["preBaselineStart"], rfc(at - 30 * MIN_NS), "{w}");
    assert_eq!(w["preBaselineEnd"], rfc(at), "{w}");
    assert_eq!(w["resolution"], "1s");
    h.finish().await;
}

// ---- an exact 5.0-point difference at any second of the minute ----

async fn otel_sdk_five_points_at_any_second(db: Db) {
    let Some(py) = python() else {
        return;
    };
    let Some(h) = Harness::start(db).await else {
        return;
    };
    let mut resources = Vec::new();
    let mut cases = Vec::new();
    for (i, second) in [0i64, 1, 10, 29, 45, 59].into_iter().enumerate() {
        let service = format!("five-{second}");
        let at = anchor(3) + i as i64 * 5 * MIN_NS + second * SEC_NS;
        // 5.5 % vs 0.5 %, the failures first (right after the change).
        let new = series(at, 250 * MS_NS, 200, 11, 30 * MS_NS);
        let mut old = series(at, 250 * MS_NS, 200, 1, 30 * MS_NS);
        // The previous version's last 100 s before the change, all failing:
        // preBaseline, never `previous`.
        old.extend(series(at - 100 * SEC_NS, SEC_NS, 100, 100, 30 * MS_NS));
        resources.push(resource(&service, "2.4.0", json!({}), &old));
        resources.push(resource(&service, "2.4.1", json!({}), &new));
        let id = deploy(&h, at, json!({"service": service})).await;
        cases.push((id, second));
    }
    export(&h, &py, resources, false).await;
    for (id, second) in cases {
        let b = blast(&h, &id).await;
        assert_eq!(
            b["verdict"], "isolated_to_new_version",
            "second {second}: {b:#}"
        );
        assert_eq!(b["cohorts"]["new"]["requestCount"], 200, "second {second}");
        assert_eq!(b["cohorts"]["new"]["errorCount"], 11, "second {second}");
        assert_eq!(
            b["cohorts"]["previous"]["requestCount"], 200,
            "second {second}"
        );
        assert_eq!(b["cohorts"]["previous"]["errorCount"], 1, "second {second}");
        assert_eq!(
            b["cohorts"]["preBaseline"]["requestCount"], 100,
            "second {second}"
        );
        let d = b["absoluteRateDifference"].as_f64().unwrap();
        assert!((d - 0.05).abs() < 1e-12, "second {second}: {d}");
    }
    h.finish().await;
}

// ---- flag and config cohorts ----

/// `n` requests that evaluated `flag` to `variant`, the first `errors` failed;
/// the flag recorded as OpenTelemetry's evaluation event, or as the seed's
/// `obs.feature_flags.<key>` span attribute.
fn flagged(
    start_ns: i64,
    n: usize,
    errors: usize,
    flag: &str,
    variant: &str,
    as_event: bool,
) -> Vec<Req> {
    series(start_ns, 200 * MS_NS, n, errors, 25 * MS_NS)
        .into_iter()
        .map(|mut r| {
            if as_event {
                r.events = json!([{"name": "feature_flag.evaluation", "attributes": {
                    "feature_flag.key": flag,
                    "feature_flag.result.variant": variant,
                    "feature_flag.provider.name": "openfeature",
                }}]);
            } else {
                let mut attrs = serde_json::Map::new();
                attrs.insert(format!("obs.feature_flags.{flag}"), json!(variant));
                r.attributes = Value::Object(attrs);
            }
            r
        })
        .collect()
}

async fn otel_sdk_flag_and_config_cohorts(db: Db) {
    let Some(py) = python() else {
        return;
    };
    let Some(h) = Harness::start(db).await else {
        return;
    };
    const FLAG: &str = "enable_legacy_tax_fallback";
    let mut resources = Vec::new();
    // The flip (a 50 % rollout at hh:mm:25) and its twin, on one version.
    let mut changes = Vec::new();
    for (i, (service, as_event, on_errors, want)) in [
        ("pricing-api", true, 36, "isolated_to_new_version"),
        ("pricing-api-twin", false, 1, "no_regression_detected"),
    ]
    .into_iter()
    .enumerate()
    {
        let at = anchor(2) + i as i64 * 10 * MIN_NS + 25 * SEC_NS;
        let mut reqs = flagged(at - 90 * SEC_NS, 400, 1, FLAG, "false", as_event);
        reqs.extend(flagged(at, 300, on_errors, FLAG, "true", as_event));
        reqs.extend(flagged(at + 100 * MS_NS, 300, 1, FLAG, "false", as_event));
        resources.push(resource(service, "3.1.0", json!({}), &reqs));
        let (st, c) = post_json(
            &h,
            "/v1/changes",
            &json!({"environment": "prod", "kind": "feature_flag", "service": service,
                    "flags": {FLAG: true}, "at": rfc(at),
                    "summary": "Roll enable_legacy_tax_fallback out to half of the traffic"}),
        )
        .await;
        assert_eq!(st, StatusCode::CREATED, "{c}");
        changes.push((c["id"].as_str().unwrap().to_string(), on_errors, want));
    }
    // A config change: pods with the new digest fail, old-digest pods do not.
    let at = anchor(3) + 40 * SEC_NS;
    resources.push(resource(
        "ledger-api",
        "7.0.0",
        json!({"obs.config.digest": "cfg_old"}),
        &series(at - 60 * SEC_NS, 100 * MS_NS, 1200, 2, 15 * MS_NS),
    ));
    resources.push(resource(
        "ledger-api",
        "7.0.0",
        json!({"obs.config.digest": "cfg_99a1"}),
        &series(at, 100 * MS_NS, 300, 30, 15 * MS_NS),
    ));
    let (st, c) = post_json(
        &h,
        "/v1/changes",
        &json!({"environment": "prod", "kind": "config", "service": "ledger-api",
                "configDigest": "cfg_99a1", "at": rfc(at)}),
    )
    .await;
    assert_eq!(st, StatusCode::CREATED, "{c}");
    let config_change = c["id"].as_str().unwrap().to_string();
    export(&h, &py, resources, true).await;

    for (id, on_errors, want) in &changes {
        let b = blast(&h, id).await;
        assert_eq!(b["verdict"], *want, "{b:#}");
        assert_eq!(b["cohortDimension"]["kind"], "feature_flag", "{b:#}");
        assert_eq!(b["cohortDimension"]["flag"], FLAG);
        assert_eq!(b["cohortDimension"]["new"], "true");
        let new = &b["cohorts"]["new"];
        assert_eq!(new["flag"], FLAG);
        assert_eq!(new["variant"], "true");
        assert_eq!(new["requestCount"], 300, "{b:#}");
        assert_eq!(new["errorCount"], *on_errors, "{b:#}");
        assert_eq!(b["cohorts"]["previous"]["requestCount"], 300, "{b:#}");
        assert_eq!(b["cohorts"]["previous"]["errorCount"], 1, "{b:#}");
        assert_eq!(b["cohorts"]["preBaseline"]["requestCount"], 400, "{b:#}");
        assert_eq!(b["comparedWith"], "previous");
    }
    // The flip reaches cohort_rate_isolated, which no flag could before.
    let (st, f) = post_json(
        &h,
        "/internal/findings",
        &json!({
            "environment": "prod", "faultLocusEntityId": "pricing-api",
            "causalChain": [{"subject": changes[0].0, "relation": "isolated_to_version_cohort", "object": "pricing-api"}],
            "citedEvidenceIds": [], "idempotencyKey": "flag-flip",
            "contributingChangeId": changes[0].0,
            "fingerprintInput": {"originatingNodeId": "pricing-api", "normalizedOperation": "POST /checkout", "errorSignature": "http_503"},
        }),
    )
    .await;
    assert_eq!(st, StatusCode::CREATED, "{f}");
    assert_eq!(
        f["finding"]["causalProofTier"], "cohort_rate_isolated",
        "{f:#}"
    );
    assert_eq!(f["finding"]["changeVerdict"], "isolated_to_new_version");

    let b = blast(&h, &config_change).await;
    assert_eq!(b["verdict"], "isolated_to_new_version", "{b:#}");
    assert_eq!(b["cohortDimension"]["kind"], "config");
    assert_eq!(b["cohorts"]["new"]["configDigest"], "cfg_99a1");
    assert_eq!(b["cohorts"]["new"]["requestCount"], 300, "{b:#}");
    assert_eq!(b["cohorts"]["new"]["errorCount"], 30);
    // cfg_old runs on after the change too: 600 of its requests are later.
    assert_eq!(b["cohorts"]["previous"]["requestCount"], 600, "{b:#}");
    assert_eq!(b["cohorts"]["preBaseline"]["requestCount"], 600, "{b:#}");
    assert_eq!(b["cohortDimension"]["overflowCount"], 0);
    h.finish().await;
}

on_both_backends!(
    otel_sdk_p95_ratio_sides,
    otel_sdk_change_mid_minute,
    otel_sdk_five_points_at_any_second,
    otel_sdk_flag_and_config_cohorts,
);
