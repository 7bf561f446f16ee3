#!/usr/bin/env node
//! `node gateway/dist/cli.js [flags]`: the command line both reference
//! gateways share (gateways/README.md), so one scenario runner drives either.
//! Usage errors exit 2; SIGTERM / SIGINT close the sessions and exit 0.

import { readFileSync } from "node:fs";
import { parseArgs } from "node:util";
import { createCapgateClient } from "@capgate/client";
import { Gateway } from "./gateway.js";
import { HostCheck } from "./hosts.js";
import { serveHttp } from "./http.js";
import { stderrLogger } from "./log.js";
import { SecretResolver } from "./secrets/index.js";
import { Fanout, loadRelayConfig, type RelayedUpstream } from "./relay.js";
import { serveStdio } from "./stdio.js";
import { DEFAULT_UPSTREAM_TIMEOUT_MS, UpstreamPool, type CallPath } from "./upstreams.js";
import { watchPolicy } from "./watch.js";

const USAGE = `usage: cli.js --capgate URL [--gateway-token-file FILE] [--ca-file FILE]
              (--listen HOST:PORT | --stdio) [--issuer ID] [--decide-timeout SECONDS]
              [--upstream-timeout SECONDS] [--relay FILE] [--allowed-host HOST]… [--allowed-origin ORIGIN]…
              [--call-path direct|sdk]

  --capgate URL              capgate's gRPC endpoint, e.g. http://127.0.0.1:50051  [env CAPGATE_URL]
  --gateway-token-file FILE  the gateway's token for capgate                     [env CAPGATE_GATEWAY_TOKEN_FILE]
  --ca-file FILE             CA bundle for an https capgate
  --listen HOST:PORT         serve MCP over Streamable HTTP at /mcp (port 0 picks one)
  --stdio                    serve MCP over stdio
  --issuer ID                issuer hint sent as Credential.issuer
  --decide-timeout SECONDS   deadline of every capgate call (default 2)
  --upstream-timeout SECONDS deadline of every upstream request, opening its session included (default 60)
  --relay FILE               the upstreams whose resources, prompts, completions and logging are relayed (JSON)
  --allowed-host HOST        a Host this gateway answers to (repeatable; default for a loopback
                             --listen: localhost, 127.0.0.1, ::1)
  --allowed-origin ORIGIN    an Origin accepted besides those of the allowed hosts (repeatable)
  --call-path direct|sdk     how tools/call travels (default direct): direct answers a 2025-era
                             session's calls below the MCP SDK and posts them to a 2025-era HTTP
                             upstream on kept connections; sdk sends every call through the SDKs
`;

function usage(problem: string): never {
  process.stderr.write(`error: ${problem}\n\n${USAGE}`);
  process.exit(2);
}

interface Config {
  readonly capgate: string;
  readonly tokenFile: string | undefined;
  readonly caFile: string | undefined;
  readonly listen: { readonly host: string; readonly port: number } | undefined;
  readonly issuer: string | undefined;
  readonly timeoutMs: number;
  readonly upstreamTimeoutMs: number;
  readonly relayed: RelayedUpstream[];
  readonly allowedHosts: string[];
  readonly allowedOrigins: string[];
  readonly callPath: CallPath;
}

function seconds(value: string | undefined, fallback: number, flag: string): number {
  const parsed = value === undefined ? fallback : Number(value);
  if (!Number.isFinite(parsed) || parsed <= 0) usage(`${flag} must be a number of seconds above 0`);
  return Math.round(parsed * 1000);
}

function parseListen(value: string): { host: string; port: number } {
  const colon = value.lastIndexOf(":");
  const host = value.slice(0, colon).replace(/^\[(.*)\]$/, "$1");
  const port = Number(value.slice(colon + 1));
  if (colon <= 0 || host === "" || !Number.isInteger(port) || port < 0 || port > 65535) {
    usage(`--listen: \`${value}\` is not HOST:PORT`);
  }
  return { host, port };
}

function config(argv: string[], env: NodeJS.ProcessEnv): Config {
  let values;
  try {
    ({ values } = parseArgs({
      args: argv,
      strict: true,
      allowPositionals: false,
      options: {
        capgate: { type: "string" },
        "gateway-token-file": { type: "string" },
        "ca-file": { type: "string" },
        listen: { type: "string" },
        stdio: { type: "boolean" },
        issuer: { type: "string" },
        "decide-timeout": { type: "string" },
        "upstream-timeout": { type: "string" },
        relay: { type: "string" },
        "allowed-host": { type: "string", multiple: true },
        "allowed-origin": { type: "string", multiple: true },
        "call-path": { type: "string" },
        help: { type: "boolean", short: "h" },
      },
    }));
  } catch (error) {
    usage(error instanceof Error ? error.message : String(error));
  }
  if (values.help) {
    process.stdout.write(USAGE);
    process.exit(0);
  }
  const capgate = values.capgate ?? env.CAPGATE_URL;
  if (capgate === undefined || capgate === "") usage("--capgate (or CAPGATE_URL) is required");
  if ((values.listen === undefined) === (values.stdio !== true)) usage("give exactly one of --listen and --stdio");
  const callPath = values["call-path"] ?? "direct";
  if (callPath !== "direct" && callPath !== "sdk") usage(`--call-path: \`${callPath}\` is neither direct nor sdk`);
  let relayed: RelayedUpstream[] = [];
  if (values.relay !== undefined) {
    try {
      relayed = loadRelayConfig(values.relay);
    } catch (error) {
      usage(`--relay: ${error instanceof Error ? error.message : String(error)}`);
    }
  }
  return {
    capgate,
    tokenFile: values["gateway-token-file"] ?? (env.CAPGATE_GATEWAY_TOKEN_FILE || undefined),
    caFile: values["ca-file"],
    listen: values.listen === undefined ? undefined : parseListen(values.listen),
    issuer: values.issuer,
    timeoutMs: seconds(values["decide-timeout"], 2, "--decide-timeout"),
    upstreamTimeoutMs: seconds(values["upstream-timeout"], DEFAULT_UPSTREAM_TIMEOUT_MS / 1000, "--upstream-timeout"),
    relayed,
    allowedHosts: values["allowed-host"] ?? [],
    allowedOrigins: values["allowed-origin"] ?? [],
    callPath,
  };
}

function readToken(file: string): string {
  try {
    return readFileSync(file, "utf8").replace(/\r?\n$/, "");
  } catch (error) {
    usage(`--gateway-token-file: cannot read \`${file}\` (${(error as NodeJS.ErrnoException).code ?? "error"})`);
  }
}

async function main(): Promise<void> {
  const cfg = config(process.argv.slice(2), process.env);
  const logger = stderrLogger;
  const capgate = createCapgateClient({
    url: cfg.capgate,
    ...(cfg.tokenFile !== undefined && { gatewayToken: readToken(cfg.tokenFile) }),
    ...(cfg.caFile !== undefined && { caFile: cfg.caFile }),
    timeoutMs: cfg.timeoutMs,
  });
  const fanout = new Fanout();
  const upstreams = new UpstreamPool(logger, {
    timeoutMs: cfg.upstreamTimeoutMs,
    callPath: cfg.callPath,
    onNotification: (key, notification) => fanout.deliver(key, notification),
  });
  const gateway = new Gateway({
    capgate,
    secrets: new SecretResolver(process.env),
    upstreams,
    logger,
    relayed: cfg.relayed,
    fanout,
    ...(cfg.issuer !== undefined && { issuer: cfg.issuer }),
  });

  const stop = new AbortController();
  const watching = watchPolicy(
    capgate,
    () => {
      const told = gateway.toolsChanged();
      logger.log("info", "tools_list_changed_sent", { sessions: told });
    },
    logger,
    stop.signal,
  );

  let closeTransport: () => Promise<void>;
  let ended: Promise<void>;
  if (cfg.listen !== undefined) {
    const hostCheck = HostCheck.forBind(cfg.listen.host, cfg.allowedHosts, cfg.allowedOrigins);
    const http = await serveHttp(gateway, logger, cfg.listen.host, cfg.listen.port, hostCheck, cfg.callPath);
    // The scenario runner waits for exactly this line.
    process.stderr.write(`${JSON.stringify({ event: "listening", url: http.url })}\n`);
    closeTransport = () => http.close();
    ended = new Promise<void>(() => undefined);
  } else {
    const stdio = serveStdio(gateway, process.env, logger);
    logger.log("info", "serving_stdio", {});
    closeTransport = () => stdio.close();
    ended = stdio.closed;
  }

  let stopping = false;
  const shutdown = async (why: string) => {
    if (stopping) return;
    stopping = true;
    logger.log("info", "stopping", { why });
    stop.abort();
    await closeTransport();
    await upstreams.closeAll();
    capgate.close();
    await watching;
    process.exit(0);
  };
  process.on("SIGTERM", () => void shutdown("SIGTERM"));
  process.on("SIGINT", () => void shutdown("SIGINT"));
  await ended;
  await shutdown("stdin closed");
}

main().catch((error: unknown) => {
  stderrLogger.log("error", "fatal", { why: error instanceof Error ? error.message : String(error) });
  process.exit(1);
});
