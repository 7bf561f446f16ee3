-- Which protocol a request came through (see the PostgreSQL migration of the same name).
ALTER TABLE audit_log ADD COLUMN door TEXT NOT NULL DEFAULT 'capgate';
