"""Fidelity: the contention scenario predicted by the simulator vs measured on the testbed.

    python bench/testbed_fidelity.py [--requests N] [--json] [--sim-only]

Runs :func:`laxflow.testbed.sim_model.predict_modes` (fluid network, the
``fs`` and ``mfs`` policy objects) and, as root, ``laxflow testbed run``'s
:func:`laxflow.testbed.scenario.run_contention` (modes off and on) with the
same :class:`ScenarioConfig`; prints predicted and measured CCT and TTFT side
by side with the relative error (measured / predicted - 1). Without root (or
with ``--sim-only``) only the prediction is printed. Timing is the machine's:
quote the load with the numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from laxflow.testbed.scenario import ScenarioConfig
from laxflow.testbed.sim_model import predict_modes


def compare(cfg: ScenarioConfig, sim_only: bool) -> dict:
    out: dict = {"config": {k: v for k, v in cfg.__dict__.items()}}
    if sim_only or os.geteuid() != 0:
        out["predicted"] = predict_modes(cfg)
        out["measured"] = None
        out["why_not_measured"] = "--sim-only" if sim_only else "the testbed needs root"
        return out
    from laxflow.testbed.scenario import run_contention

    measured = run_contention(cfg)
    # Both sides judge the same deadline: the testbed's measured low-load TTFT x factor.
    out["predicted"] = predicted = predict_modes(cfg, slo=measured["slo_s"])
    out["slo_s"], out["low_load_ttft_s"] = measured["slo_s"], measured["low_load_ttft_s"]
    out["measured"] = {m: measured[m] for m in ("off", "on")}
    out["measured"].update(cct_ratio=measured["cct_ratio"], ttft_ratio=measured["ttft_ratio"])
    out["rel_error"] = {
        mode: {k: measured[mode][k] / predicted[mode][k] - 1 for k in ("cct_mean", "ttft_mean")}
        for mode in ("off", "on")
    }
    out["within_20pct"] = {mode: all(abs(e) <= 0.2 for e in errs.values()) for mode, errs in out["rel_error"].items()}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=10)
    ap.add_argument("--name", default=f"fid{os.getpid() % 100000}")
    ap.add_argument("--slo-factor", type=float, default=3.0)
    ap.add_argument("--collective", default="auto", help="stage 2: gloo, tcp or auto (as testbed run)")
    ap.add_argument("--sim-only", action="store_true")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    cfg = ScenarioConfig(name=args.name, requests=args.requests, slo_factor=args.slo_factor, modes=("off", "on"),
                         collective=args.collective)
    out = compare(cfg, args.sim_only)
    if args.json:
        json.dump(out, sys.stdout)
        print()
        return
    print(f"{'':>4} {'metric':>9} {'predicted':>10} {'measured':>10} {'error':>7}")
    for mode in ("off", "on"):
        for k in ("cct_mean", "ttft_mean"):
            p = out["predicted"][mode][k] * 1000
            m = out["measured"][mode][k] * 1000 if out["measured"] else float("nan")
            print(f"{mode:>4} {k:>9} {p:9.1f}ms {m:9.1f}ms {(m / p - 1) * 100:+6.0f}%")
    if out["measured"] is None:
        print(f"(measured: not run, {out['why_not_measured']})")


if __name__ == "__main__":
    main()
