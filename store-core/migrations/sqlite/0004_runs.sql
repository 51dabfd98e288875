-- pstack-store schema v4 (sqlite): supervised investigation runs (seed 003 on
-- seed 001's agent loop). Nothing here holds what an agent attempted: run
-- state is classes, step ids, sequence numbers, reason codes, envelope
-- digests and subject keys (src/runs/supervisor.rs).

-- Operator-registered step graphs; (name, version) is immutable once
-- registered (a different body under the same pair is refused).
CREATE TABLE run_graphs (
    name         TEXT    NOT NULL,
    version      TEXT    NOT NULL,
    content_hash TEXT    NOT NULL,
    graph_json   TEXT    NOT NULL,
    key_id       TEXT    NOT NULL,
    created_ns   INTEGER NOT NULL,
    PRIMARY KEY (name, version)
);

-- One row per run; every change is one conditional update on revision.
CREATE TABLE runs (
    id             TEXT    PRIMARY KEY,
    graph_name     TEXT    NOT NULL,
    graph_version  TEXT    NOT NULL,
    content_hash   TEXT    NOT NULL,
    status         TEXT    NOT NULL,
    state_json     TEXT    NOT NULL,
    revision       INTEGER NOT NULL,
    key_id         TEXT    NOT NULL,
    created_ns     INTEGER NOT NULL,
    updated_ns     INTEGER NOT NULL,
    ended_ns       INTEGER
);
CREATE INDEX runs_created ON runs (created_ns);

-- The typed-failure receipt of a run that ended failed (seed 001: "success
-- or typed-failure receipt"): where, which class (null: the run recorded
-- none and the operator has not classified it), and the envelopes cited.
CREATE TABLE run_failure_receipts (
    run_id          TEXT    PRIMARY KEY REFERENCES runs (id),
    failed_step_id  TEXT,
    failure_class   TEXT,
    subject_key     TEXT,
    pre_digest      TEXT,
    post_digest     TEXT,
    created_ns      INTEGER NOT NULL
);
