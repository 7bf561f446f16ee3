//! MCP protocol revisions. The SDK this gateway is built on (1.32.2) knows
//! revisions up to 2025-11-25 and offers no option to add one, but it reads
//! the exported SUPPORTED_PROTOCOL_VERSIONS array both when it negotiates
//! `initialize` and when it checks the `MCP-Protocol-Version` header. The
//! gateway adds 2026-07-28 to that array once, at start-up, so a client asking
//! for it gets it; what the revision adds on Streamable HTTP (the
//! `Mcp-Method` / `Mcp-Name` headers) the gateway checks itself (headers.ts).

import { SUPPORTED_PROTOCOL_VERSIONS } from "@modelcontextprotocol/sdk/types.js";

export const REVISION_2026_07_28 = "2026-07-28";

export function acceptCurrentRevision(): void {
  if (!SUPPORTED_PROTOCOL_VERSIONS.includes(REVISION_2026_07_28)) {
    SUPPORTED_PROTOCOL_VERSIONS.unshift(REVISION_2026_07_28);
  }
}
