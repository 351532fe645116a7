"""The testbed's CCT and TTFT ratios over repeated runs, with their spread.

    python bench/testbed_ratio.py --runs 8 [--collective gloo] [--transport mooncake] [--json]

One ``laxflow testbed run --json`` is one sample: off, static and on back to
back on a fresh fabric. Its ``cct_ratio`` moves by +-0.2 from run to run on a
2-core box (mostly off's CCT, which depends on how far off's queues grow), so
a single run cannot say whether the target (``cct_ratio`` >= 1.3) holds. This
runs ``--runs`` of them one after another (root; each about 50 s) and prints
per figure the mean, the 95 % t-interval's half width, the range and every
run's value, plus how many runs reach 1.3. Nothing runs concurrently with
the samples; quote the JSON with the machine it names.

Figures: ``cct_ratio``, ``ttft_ratio``; per mode the mean and median CCT,
the mean TTFT and the SLO attainment; ``on``'s ``a2a_gate_ms`` (Gloo: the
adapter's time per collective inside the CCT). A run that fails is counted
in ``failed_runs`` with its last error line and left out of the figures.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from scipy import stats

TARGET = 1.3
MODES = ("off", "static", "on")


def summarize(values: list[float]) -> dict[str, Any]:
    """Mean, 95 % t-interval half width (None below two values), min, max and the values."""
    out: dict[str, Any] = {"n": len(values), "per_run": [round(v, 4) for v in values]}
    if not values:
        return out
    out["mean"] = round(statistics.fmean(values), 4)
    out["min"], out["max"] = round(min(values), 4), round(max(values), 4)
    out["ci95"] = (round(float(stats.t.ppf(0.975, len(values) - 1)) * statistics.stdev(values) / math.sqrt(len(values)), 4)
                   if len(values) > 1 else None)
    return out


def aggregate(results: list[dict[str, Any]]) -> dict[str, Any]:
    """The figures over the runs' ``testbed run --json`` objects (pure: tested without a testbed)."""
    out: dict[str, Any] = {"runs": len(results)}
    for key in ("cct_ratio", "ttft_ratio"):
        out[key] = summarize([r[key] for r in results])
    out["cct_ratio"]["runs_at_target"] = sum(r["cct_ratio"] >= TARGET for r in results)
    out["cct_ratio"]["target"] = TARGET
    for mode in MODES:
        have = [r[mode] for r in results if mode in r]
        if not have:
            continue
        out[mode] = {
            "cct_mean_ms": summarize([1000 * m["cct_mean"] for m in have]),
            "cct_median_ms": summarize([1000 * m["cct_median"] for m in have if "cct_median" in m]),
            "ttft_mean_ms": summarize([1000 * m["ttft_mean"] for m in have]),
            "slo_attainment": summarize([m["slo_attainment"] for m in have]),
        }
    gate = [r["on"]["a2a_gate_ms"] for r in results if "a2a_gate_ms" in r.get("on", {})]
    if gate:
        out["on"]["a2a_gate_ms"] = summarize(gate)
    return out


def machine() -> str:
    from _machine import cpu_model  # (bench/ is on the path when this runs as a script)

    return f"{cpu_model()}, {os.cpu_count()} cores, Python {platform.python_version()}, kernel {platform.release()}"


def as_run(results: list[dict[str, Any]], key: str, given: Any) -> Any:
    """``key`` of the runs' scenario config, as ``testbed run`` resolved it (its defaults where this bench
    passed nothing; the same in every run of one invocation), or ``given`` when no run came back."""
    values = {r.get("config", {}).get(key, given) for r in results} or {given}
    return values.pop() if len(values) == 1 else sorted(values, key=str)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=8, help="testbed runs (default 8)")
    ap.add_argument("--collective", choices=("auto", "gloo", "tcp"), default="auto")
    ap.add_argument("--transport", choices=("auto", "tcp", "mooncake"), default="auto",
                    help="stages 1 and 3 (testbed run's --transport; auto: mooncake if installed)")
    ap.add_argument("--name", default="lxfratio", help="testbed name (namespaces <name>-h*, <name>-sw)")
    ap.add_argument("--spare-share", type=float, default=None,
                    help="the daemons' spare-capacity grant (testbed run's --spare-share; 0 = strict priority only)")
    ap.add_argument("--json", action="store_true", help="print only the JSON result")
    args = ap.parse_args()
    if args.runs < 1:
        ap.error(f"--runs: expected >= 1, got {args.runs}")
    if os.geteuid() != 0:
        sys.exit("testbed_ratio: needs root (laxflow testbed run creates network namespaces); run it as root")
    laxflow = str(Path(sys.executable).with_name("laxflow"))
    cmd = [laxflow, "testbed", "run", "--json", "--name", args.name, "--collective", args.collective,
           "--transport", args.transport]
    if args.spare_share is not None:
        cmd += ["--spare-share", str(args.spare_share)]
    results: list[dict[str, Any]] = []
    failed: list[str] = []
    load = [os.getloadavg()[0]]
    for i in range(args.runs):
        proc = subprocess.run(cmd, capture_output=True, text=True)
        load.append(os.getloadavg()[0])
        if proc.returncode != 0:
            lines = (proc.stderr.strip() or proc.stdout.strip() or f"exit {proc.returncode}").splitlines()
            failed.append(lines[-1])
        else:
            results.append(json.loads(proc.stdout))
        if not args.json:
            last = f"cct_ratio {results[-1]['cct_ratio']:.3f}" if proc.returncode == 0 else f"failed: {failed[-1]}"
            print(f"run {i + 1}/{args.runs}: {last}", file=sys.stderr, flush=True)
    out = aggregate(results) if results else {"runs": 0}
    out.update(failed_runs=failed, collective=args.collective, transport=as_run(results, "transport", args.transport),
               spare_share=as_run(results, "spare_share", args.spare_share), machine=machine(),
               load_average=[round(min(load), 2), round(max(load), 2)])
    print(json.dumps(out) if args.json else json.dumps(out, indent=1))
    if not results:
        sys.exit(1)


if __name__ == "__main__":
    main()
