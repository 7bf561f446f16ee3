//! The capgate client: one HTTP/2 connection to the service, the gateway's
//! token on every call, a deadline on every unary call, typed requests in and
//! typed answers (or typed errors) out. Nothing here decides anything.

import { readFileSync } from "node:fs";
import { create } from "@bufbuild/protobuf";
import type { DescMessage, DescMethodUnary, MessageInitShape, MessageShape } from "@bufbuild/protobuf";
import { createClient, type Client, type Interceptor } from "@connectrpc/connect";
import { createGrpcTransport, Http2SessionManager } from "@connectrpc/connect-node";
import {
  DecideRequestSchema,
  DecisionService,
  ListVisibleRequestSchema,
  type AssertedPrincipal as AssertedPrincipalPb,
  type Credential as CredentialPb,
} from "./gen/capgate/v1/decisions_pb.js";
import { PolicyService } from "./gen/capgate/v1/policies_pb.js";
import { decodeError } from "./errors.js";
import { unaryCall, type FixedHeaders } from "./unary.js";
import {
  activateResult,
  activePolicy,
  decideAnswer,
  listVisibleAnswer,
  policyRevision,
  policyVersions,
  publishResult,
  type ActivateResult,
  type ActivePolicy,
  type DecideAnswer,
  type ListVisibleAnswer,
  type PolicyRevision,
  type PolicyVersion,
  type PublishResult,
} from "./results.js";
import { noteKindValue, type NoteKindName } from "./vocabulary.js";

export interface ClientOptions {
  /** capgate's gRPC endpoint: `http://127.0.0.1:50051` or `https://capgate.example.net`. */
  readonly url: string;
  /** The gateway's (or an admin's) token, sent as `authorization: Bearer` metadata on every call. */
  readonly gatewayToken?: string;
  /** PEM CA bundle that signs an `https` capgate's certificate (the system roots otherwise). */
  readonly ca?: string | Buffer;
  /** The same, read from a file. */
  readonly caFile?: string;
  /** The deadline of every unary call unless the call says otherwise. Default 2000 ms. */
  readonly timeoutMs?: number;
}

/** Per call: a deadline other than the client's, and a way to give up early. */
export interface CallSettings {
  readonly timeoutMs?: number;
  readonly signal?: AbortSignal;
}

/** The caller's own credential, forwarded for capgate to authenticate. */
export type CallerCredential = (
  | { readonly bearerToken: string }
  | { readonly apiKey: string }
  | { readonly clientCertificate: string }
) & {
  /** Optional: the declared issuer the credential belongs to. */
  readonly issuer?: string;
};

/** A principal the gateway authenticated itself (asserting gateways only). */
export interface AssertedPrincipal {
  readonly issuer: string;
  readonly subject: string;
  /** Each name once; two or more values yield no attribute (capgate's rule). */
  readonly attributes?: Readonly<Record<string, string | readonly string[]>>;
}

export type Caller = { readonly credential: CallerCredential } | { readonly principal: AssertedPrincipal };

export type DecideRequest = {
  readonly caller: Caller;
  /** Optional idempotency key. */
  readonly requestId?: string;
  /**
   * The call's arguments object as JSON text (MCP `tools/call` params.arguments), what a grant's
   * conditions read; at most 64 KiB (capgate refuses INVALID_ARGUMENT beyond). Absent: not
   * forwarded, and a grant whose conditions read an argument denies with `arguments_missing`.
   */
  readonly argumentsJson?: string;
} & ({ readonly tool: string } | { readonly capability: string });

export interface ListVisibleRequest {
  readonly caller: Caller;
  readonly requestId?: string;
}

export interface NoteDecisionRequest {
  /** The allow's decision id. */
  readonly decisionId: string;
  readonly kind: NoteKindName;
  /** One line on why. Stored as given: never put a secret in it. */
  readonly detail: string;
}

export interface PublishRequest {
  readonly artifact: string;
  readonly catalog?: string;
  readonly expectedActiveRevision?: number;
  readonly dryRun?: boolean;
  readonly comment?: string;
}

export interface CapgateClient {
  /** `DecisionService.Decide`. */
  decide(request: DecideRequest, settings?: CallSettings): Promise<DecideAnswer>;
  /** `DecisionService.ListVisible`. */
  listVisible(request: ListVisibleRequest, settings?: CallSettings): Promise<ListVisibleAnswer>;
  /** `DecisionService.WatchPolicy`: no deadline; ends when the server ends it or `signal` aborts. */
  watchPolicy(settings?: { readonly signal?: AbortSignal }): AsyncIterable<PolicyRevision>;
  /** `DecisionService.NoteDecision`. */
  noteDecision(request: NoteDecisionRequest, settings?: CallSettings): Promise<void>;
  /** `PolicyService` (admin tokens only). */
  readonly policies: {
    publish(request: PublishRequest, settings?: CallSettings): Promise<PublishResult>;
    getActive(settings?: CallSettings): Promise<ActivePolicy>;
    listVersions(limit?: number, settings?: CallSettings): Promise<PolicyVersion[]>;
    activate(revision: number, expectedActiveRevision?: number, settings?: CallSettings): Promise<ActivateResult>;
  };
  /** Closes the connection; calls in flight fail. */
  close(): void;
}

function credentialPb(credential: CallerCredential): Omit<CredentialPb, "$typeName"> {
  const issuer = credential.issuer ?? "";
  if ("bearerToken" in credential) return { kind: { case: "bearerToken", value: credential.bearerToken }, issuer };
  if ("apiKey" in credential) return { kind: { case: "apiKey", value: credential.apiKey }, issuer };
  return { kind: { case: "clientCertificate", value: credential.clientCertificate }, issuer };
}

function principalPb(principal: AssertedPrincipal): Omit<AssertedPrincipalPb, "$typeName"> {
  const attributes = Object.entries(principal.attributes ?? {}).map(([name, values]) => ({
    $typeName: "capgate.v1.Attribute" as const,
    name,
    values: typeof values === "string" ? [values] : [...values],
  }));
  return { issuer: principal.issuer, subject: principal.subject, attributes };
}

function callerPb(caller: Caller) {
  return "credential" in caller
    ? ({ case: "credential", value: credentialPb(caller.credential) } as const)
    : ({ case: "principal", value: principalPb(caller.principal) } as const);
}

/** Runs one call, turning whatever it throws into a typed error. */
async function typed<T>(call: () => Promise<T>): Promise<T> {
  try {
    return await call();
  } catch (error) {
    throw decodeError(error);
  }
}

export function createCapgateClient(options: ClientOptions): CapgateClient {
  const defaultTimeoutMs = options.timeoutMs ?? 2000;
  const ca = options.ca ?? (options.caFile === undefined ? undefined : readFileSync(options.caFile));
  // Our own session manager, so that close() can end the HTTP/2 connection
  // (which would otherwise keep the process alive until it idles out).
  const sessions = new Http2SessionManager(options.url, {}, ca === undefined ? {} : { ca });
  const authorization = options.gatewayToken === undefined ? undefined : `Bearer ${options.gatewayToken}`;
  const bearer: Interceptor = (next) => async (req) => {
    if (authorization !== undefined) req.header.set("authorization", authorization);
    return next(req);
  };
  const transport = createGrpcTransport({
    baseUrl: options.url,
    sessionManager: sessions,
    interceptors: [bearer],
  });
  // Only the stream (WatchPolicy) goes through connect's call pipeline; the unary calls are
  // unaryCall's, on the same connection (unary.ts says why).
  const decisions: Client<typeof DecisionService> = createClient(DecisionService, transport);
  const fixed: FixedHeaders = {
    "content-type": "application/grpc+proto",
    te: "trailers",
    "user-agent": "capgate-client-ts/0.1.0",
    ...(authorization !== undefined && { authorization }),
  };
  const call = <I extends DescMessage, O extends DescMessage>(
    method: DescMethodUnary<I, O>,
    input: MessageInitShape<I>,
    settings: CallSettings | undefined,
  ): Promise<MessageShape<O>> =>
    unaryCall(sessions, method, input, fixed, settings?.timeoutMs ?? defaultTimeoutMs, settings?.signal);
  const decisionMethods = DecisionService.method;
  const policyMethods = PolicyService.method;

  return {
    decide: (request, settings) =>
      typed(async () => {
        const target =
          "tool" in request
            ? ({ case: "tool", value: request.tool } as const)
            : ({ case: "capability", value: request.capability } as const);
        const message = create(DecideRequestSchema, {
          caller: callerPb(request.caller),
          target,
          requestId: request.requestId ?? "",
          ...(request.argumentsJson !== undefined && { argumentsJson: request.argumentsJson }),
        });
        return decideAnswer(await call(decisionMethods.decide, message, settings));
      }),

    listVisible: (request, settings) =>
      typed(async () => {
        const message = create(ListVisibleRequestSchema, {
          caller: callerPb(request.caller),
          requestId: request.requestId ?? "",
        });
        return listVisibleAnswer(await call(decisionMethods.listVisible, message, settings));
      }),

    watchPolicy: (settings) => ({
      async *[Symbol.asyncIterator]() {
        try {
          const stream = decisions.watchPolicy({}, settings?.signal ? { signal: settings.signal } : {});
          for await (const revision of stream) yield policyRevision(revision);
        } catch (error) {
          throw decodeError(error);
        }
      },
    }),

    noteDecision: (request, settings) =>
      typed(async () => {
        await call(
          decisionMethods.noteDecision,
          { decisionId: request.decisionId, kind: noteKindValue(request.kind), detail: request.detail },
          settings,
        );
      }),

    policies: {
      publish: (request, settings) =>
        typed(async () =>
          publishResult(
            await call(
              policyMethods.publishPolicy,
              {
                artifact: request.artifact,
                ...(request.catalog !== undefined && { catalog: request.catalog }),
                ...(request.expectedActiveRevision !== undefined && {
                  expectedActiveRevision: BigInt(request.expectedActiveRevision),
                }),
                dryRun: request.dryRun ?? false,
                comment: request.comment ?? "",
              },
              settings,
            ),
          ),
        ),
      getActive: (settings) => typed(async () => activePolicy(await call(policyMethods.getActivePolicy, {}, settings))),
      listVersions: (limit, settings) =>
        typed(async () =>
          policyVersions((await call(policyMethods.listPolicyVersions, { limit: limit ?? 0 }, settings)).versions),
        ),
      activate: (revision, expectedActiveRevision, settings) =>
        typed(async () =>
          activateResult(
            await call(
              policyMethods.activatePolicy,
              {
                revision: BigInt(revision),
                ...(expectedActiveRevision !== undefined && {
                  expectedActiveRevision: BigInt(expectedActiveRevision),
                }),
              },
              settings,
            ),
          ),
        ),
    },

    close: () => sessions.abort(),
  };
}
