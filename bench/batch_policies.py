"""Per-decision cost of the iteration schedulers, routers and pool managers (not a test).

These run in the serving engine's step loop (a vLLM scheduler calls
``schedule()`` before every forward) or on every arrival, so their Python
cost adds to each step. Timed on seeded random states:

* ``step_ms_<name>``: one ``schedule()`` over 256 sequences (192 decoding with
  contexts 100-8,000, 64 prefilling 100-8,000-token prompts, TTFT 1-3 s,
  TPOT 0.05-0.15 s, priorities 1 or 2). Median of 21.
* ``pab_ms``: one ``prefill_admission_budget`` over the same 256.
* ``route_ms_<name>``: one ``route()`` over 16 instances holding 0-8 queued
  prefills each. Median of 21.
* ``arrow_prefill_ms``: one ``dispatch_prefill`` over 16 instances. Median of 21.

``python bench/batch_policies.py --json``; quote with the machine it ran on.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

from laxflow.integrations.pools import ClusterSnapshot, Pool, PoolInstance, PoolRequest, create_pool_manager
from laxflow.integrations.prefill import BatchSample, SequenceView, create_batch_scheduler
from laxflow.integrations.prefill.fairbatching import prefill_admission_budget
from laxflow.integrations.prefill.latency import LinearBatchModel
from laxflow.integrations.routing import InstanceView, QueuedPrefill, create_router

NOW = 100.0


def _profile() -> list[BatchSample]:
    rng = np.random.default_rng(1)
    out = []
    for _ in range(64):
        entries = tuple((int(rng.integers(1, 2048)), int(rng.integers(0, 4096)), True) for _ in range(2)) + \
            tuple((1, int(rng.integers(100, 8000)), False) for _ in range(int(rng.integers(0, 64))))
        pre = sum(2e-9 * n * n + 1e-9 * n * k + 1e-4 * n for n, k, p in entries if p)
        dec = sum(2e-7 * k + 5e-5 for _, k, p in entries if not p)
        out.append(BatchSample(entries, 0.008 + pre + dec))
    return out


def _sequences(rng: np.random.Generator) -> list[SequenceView]:
    seqs = []
    for i in range(256):
        prompt = int(rng.integers(100, 8000))
        ttft, tpot = float(rng.uniform(1, 3)), float(rng.uniform(0.05, 0.15))
        weight = float(rng.choice([1.0, 2.0]))
        if i < 192:
            out = int(rng.integers(1, 400))
            arrival = NOW - ttft - out * tpot + float(rng.uniform(-0.5, 0.5))
            seqs.append(SequenceView(f"s{i}", arrival, ttft, tpot, prompt, prompt, out, weight))
        else:
            seqs.append(SequenceView(f"s{i}", NOW - float(rng.uniform(0, 1)), ttft, tpot, prompt,
                                     int(rng.integers(0, prompt)), 0, weight))
    return seqs


def _median_ms(fn, reps: int = 21) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return round(statistics.median(times), 3)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    profile, seqs = _profile(), _sequences(rng)
    result: dict[str, float] = {}
    for name in ("fairbatching", "slidebatching", "sarathi", "edf", "sjf", "priority"):
        sched = create_batch_scheduler(name, profile)
        result[f"step_ms_{name}"] = _median_ms(lambda: sched.schedule(seqs, NOW))
    model = LinearBatchModel.fit(profile)
    result["pab_ms"] = _median_ms(lambda: prefill_admission_budget(seqs, NOW, model, 2.0, 0.1))
    views = [InstanceView(f"i{k}", waiting=int(rng.integers(0, 8)), running=int(rng.integers(0, 64)),
                          pab=float(rng.uniform(-500, 5000)), reported_at=NOW,
                          prefill_queue=tuple(QueuedPrefill(f"q{k}.{j}", int(rng.integers(100, 8000)),
                                                            NOW + float(rng.uniform(0.5, 3)))
                                              for j in range(int(rng.integers(0, 9)))),
                          queue_updated_at=NOW - 0.01, free_kv_blocks=int(rng.integers(0, 4096)))
             for k in range(16)]
    request = SequenceView("new", NOW, 2.0, 0.1, 2000)
    for name in ("pab", "dplb", "gorouting", "minload"):
        router = create_router(name, profile)
        result[f"route_ms_{name}"] = _median_ms(lambda: router.route(request, views, NOW))
    ttft = [(n, 0.01 + 1e-4 * n + 1e-8 * n * n) for n in (128, 512, 1024, 2048, 4096, 8192)]
    arrow = create_pool_manager("arrow", ttft, max_running_tokens=200_000)
    snap = ClusterSnapshot(tuple(
        PoolInstance(f"i{k}", Pool.PREFILL if k < 8 else Pool.DECODE,
                     queued_prefill_tokens=tuple(int(n) for n in rng.integers(100, 8000, size=int(rng.integers(0, 9)))) if k < 8 else (),
                     running_tokens=0 if k < 8 else int(rng.integers(0, 200_000)),
                     decoding=0 if k < 8 else int(rng.integers(1, 64)), avg_token_interval=0.05)
        for k in range(16)))
    result["arrow_prefill_ms"] = _median_ms(lambda: arrow.dispatch_prefill(PoolRequest("r", NOW, 2000, 2.0, 0.1), snap, NOW))
    if args.json:
        print(json.dumps(result))
    else:
        for k, v in result.items():
            print(f"{k:26s} {v:8.3f} ms")


if __name__ == "__main__":
    main()
