-- pstack-store schema v8 (postgres): the hypothesis ledger (seed 001, agent
-- loop: "updated hypothesis state") and what the acceptance metrics (AC1)
-- need of runs. Rules: src/runs/hypotheses.rs; docs: docs/runs.md.

-- The subject a run bound and its report outcome, kept beside its state so
-- a run on a subject another run settled within the repeat window is found
-- without reading run states.
ALTER TABLE runs ADD COLUMN subject_key TEXT;
ALTER TABLE runs ADD COLUMN outcome TEXT;
CREATE INDEX runs_subject ON runs (subject_key, graph_name, ended_ns);

-- One row per hypothesis of a subject; hyp_key is h: + 16 hex digits of
-- SHA-256(code, surfaces). Rows change only inside the ledger's
-- transaction (one subject at a time).
CREATE TABLE hypotheses (
    subject_key    TEXT    NOT NULL,
    hyp_key        TEXT    NOT NULL,
    code           TEXT    NOT NULL,
    statement      TEXT    NOT NULL,
    falsifier      TEXT    NOT NULL,
    surfaces_json  TEXT    NOT NULL,
    effects_json   TEXT    NOT NULL,
    state          TEXT    NOT NULL,
    opened_wall_ns BIGINT  NOT NULL,
    updated_ns     BIGINT  NOT NULL,
    PRIMARY KEY (subject_key, hyp_key)
);

-- Every move, append-only: which envelope, recorded by which run, moved
-- which hypothesis from what to what, by which rule. Retention keeps the
-- envelopes cited here.
CREATE TABLE hypothesis_moves (
    subject_key TEXT    NOT NULL,
    hyp_key     TEXT    NOT NULL,
    seq         BIGINT  NOT NULL,
    digest      TEXT    NOT NULL,
    run_id      TEXT    NOT NULL,
    from_state  TEXT,
    to_state    TEXT    NOT NULL,
    rule        TEXT    NOT NULL,
    at_ns       BIGINT  NOT NULL,
    PRIMARY KEY (subject_key, hyp_key, seq)
);
CREATE INDEX hypothesis_moves_digest ON hypothesis_moves (digest);
CREATE INDEX hypothesis_moves_run ON hypothesis_moves (run_id);
