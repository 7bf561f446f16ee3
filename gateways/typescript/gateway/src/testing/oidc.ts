//! Test support: an OpenID provider on loopback, as small as capgate's `oidc`
//! issuer needs (a discovery document and a JWKS), and RS256 tokens signed
//! with its key.

import { generateKeyPairSync, sign, type KeyObject } from "node:crypto";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";

export interface Provider {
  /** The issuer URL (`iss`), also the discovery document's base. */
  readonly issuer: string;
  readonly discovery: string;
  /** A compact JWS for these claims; `iss`, `iat` and `exp` (in an hour) unless given. */
  mint(claims: Record<string, unknown>, key?: "own" | "foreign"): string;
  close(): Promise<void>;
}

const b64url = (data: Buffer | string) => Buffer.from(data).toString("base64url");

function jws(claims: Record<string, unknown>, key: KeyObject, kid: string): string {
  const header = b64url(JSON.stringify({ alg: "RS256", typ: "JWT", kid }));
  const payload = b64url(JSON.stringify(claims));
  const signature = sign("sha256", Buffer.from(`${header}.${payload}`), key);
  return `${header}.${payload}.${b64url(signature)}`;
}

export async function startProvider(): Promise<Provider> {
  const own = generateKeyPairSync("rsa", { modulusLength: 2048 });
  const foreign = generateKeyPairSync("rsa", { modulusLength: 2048 });
  const kid = "test-key-1";
  const jwk = { ...own.publicKey.export({ format: "jwk" }), kid, alg: "RS256", use: "sig" };
  let issuer = "";
  const server: Server = createServer((req, res) => {
    if (req.url === "/.well-known/openid-configuration") {
      res.writeHead(200, { "Content-Type": "application/json" }).end(JSON.stringify({ issuer, jwks_uri: `${issuer}/jwks` }));
    } else if (req.url === "/jwks") {
      res.writeHead(200, { "Content-Type": "application/json" }).end(JSON.stringify({ keys: [jwk] }));
    } else {
      res.writeHead(404).end();
    }
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  issuer = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  return {
    issuer,
    discovery: `${issuer}/.well-known/openid-configuration`,
    mint(claims, key = "own") {
      const now = Math.floor(Date.now() / 1000);
      const full = { iss: issuer, iat: now, exp: now + 3600, ...claims };
      return jws(full, key === "own" ? own.privateKey : foreign.privateKey, kid);
    },
    close: () => new Promise((resolve) => server.close(() => resolve())),
  };
}
