-- A claim on `(gateway, request_id)`, taken before a decision with that request id is made, so
-- that processes sharing this file make one decision per request id between them
-- (docs/decisions/0016-idempotency-across-replicas.md). See the PostgreSQL migration of the same
-- name for the full story.
CREATE TABLE request_claims (
    gateway    TEXT    NOT NULL,
    request_id TEXT    NOT NULL,
    claimed_at INTEGER NOT NULL,
    PRIMARY KEY (gateway, request_id)
) STRICT;
CREATE INDEX request_claims_claimed_at ON request_claims (claimed_at);
