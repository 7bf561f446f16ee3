-- capgate's tables on PostgreSQL (service.md §1, §2, §4, §5). migrations/sqlite/0001_init.sql holds
-- the same tables for SQLite; the behavioural suite (tests/store.rs) runs against both.
--
-- Times are BIGINT milliseconds since the Unix epoch, in both dialects: exact, identical, and what
-- the core computes with.

-- Every published policy version. Rows are only ever inserted.
CREATE TABLE policy_versions (
    revision   BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    version    TEXT   NOT NULL,  -- sha256:<hex> of the artifact
    artifact   TEXT   NOT NULL,
    catalog    TEXT,
    author     TEXT   NOT NULL,
    comment    TEXT   NOT NULL,
    created_at BIGINT NOT NULL
);

-- The single active pointer: exactly one row, NULL until a version is published. Publishing and
-- activating lock this row first (SELECT ... FOR UPDATE), which serialises every change of the
-- active version across replicas.
CREATE TABLE active_policy (
    id       BOOLEAN PRIMARY KEY DEFAULT TRUE CHECK (id),
    revision BIGINT REFERENCES policy_versions (revision)
);
INSERT INTO active_policy (id, revision) VALUES (TRUE, NULL);

-- Usage counters: calls counted in the fixed window that opened at window_start (service.md §4).
-- Only calls and window_start change, and no index covers them, so with free space left in each
-- page (fillfactor) the hot updates stay heap-only and need no index maintenance.
CREATE TABLE usage_counters (
    principal_id TEXT   NOT NULL,
    capability   TEXT   NOT NULL,
    window_start BIGINT NOT NULL,
    calls        BIGINT NOT NULL CHECK (calls >= 0),
    PRIMARY KEY (principal_id, capability)
) WITH (fillfactor = 70);

-- The audit trail (service.md §5): one row per decision, never updated. No foreign key points into
-- it or out of it, so that it can be partitioned by time later (its primary key then becomes
-- (decision_id, at), which the inserts' target-less ON CONFLICT DO NOTHING already allows).
CREATE TABLE audit_log (
    decision_id     TEXT   PRIMARY KEY,  -- UUIDv7
    at              BIGINT NOT NULL,
    request_id      TEXT,
    gateway         TEXT   NOT NULL,
    kind            TEXT   NOT NULL CHECK (kind IN ('decide', 'list')),
    outcome         TEXT   NOT NULL CHECK (outcome IN ('allow', 'deny', 'unauthenticated', 'unknown_tool')),
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
);

-- The usual questions, newest first: everything lately; by principal; by capability; by outcome;
-- by code. Each is an equality followed by `at`, so `WHERE x = $1 ORDER BY at DESC LIMIT n` reads
-- the newest n index entries and stops.
CREATE INDEX audit_log_at ON audit_log (at);
CREATE INDEX audit_log_principal_at ON audit_log (principal_id, at);
CREATE INDEX audit_log_capability_at ON audit_log (capability, at);
CREATE INDEX audit_log_outcome_at ON audit_log (outcome, at);
CREATE INDEX audit_log_code_at ON audit_log (code, at);
CREATE INDEX audit_log_account_at ON audit_log (account_id, at);

-- Idempotency (service.md §4): the response first returned to a gateway for a request id. `at`
-- (the decision's time) lets expired entries be recognised and pruned.
CREATE TABLE remembered_responses (
    gateway     TEXT   NOT NULL,
    request_id  TEXT   NOT NULL,
    decision_id TEXT   NOT NULL,
    response    BYTEA  NOT NULL,
    at          BIGINT NOT NULL,
    PRIMARY KEY (gateway, request_id)
);
CREATE INDEX remembered_responses_at ON remembered_responses (at);
