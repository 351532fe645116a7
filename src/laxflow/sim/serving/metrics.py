"""Metrics of one run, over the measured (non-warm-up) requests.

Called by :mod:`.experiment` after each run. All times in seconds.

* SLO attainment: share of measured requests whose TTFT <= SLO.
* TTFT mean / p50 / p90 / p99.
* CCT: per layer of a batch, the time its stage-2 collectives took (MoE
  dispatch + combine, as the paper aggregates them), averaged over the layers
  of batches that hold at least one measured request.
* Non-overlapped communication: per request, the time its batch's GPUs
  waited on the network (reuse stalls before layers plus the collectives).
* Earliness: deadline - finish (negative: a miss): mean, p10/p50/p90, and
  the mean over the requests that met their deadline (the paper's
  "non-negative earliness").
* CCT inflation: the measured batches' CCT over the same layers' CCT alone
  on an idle fabric (computed from the layer plan's bytes and idle
  bottleneck rates at batch start), summed over layers: 1.0 means no
  contention was left for a policy to remove. A policy that shortens CCT
  only by forming smaller batches does not lower it.
* Remote-reuse share: reused tokens fetched from another unit over all
  reused tokens; reuse share: reused tokens over all input tokens.
* Bytes per stage attributed to the measured requests, and the network's
  delivered bytes per stage for the whole run.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from laxflow.sim.serving.simulator import SimResult
from laxflow.stage import STAGE_NAMES

CONTRACT_KEYS = (
    "policy",
    "rate",
    "slo_attainment",
    "ttft_mean",
    "ttft_p90",
    "ttft_p99",
    "cct_mean",
    "earliness_mean",
    "requests",
)


def summarize(result: SimResult, rate: float) -> dict[str, Any]:
    """Every metric of one run, as a flat dict (the contract keys first)."""
    measured = result.measured
    ttft = np.array([s.ttft for s in measured], dtype=float)
    slo = np.array([s.slo for s in measured], dtype=float)
    early = np.array([s.deadline - s.finish for s in measured], dtype=float)
    met = ttft <= slo * (1 + 1e-12)
    measured_batches = {s.batch for s in measured}
    batches = [b for b in result.batches if b.id in measured_batches]
    cct = [c for b in batches for c in b.cct]
    idle_cct = sum(b.idle_cct * len(b.cct) for b in batches)
    reused = sum(s.route.reused_tokens for s in measured)
    remote = sum(s.route.remote_tokens for s in measured)
    bytes_by_stage = {st: float(sum(s.bytes.get(st, 0.0) for s in measured)) for st in STAGE_NAMES}
    out: dict[str, Any] = {
        "policy": result.policy,
        "rate": rate,
        "slo_attainment": float(met.mean()),
        "ttft_mean": float(ttft.mean()),
        "ttft_p90": float(np.percentile(ttft, 90)),
        "ttft_p99": float(np.percentile(ttft, 99)),
        "cct_mean": float(np.mean(cct)) if cct else 0.0,
        "earliness_mean": float(early.mean()),
        "requests": len(measured),
        # beyond the JSON contract: tables, sweeps, the README comparison
        "cct_inflation": float(sum(cct) / idle_cct) if idle_cct > 0 else 1.0,
        "remote_reuse_share": float(remote / reused) if reused else 0.0,
        "ttft_p50": float(np.percentile(ttft, 50)),
        "slo_mean": float(slo.mean()),
        "earliness_nonneg_mean": float(early[early >= 0].mean()) if np.any(early >= 0) else 0.0,
        "earliness_p10": float(np.percentile(early, 10)),
        "earliness_p50": float(np.percentile(early, 50)),
        "earliness_p90": float(np.percentile(early, 90)),
        "reuse_share": float(reused / sum(s.input_tokens for s in measured)),
        "nonoverlap_mean": float(np.mean([s.stall for s in measured])),
        "bytes_by_stage": bytes_by_stage,
        "network_bytes_by_stage": dict(result.stage_bytes_delivered),
        "batches": len(result.batches),
        "wall_s": result.wall_s,
        "sim_time": result.sim_time,
        "network_events": result.network_events,
    }
    return out


def contract_view(row: dict[str, Any]) -> dict[str, Any]:
    """The ``--json`` result object: exactly the contract keys."""
    return {k: row[k] for k in CONTRACT_KEYS}


def goodput(rows: list[dict[str, Any]], threshold: float = 0.9) -> dict[str, float | None]:
    """Per policy, the largest swept rate whose attainment is >= ``threshold`` (None if none is)."""
    best: dict[str, float | None] = {}
    for row in rows:
        p = row["policy"]
        best.setdefault(p, None)
        if row["slo_attainment"] >= threshold and (best[p] is None or row["rate"] > best[p]):
            best[p] = row["rate"]
    return best
