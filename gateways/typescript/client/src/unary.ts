//! One unary gRPC call on the client's HTTP/2 connection, without connect-es's generic call
//! pipeline. Measured (issue 32): connect's unary call cost the gateway ~1.7 ms of CPU per
//! `Decide` on the 2-core workplace box, @grpc/grpc-js ~1.5 ms, this ~0.9 ms — its async
//! iterables, abort signals and an error built at every call's end are most of the difference.
//!
//! What is not hand-written here is connect's: the HTTP/2 connection (its Http2SessionManager,
//! shared with the streaming calls, which keep going through connect), and the reading of a
//! gRPC status (`validateResponse`, `validateTrailer`: codes, messages and the
//! `grpc-status-details-bin` details as a ConnectError). Every failure is a ConnectError, so
//! `decodeError` reads it as it reads connect's own.

import { constants as h2, type ClientHttp2Stream, type IncomingHttpHeaders } from "node:http2";
import {
  create,
  fromBinary,
  isMessage,
  toBinary,
  type DescMessage,
  type DescMethodUnary,
  type MessageInitShape,
  type MessageShape,
} from "@bufbuild/protobuf";
import { Code, ConnectError } from "@connectrpc/connect";
import { validateResponse, validateTrailer } from "@connectrpc/connect/protocol-grpc";
import type { Http2SessionManager } from "@connectrpc/connect-node";

/** A gRPC message's envelope: one flags byte (0: not compressed), a big-endian 32-bit length. */
const ENVELOPE_BYTES = 5;

/** What each unary call carries besides the per-call ones (authorization, user-agent, …). */
export type FixedHeaders = Readonly<Record<string, string>>;

/**
 * Calls `method` with `input` and resolves with its one output message; rejects with a
 * ConnectError: the server's gRPC status (with its details), `deadline_exceeded` after
 * `timeoutMs` ("the operation timed out", connect's words), `canceled` when `signal` aborts,
 * and what the connection's failure maps to (connect-node's mapping: `unavailable` for a
 * refused or unresolvable host).
 */
export function unaryCall<I extends DescMessage, O extends DescMessage>(
  sessions: Http2SessionManager,
  method: DescMethodUnary<I, O>,
  input: MessageInitShape<I>,
  fixed: FixedHeaders,
  timeoutMs: number,
  signal?: AbortSignal,
): Promise<MessageShape<O>> {
  const message = isMessage(input, method.input) ? input : create(method.input, input);
  const bytes = toBinary(method.input, message);
  const frame = Buffer.allocUnsafe(ENVELOPE_BYTES + bytes.length);
  frame[0] = 0;
  frame.writeUInt32BE(bytes.length, 1);
  frame.set(bytes, ENVELOPE_BYTES);
  const headers = { ...fixed, "grpc-timeout": `${Math.max(1, Math.ceil(timeoutMs))}m` };
  const path = `/${method.parent.typeName}/${method.name}`;

  return new Promise<MessageShape<O>>((resolve, reject) => {
    let settled = false;
    let stream: ClientHttp2Stream | undefined;
    const settle = (error: ConnectError | undefined, output?: MessageShape<O>) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      signal?.removeEventListener("abort", onAbort);
      if (error === undefined) {
        resolve(output as MessageShape<O>);
        return;
      }
      // A call given up on is cancelled on the wire too (RST_STREAM CANCEL, as connect does).
      if (stream !== undefined && !stream.closed) stream.close(h2.NGHTTP2_CANCEL);
      reject(error);
    };
    const onAbort = () => settle(ConnectError.from(signal?.reason ?? new Error("This operation was aborted"), Code.Canceled));
    const timer = setTimeout(() => settle(new ConnectError("the operation timed out", Code.DeadlineExceeded)), Math.max(0, timeoutMs));
    if (signal !== undefined) {
      if (signal.aborted) {
        onAbort();
        return;
      }
      signal.addEventListener("abort", onAbort);
    }

    sessions.request("POST", path, headers, {}).then(
      (opened) => {
        if (settled) {
          opened.close(h2.NGHTTP2_CANCEL);
          return;
        }
        stream = opened;
        let head: IncomingHttpHeaders | undefined;
        let trailers: IncomingHttpHeaders | undefined;
        const chunks: Buffer[] = [];
        opened.once("response", (received) => {
          head = received;
        });
        opened.on("data", (chunk: Buffer) => {
          chunks.push(chunk);
          sessions.notifyResponseByteRead(opened);
        });
        opened.once("trailers", (received) => {
          trailers = received;
        });
        // A stream the server reset is an error event first: its code says more than the error.
        opened.on("error", (error) => settle(fromResetCode(opened.rstCode) ?? fromNodeReason(error)));
        opened.once("close", () => {
          if (settled) return;
          try {
            settle(undefined, outputOf(method, opened.rstCode, head, trailers, chunks));
          } catch (error) {
            settle(ConnectError.from(error, Code.Internal));
          }
        });
        opened.end(frame);
      },
      (error: unknown) => settle(fromNodeReason(error)),
    );
  });
}

/** The call's output once its stream has closed; throws the ConnectError the exchange amounts to. */
function outputOf<O extends DescMessage>(
  method: DescMethodUnary<DescMessage, O>,
  rstCode: number,
  head: IncomingHttpHeaders | undefined,
  trailers: IncomingHttpHeaders | undefined,
  chunks: Buffer[],
): MessageShape<O> {
  const reset = fromResetCode(rstCode);
  if (reset !== undefined) throw reset;
  if (head === undefined) throw new ConnectError("protocol error: the stream closed without a response", Code.Internal);
  const header = webHeaders(head);
  // A trailers-only answer (most errors) has its status in the head: headerError.
  const { headerError } = validateResponse(Number(head[":status"] ?? 0), header);
  if (headerError !== undefined) throw headerError;
  validateTrailer(webHeaders(trailers ?? {}), header);
  const body = chunks.length === 1 ? (chunks[0] as Buffer) : Buffer.concat(chunks);
  if (body.length < ENVELOPE_BYTES) {
    throw new ConnectError("protocol error: missing output message for unary method", Code.Unimplemented);
  }
  const flags = body[0] as number;
  const length = body.readUInt32BE(1);
  if (flags !== 0) throw new ConnectError("protocol error: received a compressed or flagged message", Code.Internal);
  if (body.length < ENVELOPE_BYTES + length) throw new ConnectError("protocol error: promised more data than received", Code.InvalidArgument);
  if (body.length > ENVELOPE_BYTES + length) {
    throw new ConnectError("protocol error: received extra output message for unary method", Code.Unimplemented);
  }
  return fromBinary(method.output, body.subarray(ENVELOPE_BYTES));
}

/** Node's HTTP/2 header object as a WHATWG Headers, pseudo-headers left out. */
function webHeaders(node: IncomingHttpHeaders): Headers {
  const headers = new Headers();
  for (const [name, value] of Object.entries(node)) {
    if (name.startsWith(":") || value === undefined) continue;
    if (Array.isArray(value)) for (const item of value) headers.append(name, item);
    else headers.set(name, String(value));
  }
  return headers;
}

/** connect-node's mapping of a stream reset to a gRPC code (PROTOCOL-HTTP2.md, "Errors"). */
function fromResetCode(rstCode: number): ConnectError | undefined {
  let code: Code;
  switch (rstCode) {
    case h2.NGHTTP2_PROTOCOL_ERROR:
    case h2.NGHTTP2_INTERNAL_ERROR:
    case h2.NGHTTP2_FLOW_CONTROL_ERROR:
    case h2.NGHTTP2_SETTINGS_TIMEOUT:
    case h2.NGHTTP2_FRAME_SIZE_ERROR:
    case h2.NGHTTP2_COMPRESSION_ERROR:
    case h2.NGHTTP2_CONNECT_ERROR:
      code = Code.Internal;
      break;
    case h2.NGHTTP2_REFUSED_STREAM:
      code = Code.Unavailable;
      break;
    case h2.NGHTTP2_CANCEL:
      code = Code.Canceled;
      break;
    case h2.NGHTTP2_ENHANCE_YOUR_CALM:
      code = Code.ResourceExhausted;
      break;
    case h2.NGHTTP2_INADEQUATE_SECURITY:
    case h2.NGHTTP2_HTTP_1_1_REQUIRED:
      code = Code.PermissionDenied;
      break;
    default:
      return undefined; // NO_ERROR, and STREAM_CLOSED, which gRPC does not map
  }
  return new ConnectError(`http/2 stream closed with error code 0x${rstCode.toString(16)}`, code);
}

/** connect-node's mapping of a Node error (its `code`, or a cause's) to a ConnectError. */
function fromNodeReason(reason: unknown): ConnectError {
  if (reason instanceof ConnectError) return reason;
  const codes: string[] = [];
  for (let inner = reason, depth = 0; inner instanceof Error && depth < 8; inner = inner.cause, depth++) {
    const code = (inner as NodeJS.ErrnoException).code;
    if (typeof code === "string") codes.push(code);
  }
  let code = Code.Internal;
  if (codes.some((c) => c === "ERR_STREAM_WRITE_AFTER_END" || c === "ERR_STREAM_DESTROYED" || c === "ERR_HTTP2_INVALID_STREAM" || c === "ECONNRESET")) {
    code = Code.Aborted;
  } else if (codes.some((c) => c === "ETIMEDOUT" || c === "ENOTFOUND" || c === "EAI_AGAIN" || c === "ECONNREFUSED")) {
    code = Code.Unavailable;
  }
  const error = ConnectError.from(reason, code);
  if (error !== reason) error.cause = reason;
  return error;
}
