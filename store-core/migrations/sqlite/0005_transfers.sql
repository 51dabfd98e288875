-- pstack-store schema v5 (sqlite): both ends of a transfer joined
-- (src/transfers.rs, src/db/transfers.rs).

-- What each stream or storage-transfer envelope offers to the join: its own
-- view (`near`: "proto local remote", or the transfer id), the side it
-- stands for (a stream's subject key; a storage transfer's shipping key)
-- and its capture window. Gone with its envelope.
CREATE TABLE transfer_candidates (
    digest   TEXT    PRIMARY KEY REFERENCES envelopes (digest) ON DELETE CASCADE,
    basis    TEXT    NOT NULL,
    near     TEXT    NOT NULL,
    side_key TEXT    NOT NULL,
    start_ns INTEGER NOT NULL,
    end_ns   INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX transfer_candidates_near ON transfer_candidates (basis, near, start_ns);

-- One row per transfer; its id is derived from basis and join key, so the
-- two arrival orders make the same row.
CREATE TABLE transfers (
    id        TEXT    PRIMARY KEY,
    basis     TEXT    NOT NULL,
    join_key  TEXT    NOT NULL,
    linked_ns INTEGER NOT NULL
);

-- The joined envelopes, each with the side it belongs to.
CREATE TABLE transfer_ends (
    transfer_id TEXT    NOT NULL REFERENCES transfers (id) ON DELETE CASCADE,
    digest      TEXT    NOT NULL REFERENCES envelopes (digest) ON DELETE CASCADE,
    side_key    TEXT    NOT NULL,
    linked_ns   INTEGER NOT NULL,
    PRIMARY KEY (transfer_id, digest)
);
CREATE INDEX transfer_ends_digest ON transfer_ends (digest);
