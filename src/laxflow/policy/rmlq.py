"""Reverse Multi-Level Queue: per-flow state that only ever promotes.

MFS §4.2-§4.5. Flows enter low and climb as their laxity shrinks; a flow's
urgency index (its MLU level if it has an explicit deadline, its RLI
otherwise; 0 most urgent) never grows. It may change only

* at a layer boundary of its request: the request's ``current_layer`` is
  larger than when the level was last set (while the request computes), or
* for explicit-deadline flows once the request's compute has ended, on a
  fixed grid of period ``period``: ticks at ``k * period``; a flow is
  re-evaluated at the first decision in a tick later than the one in which
  its level was last set, and :meth:`Rmlq.next_timer` tells the engine when
  the next tick is.

so one message never spans two levels (packets of one message are never
reordered across queues). New flows get their entry level at admission.

The table stores per flow, in slot arrays that grow by doubling, what the
``mfs`` policy needs on every decision (static path features, the stored
urgency and when it was set), so a decision over 10,000 live flows is a few
NumPy operations and no per-flow Python beyond one dictionary lookup.
Owned by one ``mfs`` policy instance; called on the engine's thread.
"""

from __future__ import annotations

import math

import numpy as np

from laxflow.policy.flow import Flow

_NO_LAYER = -math.inf  # "no current layer known": any real layer is an advance


class Rmlq:
    """Slot table of live flows with their monotone urgency."""

    def __init__(self, levels: int, period: float) -> None:
        self.levels = levels
        self.period = period
        self.slot: dict[Flow, int] = {}
        self._free: list[int] = []
        self._size = 0
        cap = 64
        self.urgency = np.zeros(cap, np.int64)  # MLU level or RLI, 0 = most urgent
        self.explicit = np.zeros(cap, bool)
        self.stage = np.zeros(cap, np.int8)
        self.target = np.zeros(cap)  # target layer, NaN if unknown
        self.due = np.zeros(cap)  # due time, NaN if none
        self.bneck_link = np.zeros(cap, np.int64)
        self.bneck_rate = np.zeros(cap)  # bytes/s alone on its path
        self.bneck_weight = np.zeros(cap)  # its weight on that link
        self.last_rem = np.zeros(cap)  # remaining bytes at the last decision
        self.batch = np.zeros(cap, np.int64)  # index into the policy's batch table
        self.request = np.zeros(cap, np.int64)  # index into the policy's request table
        self.layer_at = np.zeros(cap)  # current_layer when urgency was last set
        self.tick_at = np.zeros(cap, np.int64)  # period tick when urgency was last set

    _ARRAYS = (
        "urgency", "explicit", "stage", "target", "due", "bneck_link", "bneck_rate",
        "bneck_weight", "last_rem", "batch", "request", "layer_at", "tick_at",
    )  # fmt: skip

    def __len__(self) -> int:
        return len(self.slot)

    @property
    def allocated(self) -> int:
        """Slots handed out so far, free ones included (the most flows live at once)."""
        return self._size

    def tick(self, now: float) -> int:
        """Index of the period tick containing ``now`` (robust to float dust)."""
        return int(math.floor(now / self.period + 1e-9))

    def allocate(self, flow: Flow) -> int:
        """A slot for a newly seen flow (fields are set by the caller)."""
        if self._free:
            s = self._free.pop()
        else:
            s = self._size
            self._size += 1
            if s >= len(self.urgency):
                for name in self._ARRAYS:
                    old = getattr(self, name)
                    new = np.zeros(2 * len(old), old.dtype)
                    new[: len(old)] = old
                    setattr(self, name, new)
        self.slot[flow] = s
        return s

    def release(self, flow: Flow) -> int | None:
        """Forget a finished flow (called from the policy's ``on_complete``); its
        slot, free again (None: the flow had none)."""
        s = self.slot.pop(flow, None)
        if s is not None:
            self._free.append(s)
        return s

    def set_entry(self, idx: np.ndarray, urgency: np.ndarray, current: np.ndarray, now: float) -> None:
        """Entry level at admission: no monotonicity to respect yet."""
        self.urgency[idx] = urgency
        self.layer_at[idx] = np.where(np.isnan(current), _NO_LAYER, current)
        self.tick_at[idx] = self.tick(now)

    def eligible(self, idx: np.ndarray, current: np.ndarray, compute_done: np.ndarray, now: float) -> np.ndarray:
        """Which of ``idx`` may change level now (layer boundary or period tick)."""
        cur = np.where(np.isnan(current), _NO_LAYER, current)
        advanced = cur > self.layer_at[idx]
        periodic = self.explicit[idx] & compute_done & (self.tick(now) > self.tick_at[idx])
        return (advanced | periodic) & (self.urgency[idx] > 0)

    def promote(self, idx: np.ndarray, candidate: np.ndarray, current: np.ndarray, now: float) -> np.ndarray:
        """Move ``idx`` to ``min(stored, candidate)``; return which changed."""
        old = self.urgency[idx]
        new = np.minimum(old, candidate)
        self.urgency[idx] = new
        self.layer_at[idx] = np.where(np.isnan(current), _NO_LAYER, current)
        self.tick_at[idx] = self.tick(now)
        return new < old

    def next_timer(self, idx: np.ndarray, compute_done: np.ndarray, now: float) -> float | None:
        """Next period tick if some explicit flow past compute can still climb."""
        waiting = self.explicit[idx] & compute_done & (self.urgency[idx] > 0)
        if not waiting.any():
            return None
        return (self.tick(now) + 1) * self.period
