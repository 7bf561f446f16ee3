-- A decision about a tool call whose arguments were forwarded (a version 2 policy's conditions
-- read them) keeps `arguments_digest`, `sha256:<hex>` of their canonical JSON; never their values,
-- unless the operator opted in (`serve --audit-arguments`), and then redacted (`arguments`) or,
-- over 16 KiB, only their size (`arguments_omitted`). Nullable columns without a default: only
-- the catalog changes, on the partitioned table and every partition at once.
ALTER TABLE audit_log
    ADD COLUMN arguments_digest TEXT,
    ADD COLUMN arguments TEXT,
    ADD COLUMN arguments_omitted BIGINT;
