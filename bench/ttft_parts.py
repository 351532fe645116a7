"""Where a request's TTFT goes, per flow policy: waiting for its prefill, the prefill itself, the P2D tail.

    python bench/ttft_parts.py --point fig12-conv --physics paper --servers 64 --requests 384 --warmup 128 \
        --seeds 3 --policies fs,mfs,karuna-group --jobs 2

TTFT on the prefill units is three parts that add up exactly: ``queue`` (arrival to its batch's start),
``compute`` (the batch's layers, collectives and reuse stalls included) and the ``p2d_tail`` (compute end
to the last P2D byte: the KV that had not landed when the compute ended). A flow policy moves time
between them: giving collectives the fabric shortens compute (and so the queue behind it) and lengthens
the P2D tail. One JSON document: per policy, each part's mean over the measured requests and over those
that missed their SLO, as mean and 95 % half-width over seeds, with the SLO attainment; the point at
``--fraction`` of its capacity under ``--physics`` (as ``bench/sim_claims.py``), its decode units running
decode batches (``--decode steps``, the default; each policy then also reports its mean TPOT,
``tpot_ms``) or held (``--decode hold``). Not a test.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sim_claims import point_specs  # noqa: E402

from laxflow.sim.map.figures import mean_ci  # noqa: E402
from laxflow.sim.serving.experiment import RunSpec, build_workload  # noqa: E402
from laxflow.sim.serving.metrics import met_slo, summarize  # noqa: E402
from laxflow.sim.serving.simulator import ServingSimulator  # noqa: E402

PARTS = ("queue", "compute", "p2d_tail")


def parts(spec: RunSpec) -> dict[str, float]:
    """One run: SLO attainment and each TTFT part's mean (ms), over all measured requests and the missed."""
    res = ServingSimulator(spec.config, build_workload(spec), spec.policy).run()
    m = res.measured
    split = {"queue": [s.batch_start - s.arrival for s in m], "compute": [s.compute_end - s.batch_start for s in m],
             "p2d_tail": [s.finish - s.compute_end for s in m]}
    missed = [not met_slo(s.ttft, s.slo) for s in m]
    out = {"slo_attainment": 1.0 - sum(missed) / len(m)}
    if res.decode is not None:  # decode steps: the run's mean TPOT (the metrics row's rule)
        out["tpot_ms"] = 1e3 * summarize(res, spec.rate)["tpot_mean"]
    for k, v in split.items():
        out[f"{k}_ms"] = 1e3 * sum(v) / len(v)
        late = [x for x, miss in zip(v, missed) if miss]
        out[f"missed_{k}_ms"] = 1e3 * sum(late) / len(late) if late else 0.0
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--point", required=True, help="a preset (bench/sim_claims.py's points)")
    ap.add_argument("--physics", default="faithful")
    ap.add_argument("--fraction", type=float, default=0.8)
    ap.add_argument("--servers", type=int, default=None)
    ap.add_argument("--requests", type=int, default=None)
    ap.add_argument("--warmup", type=int, default=None)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--policies", default="fs,mfs")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--decode", default="steps", choices=("hold", "steps"),
                    help="the decode units' model (ServingConfig.decode): steps, decode batches (default), or hold")
    a = ap.parse_args(argv)
    args = argparse.Namespace(servers=a.servers, warmup=a.warmup, kv_placement=None, requests=a.requests,
                              policies=a.policies, decode=a.decode)
    specs = [s for seed in range(a.seeds) for s in point_specs((a.point, a.physics, a.fraction), args, seed)[1]]
    t0 = time.monotonic()
    with ProcessPoolExecutor(max_workers=max(1, a.jobs)) as pool:
        rows = list(pool.map(parts, specs))
    by_policy: dict[str, list[dict[str, float]]] = {}
    for spec, row in zip(specs, rows):
        by_policy.setdefault(spec.policy, []).append(row)
    out: dict[str, Any] = {"point": a.point, "physics": a.physics, "decode": a.decode, "fraction": a.fraction,
                           "rate": specs[0].rate,
                           "servers": specs[0].config.cluster.servers, "requests": specs[0].requests,
                           "warmup": specs[0].config.warmup, "seeds": a.seeds, "policies": {}}
    for pol, runs in by_policy.items():
        out["policies"][pol] = {}
        for key in runs[0]:
            mean, ci = mean_ci([r[key] for r in runs])
            out["policies"][pol][key] = {"mean": mean, "ci95": ci, "seeds": [r[key] for r in runs]}
    out["wall_s"] = time.monotonic() - t0
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
