"""The MLU's inputs at each KV-write decision, from a daemon on the testbed or in the simulator model.

Off by default; a debugging record for the fidelity report. :class:`DecisionTrace`
wraps a :class:`~laxflow.daemon.core.DaemonCore`'s policy (on the core's
thread: the daemon's loop, or the model's event loop) and, after each
decision, records for every stage-3 message still waiting for its permit the
inputs MFS's MLU used: the port's measured link load (the core's
:class:`~laxflow.daemon.ports.LinkMeter`), the policy's explicit-deadline
load, rho, the bytes left, the time left to the deadline, the MLU and the
level and DSCP the decision gave. A message's last record is the decision
its permit carries (a granted message keeps its level). Nothing in the
daemon changes: the wrapper delegates every other call to the policy.

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
        core.policy = self

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def decide(self, snap: Snapshot) -> Decision:
        d = self.inner.decide(snap)
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
            meter = self.core.meter  # the port's last counter sample the load came from (value, time)
            self.records.append((snap.now, m.msg_id, f.request, f.layer, port, load, ex, rho, rem, left, mlu,
                                 int(d.queue[i]), int(d.dscp[i]), float(meter._bytes[port]), float(meter._t[port])))
        return d

    def at_grant(self) -> list[dict[str, Any]]:
        """Each message's last record (the decision its permit carried), in time order."""
        last: dict[int, tuple] = {}
        for r in self.records:
            last[r[1]] = r
        return [dict(zip(FIELDS, r)) for r in sorted(last.values(), key=lambda r: r[0])]


def summarize(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Quantiles (10/50/90 %) of each input at grant, the DSCP counts and the share at each DSCP."""
    out: dict[str, Any] = {"writes": len(records)}
    if not records:
        return out
    for k in ("link_load", "explicit_load", "rho", "time_left", "mlu"):
        xs = sorted(r[k] for r in records if r[k] is not None and math.isfinite(r[k]))
        if xs:
            out[k] = {q: round(xs[min(len(xs) - 1, int(p * len(xs)))], 4) for q, p in (("p10", .1), ("p50", .5), ("p90", .9))}
            out[k]["mean"] = round(statistics.fmean(xs), 4)
    dscp: dict[str, int] = {}
    for r in records:
        dscp[str(r["dscp"])] = dscp.get(str(r["dscp"]), 0) + 1
    out["dscp"] = dict(sorted(dscp.items()))
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
            json.dump({"node": args.node, "ports": [p.name for p in config.core.ports], "at_grant": trace.at_grant()}, f)


if __name__ == "__main__":
    main()
