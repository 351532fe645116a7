"""Karuna, as the MFS paper's baseline runs it (§6.3; Chen et al., SIGCOMM'16).

Flows with an explicit deadline (``p2d`` flows with a deadline) get the top
level, max-min fair among themselves, each capped at the minimum rate that
still meets its due time, ``remaining / (due - now)``, recomputed at every
event; once due, the cap is lifted (the flow is late, let it finish). Every
other flow is scheduled below them by strict priority on total size, the
paper's "remaining flows using SJF", with SJF's own tie rule
(``sjf.sjf_levels``: equal sizes by earlier arrival, exact ties share a level). A timer at each explicit flow's
due time lifts its cap even if no other event happens then. Called by the engine after every event.
``karuna-group`` sizes a flow group (a collective) as one job of its group's bytes, as ``sjf-group``.
"""

from __future__ import annotations

import numpy as np

from laxflow.policy.base import Decision, FlowPolicy, Snapshot
from laxflow.policy.sjf import job_sizes, sjf_levels


class Karuna(FlowPolicy):
    """Minimal-rate deadline flows on top, SJF below."""

    name = "karuna"
    reads_link_load = False
    group = False  # the SJF part's job size: per pair (False) or the whole flow group (karuna-group)

    def decide(self, snap: Snapshot) -> Decision:
        n = len(snap.flows)
        now = snap.now
        explicit = snap.explicit
        level = np.zeros(n, np.int64)
        cap = np.full(n, np.inf)
        other = ~explicit
        if other.any():
            level[other] = 1 + sjf_levels(job_sizes(snap, self.group)[other], snap.arrival[other])
        timers: tuple[float, ...] = ()
        if explicit.any():
            due = snap.due[explicit]
            left = due - now
            with np.errstate(divide="ignore", invalid="ignore"):
                cap[explicit] = np.where(left > 0, snap.remaining[explicit] / left, np.inf)
            future = due[left > 0]
            timers = tuple(sorted(set(future.tolist())))
        return self.decision(level, cap=cap, timers=timers)


class KarunaGroup(Karuna):
    """``karuna-group``: Karuna whose SJF part sizes a flow group as one job of its group's bytes."""

    name = "karuna-group"
    group = True
