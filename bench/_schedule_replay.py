"""MFS's schedule without MFS: a run's decisions recorded, then replayed (``bench/sim.py --split``).

Not a benchmark: the policies ``bench/sim.py --split`` runs to tell the
time the serving simulator spends *because of* MFS's schedule (the
network engine filling more priority levels, MFS's timer events, the
link-load average it reads) from the time MFS's own code takes to decide
(its C step and the Python around it: admission, batch and request
tables, request progress, completions).

* :class:`RecordingMfs` is mfs, keeping every decision its C path writes
  into the engine's buffers (levels, queues, DSCP codepoints) and the timer
  it returns. Kept in memory: 17 bytes per live flow per decision (about
  540 MB for a paper-scale run's 32 million).
* :class:`ReplayedSchedule` copies those decisions back into the engine's
  buffers in the same order and does nothing on completions: the same run
  (same events, same TTFTs; ``bench/sim.py`` checks), with a policy that
  costs a copy per decision, which it times (``copy_s``) so the caller can
  take it out.
* :class:`FsKeepingLinkLoad` is fs with the engine keeping the link-load
  average as it does for mfs (fs reads none: the same schedule as fs).

Each runs on the simulator's one thread, called by the network engine.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np

from laxflow.policy.base import Decision, FlowPolicy, Snapshot
from laxflow.policy.fair_sharing import FairSharing
from laxflow.policy.flow import Flow
from laxflow.policy.mfs import MfsPolicy
from laxflow.sim.network.engine import _ffi

# Bytes of one live flow's recorded decision: level and queue (int64_t), DSCP (uint8_t).
_PER_FLOW = 8 + 8 + 1


class RecordingMfs(MfsPolicy):
    """mfs (default config, as ``create_policy("mfs")``), with each decision kept."""

    def __init__(self) -> None:
        super().__init__()
        self.tape = bytearray()
        self.decisions: list[tuple[int, Any]] = []  # (live flows, timer) per decision, in order

    def decide_into(self, flows: list[Flow], now: float, kept: int, progressed: bool | list[Flow],
                    capacity: np.ndarray, load_window: float, buffers: tuple,
                    snapshot: Callable[[], Snapshot]) -> Any:
        timer = super().decide_into(flows, now, kept, progressed, capacity, load_window, buffers, snapshot)
        if timer is NotImplemented:
            raise RuntimeError("mfs is not deciding into the engine here (its C step, laxflow.policy.mfs._core, "
                               "is not built): there is no decision to record")
        n = len(flows)
        level, queue, dscp = buffers[2:5]
        self.tape += _ffi.buffer(level, 8 * n)
        self.tape += _ffi.buffer(queue, 8 * n)
        self.tape += _ffi.buffer(dscp, n)
        self.decisions.append((n, timer))
        return timer


class ReplayedSchedule(FlowPolicy):
    """A :class:`RecordingMfs` run's decisions, in order. Raises if the run
    asks for a decision over another number of flows than the recording's
    (the replay left the recorded run) or for more decisions than it holds."""

    name = "mfs-replayed"
    reads_link_load = True  # as mfs: the engine keeps the link-load average

    def __init__(self, recording: RecordingMfs) -> None:
        super().__init__()
        self._tape = memoryview(recording.tape)
        self._decisions = recording.decisions
        self.replayed = 0  # decisions handed out so far
        self.copy_s = 0.0  # seconds spent in decide_into (perf_counter)
        self._at = 0

    def decide(self, snap: Snapshot) -> Decision:
        raise RuntimeError("the replayed schedule only decides into the network engine's buffers")

    def decide_into(self, flows: list[Flow], now: float, kept: int, progressed: bool | list[Flow],
                    capacity: np.ndarray, load_window: float, buffers: tuple,
                    snapshot: Callable[[], Snapshot]) -> Any:
        t0 = time.perf_counter()
        k, n = self.replayed, len(flows)
        if k >= len(self._decisions):
            raise RuntimeError(f"replay: decision {k} asked for, the recording holds {len(self._decisions)}")
        recorded, timer = self._decisions[k]
        if recorded != n:
            raise RuntimeError(f"replay: decision {k} is over {n} flows, the recorded one over {recorded} "
                               "(the replay left the recorded run)")
        at, tape = self._at, self._tape
        level, queue, dscp = buffers[2:5]
        _ffi.memmove(level, tape[at:at + 8 * n], 8 * n)
        _ffi.memmove(queue, tape[at + 8 * n:at + 16 * n], 8 * n)
        _ffi.memmove(dscp, tape[at + 16 * n:at + _PER_FLOW * n], n)
        self._at = at + _PER_FLOW * n
        self.replayed = k + 1
        self.copy_s += time.perf_counter() - t0
        return timer

    @property
    def complete(self) -> bool:
        """Whether every recorded decision was handed out."""
        return self.replayed == len(self._decisions)


class FsKeepingLinkLoad(FairSharing):
    """fs, saying it reads the link-load average so the engine keeps it (it reads none)."""

    reads_link_load = True
