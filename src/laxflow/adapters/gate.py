"""The permit client adapters share: submit, wait for the permit, complete.

One :class:`PermitGate` per serving process (per wrapped engine).  The
caller's thread calls :meth:`PermitGate.submit`, which pushes a SUBMIT event
for the message into the node daemon's shared-memory segment and returns a
:class:`concurrent.futures.Future` at once.  A waiter thread reads the
permit table each time the daemon publishes permits (it sleeps on the
segment's permit futex in between); when the daemon opens the message's gate, a worker thread runs
the transfer (``run(permit)``), pushes the COMPLETION event and resolves the
future.  The caller never blocks on the daemon.

A caller whose thread blocks anyway until the transfer may start (a
collective: it stalls compute until it is done) uses :meth:`PermitGate.acquire`
and :meth:`PermitGate.release` instead: SUBMIT, then the caller's own thread
sleeps on the permit futex and runs the transfer itself, with no hand-off to
the waiter and worker threads (each costs a wake-up, and on a busy host a
wait for the GIL, on the transfer's critical path).

Fails open, as the shim does: with no segment, a layout mismatch, a stale
daemon heartbeat (before or while a message waits) or a full event ring, the
transfer runs at once with ``permit=None`` and is counted in :attr:`stats`.
The segment is re-attached at most once per ``reattach_s`` when it was
missing, so a daemon started after the job still takes over.
"""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Mapping

from laxflow.protocol.shm import COMPUTE_DONE_LAYER, EventKind, Gate, Permit, Segment, SegmentError, TagValue

DEFAULT_SHM_NAME = "/laxflow"


@dataclass(frozen=True)
class GateConfig:
    """How an adapter talks to the node daemon.

    shm_name: the daemon's segment ('/name').
    poll_s: the longest the waiter thread sleeps on the permit futex before
        it reads the permits (and the daemon's heartbeat) again.
    workers: threads that run released transfers (each blocks in the library).
    reattach_s: how often to retry attaching when the segment was missing.
    max_wait_s: the longest a message waits for its permit from a live
        daemon; past it the transfer goes without one (failing open, counted
        in ``stats["wait_timeouts"]``). A liveness bound for a daemon that
        beats but never opens a message, far above any deferral MFS makes.
    """

    shm_name: str = DEFAULT_SHM_NAME
    poll_s: float = 0.005
    workers: int = 4
    reattach_s: float = 1.0
    max_wait_s: float = 10.0

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> GateConfig:
        """The config of a process started by ``laxflow run``: ``LAXFLOW_SHM_NAME``, ``LAXFLOW_GATE_MAX_WAIT_S``."""
        kw: dict = {"shm_name": env.get("LAXFLOW_SHM_NAME", DEFAULT_SHM_NAME)}
        if "LAXFLOW_GATE_MAX_WAIT_S" in env:
            try:
                kw["max_wait_s"] = float(env["LAXFLOW_GATE_MAX_WAIT_S"])
            except ValueError:
                raise ValueError(f"LAXFLOW_GATE_MAX_WAIT_S: expected seconds, got {env['LAXFLOW_GATE_MAX_WAIT_S']!r}") \
                    from None
        return cls(**kw)

    def __post_init__(self) -> None:
        if not self.shm_name.startswith("/") or "/" in self.shm_name[1:]:
            raise ValueError(f"shm_name: expected '/name' (one slash), got {self.shm_name!r}")
        if not 0 < self.poll_s <= 1:
            raise ValueError(f"poll_s: expected seconds in (0, 1], got {self.poll_s!r}")
        if not 1 <= self.workers <= 256:
            raise ValueError(f"workers: expected 1..256, got {self.workers!r}")
        if not self.reattach_s > 0:
            raise ValueError(f"reattach_s: expected seconds > 0, got {self.reattach_s!r}")
        if not 0 < self.max_wait_s < float("inf"):
            raise ValueError(f"max_wait_s: expected seconds > 0, got {self.max_wait_s!r}")


@dataclass(frozen=True)
class Ticket:
    """One message announced by :meth:`PermitGate.acquire`; hand it back to :meth:`PermitGate.release`.

    ``permit`` is None when the message failed open (no daemon, a stale
    heartbeat, a full ring): the transfer goes at once in its connection's class.
    """

    msg_id: int
    request_id: int
    stage: int
    layer: int
    nbytes: int
    permit: Permit | None
    generation: int


@dataclass
class _Waiting:
    msg_id: int
    request_id: int
    stage: int
    layer: int
    nbytes: int
    run: Callable[[Permit | None], object]
    future: Future
    generation: int = 0
    since: float = 0.0  # time.monotonic() at SUBMIT (max_wait_s counts from here)


class PermitGate:
    """Gate transfers on the daemon's permits; see the module docstring.

    ``submit`` may be called from any thread; ``close`` from the owner's.
    """

    def __init__(self, config: GateConfig | None = None) -> None:
        self.config = config or GateConfig()
        self._lock = threading.Lock()  # the Segment's cffi scratch buffers are shared
        self._seg: Segment | None = None
        self._why_bypass: str | None = "not attached yet"
        self._next_attach = 0.0
        self._generation = 0  # bumped whenever the mapped segment is replaced
        # Segments replaced after a daemon restart: kept mapped until close(), since a
        # thread may still sleep in wait_permits on one (unmapping under it would crash).
        self._retired: list[Segment] = []
        self._waiting: dict[int, _Waiting] = {}
        self._wake = threading.Condition(self._lock)
        self._closed = False
        self._pool = ThreadPoolExecutor(self.config.workers, thread_name_prefix="laxflow-xfer")
        self._pid = os.getpid()
        self.stats = {"submitted": 0, "released": 0, "failopen": 0, "bypassed": 0, "completed": 0, "wait_timeouts": 0}
        self._waiter = threading.Thread(target=self._wait_loop, name="laxflow-permits", daemon=True)
        self._waiter.start()

    # ------------------------------------------------------------ segment

    def _attach_locked(self) -> Segment | None:
        """The live segment, attaching (again) when due; None means bypass."""
        now = time.monotonic()
        if self._seg is None and now >= self._next_attach:
            self._next_attach = now + self.config.reattach_s
            try:
                self._seg = Segment.attach(self.config.shm_name)
            except SegmentError as exc:
                self._why_bypass = str(exc)
        if self._seg is None:
            return None
        if not self._seg.live():
            self._why_bypass = f"segment {self.config.shm_name!r}: daemon heartbeat is stale"
            if now >= self._next_attach:  # a restarted daemon has a new segment under the same name
                self._next_attach = now + self.config.reattach_s
                try:
                    fresh = Segment.attach(self.config.shm_name)
                except SegmentError:
                    return None
                if not fresh.live():
                    # Still the dead daemon's segment (or a new one not beating yet): nothing has used this
                    # mapping, so it goes now; kept, one more 5 MB mapping would pile up per attempt.
                    fresh.close(unlink=False)
                    return None
                if fresh.bell_path == self._seg.bell_path:  # unique to a daemon instance (pid, creation time)
                    # The same daemon, late and beating again: not replaced, its messages are still its own
                    # (counted as replaced, their completions were never sent and it held later ones behind them).
                    fresh.close(unlink=False)
                    self._why_bypass = None
                    return self._seg
                self._retired.append(self._seg)  # a thread may still sleep in wait_permits on it
                self._seg = fresh
                self._generation += 1  # messages announced to the old daemon are failed open
                self._why_bypass = None
                return self._seg
            return None
        self._why_bypass = None
        return self._seg

    @property
    def bypass_reason(self) -> str | None:
        """Why transfers currently pass straight through (None: gated)."""
        with self._lock:
            self._attach_locked()
            return self._why_bypass

    # -------------------------------------------------------------- submit

    def submit(
        self,
        run: Callable[[Permit | None], object],
        request_id: int,
        stage: int,
        layer: int,
        nbytes: int,
        handle: int = 0,
    ) -> Future:
        """Announce one message and run it once permitted; returns its future.

        Called by an adapter on the caller's thread; never blocks on the daemon.
        ``run`` gets the permit (None when failing open) on a worker thread and
        its return value becomes the future's result.
        """
        future: Future = Future()
        with self._lock:
            seg, msg_id = self._announce_locked(request_id, stage, layer, nbytes, handle)
            item = _Waiting(msg_id, request_id, stage, layer, nbytes, run, future, self._generation, time.monotonic())
            if seg is None:
                self.stats["bypassed"] += 1
            else:
                self._waiting[msg_id] = item
                self._wake.notify()
                return future
        self._dispatch(item, None)
        return future

    def acquire(self, request_id: int, stage: int, layer: int, nbytes: int, handle: int = 0) -> Ticket:
        """Announce one message and block the calling thread until the daemon permits it.

        For callers whose thread waits for the transfer anyway (a collective);
        the caller then runs the transfer itself and reports it with
        :meth:`release`. Fails open like :meth:`submit`: with no segment, a full
        ring, a daemon whose heartbeat goes stale while the message waits, or a
        replaced segment, the ticket comes back at once with ``permit=None``.
        """
        with self._lock:
            seg, msg_id = self._announce_locked(request_id, stage, layer, nbytes, handle)
            generation = self._generation
            if seg is None:
                self.stats["bypassed"] += 1
                return Ticket(0, request_id, stage, layer, nbytes, None, generation)
        give_up = time.monotonic() + self.config.max_wait_s
        while True:
            with self._lock:
                seg = self._attach_locked() if not self._closed else None
                timed_out = time.monotonic() > give_up
                if seg is None or generation != self._generation or timed_out:
                    self.stats["failopen"] += 1
                    self.stats["wait_timeouts"] += timed_out
                    return Ticket(msg_id, request_id, stage, layer, nbytes, None, generation)
                seq = seg.permit_seq()  # read before the permit: no lost wake-up
                permit = seg.get_permit(msg_id)
                if permit is not None and permit.gate == Gate.OPEN:
                    self.stats["released"] += 1
                    return Ticket(msg_id, request_id, stage, layer, nbytes, permit, generation)
            seg.wait_permits(seq, self.config.poll_s)  # outside the lock (GIL released): others go on

    def release(self, ticket: Ticket, nbytes: int | None = None) -> None:
        """The transfer of an acquired message ended: COMPLETION with ``nbytes`` (default: the announced size)."""
        self._complete(ticket, ticket.nbytes if nbytes is None else nbytes)

    def _announce_locked(self, request_id: int, stage: int, layer: int, nbytes: int, handle: int) -> tuple:
        """SUBMIT one message (``submit`` and ``acquire``, under the lock): (segment, msg_id),
        (None, 0) when bypassing (no segment, or a full ring: counted by the segment)."""
        if self._closed:
            raise RuntimeError("PermitGate is closed")
        seg = self._attach_locked()
        msg_id = 0
        if seg is not None:
            msg_id = seg.alloc_msg_id()
            if not seg.push_event(EventKind.SUBMIT, msg_id, request_id, nbytes, stage, layer, handle):
                seg, msg_id = None, 0  # ring full: counted by the segment, fail open
        self.stats["submitted"] += 1
        return seg, msg_id

    # -------------------------------------------------------------- waiter

    def _wait_loop(self) -> None:
        """Waiter thread: release messages whose gate opened, or all when stale.

        Between passes it sleeps on the segment's permit futex, which the
        daemon wakes after every step that opened gates, so a permit is
        seen as soon as it is written; ``poll_s`` only bounds the sleep (the
        heartbeat check, a daemon of an older layout).
        """
        while True:
            released: list[tuple[_Waiting, Permit | None]] = []
            with self._lock:
                while not self._waiting and not self._closed:
                    self._wake.wait()
                if self._closed and not self._waiting:
                    return
                seg = self._attach_locked() if not self._closed else None
                seq = seg.permit_seq() if seg is not None else 0  # read before the permits: no lost wake-up
                too_old = time.monotonic() - self.config.max_wait_s
                for msg_id, item in list(self._waiting.items()):
                    if seg is None or item.generation != self._generation:
                        released.append((item, None))
                        self.stats["failopen"] += 1
                    else:
                        permit = seg.get_permit(msg_id)
                        if permit is not None and permit.gate == Gate.OPEN:
                            released.append((item, permit))
                            self.stats["released"] += 1
                        elif item.since < too_old:  # the daemon lives but never opened it: go anyway
                            released.append((item, None))
                            self.stats["failopen"] += 1
                            self.stats["wait_timeouts"] += 1
                        else:
                            continue
                    del self._waiting[msg_id]
                pending = bool(self._waiting)
            for item, permit in released:
                self._dispatch(item, permit)
            if pending and seg is not None:
                seg.wait_permits(seq, self.config.poll_s)  # outside the lock: submits go on meanwhile
            elif pending:
                time.sleep(self.config.poll_s)

    def _dispatch(self, item: _Waiting, permit: Permit | None) -> None:
        self._pool.submit(self._run, item, permit)

    def _run(self, item: _Waiting, permit: Permit | None) -> None:
        """Worker thread: the transfer itself, then COMPLETION and the future."""
        if not item.future.set_running_or_notify_cancel():
            return
        try:
            result = item.run(permit)
        except BaseException as exc:  # the caller sees it through the future
            self._complete(item, 0)
            item.future.set_exception(exc)
            return
        self._complete(item, item.nbytes)
        item.future.set_result(result)

    def _complete(self, item: _Waiting | Ticket, nbytes: int) -> None:
        with self._lock:
            self.stats["completed"] += 1
            if item.msg_id and self._seg is not None and item.generation == self._generation:
                self._seg.push_event(
                    EventKind.COMPLETION, item.msg_id, item.request_id, nbytes, item.stage, item.layer
                )

    def write_tag(self, kind: int, handle: int, value: TagValue) -> bool:
        """Write a flow tag for this process's QP or socket; False when bypassing or full.

        Called on a worker thread just before a released transfer starts, so
        the shim reads the message's id and class on that QP or socket.
        """
        with self._lock:
            if self._seg is None:
                return False
            try:
                self._seg.write_tag(self._pid, kind, handle, value)
            except SegmentError:
                return False  # registry full: counted by the segment, traffic flows untagged
            return True

    def layer_boundary(self, request_id: int, layer: int | None) -> bool:
        """The request's batch computes ``layer`` now (None: its prefill compute ended); False when bypassing.

        The shared-memory path for layer progress (MFS §5: runtimes talk to
        the daemon through lock-free queues): one ring event, no round trip,
        so an engine can report every layer on its critical path. The daemon
        maps the request to its batch (``batch_formed`` through the hooks).
        Called on the engine's thread.
        """
        with self._lock:
            seg = self._attach_locked()
            if seg is None:
                return False
            return seg.push_event(EventKind.LAYER_BOUNDARY, 0, request_id, 0, 0,
                                  COMPUTE_DONE_LAYER if layer is None else layer)

    def mark(self, kind: int, handle: int, request_id: int, stage: int, layer: int, nbytes: int, dscp: int) -> bool:
        """Tag the next ``nbytes`` on this process's QP or socket with a class another node's daemon chose.

        For one-sided transfers: the initiator's daemon permits an RDMA READ
        (or, on TCP, the request for a read) and the responder only sends
        the bytes; the responder's shim must put them in the initiator's
        class. Allocates a message id so the shim sees a new message; False
        when bypassing (the bytes then go in the connection's class).
        Called on the responder's serving thread, just before it sends.
        """
        with self._lock:
            seg = self._attach_locked()
            if seg is None:
                return False
            try:
                seg.write_tag(self._pid, kind, handle,
                              TagValue(seg.alloc_msg_id(), request_id, nbytes, stage, layer, dscp))
            except SegmentError:
                return False
            return True

    # --------------------------------------------------------------- close

    def close(self) -> None:
        """Release every waiting message (fail open), finish running ones, detach."""
        with self._lock:
            self._closed = True
            self._wake.notify_all()
        self._waiter.join()
        self._pool.shutdown(wait=True)
        with self._lock:
            if self._seg is not None:
                self._seg.close(unlink=False)
                self._seg = None
            for old in self._retired:
                old.close(unlink=False)
            self._retired.clear()
