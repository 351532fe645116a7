"""Speed of the MFS policy core (not a test; quote with the machine it ran on).

* ``mfs_decision_ms_10000``: one ``MfsPolicy.decide`` over 10,000 live flows
  (2,500 requests in 500 batches, all four flows of every request on random
  2-4 link paths of a 2,048-link network) at a layer boundary of every
  request, so every flow is re-evaluated for promotion. Median of 7, after
  the admission decision (reported separately in the text output).
* ``inter_ms_1000x2048``: Algorithm 1 (RED sort, feasibility, pruning with a
  budget of 16) over 1,000 batches of 1-8 requests, each loading 2-8 of 2,048
  ports (deadlines 0.1-2 s, so some batches fail the check and the budget
  is used up), on the array form the coordinator keeps (``LoadTable``). Median of
  7. Converting the same input from the JSON-shaped objects of
  ``laxflow policy inter`` is timed separately (text output).

* ``mfs_decision_us_small``: the median ``MfsPolicy.decide`` over the
  decisions with 1-10 live flows of a recorded serving run (the policy's
  calls in ``tests/policy/data/mfs_trace_default.json.gz``: Mixtral-8x7B on
  8 servers, 32 QwenA-conversation requests; replayed call by call, so the
  policy sees exactly what it saw in the run). Real runs have 1-3 live flows
  at the median, so this is the cost that sets a simulation's speed.
  Target <= 100 us.

Targets: <= 20 ms (the first two). ``python bench/policy.py --json``.
``python bench/policy.py --record DIR`` re-records the traces of ``TRACES``
(the regression test of ``tests/policy`` replays them: re-record only when a
decision is meant to change).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np

from laxflow.policy import Flow, Snapshot, Stage
from laxflow.policy.inter_request import InterBatch, InterProblem, InterRequest, LoadTable, schedule_table
from laxflow.policy.mfs import MfsPolicy
from laxflow.sim.network.trace import Replay, load

LINKS = 2048
TRACE_DIR = Path(__file__).resolve().parents[1] / "tests" / "policy" / "data"
# name -> (model, servers, measured requests, rate per prefill GPU, seed, MfsPolicy options)
TRACES = {
    "mfs_trace_default": ("mixtral-8x7b", 8, 32, 0.9, 0, {}),
    "mfs_trace_pruning": ("mixtral-8x22b", 8, 12, 0.9, 0, {"drop_budget": 2}),
}


def _flows(rng: np.random.Generator) -> list[Flow]:
    flows = []
    stages = [Stage.REUSE, Stage.COLLECTIVE, Stage.P2D, Stage.P2D]
    for r in range(2500):
        deadline = float(rng.uniform(0.5, 5.0))
        for k, stage in enumerate(stages):
            path = rng.choice(LINKS, size=int(rng.integers(2, 5)), replace=False)
            flows.append(Flow.on_path(
                f"r{r}f{k}", float(rng.uniform(1e6, 1e8)), path, stage=stage, request=f"r{r}", batch=f"b{r // 5}",
                deadline=deadline, layer=int(rng.integers(0, 60)), current_layer=0,
            ))  # fmt: skip
    return flows


def bench_decision(repeats: int = 7) -> tuple[float, float]:
    rng = np.random.default_rng(1)
    flows = _flows(rng)
    capacity = np.full(LINKS, 25e9)
    policy = MfsPolicy()
    remaining = np.array([f.size for f in flows])

    def snap(now: float) -> Snapshot:
        return Snapshot(now=now, flows=flows, remaining=remaining, capacity=capacity, link_load=rng.uniform(0, 0.9, LINKS), load_window=0.01)

    t0 = time.perf_counter()
    policy.decide(snap(0.0))
    admission = time.perf_counter() - t0
    times = []
    for step in range(1, repeats + 1):
        for f in flows:
            f.current_layer = step
        remaining *= 0.95
        s = snap(step * 1e-3)
        t0 = time.perf_counter()
        policy.decide(s)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3, admission * 1e3


def bench_inter(repeats: int = 7) -> tuple[float, float, int]:
    rng = np.random.default_rng(2)
    ports = {f"port{i:04d}": 25e9 for i in range(LINKS)}
    names = list(ports)
    batches = []
    rid = 0
    for b in range(1000):
        reqs = []
        for _ in range(int(rng.integers(1, 9))):
            chosen = rng.choice(LINKS, size=int(rng.integers(2, 9)), replace=False)
            load = {names[i]: float(rng.uniform(1e6, 1e9)) for i in chosen}
            reqs.append(InterRequest(f"r{rid}", float(rng.uniform(0.1, 2.0)), load))
            rid += 1
        batches.append(InterBatch(f"b{b}", float(rng.uniform(0.01, 0.2)), tuple(reqs)))
    problem = InterProblem(ports=ports, batches=tuple(batches), now=0.0, drop_budget=16)
    times, convert = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        table = LoadTable.from_problem(problem)
        t1 = time.perf_counter()
        result = schedule_table(table)
        times.append(time.perf_counter() - t1)
        convert.append(t1 - t0)
    return statistics.median(times) * 1e3, statistics.median(convert) * 1e3, len(result.pruned)


def record_traces(out: Path) -> None:
    """Run each serving setup of ``TRACES`` under a recorded ``mfs`` policy and save its calls."""
    from laxflow.sim.network.trace import PolicyRecorder
    from laxflow.sim.serving.config import ClusterConfig, ServingConfig
    from laxflow.sim.serving.experiment import RunSpec, build_workload
    from laxflow.sim.serving.simulator import ServingSimulator

    out.mkdir(parents=True, exist_ok=True)
    for name, (model, servers, requests, rate, seed, options) in TRACES.items():
        cfg = ServingConfig(model=model, cluster=ClusterConfig(servers=servers), warmup=0)
        reqs = build_workload(RunSpec(cfg, "qwen-conv", rate, "mfs", requests, seed=seed))
        recorder = PolicyRecorder(MfsPolicy(**options))
        ServingSimulator(cfg, reqs, recorder).run()
        meta = {"model": model, "servers": servers, "requests": requests, "rate": rate, "seed": seed,
                "workload": "qwen-conv", "mfs": options}  # fmt: skip
        recorder.save(out / f"{name}.json.gz", **meta)
        print(f"{name}: {sum(c[0] == 'decide' for c in recorder.calls)} decisions, {len(recorder.flows)} flows")


def bench_small_decisions(max_flows: int = 10) -> tuple[float, int]:
    """Median decide() over recorded decisions with 1..max_flows live flows (us), and their count."""
    data = load(TRACE_DIR / "mfs_trace_default.json.gz")
    policy = MfsPolicy(**data["meta"]["mfs"])
    times = []
    for kind, a, b in Replay(data):
        if kind == "complete":
            policy.on_complete(a, b)
            continue
        t0 = time.perf_counter()
        policy.decide(a)
        dt = time.perf_counter() - t0
        if 1 <= len(a.flows) <= max_flows:
            times.append(dt)
    return statistics.median(times) * 1e6, len(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    parser.add_argument("--record", type=Path, metavar="DIR", help="re-record the serving traces into DIR and exit")
    args = parser.parse_args()
    if args.record:
        record_traces(args.record)
        return
    small, count = bench_small_decisions()
    decision, admission = bench_decision()
    inter, convert, pruned = bench_inter()
    if args.json:
        print(json.dumps({
            "mfs_decision_ms_10000": round(decision, 3), "inter_ms_1000x2048": round(inter, 3),
            "mfs_decision_us_small": round(small, 1),
        }))  # fmt: skip
    else:
        print(f"mfs decision, 1-10 live flows (median of {count} from a serving run): {small:.1f} us (target <= 100)")
        print(f"mfs decision, 10,000 live flows (all at a layer boundary): {decision:.2f} ms (target <= 20)")
        print(f"mfs admission decision, 10,000 new flows:                 {admission:.2f} ms")
        print(f"Algorithm 1, 1,000 batches on 2,048 ports:                 {inter:.2f} ms (target <= 20; pruned {pruned})")
        print(f"  building its arrays from InterProblem objects:           {convert:.2f} ms")


if __name__ == "__main__":
    main()
