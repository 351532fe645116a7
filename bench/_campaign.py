"""A resumable campaign of simulator runs, for the bench scripts that run many seeds of many points.

Used by ``bench/sim_claims.py``, ``bench/codesign.py`` and ``bench/instance_policies.py``. Each finished
run's record is appended to a JSON-lines log at once; a rerun reads the log and skips every run already
there, so a campaign stopped at any point resumes where it was. Runs go seed by seed (every point's
seed 0, then seed 1, ...), so an early stop leaves whole seeds. ``positive_floats`` reads their grid flags.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any, Callable, Hashable, Iterable, Sequence

from laxflow.sim.serving.experiment import RunSpec, run_all

Key = Hashable  # one run's key: it names the point, the seed and the policy (or combination)


def run_campaign(log: Path, seeds: Iterable[int], todo_for: Callable[[int], Sequence[tuple[Key, RunSpec]]],
                 record: Callable[[Key, RunSpec, dict[str, Any]], dict[str, Any]],
                 key_of: Callable[[dict[str, Any]], Key], jobs: int,
                 cost: Callable[[RunSpec], float] | None = None) -> dict[Key, dict[str, Any]]:
    """Run what ``log`` lacks; returns every run's record by key (the log's and the new ones).

    ``todo_for(seed)``: that seed's runs, (key, spec). ``record(key, spec, row)``: what the log keeps of a
    finished run's metrics row (``key_of`` must give ``key`` back from it). ``cost``: a run's relative time;
    the slowest start first, so no worker idles at the end of a seed.
    """
    done: dict[Key, dict[str, Any]] = {}
    if log.exists():
        for text in log.read_text().splitlines():
            r = json.loads(text)
            done[key_of(r)] = r
    t0 = time.perf_counter()
    for seed in seeds:
        todo = [(k, s) for k, s in todo_for(seed) if k not in done]
        if not todo:
            continue
        if cost is not None:
            todo.sort(key=lambda ks: cost(ks[1]), reverse=True)
        owner = {id(s): k for k, s in todo}

        def save(spec: RunSpec, row: dict[str, Any], owner=owner) -> None:
            key = owner[id(spec)]
            done[key] = kept = record(key, spec, row)
            with log.open("a") as f:
                f.write(json.dumps(kept) + "\n")

        run_all([s for _, s in todo], jobs=jobs, on_done=save)
        print(f"# seed {seed} done, {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    return done


def positive_floats(text: str, flag: str) -> list[float]:
    """A comma-separated list of positive numbers from flag ``flag``, or exit with one line naming it."""
    prog = Path(sys.argv[0]).stem
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SystemExit(f"{prog}: {flag}: expected comma-separated numbers, got {text!r}") from None
    if not values or any(not v > 0 for v in values):
        raise SystemExit(f"{prog}: {flag}: expected positive numbers, got {text!r}")
    return values
