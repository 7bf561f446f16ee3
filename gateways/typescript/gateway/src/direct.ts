//! The direct path's outbound half (docs/decisions/0036-a-direct-path-for-tool-calls.md): one
//! `tools/call` POSTed as raw JSON-RPC on an upstream's SDK session — its `Mcp-Session-Id`, its
//! negotiated `MCP-Protocol-Version` — over a kept-alive HTTP connection. The SDK session stays
//! the pool's (handshake, GET stream, everything that is not a tool call); this only moves the
//! call and its answer.
//!
//! node:http with a keep-alive Agent rather than the global fetch: a socket goes back to the
//! Agent once its response has been read to the end, which this module always does (an SSE
//! answer is drained after our response, servers close it then), and a reused socket that the
//! upstream closed while idle is known (`reusedSocket`) and retried once on a fresh one.
//! Nothing read from an upstream is unbounded: an answer over MAX_UPSTREAM_ANSWER_BYTES is cut.

import { Agent as HttpAgent, request as httpRequest, type ClientRequest, type IncomingMessage } from "node:http";
import { Agent as HttpsAgent, request as httpsRequest } from "node:https";
import { StringDecoder } from "node:string_decoder";

/**
 * The most the gateway reads of one upstream answer (a JSON body, or a whole SSE stream): four
 * times the 4 MiB a caller may send it, so a tool's result may be larger than its request
 * (an image, a file) without an upstream being able to fill the gateway's memory.
 */
export const MAX_UPSTREAM_ANSWER_BYTES = 16 * 1024 * 1024;
/** What is read of an answer that is refused anyway (an HTTP error) before its socket is dropped. */
const MAX_DISCARDED_BYTES = 64 * 1024;

/** Where and as whom to call: the SDK session's URL, credential, id and negotiated version. */
export interface DirectTarget {
  readonly url: URL;
  readonly credential: string;
  readonly sessionId: string | undefined;
  readonly protocolVersion: string | undefined;
}

/** A JSON-RPC message the upstream sent on its own, as the SDK client would see it. */
export interface Notification {
  readonly method: string;
  readonly params?: Record<string, unknown> | undefined;
}

/** The upstream's answer to the call: its `result` as sent, or its JSON-RPC `error`. */
export type DirectAnswer =
  | { readonly result: Record<string, unknown> }
  | { readonly error: { readonly code: number; readonly message: string; readonly data?: unknown } };

/** HTTP 404: the upstream does not know the session (restarted, or expired it). */
export class SessionGone extends Error {
  override readonly name = "SessionGone";
}

/** The deadline passed before the answer came. */
export class DirectTimeout extends Error {
  override readonly name = "DirectTimeout";
}

/** The upstream failed the call at transport level; the message holds no credential. */
export class DirectFailure extends Error {
  override readonly name = "DirectFailure";
}

/** Errors that say a kept socket was closed by the upstream before it read our request. */
const STALE_SOCKET_CODES = new Set(["ECONNRESET", "EPIPE", "ECONNABORTED"]);

/** A server-to-client request during a call: the SDK client, without capabilities, answers these. */
function answerTo(request: { id: unknown; method: string }): object {
  if (request.method === "ping") return { jsonrpc: "2.0", id: request.id, result: {} };
  return { jsonrpc: "2.0", id: request.id, error: { code: -32601, message: "Method not found" } };
}

function isObject(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

/** A JSON-RPC response's answer, or undefined when `message` is not a well-formed one. */
function answerOf(message: Record<string, unknown>): DirectAnswer | undefined {
  if (message.jsonrpc !== "2.0") return undefined;
  if ("result" in message) return isObject(message.result) ? { result: message.result } : undefined;
  const error = message.error;
  if (!isObject(error) || !Number.isSafeInteger(error.code) || typeof error.message !== "string") return undefined;
  return { error: { code: error.code as number, message: error.message, ...("data" in error && { data: error.data }) } };
}

/**
 * SSE as the WHATWG parser reads it, for what a JSON-RPC stream uses: `data` lines joined by
 * "\n", the `event` type, lines ending in CRLF, LF or CR, comments and other fields ignored.
 */
export class SseDecoder {
  #pending = "";
  #data: string[] = [];
  #event = "";

  /** The events `text` completes, each with its type ("message" when it named none). */
  push(text: string): Array<{ event: string; data: string }> {
    const events: Array<{ event: string; data: string }> = [];
    let buffer = this.#pending + text;
    let start = 0;
    for (;;) {
      const lf = buffer.indexOf("\n", start);
      const cr = buffer.indexOf("\r", start);
      let end: number;
      let next: number;
      if (cr !== -1 && (lf === -1 || cr < lf)) {
        // A CR at the end may be the first half of a CRLF still to come.
        if (cr === buffer.length - 1) break;
        end = cr;
        next = buffer[cr + 1] === "\n" ? cr + 2 : cr + 1;
      } else if (lf !== -1) {
        end = lf;
        next = lf + 1;
      } else {
        break;
      }
      this.#line(buffer.slice(start, end), events);
      start = next;
    }
    buffer = buffer.slice(start);
    this.#pending = buffer;
    return events;
  }

  #line(line: string, events: Array<{ event: string; data: string }>): void {
    if (line === "") {
      if (this.#data.length > 0) events.push({ event: this.#event === "" ? "message" : this.#event, data: this.#data.join("\n") });
      this.#data = [];
      this.#event = "";
      return;
    }
    if (line.startsWith(":")) return;
    const colon = line.indexOf(":");
    const field = colon === -1 ? line : line.slice(0, colon);
    let value = colon === -1 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (field === "data") this.#data.push(value);
    else if (field === "event") this.#event = value;
  }
}

/** One call's exchange: the request, its deadline, and how its answer ends. */
interface Exchange {
  readonly target: DirectTarget;
  readonly id: string;
  readonly deadline: number;
  readonly onNotification: (notification: Notification) => void;
}

/**
 * The pool's HTTP client for direct calls: one keep-alive Agent per scheme for the pool's
 * life, shared by every upstream it calls.
 */
export class DirectClient {
  readonly #http = new HttpAgent({ keepAlive: true, scheduling: "lifo" });
  readonly #https = new HttpsAgent({ keepAlive: true, scheduling: "lifo" });
  #counter = 0;

  /**
   * `tools/call` of `name` with `args` on `target`'s session, answered before `deadline`
   * (epoch ms). Resolves with the upstream's result or JSON-RPC error; rejects with
   * SessionGone (HTTP 404), DirectTimeout or DirectFailure. Notifications the upstream sends
   * on the answer's stream go to `onNotification`.
   */
  async call(
    target: DirectTarget,
    name: string,
    args: Record<string, unknown> | undefined,
    deadline: number,
    onNotification: (notification: Notification) => void,
  ): Promise<DirectAnswer> {
    const id = `capgate-${++this.#counter}`;
    const body = JSON.stringify({
      jsonrpc: "2.0",
      id,
      method: "tools/call",
      params: { name, ...(args !== undefined && { arguments: args }) },
    });
    const exchange: Exchange = { target, id, deadline, onNotification };
    const response = await this.#post(exchange, body, true);
    return this.#answer(exchange, response);
  }

  /** Closes every kept connection. */
  close(): void {
    this.#http.destroy();
    this.#https.destroy();
  }

  /**
   * POSTs `body` and resolves with the response once its head is in. A kept socket the
   * upstream had closed fails before any response; that is retried once, on another socket.
   */
  #post(exchange: Exchange, body: string, retry: boolean): Promise<IncomingMessage> {
    const { target, deadline } = exchange;
    const headers: Record<string, string> = {
      Authorization: `Bearer ${target.credential}`,
      "Content-Type": "application/json",
      Accept: "application/json, text/event-stream",
      "Content-Length": String(Buffer.byteLength(body, "utf8")),
    };
    if (target.sessionId !== undefined) headers["Mcp-Session-Id"] = target.sessionId;
    if (target.protocolVersion !== undefined) headers["MCP-Protocol-Version"] = target.protocolVersion;
    return new Promise<IncomingMessage>((resolve, reject) => {
      let request: ClientRequest;
      try {
        request = this.#request(target.url, headers);
      } catch (error) {
        reject(new DirectFailure(`cannot send to the upstream: ${error instanceof Error ? error.message : String(error)}`));
        return;
      }
      let answer: IncomingMessage | undefined;
      // The timer bounds the whole exchange, the answer's body included: it is cleared when the
      // response has ended or its socket is gone, not when the response's head arrives.
      const timer = setTimeout(() => (answer ?? request).destroy(new DirectTimeout()), Math.max(0, deadline - Date.now()));
      request.once("response", (response) => {
        answer = response;
        response.once("close", () => clearTimeout(timer));
        resolve(response);
      });
      // `on`, not `once`: a request destroyed after its response may report more than one error.
      request.on("error", (error) => {
        if (answer !== undefined) return; // the response reports it
        clearTimeout(timer);
        const code = (error as NodeJS.ErrnoException).code;
        if (retry && request.reusedSocket && code !== undefined && STALE_SOCKET_CODES.has(code)) {
          this.#post(exchange, body, false).then(resolve, reject);
          return;
        }
        reject(error instanceof DirectTimeout ? error : new DirectFailure(describe(error)));
      });
      request.end(body);
    });
  }

  #request(url: URL, headers: Record<string, string>): ClientRequest {
    if (url.protocol === "http:") return httpRequest(url, { method: "POST", headers, agent: this.#http });
    if (url.protocol === "https:") return httpsRequest(url, { method: "POST", headers, agent: this.#https });
    throw new Error(`an upstream URL is http or https, not ${url.protocol}`);
  }

  /** Reads `response` for the call's answer; the rest of it is read too, for the socket's sake. */
  #answer(exchange: Exchange, response: IncomingMessage): Promise<DirectAnswer> {
    const status = response.statusCode ?? 0;
    if (status !== 200) {
      discard(response);
      if (status === 404) return Promise.reject(new SessionGone("the upstream does not know the session (HTTP 404)"));
      return Promise.reject(new DirectFailure(`the upstream answered HTTP ${status}`));
    }
    const type = (response.headers["content-type"] ?? "").split(";")[0]?.trim().toLowerCase();
    if (type === "application/json") return this.#json(exchange, response);
    if (type === "text/event-stream") return this.#stream(exchange, response);
    discard(response);
    return Promise.reject(new DirectFailure(`the upstream answered ${type === "" ? "no Content-Type" : `\`${type}\``}, not JSON or SSE`));
  }

  #json(exchange: Exchange, response: IncomingMessage): Promise<DirectAnswer> {
    return new Promise((resolve, reject) => {
      const chunks: Buffer[] = [];
      let size = 0;
      response.on("data", (chunk: Buffer) => {
        size += chunk.length;
        if (size > MAX_UPSTREAM_ANSWER_BYTES) {
          response.destroy();
          reject(new DirectFailure(`the upstream's answer is over ${MAX_UPSTREAM_ANSWER_BYTES} bytes`));
          return;
        }
        chunks.push(chunk);
      });
      response.once("end", () => {
        let message: unknown;
        try {
          message = JSON.parse(Buffer.concat(chunks).toString("utf8"));
        } catch {
          reject(new DirectFailure("the upstream's answer is not JSON"));
          return;
        }
        const answer = isObject(message) && message.id === exchange.id ? answerOf(message) : undefined;
        if (answer === undefined) reject(new DirectFailure("the upstream's answer is not the call's JSON-RPC response"));
        else resolve(answer);
      });
      response.on("error", (error) => reject(error instanceof DirectTimeout ? error : new DirectFailure(describe(error))));
      response.once("close", () => {
        if (!response.complete) reject(new DirectFailure("the upstream closed the connection mid-answer"));
      });
    });
  }

  /**
   * An SSE answer: events until our response, which settles the call at once; then the stream
   * is read to its end (servers close it after the response) so its socket can be kept.
   */
  #stream(exchange: Exchange, response: IncomingMessage): Promise<DirectAnswer> {
    return new Promise((resolve, reject) => {
      const decoder = new StringDecoder("utf8");
      const sse = new SseDecoder();
      let size = 0;
      let settled = false;
      const fail = (error: Error) => {
        if (!settled) reject(error);
        settled = true;
      };
      const onEvent = (data: string) => {
        let message: unknown;
        try {
          message = JSON.parse(data);
        } catch {
          return; // the SDK client reports and skips an event it cannot read
        }
        if (!isObject(message)) return;
        if (typeof message.method === "string") {
          if ("id" in message) {
            this.#reply(exchange, answerTo({ id: message.id, method: message.method }));
          } else {
            const params = isObject(message.params) ? message.params : undefined;
            exchange.onNotification({ method: message.method, ...(params !== undefined && { params }) });
          }
          return;
        }
        if (message.id !== exchange.id || settled) return;
        settled = true;
        const answer = answerOf(message);
        if (answer === undefined) reject(new DirectFailure("the upstream's answer is not a JSON-RPC response"));
        else resolve(answer);
      };
      response.on("data", (chunk: Buffer) => {
        size += chunk.length;
        if (size > MAX_UPSTREAM_ANSWER_BYTES) {
          response.destroy();
          fail(new DirectFailure(`the upstream's answer is over ${MAX_UPSTREAM_ANSWER_BYTES} bytes`));
          return;
        }
        for (const event of sse.push(decoder.write(chunk))) if (event.event === "message") onEvent(event.data);
      });
      response.once("end", () => {
        // An event the stream ends inside of is not dispatched (as an EventSource would not).
        for (const event of sse.push(decoder.end())) if (event.event === "message") onEvent(event.data);
        // Checked first: an Error (its stack trace) per call for nothing, on the common end.
        if (!settled) fail(new DirectFailure("the upstream's stream ended without the call's response"));
      });
      response.on("error", (error) => fail(error instanceof DirectTimeout ? error : new DirectFailure(describe(error))));
      response.once("close", () => {
        if (!settled && !response.complete) fail(new DirectFailure("the upstream closed the stream mid-answer"));
      });
    });
  }

  /** Answers a server-to-client request on the session, within the call's deadline; best effort. */
  #reply(exchange: Exchange, message: object): void {
    this.#post(exchange, JSON.stringify(message), true).then(discard, () => undefined);
  }
}

/** Reads a response nobody needs to its end (so its socket is kept), or drops it when it is long. */
function discard(response: IncomingMessage): void {
  let size = 0;
  response.on("data", (chunk: Buffer) => {
    size += chunk.length;
    if (size > MAX_DISCARDED_BYTES) response.destroy();
  });
  response.on("error", () => undefined);
}

function describe(error: Error): string {
  const code = (error as NodeJS.ErrnoException).code;
  return code !== undefined && !error.message.includes(code) ? `${error.message} (${code})` : error.message;
}
