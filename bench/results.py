"""``make results``: run the ``bench/`` scripts afresh, keep their JSON, write the results pages.

    python bench/results.py                      # run every bench, then render every page
    python bench/results.py --only sim_claims,preemption
    python bench/results.py --render-only        # re-render from bench/results/*.json, run nothing
    python bench/results.py --list               # the benches and their commands

Each bench is one command of :data:`results_benches.BENCHES` (its script with ``--json`` or
the arguments its docstring documents, at the scale named there). Its stdout
is parsed as JSON and kept as ``bench/results/<name>.json`` together with the
UTC date, the git commit, the machine (``bench/_machine.py``), the command
and the wall time: the raw data behind the pages, committed. A bench that
fails keeps a record with its error and no result; one never run has no file.
Either renders as "not run in this regeneration" with the command to run it,
never as a number.

The pages (``docs/results/*.md``, ``bench/README.md``) are rendered by
:mod:`results_render` from those files alone; the papers' numbers and the
reasons for each gap are text kept there. Runs go one at a time, at the
caller's priority (``make results`` does not renice), with a progress line
per bench on stderr.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results"
WORK = ROOT / "out" / "results"  # scratch (sim_claims' resumable run log); not committed

from results_benches import BENCHES, Bench  # noqa: E402  (bench/ is on the path when run as a script)


def machine() -> dict:
    """The machine a run happened on, as its JSON names it."""
    sys.path.insert(0, str(HERE))
    from _machine import cpu_model

    return {"cpu": cpu_model(), "cores": os.cpu_count(), "python": platform.python_version(),
            "kernel": platform.release()}


def git_commit() -> str:
    """HEAD's hash, with ``+dirty`` when tracked code differs from it (others' edits in a shared tree); what
    this command writes (the records, the README's table) does not count, so one regeneration's later
    benches keep the hash its first one had."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", "src", "native", "bench",
                                ":(exclude)bench/results", ":(exclude)bench/README.md"],
                               cwd=ROOT).returncode != 0
        return head + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def parse_output(text: str):
    """A script's stdout as JSON: one document, or its JSON lines (a list when there are several)."""
    text = text.strip()
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        pass
    docs = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                docs.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    if not docs:
        raise ValueError("no JSON object in its output")
    return docs[0] if len(docs) == 1 else docs


def shape(name: str, result):
    """Per-bench reshaping of the parsed output into one object (JSON lines keyed by what they describe)."""
    if name in ("sim_claims", "sim_claims_paper", "sim_claims_hold", "sim_claims_paper_hold"):
        lines = result if isinstance(result, list) else [result]
        return {"points": {ln["preset"]: ln for ln in lines}}
    if isinstance(result, list):
        return {"lines": result}
    return result


def run_bench(bench: Bench, python: str, timeout: float | None, resume: bool = False) -> dict:
    """Run one bench and return its record (result or error); ``resume`` keeps its scratch runs."""
    record = {"bench": bench.name, "about": bench.about, "command": "python " + " ".join(bench.args),
              "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "commit": git_commit(),
              "machine": machine(), "load_avg_start": round(os.getloadavg()[0], 2)}
    if bench.needs_root and os.geteuid() != 0:
        record["error"] = "needs root (network namespaces and qdiscs): run make results as root"
        return record
    for path in bench.fresh:
        if resume:
            if (ROOT / path).exists():  # (nothing kept: a start from nothing, timed whole)
                since = dt.datetime.fromtimestamp((ROOT / path).stat().st_ctime, dt.timezone.utc).strftime("%H:%M UTC")
                record["resumed"] = (f"runs kept in {path} from an earlier start of this bench (folder made {since}); "
                                     "elapsed_s is this start's time only")
        else:
            shutil.rmtree(ROOT / path, ignore_errors=True)
    t0 = time.monotonic()
    try:
        proc = subprocess.run([python, *bench.args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        record["elapsed_s"] = round(time.monotonic() - t0, 1)
        record["error"] = f"timed out after {timeout:.0f} s"
        return record
    record["elapsed_s"] = round(time.monotonic() - t0, 1)
    record["load_avg_end"] = round(os.getloadavg()[0], 2)
    if proc.returncode != 0:
        tail = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()][-1:] or ["(no stderr)"]
        record["error"] = f"exit status {proc.returncode}: {tail[0][:300]}"
        return record
    try:
        record["result"] = shape(bench.name, parse_output(proc.stdout))
    except (ValueError, KeyError, TypeError) as exc:
        record["error"] = f"unreadable output: {exc}"
    return record


def save(record: dict) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{record['bench']}.json"
    path.write_text(json.dumps(record, indent=1, sort_keys=False) + "\n")
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", help="comma-separated bench names to run (default: all)")
    ap.add_argument("--render-only", action="store_true", help="render the pages from bench/results/*.json, run nothing")
    ap.add_argument("--resume", action="store_true",
                    help="keep sim_claims' finished runs (out/results/sim_claims) instead of starting it afresh")
    ap.add_argument("--timeout", type=float, default=None, help="seconds one bench may run (default: no limit)")
    ap.add_argument("--list", action="store_true", help="print the benches and their commands, then exit")
    a = ap.parse_args(argv)
    if a.list:
        for b in BENCHES.values():
            print(f"{b.name:22s} python {' '.join(b.args)}")
        return 0
    names = [n.strip() for n in a.only.split(",") if n.strip()] or list(BENCHES)
    unknown = [n for n in names if n not in BENCHES]
    if unknown:
        ap.error(f"--only: unknown bench {unknown[0]!r} (expected one of {', '.join(BENCHES)})")
    sys.path.insert(0, str(HERE))
    import results_render  # now: a long run renders with the code it started with

    if not a.render_only:
        for i, name in enumerate(names, 1):
            bench = BENCHES[name]
            print(f"[{i}/{len(names)}] {name}: python {' '.join(bench.args)}", file=sys.stderr, flush=True)
            t0 = time.monotonic()
            record = run_bench(bench, sys.executable, a.timeout, a.resume)
            path = save(record)
            state = f"error: {record['error']}" if "error" in record else f"ok -> {path.relative_to(ROOT)}"
            print(f"[{i}/{len(names)}] {name}: {time.monotonic() - t0:.0f} s, {state}", file=sys.stderr, flush=True)
    for path in results_render.render_all(RESULTS, ROOT):
        print(f"wrote {path.relative_to(ROOT)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
