//! What resolving a secret reference yields: the credential, or a one-line
//! reason that names the scheme and the cause and never the secret (it is
//! logged, returned to the MCP client and stored by `NoteDecision`).

export type Resolution =
  | { readonly ok: true; readonly credential: string }
  | { readonly ok: false; readonly detail: string };

export const resolved = (credential: string): Resolution => ({ ok: true, credential });

export const failed = (detail: string): Resolution => ({ ok: false, detail });

/** How long one Vault or token-endpoint request may take. */
export const FETCH_TIMEOUT_MS = 5000;

/** A fetch failure's cause as a short phrase (e.g. `ECONNREFUSED`), without URLs or bodies. */
export function fetchProblem(error: unknown): string {
  if (error instanceof Error && error.name === "TimeoutError") return `no answer within ${FETCH_TIMEOUT_MS} ms`;
  const cause = error instanceof Error ? (error.cause as { code?: unknown } | undefined) : undefined;
  if (cause !== undefined && typeof cause.code === "string") return cause.code;
  return "the request failed";
}
