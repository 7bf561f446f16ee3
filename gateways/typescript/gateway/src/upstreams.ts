//! Upstream MCP sessions: one per (upstream id, account id), opened on first
//! use and shared by every caller allowed to run as that account. The
//! credential reaches a stdio child as `MCP_UPSTREAM_CREDENTIAL` and an HTTP
//! upstream as `Authorization: Bearer`. A session that fails at transport
//! level is dropped, so the next call opens a fresh one.

import { createHash } from "node:crypto";
import {
  Client,
  ProtocolError,
  StreamableHTTPClientTransport,
  type CallToolResult,
  type Transport,
} from "@modelcontextprotocol/client";
import { StdioClientTransport, getDefaultEnvironment } from "@modelcontextprotocol/client/stdio";
import type { ToolRoute } from "@capgate/client";
import type { Logger } from "./log.js";

/** The upstream could not be reached, or failed the call at transport level. */
export class UpstreamFailure extends Error {
  override readonly name = "UpstreamFailure";
}

/** The upstream answered the call with a JSON-RPC error: relayed as it is. */
export class UpstreamError extends Error {
  override readonly name = "UpstreamError";
  constructor(
    readonly code: number,
    message: string,
    readonly data: unknown,
  ) {
    super(message);
  }
}

interface Session {
  /** What the session was opened with; another route or credential opens a new one. */
  readonly fingerprint: string;
  readonly client: Promise<Client>;
}

function transportFor(route: ToolRoute, credential: string): Transport {
  const target = route.transport;
  if (target.kind === "stdio") {
    // The child gets the SDK's minimal environment (PATH, HOME, …) and the
    // credential, not the gateway's own environment (VAULT_TOKEN and the like).
    return new StdioClientTransport({
      command: target.command,
      args: [...target.args],
      env: { ...getDefaultEnvironment(), MCP_UPSTREAM_CREDENTIAL: credential },
      stderr: "ignore",
    });
  }
  return new StreamableHTTPClientTransport(new URL(target.url), {
    requestInit: { headers: { Authorization: `Bearer ${credential}` } },
  });
}

/** A route's identity: the same upstream id may move (a new policy version). */
function fingerprintOf(route: ToolRoute, credential: string): string {
  // Hashed, so that the pool holds no second copy of the credential.
  return createHash("sha256").update(JSON.stringify([route.transport, credential])).digest("hex");
}


export class UpstreamPool {
  readonly #sessions = new Map<string, Session>();

  constructor(
    private readonly logger: Logger,
    private readonly clientInfo = { name: "capgate-gateway", version: "0.1.0" },
  ) {}

  /** Calls `route.name` at its upstream as `accountId`; throws UpstreamFailure or UpstreamError. */
  async call(
    route: ToolRoute,
    accountId: string,
    credential: string,
    args: Record<string, unknown> | undefined,
  ): Promise<CallToolResult> {
    const key = `${route.upstream}\u0000${accountId}`;
    const session = this.#session(key, route, accountId, credential);
    let client: Client;
    try {
      client = await session.client;
    } catch (error) {
      throw new UpstreamFailure(`cannot open a session with upstream \`${route.upstream}\`: ${describe(error)}`);
    }
    try {
      return (await client.callTool({ name: route.name, ...(args && { arguments: args }) })) as CallToolResult;
    } catch (error) {
      // A JSON-RPC error the upstream answered is relayed; anything else
      // (the SDK's own SdkError: connection closed, timeout, HTTP failure)
      // is the transport failing.
      if (error instanceof ProtocolError) throw new UpstreamError(error.code, error.message, error.data);
      this.#drop(key, session);
      throw new UpstreamFailure(`upstream \`${route.upstream}\` failed the call: ${describe(error)}`);
    }
  }

  #session(key: string, route: ToolRoute, accountId: string, credential: string): Session {
    const fingerprint = fingerprintOf(route, credential);
    let session = this.#sessions.get(key);
    if (session !== undefined && session.fingerprint !== fingerprint) {
      this.#sessions.delete(key);
      void session.client.then((c) => c.close()).catch(() => undefined);
      session = undefined;
    }
    if (session === undefined) {
      const opening = this.#open(route, credential);
      session = { fingerprint, client: opening };
      this.#sessions.set(key, session);
      this.logger.log("info", "upstream_session_opening", { upstream: route.upstream, account: accountId });
      opening.then(
        (client) => {
          // A child that exits, or a connection that closes, ends the session.
          client.onclose = () => {
            if (this.#sessions.get(key) === session) this.#sessions.delete(key);
            this.logger.log("info", "upstream_session_closed", { upstream: route.upstream, account: accountId });
          };
        },
        () => {
          if (this.#sessions.get(key) === session) this.#sessions.delete(key);
        },
      );
    }
    return session;
  }

  async #open(route: ToolRoute, credential: string): Promise<Client> {
    // `auto`: a 2026-07-28 upstream is spoken to in its revision, a 2025 one
    // through the initialize handshake.
    const client = new Client(this.clientInfo, { versionNegotiation: { mode: "auto" } });
    await client.connect(transportFor(route, credential));
    return client;
  }

  #drop(key: string, session: Session): void {
    if (this.#sessions.get(key) === session) this.#sessions.delete(key);
    void session.client.then((c) => c.close()).catch(() => undefined);
  }

  /** How many sessions are open or opening (for tests). */
  get size(): number {
    return this.#sessions.size;
  }

  async closeAll(): Promise<void> {
    const sessions = [...this.#sessions.values()];
    this.#sessions.clear();
    await Promise.allSettled(sessions.map(async (s) => (await s.client).close()));
  }
}

/**
 * An error as a short phrase that holds no credential (SDK errors carry no
 * request headers): its message, and the innermost cause's when there is
 * one (`fetch failed` says little; `ECONNREFUSED 127.0.0.1:9` says why).
 */
function describe(error: unknown): string {
  if (!(error instanceof Error)) return String(error);
  let inner: unknown = error;
  for (let depth = 0; depth < 8 && inner instanceof Error && inner.cause !== undefined; depth++) inner = inner.cause;
  if (inner === error || !(inner instanceof Error)) return error.message;
  const code = (inner as NodeJS.ErrnoException).code;
  return `${error.message} (${inner.message}${code !== undefined && !inner.message.includes(code) ? `, ${code}` : ""})`;
}
