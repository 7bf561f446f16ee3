-- A request_id answers only for the request it was first used for
-- (docs/decisions/0027-a-request-id-answers-only-its-request.md).
--
-- The claim and the remembered answer carry the fingerprint of the request that first claimed the
-- id: an HMAC-SHA256 over the door, the gateway, the caller as presented, the target and the
-- door's own facts, under the deployment's key. Rows from before have none (NULL) and match no
-- request. Nullable columns without a default: only the catalog changes.
ALTER TABLE request_claims ADD COLUMN fingerprint BYTEA;
ALTER TABLE remembered_responses ADD COLUMN fingerprint BYTEA;

-- The deployment's fingerprint key: 32 random bytes, drawn by the first replica that starts on
-- this database (capgate, not this migration, draws them) and read by every replica at start.
CREATE TABLE request_key (
    id  BOOLEAN PRIMARY KEY DEFAULT TRUE CHECK (id),
    key BYTEA   NOT NULL CHECK (length(key) = 32)
);

-- Two more outcomes: a retry answered with its first answer (`replayed`), and a request refused
-- because its id was already used for another request (`request_id_reused`); both name the
-- decision the id belongs to. The old check is narrower than the new one, so every stored row
-- satisfies the new one: NOT VALID skips a scan of the whole trail under an exclusive lock, and
-- every row written from now on is checked.
ALTER TABLE audit_log ADD COLUMN first_decision_id TEXT;
ALTER TABLE audit_log
    DROP CONSTRAINT audit_log_outcome_check,
    ADD CONSTRAINT audit_log_outcome_check CHECK (outcome IN (
        'allow', 'deny', 'unauthenticated', 'unknown_tool', 'replayed', 'request_id_reused'
    )) NOT VALID;
