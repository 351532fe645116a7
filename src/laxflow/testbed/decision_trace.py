"""The MLU's inputs at each KV-write decision, from a daemon on the testbed or in the simulator model.

Off by default; a debugging record for the fidelity report. :class:`DecisionTrace`
wraps a :class:`~laxflow.daemon.core.DaemonCore`'s policy (on the core's
thread: the daemon's loop, or the model's event loop) and, after each
decision, records for every stage-3 message still waiting for its permit the
inputs MFS's MLU used: the port's measured link load (the core's
:class:`~laxflow.daemon.ports.LinkMeter`), the policy's explicit-deadline
load, rho, the bytes left, the time left to the deadline, the MLU and the
level and DSCP the decision gave. A message's last record is the decision
its permit carries (a granted message keeps its level). For every
collective (stage 2) it also records, at the first decision that saw it,
what ranks above it on its port and is unfinished, and later when its
permit was written (:meth:`DecisionTrace.holds`): what held the all_to_all
at the host gate, and for how long. Nothing in the daemon changes: the
wrapper delegates every other call to the policy.

On the testbed, ``ScenarioConfig.trace_decisions`` makes the scenario start
each host's daemon as ``python -m laxflow.testbed.decision_trace OUT.json
--node ... <the daemon's flags>`` (this module's :func:`main`: the daemon
CLI's run, plus the trace written to OUT when it stops). The simulator
model wraps its own daemons' cores the same way (``predict(...,
trace=True)``); :func:`summarize` puts both in one form.
"""

from __future__ import annotations

import argparse
import json
import math
import signal
import statistics
from typing import Any

from laxflow.policy.base import Decision, Snapshot
from laxflow.policy.flow import Stage

FIELDS = ("t", "msg", "request", "layer", "port", "link_load", "explicit_load", "rho", "bytes_left", "time_left",
          "mlu", "queue", "dscp", "counter", "counter_t")


class DecisionTrace:
    """Stands in for ``core.policy``; records stage-3 decisions (see the module doc)."""

    def __init__(self, core: Any) -> None:
        self.core, self.inner = core, core.policy
        self.records: list[tuple] = []
        # per collective, at the first decision that saw it: (t, port, [(stage, queue, unfinished bytes, granted)
        # per message ranked above it], its Message: granted is set on it when the permit is written)
        self.held: dict[int, tuple] = {}
        core.policy = self

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def decide(self, snap: Snapshot) -> Decision:
        d = self.inner.decide(snap)
        self._record_holds(snap, d)
        explicit = getattr(self.inner, "_explicit_load", None)
        for i, f in enumerate(snap.flows):
            if f.stage is not Stage.P2D:
                continue
            m = self.core.messages.get(int(f.id))
            if m is None or m.granted is not None:
                continue
            port = m.port
            load = float(snap.link_load[port])
            ex = float(explicit[port]) if explicit is not None and explicit.size > port else 0.0
            rho = min(max(load - ex, 0.0), 1.0)
            left = None if f.due is None else f.due - snap.now
            rem = float(snap.remaining[i])
            residual = None if left is None else left * float(snap.capacity[port]) * (1.0 - rho)
            mlu = None if residual is None else (rem / residual if residual > 0 else math.inf)
            counter_t, counter = self.core.meter.last_sample(port)  # the port's sample the load came from
            self.records.append((snap.now, m.msg_id, f.request, f.layer, port, load, ex, rho, rem, left, mlu,
                                 int(d.queue[i]), int(d.dscp[i]), counter, counter_t))
        return d

    def _record_holds(self, snap: Snapshot, d: Decision) -> None:
        """For each collective this decision is the first to see: the unfinished messages ranked above it."""
        msgs = [self.core.messages.get(int(f.id)) for f in snap.flows]
        rank = [int(r) for r in d.level]
        for i, f in enumerate(snap.flows):
            m = msgs[i]
            if f.stage is not Stage.COLLECTIVE or m is None or m.granted is not None or m.msg_id in self.held:
                continue
            ahead = [(int(g.flow.stage.code), int(d.queue[j]), float(snap.remaining[j]), g.granted is not None)
                     for j, g in enumerate(msgs)
                     if g is not None and g.port == m.port and rank[j] < rank[i] and snap.remaining[j] > 0]
            self.held[m.msg_id] = (snap.now, m.port, ahead, m)

    def holds(self) -> list[dict[str, Any]]:
        """Per collective, in time order: when the daemon took it in (``submitted``), its first decision
        (``t``), when its permit was written (``granted``; None: never; ``spare``: into the port's spare
        capacity), and what was ranked above it and unfinished at that decision (stage, queue, unfinished
        bytes, granted)."""
        return [{"msg": msg, "port": port, "submitted": m.submitted, "t": t, "granted": m.granted, "spare": m.spare,
                 "ahead": [dict(zip(("stage", "queue", "bytes", "granted"), a)) for a in ahead]}
                for msg, (t, port, ahead, m) in sorted(self.held.items(), key=lambda kv: kv[1][0])]

    def at_grant(self) -> list[dict[str, Any]]:
        """Each message's last record (the decision its permit carried), in time order."""
        last: dict[int, tuple] = {}
        for r in self.records:
            last[r[1]] = r
        return [dict(zip(FIELDS, r)) for r in sorted(last.values(), key=lambda r: r[0])]


def _at(xs: list[float], p: float) -> float:
    """The ``p`` quantile of sorted ``xs`` (non-empty): the element at index floor(p * n)."""
    return xs[min(len(xs) - 1, int(p * len(xs)))]


def summarize(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Quantiles (10/50/90 %) of each input at grant, the DSCP counts and the share at each DSCP."""
    out: dict[str, Any] = {"writes": len(records)}
    if not records:
        return out
    for k in ("link_load", "explicit_load", "rho", "time_left", "mlu"):
        xs = sorted(r[k] for r in records if r[k] is not None and math.isfinite(r[k]))
        if xs:
            out[k] = {q: round(_at(xs, p), 4) for q, p in (("p10", .1), ("p50", .5), ("p90", .9))}
            out[k]["mean"] = round(statistics.fmean(xs), 4)
    dscp: dict[str, int] = {}
    for r in records:
        dscp[str(r["dscp"])] = dscp.get(str(r["dscp"]), 0) + 1
    out["dscp"] = dict(sorted(dscp.items()))
    return out


def summarize_holds(holds: list[dict[str, Any]]) -> dict[str, Any]:
    """The collectives at the daemon's gate: how many, their wait from intake to permit (ms: mean, p50,
    p90, max; how many waited 1 ms or more), and of those how many had a granted stage-3 write (a KV write
    in flight) or stage-1 read ranked above them at their first decision, and how many nothing; how many
    went into the port's spare capacity with something above them unfinished (``spare_grants``)."""
    out: dict[str, Any] = {"collectives": len(holds), "spare_grants": sum(bool(h.get("spare")) for h in holds)}
    waits = [(1000 * (h["granted"] - h["submitted"]), h) for h in holds if h["granted"] is not None]
    if not waits:
        return out
    ms = sorted(w for w, _ in waits)
    out["wait_ms"] = {"mean": round(statistics.fmean(ms), 3), "p50": round(_at(ms, .5), 3),
                      "p90": round(_at(ms, .9), 3), "max": round(ms[-1], 3)}
    long = [h for w, h in waits if w >= 1.0]
    out["waited_1ms"] = len(long)
    for stage, name in ((3, "write"), (1, "read")):
        out[f"waited_1ms_granted_{name}_ahead"] = sum(any(a["stage"] == stage and a["granted"] for a in h["ahead"])
                                                      for h in long)
    out["waited_1ms_nothing_ahead"] = sum(not h["ahead"] for h in long)
    return out


def main() -> None:
    """``python -m laxflow.testbed.decision_trace OUT --node ...``: the daemon, traced; OUT written when it stops."""
    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("out")
    for flag in ("--node", "--coordinator", "--shm", "--ports", "--hooks", "--config"):
        ap.add_argument(flag)
    ap.add_argument("--metrics-port", type=int)
    ap.add_argument("--log-level", default="warning")
    args = ap.parse_args()
    from laxflow.daemon.config import load_config
    from laxflow.daemon.service import Daemon

    config = load_config({"node": args.node, "coordinator": args.coordinator, "shm": args.shm, "ports": args.ports,
                          "metrics_port": args.metrics_port, "hooks": args.hooks, "config": args.config})
    daemon = Daemon(config)
    trace = DecisionTrace(daemon.core)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: daemon.stop())
    try:
        daemon.run()
    finally:
        daemon.shutdown()
        with open(args.out, "w") as f:
            json.dump({"node": args.node, "ports": [p.name for p in config.core.ports], "at_grant": trace.at_grant(),
                       "holds": trace.holds()}, f)


if __name__ == "__main__":
    main()
