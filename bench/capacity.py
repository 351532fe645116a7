"""Recompute ``CAPACITY`` (src/laxflow/sim/serving/experiment.py) with the current serving model.

Run: ``.venv/bin/python bench/capacity.py [--json] [--servers 32] [--requests 1000] [--seed 0]``.
For every (model, workload) pair of the table, the same method
(:func:`laxflow.sim.serving.capacity.capacity`, described in its module
docstring and the README's preset paragraph): one JSON line per pair with the
per-GPU rate (2 significant digits in ``rounded``, what the table holds) and
the old table value beside it; without ``--json`` a Python dict literal to paste.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict

from laxflow.sim.serving.capacity import PAIRS, capacity
from laxflow.sim.serving.experiment import CAPACITY


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="one JSON line per pair")
    ap.add_argument("--servers", type=int, default=32)
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    table = {}
    for (model, workload), setup in PAIRS.items():
        old = CAPACITY.get((model, workload))
        setup = {"servers": args.servers, **setup}
        c = capacity(model, workload, requests=args.requests, seed=args.seed, **setup)
        rounded = float(f"{c.per_gpu_rate:.3g}")
        table[(model, workload)] = rounded
        if args.json:
            print(json.dumps({**asdict(c), "rounded": rounded, "table_now": old, **setup}), flush=True)
    if not args.json:
        print("CAPACITY = {")
        for (model, workload), v in table.items():
            print(f"    ({model!r}, {workload!r}): {v},")
        print("}")


if __name__ == "__main__":
    main()
