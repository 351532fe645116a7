"""Shortest Job First (SJF): strict priority by total flow size.

What a "flow" is, the MFS paper does not say for a collective. ``sjf`` ranks
each engine flow by its own size: a collective or a sharded KV move, issued
in per-pair units, counts as one queue pair's bytes (RDMA's view: every QP
is a flow). ``sjf-group`` ranks it by its group's bytes (``Flow.pairs`` x
size: the whole collective is one job). Both share every other rule.

Smaller flows go first; the tie rule (``sjf_levels``, shared with Karuna's
SJF part) is: equal sizes by earlier arrival, and flows equal in both share
one level, max-min fair among themselves. No flow-id order enters (ids like
L0, L1, L10 would sort as strings and hand SJF part of another policy's
layer order), and the result does not depend on the engine's flow order.
The size is the flow's total size, not what remains: this is the size-based
baseline of the MFS paper, not SRPT.
"""

from __future__ import annotations

import numpy as np

from laxflow.policy.base import Decision, FlowPolicy, Snapshot, rank_levels


def job_sizes(snap: Snapshot, group: bool) -> np.ndarray:
    """Each flow's size as a job: its own (per pair), or its whole group's (``group``: size x ``Flow.pairs``)."""
    return snap.size * snap.column("pairs") if group else snap.size


def sjf_levels(size: np.ndarray, arrival: np.ndarray) -> np.ndarray:
    """SJF's strict-priority levels: dense rank of (size, then arrival); exact ties share a level."""
    return rank_levels([arrival, size])


class ShortestJobFirst(FlowPolicy):
    """Level = rank of (size, arrival); called by the engine after every event."""

    name = "sjf"
    reads_link_load = False
    group = False  # job size: per pair (False) or the whole flow group (sjf-group)

    def decide(self, snap: Snapshot) -> Decision:
        return self.decision(sjf_levels(job_sizes(snap, self.group), snap.arrival))


class ShortestGroupFirst(ShortestJobFirst):
    """``sjf-group``: SJF with a collective (a flow group) as one job of its group's bytes."""

    name = "sjf-group"
    group = True
