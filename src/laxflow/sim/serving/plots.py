"""PNG plots of ``laxflow sim serve`` and ``laxflow sim sweep`` (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from laxflow.errors import UserError


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path) -> None:
    """Write the figure (the CLI checked the extension and made the directory before running)."""
    try:
        fig.savefig(path, dpi=120, bbox_inches="tight")
    except (OSError, ValueError) as exc:
        raise UserError(f"--plot: cannot write {str(path)!r}: {getattr(exc, 'strerror', None) or exc}") from None


def _setup(meta: dict[str, Any]) -> str:
    """Servers, measured requests and seeds, for a plot's subtitle."""
    seeds = meta.get("seeds") or [meta.get("seed", 0)]
    return (f"{meta['servers']} servers ({meta['prefill_gpus']} prefill GPUs), {meta['requests']} measured "
            f"requests, {len(seeds)} seed{'s' if len(seeds) > 1 else ''}")


def plot_serve(rows: list[dict[str, Any]], meta: dict[str, Any], path: Path) -> None:
    """SLO attainment per policy (bars) and each policy's TTFT CDF normalized by its SLO."""
    import numpy as np

    plt = _pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    names = [r["policy"] for r in rows]
    bars = ax1.bar(names, [r["slo_attainment"] for r in rows], color="tab:blue",
                   yerr=[r.get("slo_attainment_ci95") or 0.0 for r in rows], capsize=4)
    ax1.bar_label(bars, fmt="%.3f")
    ax1.set_ylim(0, 1)
    ax1.set_ylabel("TTFT SLO attainment")
    ax1.set_title(f"{meta['model']} / {meta.get('workload') or 'trace'} @ {meta['rate']:g} req/s/GPU")
    fig.suptitle(_setup(meta), fontsize=9)
    for r in rows:
        x = np.sort(np.asarray(r["ttft_samples"]) / np.asarray(r["slo_samples"]))
        ax2.plot(x, np.arange(1, x.size + 1) / x.size, label=r["policy"])
    ax2.axvline(1.0, color="grey", linestyle="--", linewidth=1)
    ax2.set_xscale("log")
    ax2.set_xlabel("TTFT / SLO (log; left of the line: met)")
    ax2.set_ylabel("CDF of requests")
    ax2.legend()
    _save(fig, path)
    plt.close(fig)


def sweep_figure(rows: list[dict[str, Any]], meta: dict[str, Any]):
    """SLO attainment against rate, one line per policy (error bars: 95 % CI over seeds); returns the figure."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4.3))
    for name in dict.fromkeys(r["policy"] for r in rows):
        pts = sorted((r["rate"], r["slo_attainment"], r.get("slo_attainment_ci95") or 0.0)
                     for r in rows if r["policy"] == name)
        ax.errorbar([p[0] for p in pts], [p[1] for p in pts], yerr=[p[2] for p in pts], marker="o", capsize=3,
                    label=name)
    ax.axhline(0.9, color="grey", linestyle="--", linewidth=1, label="0.9: goodput threshold")
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("request rate (req/s per prefill GPU)")
    ax.set_ylabel("TTFT SLO attainment")
    ax.set_title(f"{meta['model']} / {meta.get('workload') or 'trace'}\n{_setup(meta)}", fontsize=10)
    ax.legend(fontsize=8)
    return fig


def plot_sweep(rows: list[dict[str, Any]], meta: dict[str, Any], path: Path) -> None:
    """Write :func:`sweep_figure` to ``path``."""
    fig = sweep_figure(rows, meta)
    _save(fig, path)
    _pyplot().close(fig)
