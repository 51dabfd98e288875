//! OTLP aggregates, the reads: request, cohort and call totals of a
//! window, failing code paths, one failed request, and who wrote the
//! spans.
//!
//! Invariants:
//! - Reads only. A second counts when it starts in the window: whole
//!   minutes read the minute's sketch when one is stored, the minutes at
//!   the window's edges (and rows without a sketch) read their seconds.

use std::collections::{BTreeMap, BTreeSet};

use sqlx::Row;

use super::json_column;
use crate::analysis::cohort::Dimension;
use crate::analysis::otlp::FailedRequest;
use crate::analysis::sketch::{MinuteCells, SecondRange, Sketch};
use crate::db::{Pools, Store, StoreError};

use super::otlp_write::decode_err;

/// Which versions a cohort holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VersionFilter<'a> {
    /// Every version.
    Any,
    /// Exactly this one.
    Is(&'a str),
    /// Every other one.
    Not(&'a str),
}

impl<'a> VersionFilter<'a> {
    fn binds(self) -> (Option<&'a str>, Option<&'a str>) {
        match self {
            VersionFilter::Any => (None, None),
            VersionFilter::Is(v) => (Some(v), None),
            VersionFilter::Not(v) => (None, Some(v)),
        }
    }
}

/// Request counts and latency sketch of a cohort over `[start, end)`, to the second.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RequestTotals {
    /// Requests.
    pub requests: i64,
    /// Failed requests.
    pub errors: i64,
    /// Latency sketch of those requests.
    pub latency: Sketch,
    /// Rows read that were converted from minute-resolution aggregates
    /// (their latency error bound is wider; see `convert_legacy_request_stats`).
    pub legacy_rows: i64,
}

/// Which cohort rows a read sums.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CohortFilter<'a> {
    /// Version, config digest or flag variant.
    pub dimension: Dimension,
    /// The flag key ([`Dimension::Flag`]), else "".
    pub name: &'a str,
    /// Which values.
    pub values: VersionFilter<'a>,
}

impl<'a> CohortFilter<'a> {
    /// Version cohorts.
    pub fn versions(values: VersionFilter<'a>) -> CohortFilter<'a> {
        CohortFilter {
            dimension: Dimension::Version,
            name: "",
            values,
        }
    }
}

/// Calls of a cohort to one resource.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CallTotals {
    /// Calls.
    pub calls: i64,
    /// Failed calls.
    pub errors: i64,
    /// Sum of durations, µs.
    pub duration_us: i64,
    /// One contending span (`traceId/spanId`).
    pub exemplar: String,
}

impl Store {
    /// Who wrote the spans of `service` (every version) in `[start, end)`:
    /// key id → spans (requests + client calls) it shipped there.
    pub async fn span_writers(
        &self,
        environment: &str,
        service: &str,
        start_ns: i64,
        end_ns: i64,
    ) -> Result<BTreeMap<String, i64>, StoreError> {
        let rows: Vec<(String, i64)> = with_pool!(self, read, |pool, pg| {
            sqlx::query_as(
                "SELECT key_id, CAST(SUM(requests + calls) AS BIGINT) FROM span_writers
                 WHERE environment = $1 AND service = $2 AND bucket_ns >= $3 AND bucket_ns < $4
                 GROUP BY key_id",
            )
            .bind(environment)
            .bind(service)
            .bind(start_ns)
            .bind(end_ns)
            .fetch_all(pool)
            .await?
        });
        Ok(rows.into_iter().collect())
    }

    /// Requests of `service` in `[start, end)`, one version or all, to the
    /// second (a second counts when it starts in the window).
    pub async fn request_totals(
        &self,
        environment: &str,
        service: &str,
        versions: VersionFilter<'_>,
        start_ns: i64,
        end_ns: i64,
    ) -> Result<RequestTotals, StoreError> {
        self.cohort_totals(
            environment,
            service,
            CohortFilter::versions(versions),
            start_ns,
            end_ns,
        )
        .await
    }

    /// Requests of one cohort filter in `[start, end)`, to the second.
    pub async fn cohort_totals(
        &self,
        environment: &str,
        service: &str,
        filter: CohortFilter<'_>,
        start_ns: i64,
        end_ns: i64,
    ) -> Result<RequestTotals, StoreError> {
        self.sum_cohort_rows(environment, service, filter, false, start_ns, end_ns)
            .await
    }

    /// Requests counted in a dimension's overflow rows in `[start, end)`
    /// (values past the per-minute cap).
    pub async fn cohort_overflow(
        &self,
        environment: &str,
        service: &str,
        dimension: Dimension,
        start_ns: i64,
        end_ns: i64,
    ) -> Result<i64, StoreError> {
        let filter = CohortFilter {
            dimension,
            name: "",
            values: VersionFilter::Any,
        };
        Ok(self
            .sum_cohort_rows(environment, service, filter, true, start_ns, end_ns)
            .await?
            .requests)
    }

    async fn sum_cohort_rows(
        &self,
        environment: &str,
        service: &str,
        filter: CohortFilter<'_>,
        overflow: bool,
        start_ns: i64,
        end_ns: i64,
    ) -> Result<RequestTotals, StoreError> {
        const MINUTE: i64 = crate::analysis::otlp::BUCKET_NS;
        let mut t = RequestTotals::default();
        if end_ns <= start_ns {
            return Ok(t);
        }
        let (is, not) = filter.values.binds();
        let first_minute = start_ns - start_ns.rem_euclid(MINUTE);
        // Whole minutes read the minute sketch when one is stored; the
        // minutes at the edges (and rows without one) read the seconds.
        let sql = format!(
            "SELECT bucket_ns, requests, errors, legacy, sketch,
                    CASE WHEN length(sketch) = 0 OR bucket_ns < $3 OR bucket_ns > $4 THEN seconds END
             FROM cohort_stats
             WHERE environment = $1 AND service = $2 AND dimension = $5 AND name = $6
               AND bucket_ns >= $7 AND bucket_ns < $8 AND {}
               AND ($9 IS NULL OR value = $9) AND ($10 IS NULL OR value <> $10)",
            if overflow { "value = ''" } else { "value <> ''" }
        );
        type Row = (i64, i64, i64, i64, Vec<u8>, Option<Vec<u8>>);
        let rows: Vec<Row> = with_pool!(self, read, |pool, pg| {
            sqlx::query_as(&sql)
                .bind(environment)
                .bind(service)
                .bind(start_ns)
                .bind(end_ns.saturating_sub(MINUTE))
                .bind(filter.dimension.as_str())
                .bind(filter.name)
                .bind(first_minute)
                .bind(end_ns)
                .bind(is)
                .bind(not)
                .fetch_all(pool)
                .await?
        });
        let (mut requests, mut errors) = (0u64, 0u64);
        for (bucket_ns, req, err, legacy, sketch, seconds) in rows {
            let range = SecondRange::within(bucket_ns, start_ns, end_ns);
            if range.from >= range.to {
                continue;
            }
            t.legacy_rows += i64::from(legacy != 0);
            match seconds {
                Some(seconds) => {
                    let (r, e) = MinuteCells::read_into(&seconds, range, &mut t.latency)
                        .map_err(decode_err)?;
                    requests = requests.saturating_add(r);
                    errors = errors.saturating_add(e);
                }
                None => {
                    t.latency.merge_encoded(&sketch).map_err(decode_err)?;
                    requests = requests.saturating_add(u64::try_from(req).unwrap_or(0));
                    errors = errors.saturating_add(u64::try_from(err).unwrap_or(0));
                }
            }
        }
        t.requests = i64::try_from(requests).unwrap_or(i64::MAX);
        t.errors = i64::try_from(errors).unwrap_or(i64::MAX);
        Ok(t)
    }

    /// Calls by resource of one version in `[start, end)`.
    pub async fn call_totals(
        &self,
        environment: &str,
        service: &str,
        versions: VersionFilter<'_>,
        start_ns: i64,
        end_ns: i64,
    ) -> Result<BTreeMap<String, CallTotals>, StoreError> {
        let (is, not) = versions.binds();
        let rows: Vec<(String, i64, i64, i64, String)> = with_pool!(self, read, |pool, pg| {
            sqlx::query_as(
                "SELECT resource, CAST(SUM(calls) AS BIGINT), CAST(SUM(errors) AS BIGINT),
                        CAST(SUM(duration_us) AS BIGINT), MAX(exemplar)
                 FROM call_stats
                 WHERE environment = $1 AND service = $2
                   AND bucket_ns >= $3 AND bucket_ns < $4
                   AND ($5 IS NULL OR version = $5) AND ($6 IS NULL OR version <> $6)
                 GROUP BY resource",
            )
            .bind(environment)
            .bind(service)
            .bind(start_ns)
            .bind(end_ns)
            .bind(is)
            .bind(not)
            .fetch_all(pool)
            .await?
        });
        Ok(rows
            .into_iter()
            .map(|(r, calls, errors, duration_us, exemplar)| {
                (
                    r,
                    CallTotals {
                        calls,
                        errors,
                        duration_us,
                        exemplar,
                    },
                )
            })
            .collect())
    }

    /// `code.filepath` values on failed requests of one version in `[start, end)`.
    pub async fn failing_code_paths(
        &self,
        environment: &str,
        service: &str,
        versions: VersionFilter<'_>,
        start_ns: i64,
        end_ns: i64,
    ) -> Result<BTreeSet<String>, StoreError> {
        let (is, not) = versions.binds();
        let rows: Vec<String> = with_pool!(self, read, |pool, pg| {
            sqlx::query_scalar(
                "SELECT DISTINCT code_paths FROM failed_requests
                 WHERE environment = $1 AND service = $2
                   AND start_ns >= $3 AND start_ns < $4 AND code_paths <> '[]'
                   AND ($5 IS NULL OR version = $5) AND ($6 IS NULL OR version <> $6)
                 LIMIT 10000",
            )
            .bind(environment)
            .bind(service)
            .bind(start_ns)
            .bind(end_ns)
            .bind(is)
            .bind(not)
            .fetch_all(pool)
            .await?
        });
        Ok(rows
            .iter()
            .flat_map(|s| serde_json::from_str::<Vec<String>>(s).unwrap_or_default())
            .collect())
    }

    /// A sampled failed request by span id (hex).
    pub async fn failed_request(&self, span_id: &str) -> Result<Option<FailedRequest>, StoreError> {
        with_pool!(self, read, |pool, pg| {
            let Some(row) = sqlx::query(
                "SELECT span_id, trace_id, environment, service, version, operation, error_signature,
                        downstream, code_paths, config_digest, feature_flags, start_ns
                 FROM failed_requests WHERE span_id = $1",
            )
            .bind(span_id)
            .fetch_optional(pool)
            .await?
            else {
                return Ok(None);
            };
            Ok(Some(FailedRequest {
                span_id: row.try_get("span_id")?,
                trace_id: row.try_get("trace_id")?,
                environment: row.try_get("environment")?,
                service: row.try_get("service")?,
                version: row.try_get("version")?,
                operation: row.try_get("operation")?,
                error_signature: row.try_get("error_signature")?,
                downstream: row.try_get("downstream")?,
                code_paths: json_column(&row, "code_paths")?,
                config_digest: row.try_get("config_digest")?,
                feature_flags: json_column(&row, "feature_flags")?,
                start_ns: row.try_get("start_ns")?,
            }))
        })
    }
}
