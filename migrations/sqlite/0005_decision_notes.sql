-- What a gateway noted after an allow (see the PostgreSQL migration of the same name).
CREATE TABLE decision_notes (
    decision_id TEXT    NOT NULL,
    kind        TEXT    NOT NULL CHECK (kind IN ('credential_failed', 'upstream_failed')),
    at          INTEGER NOT NULL,
    gateway     TEXT    NOT NULL,
    detail      TEXT    NOT NULL,
    PRIMARY KEY (decision_id, kind)
);
CREATE INDEX decision_notes_at ON decision_notes (at);
