"""The hooks client the prefill scheduler imports.

One :class:`HooksClient` per scheduler thread (ZeroMQ sockets are not
thread-safe); each call is one request and one reply over ``ipc://`` to the
node daemon. The daemon being down must never stop serving: a call that gets
no reply within ``timeout_ms`` returns quietly (``wait_permit`` returns None:
send anyway), the socket is rebuilt, and :attr:`failures` counts it.

Address: ``HooksClient(address)``, else :func:`client_address` (the only
reader of ``LAXFLOW_HOOKS`` / ``LAXFLOW_SHM_NAME`` / ``XDG_RUNTIME_DIR`` here),
which gives the default address of the local daemon's segment.
"""

from __future__ import annotations

import os
import threading
from typing import Callable, Iterable, Mapping, Sequence

import zmq

from laxflow.hooks import messages as hm
from laxflow.hooks.api import Hooks, request_key
from laxflow.protocol.wire import ProtocolError, decode, encode


def client_address(env: Mapping[str, str] | None = None) -> str:
    """``$LAXFLOW_HOOKS``, else the default of the daemon serving ``$LAXFLOW_SHM_NAME``."""
    from laxflow.daemon.config import DEFAULT_SHM, default_hooks_address, runtime_dir

    env = os.environ if env is None else env
    return env.get("LAXFLOW_HOOKS") or default_hooks_address(env.get("LAXFLOW_SHM_NAME") or DEFAULT_SHM,
                                                             runtime_dir(env))


class HooksClient(Hooks):
    """Hooks over ZeroMQ to the local daemon (see :mod:`laxflow.hooks.api` for when to call what)."""

    def __init__(self, address: str | None = None, timeout_ms: int = 200, name: str = "hooks") -> None:
        self.address = address or client_address()
        self.timeout_ms = timeout_ms
        self.name = f"{name}-{os.getpid()}"
        self.failures = 0
        self._ctx = zmq.Context.instance()
        self._sock: zmq.Socket | None = None
        self._names: dict[str, str] = {}
        self._threads: list[threading.Thread] = []
        self._stop = threading.Event()

    def close(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=1.0)
        if self._sock is not None:
            self._sock.close(0)
            self._sock = None

    def __enter__(self) -> "HooksClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------ the interface

    def register_request(self, request, deadline, prompt_tokens, reused_tokens=0, priority=0) -> None:
        self._remember(request)
        self._call(hm.RegisterRequest(request, deadline, int(prompt_tokens), int(reused_tokens), int(priority)))

    def batch_formed(self, batch: str, requests: Iterable[str], compute_s: float = 0.0,
                     traffic: Mapping[str, Mapping[str, float]] | None = None) -> None:
        reqs = tuple(requests)
        for r in reqs:
            self._remember(r)
        rows = {p: {r: float(b) for r, b in row.items()} for p, row in (traffic or {}).items()}
        self._call(hm.BatchFormed(batch, reqs, float(compute_s), rows))

    def layer_begin(self, batch: str, layer: int) -> None:
        self._call(hm.Layer(batch, int(layer), "begin", False))

    def layer_end(self, batch: str, layer: int, last: bool = False) -> None:
        self._call(hm.Layer(batch, int(layer), "end", bool(last)))

    def message_submit(self, msg_id, request, stage, layer, nbytes, port="", downstream=0.0) -> None:
        self._remember(request)
        self._call(hm.Submit(int(msg_id), request, stage, layer, float(nbytes), port, float(downstream)))

    def wait_permit(self, msg_id: int, timeout_s: float = 1.0) -> tuple[int, int] | None:
        reply = self._call(hm.WaitPermit(int(msg_id), float(timeout_s)), timeout_ms=int(timeout_s * 1000) + self.timeout_ms)
        if isinstance(reply, hm.Permit) and reply.granted:
            return reply.level, reply.dscp
        return None

    def message_progress(self, msg_id: int, bytes_done: float) -> None:
        self._call(hm.Progress(int(msg_id), float(bytes_done)))

    def message_complete(self, msg_id: int) -> None:
        self._call(hm.Complete(int(msg_id)))

    def request_done(self, request: str) -> None:
        self._call(hm.RequestDone(request))

    def bind(self, pid: int, handle: int, port: str) -> None:
        """Say which port process ``pid``'s QP number or socket fd ``handle`` sends on."""
        self._call(hm.Bind(int(pid), int(handle), port))

    def pruned(self) -> set[str]:
        reply = self._call(hm.PrunedQuery())
        return self._unkey(reply.requests) if isinstance(reply, hm.Pruned) else set()

    def subscribe_pruned(self, callback: Callable[[set[str]], None]) -> None:
        """``callback(pruned set)`` on every change, from a client thread, until :meth:`close`."""
        t = threading.Thread(target=self._listen, args=(callback,), name="laxflow-hooks-pruned", daemon=True)
        t.start()
        self._threads.append(t)

    def dispatch_advice(self, request: str, instances: Sequence[hm.Instance]) -> list[hm.Estimate]:
        reply = self._call(hm.Dispatch(request, tuple(instances)))
        return list(reply.ranked) if isinstance(reply, hm.Advice) else []

    def status(self) -> hm.Status | None:
        reply = self._call(hm.StatusQuery())
        return reply if isinstance(reply, hm.Status) else None

    # ------------------------------------------------------------ plumbing

    def _remember(self, request: str) -> None:
        self._names[str(request_key(request))] = request

    def _unkey(self, keys: Iterable[str]) -> set[str]:
        return {self._names.get(k, k) for k in keys}

    def _socket(self) -> zmq.Socket:
        if self._sock is None:
            self._sock = self._ctx.socket(zmq.DEALER)
            self._sock.setsockopt(zmq.LINGER, 0)
            self._sock.connect(self.address)
        return self._sock

    def _call(self, msg, timeout_ms: int | None = None):
        """Send and wait for the one reply; None (and a rebuilt socket) if none comes."""
        sock = self._socket()
        try:
            sock.send(encode(msg, self.name), zmq.NOBLOCK)
        except zmq.ZMQError:
            self._fail()
            return None
        if not sock.poll(self.timeout_ms if timeout_ms is None else timeout_ms):
            self._fail()  # the daemon is gone or slow: a late reply must not answer the next call
            return None
        try:
            return decode(sock.recv()).body
        except ProtocolError:
            self.failures += 1
            return None

    def _fail(self) -> None:
        self.failures += 1
        if self._sock is not None:
            self._sock.close(0)
            self._sock = None

    def _listen(self, callback: Callable[[set[str]], None]) -> None:
        sub = self._ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(self.address + ".pub")
        try:
            while not self._stop.is_set():
                if not sub.poll(100):
                    continue
                try:
                    body = decode(sub.recv()).body
                except ProtocolError:
                    continue
                if isinstance(body, hm.Pruned):
                    callback(self._unkey(body.requests))
        finally:
            sub.close(0)
