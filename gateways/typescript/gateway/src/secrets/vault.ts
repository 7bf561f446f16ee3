//! `vault://<mount>/<path>[#<field>]`: HashiCorp Vault KV v2. `GET
//! $VAULT_ADDR/v1/<mount>/data/<path>` with `X-Vault-Token: $VAULT_TOKEN`;
//! the value is `data.data.<field>`, the field `value` unless named.

import { FETCH_TIMEOUT_MS, failed, fetchProblem, resolved, type Resolution } from "./resolution.js";

/** `rest` is the reference without `vault://`. */
export async function resolveVault(rest: string, env: NodeJS.ProcessEnv): Promise<Resolution> {
  const hash = rest.indexOf("#");
  const location = hash === -1 ? rest : rest.slice(0, hash);
  const field = hash === -1 ? "value" : rest.slice(hash + 1);
  const slash = location.indexOf("/");
  const mount = slash === -1 ? "" : location.slice(0, slash);
  const path = slash === -1 ? "" : location.slice(slash + 1);
  if (mount === "" || path === "" || field === "") {
    return failed("vault: the reference is not vault://<mount>/<path>[#<field>]");
  }
  const addr = env.VAULT_ADDR;
  if (addr === undefined || addr === "") return failed("vault: VAULT_ADDR is not set");
  const token = env.VAULT_TOKEN;
  if (token === undefined || token === "") return failed("vault: VAULT_TOKEN is not set");

  const url = `${addr.replace(/\/+$/, "")}/v1/${mount}/data/${path}`;
  let response: Response;
  try {
    response = await fetch(url, {
      headers: { "X-Vault-Token": token, Accept: "application/json" },
      signal: AbortSignal.timeout(FETCH_TIMEOUT_MS),
    });
  } catch (error) {
    return failed(`vault: cannot reach VAULT_ADDR (${fetchProblem(error)})`);
  }
  if (!response.ok) {
    await response.body?.cancel();
    return failed(`vault: \`${mount}/${path}\` answered HTTP ${response.status}`);
  }
  let body: unknown;
  try {
    body = await response.json();
  } catch {
    return failed(`vault: \`${mount}/${path}\` answered a body that is not JSON`);
  }
  const data = (body as { data?: { data?: Record<string, unknown> } } | null)?.data?.data;
  const value = data?.[field];
  if (typeof value !== "string" || value === "") {
    return failed(`vault: \`${mount}/${path}\` has no string field \`${field}\``);
  }
  return resolved(value);
}
