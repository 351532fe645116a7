"""The hooks client the prefill scheduler imports.

One :class:`HooksClient` per scheduler thread (ZeroMQ sockets are not
thread-safe); each call is one request and one reply over ``ipc://`` to the
node daemon.

The daemon being down must never stop serving, nor slow it. The first call
that gets no reply within ``timeout_ms`` returns quietly (``wait_permit``
returns None: send anyway), counts in :attr:`failures` and marks the client
disconnected. From then on no call waits: each returns at once, in
microseconds, until a background thread (``laxflow-hooks-reconnect``, one
per disconnected client, its own socket) gets an answer from a daemon on the
same address, probing with a backoff from ``reconnect_ms[0]`` doubling up to
``reconnect_ms[1]``. The next call after that answer goes to the daemon again
and counts in :attr:`reconnects`. While disconnected:

* events (``register_request``, ``batch_formed``, ``layer_begin``,
  ``layer_end``, ``message_submit``, ``message_progress``,
  ``message_complete``, ``request_done``, ``bind``) are dropped and counted
  in :attr:`dropped`. They are not queued: a daemon that comes back is a new
  one with no state, and replaying layers and batches that have since ended
  would describe traffic that no longer exists;
* queries get the answer of a scheduler without laxflow, counted in
  :attr:`failed_open`: ``wait_permit`` None (send now), ``pruned`` an empty
  set, ``dispatch_advice`` no ranking (``[]``), ``status`` None.

:meth:`counters` gives the four numbers and the state at once.

Address: ``HooksClient(address)``, else :func:`client_address` (the only
reader of ``LAXFLOW_HOOKS`` / ``LAXFLOW_SHM_NAME`` / ``XDG_RUNTIME_DIR`` here),
which gives the default address of the local daemon's segment.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Callable, Iterable, Mapping, Sequence

import zmq

from laxflow.errors import UserError
from laxflow.hooks.api import Hooks, request_key
from laxflow.protocol import hooks as hm
from laxflow.protocol.wire import ProtocolError, decode, encode

log = logging.getLogger("laxflow.hooks")


def client_address(env: Mapping[str, str] | None = None) -> str:
    """``$LAXFLOW_HOOKS``, else the default of the daemon serving ``$LAXFLOW_SHM_NAME``."""
    from laxflow.protocol.shm import DEFAULT_NAME

    env = os.environ if env is None else env
    return env.get("LAXFLOW_HOOKS") or hm.default_hooks_address(env.get("LAXFLOW_SHM_NAME") or DEFAULT_NAME,
                                                                hm.runtime_dir(env))


class HooksClient(Hooks):
    """Hooks over ZeroMQ to the local daemon (see :mod:`laxflow.hooks.api` for when to call what).

    ``timeout_ms``: how long a call waits for the daemon's reply before the
    client counts it gone; ``reconnect_ms``: (first, longest) pause between
    reconnect probes while it is gone.
    """

    def __init__(self, address: str | None = None, timeout_ms: int = 200, name: str = "hooks",
                 reconnect_ms: tuple[float, float] = (20.0, 1000.0)) -> None:
        if not timeout_ms > 0:
            raise UserError(f"HooksClient: timeout_ms must be > 0, got {timeout_ms!r}")
        lo, hi = reconnect_ms
        if not 0 < lo <= hi:
            raise UserError(f"HooksClient: reconnect_ms must be (first, longest) with 0 < first <= longest, "
                            f"got {reconnect_ms!r}")
        self.address = address or client_address()
        self.timeout_ms = timeout_ms
        self.reconnect_ms = (float(lo), float(hi))
        self.name = f"{name}-{os.getpid()}"
        self.failures = 0  # calls that waited and got no usable reply
        self.dropped = 0  # events not sent while disconnected
        self.failed_open = 0  # queries answered without the daemon while disconnected
        self.reconnects = 0  # times the client went back to a daemon after losing it
        self._connected = True
        self._answered = threading.Event()  # set by the reconnect thread when a daemon answers
        self._probe: threading.Thread | None = None
        self._ctx = zmq.Context.instance()
        self._sock: zmq.Socket | None = None
        # key -> the caller's request name, for pruned sets (the daemon names requests by key). Only the caller's
        # thread changes these two; the pruned listener reads _names and replaces _pruned_keys.
        self._names: dict[str, str] = {}
        self._done: set[str] = set()  # keys of requests over but last seen pruned: named until a pruned set drops them
        self._pruned_keys: frozenset[str] = frozenset()  # the last pruned set received
        self._threads: list[threading.Thread] = []
        self._stop = threading.Event()

    def close(self) -> None:
        """Stop the client's threads and close its socket; later calls are dropped (counted), never sent."""
        self._stop.set()
        self._connected = False
        for t in [*self._threads, *([self._probe] if self._probe is not None else [])]:
            t.join(timeout=1.0)
        if self._sock is not None:
            self._sock.close(0)
            self._sock = None

    def __enter__(self) -> "HooksClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def connected(self) -> bool:
        """False from the first unanswered call until a reconnect probe is answered (and after close)."""
        return self._connected

    @property
    def probing(self) -> bool:
        """True while the reconnect thread is looking for the daemon."""
        return self._probe is not None and self._probe.is_alive()

    def counters(self) -> dict[str, int]:
        """``failures``, ``dropped``, ``failed_open``, ``reconnects`` and ``connected`` (1/0), for logs and metrics."""
        return {"failures": self.failures, "dropped": self.dropped, "failed_open": self.failed_open,
                "reconnects": self.reconnects, "connected": int(self._connected)}

    # ------------------------------------------------------------ the interface

    def register_request(self, request, deadline, prompt_tokens, reused_tokens=0, priority=0) -> None:
        self._remember(request)
        self._event(hm.RegisterRequest(request, deadline, int(prompt_tokens), int(reused_tokens), int(priority)))

    def batch_formed(self, batch: str, requests: Iterable[str], compute_s: float = 0.0,
                     traffic: Mapping[str, Mapping[str, float]] | None = None) -> None:
        reqs = tuple(requests)
        for r in reqs:
            self._remember(r)
        if not self._up(event=True):
            return
        rows = {p: {r: float(b) for r, b in row.items()} for p, row in (traffic or {}).items()}
        self._call(hm.BatchFormed(batch, reqs, float(compute_s), rows))

    def layer_begin(self, batch: str, layer: int) -> None:
        self._event(hm.Layer(batch, int(layer), "begin", False))

    def layer_end(self, batch: str, layer: int, last: bool = False) -> None:
        self._event(hm.Layer(batch, int(layer), "end", bool(last)))

    def message_submit(self, msg_id, request, stage, layer, nbytes, port="", downstream=0.0) -> None:
        self._remember(request)
        self._event(hm.Submit(int(msg_id), request, stage, layer, float(nbytes), port, float(downstream)))

    def wait_permit(self, msg_id: int, timeout_s: float = 1.0) -> tuple[int, int] | None:
        if not self._up(event=False):
            return None
        reply = self._call(hm.WaitPermit(int(msg_id), float(timeout_s)), timeout_ms=int(timeout_s * 1000) + self.timeout_ms)
        if isinstance(reply, hm.Permit) and reply.granted:
            return reply.level, reply.dscp
        return None

    def message_progress(self, msg_id: int, bytes_done: float) -> None:
        self._event(hm.Progress(int(msg_id), float(bytes_done)))

    def message_complete(self, msg_id: int) -> None:
        self._event(hm.Complete(int(msg_id)))

    def request_done(self, request: str) -> None:
        self._forget(request)
        self._event(hm.RequestDone(request))

    def bind(self, pid: int, handle: int, port: str) -> None:
        """Say which port process ``pid``'s QP number or socket fd ``handle`` sends on."""
        self._event(hm.Bind(int(pid), int(handle), port))

    def pruned(self) -> set[str]:
        reply = self._query(hm.PrunedQuery())
        names = self._unkey(reply.requests) if isinstance(reply, hm.Pruned) else set()
        self._drop_done()
        return names

    def subscribe_pruned(self, callback: Callable[[set[str]], None]) -> None:
        """``callback(pruned set)`` on every change, from a client thread, until :meth:`close`."""
        t = threading.Thread(target=self._listen, args=(callback,), name="laxflow-hooks-pruned", daemon=True)
        t.start()
        self._threads.append(t)

    def dispatch_advice(self, request: str, instances: Sequence[hm.Instance]) -> list[hm.Estimate]:
        reply = self._query(hm.Dispatch(request, tuple(instances)))
        return list(reply.ranked) if isinstance(reply, hm.Advice) else []

    def status(self) -> hm.Status | None:
        reply = self._query(hm.StatusQuery())
        return reply if isinstance(reply, hm.Status) else None

    # ------------------------------------------------------------ plumbing

    def _remember(self, request: str) -> None:
        key = str(request_key(request))
        self._names[key] = request
        self._done.discard(key)

    def _forget(self, request: str) -> None:
        """The request is over: drop its name, or keep it while the last pruned set names it."""
        key = str(request_key(request))
        if key in self._pruned_keys:
            self._done.add(key)
        else:
            self._names.pop(key, None)
        self._drop_done()

    def _drop_done(self) -> None:
        if self._done:
            pruned = self._pruned_keys
            for key in [k for k in self._done if k not in pruned]:
                self._done.discard(key)
                self._names.pop(key, None)

    def _unkey(self, keys: Iterable[str]) -> set[str]:
        """Names of a pruned set (a pruned reply, or advice on the listener thread), which becomes the last seen."""
        keys = frozenset(keys)
        self._pruned_keys = keys
        return {self._names.get(k, k) for k in keys}

    def _event(self, msg) -> None:
        if self._up(event=True):
            self._call(msg)

    def _query(self, msg):
        return self._call(msg) if self._up(event=False) else None

    def _up(self, event: bool) -> bool:
        """Whether this call may go to the daemon; if not, count it (dropped event or failed-open query)."""
        if self._connected:
            return True
        if self._answered.is_set() and not self._stop.is_set():
            self._answered.clear()
            self._connected = True
            self.reconnects += 1
            log.info("laxflow hooks: the daemon at %s answers again (%d events dropped, %d queries failed open "
                     "so far)", self.address, self.dropped, self.failed_open)
            return True
        if event:
            self.dropped += 1
        else:
            self.failed_open += 1
        return False

    def _socket(self) -> zmq.Socket:
        if self._sock is None:
            self._sock = self._ctx.socket(zmq.DEALER)
            self._sock.setsockopt(zmq.LINGER, 0)
            self._sock.connect(self.address)
        return self._sock

    def _call(self, msg, timeout_ms: int | None = None):
        """Send and wait for the one reply; None (and the client disconnected) if none comes."""
        sock = self._socket()
        try:
            sock.send(encode(msg, self.name), zmq.NOBLOCK)
        except zmq.ZMQError:
            self._lost()
            return None
        if not sock.poll(self.timeout_ms if timeout_ms is None else timeout_ms):
            self._lost()  # the daemon is gone or stuck: a late reply must not answer the next call
            return None
        try:
            return decode(sock.recv()).body
        except ProtocolError:
            self.failures += 1  # the daemon answered (it is there), but not with a frame we read
            return None

    def _lost(self) -> None:
        """A call went unanswered: count it, drop the socket, fail open until the reconnect thread hears back."""
        self.failures += 1
        if self._sock is not None:
            self._sock.close(0)
            self._sock = None
        self._connected = False
        if self._stop.is_set():
            return
        log.warning("laxflow hooks: no reply from the daemon at %s within %d ms; calls return at once "
                    "(events dropped, queries fail open) until it answers again", self.address, self.timeout_ms)
        if not self.probing:
            self._answered.clear()
            self._probe = threading.Thread(target=self._reconnect, name="laxflow-hooks-reconnect", daemon=True)
            self._probe.start()

    def _reconnect(self) -> None:
        """Reconnect thread: a status query on a fresh socket per try, with backoff, until one is answered."""
        pause, longest = self.reconnect_ms
        while not self._stop.is_set():
            if self._probe_once():
                self._answered.set()
                return
            if self._stop.wait(pause / 1e3):
                return
            pause = min(pause * 2, longest)

    def _probe_once(self) -> bool:
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        try:
            sock.connect(self.address)
            sock.send(encode(hm.StatusQuery(), self.name + "-probe"), zmq.NOBLOCK)
            waited = 0
            while waited < self.timeout_ms and not self._stop.is_set():
                step = min(50, self.timeout_ms - waited)
                if sock.poll(step):
                    return isinstance(decode(sock.recv()).body, hm.Status)
                waited += step
            return False
        except (zmq.ZMQError, ProtocolError):
            return False
        finally:
            sock.close(0)

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
