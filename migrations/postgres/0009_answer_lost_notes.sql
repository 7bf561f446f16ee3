-- A third kind of note, `answer_lost`: capgate's own correction when the commit that stored a
-- record lost its answer and the caller was answered otherwise (a capped call denied
-- `usage_unknown`, or no answer at all) — the record may say `allow` while the caller got
-- something else (docs/decisions/0031-a-lost-commit-answer-is-corrected.md). Changing a CHECK is
-- a catalog change here; the table is small (notes are rare).
ALTER TABLE decision_notes DROP CONSTRAINT decision_notes_kind_check;
ALTER TABLE decision_notes ADD CONSTRAINT decision_notes_kind_check
    CHECK (kind IN ('credential_failed', 'upstream_failed', 'answer_lost'));
