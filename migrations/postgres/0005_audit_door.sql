-- Which protocol a request came through: capgate's own gRPC API (`capgate`), Envoy's ext_authz
-- (`ext_authz`), agentgateway's ExtMCP (`ext_mcp`) or AuthZEN (`authzen`). Every record written
-- before the other doors existed came through capgate's own, which the default says; a constant
-- default makes this a catalog-only change, whatever the table's size.
ALTER TABLE audit_log ADD COLUMN door TEXT NOT NULL DEFAULT 'capgate';
