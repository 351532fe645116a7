"""Speed of the flow-level network engine (a benchmark, not a test).

Prints ``{"recompute_ms_5000": ..., "recompute_ms_20000": ..., "events_per_s": ...}``:

* ``recompute_ms_N``: one full recompute of the engine with N live
  point-to-point flows between random NICs of a 2,048-NIC leaf-spine (32 NICs
  per leaf, 32 spines, 2:1 oversubscribed) and 4 levels: snapshot, policy
  decision (every flow moves to another level, so no level's rates can be
  reused), allocation of all levels, write-back into the Flow objects and
  the next completion. Median of several. ``allocate_ms_N`` is the
  allocation alone (``laxflow.sim.network.allocate``).
* ``events_per_s``: event throughput of a whole fluid run with about 100k
  events (Poisson flow arrivals on the same fabric, a 4-level policy, a few
  hundred live flows), counting every event the queue ran.
* ``event_us_small``: CPU microseconds per event of a fluid run with few
  live flows (about 3 on average, 1-10 most of the time, as in a serving
  simulation, where the median decision sees 1-3), under Fair Sharing, so
  the figure is the engine's own fixed cost per event (arrival, completion,
  recompute: snapshot, checks, allocation, write-back) and not a policy's.

Times are CPU time of this (single-threaded) process, so that other load on a
shared machine does not inflate them; ``--wall`` uses wall-clock time instead.

Usage: ``python bench/network.py [--json] [--events N] [--wall]``. Quote
figures with the machine they ran on.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

from laxflow.policy.base import Decision, FlowPolicy, Snapshot
from laxflow.policy.fair_sharing import FairSharing
from laxflow.policy.flow import Flow
from laxflow.sim.events import Priority
from laxflow.sim.network import FluidNetwork, Usage, allocate, leaf_spine

NICS, PER_LEAF, GBPS = 2048, 32, 400e9 / 8
CLOCK = time.process_time
LEVELS = 4


class FourLevels(FlowPolicy):
    """Level = a fixed hash of the flow's index, so every level is populated."""

    name = "bench-4-levels"

    def decide(self, snap: Snapshot) -> Decision:
        return self.decision(np.array([f.state["level"] for f in snap.flows], dtype=np.int64))


def random_usage(topo, n: int, rng: np.random.Generator) -> Usage:
    src = rng.integers(0, NICS, n)
    dst = (src + rng.integers(1, NICS, n)) % NICS
    pair, link = topo.route_many(src, dst)
    ptr = np.concatenate([[0], np.cumsum(np.bincount(pair, minlength=n))])
    return Usage(ptr.astype(np.int64), link, np.ones(link.size))


class RotatingLevels(FlowPolicy):
    """Every call moves every flow to the next of 4 levels: nothing is reusable."""

    name = "bench-rotating"

    def __init__(self) -> None:
        self.calls = 0

    def decide(self, snap: Snapshot) -> Decision:
        self.calls += 1
        base = np.arange(len(snap.flows), dtype=np.int64)
        return self.decision((base + self.calls) % LEVELS)


def recompute_ms(topo, n: int, repeats: int, rng: np.random.Generator) -> float:
    net = FluidNetwork(topo, RotatingLevels())
    src = rng.integers(0, NICS, n)
    dst = (src + rng.integers(1, NICS, n)) % NICS
    pair, link = topo.route_many(src, dst)
    ptr = np.searchsorted(pair, np.arange(n + 1))
    for i in range(n):
        net.add_flow(Flow.on_path(f"f{i}", 1e9, link[ptr[i] : ptr[i + 1]]))
    net.run(until=0.0)
    times = []
    for _ in range(repeats):
        t0 = CLOCK()
        net.reschedule()
        net.run(until=0.0)
        times.append(CLOCK() - t0)
    return 1e3 * statistics.median(times)


def allocate_ms(topo, n: int, repeats: int, rng: np.random.Generator) -> float:
    usage = random_usage(topo, n, rng)
    level = rng.integers(0, LEVELS, n)
    cap = np.full(n, np.inf)
    times = []
    for _ in range(repeats):
        t0 = CLOCK()
        allocate(topo.capacity, usage, level, cap)
        times.append(CLOCK() - t0)
    return 1e3 * statistics.median(times)


def events_per_s(topo, target_events: int, rng: np.random.Generator) -> tuple[float, int]:
    net = FluidNetwork(topo, FourLevels())
    # ~5 events per flow (arrival, completion, recomputes); a mean flow of
    # 8 MB at ~half line rate lasts ~0.3 ms, so 1.5M flows/s keeps a few
    # hundred live.
    num_flows = target_events // 5
    arrivals = np.cumsum(rng.exponential(1 / 1.5e6, num_flows))
    src = rng.integers(0, NICS, num_flows)
    dst = (src + rng.integers(1, NICS, num_flows)) % NICS
    sizes = rng.exponential(8e6, num_flows) + 1e3
    for i in range(num_flows):
        flow = Flow.on_path(f"f{i}", float(sizes[i]), topo.path(int(src[i]), int(dst[i])), arrival=float(arrivals[i]))
        flow.state["level"] = i % LEVELS
        net.queue.push(flow.arrival, Priority.ARRIVAL, net.add_flow, flow)
    t0 = CLOCK()
    events = net.run()
    return events / (CLOCK() - t0), events


def event_us_small(topo, num_flows: int, rng: np.random.Generator) -> tuple[float, float, int]:
    """Per-event CPU cost (us) with a handful of live flows (see the module doc), the mean live count, events."""
    net = FluidNetwork(topo, FairSharing())
    # Mean flow 2 MB at ~line rate lasts ~40 us; 60k flows/s keeps ~3 live.
    arrivals = np.cumsum(rng.exponential(1 / 6e4, num_flows))
    src = rng.integers(0, NICS, num_flows)
    dst = (src + rng.integers(1, NICS, num_flows)) % NICS
    sizes = rng.exponential(2e6, num_flows) + 1e3
    flows = []
    for i in range(num_flows):
        flow = Flow.on_path(f"f{i}", float(sizes[i]), topo.path(int(src[i]), int(dst[i])), arrival=float(arrivals[i]))
        flows.append(flow)
        net.queue.push(flow.arrival, Priority.ARRIVAL, net.add_flow, flow)
    t0 = CLOCK()
    events = net.run()
    cost = (CLOCK() - t0) / events
    span = max(f.finish for f in flows) - flows[0].arrival
    mean_live = sum(f.finish - f.arrival for f in flows) / span
    return 1e6 * cost, mean_live, events


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print only the JSON result")
    parser.add_argument("--events", type=int, default=100_000, help="about how many events the run has")
    parser.add_argument("--wall", action="store_true", help="time with the wall clock, not CPU time")
    args = parser.parse_args()
    if args.wall:
        global CLOCK
        CLOCK = time.perf_counter
    rng = np.random.default_rng(1)
    topo = leaf_spine(NICS, PER_LEAF, GBPS, oversubscription=2.0)
    result = {
        "recompute_ms_5000": round(recompute_ms(topo, 5000, 21, rng), 3),
        "recompute_ms_20000": round(recompute_ms(topo, 20000, 7, rng), 3),
        "allocate_ms_5000": round(allocate_ms(topo, 5000, 21, rng), 3),
        "allocate_ms_20000": round(allocate_ms(topo, 20000, 7, rng), 3),
    }
    rate, events = events_per_s(topo, args.events, rng)
    result["events_per_s"] = round(rate, 1)
    small, live, small_events = event_us_small(topo, args.events // 4, rng)
    result["event_us_small"] = round(small, 2)
    if not args.json:
        print(f"2,048-NIC leaf-spine, {LEVELS} levels; event run: {events} events")
        print(f"small run (fair sharing): {small_events} events, {live:.1f} live flows on average")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
