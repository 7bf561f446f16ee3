-- capgate's tables on SQLite: the same tables as migrations/postgres/0001_init.sql (read its
-- comments), in SQLite's types. STRICT tables refuse a value of the wrong type, as PostgreSQL does.
--
-- Times are INTEGER milliseconds since the Unix epoch.

-- `revision INTEGER PRIMARY KEY` is the rowid: the next one is the largest plus one, and rows are
-- never deleted, so revisions are monotonic and start at 1.
CREATE TABLE policy_versions (
    revision   INTEGER PRIMARY KEY,
    version    TEXT    NOT NULL,
    artifact   TEXT    NOT NULL,
    catalog    TEXT,
    author     TEXT    NOT NULL,
    comment    TEXT    NOT NULL,
    created_at INTEGER NOT NULL
) STRICT;

-- The single active pointer. Changes to it run in BEGIN IMMEDIATE transactions, which hold the
-- database's one write lock.
CREATE TABLE active_policy (
    id       INTEGER PRIMARY KEY CHECK (id = 1),
    revision INTEGER REFERENCES policy_versions (revision)
) STRICT;
INSERT INTO active_policy (id, revision) VALUES (1, NULL);

CREATE TABLE usage_counters (
    principal_id TEXT    NOT NULL,
    capability   TEXT    NOT NULL,
    window_start INTEGER NOT NULL,
    calls        INTEGER NOT NULL CHECK (calls >= 0),
    PRIMARY KEY (principal_id, capability)
) STRICT, WITHOUT ROWID;

CREATE TABLE audit_log (
    decision_id     TEXT    PRIMARY KEY,
    at              INTEGER NOT NULL,
    request_id      TEXT,
    gateway         TEXT    NOT NULL,
    kind            TEXT    NOT NULL CHECK (kind IN ('decide', 'list')),
    outcome         TEXT    NOT NULL CHECK (outcome IN ('allow', 'deny', 'unauthenticated', 'unknown_tool')),
    code            TEXT,
    path            TEXT,
    principal_id    TEXT,
    issuer          TEXT,
    subject         TEXT,
    capability      TEXT,
    tool            TEXT,
    account_id      TEXT,
    limit_calls     INTEGER,
    limit_per       TEXT,
    usage_calls     INTEGER,
    policy_version  TEXT,
    policy_revision INTEGER
) STRICT;

CREATE INDEX audit_log_at ON audit_log (at);
CREATE INDEX audit_log_principal_at ON audit_log (principal_id, at);
CREATE INDEX audit_log_capability_at ON audit_log (capability, at);
CREATE INDEX audit_log_outcome_at ON audit_log (outcome, at);
CREATE INDEX audit_log_code_at ON audit_log (code, at);
CREATE INDEX audit_log_account_at ON audit_log (account_id, at);

CREATE TABLE remembered_responses (
    gateway     TEXT    NOT NULL,
    request_id  TEXT    NOT NULL,
    decision_id TEXT    NOT NULL,
    response    BLOB    NOT NULL,
    at          INTEGER NOT NULL,
    PRIMARY KEY (gateway, request_id)
) STRICT;
CREATE INDEX remembered_responses_at ON remembered_responses (at);
