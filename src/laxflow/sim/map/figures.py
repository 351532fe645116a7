"""One cell's figures from its runs: MFS over the best baseline, paired, and FS's CCT inflation.

Called by :mod:`laxflow.sim.map.run` in the CLI process when the last run of
a cell is back. The rule is ``bench/sim_claims.py``'s: the best baseline is
the baseline policy with the highest mean SLO attainment over the seeds; the
paired difference is MFS minus that baseline seed by seed (every policy of a
seed serves the same requests), with a 95 % interval (Student t, n - 1
degrees of freedom); it *excludes 0* when there are two seeds or more and
|mean| > half-width.
"""

from __future__ import annotations

from typing import Any, Sequence

from laxflow.sim.serving.report import ci95

BASELINES = ("fs", "sjf", "edf", "karuna")  # the MFS paper's, SJF and Karuna sizing a flow per queue pair
GROUP_BASELINES = ("fs", "edf", "sjf-group", "karuna-group")  # the same, a collective sized as one job


def mean_ci(values: Sequence[float]) -> tuple[float, float | None]:
    """Mean and 95 % half-width (None for one value)."""
    return float(sum(values) / len(values)), ci95(values)


def paired_diff(a: Sequence[float], b: Sequence[float]) -> tuple[float, float | None, bool]:
    """Mean of ``a[i] - b[i]`` (the same seed's requests), its 95 % half-width (None for one pair), and whether
    that interval excludes 0: the rule of a margin that "pays" (the map, ``bench/sim_claims.py``, ``bench/codesign.py``)."""
    diff, ci = mean_ci([float(x) - float(y) for x, y in zip(a, b)])
    return diff, ci, ci is not None and abs(diff) > ci


def _round(x: float | None, digits: int) -> float | None:
    return None if x is None else round(float(x), digits)


def paired_margin(by_seed: dict[int, dict[str, dict[str, Any]]], seeds: Sequence[int],
                  baselines: Sequence[str] = BASELINES) -> tuple[str, float, float | None, bool] | None:
    """(best baseline, mean of MFS minus it per seed, 95 % half-width, whether that interval excludes 0).

    ``by_seed[seed][policy]`` is a run row (``slo_attainment``); ``seeds`` those with every policy.
    None without MFS or a baseline of ``baselines``. Also ``bench/sim_claims.py``'s rule (the README's claims
    table).
    """
    if not seeds:
        return None
    present = by_seed[seeds[0]]
    bases = [b for b in baselines if b in present]
    if "mfs" not in present or not bases:
        return None

    def mean_of(p: str) -> float:
        return sum(float(by_seed[s][p]["slo_attainment"]) for s in seeds) / len(seeds)

    # Rounded so that a tie (the same mean summed in another order) goes to the first in BASELINES order.
    best = max(bases, key=lambda b: round(mean_of(b), 9))
    return (best, *paired_diff([by_seed[s]["mfs"]["slo_attainment"] for s in seeds],
                               [by_seed[s][best]["slo_attainment"] for s in seeds]))


def cell_figures(rows: Sequence[dict[str, Any]], policies: Sequence[str]) -> dict[str, Any]:
    """The figures of one cell from its run rows (one per policy and seed, every seed complete)."""
    by_seed: dict[int, dict[str, dict[str, Any]]] = {}
    for r in rows:
        by_seed.setdefault(int(r["seed"]), {})[r["policy"]] = r
    seeds = sorted(s for s, got in by_seed.items() if all(p in got for p in policies))
    out: dict[str, Any] = {"seeds": seeds, "policies": {}}
    for p in policies:
        mine = [by_seed[s][p] for s in seeds]
        att, att_ci = mean_ci([float(r["slo_attainment"]) for r in mine])
        infl = [float(r["cct_inflation"]) for r in mine if r.get("cct_inflation") is not None]
        cct, cct_ci = mean_ci(infl) if infl else (None, None)
        out["policies"][p] = {
            "slo_attainment": round(att, 4), "slo_attainment_ci95": _round(att_ci, 4),
            "slo_attainment_seeds": [round(float(r["slo_attainment"]), 4) for r in mine],
            "cct_inflation": _round(cct, 4), "cct_inflation_ci95": _round(cct_ci, 4),
            "ttft_mean": round(mean_ci([float(r["ttft_mean"]) for r in mine])[0], 5),
            "remote_reuse_share": round(mean_ci([float(r["remote_reuse_share"]) for r in mine])[0], 4),
        }
    pol = out["policies"]
    fs = pol.get("fs")
    out["fs_cct_inflation"] = fs["cct_inflation"] if fs else None
    out["fs_cct_inflation_ci95"] = fs["cct_inflation_ci95"] if fs else None
    out["remote_reuse_share"] = round(sum(p["remote_reuse_share"] for p in pol.values()) / len(pol), 4)
    margin = paired_margin(by_seed, seeds)
    if margin is not None:
        best, diff, diff_ci, excludes = margin
        m, b = pol["mfs"]["slo_attainment"], pol[best]["slo_attainment"]
        out["best_baseline"] = best
        out["mfs_over_best"] = round(m / b, 4) if b else None
        out["paired_diff"] = {"mean": round(diff, 4), "ci95": _round(diff_ci, 4), "excludes_0": excludes}
    out["wall_s"] = round(sum(float(r.get("wall_s", 0.0)) for s in seeds for r in by_seed[s].values()), 2)
    return out
