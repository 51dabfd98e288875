-- pstack-store schema v6 (PostgreSQL): key scopes and evidence provenance
-- (issue 28). Keys made before scopes hold `legacy` (every scope, as before)
-- until an operator narrows them; new keys always name their scopes.
ALTER TABLE api_keys ADD COLUMN scopes TEXT NOT NULL DEFAULT 'legacy';

-- The agent version running in the changed state: the broken
-- candidateAgentVersion a counterfactual baseline must match.
ALTER TABLE changes ADD COLUMN candidate_agent_version TEXT;

-- The key that shipped each sampled failed span (NULL: before v6).
ALTER TABLE failed_requests ADD COLUMN key_id TEXT;

-- Which key wrote the spans of each (environment, service, version, minute):
-- the provenance of request_stats and call_stats, whose counters merge every
-- writer. The gate reads it to refuse a tier resting on the acting key's own
-- telemetry. Rows before v6 do not exist: such aggregates have no known writer.
CREATE TABLE span_writers (
    environment TEXT    NOT NULL,
    service     TEXT    NOT NULL,
    version     TEXT    NOT NULL,
    bucket_ns   BIGINT  NOT NULL,
    key_id      TEXT    NOT NULL,
    requests    BIGINT  NOT NULL,
    errors      BIGINT  NOT NULL,
    calls       BIGINT  NOT NULL,
    PRIMARY KEY (environment, service, bucket_ns, version, key_id)
);
