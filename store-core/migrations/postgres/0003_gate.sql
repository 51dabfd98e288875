-- pstack-store schema v3 (PostgreSQL): the remediation gate (seed 000, scenario
-- 5): incidents with dedup and runner leases, the ontology of current target
-- state, remediation proposals with hashed single-use grants, watchdog
-- checkpoints, alerts received, and the gate's envelope receipts.

-- status: open | leased | resolved. One active incident per
-- (project, environment, dedup_key): the predicate names statuses only,
-- never the clock (an expired lease is still `leased` until reaped).
CREATE TABLE incident_investigations (
    id                    TEXT    PRIMARY KEY,
    project_id            TEXT    NOT NULL,
    environment           TEXT    NOT NULL,
    dedup_key             TEXT    NOT NULL,
    title                 TEXT    NOT NULL,
    fault_locus_entity_id TEXT,
    status                TEXT    NOT NULL,
    lease_runner_id       TEXT,
    lease_expires_ns      BIGINT,
    fencing_token         BIGINT  NOT NULL DEFAULT 0,
    alert_count           BIGINT  NOT NULL DEFAULT 1,
    key_id                TEXT    NOT NULL,
    created_ns            BIGINT  NOT NULL,
    updated_ns            BIGINT  NOT NULL
);
CREATE UNIQUE INDEX uq_incidents_active_dedup
    ON incident_investigations (project_id, environment, dedup_key)
    WHERE status IN ('open', 'leased');
CREATE INDEX incidents_env_status ON incident_investigations (environment, status, created_ns);

-- Alerts received from Alertmanager (firing and resolved), per incident.
CREATE TABLE incident_alerts (
    id          BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    incident_id TEXT    NOT NULL REFERENCES incident_investigations (id),
    fingerprint TEXT    NOT NULL,
    status      TEXT    NOT NULL,
    starts_at   TEXT,
    ends_at     TEXT,
    labels      TEXT    NOT NULL,
    received_ns BIGINT  NOT NULL
);
CREATE INDEX incident_alerts_incident ON incident_alerts (incident_id, received_ns);

-- node_key: `service:<environment>/<service>`. The state columns hold what
-- the newest change of the ledger (by its effective time) set; a change
-- that does not carry a field leaves it as it was. flags: JSON object of
-- feature-flag values, merged flag by flag.
CREATE TABLE ontology_nodes (
    node_key       TEXT    PRIMARY KEY,
    kind           TEXT    NOT NULL,
    environment    TEXT    NOT NULL,
    name           TEXT    NOT NULL,
    version        TEXT,
    commit_sha     TEXT,
    config_digest  TEXT,
    flags          TEXT    NOT NULL DEFAULT '{}',
    last_change_id TEXT    NOT NULL,
    changed_ns     BIGINT  NOT NULL,
    updated_ns     BIGINT  NOT NULL
);

CREATE TABLE remediation_proposals (
    id                         TEXT    PRIMARY KEY,
    incident_id                TEXT    NOT NULL REFERENCES incident_investigations (id),
    finding_id                 TEXT    NOT NULL REFERENCES findings (id),
    action                     TEXT    NOT NULL,
    target                     TEXT    NOT NULL,
    target_key                 TEXT    NOT NULL,
    expected_state             TEXT    NOT NULL,
    requested_autonomy         TEXT,
    effective_autonomy         TEXT    NOT NULL,
    causal_proof_tier          TEXT    NOT NULL,
    fingerprint                TEXT    NOT NULL,
    status                     TEXT    NOT NULL CHECK (status IN ('proposed', 'pending_human_approval',
                                   'grant_issued', 'claimed_executing', 'completed', 'failed_execution',
                                   'execution_timed_out', 'expired', 'rejected')),
    idempotency_key            TEXT    NOT NULL UNIQUE,
    pre_mutation_envelope      TEXT    REFERENCES envelopes (digest) ON DELETE RESTRICT,
    grant_hash                 TEXT,
    grant_issued_ns            BIGINT,
    grant_expires_ns           BIGINT,
    runner_id                  TEXT,
    claimed_ns                 BIGINT,
    execution_deadline_ns      BIGINT,
    finished_ns                BIGINT,
    outcome                    TEXT,
    callback_sealed            TEXT,
    callback_host              TEXT,
    callback_delivery          TEXT,
    recovery_status            TEXT,
    causal_verification_status TEXT,
    decided_by                 TEXT,
    key_id                     TEXT    NOT NULL,
    created_ns                 BIGINT  NOT NULL,
    updated_ns                 BIGINT  NOT NULL
);
CREATE INDEX proposals_breaker ON remediation_proposals (fingerprint, action, created_ns);
CREATE INDEX proposals_incident ON remediation_proposals (incident_id, created_ns);
CREATE INDEX proposals_status ON remediation_proposals (status, created_ns);

-- Watchdog checkpoints: +2m, +5m, +15m from completion.
CREATE TABLE remediation_checkpoints (
    proposal_id  TEXT    NOT NULL REFERENCES remediation_proposals (id),
    ord          BIGINT  NOT NULL,
    due_ns       BIGINT  NOT NULL,
    evaluated_ns BIGINT,
    requests     BIGINT,
    errors       BIGINT,
    verdict      TEXT,
    PRIMARY KEY (proposal_id, ord)
);
CREATE INDEX checkpoints_due ON remediation_checkpoints (evaluated_ns, due_ns);

-- Receipts the watchdog issues for host-subject remediations.
CREATE TABLE remediation_receipts (
    proposal_id TEXT    NOT NULL REFERENCES remediation_proposals (id),
    kind        TEXT    NOT NULL,
    subject_key TEXT    NOT NULL,
    evidence    TEXT    NOT NULL REFERENCES envelopes (digest) ON DELETE RESTRICT,
    detail      TEXT    NOT NULL,
    created_ns  BIGINT  NOT NULL,
    PRIMARY KEY (proposal_id, kind)
);
CREATE INDEX remediation_receipts_evidence ON remediation_receipts (evidence);

-- Human operators of the approval page (`pstack-store users create`):
-- argon2id PHC strings. Sessions are stored by SHA-256 of the cookie value;
-- the CSRF token is per session.
CREATE TABLE operators (
    username      TEXT    PRIMARY KEY,
    password_hash TEXT    NOT NULL,
    created_ns    BIGINT  NOT NULL
);
CREATE TABLE operator_sessions (
    id_hash    TEXT    PRIMARY KEY,
    username   TEXT    NOT NULL REFERENCES operators (username) ON DELETE CASCADE,
    csrf_token TEXT    NOT NULL,
    created_ns BIGINT  NOT NULL,
    expires_ns BIGINT  NOT NULL
);
