"""Envoy's bootstrap, read from docs/gateways/envoy.md and changed only where this machine differs.

The doc's one `static_resources` block is the configuration under test. What is changed, and
nothing else: the gateway token it says to substitute at deploy time; the listener's address
(loopback, a port of the kernel's choosing); the `capgate` cluster's endpoint; the doc's
example upstream (`payments`: its two routes and the `mcp_server` they name), repeated for each
upstream here, with the upstream's path; the upstreams' clusters, which the doc leaves to the
reader. Added for observation only: an admin interface on loopback (ready state, listener
port, the ext_authz filter's counters) and an access log with the metadata the filters wrote.
A variant (`Variant`) says what it changes on top, and why, next to the test that uses it.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import yaml

from pages import one_block, page, replace

DOC = page("envoy.md")
TOKEN_PLACEHOLDER = "${CAPGATE_GATEWAY_TOKEN}"
# The doc's example upstream, which each real upstream replaces.
DOC_UPSTREAM = "payments"

ACCESS_LOG_FORMAT = {
    "method": "%REQ(:METHOD)%",
    "path": "%REQ(:PATH)%",
    "status": "%RESPONSE_CODE%",
    "request_id": "%REQ(X-REQUEST-ID)%",
    "mcp_filter": "%DYNAMIC_METADATA(envoy.filters.http.mcp)%",
    "mcp_proxy": "%DYNAMIC_METADATA(mcp_proxy)%",
    "decision_id": "%DYNAMIC_METADATA(envoy.filters.http.ext_authz:decision_id)%",
}


def doc_bootstrap_text() -> str:
    """The doc's Envoy configuration, exactly as written there."""
    return one_block(DOC, "yaml", "static_resources:")


@dataclass(frozen=True)
class Upstream:
    """An MCP server behind Envoy: capgate's upstream id, and where it listens."""

    id: str
    host: str
    port: int
    path: str = "/mcp"


@dataclass(frozen=True)
class Variant:
    """What one Envoy changes on top of the doc's configuration (nothing, by default)."""

    name: str = "doc"
    # Request headers ext_authz does not send to capgate (`disallowed_headers`); the upstream
    # still gets them.
    withhold_headers: tuple[str, ...] = ()
    forward_body: bool = True
    metadata_namespaces: tuple[str, ...] | None = None
    # Envoy runtime keys set in a static layer.
    runtime: dict[str, Any] = field(default_factory=dict)


def _single(items: list[dict[str, Any]], what: str, **match: Any) -> dict[str, Any]:
    found = [item for item in items if all(item.get(k) == v for k, v in match.items())]
    if len(found) != 1:
        raise AssertionError(f"the doc's Envoy configuration should have one {what} {match}, found {len(found)}")
    return found[0]


def _upstream_routes(template: list[dict[str, Any]], upstream: Upstream) -> list[dict[str, Any]]:
    """The doc's routes for `payments`, as they read for `upstream`."""
    routes = []
    for route in copy.deepcopy(template):
        route["match"]["prefix"] = f"/{upstream.id}/mcp"
        route["route"]["cluster"] = upstream.id
        route["route"]["prefix_rewrite"] = upstream.path
        settings = route["typed_per_filter_config"]["envoy.filters.http.ext_authz"].get("check_settings")
        if settings is not None:
            settings["context_extensions"]["mcp_server"] = upstream.id
        routes.append(route)
    return routes


def _static_cluster(name: str, host: str, port: int) -> dict[str, Any]:
    return {
        "name": name,
        "type": "STATIC",
        "connect_timeout": "1s",
        "load_assignment": {
            "cluster_name": name,
            "endpoints": [{"lb_endpoints": [{"endpoint": {"address": {"socket_address": {
                "address": host, "port_value": port}}}}]}],
        },
    }


def bootstrap(*, gateway_token: str, capgate_port: int, upstreams: list[Upstream], variant: Variant = Variant()) -> dict[str, Any]:
    config = yaml.safe_load(replace(doc_bootstrap_text(), TOKEN_PLACEHOLDER, gateway_token, count=1, where=str(DOC)))

    listener = _single(config["static_resources"]["listeners"], "listener", name="mcp")
    listener["address"]["socket_address"].update(address="127.0.0.1", port_value=0)
    manager = _single(listener["filter_chains"][0]["filters"], "filter",
                      name="envoy.filters.network.http_connection_manager")["typed_config"]

    virtual_host = _single(manager["route_config"]["virtual_hosts"], "virtual host", name="mcp")
    template = [r for r in virtual_host["routes"] if r["match"].get("prefix") == f"/{DOC_UPSTREAM}/mcp"]
    if len(template) != len(virtual_host["routes"]) or not template:
        raise AssertionError(f"the doc's routes should all be {DOC_UPSTREAM}'s: {virtual_host['routes']}")
    virtual_host["routes"] = [route for upstream in upstreams for route in _upstream_routes(template, upstream)]

    capgate = _single(config["static_resources"]["clusters"], "cluster", name="capgate")
    endpoint = capgate["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]
    endpoint["address"]["socket_address"].update(address="127.0.0.1", port_value=capgate_port)
    config["static_resources"]["clusters"] += [_static_cluster(u.id, u.host, u.port) for u in upstreams]

    manager["access_log"] = [{
        "name": "envoy.access_loggers.stdout",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.access_loggers.stream.v3.StdoutAccessLog",
            "log_format": {"json_format": ACCESS_LOG_FORMAT},
        },
    }]
    config["admin"] = {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}}}
    _apply(variant, manager)
    if variant.runtime:
        config["layered_runtime"] = {"layers": [{"name": "variant", "static_layer": dict(variant.runtime)}]}
    return config


def _apply(variant: Variant, manager: dict[str, Any]) -> None:
    filters = manager["http_filters"]
    ext_authz = _single(filters, "http filter", name="envoy.filters.http.ext_authz")["typed_config"]
    if not variant.forward_body:
        del ext_authz["with_request_body"]
    if variant.metadata_namespaces is not None:
        ext_authz["metadata_context_namespaces"] = list(variant.metadata_namespaces)
    if variant.withhold_headers:
        ext_authz["disallowed_headers"] = {"patterns": [{"exact": h} for h in variant.withhold_headers]}
