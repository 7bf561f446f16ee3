-- The outcome and code indexes of the audit trail leave allows out (docs/decisions/0037).
--
-- Most records are allows, and an allow is found by who, what, which account or when (the
-- principal, capability, account and time indexes), never by being an allow: a query for allows
-- in a time range is most of that range. Each index an appended row enters costs the writer a
-- B-tree insertion under the partition's lock, so these two now hold only the rows they are for:
-- `(outcome, at)` the records that are not allows, `(code, at)` the codes other than `granted`.
-- Measured: PostgreSQL's own CPU per appended allow row ×0.87 (docs/benchmarks.md).
--
-- A query uses them when its conditions imply theirs: PostgreSQL proves `outcome = 'deny'` or
-- `code = 'limit_exhausted'` written with constants; the store's own queries, which bind their
-- values, also say `outcome <> 'allow'` / `code <> 'granted'` (src/store/sql.rs).
--
-- Rebuilt on every partition; the build blocks writes to the trail while it runs (see
-- docs/operations.md, "Upgrading": with millions of rows, migrate in a quiet moment).
DROP INDEX audit_log_outcome_at;
DROP INDEX audit_log_code_at;
CREATE INDEX audit_log_outcome_at ON audit_log (outcome, at) WHERE outcome <> 'allow';
CREATE INDEX audit_log_code_at ON audit_log (code, at) WHERE code <> 'granted';
