"""The contention scenario in the simulator: the testbed's prediction.

Mirrors :mod:`laxflow.testbed.worker` on the simulator's fluid network
(:class:`laxflow.sim.network.engine.FluidNetwork`) with the same policy
objects the daemons run (``fs`` for one class, ``mfs`` for laxflow on). Same
hosts, sizes, compute sleeps, arrivals and TTFT SLO as a
:class:`laxflow.testbed.scenario.ScenarioConfig`:

- links: each host's egress (``hN-up``, the host HTB at line rate) and the
  switch port toward it (``hN-down``), capacity = line rate x TCP goodput
  (1448 payload bytes per 1514-byte frame);
- per prefill rank, requests in arrival order, one at a time: the stage-1
  reads of the request's layers, asked for at once and served one after
  another on the rank's KV connection (h2 -> rank), each with the RLI of the
  layer the rank is at when it starts; layer j computes once its read is in
  (a delay), then the all_to_all (rank -> peer, both directions; the layer
  ends when both are in); each layer's stage-3 write rank -> h3 is sent as
  the layer ends, behind the earlier ones on the rank's one connection;
- SLO: ``slo_factor`` x the low-load TTFT (the testbed's measured one when
  given, else the simulator's own); the first ``warmup`` requests are left
  out, as on the testbed;
- CCT = from a rank's all_to_all start to both directions in; TTFT = the
  request's last stage-3 write done (the later rank) - arrival.

Not modelled (the differences the fidelity report discusses): TCP slow
start / ACK clocking, the daemons' permit latency and window, Python and
scheduler overheads on the host, and acknowledgement bytes.
Called by ``bench/testbed_fidelity.py`` on the main thread.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from typing import Any

from laxflow.policy.flow import Flow, Stage
from laxflow.policy.registry import create_policy
from laxflow.sim.events import EventQueue, Priority
from laxflow.sim.network.engine import FluidNetwork
from laxflow.sim.network.topology import Topology
from laxflow.testbed.fabric import parse_rate
from laxflow.testbed.scenario import ScenarioConfig

GOODPUT = 1448 / 1514  # TCP payload per Ethernet frame (timestamps on)
HOSTS = 4


def low_load_ttft(cfg: ScenarioConfig) -> float:
    """The simulator's TTFT at low load (``fs``, requests far apart): the SLO base, as the testbed measures it."""
    return predict(cfg.low_load(warmup=0), "fs", slo=math.inf)["ttft_mean"]


def predict(cfg: ScenarioConfig, policy: str, slo: float | None = None) -> dict[str, Any]:
    """Run the scenario under ``policy``; returns cct_mean, ttft_mean, slo_attainment (seconds).

    ``slo``: the TTFT SLO in seconds; None means ``slo_factor`` x the
    simulator's own low-load TTFT. The first ``cfg.warmup`` requests run and
    are left out, as on the testbed.
    """
    if slo is None:
        slo = cfg.slo_factor * low_load_ttft(cfg)
    cap = parse_rate(cfg.rate) / 8 * GOODPUT
    ids = [f"h{h}-{d}" for d in ("up", "down") for h in range(HOSTS)]
    topo = Topology.from_links(ids, [cap] * len(ids))
    q = EventQueue()
    net = FluidNetwork(topo, create_policy(policy), q)
    L, C = cfg.layers, cfg.compute_ms / 1000
    arrivals = [i * cfg.interarrival_ms / 1000 for i in range(cfg.requests + cfg.warmup)]
    up = lambda h: topo.index(f"h{h}-up")  # noqa: E731
    down = lambda h: topo.index(f"h{h}-down")  # noqa: E731
    cct: list[float] = []
    done: dict[tuple[int, int], float] = {}
    a2a: dict[tuple[int, int], dict[str, Any]] = {}
    writer = {r: deque() for r in (0, 1)}
    writer_busy = {0: False, 1: False}

    def flow(fid: str, src: int, dst: int, size: float, stage: Stage, req: int, layer: int, current: int) -> Flow:
        return Flow.on_path(fid, size, [up(src), down(dst)], stage=stage, request=f"r{req}",
                            deadline=arrivals[req] + slo if math.isfinite(slo) else None, layer=layer,
                            current_layer=current, downstream=(L - 1 - layer) * C if stage is not Stage.P2D else 0.0)

    def start_request(rank: int, req: int) -> None:
        st = {"in": [False] * L, "layer": 0, "computing": False}

        def read(layer: int) -> None:
            # the testbed's reads are asked for at once and served one after another on the rank's connection
            f = flow(f"r{req}-k{rank}-{layer}", 2, rank, cfg.reuse_bytes, Stage.REUSE, req, layer, st["layer"])
            net.add_flow(f, lambda _f: read_done(layer))

        def read_done(layer: int) -> None:
            st["in"][layer] = True
            if layer + 1 < L:
                read(layer + 1)
            maybe_compute()

        def maybe_compute() -> None:
            j = st["layer"]
            if j < L and st["in"][j] and not st["computing"]:
                st["computing"] = True
                q.push(q.now + C, Priority.COMPUTE, compute_done, j)

        def compute_done(j: int) -> None:
            key = (req, j)
            s = a2a.setdefault(key, {"start": {}, "sent": set(), "ranks": {}})
            s["start"][rank] = q.now
            s["ranks"][rank] = layer_done
            f = flow(f"r{req}-a{rank}-{j}", rank, 1 - rank, cfg.a2a_bytes, Stage.COLLECTIVE, req, j, j)
            net.add_flow(f, lambda _f: sent(key, rank))

        def layer_done(j: int) -> None:
            st["computing"] = False
            st["layer"] = j + 1
            writer[rank].append((req, j))
            pump(rank)
            if j + 1 < L:
                maybe_compute()
            elif req + 1 < len(arrivals):
                q.push(max(q.now, arrivals[req + 1]), Priority.ARRIVAL, start_request, rank, req + 1)

        read(0)

    def sent(key: tuple[int, int], rank: int) -> None:
        # rank's bytes reached the peer: the peer's receive half is done
        s = a2a[key]
        s["sent"].add(rank)
        for r in (0, 1):
            if r in s["start"] and {0, 1} <= s["sent"] and r not in s.get("closed", set()):
                s.setdefault("closed", set()).add(r)
                cct.append(((key[0], r), q.now - s["start"][r]))
                s["ranks"][r](key[1])

    def pump(rank: int) -> None:
        if writer_busy[rank] or not writer[rank]:
            return
        req, j = writer[rank].popleft()
        writer_busy[rank] = True

        def written(_f: Flow) -> None:
            writer_busy[rank] = False
            if j == L - 1:
                done[(rank, req)] = q.now
            pump(rank)

        net.add_flow(flow(f"r{req}-w{rank}-{j}", rank, 3, cfg.kv_bytes + 24, Stage.P2D, req, j, j), written)

    for rank in (0, 1):
        q.push(arrivals[0], Priority.ARRIVAL, start_request, rank, 0)
    q.run()
    w = cfg.warmup
    ttft = [max(done[(0, i)], done[(1, i)]) - a for i, a in enumerate(arrivals)][w:]
    measured_cct = [c for (req, _rank), c in cct if req >= w]
    return {"cct_mean": statistics.fmean(measured_cct), "ttft_mean": statistics.fmean(ttft),
            "slo_attainment": sum(t <= slo for t in ttft) / len(ttft), "slo_s": slo}


def predict_modes(cfg: ScenarioConfig, slo: float | None = None) -> dict[str, Any]:
    """off (``fs``: one class) and on (``mfs``), plus the ratios, as ``testbed run`` reports them.

    ``slo``: the SLO the testbed measured (its low-load TTFT x factor), so
    both sides judge the same deadline; None: the simulator's own.
    """
    if slo is None:
        slo = cfg.slo_factor * low_load_ttft(cfg)
    off, on = predict(cfg, "fs", slo), predict(cfg, "mfs", slo)
    return {"off": off, "on": on, "cct_ratio": off["cct_mean"] / on["cct_mean"],
            "ttft_ratio": off["ttft_mean"] / on["ttft_mean"]}
