#!/usr/bin/env node
//! Test support: a real 2025-era upstream, sessionful Streamable HTTP on the SDK's
//! NodeStreamableHTTPServerTransport (what the direct path posts to), which shows what a test
//! cannot see from outside. Prints `{"url": …}` on stdout; `--json` answers POSTs with
//! `application/json` instead of an SSE stream. Its tools:
//!
//! * `echo` its `text`; `whoami` the SHA-256 of the bearer token it was called with;
//! * `connections` how many TCP connections it has accepted, `sessions` how many handshakes;
//! * `headers` the MCP headers the call came with (the session id as whether it named the session);
//! * `fail` a JSON-RPC error of its own (-32099);
//! * `notify` sends `notifications/message` on the call's stream before answering;
//! * `ask` sends the caller `ping`, `elicitation/create` and `sampling/createMessage` before
//!   answering, and says what came back;
//! * `forget` drops every session (later requests naming one get HTTP 404, as from an upstream
//!   that restarted); `hang` never answers; `big` answers a text of `bytes` bytes.
//!
//! A call of a tool named `raw-…` is answered below the SDK with what no MCP server should
//! send: `raw-500` HTTP 500, `raw-garbage` a body that is not JSON, `raw-wrong-id` another
//! request's response, `raw-no-answer` an SSE stream that ends without the response,
//! `raw-html` a `text/html` page; and `raw-32002` a JSON-RPC error with code -32002, which the
//! SDK server would not send (it rewrites it to -32602) but an upstream on another stack may.

import { createHash, randomUUID } from "node:crypto";
import { createServer, type IncomingMessage, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { NodeStreamableHTTPServerTransport } from "@modelcontextprotocol/node";
import { ProtocolError, Server, isInitializeRequest } from "@modelcontextprotocol/server";

const json = process.argv.includes("--json");
const sha256 = (text: string) => createHash("sha256").update(text).digest("hex");
const sessions = new Map<string, NodeStreamableHTTPServerTransport>();
let connections = 0;
let handshakes = 0;
/** The headers of the request being dispatched: calls are made one at a time. */
let calledWith: IncomingMessage["headers"] = {};

const TOOLS = ["echo", "whoami", "connections", "sessions", "headers", "fail", "notify", "ask", "forget", "hang", "big"];

function build(): Server {
  const server = new Server({ name: "session-upstream", version: "1.0.0" }, { capabilities: { tools: {}, logging: {} } });
  server.setRequestHandler("tools/list", async () => ({
    tools: TOOLS.map((name) => ({ name, inputSchema: { type: "object" as const } })),
  }));
  server.setRequestHandler("tools/call", async (request, ctx) => {
    const text = (t: string) => ({ content: [{ type: "text" as const, text: t }] });
    switch (request.params.name) {
      case "echo":
        return text(String(request.params.arguments?.text ?? ""));
      case "whoami":
        return text(`credential-sha256: ${sha256(ctx.http?.authInfo?.token ?? "")}`);
      case "connections":
        return text(String(connections));
      case "sessions":
        return text(String(handshakes));
      case "headers":
        return text(
          JSON.stringify({
            accept: calledWith.accept,
            "content-type": calledWith["content-type"],
            "mcp-protocol-version": calledWith["mcp-protocol-version"],
            "mcp-session-id": sessions.has(String(calledWith["mcp-session-id"])),
          }),
        );
      case "fail":
        throw new ProtocolError(-32099, "the upstream refuses", { why: "asked to" });
      case "notify":
        await ctx.mcpReq.notify({ method: "notifications/message", params: { level: "info", logger: "fixture", data: "before the answer" } });
        return text("notified");
      case "ask": {
        const outcomes: string[] = [];
        const asked = {
          ping: {},
          "elicitation/create": { mode: "form", message: "?", requestedSchema: { type: "object", properties: {} } },
          "sampling/createMessage": { messages: [], maxTokens: 1 },
        };
        for (const [method, params] of Object.entries(asked)) {
          try {
            await ctx.mcpReq.send({ method, params } as never);
            outcomes.push(`${method}: answered`);
          } catch (error) {
            outcomes.push(`${method}: ${error instanceof ProtocolError ? `error ${error.code}` : String(error)}`);
          }
        }
        return text(outcomes.join("; "));
      }
      case "forget":
        sessions.clear();
        return text("forgotten");
      case "hang":
        return new Promise<never>(() => undefined);
      case "big":
        return text("x".repeat(Number(request.params.arguments?.bytes ?? 0)));
      default:
        throw new ProtocolError(-32602, `no tool ${request.params.name}`);
    }
  });
  return server;
}

/** The raw answer for a `raw-…` tool; false when the SDK is to answer. */
function answeredRaw(body: unknown, res: ServerResponse): boolean {
  const call = body as { id?: unknown; method?: unknown; params?: { name?: unknown } } | undefined;
  if (call?.method !== "tools/call" || typeof call.params?.name !== "string" || !call.params.name.startsWith("raw-")) return false;
  switch (call.params.name) {
    case "raw-500":
      res.writeHead(500, { "Content-Type": "text/plain" }).end("it broke");
      break;
    case "raw-garbage":
      res.writeHead(200, { "Content-Type": "application/json" }).end("not json {");
      break;
    case "raw-wrong-id":
      res.writeHead(200, { "Content-Type": "application/json" }).end(JSON.stringify({ jsonrpc: "2.0", id: "someone-else", result: {} }));
      break;
    case "raw-32002":
      res.writeHead(200, { "Content-Type": "application/json" });
      res.end(JSON.stringify({ jsonrpc: "2.0", id: call.id, error: { code: -32002, message: "no such thing here", data: { what: "thing" } } }));
      break;
    case "raw-no-answer":
      res.writeHead(200, { "Content-Type": "text/event-stream" });
      res.end(`event: message\ndata: ${JSON.stringify({ jsonrpc: "2.0", method: "notifications/message", params: { level: "info", data: "and nothing else" } })}\n\n`);
      break;
    default:
      res.writeHead(200, { "Content-Type": "text/html" }).end("<p>hello</p>");
  }
  return true;
}

async function readJson(req: IncomingMessage): Promise<unknown> {
  const chunks: Buffer[] = [];
  for await (const chunk of req) chunks.push(chunk as Buffer);
  return JSON.parse(Buffer.concat(chunks).toString("utf8"));
}

const http = createServer((req, res) => {
  void (async () => {
    const match = /^Bearer (.*)$/.exec(req.headers.authorization ?? "");
    (req as typeof req & { auth?: unknown }).auth = { token: match?.[1] ?? "", clientId: "gateway", scopes: [] };
    const body = req.method === "POST" ? await readJson(req) : undefined;
    if (answeredRaw(body, res)) return;
    const id = req.headers["mcp-session-id"];
    if (typeof id === "string") {
      const transport = sessions.get(id);
      if (transport === undefined) {
        res.writeHead(404, { "Content-Type": "application/json" });
        res.end(JSON.stringify({ jsonrpc: "2.0", id: null, error: { code: -32001, message: "Session not found" } }));
        return;
      }
      calledWith = req.headers;
      await transport.handleRequest(req, res, body);
      return;
    }
    if (!isInitializeRequest(body)) {
      res.writeHead(400).end();
      return;
    }
    const transport = new NodeStreamableHTTPServerTransport({
      sessionIdGenerator: () => randomUUID(),
      enableJsonResponse: json,
      onsessioninitialized: (sessionId) => {
        handshakes++;
        sessions.set(sessionId, transport);
      },
    });
    await build().connect(transport);
    await transport.handleRequest(req, res, body);
  })().catch((error: unknown) => {
    process.stderr.write(`session-upstream: ${String(error)}\n`);
    if (!res.headersSent) res.writeHead(500);
    res.end();
  });
});
http.on("connection", () => connections++);
http.listen(0, "127.0.0.1", () => {
  process.stdout.write(`${JSON.stringify({ url: `http://127.0.0.1:${(http.address() as AddressInfo).port}/mcp` })}\n`);
});
