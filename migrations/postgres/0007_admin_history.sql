-- Who changed what the service decides with, and when: every activation of a policy version (a
-- publish that stored and activated one, or an `ActivatePolicy`, a rollback or a roll-forward), and
-- every usage counter an admin reset. Written in the transaction that made the change, so a change
-- without its row cannot commit; never updated. `actor` is the admin token's name (`serve --policy` for
-- the file published at start-up, `loopback` without tokens). `from_revision` is NULL when nothing was active.
CREATE TABLE policy_activations (
    id            BIGSERIAL PRIMARY KEY,
    at            BIGINT NOT NULL,
    actor         TEXT   NOT NULL,
    kind          TEXT   NOT NULL CHECK (kind IN ('publish', 'rollback')),
    from_revision BIGINT,
    to_revision   BIGINT NOT NULL REFERENCES policy_versions (revision)
);

-- A usage counter an admin reset: what it read when it went (`calls` in the window opened at
-- `window_start`), so that the calls it forgave stay on record.
CREATE TABLE usage_resets (
    id           BIGSERIAL PRIMARY KEY,
    at           BIGINT NOT NULL,
    actor        TEXT   NOT NULL,
    principal_id TEXT   NOT NULL,
    capability   TEXT   NOT NULL,
    calls        BIGINT NOT NULL CHECK (calls >= 0),
    window_start BIGINT NOT NULL
);
CREATE INDEX usage_resets_principal ON usage_resets (principal_id, capability, at);
