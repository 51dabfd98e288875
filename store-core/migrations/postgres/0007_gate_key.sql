-- pstack-store schema v7 (postgres): the fingerprint of the gate key the
-- store's grants and sealed callbacks were made under
-- (src/gate/shared_key.rs, src/db/gate_key.rs).

-- At most one row. The first `serve` with a --gate-key-file records its
-- key's fingerprint (a keyed hash, never the key); every later start
-- compares, so a replica with another key refuses to start instead of
-- answering 403 invalid_grant_token for grants minted elsewhere.
CREATE TABLE gate_key (
    id           SMALLINT PRIMARY KEY CHECK (id = 1),
    fingerprint  TEXT     NOT NULL,
    recorded_ns  BIGINT   NOT NULL
);
