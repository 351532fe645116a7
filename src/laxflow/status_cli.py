"""``laxflow status``: what the cluster's coordinator sees now.

Asks the coordinator over its ROUTER socket (:func:`laxflow.coordinator.client.request_status`)
and prints rich tables, or one JSON object with ``--json`` for scripts. No
answer within ``--timeout`` is one error line and exit status 2.

JSON: the fields of :class:`~laxflow.protocol.messages.StatusResponse`, with
``seq`` null until the coordinator's first decision, and per daemon two keys
besides the message's: ``state`` ("alive" or "dead": a dead daemon stays
listed until the coordinator's ``--forget-after``) and ``last_seen`` (wall
clock s of its last message, ``now - heartbeat_age``).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Optional

import typer

DEFAULT_COORDINATOR = "tcp://127.0.0.1:5555"


def status(
    coordinator: str = typer.Option(DEFAULT_COORDINATOR, "--coordinator", help="The coordinator's --bind address."),
    as_json: bool = typer.Option(False, "--json", help="One JSON object on stdout."),
    curve_keys: Optional[Path] = typer.Option(None, "--curve-keys", help="Keys directory (needs coordinator.key and clients/NAME.key_secret)."),
    client: str = typer.Option("client", "--client", help="Client key name in the keys directory."),
    timeout: float = typer.Option(2.0, "--timeout", help="Seconds to wait for an answer."),
    hooks: Optional[str] = typer.Option(None, "--hooks", help="Also show this node's daemon: its hooks address "
                                        "(ipc://PATH, as `laxflow daemon --hooks`)."),
) -> None:
    """Daemons, active batches and requests, pruned set, queue depths, decision latency."""
    from laxflow.coordinator.client import request_status
    from laxflow.coordinator.keys import ClientKeys
    from laxflow.errors import UserError

    if not timeout > 0:
        raise UserError(f"--timeout must be > 0, got {timeout}")
    keys = ClientKeys.load(curve_keys, client) if curve_keys else None
    daemon = daemon_status(hooks, timeout) if hooks else None
    if daemon is not None and not as_json:
        typer.echo(daemon_line(daemon))  # before the coordinator's answer: it may not come (a refused key)
    resp = request_status(coordinator, keys=keys, timeout_s=timeout, detail=True)
    if as_json:
        out = as_dict(resp)
        if daemon is not None:
            out["daemon"] = dataclasses.asdict(daemon)
        typer.echo(json.dumps(out, sort_keys=True))
    else:
        render(resp)


def daemon_status(address: str, timeout_s: float) -> Any:
    """The node daemon's own status (a hooks StatusQuery); UserError if it does not answer in time."""
    import zmq

    from laxflow.errors import UserError
    from laxflow.protocol import hooks as hm
    from laxflow.protocol.wire import ProtocolError, decode, encode

    if not address.startswith("ipc://"):
        raise UserError(f"--hooks {address!r}: expected ipc://PATH")
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.DEALER)
    sock.linger = 0
    try:
        sock.connect(address)
        sock.send(encode(hm.StatusQuery(), "status"))
        if sock.poll(int(timeout_s * 1000)):
            try:
                body = decode(sock.recv()).body
            except ProtocolError as exc:
                raise UserError(f"--hooks {address}: the daemon's answer did not decode ({exc})") from None
            if isinstance(body, hm.Status):
                return body
        raise UserError(f"--hooks {address}: no daemon answered within {timeout_s:g} s")
    finally:
        sock.close(0)


def daemon_line(st: Any) -> str:
    """One line: the daemon's mode and, when the coordinator will not talk to it, why."""
    if not st.coordinator:
        return f"daemon {st.node}: local (no coordinator configured)"
    why = f": {st.coordinator_error}" if st.coordinator_error else ""
    return f"daemon {st.node}: {st.mode}{why} (coordinator {st.coordinator})"


def as_dict(resp: Any) -> dict[str, Any]:
    """The ``--json`` object (see the module docstring)."""
    out = dataclasses.asdict(resp)
    if resp.seq < 0:
        out["seq"] = None  # no decision yet
    for d, row in zip(resp.daemons, out["daemons"]):
        row["state"] = "alive" if d.alive else "dead"
        row["last_seen"] = resp.now - d.heartbeat_age
    return out


_AUTH = {
    "curve": "auth: CURVE",
    "none-loopback": "auth: none (any local process can register as a node; `laxflow coordinator --require-keys` refuses this)",
    "none-insecure": "auth: none (--insecure: any host that reaches the port can register as a node)",
}


def auth_line(resp: Any) -> str:
    """How the coordinator admits peers, and the peers it refused at the handshake."""
    line = _AUTH.get(resp.auth, "auth: not reported (an older coordinator)")
    refused = {k: v for k, v in resp.handshake_failures.items() if v}
    if refused:
        kinds = ", ".join(f"{k} {v}" for k, v in sorted(refused.items()))
        line += (f"; peers refused at the handshake: {kinds} (a daemon refused so schedules locally: "
                 "check its key, its log and laxflow_daemon_coordinator_auth_failures_total)")
    return line


def render(resp: Any) -> None:
    """Rich tables of a StatusResponse, on stdout."""
    from rich.console import Console
    from rich.table import Table

    console = Console()
    lat = resp.latency
    decision = f"decision #{resp.seq}" if resp.seq >= 0 else "no decision yet"
    console.print(
        f"coordinator [bold]{resp.coordinator_id}[/] up {resp.now - resp.started:.0f} s, "
        f"{decision}; {resp.active_batches} batches, {resp.active_requests} requests, "
        f"{len(resp.pruned)} pruned; decision latency ms: last {lat.last:.2f} p50 {lat.p50:.2f} "
        f"p99 {lat.p99:.2f} max {lat.max:.2f} ({lat.count} decisions)",
        soft_wrap=True,
    )
    console.print(auth_line(resp), soft_wrap=True, markup=False)
    t = Table(title="daemons")
    for col in ("node", "alive", "heartbeat age s", "mode", "batches", "ports", "queued msgs", "queued bytes"):
        t.add_column(col)
    for d in resp.daemons:
        t.add_row(
            d.node, "yes" if d.alive else "[red]dead[/]", f"{d.heartbeat_age:.2f}", d.mode, str(d.batches),
            ", ".join(f"{p.port} {p.bandwidth * 8 / 1e9:g} Gb/s" for p in d.ports),
            str(sum(q.messages for q in d.queues)), str(sum(q.nbytes for q in d.queues)),
        )
    console.print(t)
    for d in resp.daemons:
        if not d.alive:
            console.print(f"{d.node}: dead, last seen {d.heartbeat_age:.1f} s ago (its batches left the schedule)",
                          soft_wrap=True, markup=False)
    queues = [(d.node, q) for d in resp.daemons for q in d.queues if q.messages]
    if queues:
        q_table = Table(title="queue depths (non-empty levels)")
        for col in ("node", "port", "level", "messages", "bytes"):
            q_table.add_column(col)
        for node, q in queues:
            q_table.add_row(node, q.port, str(q.level), str(q.messages), str(q.nbytes))
        console.print(q_table)
    if resp.batches:
        b_table = Table(title="batches in RED order")
        for col in ("rank", "batch", "nodes", "requests", "RED in s", "finish in s"):
            b_table.add_column(col)
        for b in resp.batches:
            b_table.add_row(str(b.rank), b.id, ",".join(b.nodes), str(b.requests),
                            f"{b.red - resp.now:+.3f}", f"{b.finish - resp.now:+.3f}")
        console.print(b_table)
    if resp.pruned:
        console.print("pruned (scavenger class): " + ", ".join(resp.pruned))
    dropped = {k: v for k, v in resp.dropped.items() if v}
    if dropped:
        console.print("frames dropped: " + ", ".join(f"{k} {v}" for k, v in sorted(dropped.items())))


def register(app: typer.Typer) -> None:
    app.command("status")(status)

