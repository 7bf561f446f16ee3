-- Activations and usage resets (see the PostgreSQL migration of the same name).
CREATE TABLE policy_activations (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    at            INTEGER NOT NULL,
    actor         TEXT    NOT NULL,
    kind          TEXT    NOT NULL CHECK (kind IN ('publish', 'rollback')),
    from_revision INTEGER,
    to_revision   INTEGER NOT NULL REFERENCES policy_versions (revision)
) STRICT;

CREATE TABLE usage_resets (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    at           INTEGER NOT NULL,
    actor        TEXT    NOT NULL,
    principal_id TEXT    NOT NULL,
    capability   TEXT    NOT NULL,
    calls        INTEGER NOT NULL CHECK (calls >= 0),
    window_start INTEGER NOT NULL
) STRICT;
CREATE INDEX usage_resets_principal ON usage_resets (principal_id, capability, at);
