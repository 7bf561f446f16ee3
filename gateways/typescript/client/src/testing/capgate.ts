//! Test support, not part of the client's API: a real `capgate serve` on a
//! loopback port with a fresh SQLite file, a gateway token and an admin
//! token, started from `$CAPGATE_BIN` (default: the repository's
//! `target/debug/capgate`). Imported as `@capgate/client/testing`.

import { spawn, type ChildProcess } from "node:child_process";
import { randomBytes } from "node:crypto";
import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";

/** The repository root, from `client/dist/testing/`. */
const REPO_ROOT = fileURLToPath(new URL("../../../../../", import.meta.url));

export function capgateBin(): string {
  return process.env.CAPGATE_BIN || join(REPO_ROOT, "target/debug/capgate");
}

export interface CapgateOptions {
  /** The policy artifact's YAML text. */
  readonly policy: string;
  readonly catalog?: string;
  /** Extra environment for capgate (e.g. a static-key issuer's key). */
  readonly env?: Readonly<Record<string, string>>;
  /** Serve TLS with this certificate chain and key (PEM files): the URL is then `https://`. */
  readonly tls?: { readonly cert: string; readonly key: string };
}

export interface Capgate {
  /** `http://127.0.0.1:PORT`. */
  readonly url: string;
  readonly dir: string;
  readonly gatewayToken: string;
  readonly gatewayTokenFile: string;
  readonly adminToken: string;
  readonly adminTokenFile: string;
  /** `capgate audit --json`, parsed: every record of the store. */
  audit(): Promise<Array<Record<string, unknown>>>;
  stop(): Promise<void>;
}

function run(args: string[]): Promise<string> {
  return new Promise((resolve, reject) => {
    const child = spawn(capgateBin(), args, { stdio: ["ignore", "pipe", "pipe"] });
    let out = "";
    let err = "";
    child.stdout.setEncoding("utf8").on("data", (c: string) => (out += c));
    child.stderr.setEncoding("utf8").on("data", (c: string) => (err += c));
    child.on("error", reject);
    child.on("close", (code) =>
      code === 0 ? resolve(out) : reject(new Error(`capgate ${args[0]} exited ${code}: ${err.trim()}`)),
    );
  });
}

/** Resolves with the first address once capgate logs `capgate serving`. */
function serving(child: ChildProcess): Promise<string> {
  return new Promise((resolve, reject) => {
    const seen: string[] = [];
    const onLine = (line: string) => {
      seen.push(line);
      let record: { fields?: { message?: unknown; addresses?: unknown } };
      try {
        record = JSON.parse(line) as typeof record;
      } catch {
        return;
      }
      if (record.fields?.message === "capgate serving" && typeof record.fields.addresses === "string") {
        const first = record.fields.addresses.split(",")[0]?.trim();
        if (first) resolve(first);
      }
    };
    for (const stream of [child.stdout, child.stderr]) {
      if (stream) createInterface({ input: stream }).on("line", onLine);
    }
    child.once("error", reject);
    child.once("exit", (code) => reject(new Error(`capgate serve exited ${code} before serving:\n${seen.join("\n")}`)));
  });
}

export async function startCapgate(options: CapgateOptions): Promise<Capgate> {
  const dir = mkdtempSync(join(tmpdir(), "capgate-ts-"));
  const gatewayToken = randomBytes(16).toString("hex");
  const adminToken = randomBytes(16).toString("hex");
  const gatewayTokenFile = join(dir, "gateway-token");
  const adminTokenFile = join(dir, "admin-token");
  writeFileSync(gatewayTokenFile, `${gatewayToken}\n`);
  writeFileSync(adminTokenFile, `${adminToken}\n`);
  writeFileSync(join(dir, "policy.yaml"), options.policy);
  const args = [
    "serve",
    "--listen",
    "127.0.0.1:0",
    "--log-format",
    "json",
    "--database-url",
    `sqlite://${join(dir, "capgate.db")}`,
    "--policy",
    join(dir, "policy.yaml"),
    "--gateway-token",
    `gw=file://${gatewayTokenFile}`,
    "--admin-token",
    `admin=file://${adminTokenFile}`,
  ];
  if (options.tls !== undefined) args.push("--tls-cert", options.tls.cert, "--tls-key", options.tls.key);
  if (options.catalog !== undefined) {
    writeFileSync(join(dir, "catalog.yaml"), options.catalog);
    args.push("--catalog", join(dir, "catalog.yaml"));
  }
  const child = spawn(capgateBin(), args, {
    stdio: ["ignore", "pipe", "pipe"],
    env: { ...process.env, CAPGATE_LOG: "info", ...options.env },
  });
  const address = await serving(child);
  const databaseUrl = `sqlite://${join(dir, "capgate.db")}`;
  return {
    url: `${options.tls === undefined ? "http" : "https"}://${address}`,
    dir,
    gatewayToken,
    gatewayTokenFile,
    adminToken,
    adminTokenFile,
    async audit() {
      const out = await run(["audit", "--database-url", databaseUrl, "--json", "--limit", "10000"]);
      const text = out.trim();
      if (text === "") return [];
      if (text.startsWith("[")) return JSON.parse(text) as Array<Record<string, unknown>>;
      return text.split("\n").map((line) => JSON.parse(line) as Record<string, unknown>);
    },
    stop() {
      return new Promise((resolve) => {
        if (child.exitCode !== null) return resolve();
        child.once("exit", () => resolve());
        child.kill("SIGTERM");
      });
    },
  };
}
