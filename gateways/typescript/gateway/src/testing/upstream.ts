#!/usr/bin/env node
//! Test support: a real upstream MCP server on the official SDK, started by
//! the gateway (stdio, the default) or by a test (`--http`, which prints
//! `{"url": …}` on stdout). Its tools show what reached it without showing
//! a secret: `whoami` answers the SHA-256 of the credential it was given
//! (`MCP_UPSTREAM_CREDENTIAL` on stdio, the bearer token over HTTP), `pid`
//! its process id (to see sessions reused), `echo` its `text` argument,
//! `refund` what it was asked to refund (its `amount` and `currency`), `fail`
//! a JSON-RPC error of its own.

import { createHash } from "node:crypto";
import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { toNodeHandler } from "@modelcontextprotocol/node";
import { createMcpHandler, ProtocolError, Server } from "@modelcontextprotocol/server";
import { serveStdio } from "@modelcontextprotocol/server/stdio";

const sha256 = (text: string) => createHash("sha256").update(text).digest("hex");

function build(credentialOf: (token: string | undefined) => string): Server {
  const server = new Server({ name: "test-upstream", version: "1.0.0" }, { capabilities: { tools: {} } });
  server.setRequestHandler("tools/list", async () => ({
    tools: ["whoami", "pid", "echo", "refund", "fail"].map((name) => ({ name, inputSchema: { type: "object" as const } })),
  }));
  server.setRequestHandler("tools/call", async (request, ctx) => {
    const text = (t: string) => ({ content: [{ type: "text" as const, text: t }] });
    switch (request.params.name) {
      case "whoami":
        return text(`credential-sha256: ${sha256(credentialOf(ctx.http?.authInfo?.token))}`);
      case "pid":
        return text(String(process.pid));
      case "echo":
        return text(String(request.params.arguments?.text ?? ""));
      case "refund":
        return text(`refunded ${String(request.params.arguments?.amount)} ${String(request.params.arguments?.currency)}`);
      case "fail":
        throw new ProtocolError(-32099, "the upstream refuses", { why: "asked to" });
      default:
        throw new ProtocolError(-32602, `no tool ${request.params.name}`);
    }
  });
  return server;
}

if (process.argv.includes("--http")) {
  const handler = toNodeHandler(createMcpHandler(() => build((token) => token ?? "")));
  const http = createServer((req, res) => {
    const match = /^Bearer (.*)$/.exec(req.headers.authorization ?? "");
    (req as typeof req & { auth?: unknown }).auth = { token: match?.[1] ?? "", clientId: "gateway", scopes: [] };
    void handler(req, res);
  });
  http.listen(0, "127.0.0.1", () => {
    process.stdout.write(`${JSON.stringify({ url: `http://127.0.0.1:${(http.address() as AddressInfo).port}/mcp` })}\n`);
  });
} else {
  serveStdio(() => build(() => process.env.MCP_UPSTREAM_CREDENTIAL ?? ""));
}
