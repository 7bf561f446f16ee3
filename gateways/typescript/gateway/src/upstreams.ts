//! Upstream MCP sessions: one per (upstream id, account id), opened on first
//! use and shared by every caller allowed to run as that account. The
//! credential reaches a stdio child as `MCP_UPSTREAM_CREDENTIAL` and an HTTP
//! upstream as `Authorization: Bearer`. A session that fails at transport
//! level is dropped, so the next call opens a fresh one.
//!
//! Every request to an upstream, opening its session included, has one
//! deadline (`--upstream-timeout`): an upstream that never answers is an
//! UpstreamFailure then, and its session is dropped. What an upstream says on
//! its own (its notifications) goes to `onNotification` with the session's
//! key, for the gateway to pass on to the callers it concerns.
//!
//! A `tools/call` to an HTTP upstream whose session is 2025-era takes the direct path
//! (`callPath: "direct"`, the default; direct.ts): posted raw on the session, over the pool's
//! kept connections, instead of through the SDK client. An upstream that forgot the session
//! (HTTP 404) has it dropped and the call made once more through the SDK client, which opens a
//! new one.

import { createHash } from "node:crypto";
import {
  Client,
  METHOD_NOT_FOUND,
  ProtocolError,
  SdkError,
  SdkErrorCode,
  StreamableHTTPClientTransport,
  type CallToolResult,
  type Transport,
} from "@modelcontextprotocol/client";
import { StdioClientTransport, getDefaultEnvironment } from "@modelcontextprotocol/client/stdio";
import type { ToolRoute } from "@capgate/client";
import { DirectClient, DirectTimeout, SessionGone } from "./direct.js";
import type { Logger } from "./log.js";

export const DEFAULT_UPSTREAM_TIMEOUT_MS = 60_000;

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

/** How to reach an upstream: a policy route's transport, or a `--relay` entry's. */
export type UpstreamTransport = ToolRoute["transport"];

/** One session each: "<upstream id>\0<account id>". */
export type SessionKey = string;

export const sessionKey = (upstream: string, accountId: string): SessionKey => `${upstream}\u0000${accountId}`;

/** A notification an upstream sent on its own: its method and params, as the SDK parsed them. */
export interface UpstreamNotification {
  readonly method: string;
  readonly params?: Record<string, unknown> | undefined;
}

export type OnNotification = (key: SessionKey, notification: UpstreamNotification) => void;

/** `--call-path`: `direct` relays tools/call below the SDKs where it can, `sdk` never does. */
export type CallPath = "direct" | "sdk";

interface Session {
  /** What the session was opened with; another route or credential opens a new one. */
  readonly fingerprint: string;
  readonly client: Promise<Client>;
}

function transportFor(target: UpstreamTransport, credential: string): Transport {
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
function fingerprintOf(target: UpstreamTransport, credential: string): string {
  // Hashed, so that the pool holds no second copy of the credential.
  return createHash("sha256").update(JSON.stringify([target, credential])).digest("hex");
}

/** The SDK's own notifications about the connection, not news from the upstream. */
const CONNECTION_NOTIFICATIONS = new Set(["notifications/cancelled", "notifications/progress"]);

export class UpstreamPool {
  readonly #sessions = new Map<SessionKey, Session>();
  /** The direct path's kept connections; none with `callPath: "sdk"`. */
  readonly #direct: DirectClient | undefined;

  constructor(
    private readonly logger: Logger,
    private readonly options: { timeoutMs?: number; onNotification?: OnNotification; callPath?: CallPath } = {},
    private readonly clientInfo = { name: "capgate-gateway", version: "0.1.0" },
  ) {
    this.#direct = options.callPath === "sdk" ? undefined : new DirectClient();
  }

  get timeoutMs(): number {
    return this.options.timeoutMs ?? DEFAULT_UPSTREAM_TIMEOUT_MS;
  }

  /**
   * Calls `route.name` at its upstream as `accountId`; throws UpstreamFailure or UpstreamError.
   * The result is the upstream's as it sent it on the direct path (the SDK client validates it
   * on the other).
   */
  async call(
    route: ToolRoute,
    accountId: string,
    credential: string,
    args: Record<string, unknown> | undefined,
  ): Promise<CallToolResult> {
    const deadline = Date.now() + this.timeoutMs;
    const viaSdk = () =>
      this.#request(
        route.upstream,
        route.transport,
        accountId,
        credential,
        (client, options) => client.callTool({ name: route.name, ...(args && { arguments: args }) }, options),
        deadline,
      ) as Promise<CallToolResult>;
    const target = route.transport;
    if (this.#direct === undefined || target.kind !== "http") return viaSdk();

    const key = sessionKey(route.upstream, accountId);
    const session = this.#session(key, route.upstream, target, accountId, credential);
    const client = await this.#opened(key, session, route.upstream, deadline);
    const transport = client.transport;
    // A 2026-07-28 upstream's requests carry that revision's envelope and its results their own
    // shape (resultType, input_required): the SDK client speaks it, the direct path does not.
    if (client.getProtocolEra() !== "legacy" || !(transport instanceof StreamableHTTPClientTransport)) return viaSdk();

    let answer;
    try {
      answer = await this.#direct.call(
        {
          url: new URL(target.url),
          credential,
          sessionId: transport.sessionId,
          protocolVersion: transport.protocolVersion ?? client.getNegotiatedProtocolVersion(),
        },
        route.name,
        args,
        deadline,
        (notification) => this.#deliver(key, notification),
      );
    } catch (error) {
      this.#drop(key, session);
      if (error instanceof SessionGone) {
        this.logger.log("info", "upstream_session_lost", { upstream: route.upstream, account: accountId });
        return viaSdk();
      }
      if (error instanceof DirectTimeout || Date.now() >= deadline) {
        throw new UpstreamFailure(`upstream \`${route.upstream}\` did not answer in ${this.timeoutMs / 1000}s`);
      }
      throw new UpstreamFailure(`upstream \`${route.upstream}\` failed the call: ${describe(error)}`);
    }
    if ("error" in answer) throw new UpstreamError(answer.error.code, answer.error.message, answer.error.data);
    return answer.result as CallToolResult;
  }

  /**
   * `send` on the session of (upstream, account), opened first when there is
   * none, within the pool's deadline. A JSON-RPC error the upstream answers is
   * an UpstreamError (relayed as it is); anything else an UpstreamFailure.
   */
  request<T>(
    upstream: string,
    target: UpstreamTransport,
    accountId: string,
    credential: string,
    send: (client: Client, options: { timeout: number }) => Promise<T>,
  ): Promise<T> {
    return this.#request(upstream, target, accountId, credential, send, Date.now() + this.timeoutMs);
  }

  /** The session's client once open, before `deadline`; an UpstreamFailure otherwise. */
  async #opened(key: SessionKey, session: Session, upstream: string, deadline: number): Promise<Client> {
    try {
      return await beforeDeadline(session.client, deadline);
    } catch (error) {
      if (error instanceof DeadlinePassed) {
        this.#drop(key, session);
        throw new UpstreamFailure(`upstream \`${upstream}\` did not start in ${this.timeoutMs / 1000}s`);
      }
      throw new UpstreamFailure(`cannot open a session with upstream \`${upstream}\`: ${describe(error)}`);
    }
  }

  async #request<T>(
    upstream: string,
    target: UpstreamTransport,
    accountId: string,
    credential: string,
    send: (client: Client, options: { timeout: number }) => Promise<T>,
    deadline: number,
  ): Promise<T> {
    const key = sessionKey(upstream, accountId);
    const session = this.#session(key, upstream, target, accountId, credential);
    const client = await this.#opened(key, session, upstream, deadline);
    try {
      const timeout = Math.max(1, deadline - Date.now());
      return await beforeDeadline(send(client, { timeout }), deadline);
    } catch (error) {
      // A JSON-RPC error the upstream answered is relayed; anything else
      // (the SDK's own SdkError: connection closed, timeout, HTTP failure)
      // is the transport failing.
      if (error instanceof ProtocolError) throw new UpstreamError(error.code, error.message, error.data);
      if (error instanceof SdkError && error.code === SdkErrorCode.MethodNotSupportedByProtocolVersion) {
        // The upstream speaks a revision without this method (resources/subscribe on
        // 2026-07-28): the SDK says so before sending, as the upstream itself would.
        throw new UpstreamError(METHOD_NOT_FOUND, error.message, undefined);
      }
      this.#drop(key, session);
      if (error instanceof DeadlinePassed || Date.now() >= deadline) {
        throw new UpstreamFailure(`upstream \`${upstream}\` did not answer in ${this.timeoutMs / 1000}s`);
      }
      throw new UpstreamFailure(`upstream \`${upstream}\` failed the call: ${describe(error)}`);
    }
  }

  #session(key: SessionKey, upstream: string, target: UpstreamTransport, accountId: string, credential: string): Session {
    const fingerprint = fingerprintOf(target, credential);
    let session = this.#sessions.get(key);
    if (session !== undefined && session.fingerprint !== fingerprint) {
      this.#sessions.delete(key);
      void session.client.then((c) => c.close()).catch(() => undefined);
      session = undefined;
    }
    if (session === undefined) {
      const opening = this.#open(key, target, credential);
      const opened: Session = { fingerprint, client: opening };
      session = opened;
      this.#sessions.set(key, opened);
      this.logger.log("info", "upstream_session_opening", { upstream, account: accountId });
      opening.then(
        (client) => {
          // A child that exits, or a connection that closes, ends the session.
          client.onclose = () => {
            if (this.#sessions.get(key) === opened) this.#sessions.delete(key);
            this.logger.log("info", "upstream_session_closed", { upstream, account: accountId });
          };
        },
        () => {
          if (this.#sessions.get(key) === opened) this.#sessions.delete(key);
        },
      );
    }
    return session;
  }

  async #open(key: SessionKey, target: UpstreamTransport, credential: string): Promise<Client> {
    // `auto`: a 2026-07-28 upstream is spoken to in its revision, a 2025 one
    // through the initialize handshake.
    const client = new Client(this.clientInfo, { versionNegotiation: { mode: "auto" } });
    client.fallbackNotificationHandler = async (notification) => this.#deliver(key, notification as UpstreamNotification);
    await client.connect(transportFor(target, credential), { timeout: this.timeoutMs });
    return client;
  }

  /** What an upstream says on its own, from the SDK session or a direct call's stream alike. */
  #deliver(key: SessionKey, notification: UpstreamNotification): void {
    if (CONNECTION_NOTIFICATIONS.has(notification.method)) return;
    this.options.onNotification?.(key, notification);
  }

  #drop(key: SessionKey, session: Session): void {
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
    this.#direct?.close();
    await Promise.allSettled(sessions.map(async (s) => (await s.client).close()));
  }
}

class DeadlinePassed extends Error {
  override readonly name = "DeadlinePassed";
}

/**
 * `work`, or a DeadlinePassed rejection at `deadline` (epoch ms), whichever
 * comes first. A plain timer: `AbortSignal.timeout` per request showed in the
 * gateway's CPU profile (a few per cent of a call).
 */
function beforeDeadline<T>(work: Promise<T>, deadline: number): Promise<T> {
  return new Promise<T>((resolve, reject) => {
    const timer = setTimeout(() => reject(new DeadlinePassed()), Math.max(0, deadline - Date.now()));
    work.then(
      (value) => {
        clearTimeout(timer);
        resolve(value);
      },
      (error: unknown) => {
        clearTimeout(timer);
        reject(error);
      },
    );
  });
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
