-- A third kind of note, `answer_lost` (see the PostgreSQL migration of the same name). SQLite
-- cannot change a CHECK in place, so the table is made again inside this migration's transaction
-- (a new table, the rows copied, the old one dropped, the new one renamed, the index made again).
CREATE TABLE decision_notes_new (
    decision_id TEXT    NOT NULL,
    kind        TEXT    NOT NULL CHECK (kind IN ('credential_failed', 'upstream_failed', 'answer_lost')),
    at          INTEGER NOT NULL,
    gateway     TEXT    NOT NULL,
    detail      TEXT    NOT NULL,
    PRIMARY KEY (decision_id, kind)
);
INSERT INTO decision_notes_new (decision_id, kind, at, gateway, detail)
    SELECT decision_id, kind, at, gateway, detail FROM decision_notes;
DROP TABLE decision_notes;
ALTER TABLE decision_notes_new RENAME TO decision_notes;
CREATE INDEX decision_notes_at ON decision_notes (at);
