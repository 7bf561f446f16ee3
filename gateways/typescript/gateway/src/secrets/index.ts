//! Secret references (the account's `secret_ref` of an allow) turned into the
//! credential the upstream receives. One file per scheme; anything else is
//! refused with "no resolver for scheme `x`".

import { resolveEnv } from "./env.js";
import { resolveFile } from "./file.js";
import { OAuthResolver } from "./oauth.js";
import { failed, type Resolution } from "./resolution.js";
import { resolveVault } from "./vault.js";

export type { Resolution } from "./resolution.js";

export class SecretResolver {
  readonly #oauth: OAuthResolver;

  constructor(
    private readonly env: NodeJS.ProcessEnv = process.env,
    now: () => number = Date.now,
  ) {
    this.#oauth = new OAuthResolver((ref) => this.resolve(ref), now);
  }

  async resolve(ref: string): Promise<Resolution> {
    const sep = ref.indexOf("://");
    if (sep <= 0) return failed("the secret reference has no scheme");
    const scheme = ref.slice(0, sep);
    const rest = ref.slice(sep + 3);
    switch (scheme) {
      case "env":
        return resolveEnv(rest, this.env);
      case "file":
        return resolveFile(ref);
      case "vault":
        return resolveVault(rest, this.env);
      case "oauth+https":
      case "oauth+http":
        return this.#oauth.resolve(ref.slice("oauth+".length));
      default:
        return failed(`no resolver for scheme \`${scheme}\``);
    }
  }
}
