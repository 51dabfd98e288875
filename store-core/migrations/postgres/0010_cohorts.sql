-- pstack-store schema v10 (postgres): request cohorts exact to the second, with
-- a latency sketch of stated error (issue 29; src/analysis/cohort.rs,
-- src/analysis/sketch.rs, src/db/analysis.rs).

-- One row per (environment, service, dimension, name, minute, value):
-- dimension 'version' (name ''), 'config' (name '', value = the digest) or
-- 'flag' (name = flag key, value = variant). value '' is the dimension's
-- overflow row (requests past the per-minute cap of distinct values).
-- seconds: per second with traffic, failed requests and latency buckets
-- (MinuteCells encoding); sketch: the whole minute's latency buckets when
-- that is much smaller than seconds, else empty; requests/errors: totals.
-- legacy = 1: converted from request_stats (minute resolution, 4 latency
-- bins per octave); the answer widens its error bound.
CREATE TABLE cohort_stats (
    environment TEXT    NOT NULL,
    service     TEXT    NOT NULL,
    dimension   TEXT    NOT NULL,
    name        TEXT    NOT NULL,
    bucket_ns   BIGINT  NOT NULL,
    value       TEXT    NOT NULL,
    requests    BIGINT  NOT NULL,
    errors      BIGINT  NOT NULL,
    seconds     BYTEA   NOT NULL,
    sketch      BYTEA   NOT NULL,
    legacy      BIGINT  NOT NULL DEFAULT 0,
    PRIMARY KEY (environment, service, dimension, name, bucket_ns, value)
);
-- The capped dimensions' distinct values in one minute (the cap check at
-- ingest), without scanning a service's whole flag or digest history.
CREATE INDEX cohort_stats_capped ON cohort_stats (environment, service, dimension, bucket_ns)
    WHERE dimension <> 'version';

-- request_stats stays until the store converts its rows into cohort_stats
-- (legacy = 1) on open, in batches, each in one transaction with the
-- deletion of the rows it converted; new requests are written to
-- cohort_stats only.

-- Feature-flag values a change set (JSON object), so a flag change is
-- judged over its variant cohorts.
ALTER TABLE changes ADD COLUMN flags TEXT NOT NULL DEFAULT '{}';
