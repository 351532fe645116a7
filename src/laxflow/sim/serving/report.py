"""What ``laxflow sim serve`` / ``sweep`` report: points over seeds, their JSON and their table.

Called by :mod:`laxflow.sim.serve_cli` in the main process after every run is
back. A *point* is one (rate, policy) cell; with several seeds it is the mean
over them, with a 95 % confidence interval (Student's t, n - 1 degrees of
freedom) for SLO attainment and for goodput.
"""

from __future__ import annotations

import math
import os
from typing import Any, Sequence, TextIO

from laxflow.sim.serving.metrics import CONTRACT_KEYS, goodput
from laxflow.stage import STAGE_NAMES

_POOLED = ("ttft_samples", "slo_samples", "request_rows")  # concatenated over seeds, never in the JSON


def ci95(values: Sequence[float]) -> float | None:
    """Half-width of the 95 % confidence interval of the mean (None for fewer than 2 values)."""
    n = len(values)
    if n < 2:
        return None
    from scipy import stats

    mean = sum(values) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    return float(stats.t.ppf(0.975, n - 1) * sd / math.sqrt(n))


def _mean(values: list[Any]) -> Any:
    """Equal values are kept as they are (ints stay ints); numbers are averaged; dicts per key."""
    first = values[0]
    if all(v == first for v in values):
        return first
    if isinstance(first, dict):
        return {k: _mean([v[k] for v in values]) for k in first}
    if isinstance(first, (int, float)) and not isinstance(first, bool):
        return float(sum(values) / len(values))
    return first


def label(row: dict[str, Any]) -> str:
    """A result's name in tables and goodput: the flow policy, or ``prefill+policy`` with --prefill."""
    router = None if row.get("router") == row.get("pools") else row.get("router")  # a pool run: its manager routes
    return "+".join(str(x) for x in (row.get("prefill"), router, row.get("pools"), row["policy"]) if x)


def points(rows: Sequence[dict[str, Any]], keys: Sequence[tuple[float, str]]) -> list[dict[str, Any]]:
    """Group run rows into points; ``keys[i]`` is row i's (requested rate, policy); order of first appearance."""
    groups: dict[tuple[float, str], list[dict[str, Any]]] = {}
    for key, row in zip(keys, rows):
        groups.setdefault(key, []).append(row)
    out = []
    for group in groups.values():
        point = {k: _mean([r[k] for r in group]) for k in group[0] if k not in _POOLED and k != "seed"}
        for k in _POOLED:
            if k in group[0]:
                point[k] = [x for r in group for x in r[k]]
        att = [float(r["slo_attainment"]) for r in group]
        point["slo_attainment"] = float(sum(att) / len(att))
        point["seeds"] = [r["seed"] for r in group]
        point["slo_attainment_seeds"] = att
        point["slo_attainment_ci95"] = ci95(att)
        out.append(point)
    return out


def json_view(point: dict[str, Any]) -> dict[str, Any]:
    """A ``--json`` result: the contract keys first, then every other column (bytes per stage flattened)."""
    out = {k: point[k] for k in CONTRACT_KEYS}
    for k, v in point.items():
        if k in out or k in _POOLED:
            continue
        if k == "bytes_by_stage":
            out.update({f"bytes_{st}": float(v.get(st, 0.0)) for st in STAGE_NAMES})
        else:
            out[k] = v
    return out


def goodput_over_seeds(rows: Sequence[dict[str, Any]], threshold: float = 0.9) -> dict[str, Any]:
    """Goodput per policy for each seed, its mean and CI.

    A seed at which no swept rate reaches ``threshold`` has goodput None, and
    then so has the mean: it lies below the lowest swept rate, not at zero.
    """
    seeds = list(dict.fromkeys(r["seed"] for r in rows))
    named = [{**r, "policy": label(r)} for r in rows]  # one goodput per (prefill, policy) pair
    per_seed = [goodput([r for r in named if r["seed"] == s], threshold) for s in seeds]
    policies = list(per_seed[0])
    values = {p: [g[p] for g in per_seed] for p in policies}
    known = {p: None not in v for p, v in values.items()}
    return {
        "goodput": {p: (float(sum(v) / len(v)) if known[p] else None) for p, v in values.items()},
        "goodput_seeds": values,
        "goodput_ci95": {p: (ci95(v) if known[p] else None) for p, v in values.items()},
    }


# -- the table -------------------------------------------------------------------


def _ms(x: float) -> str:
    return f"{x * 1e3:.1f}"


def _opt(p: dict[str, Any], key: str, fmt: Any) -> str:
    """``fmt(p[key])``, or "-" where the run has no value for ``key`` (None: see ``metrics``)."""
    v = p.get(key)
    return "-" if v is None else fmt(v)


def _pair(p: dict[str, Any], a: str, b: str) -> str:
    """Two counts as ``a/b``, "-" for one the run has no value for."""
    return f"{_opt(p, a, lambda v: f'{v:g}')}/{_opt(p, b, lambda v: f'{v:g}')}"


def _att(p: dict[str, Any]) -> str:
    ci = p.get("slo_attainment_ci95")
    return f"{p['slo_attainment']:.3f}" + ("" if ci is None else f" ± {ci:.3f}")


# (header with its unit, cell); the first two columns repeat in every part of a split table.
_COLUMNS = [
    ("policy", label),
    ("rate\n(req/s/GPU)", lambda p: f"{p['rate']:.3g}"),
    ("SLO att.\n(share)", _att),
    ("TTFT mean\n(ms)", lambda p: _ms(p["ttft_mean"])),
    ("p50\n(ms)", lambda p: _ms(p["ttft_p50"])),
    ("p90\n(ms)", lambda p: _ms(p["ttft_p90"])),
    ("p99\n(ms)", lambda p: _ms(p["ttft_p99"])),
    ("CCT\n(us)", lambda p: _opt(p, "cct_mean", lambda v: f"{v * 1e6:.0f}")),
    ("non-overlap\n(ms)", lambda p: _ms(p["nonoverlap_mean"])),
    ("earliness\n(ms)", lambda p: _ms(p["earliness_mean"])),
    ("earl.>=0\n(ms)", lambda p: _ms(p["earliness_nonneg_mean"])),
    ("reuse\n(GB)", lambda p: f"{p['bytes_by_stage']['reuse'] / 1e9:.2f}"),
    ("coll\n(GB)", lambda p: f"{p['bytes_by_stage']['collective'] / 1e9:.2f}"),
    ("p2d\n(GB)", lambda p: f"{p['bytes_by_stage']['p2d'] / 1e9:.2f}"),
    ("wall\n(s)", lambda p: f"{p['wall_s']:.1f}"),
]
_KEY = 2
# Instance-engine runs (serving/instances) add decode columns at the end.
_ENGINE_COLUMNS = [
    ("TPOT p90\n(ms)", lambda p: _opt(p, "tpot_p90", _ms)),
    ("TDG\nratio", lambda p: _opt(p, "tdg_ratio", lambda v: f"{v:.3f}")),
]
# Runs with MFS pruning or --prefill drivers add what was pruned and deferred (whole run).
_PRUNE_COLUMNS = [
    ("pruned/\ndeferred", lambda p: _pair(p, "pruned", "deferred")),
]


# Pool runs (--pools) add the pool manager's flips (mean over seeds) and final P:D split.
_POOL_COLUMNS = [
    ("flips\nP>D/D>P", lambda p: _pair(p, "flips_p2d", "flips_d2p") if p.get("pools") else "-"),
    ("pools\nend", lambda p: _opt(p, "pools_end", str)),
]


def _columns(pts: Sequence[dict[str, Any]]) -> list:
    def some(key: str) -> bool:
        return any(p.get(key) is not None for p in pts)

    return _COLUMNS + (_ENGINE_COLUMNS if some("tpot_p90") else []) + \
        (_PRUNE_COLUMNS if some("pruned") or some("deferred") else []) + (_POOL_COLUMNS if some("pools") else [])


def terminal_width(stream: TextIO) -> int:
    """``COLUMNS`` if set, else the terminal's width, else 200 (a pipe or a file has no width to fit)."""
    cols = os.environ.get("COLUMNS", "")
    if cols.isdigit() and int(cols) > 0:
        return int(cols)
    try:
        return os.get_terminal_size(stream.fileno()).columns
    except (OSError, ValueError, AttributeError):
        return 200


def table_parts(pts: Sequence[dict[str, Any]], width: int) -> list[list[int]]:
    """Column indices of each table part, so that no part is wider than ``width``.

    A rich table takes each column's widest line plus 3 (padding and a rule)
    and 1 for the outer rule; columns are packed greedily, the key columns
    (policy, rate) repeated in every part. Numbers are never cut.
    """
    columns = _columns(pts)
    cells = [[fmt(p) for p in pts] for _, fmt in columns]
    widths = [max([*map(len, head.split("\n")), *map(len, col)]) + 3 for (head, _), col in zip(columns, cells)]
    base = 1 + sum(widths[:_KEY])
    parts: list[list[int]] = []
    current: list[int] = []
    used = base
    for i in range(_KEY, len(columns)):
        if current and used + widths[i] > width:
            parts.append(current)
            current, used = [], base
        current.append(i)
        used += widths[i]
    parts.append(current)
    return [list(range(_KEY)) + part for part in parts]


def print_table(pts: Sequence[dict[str, Any]], title: str, stream: TextIO) -> None:
    """The results table on ``stream``, split into parts that fit its width."""
    from rich.console import Console
    from rich.table import Table

    width = terminal_width(stream)
    columns = _columns(pts)
    console = Console(file=stream, width=width, highlight=False)
    for n, part in enumerate(table_parts(pts, width)):
        table = Table(title=title if n == 0 else None)
        for i in part:
            head = columns[i][0]
            table.add_column(head, justify="left" if i == 0 else "right", no_wrap=True)
        for p in pts:
            table.add_row(*(columns[i][1](p) for i in part))
        console.print(table)
