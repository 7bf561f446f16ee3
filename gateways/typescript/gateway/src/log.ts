//! The gateway's log: one JSON object per line on stderr. Callers pass only
//! fields that are safe to keep (ids, names, codes); a credential, token or
//! resolved secret is never a field.

export type Level = "debug" | "info" | "warn" | "error";

export type Fields = Record<string, string | number | boolean | undefined>;

export interface Logger {
  log(level: Level, event: string, fields?: Fields): void;
}

export const stderrLogger: Logger = {
  log(level, event, fields = {}) {
    process.stderr.write(`${JSON.stringify({ ts: new Date().toISOString(), level, event, ...fields })}\n`);
  },
};

/** Keeps what was logged, for tests. */
export class MemoryLogger implements Logger {
  readonly lines: Array<{ level: Level; event: string; fields: Fields }> = [];
  log(level: Level, event: string, fields: Fields = {}): void {
    this.lines.push({ level, event, fields });
  }
}
