//! Test support: the processes a test starts (a gateway, an upstream), waited for by the JSON
//! line that says they are ready, and stopped with SIGTERM.

import { spawn, type ChildProcess } from "node:child_process";
import { createServer } from "node:net";
import type { AddressInfo } from "node:net";
import { createInterface } from "node:readline";

/** A port with nothing listening on it. */
export async function closedPort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const port = (server.address() as AddressInfo).port;
  await new Promise((resolve) => server.close(resolve));
  return port;
}

/** Starts a process and resolves with the first stdout/stderr JSON line `pick` accepts. */
export function startAndWait(
  args: string[],
  env: NodeJS.ProcessEnv,
  pick: (line: Record<string, unknown>) => string | undefined,
  logs: string[],
): Promise<{ child: ChildProcess; value: string }> {
  const child = spawn(process.execPath, args, { env, stdio: ["ignore", "pipe", "pipe"] });
  return new Promise((resolve, reject) => {
    const onLine = (line: string) => {
      logs.push(line);
      try {
        const value = pick(JSON.parse(line) as Record<string, unknown>);
        if (value !== undefined) resolve({ child, value });
      } catch {
        // not JSON: kept in logs, checked by the log test
      }
    };
    createInterface({ input: child.stdout! }).on("line", onLine);
    createInterface({ input: child.stderr! }).on("line", onLine);
    child.once("exit", (code) => reject(new Error(`${args.join(" ")} exited ${code}:\n${logs.join("\n")}`)));
  });
}

export function stop(child: ChildProcess | undefined): Promise<void> {
  return new Promise((resolve) => {
    if (child === undefined || child.exitCode !== null || child.signalCode !== null) return resolve();
    child.once("exit", () => resolve());
    child.kill("SIGTERM");
  });
}
