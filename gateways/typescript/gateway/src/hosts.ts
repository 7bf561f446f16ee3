//! DNS-rebinding protection: which `Host` and `Origin` headers the gateway
//! answers to. A page on `evil.example.com` that makes its name resolve to
//! 127.0.0.1 reaches a loopback gateway with `Host: evil.example.com`; a
//! gateway that answers only to its own names refuses it (HTTP 421, and 403
//! for a foreign `Origin`). On by default for a loopback `--listen`
//! (`localhost`, `127.0.0.1`, `::1`, any port); `--allowed-host` names the
//! hosts for any other bind, which otherwise has no check (a gateway on a
//! routable address sits behind a proxy that picks the names). The same rules
//! as the Python gateway's `edge.HostCheck`.

import { isIP } from "node:net";

export const LOOPBACK_NAMES: readonly string[] = ["localhost", "127.0.0.1", "::1"];

/** `name[:port]` or `[v6][:port]` → the lowercased name without brackets, and the port if any. */
function splitHost(value: string): { name: string; port: string | undefined } {
  const text = value.trim().toLowerCase();
  if (text.startsWith("[")) {
    const close = text.indexOf("]");
    const name = close < 0 ? text.slice(1) : text.slice(1, close);
    const rest = close < 0 ? "" : text.slice(close + 1);
    return { name, port: rest.startsWith(":") ? rest.slice(1) : undefined };
  }
  const colon = text.lastIndexOf(":");
  // No port, or a bare IPv6 address (more than one colon).
  if (colon < 0 || text.indexOf(":") !== colon) return { name: text, port: undefined };
  return { name: text.slice(0, colon), port: text.slice(colon + 1) };
}

export function isLoopback(host: string): boolean {
  const name = host.toLowerCase().replace(/^\[(.*)\]$/, "$1");
  if (name === "localhost") return true;
  if (isIP(name) === 4) return name.startsWith("127.");
  return name === "::1" || name === "0:0:0:0:0:0:0:1";
}

export class HostCheck {
  private constructor(
    private readonly hosts: readonly string[],
    private readonly origins: readonly string[],
  ) {}

  /** The check for a listener on `bindHost`, or undefined when there is none. */
  static forBind(bindHost: string, hosts: readonly string[], origins: readonly string[]): HostCheck | undefined {
    const cleanOrigins = origins.map((o) => o.toLowerCase().replace(/\/$/, ""));
    if (hosts.length > 0) return new HostCheck(hosts.map((h) => h.toLowerCase()), cleanOrigins);
    if (isLoopback(bindHost)) return new HostCheck(LOOPBACK_NAMES, cleanOrigins);
    return undefined;
  }

  hostAllowed(value: string | undefined): boolean {
    if (value === undefined || value === "") return false;
    const { name, port } = splitHost(value);
    return this.hosts.some((allowed) => {
      const want = splitHost(allowed);
      return want.name === name && (want.port === undefined || want.port === port);
    });
  }

  /** No `Origin` (a client that is not a browser) is fine; otherwise a listed origin or one on an allowed host. */
  originAllowed(value: string | undefined): boolean {
    if (value === undefined) return true;
    const origin = value.trim().toLowerCase().replace(/\/$/, "");
    if (this.origins.includes(origin)) return true;
    let url: URL;
    try {
      url = new URL(origin);
    } catch {
      return false;
    }
    return (url.protocol === "http:" || url.protocol === "https:") && this.hostAllowed(url.host);
  }
}
