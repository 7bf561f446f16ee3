//! MCP over stdio: one connection, the caller being whoever started the
//! gateway. The SDK's `serveStdio` picks the era from the opening message
//! (2026-07-28 or a 2025 `initialize`) and pins one server to it; that
//! server's list-changed notifications go out on the connection (on a
//! `subscriptions/listen` stream in 2026-07-28). The credential comes from
//! the environment: `CAPGATE_CALLER_API_KEY` (a static-key issuer's key) or
//! else `CAPGATE_CALLER_TOKEN` (a bearer JWT).

import { serveStdio as sdkServeStdio, StdioServerTransport } from "@modelcontextprotocol/server/stdio";
import type { CallerCredential } from "@capgate/client";
import type { Gateway } from "./gateway.js";
import type { Logger } from "./log.js";

export function stdioCredential(env: NodeJS.ProcessEnv): CallerCredential {
  const apiKey = env.CAPGATE_CALLER_API_KEY;
  if (apiKey !== undefined && apiKey !== "") return { apiKey };
  // No credential at all is forwarded as an empty token: capgate answers
  // credential_missing, which the caller then sees.
  return { bearerToken: env.CAPGATE_CALLER_TOKEN ?? "" };
}

export function serveStdio(gateway: Gateway, env: NodeJS.ProcessEnv, logger: Logger): { closed: Promise<void>; close(): Promise<void> } {
  const credential = stdioCredential(env);
  const transport = new StdioServerTransport();
  // The client closing our stdin ends the connection (and the gateway).
  const closed = new Promise<void>((resolve) => process.stdin.once("end", () => resolve()));
  const handle = sdkServeStdio(
    () => {
      // Called for the pinned server (and for a discarded `server/discover`
      // probe instance): each listens for policy changes until it closes.
      const server = gateway.serverFor(() => credential);
      const stop = gateway.onToolsChanged(() => void server.sendToolListChanged());
      const untrack = gateway.fanout.track(server);
      const previous = server.onclose;
      server.onclose = () => {
        previous?.();
        stop();
        untrack();
      };
      return server;
    },
    { transport, onerror: (error) => logger.log("info", "mcp_stdio_error", { why: error.message }) },
  );
  return { closed, close: () => handle.close() };
}
