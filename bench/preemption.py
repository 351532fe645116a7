"""Preemption blocking time of the CPU engine: operator-level vs layer-level checks (FlowPrefill §6.4).

Not a test; quote with the machine it ran on. One model, one load, two check
placements. Each trial starts a fresh ``PrefillEngine`` running FlowPrefill,
submits a long prefill with a loose SLO, waits a random (seeded) time inside
its run, then submits a short request with a tight SLO, which preempts it.
The blocking time is from that arrival (``add_request``) to the moment the
long prefill suspends (the pool's acknowledgement). The pool places its
checks after every operator (``operator_blocking_ms``) or only after every
layer (``layer_blocking_ms``); trials alternate between the two so load on a
shared machine hits both alike. ``ratio`` = layer / operator (paper: 3.5-4.2x;
target >= 2). Trials in which the long prefill finished before the arrival
(no preemption) are counted in ``missed`` and left out.

``python bench/preemption.py --json [--trials 20] [--tokens 2048] [--threads 1]``
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time

try:
    import torch
except ImportError:  # one clear line instead of a traceback
    sys.exit("bench/preemption.py needs torch: pip install 'laxflow[torch]' (torch==2.13.0 CPU)")

from laxflow.integrations.engine import LlamaModel, ModelConfig, PrefillEngine
from laxflow.integrations.prefill import Boundary, TtftPredictor, create_prefill_scheduler

CONFIG = ModelConfig(vocab=4096, hidden=512, layers=8, heads=4, kv_heads=2, ffn=1792, seed=0)  # Llama-like ffn = 3.5 hidden, head_dim 128


def trial(model: LlamaModel, granularity: Boundary, long_ids, short_ids, delay_s: float,
          predictor: TtftPredictor) -> float | None:
    """Blocking seconds of one preemption, or None when the long prefill ended first."""
    engine = PrefillEngine(model, create_prefill_scheduler("flowprefill", predictor), granularity=granularity)
    with engine:
        engine.add_request(long_ids, slo=1000.0, request_id="long")
        time.sleep(delay_s)
        arrived = time.perf_counter()
        engine.add_request(short_ids, slo=10.0, request_id="short")
        engine.result("short", 600)
        engine.result("long", 600)
    if engine.errors:
        raise RuntimeError(f"engine error: {engine.errors[0]!r}")
    if not engine.pool.yielded_at:
        return None
    return engine.pool.yielded_at[0] - arrived


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--trials", type=int, default=20, help="preemptions per check placement (default 20)")
    ap.add_argument("--tokens", type=int, default=512, help="tokens of the long prefill (default 512)")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if args.trials < 1 or args.tokens < 64 or args.threads < 1:
        ap.error("--trials and --threads must be >= 1, --tokens >= 64")
    torch.set_num_threads(args.threads)
    model = LlamaModel(CONFIG)
    gen = torch.Generator().manual_seed(args.seed)
    long_ids = torch.randint(0, CONFIG.vocab, (args.tokens,), generator=gen).tolist()
    short_ids = torch.randint(0, CONFIG.vocab, (32,), generator=gen).tolist()
    begin = time.perf_counter()
    model.forward([long_ids])
    long_s = time.perf_counter() - begin
    # the slack test only needs a rough scale: the short request's slack stays positive
    predictor = TtftPredictor([(1, 0.001), (args.tokens // 2, long_s / 2), (args.tokens, long_s)])
    rng = random.Random(args.seed)
    blocking: dict[Boundary, list[float]] = {Boundary.OPERATOR: [], Boundary.LAYER: []}
    missed = 0
    for _ in range(args.trials):
        delay = rng.uniform(0.05, 0.8) * long_s
        for g in (Boundary.OPERATOR, Boundary.LAYER):
            b = trial(model, g, long_ids, short_ids, delay, predictor)
            if b is None:
                missed += 1
            else:
                blocking[g].append(b)
    op_ms = 1e3 * statistics.mean(blocking[Boundary.OPERATOR])
    layer_ms = 1e3 * statistics.mean(blocking[Boundary.LAYER])
    result = {
        "operator_blocking_ms": round(op_ms, 3),
        "layer_blocking_ms": round(layer_ms, 3),
        "ratio": round(layer_ms / op_ms, 2),
        "operator_max_ms": round(1e3 * max(blocking[Boundary.OPERATOR]), 3),
        "layer_max_ms": round(1e3 * max(blocking[Boundary.LAYER]), 3),
        "trials": args.trials,
        "missed": missed,
        "long_prefill_ms": round(1e3 * long_s, 1),
        "model": {"hidden": CONFIG.hidden, "layers": CONFIG.layers, "ffn": CONFIG.ffn, "tokens": args.tokens},
        "threads": args.threads,
    }
    if args.json:
        print(json.dumps(result))
    else:
        for k, v in result.items():
            print(f"{k:22} {v}")


if __name__ == "__main__":
    main()
