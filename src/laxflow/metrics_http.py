"""Serving a Prometheus registry over HTTP: what the daemon and the coordinator share.

``--metrics-bind`` and ``--metrics-port`` of both commands: :func:`check_bind`
validates the address, :func:`serve_registry` starts prometheus-client's
server thread on it.
"""

from __future__ import annotations

import ipaddress
import re

from prometheus_client import CollectorRegistry, start_http_server

from laxflow.errors import UserError

DEFAULT_BIND = "127.0.0.1"  # /metrics of the daemon and the coordinator: this host only unless configured
_LABEL = r"[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?"
_HOST_RE = re.compile(rf"^(?=.{{1,253}}$){_LABEL}(\.{_LABEL})*$")  # a host name, no scheme or port


def check_bind(value: object, what: str) -> str:
    """A ``--metrics-bind`` value (an IP address or a host name; ``what`` names the flag and key), else one
    UserError."""
    if isinstance(value, str):
        try:
            ipaddress.ip_address(value)
            return value
        except ValueError:
            if _HOST_RE.match(value):
                return value
    raise UserError(f"{what}: expected an IP address or host name to listen on, got {value!r}")


def serve_registry(registry: CollectorRegistry, host: str, port: int, what: str) -> int:
    """Serve ``registry`` on http://host:port/metrics (port 0 picks one); the bound port, or one UserError."""
    try:
        server, _ = start_http_server(port, addr=host, registry=registry)
    except (OSError, ValueError) as exc:  # in use, not an address of this host, a name that does not resolve
        reason = getattr(exc, "strerror", None) or exc
        raise UserError(f"{what}: cannot serve metrics on {host} port {port} (--metrics-bind, --metrics-port): "
                        f"{reason}") from None
    return int(server.server_address[1])
