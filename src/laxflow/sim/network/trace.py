"""Record a policy's calls during a run, and replay them into a fresh policy.

A :class:`PolicyRecorder` wraps the policy an engine (or a daemon) drives and
logs every ``decide`` with what the policy could read (the live flows' ids,
remaining bytes, request state, the measured link load) and what it answered
(levels, queues, DSCP, caps, timers), and every ``on_complete``. The log
replays without the engine or the serving model that produced it
(:func:`replay`), so it pins a policy's decisions on a real run:

* the regression test of the ``mfs`` policy replays a recorded serving run
  and asserts every decision is unchanged (``tests/policy``), and
* ``bench/policy.py`` times ``decide`` on the same calls.

Format: one JSON object (gzip when the path ends in ``.gz``) with ``capacity``
(bytes/s per link), ``load_window`` (s), ``flows`` (each flow's id and static
fields, in order of first sight) and ``calls``: ``["decide", now, flows,
remaining, current_layer, compute_done, downstream, link_load, level, queue,
dscp, cap, timers]`` or ``["complete", now, flow]``, a flow named by its
index in ``flows``. ``link_load`` is kept sparse, for the links the
live flows use, as ``[[link, load], ...]`` (other links read as 0: no policy
looks at a link none of its flows crosses). Floats round-trip exactly (JSON
writes ``repr``). Used by tests and benchmarks, on one thread.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from laxflow.policy.base import Decision, FlowPolicy, Snapshot
from laxflow.policy.dscp import DscpMap
from laxflow.policy.flow import Flow, Stage

_STATIC = ("size", "arrival", "request", "batch", "deadline", "layer")


class PolicyRecorder(FlowPolicy):
    """A policy that forwards to ``inner`` and logs its calls (see the module doc)."""

    def __init__(self, inner: FlowPolicy) -> None:
        self.inner = inner
        self.name = inner.name  # type: ignore[misc]
        self.flows: list[dict[str, Any]] = []
        self._index: dict[str, int] = {}
        self.calls: list[list[Any]] = []
        self.capacity: list[float] = []
        self.load_window = 0.0

    @property
    def dscp_map(self) -> DscpMap:
        return self.inner.dscp_map

    def decide(self, snap: Snapshot) -> Decision:
        self.capacity = np.asarray(snap.capacity, float).tolist()
        self.load_window = float(snap.load_window)
        links: set[int] = set()
        for f in snap.flows:
            if f.id not in self._index:
                row = {"id": f.id, **{k: getattr(f, k) for k in _STATIC}}
                row.update(stage=f.stage.value, links=f.links.tolist(), weights=f.weights.tolist())
                self._index[f.id] = len(self.flows)
                self.flows.append(row)
            links.update(f.links.tolist())
        load = np.asarray(snap.link_load, float)
        call: list[Any] = [
            "decide",
            float(snap.now),
            [self._index[f.id] for f in snap.flows],
            np.asarray(snap.remaining, float).tolist(),
            [f.current_layer for f in snap.flows],
            [bool(f.compute_done) for f in snap.flows],
            [float(f.downstream) for f in snap.flows],
            [[k, float(load[k])] for k in sorted(links) if load[k] != 0.0],
        ]
        d = self.inner.decide(snap)
        self.calls.append(call + decision_row(d))
        return d

    def on_complete(self, flow: Flow, now: float) -> None:
        self.calls.append(["complete", float(now), self._index[flow.id]])
        self.inner.on_complete(flow, now)

    def save(self, path: str | Path, **meta: Any) -> None:
        """Write the log (``meta``: how the run was made, free-form)."""
        data = {"meta": meta, "capacity": self.capacity, "load_window": self.load_window, "flows": self.flows, "calls": self.calls}
        text = json.dumps(data, separators=(",", ":"))
        if str(path).endswith(".gz"):
            with gzip.open(path, "wt", compresslevel=9) as fh:
                fh.write(text)
        else:
            Path(path).write_text(text)


def load(path: str | Path) -> dict[str, Any]:
    """Read a log written by :meth:`PolicyRecorder.save`."""
    if str(path).endswith(".gz"):
        with gzip.open(path, "rt") as fh:
            return json.load(fh)
    return json.loads(Path(path).read_text())


class Replay:
    """The calls of a log as fresh :class:`Flow` objects and :class:`Snapshot` s.

    Iterate to get ``("decide", snapshot, expected)`` and
    ``("complete", flow, now)`` in the recorded order; hand them to a policy
    (:func:`replay` does). Flow request state is set before each snapshot.
    """

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data
        self.capacity = np.array(data["capacity"], float)
        self.load_window = float(data["load_window"])
        self.flows = [
            Flow(
                id=row["id"], links=np.array(row["links"], np.int64), weights=np.array(row["weights"], float),
                stage=Stage(row["stage"]), **{k: row[k] for k in _STATIC},
            )  # fmt: skip
            for row in data["flows"]
        ]

    def __iter__(self) -> Iterator[tuple[str, Any, Any]]:
        n_links = self.capacity.size
        for call in self.data["calls"]:
            if call[0] == "complete":
                yield "complete", self.flows[call[2]], call[1]
                continue
            _, now, ids, remaining, current, done, downstream, load, *expected = call
            flows = [self.flows[i] for i in ids]
            for f, c, cd, ds in zip(flows, current, done, downstream):
                f.current_layer, f.compute_done, f.downstream = c, cd, ds
            link_load = np.zeros(n_links)
            for k, v in load:
                link_load[k] = v
            snap = Snapshot(
                now=now, flows=flows, remaining=np.array(remaining, float), capacity=self.capacity,
                link_load=link_load, load_window=self.load_window,
            )  # fmt: skip
            yield "decide", snap, expected


def decision_row(d: Decision) -> list[Any]:
    """A decision in the log's form (level, queue, dscp, cap, timers), for comparisons."""
    cap = None if d.cap is None else [c if np.isfinite(c) else None for c in np.asarray(d.cap, float).tolist()]
    return [np.asarray(d.level).tolist(), np.asarray(d.queue).tolist(), np.asarray(d.dscp).tolist(), cap, list(d.timers)]


def replay(data: dict[str, Any], policy: FlowPolicy) -> Iterator[tuple[list[Any], list[Any]]]:
    """Drive ``policy`` through a log; yields (recorded, replayed) decision rows."""
    for kind, a, b in Replay(data):
        if kind == "complete":
            policy.on_complete(a, b)
        else:
            yield b, decision_row(policy.decide(a))
