"""Hooks messages: the prefill scheduler's calls to its node daemon, on ZeroMQ.

Same envelope and codec as the control plane (:mod:`laxflow.protocol.wire`);
these types are registered under a ``hooks_`` prefix. The client
(:class:`laxflow.hooks.client.HooksClient`) sends one request on a DEALER and
the daemon's ROUTER (:mod:`laxflow.daemon.hooks_server`) answers each with
exactly one reply: :class:`Ack`, or the typed reply named below. Pruning
advice is pushed on the daemon's PUB socket (hooks address + ``.pub``). Where
that socket is unless configured: :func:`default_hooks_address`.

Units: deadlines are wall-clock seconds (``time.time()``), durations
seconds, sizes bytes, rates bytes/s. Request ids are the hooks' own strings;
the daemon joins them with shim events through :func:`laxflow.hooks.request_key`.
Stages are the names of :class:`laxflow.stage.Stage` (the stage table
of ``native/laxflow_shm.h``).

Counts are bounded to what a real request can have (the bounds of
:mod:`laxflow.protocol.messages`: tokens, layers, bytes; ids within int64): a
call past a bound is answered ``Ack(ok=False)`` with one line naming the
field, the value and the bound, and counted as a bad event.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from laxflow.stage import Stage
from laxflow.protocol.messages import (INT64_MAX, MAX_BANDWIDTH, MAX_BYTES, MAX_LAYER, MAX_LEVEL, MAX_SECONDS,
                                       MAX_TOKENS, bounded)
from laxflow.protocol.schema import message

STAGES = tuple(stage.value for stage in Stage)
MAX_PID = 1 << 22  # Linux's PID_MAX_LIMIT
# A QP number (24 bits), a file descriptor, or a file descriptor + 2^32: the handle of the reads a socket
# initiates, bound to the ingress port (laxflow.testbed.mfs_io.RX_HANDLE).
MAX_HANDLE = (1 << 33) - 1
MAX_PRIORITY = (1 << 31) - 1  # |priority|: the engine's own int32 priorities fit


def default_hooks_address(shm: str, runtime_dir: str) -> str:
    """Where the daemon of segment ``shm`` serves hooks unless configured (daemon config, hooks client, doctor)."""
    return f"ipc://{Path(runtime_dir) / ('laxflow-hooks-' + shm.strip('/') + '.sock')}"


def runtime_dir(env: Mapping[str, str] | None = None) -> str:
    """``$XDG_RUNTIME_DIR`` or /tmp (read here for the daemon's config loader and the hooks client's only)."""
    env = os.environ if env is None else env
    return env.get("XDG_RUNTIME_DIR") or "/tmp"


def _msg_id(value: int) -> None:
    bounded(value, "msg_id", 1, INT64_MAX)


@message("hooks_register_request")
@dataclass(frozen=True)
class RegisterRequest:
    request: str
    deadline: float | None
    prompt_tokens: int
    reused_tokens: int
    priority: int

    def validate(self) -> None:
        bounded(self.prompt_tokens, "prompt_tokens", 0, MAX_TOKENS)
        bounded(self.reused_tokens, "reused_tokens", 0, MAX_TOKENS)
        bounded(self.priority, "priority", -MAX_PRIORITY, MAX_PRIORITY)


@message("hooks_batch_formed")
@dataclass(frozen=True)
class BatchFormed:
    batch: str
    requests: tuple[str, ...]
    compute_s: float
    traffic: dict[str, dict[str, float]]  # port -> request -> bytes expected

    def validate(self) -> None:
        bounded(self.compute_s, "compute_s", 0, MAX_SECONDS)
        for port, row in self.traffic.items():
            for request, nbytes in row.items():
                bounded(nbytes, f"traffic[{port!r}][{request!r}]", 0, MAX_BYTES)


@message("hooks_layer")
@dataclass(frozen=True)
class Layer:
    batch: str
    layer: int
    phase: str  # "begin" | "end"
    last: bool  # phase "end" of the last layer: the batch's compute is done

    def validate(self) -> None:
        if self.phase not in ("begin", "end"):
            raise ValueError(f"phase {self.phase!r} (expected begin or end)")
        bounded(self.layer, "layer", 0, MAX_LAYER)


@message("hooks_submit")
@dataclass(frozen=True)
class Submit:
    msg_id: int
    request: str
    stage: str
    layer: int | None
    nbytes: float
    port: str  # "" = the daemon's default port
    downstream: float

    def validate(self) -> None:
        if self.stage not in STAGES:
            raise ValueError(f"stage {self.stage!r} (expected one of {', '.join(STAGES)})")
        _msg_id(self.msg_id)
        if self.layer is not None:
            bounded(self.layer, "layer", 0, MAX_LAYER)
        bounded(self.nbytes, "nbytes", 0, MAX_BYTES)
        bounded(self.downstream, "downstream", 0, MAX_BYTES)


@message("hooks_progress")
@dataclass(frozen=True)
class Progress:
    msg_id: int
    bytes_done: float

    def validate(self) -> None:
        _msg_id(self.msg_id)
        bounded(self.bytes_done, "bytes_done", 0, MAX_BYTES)


@message("hooks_complete")
@dataclass(frozen=True)
class Complete:
    msg_id: int

    def validate(self) -> None:
        _msg_id(self.msg_id)


@message("hooks_request_done")
@dataclass(frozen=True)
class RequestDone:
    request: str


@message("hooks_bind")
@dataclass(frozen=True)
class Bind:
    """Process ``pid``'s QP number or socket fd ``handle`` sends on ``port``."""

    pid: int
    handle: int
    port: str

    def validate(self) -> None:
        bounded(self.pid, "pid", 1, MAX_PID)
        bounded(self.handle, "handle", 0, MAX_HANDLE)


@message("hooks_wait_permit")
@dataclass(frozen=True)
class WaitPermit:
    msg_id: int
    timeout_s: float  # 0..60: the reply comes at the permit or at the timeout

    def validate(self) -> None:
        _msg_id(self.msg_id)
        if not 0 <= self.timeout_s <= 60:
            raise ValueError(f"timeout_s must be in 0..60 s, got {self.timeout_s!r}")


@message("hooks_permit")
@dataclass(frozen=True)
class Permit:
    msg_id: int
    granted: bool
    level: int
    dscp: int

    def validate(self) -> None:
        bounded(self.level, "level", 0, MAX_LEVEL)
        bounded(self.dscp, "dscp", 0, 63)


@message("hooks_pruned_query")
@dataclass(frozen=True)
class PrunedQuery:
    pass


@message("hooks_pruned")
@dataclass(frozen=True)
class Pruned:
    """The requests now in the scavenger class (reply, and PUB advice)."""

    seq: int
    requests: tuple[str, ...]


@dataclass(frozen=True)
class Instance:
    """A candidate prefill instance for ``dispatch_advice``."""

    name: str
    queue_s: float  # compute already queued ahead of the request, s
    compute_s: float  # the request's own prefill compute there, s
    nbytes: float  # network bytes the request would move there (reuse fetch + P2D)
    port: str  # this node's port the transfer crosses ("" = none known)
    bandwidth: float  # bytes/s of that path (0 = the port's line rate)

    def validate(self) -> None:
        if min(self.queue_s, self.compute_s, self.nbytes, self.bandwidth) < 0:
            raise ValueError(f"instance {self.name!r}: queue_s, compute_s, nbytes and bandwidth must be >= 0")
        bounded(self.nbytes, f"instance {self.name!r} nbytes", 0, MAX_BYTES)
        bounded(self.bandwidth, f"instance {self.name!r} bandwidth", 0, MAX_BANDWIDTH)


@dataclass(frozen=True)
class Estimate:
    name: str
    ttft_s: float  # estimated time to first token from now
    network_s: float  # of which the network


@message("hooks_dispatch")
@dataclass(frozen=True)
class Dispatch:
    request: str
    instances: tuple[Instance, ...]


@message("hooks_advice")
@dataclass(frozen=True)
class Advice:
    ranked: tuple[Estimate, ...]  # best first
    unranked: tuple[str, ...]  # instances whose estimate is not a finite number (e.g. a bandwidth near 0)


@message("hooks_status_query")
@dataclass(frozen=True)
class StatusQuery:
    pass


@message("hooks_status")
@dataclass(frozen=True)
class Status:
    node: str
    mode: str  # "coordinated" | "local"
    coordinator: str  # address, "" without one
    ports: tuple[str, ...]
    live_messages: int
    waiting: int
    pruned: int
    # Added later (a default: an older daemon leaves it out). Why the coordinator will not talk to this
    # daemon, e.g. "coordinator refused our CURVE key"; "" when it does or there is none.
    coordinator_error: str = ""


@message("hooks_ack")
@dataclass(frozen=True)
class Ack:
    ok: bool
    error: str  # one line when not ok
