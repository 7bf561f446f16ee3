-- A listing is audited as one record instead of one per visible capability
-- (docs/decisions/0015-bounded-listing-and-publish.md): a grant set of 20,000 capabilities made
-- every ListVisible a 20,000-row transaction. The listing's record says how many capabilities it
-- showed and which: their ids, separated by spaces, as many as fit the service's bound (16 KiB).
-- Both are NULL on a decision's record.
--
-- Nullable columns without a default: PostgreSQL changes only the catalog, on the partitioned table
-- and on every partition, present and future; no row is rewritten.
ALTER TABLE audit_log
    ADD COLUMN visible_count BIGINT CHECK (visible_count >= 0),
    ADD COLUMN visible       TEXT;
