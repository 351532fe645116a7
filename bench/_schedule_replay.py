"""MFS's schedule without MFS: a run's decisions recorded, then replayed (``bench/sim.py --split``).

Not a benchmark: the policies ``bench/sim.py --split`` runs to tell the
time the serving simulator spends *because of* MFS's schedule (the
network engine filling more priority levels, MFS's timer events, the
link-load average it reads) from the time MFS's own code takes to decide
(its C step and the Python around it: admission, batch and request
tables, request progress, completions).

* :class:`RecordingMfs` is mfs, keeping every decision its C core makes
  on the engine's incremental snapshots (levels, queues, DSCP codepoints)
  and the timer it returns. Kept in memory: 17 bytes per live flow per decision (about
  540 MB for a paper-scale run's 32 million).
* :class:`ReplayedSchedule` hands those decisions back to the engine in the
  same order and does nothing on completions: the same run
  (same events, same TTFTs; ``bench/sim.py`` checks), with a policy that
  costs a copy per decision, which it times (``copy_s``) so the caller can
  take it out. It takes the engine's path that mfs takes: an incremental
  snapshot in (``keeps_tags``), and one Decision per flow count over its
  own arrays handed out again, as mfs's C core does, so the engine does not
  check and convert a new decision's arrays at every event (work that mfs's
  run does not have and the split would count as the schedule's).
* :class:`FsKeepingLinkLoad` is fs with the engine keeping the link-load
  average as it does for mfs (fs reads none: the same schedule as fs).

Each runs on the simulator's one thread, called by the network engine.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from laxflow.policy.base import Decision, FlowPolicy, Snapshot
from laxflow.policy.fair_sharing import FairSharing
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

    def decide(self, snap: Snapshot) -> Decision:
        if not self.native or snap.tag is None:
            raise RuntimeError("mfs is not deciding on the network engine's incremental snapshot in C here (its "
                               "C core, laxflow.policy.mfs._core, is not built): there is no decision to record")
        decision = super().decide(snap)
        self.tape += decision.level.data
        self.tape += decision.queue.data
        self.tape += decision.dscp.data
        self.decisions.append((len(snap.flows), decision.timers[0] if decision.timers else None))
        return decision


class ReplayedSchedule(FlowPolicy):
    """A :class:`RecordingMfs` run's decisions, in order. Raises if the run
    asks for a decision over another number of flows than the recording's
    (the replay left the recorded run) or for more decisions than it holds."""

    name = "mfs-replayed"
    reads_link_load = True  # as mfs: the engine keeps the link-load average
    keeps_tags = True  # as mfs: the engine's incremental snapshot and decision path (no tags handed back)

    def __init__(self, recording: RecordingMfs) -> None:
        super().__init__()
        self._tape = memoryview(recording.tape)
        self._decisions = recording.decisions
        self.replayed = 0  # decisions handed out so far
        self.copy_s = 0.0  # seconds spent in decide (perf_counter)
        self._at = 0
        self._room = 0
        self._out: tuple = ()
        self._views: dict[int, Decision] = {}  # flow count -> the Decision over the arrays' first n

    def decide(self, snap: Snapshot) -> Decision:
        t0 = time.perf_counter()
        k, n = self.replayed, len(snap.flows)
        if k >= len(self._decisions):
            raise RuntimeError(f"replay: decision {k} asked for, the recording holds {len(self._decisions)}")
        recorded, timer = self._decisions[k]
        if recorded != n:
            raise RuntimeError(f"replay: decision {k} is over {n} flows, the recorded one over {recorded} "
                               "(the replay left the recorded run)")
        if n > self._room:  # (arrays of its own, grown as mfs grows its out-arrays)
            self._room = max(n, 2 * self._room)
            self._out = (np.empty(self._room, np.int64), np.empty(self._room, np.int64),
                         np.empty(self._room, np.uint8))
            self._views.clear()
        decision = self._views.get(n)
        if decision is None:
            decision = self._views[n] = Decision(*(a[:n] for a in self._out))
        at, tape = self._at, self._tape
        _ffi.memmove(decision.level, tape[at:at + 8 * n], 8 * n)
        _ffi.memmove(decision.queue, tape[at + 8 * n:at + 16 * n], 8 * n)
        _ffi.memmove(decision.dscp, tape[at + 16 * n:at + _PER_FLOW * n], n)
        decision.timers = () if timer is None else (timer,)
        self._at = at + _PER_FLOW * n
        self.replayed = k + 1
        self.copy_s += time.perf_counter() - t0
        return decision

    @property
    def complete(self) -> bool:
        """Whether every recorded decision was handed out."""
        return self.replayed == len(self._decisions)


class FsKeepingLinkLoad(FairSharing):
    """fs, saying it reads the link-load average so the engine keeps it (it reads none)."""

    reads_link_load = True
