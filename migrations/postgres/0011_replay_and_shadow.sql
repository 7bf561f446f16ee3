-- Replay and shadow versions (docs/decisions/0035).
--
-- `attributes`: the normalised principal's attributes a decision or a listing was taken on, as a
-- JSON object of strings (never credential material: the core's principal holds none). With
-- `issuer` and `subject`, what `capgate replay` decides a record again on; NULL on a record
-- written before this column, which replay reports as not replayable rather than guess.
ALTER TABLE audit_log ADD COLUMN attributes TEXT;

-- The one shadow pointer: the version every replica evaluates beside the active one on live
-- traffic, never changing an answer. NULL when there is none. Locked with the active pointer's
-- row when a publish or an activation changes either.
CREATE TABLE shadow_policy (
    id       BOOLEAN PRIMARY KEY DEFAULT TRUE CHECK (id),
    revision BIGINT REFERENCES policy_versions (revision),
    set_at   BIGINT,
    set_by   TEXT
);
INSERT INTO shadow_policy (id, revision) VALUES (TRUE, NULL);

-- Where the shadow version decided otherwise than the active one: one row per differing decision
-- or listing, written in the transaction that stores the audit record of the same decision_id.
-- Pruned past the retention `serve --shadow-retention` names (7 days by default).
CREATE TABLE shadow_differences (
    decision_id        TEXT   PRIMARY KEY,
    at                 BIGINT NOT NULL,
    kind               TEXT   NOT NULL CHECK (kind IN ('decide', 'list')),
    transition         TEXT   NOT NULL,
    active_revision    BIGINT NOT NULL,
    shadow_revision    BIGINT NOT NULL,
    principal_id       TEXT,
    capability         TEXT,
    tool               TEXT,
    active_outcome     TEXT   NOT NULL,
    active_code        TEXT,
    active_path        TEXT,
    active_account     TEXT,
    active_limit_calls BIGINT,
    active_limit_per   TEXT,
    shadow_outcome     TEXT   NOT NULL,
    shadow_code        TEXT,
    shadow_path        TEXT,
    shadow_account     TEXT,
    shadow_limit_calls BIGINT,
    shadow_limit_per   TEXT,
    gained             TEXT,
    lost               TEXT
);
CREATE INDEX shadow_differences_at ON shadow_differences (at);
