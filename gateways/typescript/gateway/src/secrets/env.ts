//! `env://NAME`: the gateway process's environment variable NAME.

import { failed, resolved, type Resolution } from "./resolution.js";

export function resolveEnv(name: string, env: NodeJS.ProcessEnv): Resolution {
  if (name === "") return failed("env:// reference names no variable");
  const value = env[name];
  if (value === undefined) return failed(`env: variable \`${name}\` is not set`);
  if (value === "") return failed(`env: variable \`${name}\` is empty`);
  return resolved(value);
}
