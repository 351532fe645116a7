"""Issue 34's side by side: the four benches recorded before the one-engine merge, rerun on this tree.

    python bench/merge_compare.py [--only sim_claims,arrow_repro] [--out out/results/merge_compare]

``bench/results/premerge/<bench>.json`` holds each bench's commands and results
on main before the merge (3 seeds, every preset; its README says how they were
made). This script reruns every recorded command on this tree -- the same
script and arguments, ``--out`` pointed into ``--out`` -- and prints one JSON
document: per bench, the commit and machine of both sides, and one row per
measured value (a preset and policy, a system at a rate, a scheduler): its
per-seed values before and after, their means, and the paired difference
(after minus before on the same seed's requests) with its 95 % interval.
``changed`` is true where any seed moved; ``beyond`` where the interval
excludes 0 (the changes the results page must explain). Progress goes to
stderr; a failed command stops the script with its stderr. Not a test: the
numbers are the simulator's, the wall time the machine's.
"""

from __future__ import annotations

import argparse
import json
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

from laxflow.sim.map.figures import paired_diff

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PREMERGE = HERE / "results" / "premerge"
BENCHES = ("sim_claims", "batching_repro", "arrow_repro", "flowprefill")


def _command(recorded: str, out: Path, k: int) -> list[str]:
    """The recorded command's script and arguments, ``--out`` moved under ``out``."""
    words = shlex.split(recorded.split("&&")[-1])
    script = next(i for i, w in enumerate(words) if w.startswith("bench/") and w.endswith(".py"))
    args = words[script:]
    if "--out" in args:
        args[args.index("--out") + 1] = str(out / f"run{k}")
    return [sys.executable, *args]


def _parse(text: str) -> Any:
    sys.path.insert(0, str(HERE))
    from results import parse_output

    return parse_output(text)


def rows(bench: str, result: Any) -> Iterator[tuple[str, str, list[float]]]:
    """(point, metric, per-seed values) of one command's result, by the bench's own JSON shape."""
    if bench == "sim_claims":
        for line in result if isinstance(result, list) else [result]:
            for pol, v in line["policies"].items():
                yield f"{line['preset']} {pol}", "slo_attainment", v["slo_attainment_seeds"]
    elif bench == "batching_repro":
        for exp, doc in result.items():
            if isinstance(doc, dict) and "points" in doc:
                for system, by_rate in doc["points"].items():
                    for rate, v in by_rate.items():
                        yield f"{exp} {system} @{rate}", "slo_attainment", v["slo_attainment_seeds"]
    elif bench == "arrow_repro":
        for system, v in result["sustainable_rate"].items():
            yield f"{result['workload']} {system}", "sustainable_rate", v["per_seed"]
        for system, by_size in result.get("scaling_mean_rate", {}).items():  # the mean over seeds only
            for size, rate in by_size.items():
                yield f"scaling {system} x{size}", "sustainable_rate (mean)", [rate]
    elif bench == "flowprefill":
        for sched, values in result["values"].items():
            yield f"{result['model']} {sched}", result["metric"], values
    else:
        raise ValueError(f"unknown bench {bench!r}")


def compare(bench: str, before: list[Any], after: list[Any]) -> list[dict[str, Any]]:
    """One row per (point, metric) of the bench, both sides matched by name."""
    old = {(p, m): v for res in before for p, m, v in rows(bench, res)}
    out = []
    for res in after:
        for point, metric, new in rows(bench, res):
            prev = old.get((point, metric))
            if prev is None or len(prev) != len(new):
                continue
            diff, ci, beyond = paired_diff(new, prev)
            out.append({"point": point, "metric": metric, "before": prev, "after": new,
                        "before_mean": sum(prev) / len(prev), "after_mean": sum(new) / len(new),
                        "diff": diff, "diff_ci95": ci, "changed": list(prev) != list(new), "beyond": beyond})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default="", help=f"comma-separated benches (default: {','.join(BENCHES)})")
    ap.add_argument("--out", default="out/results/merge_compare", help="folder for the benches' run files")
    a = ap.parse_args(argv)
    names = [n for n in a.only.split(",") if n] or list(BENCHES)
    unknown = [n for n in names if n not in BENCHES]
    if unknown:
        ap.error(f"--only: unknown bench {unknown[0]!r} (expected some of {', '.join(BENCHES)})")
    out = Path(a.out)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    doc: dict[str, Any] = {"commit": commit, "python": platform.python_version(), "benches": {}}
    for name in names:
        recorded = json.loads((PREMERGE / f"{name}.json").read_text())
        after = []
        t0 = time.monotonic()
        for k, run in enumerate(recorded["runs"]):
            cmd = _command(run["command"], out / name, k)
            print(f"# {name} [{k + 1}/{len(recorded['runs'])}]: {' '.join(cmd[1:])}", file=sys.stderr, flush=True)
            done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
            if done.returncode != 0:
                sys.stderr.write(done.stderr)
                raise SystemExit(f"merge_compare: {name}: {' '.join(cmd[1:])} exited with {done.returncode}")
            after.append(_parse(done.stdout))
        table = compare(name, [r["result"] for r in recorded["runs"]], after)
        doc["benches"][name] = {"before_commit": recorded["commit"], "rows": table, "wall_s": time.monotonic() - t0,
                                "changed": sum(r["changed"] for r in table),
                                "beyond": sum(r["beyond"] for r in table)}
        print(f"# {name}: {len(table)} values, {doc['benches'][name]['changed']} changed, "
              f"{doc['benches'][name]['beyond']} beyond their interval", file=sys.stderr, flush=True)
    print(json.dumps(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
