//! MCP over Streamable HTTP at `/mcp`. Before the SDK sees a request: a
//! `Host` or `Origin` the gateway does not answer to is HTTP 421 / 403
//! (`hosts.ts`, DNS-rebinding protection); no `Authorization: Bearer` is HTTP
//! 401 with `WWW-Authenticate: Bearer`; a body that is not JSON, or nested
//! deeper than MAX_DEPTH, is JSON-RPC -32700; and a POST whose `Mcp-Method` /
//! `Mcp-Name` headers disagree with its body is JSON-RPC -32600 (the SDK
//! would answer its own -32020 on 2026-07-28 requests only; checking first
//! gives one answer for every revision). INVARIANT: every 4xx answer carries
//! a JSON-RPC error body.
//!
//! Then the request goes to one of two legs, split by the SDK's own
//! `isLegacyRequest`: 2026-07-28 requests (self-contained, with the `_meta`
//! envelope) to the SDK's `createMcpHandler`, a fresh server per request,
//! list changes on `subscriptions/listen` streams; 2025-era requests to
//! sessionful Streamable HTTP, one server per `Mcp-Session-Id`, list changes
//! on the session's GET stream. Either way the bearer token of every request
//! (not a session's first) is the caller's credential for that request.
//!
//! Before that split, with `--call-path direct` (the default), a `tools/call`
//! on a session the gateway holds is answered here, below the SDK
//! (`directCall`, docs/decisions/0036-a-direct-path-for-tool-calls.md): the
//! same `Gateway.callTool`, one JSON-RPC response as `application/json`.

import { randomUUID } from "node:crypto";
import { createServer, type IncomingMessage, type Server as HttpServer, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { NodeStreamableHTTPServerTransport, toNodeHandler, toWebRequest } from "@modelcontextprotocol/node";
import {
  SUPPORTED_PROTOCOL_VERSIONS,
  createMcpHandler,
  isInitializeRequest,
  isJsonContentType,
  isLegacyRequest,
} from "@modelcontextprotocol/server";
import { wireError, type Gateway } from "./gateway.js";
import { headerDisagreement, headerValue } from "./headers.js";
import type { HostCheck } from "./hosts.js";
import type { Logger } from "./log.js";
import { JSONRPC_INVALID_REQUEST } from "./refusals.js";
import type { CallPath } from "./upstreams.js";

const JSONRPC_PARSE_ERROR = -32700;

const MAX_BODY_BYTES = 4 * 1024 * 1024;
/**
 * How deep a request body may nest. The SDK's validators recurse, so a body
 * nested tens of thousands deep would overflow the stack (an HTTP 500); MCP
 * messages nest a few levels, tool arguments rarely a few dozen.
 */
export const MAX_DEPTH = 256;

interface Session {
  readonly transport: NodeStreamableHTTPServerTransport;
}

/** The token of `Authorization: Bearer <token>`, or undefined when there is no such header. */
export function bearerToken(header: string | undefined): string | undefined {
  if (header === undefined) return undefined;
  const match = /^Bearer(?:\s+(.*))?$/i.exec(header.trim());
  return match === null ? undefined : (match[1] ?? "").trim();
}

function jsonRpcError(res: ServerResponse, status: number, code: number, message: string, id: unknown = null): void {
  const body = JSON.stringify({ jsonrpc: "2.0", id, error: { code, message } });
  res.writeHead(status, { "Content-Type": "application/json" }).end(body);
}

/** How deeply `value` nests (a scalar is 0), counted without recursion, up to `limit + 1`. */
export function depthOf(value: unknown, limit = MAX_DEPTH): number {
  let deepest = 0;
  const stack: Array<[unknown, number]> = [[value, 0]];
  while (stack.length > 0) {
    const [item, depth] = stack.pop() as [unknown, number];
    if (typeof item !== "object" || item === null) continue;
    if (depth + 1 > deepest) deepest = depth + 1;
    if (deepest > limit) return deepest;
    for (const child of Array.isArray(item) ? item : Object.values(item)) stack.push([child, depth + 1]);
  }
  return deepest;
}

async function readBody(req: IncomingMessage): Promise<string | undefined> {
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of req) {
    size += (chunk as Buffer).length;
    if (size > MAX_BODY_BYTES) return undefined;
    chunks.push(chunk as Buffer);
  }
  return Buffer.concat(chunks).toString("utf8");
}

interface ListenRequest {
  method: "subscriptions/listen";
  params: { notifications: { resourceSubscriptions: string[] } };
}

/** The resource URIs a 2026-07-28 `subscriptions/listen` request asks to hear about. */
function listenedResources(body: unknown): string[] {
  const message = body as { method?: unknown; params?: { notifications?: { resourceSubscriptions?: unknown } } } | null;
  if (message?.method !== "subscriptions/listen") return [];
  const uris = message.params?.notifications?.resourceSubscriptions;
  return Array.isArray(uris) ? uris.filter((u): u is string => typeof u === "string") : [];
}

/** A `tools/call` the gateway answers itself: what it needs of the request. */
export interface DirectCall {
  readonly id: string | number;
  readonly name: string;
  readonly arguments: Record<string, unknown> | undefined;
}

const isObject = (value: unknown): value is Record<string, unknown> =>
  typeof value === "object" && value !== null && !Array.isArray(value);

/** What a tools/call's params may hold and still be answered directly. */
const DIRECT_PARAMS = new Set(["name", "arguments", "_meta"]);

/**
 * A `_meta` the direct path takes: none, or only a `progressToken` of the type the SDK's
 * schema wants (it answers 400 to another). Any other key (a related task, a 2026-07-28
 * envelope claim, which the SDK routes to that leg, or what some extension adds) leaves
 * the call to the SDK, which knows what each means.
 */
function plainMeta(meta: unknown): boolean {
  if (meta === undefined) return true;
  if (!isObject(meta)) return false;
  for (const [key, value] of Object.entries(meta)) {
    if (key !== "progressToken") return false;
    if (!(typeof value === "string" || (typeof value === "number" && Number.isSafeInteger(value)))) return false;
  }
  return true;
}

/**
 * The POST as a call the direct path answers, or undefined when the SDK is to serve it (and
 * answer exactly as it would without the direct path: a batch, an unknown session, a bad
 * Accept, malformed params, a 2026-07-28 request each keep the SDK's answer). Only what the
 * SDK's 2025-era leg would serve and dispatch to the tools/call handler is taken: a JSON
 * Content-Type; an Accept naming both JSON and SSE (the SDK's own test: it answers 406
 * otherwise, so a direct answer there would be one the SDK path never gives); a protocol
 * version header that leg accepts, or none; one JSON-RPC request with a string or integer id,
 * a string `name`, `arguments` absent or an object, and a `_meta` that plainMeta takes.
 * Whether the session is held is the caller's check.
 */
export function directCall(headers: IncomingMessage["headers"], body: unknown): DirectCall | undefined {
  const contentType = headerValue(headers["content-type"]);
  if (contentType === undefined || !isJsonContentType(contentType)) return undefined;
  const accept = headerValue(headers.accept);
  if (accept === undefined || !accept.includes("application/json") || !accept.includes("text/event-stream")) return undefined;
  const version = headerValue(headers["mcp-protocol-version"]);
  if (version !== undefined && !SUPPORTED_PROTOCOL_VERSIONS.includes(version)) return undefined;
  if (!isObject(body) || body.jsonrpc !== "2.0" || body.method !== "tools/call") return undefined;
  const { id, params } = body;
  if (!(typeof id === "string" || (typeof id === "number" && Number.isSafeInteger(id)))) return undefined;
  if (!isObject(params) || typeof params.name !== "string") return undefined;
  for (const key of Object.keys(params)) if (!DIRECT_PARAMS.has(key)) return undefined;
  const args = params.arguments;
  if (args !== undefined && !isObject(args)) return undefined;
  if (!plainMeta(params._meta)) return undefined;
  return { id, name: params.name, arguments: args };
}

export interface HttpGateway {
  readonly url: string;
  close(): Promise<void>;
}

export async function serveHttp(
  gateway: Gateway,
  logger: Logger,
  host: string,
  port: number,
  hostCheck?: HostCheck,
  callPath: CallPath = "direct",
): Promise<HttpGateway> {
  const sessions = new Map<string, Session>();
  const credentialOf = (authToken: string | undefined) => ({ bearerToken: authToken ?? "" });
  const modern = createMcpHandler(() => gateway.serverFor(credentialOf), {
    legacy: "reject",
    onerror: (error) => logger.log("info", "mcp_request_rejected", { why: error.message }),
  });
  const serveModern = toNodeHandler(modern);
  const stopNotifying = gateway.onToolsChanged(() => modern.notify.toolsChanged());
  const stopStreams = gateway.fanout.addStreams(modern.notify);

  /** The direct path's answer: Gateway.callTool's result, or its throw as the SDK would send it. */
  async function answerDirectly(res: ServerResponse, sessionId: string, call: DirectCall, token: string): Promise<void> {
    let response: object;
    try {
      const result = await gateway.callTool(credentialOf(token), call.name, call.arguments);
      response = { jsonrpc: "2.0", id: call.id, result };
    } catch (error) {
      response = { jsonrpc: "2.0", id: call.id, error: wireError(error) };
    }
    // With its length: without it, writeHead commits to a chunked body (framing for the caller
    // to undo, and the end of the chunks written on its own).
    const body = JSON.stringify(response);
    res
      .writeHead(200, { "Content-Type": "application/json", "Content-Length": Buffer.byteLength(body), "Mcp-Session-Id": sessionId })
      .end(body);
  }

  async function handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    if (hostCheck !== undefined) {
      if (!hostCheck.hostAllowed(req.headers.host)) {
        logger.log("info", "host_refused", { host: req.headers.host ?? "" });
        jsonRpcError(res, 421, JSONRPC_INVALID_REQUEST, "the Host header names no host this gateway answers to");
        return;
      }
      if (!hostCheck.originAllowed(headerValue(req.headers.origin))) {
        logger.log("info", "origin_refused", { origin: headerValue(req.headers.origin) });
        jsonRpcError(res, 403, JSONRPC_INVALID_REQUEST, "the Origin header names no origin this gateway answers to");
        return;
      }
    }
    const token = bearerToken(req.headers.authorization);
    if (token === undefined) {
      res
        .writeHead(401, { "WWW-Authenticate": "Bearer", "Content-Type": "application/json" })
        .end(JSON.stringify({ error: "unauthorized", error_description: "an Authorization: Bearer token is required" }));
      return;
    }
    // The usual request line is exactly `/mcp`: no URL to parse for it.
    const path = req.url === "/mcp" ? "/mcp" : new URL(req.url ?? "/", "http://gateway").pathname;
    if (path !== "/mcp") {
      jsonRpcError(res, 404, JSONRPC_INVALID_REQUEST, "not found: MCP is served at /mcp");
      return;
    }
    // The SDK hands this to every handler as `extra.authInfo`.
    (req as IncomingMessage & { auth?: unknown }).auth = { token, clientId: "mcp-client", scopes: [] };

    let body: unknown;
    if (req.method === "POST") {
      const text = await readBody(req);
      if (text === undefined) {
        // The rest of the body is left unread, so the connection cannot carry another request:
        // kept alive, the client's next request on it would be read as body, reset or stalled.
        res.setHeader("Connection", "close");
        jsonRpcError(res, 413, JSONRPC_INVALID_REQUEST, "the request body is over 4 MiB");
        return;
      }
      try {
        body = JSON.parse(text);
      } catch {
        jsonRpcError(res, 400, JSONRPC_PARSE_ERROR, "Parse error: the body is not JSON");
        return;
      }
      if (depthOf(body) > MAX_DEPTH) {
        jsonRpcError(res, 400, JSONRPC_PARSE_ERROR, `Parse error: the body is nested deeper than ${MAX_DEPTH} levels`);
        return;
      }
      const disagreement = headerDisagreement(
        { method: headerValue(req.headers["mcp-method"]), name: headerValue(req.headers["mcp-name"]) },
        body,
      );
      if (disagreement !== undefined) {
        const id = (body as { id?: unknown } | null)?.id ?? null;
        logger.log("info", "header_mismatch", { why: disagreement });
        jsonRpcError(res, 400, JSONRPC_INVALID_REQUEST, `Invalid Request: ${disagreement}`, id);
        return;
      }
    }

    if (callPath === "direct" && req.method === "POST") {
      // Checked before isLegacyRequest, which builds a web Request to classify: a call directCall
      // takes (no envelope claim in `_meta`, no 2026-07-28 version header) is one it classifies
      // 2025-era.
      const sessionId = headerValue(req.headers["mcp-session-id"]);
      const call = sessionId !== undefined && sessions.has(sessionId) ? directCall(req.headers, body) : undefined;
      if (sessionId !== undefined && call !== undefined) {
        await answerDirectly(res, sessionId, call, token);
        return;
      }
    }

    if (req.method === "POST" && !(await isLegacyRequest(await toWebRequest(req, body), body))) {
      const uris = listenedResources(body);
      if (uris.length > 0) {
        // The SDK serves subscriptions/listen itself; the resources it names are subscribed
        // upstream here, for as long as the stream stays open.
        const held = await gateway.holdSubscriptions(credentialOf(token), uris);
        (body as ListenRequest).params.notifications.resourceSubscriptions = held.honoured;
        res.once("close", held.release);
      }
      await serveModern(req, res, body);
      return;
    }

    const sessionId = headerValue(req.headers["mcp-session-id"]);
    if (sessionId !== undefined) {
      const session = sessions.get(sessionId);
      if (session === undefined) {
        jsonRpcError(res, 404, -32001, "Session not found");
        return;
      }
      await session.transport.handleRequest(req, res, body);
      return;
    }
    if (req.method === "POST" && isInitializeRequest(body)) {
      const transport: NodeStreamableHTTPServerTransport = new NodeStreamableHTTPServerTransport({
        sessionIdGenerator: () => randomUUID(),
        onsessioninitialized: (id) => {
          sessions.set(id, { transport });
          logger.log("info", "session_opened", { session: id });
        },
        onsessionclosed: (id) => {
          sessions.delete(id);
        },
      });
      const server = gateway.serverFor(credentialOf);
      const stop = gateway.onToolsChanged(() => void server.sendToolListChanged());
      const untrack = gateway.fanout.track(server);
      transport.onclose = () => {
        stop();
        untrack();
        if (transport.sessionId !== undefined) {
          sessions.delete(transport.sessionId);
          logger.log("info", "session_closed", { session: transport.sessionId });
        }
      };
      await server.connect(transport);
      await transport.handleRequest(req, res, body);
      return;
    }
    jsonRpcError(res, 400, -32000, "Bad Request: no Mcp-Session-Id, and not an initialize request");
  }

  const server: HttpServer = createServer((req, res) => {
    handle(req, res).catch((error: unknown) => {
      logger.log("error", "http_request_failed", { why: error instanceof Error ? error.message : String(error) });
      if (!res.headersSent) jsonRpcError(res, 500, -32603, "Internal error");
      else res.end();
    });
  });
  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(port, host, () => resolve());
  });
  const address = server.address() as AddressInfo;
  const shownHost = address.family === "IPv6" ? `[${address.address}]` : address.address;
  const url = `http://${shownHost}:${address.port}/mcp`;

  return {
    url,
    async close() {
      stopNotifying();
      stopStreams();
      await modern.close();
      await Promise.allSettled([...sessions.values()].map((s) => s.transport.close()));
      sessions.clear();
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}
