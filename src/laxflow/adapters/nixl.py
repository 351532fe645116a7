"""NIXL's ``nixl_agent`` with laxflow's keywords: gated, tagged, reported.

:class:`NixlAgent` has the calls of ``nixl._api.nixl_agent`` (anything it
does not wrap, such as ``register_memory`` or ``get_new_notifs``, goes
straight to the inner agent) and adds keyword-only ``request``, ``stage``,
``layer``, ``deadline`` and ``nbytes`` to the calls that make and post a
transfer request (``initialize_xfer``, ``make_prepped_xfer``, ``transfer``).
Each posted transfer becomes one laxflow message:

1. ``transfer(handle)`` pushes SUBMIT (request, stage, layer, bytes) into the
   daemon's segment (:mod:`laxflow.adapters.gate`) and returns ``"PROC"`` at
   once, as NIXL does for a transfer in flight;
2. when the daemon opens the message's gate, a worker thread marks UCX's
   TCP connections to the remote agent with the permit's DSCP, posts the
   request with NIXL's ``transfer`` and polls ``check_xfer_state`` to its end;
3. COMPLETION is pushed; the caller's ``check_xfer_state(handle)`` then
   says ``"DONE"`` (or ``"ERR"``) -- before that, ``"PROC"``.

The bytes of a message: the sum of the local descriptors' lengths, taken
from ``initialize_xfer``'s list or the ``prep_xfer_dlist`` list the indices
of ``make_prepped_xfer`` select (``nbytes=`` overrides).  Tags given when the
request is made hold for each of its posts; ``transfer`` may override them;
below both, ``tagger`` (a callable of the notification message, which
vLLM's NixlConnector fills with the request id) and, last, :meth:`NixlAgent.tags`,
defaults for the calling thread (a connector wrapper sets them around the
inner connector's calls).

*The class on the wire.*  UCX has no per-request traffic class:
``UCX_IB_TRAFFIC_CLASS`` (the whole IPv6/RoCEv2 traffic-class byte, DSCP << 2)
is read once when the agent's UCX context is made and holds for every QP of
the agent, so on RoCE the permits order NIXL's transfers but the switch sees
the agent's one class (``NixlAdapterConfig.ib_traffic_class`` puts it in the
UCX backend's ``engine_config`` when the wrapper builds the agent).  UCX's TCP
transport (``UCX_TLS=tcp``) has no TOS setting at all (its options are
buffer sizes, keepalive, ``NODELAY``, ports); the wrapper marks its sockets
from outside instead: the connection UCX opens to a remote agent while
``add_remote_agent`` loads it (towards that agent's UCX listening port) is
that agent's, and gets ``IP_TOS`` (DSCP << 2) of the most urgent permit in
flight to it before each post.  One connection carries both directions of
a pair: a WRITE's data leaves on the initiator's end (marked by it); a
READ's data is sent back by the *target's* end of the connection, in the
target's class.  UCX completes a TCP put only once the peer acknowledged it
(NIXL flushes before it reports DONE), so COMPLETION never precedes the
bytes.  Unlike the Mooncake wrapper, it does not wait for a connection's
queued bytes before moving it to a more urgent class: packets of one
connection in two strict-priority queues can arrive out of order.  Shared
memory (``UCX_TLS=sm``) never reaches a switch.

Threads: callers any; NIXL calls from the wrapper's threads and the caller's
go through one lock (an agent made with NIXL's default sync mode is not
thread safe); one waiter and ``GateConfig.workers`` worker threads.  Fails
open with the gate: no daemon, no marks, the transfer goes at once.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping

from laxflow.adapters.gate import GateConfig, PermitGate
from laxflow.adapters.sockets import set_dscp, socket_inodes, tcp_sockets
from laxflow.errors import UserError
from laxflow.protocol.shm import Permit, Stage

RESCAN_S = 1.0  # at most this long before a remote agent's connections are looked up again
RECORDS = 4096  # NixlAgent.records keeps the last this many transfers
_OPS = ("WRITE", "READ")
_TAG_KEYS = ("request", "stage", "layer", "deadline")


@dataclass(frozen=True)
class NixlAdapterConfig:
    """How the NIXL wrapper talks to the daemon and marks its traffic.

    gate: the permit client's settings.
    mark_sockets: mark UCX's TCP connections to a remote agent with the permit's DSCP.
    ib_traffic_class: UCX's ``IB_TRAFFIC_CLASS`` (0..255, the traffic-class
        byte: DSCP << 2 | ECN) for an agent the wrapper builds; None: UCX's own
        (or the environment's ``UCX_IB_TRAFFIC_CLASS``).
    on_deadline: called once per request with its deadline (the hooks API's
        ``register_request`` units), as the Mooncake wrapper does.
    """

    gate: GateConfig = field(default_factory=GateConfig)
    mark_sockets: bool = True
    ib_traffic_class: int | None = None
    on_deadline: Callable[[int, float], None] | None = None

    def __post_init__(self) -> None:
        tc = self.ib_traffic_class
        if tc is not None and (isinstance(tc, bool) or not isinstance(tc, int) or not 0 <= tc <= 255):
            raise UserError(f"ib_traffic_class: expected 0..255 (DSCP << 2), got {tc!r}")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides) -> NixlAdapterConfig:
        """The config of a process started by ``laxflow run``: the gate's variables and ``UCX_IB_TRAFFIC_CLASS``."""
        env = os.environ if env is None else env
        kw: dict = {"gate": GateConfig.from_env(env)}
        raw = env.get("UCX_IB_TRAFFIC_CLASS", "").strip()
        if raw and raw != "auto":
            try:
                kw["ib_traffic_class"] = int(raw, 0)
            except ValueError:
                raise UserError(f"UCX_IB_TRAFFIC_CLASS: expected 0..255 or 'auto', got {raw!r}") from None
        kw.update(overrides)
        return cls(**kw)


@dataclass(frozen=True)
class TransferRecord:
    """One finished post, as :attr:`NixlAgent.records` keeps it.

    ``msg_id``/``level``/``dscp``: its permit (0/-1/-1 when it failed open);
    ``marked``: UCX TCP connections given the DSCP; ``permitted``/``done``:
    ``time.monotonic()`` when the worker posted it and when NIXL said it ended.
    """

    op: str
    remote_agent: str
    request: int
    stage: int
    layer: int
    nbytes: int
    msg_id: int
    level: int
    dscp: int
    marked: int
    permitted: float
    done: float
    status: str


@dataclass
class _Request:
    op: str
    remote_agent: str
    nbytes: int
    tags: dict
    notif: bytes = b""  # the notification given when it was made (what ``tagger`` reads)
    future: Future | None = None


@dataclass
class _Peer:
    addr: tuple[str, int] | None  # the remote agent's UCX TCP listening address, None when not seen
    inflight: dict[int, int] = field(default_factory=dict)  # token -> level << 8 | dscp
    fds: list[tuple[int, int]] = field(default_factory=list)  # (fd, inode) of its connections
    scanned_at: float = 0.0


class NixlAgent:
    """The wrapper; see the module docstring.  ``agent``: a ``nixl_agent``, else one is built."""

    def __init__(self, agent: Any = None, name: str | None = None, nixl_conf: Any = None,
                 config: NixlAdapterConfig | None = None,
                 tagger: Callable[[bytes], Mapping[str, Any] | None] | None = None) -> None:
        self.config = config or NixlAdapterConfig.from_env()
        if agent is None:
            agent = _build_agent(name, nixl_conf, self.config)
        self._agent = agent
        self._nixl = threading.RLock()
        self._gate = PermitGate(self.config.gate)
        self._requests: dict[int, _Request] = {}
        self._dlists: dict[int, tuple[str, list[int]]] = {}
        self._peers: dict[str, _Peer] = {}
        self._peers_lock = threading.Lock()  # a peer's inflight and fds: worker threads
        self._local = threading.local()
        self._tokens = iter(range(1, 1 << 62))
        self._deadlines_sent: set[int] = set()
        self.tagger = tagger
        self.records: deque[TransferRecord] = deque(maxlen=RECORDS)  # appended by worker threads

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):  # never recurse through a half-built wrapper
            raise AttributeError(name)
        value = getattr(self._agent, name)
        if not callable(value):
            return value

        def locked(*args: Any, **kwargs: Any) -> Any:
            with self._nixl:
                return value(*args, **kwargs)

        locked.__name__ = name
        return locked

    @property
    def gate(self) -> PermitGate:
        return self._gate

    @property
    def inner(self) -> Any:
        return self._agent

    @contextmanager
    def tags(self, **tags: Any) -> Iterator[None]:
        """Defaults for transfers made or posted on this thread inside the block."""
        _check_tags(tags)
        saved = getattr(self._local, "tags", None)
        self._local.tags = {**(saved or {}), **tags}
        try:
            yield
        finally:
            self._local.tags = saved

    # ------------------------------------------------------------ remote agents

    def add_remote_agent(self, metadata: bytes) -> str:
        """NIXL's call; also learns the UCX TCP connection it opens to that agent."""
        before = set(socket_inodes())
        with self._nixl:
            name = self._agent.add_remote_agent(metadata)
        self._peers[name] = _Peer(self._learn_addr(before))
        return name

    def remove_remote_agent(self, agent: str) -> None:
        with self._nixl:
            self._agent.remove_remote_agent(agent)
        self._peers.pop(agent, None)

    # ------------------------------------------------------------ making requests

    def prep_xfer_dlist(self, agent_name: str, xfer_list: Any, mem_type: str | None = None,
                        backends: list[str] = []) -> Any:  # noqa: B006 (NIXL's signature)
        with self._nixl:
            handle = self._agent.prep_xfer_dlist(agent_name, xfer_list, mem_type, backends)
            lengths = _lengths(self._agent, xfer_list, mem_type)
        self._dlists[_key(handle)] = (agent_name, lengths)
        return handle

    def release_dlist_handle(self, handle: Any) -> None:
        self._dlists.pop(_key(handle), None)
        with self._nixl:
            self._agent.release_dlist_handle(handle)

    def initialize_xfer(self, operation: str, local_descs: Any, remote_descs: Any, remote_agent: str,
                        notif_msg: bytes = b"", backends: list[str] = [], *,  # noqa: B006
                        nbytes: int | None = None, **tags: Any) -> Any:
        _check_op(operation)
        _check_tags(tags)
        with self._nixl:
            handle = self._agent.initialize_xfer(operation, local_descs, remote_descs, remote_agent, notif_msg,
                                                 backends)
            if nbytes is None:
                nbytes = sum(_lengths(self._agent, local_descs, None))
        self._requests[_key(handle)] = _Request(operation, remote_agent, int(nbytes), tags, bytes(notif_msg or b""))
        return handle

    def make_prepped_xfer(self, operation: str, local_xfer_side: Any, local_indices: Any, remote_xfer_side: Any,
                          remote_indices: Any, notif_msg: bytes = b"", backends: list[str] = [],  # noqa: B006
                          skip_desc_merge: bool = False, *, nbytes: int | None = None, **tags: Any) -> Any:
        _check_op(operation)
        _check_tags(tags)
        with self._nixl:
            handle = self._agent.make_prepped_xfer(operation, local_xfer_side, local_indices, remote_xfer_side,
                                                   remote_indices, notif_msg, backends, skip_desc_merge)
        if nbytes is None:
            lengths = self._dlists.get(_key(local_xfer_side), ("", []))[1]
            nbytes = sum(lengths[int(i)] for i in local_indices) if lengths else 0
        remote = self._dlists.get(_key(remote_xfer_side), ("", []))[0]
        self._requests[_key(handle)] = _Request(operation, remote, int(nbytes), tags, bytes(notif_msg or b""))
        return handle

    # ------------------------------------------------------------ posting and state

    def transfer(self, handle: Any, notif_msg: bytes = b"", **tags: Any) -> str:
        """Announce the request as one message and post it once permitted; ``"PROC"`` until then."""
        _check_tags(tags)
        req = self._requests.get(_key(handle))
        if req is None:  # made by the inner agent directly: bytes and peer unknown
            req = self._requests[_key(handle)] = _Request("", "", 0, {})
        if req.future is not None and not req.future.done():
            raise RuntimeError("transfer: this request is still in flight; wait for check_xfer_state first")
        notif = bytes(notif_msg or b"") or req.notif
        merged = {**(getattr(self._local, "tags", None) or {}),
                  **((self.tagger(notif) or {}) if self.tagger and notif else {}), **req.tags, **tags}
        request, layer = int(merged.get("request", 0)), int(merged.get("layer", 0))
        stage = merged.get("stage")
        stage = int(stage if stage is not None else (Stage.REUSE if req.op == "READ" else Stage.P2D))
        deadline = merged.get("deadline")
        if deadline is not None and request not in self._deadlines_sent and self.config.on_deadline is not None:
            self._deadlines_sent.add(request)
            self.config.on_deadline(request, float(deadline))

        def run(permit: Permit | None) -> str:
            return self._execute(handle, notif_msg, req, permit, request, stage, layer)

        req.future = self._gate.submit(run, request, stage, layer, req.nbytes)
        return self._state(req)

    def check_xfer_state(self, handle: Any) -> str:
        """``"PROC"`` while the message waits or runs, then NIXL's ``"DONE"`` / ``"ERR"``.

        An exception NIXL raised when the worker posted the request is raised here.
        """
        req = self._requests.get(_key(handle))
        if req is None or req.future is None:
            with self._nixl:
                return self._agent.check_xfer_state(handle)
        return self._state(req)

    def release_xfer_handle(self, handle: Any) -> None:
        req = self._requests.pop(_key(handle), None)
        if req is not None and req.future is not None and not req.future.done():
            req.future.result(timeout=self.config.gate.max_wait_s * 2)  # cannot free what a worker still posts
        with self._nixl:
            self._agent.release_xfer_handle(handle)

    def close(self) -> None:
        """Release waiting transfers (fail open), finish running ones, detach from the daemon."""
        self._gate.close()

    @staticmethod
    def _state(req: _Request) -> str:
        if not req.future.done():
            return "PROC"
        return req.future.result()

    # ------------------------------------------------------------ worker side

    def _execute(self, handle, notif_msg, req, permit, request, stage, layer) -> str:
        """Worker thread: mark the peer's connections, post, poll to the end."""
        started = time.monotonic()
        token = next(self._tokens)
        marked = self._mark(req.remote_agent, token, permit) if permit is not None else 0
        status = "ERR"
        try:
            with self._nixl:
                status = self._agent.transfer(handle, notif_msg)
            sleep = 5e-5
            while status == "PROC":
                time.sleep(sleep)
                sleep = min(sleep * 2, 1e-3)
                with self._nixl:
                    status = self._agent.check_xfer_state(handle)
            return status
        finally:
            peer = self._peers.get(req.remote_agent)
            if peer is not None:
                with self._peers_lock:
                    peer.inflight.pop(token, None)
            self.records.append(TransferRecord(
                req.op, req.remote_agent, request, stage, layer, req.nbytes,
                permit.msg_id if permit else 0, permit.level if permit else -1,
                permit.dscp if permit else -1, marked, started, time.monotonic(), status))

    def _mark(self, remote_agent: str, token: int, permit: Permit) -> int:
        """Give the remote agent's UCX TCP connections the most urgent class in flight; how many were marked."""
        peer = self._peers.get(remote_agent)
        if peer is None or not self.config.mark_sockets or peer.addr is None:
            return 0
        with self._peers_lock:
            peer.inflight[token] = permit.level << 8 | permit.dscp
            dscp = min(peer.inflight.values()) & 0xFF
            if not peer.fds or time.monotonic() - peer.scanned_at > RESCAN_S or \
                    not all(set_dscp(fd, inode, dscp) for fd, inode in peer.fds):
                found = [(s.fd, s.inode) for s in tcp_sockets() if s.remote == peer.addr]
                peer.fds = [(fd, inode) for fd, inode in found if set_dscp(fd, inode, dscp)]
                peer.scanned_at = time.monotonic()
            return len(peer.fds)

    def _learn_addr(self, before: set[int]) -> tuple[str, int] | None:
        """The listening address of the agent just loaded: where its new connection from us goes.

        UCX's TCP transport connects while the remote agent is loaded; the
        new socket towards a port that is not one of ours is that connection
        (the agent's own loopback connection, accepted late, is on ours).
        """
        socks = tcp_sockets()
        ours = {s.local[1] for s in socks if s.state == "LISTEN"}
        out = [s for s in socks if s.inode not in before and s.state == "ESTABLISHED"
               and s.local[1] not in ours and s.remote[1] not in ours]
        return out[0].remote if out else None


def _build_agent(name: str | None, nixl_conf: Any, config: NixlAdapterConfig) -> Any:
    """A ``nixl_agent`` with a UCX backend, carrying ``config.ib_traffic_class`` when set."""
    from nixl._api import nixl_agent, nixl_agent_config

    if not name:
        raise UserError("NixlAgent: name: expected the agent's name when no agent is given")
    conf = nixl_conf or nixl_agent_config()
    if config.ib_traffic_class is None or "UCX" not in conf.backends:
        return nixl_agent(name, conf)
    backends = list(conf.backends)
    conf.backends = [b for b in backends if b != "UCX"]
    try:
        agent = nixl_agent(name, conf)
    finally:
        conf.backends = backends
    params = {"engine_config": f"IB_TRAFFIC_CLASS={config.ib_traffic_class}"}
    if conf.num_threads > 0:
        params["num_threads"] = str(conf.num_threads)
    agent.create_backend("UCX", params)
    return agent


def _check_op(operation: str) -> None:
    if operation not in _OPS:
        raise ValueError(f"operation: expected 'WRITE' or 'READ', got {operation!r}")


def _check_tags(tags: Mapping[str, Any]) -> None:
    unknown = set(tags) - set(_TAG_KEYS)
    if unknown:
        raise TypeError(f"unexpected keyword(s) {sorted(unknown)}: laxflow adds {list(_TAG_KEYS)} and nbytes")
    stage = tags.get("stage")
    if stage is not None and stage not in (Stage.NONE, Stage.REUSE, Stage.COLLECTIVE, Stage.P2D):
        raise ValueError(f"stage: expected 0..3, got {stage!r}")
    for key in ("request", "layer"):
        if key in tags and (not isinstance(tags[key], int) or tags[key] < 0):
            raise ValueError(f"{key}: expected an integer >= 0, got {tags[key]!r}")


def _key(handle: Any) -> int:
    """A NIXL handle object's identity (its C handle when it has one)."""
    return int(getattr(handle, "_handle", None) or id(handle))


def _lengths(agent: Any, descs: Any, mem_type: str | None) -> list[int]:
    """Each descriptor's length in bytes, for the input forms ``get_xfer_descs`` takes (Nx5: len * count)."""
    try:
        import numpy as np

        if isinstance(descs, np.ndarray) and descs.ndim == 2 and descs.shape[1] in (3, 5):
            lens = descs[:, 1].astype(int)
            return [int(x) for x in (lens * descs[:, 4].astype(int) if descs.shape[1] == 5 else lens)]
    except ImportError:
        pass
    if isinstance(descs, (list, tuple)) and descs and isinstance(descs[0], tuple):
        return [int(d[1]) for d in descs]
    if hasattr(descs, "descCount"):
        return [int(descs[i][1]) for i in range(descs.descCount())]
    dl = agent.get_xfer_descs(descs, mem_type)  # tensors, or a list of them
    return [int(dl[i][1]) for i in range(dl.descCount())] if dl is not None else []


__all__ = ["NixlAdapterConfig", "NixlAgent", "TransferRecord"]
