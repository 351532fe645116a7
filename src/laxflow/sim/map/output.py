"""The map's files: ``--json`` (also what a rerun resumes from), ``--csv`` and ``--plot DIR``.

Called by :mod:`laxflow.sim.map.run` in the CLI process: the JSON file is
read once before any run (its cells are not run again) and rewritten whole
(to a temporary file, then renamed) each time a cell finishes, so a map cut
short keeps every finished cell.
"""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path
from typing import Any, Sequence

from laxflow.errors import UserError
from laxflow.sim.map.grid import AXIS_NAMES, AXES

FORMAT = 1  # version of the JSON layout below
# Settings a cell's figures depend on besides its own parameters: a file made with others is not resumed.
SETTINGS = ("requests", "warmup", "seeds", "slo_scale", "policies", "grid", "base_load", "physics")
OLDER = {"physics": "faithful"}  # a setting a file made before it existed ran with

CSV_COLUMNS = ("row", "model", "workload", *AXIS_NAMES, "deployment", "servers", "topology", "capacity", "rate",
               "seeds", "best_baseline", "mfs_slo_attainment", "mfs_slo_attainment_ci95", "best_slo_attainment",
               "best_slo_attainment_ci95", "mfs_over_best", "paired_diff", "paired_diff_ci95", "excludes_0",
               "fs_cct_inflation", "fs_cct_inflation_ci95", "mfs_cct_inflation", "remote_reuse_share", "wall_s")


def load(path: Path | None, settings: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Cells already in ``path`` by key (none if it does not exist); other settings are one UserError."""
    if path is None or not path.exists():
        return {}
    where = f"--json: {str(path)!r}"
    if path.is_dir():
        raise UserError(f"{where}: is a directory, expected a file")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UserError(f"{where}: cannot resume from it ({exc}); give another file") from None
    if not isinstance(data, dict) or data.get("laxflow_map") != FORMAT or not isinstance(data.get("cells"), list):
        raise UserError(f"{where}: not a laxflow sim map file (format {FORMAT}); give another file")
    theirs = data.get("settings", {})
    for key in SETTINGS:
        made = theirs.get(key, OLDER.get(key))
        if made != settings[key]:
            raise UserError(f"{where}: made with {key} = {made!r}, this map has {settings[key]!r}; "
                            f"give another file or the same settings to resume it")
    return {c["key"]: c for c in data["cells"] if isinstance(c, dict) and "key" in c}


def write_json(path: Path, settings: dict[str, Any], cells: Sequence[dict[str, Any]]) -> None:
    """The whole map file, replaced atomically."""
    payload = {"laxflow_map": FORMAT, "settings": settings, "cells": list(cells)}
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(json.dumps(payload, indent=1, allow_nan=False) + "\n", encoding="utf-8")
        os.replace(tmp, path)
    except OSError as exc:
        raise UserError(f"--json: cannot write {str(path)!r}: {exc.strerror}") from None


def csv_row(cell: dict[str, Any]) -> dict[str, Any]:
    """One CSV line of a cell: parameters, then the headline figures."""
    pol = cell["policies"]
    best = cell.get("best_baseline")
    diff = cell.get("paired_diff") or {}
    mfs, bb = pol.get("mfs", {}), pol.get(best, {}) if best else {}
    return {
        **{k: cell[k] for k in ("row", "model", "workload", *AXIS_NAMES, "deployment", "servers", "topology",
                                "capacity", "rate")},
        "seeds": len(cell["seeds"]), "best_baseline": best,
        "mfs_slo_attainment": mfs.get("slo_attainment"), "mfs_slo_attainment_ci95": mfs.get("slo_attainment_ci95"),
        "best_slo_attainment": bb.get("slo_attainment"), "best_slo_attainment_ci95": bb.get("slo_attainment_ci95"),
        "mfs_over_best": cell.get("mfs_over_best"), "paired_diff": diff.get("mean"),
        "paired_diff_ci95": diff.get("ci95"), "excludes_0": diff.get("excludes_0"),
        "fs_cct_inflation": cell.get("fs_cct_inflation"), "fs_cct_inflation_ci95": cell.get("fs_cct_inflation_ci95"),
        "mfs_cct_inflation": mfs.get("cct_inflation"), "remote_reuse_share": cell.get("remote_reuse_share"),
        "wall_s": cell.get("wall_s"),
    }


def write_csv(path: Path, cells: Sequence[dict[str, Any]]) -> None:
    try:
        with path.open("w", newline="", encoding="utf-8") as f:
            w = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
            w.writeheader()
            for c in cells:
                w.writerow({k: ("" if v is None else v) for k, v in csv_row(c).items()})
    except OSError as exc:
        raise UserError(f"--csv: cannot write {str(path)!r}: {exc.strerror}") from None


# -- --plot DIR: one heatmap figure per row --------------------------------------------------------------


def _label(axis: str, value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def plot_row(path: Path, row: str, cells: Sequence[dict[str, Any]], through: dict[str, Any]) -> None:
    """Two heatmaps for one row: paired MFS - best baseline, and FS's CCT inflation.

    Heatmap line i is axis i; its columns are that axis's values with every other axis at
    ``through`` (the base point), so a star grid is drawn whole and a product grid by its slice
    through the base; axes held at one value are left out (unless none varies). A cell whose
    paired interval excludes 0 is outlined and starred.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    lines: list[tuple[str, list[tuple[Any, dict[str, Any]]]]] = []
    for a in AXES:
        line = [(c[a.name], c) for c in cells
                if all(c[b] == through[b] for b in AXIS_NAMES if b != a.name)]
        line.sort(key=lambda vc: (str(type(vc[0])), vc[0]))
        if line:
            lines.append((a.flag.lstrip("-"), line))
    varied = [(name, line) for name, line in lines if len(line) > 1]
    lines = varied or lines  # an axis held at one value says nothing here (its value is in every cell)
    width = max(len(line) for _, line in lines)
    diff = np.full((len(lines), width), np.nan)
    infl = np.full((len(lines), width), np.nan)
    fig, axes = plt.subplots(1, 2, figsize=(4 + 2.4 * width, 1.6 + 0.75 * len(lines)), squeeze=False)
    for i, (_, line) in enumerate(lines):
        for j, (_, c) in enumerate(line):
            d = (c.get("paired_diff") or {}).get("mean")
            diff[i, j] = np.nan if d is None else d
            fsi = c.get("fs_cct_inflation")
            infl[i, j] = np.nan if fsi is None else fsi
    span = np.nanmax(np.abs(diff)) if np.isfinite(diff).any() else 0.0
    span = max(span, 0.05)  # a scale of at least +-0.05 attainment, so that noise does not look dark
    # FS CCT inflation from 1 (idle) to at least 1.5, for the same reason.
    panels = [(axes[0][0], diff, "RdBu", -span, span, "MFS - best baseline, SLO attainment (paired)"),
              (axes[0][1], infl, "Reds", 1.0, max(1.5, float(np.nanmax(infl)) if np.isfinite(infl).any() else 1.5),
               "FS CCT inflation (x idle)")]
    for ax, data, cmap, lo, hi, title in panels:
        im = ax.imshow(np.ma.masked_invalid(data), cmap=cmap, vmin=lo, vmax=hi, aspect="auto")
        ax.set_title(title, fontsize=9)
        ax.set_yticks(range(len(lines)), [name for name, _ in lines])
        ax.set_xticks([])
        fig.colorbar(im, ax=ax, shrink=0.8)
        for i, (_, line) in enumerate(lines):
            for j, (value, c) in enumerate(line):
                pd = c.get("paired_diff") or {}
                marked = bool(pd.get("excludes_0"))
                if data is diff:
                    ci = pd.get("ci95")
                    text = "-" if pd.get("mean") is None else f"{pd['mean']:+.3f}" + ("" if ci is None else f"\n±{ci:.3f}")
                else:
                    ci = c.get("fs_cct_inflation_ci95")
                    v = c.get("fs_cct_inflation")
                    text = "-" if v is None else f"{v:.2f}" + ("" if ci is None else f"\n±{ci:.2f}")
                shade = (data[i, j] - lo) / (hi - lo) if np.isfinite(data[i, j]) else 0.5
                dark = abs(shade - 0.5) > 0.3 if data is diff else shade > 0.6  # white text on dark colours
                ax.text(j, i, f"{_label('', value)}{' *' if marked else ''}\n{text}", ha="center", va="center",
                        fontsize=7, fontweight="bold" if marked else "normal", color="white" if dark else "black")
                if marked:
                    ax.add_patch(matplotlib.patches.Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, lw=2,
                                                              edgecolor="black"))
    fig.suptitle(f"laxflow sim map: {row} (* paired 95 % interval excludes 0)", fontsize=10)
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=110)
    except OSError as exc:
        raise UserError(f"--plot: cannot write {str(path)!r}: {exc.strerror}") from None
    finally:
        plt.close(fig)


def plot_file(directory: Path, row: str) -> Path:
    safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in row)
    return directory / f"map-{safe}.png"
