-- What a gateway noted after an allow (`NoteDecision`): the account's secret could not be resolved,
-- or the upstream failed. Appended next to the audit trail, never into it: a record is never
-- updated. One note per kind per decision, so a retried call notes once. `at` is when it was noted;
-- `capgate audit prune` forgets the notes of the periods it removes.
CREATE TABLE decision_notes (
    decision_id TEXT   NOT NULL,
    kind        TEXT   NOT NULL CHECK (kind IN ('credential_failed', 'upstream_failed')),
    at          BIGINT NOT NULL,
    gateway     TEXT   NOT NULL,
    detail      TEXT   NOT NULL,
    PRIMARY KEY (decision_id, kind)
);
CREATE INDEX decision_notes_at ON decision_notes (at);
