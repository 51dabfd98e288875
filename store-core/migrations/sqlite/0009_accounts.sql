-- pstack-store schema v9 (sqlite): operator accounts and the shared login
-- throttle (src/operators.rs, src/login.rs, src/db/operators.rs,
-- src/db/login_throttle.rs).

-- CSRF tokens are stored only as their SHA-256 from now on. A session made
-- before kept its token in the clear (and a token that is not derived from
-- the session id): every such session ends here; operators log in again.
DELETE FROM operator_sessions;
ALTER TABLE operator_sessions RENAME COLUMN csrf_token TO csrf_hash;
CREATE INDEX operator_sessions_username ON operator_sessions (username);

-- `users disable`: a disabled operator cannot log in and has no session.
ALTER TABLE operators ADD COLUMN disabled_ns INTEGER;

-- Failed logins per key ('source:ADDR', 'pair:NAMEHASH@ADDR',
-- 'name:NAMEHASH'), shared by every replica on this database. Bounded by
-- eviction (expired windows, then fewest failures, oldest first), never
-- cleared.
CREATE TABLE login_throttle (
    throttle_key    TEXT    PRIMARY KEY,
    failures        INTEGER NOT NULL,
    window_start_ns INTEGER NOT NULL,
    last_ns         INTEGER NOT NULL
) WITHOUT ROWID;

-- Eviction walks these instead of sorting the table.
CREATE INDEX login_throttle_window ON login_throttle (window_start_ns);
CREATE INDEX login_throttle_eviction ON login_throttle (failures, last_ns);

-- Where each operator has logged in successfully: such a source is exempt
-- from the per-name budget, so strangers cannot lock an operator out of it.
CREATE TABLE operator_known_sources (
    username        TEXT    NOT NULL REFERENCES operators (username) ON DELETE CASCADE,
    source          TEXT    NOT NULL,
    last_success_ns INTEGER NOT NULL,
    PRIMARY KEY (username, source)
) WITHOUT ROWID;
