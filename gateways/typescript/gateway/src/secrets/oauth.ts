//! `oauth+https://host/token/path?client=<id>&secret=<ref>[&scope=<s>]`: an
//! OAuth 2.0 client-credentials grant. The client secret is itself a secret
//! reference (any scheme but `oauth+`); the token endpoint's `access_token`
//! is the credential, kept until shortly before its `expires_in`.
//!
//! The query is split by hand: values are percent-decoded only (`+` stays a
//! plus, unlike URLSearchParams), and everything after the first `?` belongs
//! to the query, so a nested `vault://…#field` needs no escaping.

import { FETCH_TIMEOUT_MS, failed, fetchProblem, resolved, type Resolution } from "./resolution.js";

type Resolve = (ref: string) => Promise<Resolution>;

interface Grant {
  readonly endpoint: URL;
  readonly client: string;
  readonly secretRef: string;
  readonly scope: string | undefined;
}

interface Cached {
  readonly token: string;
  /** Epoch ms after which the token is fetched again. */
  readonly refreshAt: number;
}

const LOOPBACK_HOSTS = new Set(["localhost", "[::1]"]);

function isLoopback(hostname: string): boolean {
  return LOOPBACK_HOSTS.has(hostname) || /^127\.\d{1,3}\.\d{1,3}\.\d{1,3}$/.test(hostname);
}

/** `rest` is the reference without `oauth+`, e.g. `https://host/token?client=…`. */
function parseGrant(rest: string): Grant | string {
  const question = rest.indexOf("?");
  if (question === -1) return "oauth: the reference has no query (client=…&secret=…)";
  let endpoint: URL;
  try {
    endpoint = new URL(rest.slice(0, question));
  } catch {
    return "oauth: the token endpoint is not a URL";
  }
  if (endpoint.protocol === "http:") {
    if (!isLoopback(endpoint.hostname)) return "oauth: oauth+http is allowed only for loopback hosts";
  } else if (endpoint.protocol !== "https:") {
    return "oauth: the token endpoint must be https";
  }
  const params = new Map<string, string>();
  for (const pair of rest.slice(question + 1).split("&")) {
    if (pair === "") continue;
    const eq = pair.indexOf("=");
    const rawKey = eq === -1 ? pair : pair.slice(0, eq);
    const rawValue = eq === -1 ? "" : pair.slice(eq + 1);
    let key: string;
    let value: string;
    try {
      key = decodeURIComponent(rawKey);
      value = decodeURIComponent(rawValue);
    } catch {
      return "oauth: the query is not valid percent-encoding";
    }
    if (params.has(key)) return `oauth: query parameter \`${key}\` is given twice`;
    params.set(key, value);
  }
  const client = params.get("client");
  const secretRef = params.get("secret");
  if (client === undefined || client === "") return "oauth: the reference has no `client`";
  if (secretRef === undefined || secretRef === "") return "oauth: the reference has no `secret`";
  if (secretRef.startsWith("oauth+")) return "oauth: the client secret cannot itself be an oauth+ reference";
  return { endpoint, client, secretRef, scope: params.get("scope") };
}

export class OAuthResolver {
  readonly #cache = new Map<string, Cached>();
  readonly #inFlight = new Map<string, Promise<Resolution>>();

  constructor(
    private readonly resolveNested: Resolve,
    private readonly now: () => number = Date.now,
  ) {}

  /** `rest` is the reference without `oauth+`. */
  resolve(rest: string): Promise<Resolution> {
    const cached = this.#cache.get(rest);
    if (cached !== undefined && this.now() < cached.refreshAt) return Promise.resolve(resolved(cached.token));
    // Concurrent calls for the same grant share one token request.
    const pending = this.#inFlight.get(rest);
    if (pending !== undefined) return pending;
    const request = this.#fetch(rest).finally(() => this.#inFlight.delete(rest));
    this.#inFlight.set(rest, request);
    return request;
  }

  async #fetch(rest: string): Promise<Resolution> {
    const grant = parseGrant(rest);
    if (typeof grant === "string") return failed(grant);
    const secret = await this.resolveNested(grant.secretRef);
    if (!secret.ok) return failed(`oauth: the client secret: ${secret.detail}`);

    const form = new URLSearchParams({
      grant_type: "client_credentials",
      client_id: grant.client,
      client_secret: secret.credential,
    });
    if (grant.scope !== undefined) form.set("scope", grant.scope);
    const where = `${grant.endpoint.host}${grant.endpoint.pathname}`;
    let response: Response;
    try {
      response = await fetch(grant.endpoint, {
        method: "POST",
        headers: { "Content-Type": "application/x-www-form-urlencoded", Accept: "application/json" },
        body: form,
        signal: AbortSignal.timeout(FETCH_TIMEOUT_MS),
      });
    } catch (error) {
      return failed(`oauth: cannot reach the token endpoint \`${where}\` (${fetchProblem(error)})`);
    }
    if (!response.ok) {
      await response.body?.cancel();
      return failed(`oauth: the token endpoint \`${where}\` answered HTTP ${response.status}`);
    }
    let body: { access_token?: unknown; expires_in?: unknown };
    try {
      body = (await response.json()) as typeof body;
    } catch {
      return failed(`oauth: the token endpoint \`${where}\` answered a body that is not JSON`);
    }
    const token = body?.access_token;
    if (typeof token !== "string" || token === "") {
      return failed(`oauth: the token endpoint \`${where}\` answered no access_token`);
    }
    const expiresIn = Number(body.expires_in);
    if (Number.isFinite(expiresIn) && expiresIn > 0) {
      const lifetimeMs = expiresIn * 1000;
      // Refresh a little early, so a token is not sent just as it expires.
      const marginMs = Math.min(30_000, lifetimeMs / 10);
      this.#cache.set(rest, { token, refreshAt: this.now() + lifetimeMs - marginMs });
    }
    return resolved(token);
  }
}
