//! `file:///abs/path`: the file's content, one trailing newline trimmed.

import { readFile } from "node:fs/promises";
import { fileURLToPath } from "node:url";
import { failed, resolved, type Resolution } from "./resolution.js";

export async function resolveFile(ref: string): Promise<Resolution> {
  let path: string;
  try {
    path = fileURLToPath(ref);
  } catch {
    return failed("file: the reference is not an absolute file:/// URL");
  }
  let content: string;
  try {
    content = await readFile(path, "utf8");
  } catch (error) {
    const code = (error as NodeJS.ErrnoException).code ?? "unreadable";
    return failed(`file: cannot read \`${path}\` (${code})`);
  }
  const value = content.replace(/\r?\n$/, "");
  if (value === "") return failed(`file: \`${path}\` is empty`);
  return resolved(value);
}
