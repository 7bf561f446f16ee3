//! The gateway proper, whatever the MCP transport: `tools/list` asks capgate's
//! ListVisible, `tools/call` asks Decide and, on an allow only, resolves the
//! account's secret and calls the upstream. Every other answer is a refusal.
//! The gateway never decides; it relays.

import { randomUUID } from "node:crypto";
import {
  INTERNAL_ERROR,
  INVALID_PARAMS,
  Server,
  type JSONRPCMessage,
  type ServerCapabilities,
  type Tool,
  type Transport,
} from "@modelcontextprotocol/server";
import type { CallerCredential, CapgateClient, VisibleTool } from "@capgate/client";
import type { Logger } from "./log.js";
import {
  JSONRPC_CREDENTIAL_FAILED,
  MAX_ARGUMENTS_BYTES,
  argumentsTooLarge,
  capgateUnavailable,
  credentialFailed,
  listingUnauthenticated,
  refusalOf,
  unknownTarget,
  upstreamFailed,
} from "./refusals.js";
import {
  Fanout,
  Relay,
  listResourceTemplates,
  listResources,
  promptRoute,
  type Feature,
  type Listener,
  type Reach,
  type RelayedUpstream,
} from "./relay.js";
import type { SecretResolver } from "./secrets/index.js";
import { UpstreamError, UpstreamFailure, type UpstreamPool } from "./upstreams.js";

export const GATEWAY_INFO = { name: "capgate-gateway", version: "0.1.0" };

export interface GatewayDeps {
  readonly capgate: CapgateClient;
  readonly secrets: SecretResolver;
  readonly upstreams: UpstreamPool;
  readonly logger: Logger;
  /** `--issuer`: sent as `Credential.issuer`. */
  readonly issuer?: string;
  readonly now?: () => Date;
  /** `--relay`: the upstreams whose resources, prompts, completions and logging are relayed. */
  readonly relayed?: readonly RelayedUpstream[];
  /** Who hears what upstreams say (the pool delivers to the same one). */
  readonly fanout?: Fanout;
}

/** Where a request's caller credential comes from (HTTP: its bearer token; stdio: the env). */
export type CredentialOf = (authToken: string | undefined) => CallerCredential;

/** A handler's caller, `--issuer` applied. */
type Caller = (ctx: { http?: { authInfo?: { token?: string } } }) => CallerCredential;

/** Appended to the description of a tool every grant of which carries conditions (gateways/README.md). */
export const CONDITIONAL_MARK = "Calls may be refused depending on their arguments or time.";

/**
 * The call's arguments as capgate's `arguments_json`: the object received, as
 * JSON (keys in the order they came); absent arguments are `{}`, as MCP reads
 * them. Over MAX_ARGUMENTS_BYTES of UTF-8 it throws the refusal.
 */
export function argumentsJson(args: Record<string, unknown> | undefined): string {
  const text = JSON.stringify(args ?? {});
  const size = Buffer.byteLength(text, "utf8");
  if (size > MAX_ARGUMENTS_BYTES) throw argumentsTooLarge(size);
  return text;
}

/** A visible tool as MCP lists it; a conditional one says so in its description. */
export function mcpTool(tool: VisibleTool): Tool {
  let inputSchema: Tool["inputSchema"] = { type: "object" };
  if (tool.inputSchemaJson !== "") {
    // capgate passes the catalog's schema through untouched; a catalog entry
    // that is not a JSON object still lists the tool, with the empty schema.
    try {
      const parsed: unknown = JSON.parse(tool.inputSchemaJson);
      if (typeof parsed === "object" && parsed !== null && !Array.isArray(parsed)) {
        inputSchema = parsed as Tool["inputSchema"];
      }
    } catch {
      // keep { type: "object" }
    }
  }
  let description = tool.description;
  if (tool.conditional) description = description === "" ? CONDITIONAL_MARK : `${description} (${CONDITIONAL_MARK})`;
  return {
    name: tool.exposedName,
    ...(description !== "" && { description }),
    inputSchema,
  };
}

/** A JSON-RPC error as it goes on the wire. */
export interface WireError {
  readonly code: number;
  readonly message: string;
  readonly data?: unknown;
}

const isCredentialFailed = (data: unknown) => (data as { code?: unknown } | undefined)?.code === "credential_failed";

/**
 * The SDK rewrites a JSON-RPC error code -32002 to -32602 on the way out
 * (-32002 was MCP's retired "resource not found"), but the gateway contract
 * fixes -32002 for credential_failed. Every transport a gateway server is
 * connected to gets its credential_failed errors' code put back.
 */
function keepCredentialFailedCode(server: Server): void {
  const connect = server.connect.bind(server);
  server.connect = (transport: Transport) => {
    const send = transport.send.bind(transport);
    transport.send = (message: JSONRPCMessage, options) => {
      const error = (message as { error?: { code: number; data?: unknown } }).error;
      if (error !== undefined && isCredentialFailed(error.data)) error.code = JSONRPC_CREDENTIAL_FAILED;
      return send(message, options);
    };
    return connect(transport);
  };
}

/**
 * The error a `tools/call` that throws `thrown` is answered with, exactly as a server from
 * `serverFor` sends it on a 2025-era session: the SDK's own encoding of a handler's throw (its
 * `code` when a safe integer, else -32603; -32002 sent as -32602; its `message`; its `data`
 * when there is one), then keepCredentialFailedCode. The direct path answers with this, so the
 * two paths cannot differ on a refusal.
 */
export function wireError(thrown: unknown): WireError {
  const error = (typeof thrown === "object" && thrown !== null ? thrown : {}) as { code?: unknown; message?: unknown; data?: unknown };
  let code = typeof error.code === "number" && Number.isSafeInteger(error.code) ? error.code : INTERNAL_ERROR;
  if (code === JSONRPC_CREDENTIAL_FAILED) code = INVALID_PARAMS;
  if (isCredentialFailed(error.data)) code = JSONRPC_CREDENTIAL_FAILED;
  return {
    code,
    message: typeof error.message === "string" ? error.message : "Internal error",
    ...(error.data !== undefined && { data: error.data }),
  };
}

export class Gateway {
  /** Told when the policy changes: one per open MCP session or stream router. */
  readonly #listeners = new Set<() => void>();
  readonly relay: Relay;
  readonly fanout: Fanout;

  constructor(private readonly deps: GatewayDeps) {
    this.relay = new Relay(deps, deps.relayed ?? []);
    this.fanout = deps.fanout ?? new Fanout();
  }

  /** A server for one MCP session or request, the caller's credential read per request through `credentialOf`. */
  serverFor(credentialOf: CredentialOf): Server {
    const has = (feature: Feature) => this.relay.features.has(feature);
    // Closed by default: a feature no relayed upstream opens has no handler and is not advertised.
    const capabilities: ServerCapabilities = {
      tools: { listChanged: true },
      ...(has("resources") && { resources: { subscribe: true, listChanged: true } }),
      ...(has("prompts") && { prompts: { listChanged: true } }),
      ...(has("completions") && { completions: {} }),
      ...(has("logging") && { logging: {} }),
    };
    const server = new Server(GATEWAY_INFO, { capabilities });
    const caller = (ctx: { http?: { authInfo?: { token?: string } } }) => this.#credential(credentialOf(ctx.http?.authInfo?.token));
    server.setRequestHandler("tools/list", async (_request, ctx) => ({
      tools: await this.listTools(credentialOf(ctx.http?.authInfo?.token)),
    }));
    server.setRequestHandler("tools/call", async (request, ctx) =>
      this.callTool(credentialOf(ctx.http?.authInfo?.token), request.params.name, request.params.arguments),
    );
    if (has("resources")) this.#relayResources(server, caller);
    if (has("prompts")) this.#relayPrompts(server, caller);
    if (has("completions")) this.#relayCompletions(server, caller);
    if (has("logging")) this.#relayLogging(server, caller);
    keepCredentialFailedCode(server);
    return server;
  }

  // ── what is not a tool (relay.ts) ──────────────────────────────────────────

  #relayResources(server: Server, caller: Caller): void {
    const relay = this.relay;
    server.setRequestHandler("resources/list", async (_request, ctx) => {
      const reaches = await relay.reach(caller(ctx), "resources", "resources/list");
      return { resources: await relay.gather(reaches, "resources/list", listResources) };
    });
    server.setRequestHandler("resources/templates/list", async (_request, ctx) => {
      const reaches = await relay.reach(caller(ctx), "resources", "resources/templates/list");
      return { resourceTemplates: await relay.gather(reaches, "resources/templates/list", listResourceTemplates) };
    });
    server.setRequestHandler("resources/read", async (request, ctx) => {
      const { uri } = request.params;
      const reach = await this.#resource(caller(ctx), "resources", "resources/read", uri);
      return relay.send(reach, "resources/read", uri, (client, options) => client.readResource({ uri }, options));
    });
    server.setRequestHandler("resources/subscribe", async (request, ctx) => {
      const { uri } = request.params;
      const reach = await this.#resource(caller(ctx), "resources", "resources/subscribe", uri);
      const result = await relay.send(reach, "resources/subscribe", uri, (client, options) =>
        client.subscribeResource({ uri }, options),
      );
      this.fanout.subscribe(reach.key, uri, server);
      return result;
    });
    server.setRequestHandler("resources/unsubscribe", async (request, ctx) => {
      const { uri } = request.params;
      const reach = await this.#resource(caller(ctx), "resources", "resources/unsubscribe", uri);
      if (!this.fanout.unsubscribe(reach.key, uri, server)) {
        // Another session of this upstream and account still listens: the upstream keeps it.
        this.deps.logger.log("info", "relayed", {
          method: "resources/unsubscribe",
          upstream: reach.upstream.id,
          account: reach.account.id,
          listing_id: reach.listingId,
          target: uri,
          kept_for_others: true,
        });
        return {};
      }
      return relay.send(reach, "resources/unsubscribe", uri, (client, options) => client.unsubscribeResource({ uri }, options));
    });
  }

  async #resource(credential: CallerCredential, feature: Feature, method: string, uri: string): Promise<Reach> {
    const reaches = await this.relay.reach(credential, feature, method);
    const reach = await this.relay.routeResource(reaches, uri);
    if (reach === undefined) {
      const listingId = reaches[0]?.listingId ?? "";
      this.deps.logger.log("info", "relay_refused", { method, code: "unknown_resource", target: uri, listing_id: listingId });
      throw unknownTarget("resource", uri, listingId);
    }
    return reach;
  }

  async #prompt(credential: CallerCredential, feature: Feature, method: string, name: string): Promise<{ reach: Reach; inner: string }> {
    const reaches = await this.relay.reach(credential, feature, method);
    const route = promptRoute(reaches, name);
    if (route === undefined) {
      const listingId = reaches[0]?.listingId ?? "";
      this.deps.logger.log("info", "relay_refused", { method, code: "unknown_prompt", target: name, listing_id: listingId });
      throw unknownTarget("prompt", name, listingId);
    }
    return route;
  }

  #relayPrompts(server: Server, caller: Caller): void {
    const relay = this.relay;
    server.setRequestHandler("prompts/list", async (_request, ctx) => {
      const reaches = await relay.reach(caller(ctx), "prompts", "prompts/list");
      const prompts = [];
      for (const reach of reaches) {
        const listed = await relay.gather([reach], "prompts/list", async (client, options) => (await client.listPrompts(undefined, options)).prompts);
        prompts.push(...listed.map((p) => ({ ...p, name: `${reach.upstream.id}__${p.name}` })));
      }
      return { prompts };
    });
    server.setRequestHandler("prompts/get", async (request, ctx) => {
      const { name, arguments: args } = request.params;
      const { reach, inner } = await this.#prompt(caller(ctx), "prompts", "prompts/get", name);
      return relay.send(reach, "prompts/get", name, (client, options) =>
        client.getPrompt({ name: inner, ...(args !== undefined && { arguments: args }) }, options),
      );
    });
  }

  #relayCompletions(server: Server, caller: Caller): void {
    server.setRequestHandler("completion/complete", async (request, ctx) => {
      const { ref, argument, context } = request.params;
      let reach: Reach;
      let upstreamRef: typeof ref;
      let target: string;
      if (ref.type === "ref/prompt") {
        const route = await this.#prompt(caller(ctx), "completions", "completion/complete", ref.name);
        ({ reach } = route);
        upstreamRef = { ...ref, name: route.inner };
        target = ref.name;
      } else {
        reach = await this.#resource(caller(ctx), "completions", "completion/complete", ref.uri);
        upstreamRef = ref;
        target = ref.uri;
      }
      return this.relay.send(reach, "completion/complete", target, (client, options) =>
        client.complete({ ref: upstreamRef, argument, ...(context !== undefined && { context }) }, options),
      );
    });
  }

  /**
   * A 2026-07-28 `subscriptions/listen` that names resource URIs: each URI an
   * upstream the caller reaches serves is subscribed upstream for the
   * stream's life (its updates reach the stream through the HTTP handler's
   * notifier); the others are left out of the filter, so the acknowledgement
   * says what was honoured. Nothing is honoured when the caller cannot be
   * authenticated or capgate does not answer: fail closed.
   */
  async holdSubscriptions(credential: CallerCredential, uris: readonly string[]): Promise<{ honoured: string[]; release: () => void }> {
    const none = { honoured: [], release: () => undefined };
    if (!this.relay.features.has("resources") || uris.length === 0) return none;
    let reaches: Reach[];
    try {
      reaches = await this.relay.reach(this.#credential(credential), "resources", "subscriptions/listen");
    } catch {
      return none; // logged by reach
    }
    const holder = streamHolder();
    const held: Array<{ reach: Reach; uri: string }> = [];
    for (const uri of uris) {
      const reach = await this.relay.routeResource(reaches, uri);
      if (reach === undefined) continue;
      try {
        await this.relay.send(reach, "resources/subscribe", uri, (client, options) => client.subscribeResource({ uri }, options));
      } catch {
        continue; // logged by send
      }
      this.fanout.subscribe(reach.key, uri, holder);
      held.push({ reach, uri });
    }
    const release = () => {
      for (const { reach, uri } of held.splice(0)) {
        if (!this.fanout.unsubscribe(reach.key, uri, holder)) continue;
        this.relay
          .send(reach, "resources/unsubscribe", uri, (client, options) => client.unsubscribeResource({ uri }, options))
          .catch(() => undefined); // logged by send
      }
    };
    return { honoured: held.map((h) => h.uri), release };
  }

  #relayLogging(server: Server, caller: Caller): void {
    server.setRequestHandler("logging/setLevel", async (request, ctx) => {
      const { level } = request.params;
      for (const reach of await this.relay.reach(caller(ctx), "logging", "logging/setLevel")) {
        try {
          await this.relay.send(reach, "logging/setLevel", level, (client, options) => client.setLoggingLevel(level, options));
        } catch {
          continue; // logged by send; the other upstreams still log
        }
        this.fanout.listenLogs(reach.key, server);
      }
      return {};
    });
  }

  /** Calls `listener` on every policy change until the returned function is called. */
  onToolsChanged(listener: () => void): () => void {
    this.#listeners.add(listener);
    return () => this.#listeners.delete(listener);
  }

  #credential(credential: CallerCredential): CallerCredential {
    return this.deps.issuer === undefined ? credential : { ...credential, issuer: this.deps.issuer };
  }

  async listTools(credential: CallerCredential): Promise<Tool[]> {
    const requestId = randomUUID();
    let answer;
    try {
      answer = await this.deps.capgate.listVisible({
        caller: { credential: this.#credential(credential) },
        requestId,
      });
    } catch (error) {
      const refusal = capgateUnavailable(error);
      this.deps.logger.log("warn", "list_refused", { request_id: requestId, code: "capgate_unavailable", why: refusal.message });
      throw refusal;
    }
    if (answer.result.kind === "unauthenticated") {
      this.deps.logger.log("info", "list_refused", { request_id: requestId, code: "unauthenticated", problem: answer.result.problem });
      throw listingUnauthenticated(answer.result.problem, answer.result.message);
    }
    this.deps.logger.log("info", "listed", { request_id: requestId, tools: answer.result.tools.length });
    return answer.result.tools.map(mcpTool);
  }

  async callTool(credential: CallerCredential, tool: string, args: Record<string, unknown> | undefined) {
    const { capgate, logger, secrets, upstreams } = this.deps;
    const requestId = randomUUID();
    let arguments_: string;
    try {
      arguments_ = argumentsJson(args);
    } catch (refusal) {
      logger.log("info", "call_refused", { tool, request_id: requestId, code: "arguments_too_large" });
      throw refusal;
    }
    let answer;
    try {
      answer = await capgate.decide({
        caller: { credential: this.#credential(credential) },
        tool,
        requestId,
        argumentsJson: arguments_,
      });
    } catch (error) {
      const refusal = capgateUnavailable(error);
      logger.log("warn", "call_refused", { tool, request_id: requestId, code: "capgate_unavailable", why: refusal.message });
      throw refusal;
    }
    const refusal = refusalOf(answer, this.deps.now?.() ?? new Date());
    if (refusal !== undefined) {
      logger.log("info", "call_refused", { tool, decision_id: answer.decisionId, code: String(refusal.data.code) });
      throw refusal;
    }
    const { decisionId, result } = answer;
    // INVARIANT: refusalOf returned undefined, so this is an allow.
    if (result.kind !== "allow") throw capgateUnavailable(new Error("an allow was expected"));
    if (result.tool === undefined) {
      throw capgateUnavailable(new Error("an allow for a tool without the tool's route"));
    }

    const secret = await secrets.resolve(result.account.secretRef);
    if (!secret.ok) {
      logger.log("warn", "credential_failed", { tool, decision_id: decisionId, account: result.account.id, why: secret.detail });
      await this.#note(decisionId, "credential_failed", secret.detail);
      throw credentialFailed(decisionId, secret.detail);
    }

    try {
      const output = await upstreams.call(result.tool, result.account.id, secret.credential, args);
      logger.log("info", "called", { tool, decision_id: decisionId, account: result.account.id });
      return output;
    } catch (error) {
      if (error instanceof UpstreamError) {
        logger.log("info", "upstream_error_relayed", { tool, decision_id: decisionId, upstream_code: error.code });
        throw error;
      }
      const detail = error instanceof UpstreamFailure ? error.message : `upstream call failed: ${String(error)}`;
      logger.log("warn", "upstream_failed", { tool, decision_id: decisionId, why: detail });
      await this.#note(decisionId, "upstream_failed", detail);
      throw upstreamFailed(decisionId, detail);
    }
  }

  /** Appends to the decision's audit trail; a failure to note is logged, never fatal. */
  async #note(decisionId: string, kind: "credential_failed" | "upstream_failed", detail: string): Promise<void> {
    try {
      // NoteDecision bounds the detail to 1024 bytes.
      await this.deps.capgate.noteDecision({ decisionId, kind, detail: truncateUtf8(detail, 1024) });
    } catch (error) {
      this.deps.logger.log("warn", "note_failed", {
        decision_id: decisionId,
        kind,
        why: error instanceof Error ? error.message : String(error),
      });
    }
  }

  /** Has `notifications/tools/list_changed` sent on every open session and listen stream. */
  toolsChanged(): number {
    for (const listener of this.#listeners) {
      try {
        listener();
      } catch (error) {
        this.deps.logger.log("warn", "list_changed_failed", { why: error instanceof Error ? error.message : String(error) });
      }
    }
    return this.#listeners.size;
  }
}

/** A listen stream's place among a resource's subscribers: it hears through the notifier, not here. */
function streamHolder(): Listener {
  const quiet = async () => undefined;
  return { sendResourceUpdated: quiet, sendResourceListChanged: quiet, sendPromptListChanged: quiet, sendLoggingMessage: quiet };
}

function truncateUtf8(text: string, maxBytes: number): string {
  const bytes = Buffer.from(text, "utf8");
  if (bytes.length <= maxBytes) return text;
  // Cutting may split a character; the decoder drops the broken tail.
  return new TextDecoder("utf-8", { fatal: false }).decode(bytes.subarray(0, maxBytes)).replace(/\uFFFD$/, "");
}
