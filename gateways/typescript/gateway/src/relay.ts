//! What is not a tool: resources, prompts, completions and logging, relayed
//! from the upstreams the operator opened (`--relay FILE`) to the callers
//! capgate lets use them. The same rule as the Python gateway's `relay.py`
//! (docs/decisions/0026-what-the-gateways-relay.md):
//!
//! * Closed by default: without `--relay`, or for an upstream or feature the
//!   file does not name, nothing is served (-32601, no capability advertised).
//! * A caller reaches an opened upstream when capgate's ListVisible shows it at
//!   least one of the upstream's tools; the request runs as the account those
//!   tools run as, and is refused when they run as several (the policy does
//!   not say which).
//! * Every relayed request asks ListVisible first, so capgate authenticates
//!   the caller and writes a listing record; the gateway's log line carries
//!   that record's id (`listing_id`), which names the caller in the audit.
//! * Prompts are named like tools, `<upstream>__<prompt>`. A resource URI goes
//!   to the only upstream the caller reaches, else to the one whose listing
//!   holds it (or whose template's fixed prefix it starts with, the longest).

import { readFileSync } from "node:fs";
import { randomUUID } from "node:crypto";
import type { Client } from "@modelcontextprotocol/client";
import type { Server } from "@modelcontextprotocol/server";
import type { CallerCredential, CapgateClient } from "@capgate/client";
import type { Logger } from "./log.js";
import { capgateUnavailable, credentialFailed, listingUnauthenticated, upstreamFailed } from "./refusals.js";
import type { SecretResolver } from "./secrets/index.js";
import {
  UpstreamError,
  UpstreamFailure,
  sessionKey,
  type SessionKey,
  type UpstreamNotification,
  type UpstreamPool,
  type UpstreamTransport,
} from "./upstreams.js";

export const FEATURES = ["resources", "prompts", "completions", "logging"] as const;
export type Feature = (typeof FEATURES)[number];

export interface RelayedUpstream {
  readonly id: string;
  readonly transport: UpstreamTransport;
  readonly features: ReadonlySet<Feature>;
}

/** The `--relay` file cannot be used; the message says where and why. */
export class RelayConfigError extends Error {
  override readonly name = "RelayConfigError";
}

function only(value: unknown, keys: readonly string[], where: string): Record<string, unknown> {
  if (typeof value !== "object" || value === null || Array.isArray(value)) throw new RelayConfigError(`${where} must be an object`);
  const unknown = Object.keys(value).filter((k) => !keys.includes(k)).sort();
  if (unknown.length > 0) throw new RelayConfigError(`${where} has unknown field \`${unknown[0]}\``);
  return value as Record<string, unknown>;
}

function transportOf(value: unknown, where: string): UpstreamTransport {
  const kind = typeof value === "object" && value !== null ? (value as { kind?: unknown }).kind : undefined;
  if (kind === "mcp-stdio") {
    const { command, args = [] } = only(value, ["kind", "command", "args"], `${where}.transport`);
    if (typeof command !== "string" || command === "" || !Array.isArray(args) || !args.every((a) => typeof a === "string")) {
      throw new RelayConfigError(`${where}.transport needs \`command\` (a string) and \`args\` (strings)`);
    }
    return { kind: "stdio", command, args: args as string[] };
  }
  if (kind === "mcp-http") {
    const { url } = only(value, ["kind", "url"], `${where}.transport`);
    if (typeof url !== "string" || !/^https?:\/\//.test(url)) throw new RelayConfigError(`${where}.transport.url must be an http(s) URL`);
    return { kind: "http", url };
  }
  throw new RelayConfigError(`${where}.transport.kind must be \`mcp-stdio\` or \`mcp-http\``);
}

/**
 * `{"upstreams": [{"id", "transport", "relay": [features]}]}`, `transport`
 * written as in the policy (`{"kind": "mcp-stdio", "command", "args"}` or
 * `{"kind": "mcp-http", "url"}`).
 */
export function parseRelayConfig(text: string): RelayedUpstream[] {
  let document: unknown;
  try {
    document = JSON.parse(text);
  } catch (error) {
    throw new RelayConfigError(`not JSON: ${error instanceof Error ? error.message : String(error)}`);
  }
  const { upstreams } = only(document, ["upstreams"], "the file");
  if (!Array.isArray(upstreams)) throw new RelayConfigError("`upstreams` must be a list");
  const parsed: RelayedUpstream[] = [];
  upstreams.forEach((entry, index) => {
    const where = `upstreams[${index}]`;
    const { id, transport, relay } = only(entry, ["id", "transport", "relay"], where);
    if (typeof id !== "string" || id === "" || id.includes("_")) throw new RelayConfigError(`${where}.id must be an upstream id (no \`_\`)`);
    if (parsed.some((u) => u.id === id)) throw new RelayConfigError(`${where}.id \`${id}\` is named twice`);
    if (!Array.isArray(relay) || !relay.every((f) => (FEATURES as readonly unknown[]).includes(f))) {
      throw new RelayConfigError(`${where}.relay must list some of ${FEATURES.join(", ")}`);
    }
    parsed.push({ id, transport: transportOf(transport, where), features: new Set(relay as Feature[]) });
  });
  return parsed;
}

export function loadRelayConfig(path: string): RelayedUpstream[] {
  let text: string;
  try {
    text = readFileSync(path, "utf8");
  } catch (error) {
    throw new RelayConfigError(`cannot read \`${path}\` (${(error as NodeJS.ErrnoException).code ?? "error"})`);
  }
  return parseRelayConfig(text);
}

// ── who hears what an upstream says ─────────────────────────────────────────

/** A session (2025 era: one server per session) that can be told things. */
export type Listener = Pick<Server, "sendResourceUpdated" | "sendResourceListChanged" | "sendPromptListChanged" | "sendLoggingMessage">;
type LoggingParams = Parameters<Server["sendLoggingMessage"]>[0];

/** Where the 2026-07-28 `subscriptions/listen` streams are told (the HTTP handler's notifier, or none). */
export interface StreamNotifier {
  resourceUpdated(uri: string): void;
  resourcesChanged(): void;
  promptsChanged(): void;
}

/** The gateway's open sessions, and which of them asked for what an upstream may say. */
export class Fanout {
  readonly #sessions = new Set<Listener>();
  readonly #subscribers = new Map<string, Set<Listener>>();
  readonly #logListeners = new Map<SessionKey, Set<Listener>>();
  readonly #streams = new Set<StreamNotifier>();

  /** Keeps `listener` until the returned function is called (its session closed). */
  track(listener: Listener): () => void {
    this.#sessions.add(listener);
    return () => {
      this.#sessions.delete(listener);
      for (const set of [...this.#subscribers.values(), ...this.#logListeners.values()]) set.delete(listener);
    };
  }

  addStreams(notifier: StreamNotifier): () => void {
    this.#streams.add(notifier);
    return () => this.#streams.delete(notifier);
  }

  subscribe(key: SessionKey, uri: string, listener: Listener): void {
    const id = `${key}\u0000${uri}`;
    const set = this.#subscribers.get(id) ?? new Set<Listener>();
    set.add(listener);
    this.#subscribers.set(id, set);
  }

  /** Forgets `listener`'s subscription; true when nobody is left subscribed to `uri`. */
  unsubscribe(key: SessionKey, uri: string, listener: Listener): boolean {
    const id = `${key}\u0000${uri}`;
    const set = this.#subscribers.get(id);
    if (set === undefined) return true;
    set.delete(listener);
    if (set.size > 0) return false;
    this.#subscribers.delete(id);
    return true;
  }

  listenLogs(key: SessionKey, listener: Listener): void {
    const set = this.#logListeners.get(key) ?? new Set<Listener>();
    set.add(listener);
    this.#logListeners.set(key, set);
  }

  /** What the session of `key` said on its own, to the sessions it concerns. */
  deliver(key: SessionKey, notification: UpstreamNotification): void {
    const quietly = (sending: Promise<void>) => void sending.catch(() => undefined);
    switch (notification.method) {
      case "notifications/resources/updated": {
        const uri = String(notification.params?.uri ?? "");
        for (const listener of this.#subscribers.get(`${key}\u0000${uri}`) ?? []) quietly(listener.sendResourceUpdated({ uri }));
        for (const streams of this.#streams) streams.resourceUpdated(uri);
        return;
      }
      case "notifications/resources/list_changed":
        for (const listener of this.#sessions) quietly(listener.sendResourceListChanged());
        for (const streams of this.#streams) streams.resourcesChanged();
        return;
      case "notifications/prompts/list_changed":
        for (const listener of this.#sessions) quietly(listener.sendPromptListChanged());
        for (const streams of this.#streams) streams.promptsChanged();
        return;
      case "notifications/message":
        for (const listener of this.#logListeners.get(key) ?? []) quietly(listener.sendLoggingMessage(notification.params as LoggingParams));
        return;
    }
  }
}

// ── the relay ────────────────────────────────────────────────────────────────

/** An opened upstream this caller may use, as which account, per which listing record. */
export interface Reach {
  readonly upstream: RelayedUpstream;
  readonly account: { readonly id: string; readonly secretRef: string };
  readonly listingId: string;
  readonly key: SessionKey;
}

export interface RelayDeps {
  readonly capgate: CapgateClient;
  readonly secrets: SecretResolver;
  readonly upstreams: UpstreamPool;
  readonly logger: Logger;
}

type Send<T> = (client: Client, options: { timeout: number }) => Promise<T>;

export class Relay {
  readonly features: ReadonlySet<Feature>;

  constructor(
    private readonly deps: RelayDeps,
    readonly upstreams: readonly RelayedUpstream[],
  ) {
    this.features = new Set(upstreams.flatMap((u) => [...u.features]));
  }

  /** The opened upstreams (for `feature`) this caller may use, in the file's order. */
  async reach(credential: CallerCredential, feature: Feature, method: string): Promise<Reach[]> {
    let answer;
    try {
      answer = await this.deps.capgate.listVisible({ caller: { credential }, requestId: randomUUID() });
    } catch (error) {
      const refusal = capgateUnavailable(error);
      this.deps.logger.log("warn", "relay_refused", { method, code: "capgate_unavailable", why: refusal.message });
      throw refusal;
    }
    if (answer.result.kind === "unauthenticated") {
      this.deps.logger.log("info", "relay_refused", { method, code: "unauthenticated", problem: answer.result.problem });
      throw listingUnauthenticated(answer.result.problem, answer.result.message);
    }
    const { capabilities, tools } = answer.result;
    const accounts = new Map(capabilities.flatMap((c) => (c.account === undefined ? [] : [[c.capability, c.account] as const])));
    const listingId = capabilities[0]?.decisionId ?? "";
    const reaches: Reach[] = [];
    for (const upstream of this.upstreams) {
      if (!upstream.features.has(feature)) continue;
      const used = new Map<string, { id: string; secretRef: string }>();
      for (const tool of tools) {
        const account = tool.upstream === upstream.id ? accounts.get(tool.capability) : undefined;
        if (account !== undefined) used.set(account.id, account);
      }
      const [account, ...others] = [...used.values()];
      if (account !== undefined && others.length === 0) {
        reaches.push({ upstream, account, listingId, key: sessionKey(upstream.id, account.id) });
      } else if (others.length > 0) {
        this.deps.logger.log("warn", "relay_ambiguous", {
          method,
          upstream: upstream.id,
          accounts: [...used.keys()].sort().join(","),
          listing_id: listingId,
        });
      }
    }
    return reaches;
  }

  /** One relayed request, logged with who asked (the listing record) and what came of it. */
  async send<T>(reach: Reach, method: string, target: string, send: Send<T>): Promise<T> {
    const { logger, secrets, upstreams } = this.deps;
    const fields = { method, upstream: reach.upstream.id, account: reach.account.id, listing_id: reach.listingId, target };
    const secret = await secrets.resolve(reach.account.secretRef);
    if (!secret.ok) {
      logger.log("warn", "relay_failed", { ...fields, code: "credential_failed", why: secret.detail });
      throw credentialFailed(reach.listingId, secret.detail);
    }
    try {
      const result = await upstreams.request(reach.upstream.id, reach.upstream.transport, reach.account.id, secret.credential, send);
      logger.log("info", "relayed", fields);
      return result;
    } catch (error) {
      if (error instanceof UpstreamError) {
        logger.log("info", "relayed", { ...fields, upstream_error: error.code });
        throw error;
      }
      const detail = error instanceof UpstreamFailure ? error.message : `upstream request failed: ${String(error)}`;
      logger.log("warn", "relay_failed", { ...fields, code: "upstream_failed", why: detail });
      throw upstreamFailed(reach.listingId, detail);
    }
  }

  /** A whole listing from each upstream (the SDK walks the pages); one that fails is left out (and logged). */
  async gather<T>(reaches: readonly Reach[], method: string, fetch: Send<readonly T[]>): Promise<T[]> {
    const gathered: T[] = [];
    for (const reach of reaches) {
      try {
        gathered.push(...(await this.send(reach, method, "", fetch)));
      } catch {
        // logged by send; the other upstreams still answer
      }
    }
    return gathered;
  }

  /** The upstream a resource URI belongs to, among those the caller reaches. */
  async routeResource(reaches: readonly Reach[], uri: string): Promise<Reach | undefined> {
    if (reaches.length <= 1) return reaches[0];
    let best: { length: number; reach: Reach } | undefined;
    for (const reach of reaches) {
      const resources = await this.gather([reach], "resources/list", listResources);
      if (resources.some((r) => r.uri === uri)) return reach;
      for (const template of await this.gather([reach], "resources/templates/list", listResourceTemplates)) {
        const prefix = template.uriTemplate.split("{", 1)[0] ?? "";
        if (prefix !== "" && uri.startsWith(prefix) && (best === undefined || prefix.length > best.length)) {
          best = { length: prefix.length, reach };
        }
      }
    }
    return best?.reach;
  }
}

export type Resource = Awaited<ReturnType<Client["listResources"]>>["resources"][number];
export type ResourceTemplate = Awaited<ReturnType<Client["listResourceTemplates"]>>["resourceTemplates"][number];

export const listResources: Send<readonly Resource[]> = async (client, options) =>
  (await client.listResources(undefined, options)).resources;

export const listResourceTemplates: Send<readonly ResourceTemplate[]> = async (client, options) =>
  (await client.listResourceTemplates(undefined, options)).resourceTemplates;

/** `<upstream>__<prompt>` → the upstream (if the caller reaches it) and its own prompt name. */
export function promptRoute(reaches: readonly Reach[], name: string): { reach: Reach; inner: string } | undefined {
  const split = name.indexOf("__");
  if (split <= 0 || split + 2 >= name.length) return undefined;
  const reach = reaches.find((r) => r.upstream.id === name.slice(0, split));
  return reach === undefined ? undefined : { reach, inner: name.slice(split + 2) };
}
