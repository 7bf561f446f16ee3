-- audit_log becomes a table partitioned by range of `at`, one partition per calendar month in UTC
-- (docs/decisions/0009-audit-partitioning.md), so that retention drops whole partitions instead of
-- deleting rows. No row is lost: the rows move to the new table inside this migration's
-- transaction, which locks the old table against writes first.
--
-- Partitions are named audit_log_pYYYY_MM and hold [first instant of the month, first instant of
-- the next) in milliseconds; rows before 0001-01-01 or from 10000-01-01 on (a broken clock) go to
-- audit_log_p_before / audit_log_p_after. src/periphery/store/retention.rs computes the same names
-- and bounds; the store creates the partitions of the coming months ahead of time and any other one
-- on demand, so this migration creates only those the existing rows need.
--
-- The primary key becomes (decision_id, at): PostgreSQL requires a unique constraint of a
-- partitioned table to include the partition key. The inserts' target-less ON CONFLICT DO NOTHING
-- keeps skipping a record already stored, because a replayed record carries the `at` it was made
-- with.

-- Writers wait (old replicas during a rolling upgrade: their batches time out into the spool);
-- readers go on. Nothing can be inserted between the copy and the drop below.
LOCK TABLE audit_log IN EXCLUSIVE MODE;

CREATE TABLE audit_log_partitioned (
    decision_id     TEXT   NOT NULL,  -- UUIDv7
    at              BIGINT NOT NULL,
    request_id      TEXT,
    gateway         TEXT   NOT NULL,
    kind            TEXT   NOT NULL
        CONSTRAINT audit_log_kind_check CHECK (kind IN ('decide', 'list')),
    outcome         TEXT   NOT NULL
        CONSTRAINT audit_log_outcome_check CHECK (outcome IN ('allow', 'deny', 'unauthenticated', 'unknown_tool')),
    code            TEXT,
    path            TEXT,
    principal_id    TEXT,
    issuer          TEXT,
    subject         TEXT,
    capability      TEXT,
    tool            TEXT,
    account_id      TEXT,
    limit_calls     BIGINT,
    limit_per       TEXT,
    usage_calls     BIGINT,
    policy_version  TEXT,
    policy_revision BIGINT
) PARTITION BY RANGE (at);

-- The partitions the existing rows need. Months are computed on whole seconds (floor), so a row
-- one millisecond before a month's first instant stays in the month before.
DO $$
DECLARE
    months_start CONSTANT BIGINT := -62135596800000;  -- 0001-01-01T00:00:00Z
    months_end   CONSTANT BIGINT := 253402300800000;  -- 10000-01-01T00:00:00Z
    month        TIMESTAMP;
BEGIN
    IF EXISTS (SELECT 1 FROM audit_log WHERE at < months_start) THEN
        EXECUTE format(
            'CREATE TABLE audit_log_p_before PARTITION OF audit_log_partitioned '
            'FOR VALUES FROM (MINVALUE) TO (%s)', months_start);
    END IF;
    IF EXISTS (SELECT 1 FROM audit_log WHERE at >= months_end) THEN
        EXECUTE format(
            'CREATE TABLE audit_log_p_after PARTITION OF audit_log_partitioned '
            'FOR VALUES FROM (%s) TO (MAXVALUE)', months_end);
    END IF;
    FOR month IN
        SELECT DISTINCT date_trunc('month', to_timestamp(floor(at / 1000.0)) AT TIME ZONE 'UTC')
        FROM audit_log
        WHERE at >= months_start AND at < months_end
    LOOP
        -- `extract(epoch FROM timestamp)` reads a timestamp without time zone as UTC.
        EXECUTE format(
            'CREATE TABLE %I PARTITION OF audit_log_partitioned FOR VALUES FROM (%s) TO (%s)',
            'audit_log_p' || to_char(month, 'YYYY_MM'),
            (extract(epoch FROM month) * 1000)::BIGINT,
            (extract(epoch FROM month + INTERVAL '1 month') * 1000)::BIGINT);
    END LOOP;
END
$$;

INSERT INTO audit_log_partitioned (decision_id, at, request_id, gateway, kind, outcome, code, path,
    principal_id, issuer, subject, capability, tool, account_id, limit_calls, limit_per, usage_calls,
    policy_version, policy_revision)
SELECT decision_id, at, request_id, gateway, kind, outcome, code, path,
    principal_id, issuer, subject, capability, tool, account_id, limit_calls, limit_per, usage_calls,
    policy_version, policy_revision
FROM audit_log;

DROP TABLE audit_log;
ALTER TABLE audit_log_partitioned RENAME TO audit_log;

-- Built after the copy (one sort per index rather than row-by-row upkeep). The same indexes as
-- 0001, each created on every partition, present and future.
ALTER TABLE audit_log ADD CONSTRAINT audit_log_pkey PRIMARY KEY (decision_id, at);
CREATE INDEX audit_log_at ON audit_log (at);
CREATE INDEX audit_log_principal_at ON audit_log (principal_id, at);
CREATE INDEX audit_log_capability_at ON audit_log (capability, at);
CREATE INDEX audit_log_outcome_at ON audit_log (outcome, at);
CREATE INDEX audit_log_code_at ON audit_log (code, at);
CREATE INDEX audit_log_account_at ON audit_log (account_id, at);
