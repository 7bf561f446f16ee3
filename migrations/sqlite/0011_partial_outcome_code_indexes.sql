-- The outcome and code indexes of the audit trail leave allows out (docs/decisions/0037): most
-- records are allows, found by who, what, which account or when, never by being an allow, and each
-- index an appended row enters is work for the one writer. `(outcome, at)` holds the records that
-- are not allows, `(code, at)` the codes other than `granted`. SQLite uses a partial index only when
-- the query states its condition: the store's queries say `outcome <> 'allow'` / `code <> 'granted'`
-- beside the value they look for (src/store/sql.rs).
DROP INDEX audit_log_outcome_at;
DROP INDEX audit_log_code_at;
CREATE INDEX audit_log_outcome_at ON audit_log (outcome, at) WHERE outcome <> 'allow';
CREATE INDEX audit_log_code_at ON audit_log (code, at) WHERE code <> 'granted';
