-- pstack-store schema v11 (sqlite): envelope bodies kept as LZ4 blocks when
-- that is smaller (src/db/body.rs), and the claims' codes beside them so a
-- search by claim reads no body.
--
-- body_codec: 0 = the bytes as received, 1 = an LZ4 block of them (decoded
-- length prepended). Rows stored before this version are raw: the default.
-- claim_codes: the claims' codes as a JSON array of strings; NULL on rows
-- stored before this version (their raw bodies are read instead). Both
-- columns are added without rewriting a row.
ALTER TABLE envelopes ADD COLUMN body_codec INTEGER NOT NULL DEFAULT 0;
ALTER TABLE envelopes ADD COLUMN claim_codes TEXT;
