-- pstack-store schema v1 (PostgreSQL). Exact sealed bytes live in envelopes.body.
CREATE TABLE envelopes (
    id           BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    digest       TEXT    NOT NULL UNIQUE,
    subject_key  TEXT    NOT NULL,
    kind         TEXT    NOT NULL,
    locator      TEXT    NOT NULL,
    pid          BIGINT,
    identity     TEXT    NOT NULL,
    wall_ns      BIGINT  NOT NULL,
    received_ns  BIGINT  NOT NULL,
    completeness TEXT    NOT NULL,
    key_id       TEXT    NOT NULL,
    size         BIGINT  NOT NULL,
    body         BYTEA   NOT NULL
);
-- Envelopes are hashed, high-entropy JSON already shipped gzip: store them
-- out of line without TOAST compression (saves CPU at ingest).
ALTER TABLE envelopes ALTER COLUMN body SET STORAGE EXTERNAL;
CREATE INDEX envelopes_locator  ON envelopes (kind, locator, pid, wall_ns, digest);
CREATE INDEX envelopes_received ON envelopes (received_ns);

CREATE TABLE unknowns (
    digest   TEXT    NOT NULL REFERENCES envelopes (digest) ON DELETE CASCADE,
    ord      BIGINT  NOT NULL,
    question TEXT    NOT NULL,
    blocks   TEXT    NOT NULL,
    owner    TEXT    NOT NULL,
    probe    TEXT    NOT NULL,
    surface  TEXT,
    PRIMARY KEY (digest, ord)
);

CREATE TABLE subjects (
    subject_key    TEXT    PRIMARY KEY,
    kind           TEXT    NOT NULL,
    identity       TEXT    NOT NULL,
    latest_digest  TEXT    NOT NULL,
    latest_wall_ns BIGINT  NOT NULL
);
CREATE INDEX subjects_latest ON subjects (latest_wall_ns);

CREATE TABLE api_keys (
    id         TEXT    PRIMARY KEY,
    name       TEXT    NOT NULL,
    key_hash   TEXT    NOT NULL,
    created_ns BIGINT  NOT NULL,
    revoked_ns BIGINT
);

CREATE TABLE receipts (
    id          BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    subject_key TEXT    NOT NULL,
    change_id   TEXT    NOT NULL,
    kind        TEXT    NOT NULL,
    revision    TEXT,
    realized_ns BIGINT,
    soak_ms     BIGINT,
    note        TEXT,
    key_id      TEXT    NOT NULL,
    created_ns  BIGINT  NOT NULL,
    UNIQUE (subject_key, change_id, kind)
);

-- RESTRICT: the database itself refuses to drop an envelope a receipt cites.
CREATE TABLE receipt_evidence (
    receipt_id BIGINT  NOT NULL REFERENCES receipts (id),
    digest     TEXT    NOT NULL REFERENCES envelopes (digest) ON DELETE RESTRICT,
    PRIMARY KEY (receipt_id, digest)
);
CREATE INDEX receipt_evidence_digest ON receipt_evidence (digest);
