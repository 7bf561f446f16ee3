-- A request_id answers only for the request it was first used for (see the PostgreSQL migration
-- of the same name, and docs/decisions/0027-a-request-id-answers-only-its-request.md).
ALTER TABLE request_claims ADD COLUMN fingerprint BLOB;
ALTER TABLE remembered_responses ADD COLUMN fingerprint BLOB;

CREATE TABLE request_key (
    id  INTEGER PRIMARY KEY CHECK (id = 1),
    key BLOB    NOT NULL CHECK (length(key) = 32)
) STRICT;

-- Two more outcomes, `replayed` and `request_id_reused`, and the decision they name. SQLite
-- cannot change a table's CHECK in place, so the table is made again, as SQLite's documentation
-- prescribes (a new table, the rows copied, the old one dropped, the new one renamed, the indexes
-- made again), inside this migration's transaction: either all of it happens or none. The copy
-- takes time in proportion to the trail (about a second per million records on a laptop); the
-- service does not serve until migrations are done.
CREATE TABLE audit_log_new (
    decision_id       TEXT    PRIMARY KEY,
    at                INTEGER NOT NULL,
    request_id        TEXT,
    gateway           TEXT    NOT NULL,
    kind              TEXT    NOT NULL CHECK (kind IN ('decide', 'list')),
    outcome           TEXT    NOT NULL CHECK (outcome IN (
        'allow', 'deny', 'unauthenticated', 'unknown_tool', 'replayed', 'request_id_reused'
    )),
    code              TEXT,
    path              TEXT,
    principal_id      TEXT,
    issuer            TEXT,
    subject           TEXT,
    capability        TEXT,
    tool              TEXT,
    account_id        TEXT,
    limit_calls       INTEGER,
    limit_per         TEXT,
    usage_calls       INTEGER,
    policy_version    TEXT,
    policy_revision   INTEGER,
    visible_count     INTEGER CHECK (visible_count >= 0),
    visible           TEXT,
    door              TEXT    NOT NULL DEFAULT 'capgate',
    first_decision_id TEXT
) STRICT;

INSERT INTO audit_log_new (decision_id, at, request_id, gateway, kind, outcome, code, path,
    principal_id, issuer, subject, capability, tool, account_id, limit_calls, limit_per,
    usage_calls, policy_version, policy_revision, visible_count, visible, door)
SELECT decision_id, at, request_id, gateway, kind, outcome, code, path,
    principal_id, issuer, subject, capability, tool, account_id, limit_calls, limit_per,
    usage_calls, policy_version, policy_revision, visible_count, visible, door
FROM audit_log;

DROP TABLE audit_log;
ALTER TABLE audit_log_new RENAME TO audit_log;

CREATE INDEX audit_log_at ON audit_log (at);
CREATE INDEX audit_log_principal_at ON audit_log (principal_id, at);
CREATE INDEX audit_log_capability_at ON audit_log (capability, at);
CREATE INDEX audit_log_outcome_at ON audit_log (outcome, at);
CREATE INDEX audit_log_code_at ON audit_log (code, at);
CREATE INDEX audit_log_account_at ON audit_log (account_id, at);
