//! Follows capgate's WatchPolicy for the gateway's whole life. The first
//! revision seen is where things stand; every later one that differs from the
//! last seen is a change, and the callback tells the MCP sessions. When the
//! stream ends or fails, it reconnects with backoff; the first message after
//! a reconnect is compared too, so a change made while disconnected is not
//! missed. UNIMPLEMENTED (a capgate without WatchPolicy) is logged once and
//! retried every few seconds.

import { setTimeout as sleep } from "node:timers/promises";
import { CapgateError, type CapgateClient, type PolicyRevision } from "@capgate/client";
import type { Logger } from "./log.js";

export interface WatchOptions {
  readonly initialBackoffMs?: number;
  readonly maxBackoffMs?: number;
  readonly unimplementedRetryMs?: number;
}

export async function watchPolicy(
  capgate: CapgateClient,
  onChange: (revision: PolicyRevision) => void | Promise<void>,
  logger: Logger,
  signal: AbortSignal,
  options: WatchOptions = {},
): Promise<void> {
  const initialBackoffMs = options.initialBackoffMs ?? 250;
  const maxBackoffMs = options.maxBackoffMs ?? 10_000;
  const unimplementedRetryMs = options.unimplementedRetryMs ?? 5_000;
  let last: number | undefined;
  let backoffMs = initialBackoffMs;
  let saidUnimplemented = false;

  while (!signal.aborted) {
    let waitMs = backoffMs;
    try {
      for await (const revision of capgate.watchPolicy({ signal })) {
        backoffMs = initialBackoffMs;
        saidUnimplemented = false;
        if (last === undefined) {
          logger.log("info", "policy_watch", { policy_revision: revision.policyRevision });
        } else if (revision.policyRevision !== last) {
          logger.log("info", "policy_changed", { policy_revision: revision.policyRevision, previous: last });
          await onChange(revision);
        }
        last = revision.policyRevision;
      }
      logger.log("info", "policy_watch_ended", {});
    } catch (error) {
      if (signal.aborted) break;
      if (error instanceof CapgateError && error.code === "unimplemented") {
        if (!saidUnimplemented) {
          logger.log("warn", "policy_watch_unimplemented", { retry_ms: unimplementedRetryMs });
          saidUnimplemented = true;
        }
        waitMs = unimplementedRetryMs;
      } else {
        logger.log("warn", "policy_watch_failed", {
          why: error instanceof Error ? error.message : String(error),
          retry_ms: backoffMs,
        });
      }
    }
    if (signal.aborted) break;
    try {
      await sleep(waitMs, undefined, { signal });
    } catch {
      break;
    }
    backoffMs = Math.min(maxBackoffMs, backoffMs * 2);
  }
}
