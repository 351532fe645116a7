"""FlowPrefill's two end-to-end metrics (its §6.1, Figure 9): goodput and the tightest SLO scale met.

Called by ``bench/flowprefill.py`` (and tests) on the main thread; every
probe is one serving simulation (:func:`laxflow.sim.serving.experiment.run_one`)
of a ``flowprefill-<model>`` preset with one ``--prefill`` scheduler.

* Goodput: "the maximum sustainable request rate at 90 % SLO attainment".
  Swept grids only bound it to a grid step, so :func:`boundary` searches the
  rate: it steps geometrically from ``start`` until attainment falls below
  90 % and then bisects between the last rate that held and the first that
  did not, to a relative width ``tol`` (from a start that already fails it
  steps down instead). The result is the crossing nearest the start -- on a
  curve that falls once, the rate the paper's vertical line marks; on one
  that dips and recovers (seed noise near 90 %) the first dip seen.
* Tightest SLO scale: at a fixed rate, every SLO of Table 2 is multiplied by
  the scale; attainment grows with it, so the same search from above finds
  the smallest scale with >= 90 %.

Rates here are instance rates (requests/s into the one prefill instance of
the 1P1D preset), the unit of FlowPrefill's plots; ``RunSpec`` takes them
per prefill GPU, so they are divided by the instance's GPUs.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable

THRESHOLD = 0.9  # FlowPrefill's SLO attainment goal


@dataclass(frozen=True)
class Search:
    """The outcome of one boundary search: the value found and every probe (value, attainment)."""

    value: float | None  # None: even the most lenient probe did not reach the threshold
    probes: tuple[tuple[float, float], ...]


def boundary(attainment: Callable[[float], float], start: float, up: bool, step: float = 1.25,
             tol: float = 0.02, limit: int = 40) -> Search:
    """Search the value where ``attainment`` crosses ``THRESHOLD``.

    ``up=True`` (rates): attainment falls as the value grows; returns the
    largest value that holds. ``up=False`` (SLO scales): attainment grows with
    the value; returns the smallest value that holds. ``step`` > 1 is the
    geometric stride of the scan, ``tol`` the bisection's relative width,
    ``limit`` the most probes (then the best value that held so far).
    """
    if not (step > 1 and tol > 0 and start > 0):
        raise ValueError(f"boundary: need step > 1, tol > 0, start > 0 (got {step}, {tol}, {start})")
    probes: list[tuple[float, float]] = []

    def holds(x: float) -> bool:
        a = float(attainment(x))
        probes.append((x, a))
        return a >= THRESHOLD

    # ``good`` holds, ``bad`` does not; "more" is the direction in which attainment falls.
    more = (lambda x: x * step) if up else (lambda x: x / step)
    less = (lambda x: x / step) if up else (lambda x: x * step)
    good = bad = None
    x = start
    if holds(x):
        good, step_out = x, more  # holds: step outwards until it fails
    else:
        bad, step_out = x, less  # fails: step back until it holds
    while (good is None or bad is None) and len(probes) < limit:
        x = step_out(x)
        if holds(x):
            good = x
        else:
            bad = x
    if good is None or bad is None:
        return Search(good, tuple(probes))
    while abs(bad - good) > tol * min(good, bad) and len(probes) < limit:
        mid = (good * bad) ** 0.5
        if holds(mid):
            good = mid
        else:
            bad = mid
    return Search(good, tuple(probes))


def probe(model: str, scheduler: str, rate: float, slo_scale: float, seed: int, requests: int, warmup: int,
          policy: str = "fs", **config: Any) -> dict[str, Any]:
    """One simulation of preset ``flowprefill-<model>`` at instance ``rate``; the run's summary row.

    ``config``: extra ``ServingConfig`` fields (e.g. ``token_budget``).
    """
    from laxflow.sim.serving.experiment import RunSpec, get_preset, prefill_gpus, run_one

    preset = get_preset(f"flowprefill-{model}")
    cfg = replace(preset.config(), slo_scale=slo_scale, warmup=warmup, **config)
    gpus = prefill_gpus(cfg)
    row = run_one(RunSpec(cfg, preset.workload, rate / gpus, policy, requests, seed, prefill=scheduler))
    row["instance_rate"] = rate
    return row


def goodput(model: str, scheduler: str, seed: int, requests: int, warmup: int, start: float,
            slo_scale: float = 1.0, tol: float = 0.02, **config: Any) -> Search:
    """Largest instance rate with >= 90 % attainment (first crossing), one seed."""
    return boundary(lambda r: probe(model, scheduler, r, slo_scale, seed, requests, warmup, **config)["slo_attainment"],
                    start, up=True, tol=tol)


def tightest_slo_scale(model: str, scheduler: str, seed: int, requests: int, warmup: int, rate: float,
                       start: float = 1.0, tol: float = 0.02, **config: Any) -> Search:
    """Smallest SLO scale with >= 90 % attainment at instance ``rate``, one seed."""
    return boundary(lambda s: probe(model, scheduler, rate, s, seed, requests, warmup, **config)["slo_attainment"],
                    start, up=False, tol=tol)
