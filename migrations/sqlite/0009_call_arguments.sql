-- A decision's digest of the call's arguments, and what the operator opted in to keep of them
-- (see the PostgreSQL migration of the same name). Nullable columns without a default: SQLite adds
-- them without rewriting the table.
ALTER TABLE audit_log ADD COLUMN arguments_digest TEXT;
ALTER TABLE audit_log ADD COLUMN arguments TEXT;
ALTER TABLE audit_log ADD COLUMN arguments_omitted INTEGER CHECK (arguments_omitted >= 0);
