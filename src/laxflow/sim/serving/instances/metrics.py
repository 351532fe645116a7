"""Metrics of one iteration-level run, over the measured (non-warm-up) requests.

Called by :func:`.run.run_instances` after each run. Times in seconds.

* TTFT = first token - arrival; TPOT = (last token - first token) / (outputs - 1)
  (requests with one output token have none); TBT = every gap between tokens.
* SLO attainment (ProServe, Arrow): TTFT <= TTFT SLO and TPOT <= TPOT SLO;
  ``ttft_attainment`` / ``tpot_attainment`` each alone; ``max_tbt_attainment``
  with the largest gap of the request as its TPOT; ``envelope_attainment``: every
  token by its deadline ``arrival + TTFT_SLO + i * TPOT_SLO`` (FairBatching §3.1's SLO).
* Per-token deadlines ``arrival + TTFT_SLO + i * TPOT_SLO``: share of tokens on time.
* TDG (ProServe Eq. 3) with the run's w_p / w_d: ``tdg_gain`` (sum), ``tdg_ratio``
  (over the ideal gain); per priority (``high``/``low``) attainment and TDG ratio.
* Requests rejected by admission control (``fairbatching-pab``) count as SLO
  misses with zero gain in every attainment and TDG figure (FairBatching §5.1);
  latency percentiles are over the served ones; ``rejected`` counts them.
* The serving table's columns (``cct_mean`` etc.) are filled so the shared
  report prints them: no collectives here (0), earliness = TTFT SLO - TTFT.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from laxflow.errors import UserError
from laxflow.integrations.metrics.tdg import TdgWeights, tdg_gain, tdg_ideal
from laxflow.sim.serving.instances.engine import InstanceResult
from laxflow.sim.serving.instances.instance import Seq

_TOL = 1 + 1e-9


def request_metrics(s: Seq) -> dict[str, float]:
    t = s.token_times
    ttft = t[0] - s.arrival
    gaps = np.diff(t) if len(t) > 1 else np.zeros(0)
    tpot = float((t[-1] - t[0]) / (len(t) - 1)) if len(t) > 1 else 0.0
    return {"ttft": ttft, "tpot": tpot, "max_tbt": float(gaps.max()) if len(gaps) else 0.0}


def _pct(x: np.ndarray, q: float) -> float:
    return float(np.percentile(x, q)) if len(x) else 0.0


def _group(all_seqs: list[Seq], weights: TdgWeights) -> dict[str, float]:
    """Latencies over the served requests; attainments and TDG over all (a rejected one misses, gains 0)."""
    seqs = [s for s in all_seqs if not s.rejected]
    n = len(all_seqs)
    rows = [request_metrics(s) for s in seqs]
    ttft = np.array([r["ttft"] for r in rows])
    tpot = np.array([r["tpot"] for r in rows])
    ok_ttft = ttft <= np.array([s.ttft_slo for s in seqs]) * _TOL
    ok_tpot = tpot <= np.array([s.tpot_slo for s in seqs]) * _TOL
    gains = [tdg_gain(s.arrival, s.ttft_slo, s.tpot_slo, s.token_times, s.weight, weights) for s in seqs]
    # A rejected request's ideal gain is what its prompt and outputs would have earned (ProServe Eq. 3).
    ideal = [tdg_ideal(len(s.token_times) if not s.rejected else s.target_outputs, s.weight, weights)
             for s in all_seqs]
    return {"slo_attainment": float(np.sum(ok_ttft & ok_tpot) / n), "tdg_ratio": float(sum(gains) / sum(ideal)),
            "ttft_attainment": float(np.sum(ok_ttft) / n), "tpot_attainment": float(np.sum(ok_tpot) / n),
            "gain": float(sum(gains)), "ttft": ttft, "tpot": tpot, "rows": rows, "served": seqs}


def summarize(result: InstanceResult, rate: float, label: dict[str, Any]) -> dict[str, Any]:
    """Every metric of one run as a flat dict (the serving report's contract keys first)."""
    seqs = result.measured
    weights = TdgWeights(result.w_p, result.w_d)
    g = _group(seqs, weights)
    ttft, tpot = g["ttft"], g["tpot"]
    everyone, seqs = seqs, g["served"]  # rejected requests (admission control) count below as misses
    if not seqs:
        raise UserError("every measured request was rejected by admission control: no latency to report")
    multi = np.array([len(s.token_times) > 1 for s in seqs])
    tbt = np.concatenate([np.diff(s.token_times) for s in seqs if len(s.token_times) > 1] or [np.zeros(0)])
    on_time = sum(sum(1 for i, t in enumerate(s.token_times) if t <= s.arrival + s.ttft_slo + i * s.tpot_slo)
                  for s in seqs)
    tokens = sum(len(s.token_times) for s in seqs)
    max_tbt_ok = [r["ttft"] <= s.ttft_slo * _TOL and r["max_tbt"] <= s.tpot_slo * _TOL for r, s in zip(g["rows"], seqs)]
    max_tbt_ok += [False] * (len(everyone) - len(seqs))
    # FairBatching §3.1: a request meets its SLO when every token lies inside the deadline envelope.
    envelope_ok = [all(t <= (s.arrival + s.ttft_slo + i * s.tpot_slo) * _TOL for i, t in enumerate(s.token_times))
                   for s in seqs] + [False] * (len(everyone) - len(seqs))
    span = max(max(s.token_times[-1] for s in seqs), max(s.arrival for s in everyone)) - \
        min(s.arrival for s in everyone)
    out: dict[str, Any] = {
        "policy": label["policy"], "rate": rate, "slo_attainment": g["slo_attainment"],
        "ttft_mean": float(ttft.mean()), "ttft_p90": _pct(ttft, 90), "ttft_p99": _pct(ttft, 99),
        "cct_mean": 0.0, "earliness_mean": float(np.mean([s.ttft_slo for s in seqs]) - ttft.mean()),
        "requests": len(everyone), "rejected": len(everyone) - len(seqs),
        "prefill": label.get("prefill"), "router": label.get("router"), "pools": label.get("pools"),
        "instances": label.get("instances"),
        "ttft_p50": _pct(ttft, 50), "ttft_attainment": g["ttft_attainment"], "tpot_attainment": g["tpot_attainment"],
        "max_tbt_attainment": float(np.mean(max_tbt_ok)), "envelope_attainment": float(np.mean(envelope_ok)),
        "tpot_mean": float(tpot[multi].mean()) if multi.any() else 0.0, "tpot_p50": _pct(tpot[multi], 50),
        "tpot_p90": _pct(tpot[multi], 90), "tpot_p99": _pct(tpot[multi], 99),
        "tbt_p50": _pct(tbt, 50), "tbt_p99": _pct(tbt, 99), "tbt_max": float(tbt.max()) if len(tbt) else 0.0,
        "token_deadline_attainment": on_time / tokens, "tdg_gain": g["gain"], "tdg_ratio": g["tdg_ratio"],
        "tdg_w_p": result.w_p, "tdg_w_d": result.w_d,
        "effective_rps": g["slo_attainment"] * (len(everyone) - 1) / span if span > 0 else 0.0,
        "preemptions": sum(s.preemptions for s in seqs),
        "slo_mean": float(np.mean([s.ttft_slo for s in seqs])), "tpot_slo": float(np.mean([s.tpot_slo for s in seqs])),
        "earliness_nonneg_mean": float(np.mean(np.maximum(0.0, [s.ttft_slo - x for s, x in zip(seqs, ttft)]))),
        "nonoverlap_mean": 0.0, "bytes_by_stage": {"reuse": 0.0, "collective": 0.0, "p2d": result.p2d_bytes},
        "busy_share": float(np.mean([i["busy_s"] for i in result.instances.values()]) / result.sim_time)
        if result.sim_time > 0 else 0.0,
        "wall_s": result.wall_s, "sim_time": result.sim_time, "network_events": result.network_events,
    }
    for level in ("high", "low"):
        part = [s for s in everyone if s.weight == {"high": 2.0, "low": 1.0}[level]]
        if part and any(not s.rejected for s in part) and any(s.weight != 1.0 for s in everyone):
            pg = _group(part, weights)
            out[f"slo_attainment_{level}"] = pg["slo_attainment"]
            out[f"tdg_ratio_{level}"] = pg["tdg_ratio"]
            out[f"ttft_p99_{level}"] = _pct(pg["ttft"], 99)
    return out
