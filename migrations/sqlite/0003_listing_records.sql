-- A listing is audited as one record: how many capabilities it showed and which (the ids,
-- separated by spaces, bounded). The same columns as migrations/postgres/0004_listing_records.sql
-- (read its comments); NULL on a decision's record.
ALTER TABLE audit_log ADD COLUMN visible_count INTEGER CHECK (visible_count >= 0);
ALTER TABLE audit_log ADD COLUMN visible TEXT;
