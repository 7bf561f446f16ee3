//! MCP over stdio: one session, the caller being whoever started the gateway.
//! Its credential comes from the environment: `CAPGATE_CALLER_API_KEY` (a
//! static-key issuer's key) or else `CAPGATE_CALLER_TOKEN` (a bearer JWT).

import { StdioServerTransport } from "@modelcontextprotocol/sdk/server/stdio.js";
import type { CallerCredential } from "@capgate/client";
import type { Gateway } from "./gateway.js";

export function stdioCredential(env: NodeJS.ProcessEnv): CallerCredential {
  const apiKey = env.CAPGATE_CALLER_API_KEY;
  if (apiKey !== undefined && apiKey !== "") return { apiKey };
  // No credential at all is forwarded as an empty token: capgate answers
  // credential_missing, which the caller then sees.
  return { bearerToken: env.CAPGATE_CALLER_TOKEN ?? "" };
}

export async function serveStdio(gateway: Gateway, env: NodeJS.ProcessEnv): Promise<{ closed: Promise<void> }> {
  const credential = stdioCredential(env);
  const server = gateway.serverFor(() => credential);
  const transport = new StdioServerTransport();
  const closed = new Promise<void>((resolve) => {
    transport.onclose = () => resolve();
  });
  await server.connect(transport);
  // StdioServerTransport does not notice the end of stdin; the MCP client
  // closing our stdin ends the session.
  process.stdin.once("end", () => void server.close());
  return { closed };
}
