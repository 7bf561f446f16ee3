-- A claim on `(gateway, request_id)`, taken before a decision with that request id is made, so
-- that copies of one request sent to different replicas make one decision between them
-- (docs/decisions/0016-idempotency-across-replicas.md). The claim's holder writes the answer to
-- remembered_responses with its audit record; the other copies wait for that answer. A claim
-- older than the lease whose answer never arrived (its replica died mid-decision) may be taken
-- over; `claimed_at` is when it was last taken, in milliseconds since the Unix epoch.
CREATE TABLE request_claims (
    gateway    TEXT   NOT NULL,
    request_id TEXT   NOT NULL,
    claimed_at BIGINT NOT NULL,
    PRIMARY KEY (gateway, request_id)
);
CREATE INDEX request_claims_claimed_at ON request_claims (claimed_at);
