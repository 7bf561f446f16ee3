//! MCP 2026-07-28's `Mcp-Method` and `Mcp-Name` request headers on Streamable
//! HTTP: optional, but when present they must say what the JSON-RPC body
//! says, so that a proxy routing on the headers and the gateway acting on the
//! body cannot be told two different things. A mismatch is JSON-RPC -32600.

/** The name a method's `Mcp-Name` stands for, read from the request's params. */
const NAME_PARAM: Readonly<Record<string, string>> = {
  "tools/call": "name",
  "prompts/get": "name",
  "resources/read": "uri",
  "resources/subscribe": "uri",
  "resources/unsubscribe": "uri",
};

export interface HeaderValues {
  readonly method: string | undefined;
  readonly name: string | undefined;
}

/** Why the headers disagree with the body, or `undefined` when they agree (or are absent). */
export function headerDisagreement(headers: HeaderValues, body: unknown): string | undefined {
  if (headers.method === undefined && headers.name === undefined) return undefined;
  if (typeof body !== "object" || body === null || Array.isArray(body)) {
    return "Mcp-Method / Mcp-Name headers need a single JSON-RPC message in the body";
  }
  const message = body as { method?: unknown; params?: Record<string, unknown> };
  const method = typeof message.method === "string" ? message.method : undefined;
  if (headers.method !== undefined && headers.method !== method) {
    return `the Mcp-Method header (\`${headers.method}\`) does not match the body's method (\`${method ?? ""}\`)`;
  }
  if (headers.name !== undefined) {
    const param = method === undefined ? undefined : NAME_PARAM[method];
    const value = param === undefined ? undefined : message.params?.[param];
    if (typeof value !== "string" || (value !== headers.name && decodedHeader(headers.name) !== value)) {
      return `the Mcp-Name header (\`${headers.name}\`) does not match the body's ${param ?? "name"}`;
    }
  }
  return undefined;
}

/**
 * MCP writes a header value that is not a plain token as `=?base64?<b64>?=`
 * (UTF-8 inside); undefined when the value is not in that form.
 */
function decodedHeader(value: string): string | undefined {
  const match = /^=\?base64\?([A-Za-z0-9+/]*={0,2})\?=$/.exec(value);
  if (match === null) return undefined;
  return Buffer.from(match[1] ?? "", "base64").toString("utf8");
}

/** One header's value: absent, or the single value given (a repeated header counts as disagreeing). */
export function headerValue(raw: string | string[] | undefined): string | undefined {
  if (raw === undefined) return undefined;
  return Array.isArray(raw) ? raw.join(",") : raw.trim();
}
