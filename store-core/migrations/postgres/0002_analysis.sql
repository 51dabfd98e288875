-- pstack-store schema v2 (PostgreSQL): change ledger, request telemetry
-- aggregates, findings and eval runs (seed 000). Raw spans are not kept: only
-- per-minute counters and a bounded sample of failed requests.
CREATE TABLE changes (
    id                  TEXT    PRIMARY KEY,
    environment         TEXT    NOT NULL,
    kind                TEXT    NOT NULL,
    service             TEXT,
    version             TEXT,
    previous_version    TEXT,
    commit_sha          TEXT,
    previous_commit_sha TEXT,
    config_digest       TEXT,
    summary             TEXT,
    touched_paths       TEXT    NOT NULL,
    at_ns               BIGINT  NOT NULL,
    key_id              TEXT    NOT NULL,
    created_ns          BIGINT  NOT NULL
);
CREATE INDEX changes_env_at ON changes (environment, at_ns);

CREATE TABLE change_nodes (
    change_id TEXT    NOT NULL REFERENCES changes (id) ON DELETE CASCADE,
    node      TEXT    NOT NULL,
    at_ns     BIGINT  NOT NULL,
    PRIMARY KEY (change_id, node)
);

-- Requests per (environment, service, version, minute, latency bin): counts
-- and a log-scale latency histogram in one table.
CREATE TABLE request_stats (
    environment TEXT    NOT NULL,
    service     TEXT    NOT NULL,
    version     TEXT    NOT NULL,
    bucket_ns   BIGINT  NOT NULL,
    latency_bin BIGINT  NOT NULL,
    requests    BIGINT  NOT NULL,
    errors      BIGINT  NOT NULL,
    PRIMARY KEY (environment, service, bucket_ns, version, latency_bin)
);

-- Client calls per (environment, service, version, minute, resource).
CREATE TABLE call_stats (
    environment TEXT    NOT NULL,
    service     TEXT    NOT NULL,
    version     TEXT    NOT NULL,
    bucket_ns   BIGINT  NOT NULL,
    resource    TEXT    NOT NULL,
    calls       BIGINT  NOT NULL,
    errors      BIGINT  NOT NULL,
    duration_us BIGINT  NOT NULL,
    exemplar    TEXT    NOT NULL,
    PRIMARY KEY (environment, service, bucket_ns, version, resource)
);

CREATE TABLE failed_requests (
    span_id         TEXT    PRIMARY KEY,
    trace_id        TEXT    NOT NULL,
    environment     TEXT    NOT NULL,
    service         TEXT    NOT NULL,
    version         TEXT    NOT NULL,
    operation       TEXT    NOT NULL,
    error_signature TEXT    NOT NULL,
    downstream      TEXT,
    code_paths      TEXT    NOT NULL,
    config_digest   TEXT,
    feature_flags   TEXT    NOT NULL,
    start_ns        BIGINT  NOT NULL
);
CREATE INDEX failed_requests_service ON failed_requests (environment, service, start_ns);

CREATE TABLE eval_runs (
    id                      TEXT    PRIMARY KEY,
    eval_case_id            TEXT    NOT NULL,
    input_payload_hash      TEXT    NOT NULL,
    passed                  BIGINT  NOT NULL,
    service_version         TEXT,
    commit_sha              TEXT,
    candidate_agent_version TEXT,
    failure_fingerprint     TEXT,
    key_id                  TEXT    NOT NULL,
    created_ns              BIGINT  NOT NULL
);

CREATE TABLE findings (
    id                     TEXT    PRIMARY KEY,
    environment            TEXT    NOT NULL,
    incident_id            TEXT,
    fault_locus_entity_id  TEXT    NOT NULL,
    causal_chain           TEXT    NOT NULL,
    cited_evidence_ids     TEXT    NOT NULL,
    contributing_change_id TEXT    REFERENCES changes (id),
    change_verdict         TEXT,
    counterfactual         TEXT,
    fingerprint            TEXT    NOT NULL,
    fingerprint_input      TEXT    NOT NULL,
    causal_proof_tier      TEXT    NOT NULL,
    idempotency_key        TEXT    NOT NULL UNIQUE,
    key_id                 TEXT    NOT NULL,
    created_ns             BIGINT  NOT NULL,
    updated_ns             BIGINT  NOT NULL
);
CREATE INDEX findings_fingerprint ON findings (fingerprint, created_ns);

-- RESTRICT: an envelope a finding cites is never deleted.
CREATE TABLE finding_evidence (
    finding_id TEXT NOT NULL REFERENCES findings (id),
    digest     TEXT NOT NULL REFERENCES envelopes (digest) ON DELETE RESTRICT,
    PRIMARY KEY (finding_id, digest)
);
CREATE INDEX finding_evidence_digest ON finding_evidence (digest);
