"""One metrics row per run, for both serving engines: the keys of :data:`ROW_KEYS`, always all of them.

Who calls: :func:`.experiment.run_one` after a unit-level run (the
:class:`~.simulator.ServingSimulator`'s :class:`~.simulator.SimResult`),
:func:`.instances.run.run_instances` after an iteration-level one (the
:class:`~.instances.engine.InstanceEngine`'s ``InstanceResult``), bench
scripts and tests; in whichever process ran the simulation. :func:`summarize`
takes either result and returns a flat dict whose keys are exactly
:data:`ROW_KEYS`, in that order, :data:`CONTRACT_KEYS` first; the run
functions add :data:`RUN_KEYS` (and ``request_rows`` with ``--requests-out``).
Metrics are over the measured (non-warm-up) requests unless a key says
"whole run". Times in seconds, bytes in bytes.

A key with no value on one engine is None there (JSON ``null``), never a
made-up number: ``--json`` is written with ``allow_nan=False``, so NaN cannot
stand for it, and 0 would claim a measurement (a zero-time collective, a
perfect TPOT). A key that counts something a run cannot have (a pool flip
without pools, a rejection without admission control) is 0.

Where one key means two things (each engine keeps the meaning it had before
the two shared a row; compare engines on the keys marked "both"):

* TTFT (``ttft_*``, the attainments, earliness): both arrival to the first
  token the user sees. unit: the last P2D byte landing on the decode unit
  (MFS's TTFT); instance: the first token is emitted at the end of the
  prompt's last prefill step and, for a request whose KV moves to a decode
  instance, seen when its last P2D byte lands there (``Seq.kv_landed``); the
  same definition, so P2D shows in TTFT on both.
* ``slo_attainment``: unit: TTFT <= its SLO; instance: TTFT <= TTFT SLO and
  TPOT <= TPOT SLO, a request rejected by admission control counting as a miss.
  ``ttft_attainment`` (both) is TTFT alone; on the unit engine it equals
  ``slo_attainment``.
* ``earliness_mean``: both the mean of SLO - TTFT (unit: deadline - finish,
  the same number); instance: over the served requests (a rejected one has
  no TTFT). ``earliness_p10/p50/p90``: the same per request, both.
* ``earliness_nonneg_mean``: unit: the mean earliness of the requests that
  met their SLO (the paper's "non-negative earliness"; 0.0 if none did);
  instance: the mean of max(0, SLO - TTFT) over the served requests (a miss
  counts 0).
* ``requests``: both the measured requests; the instance engine's include
  those rejected by admission control (``rejected``; the unit engine rejects none).
* ``cct_mean``, ``cct_inflation``: unit: per layer, its stage-2 collectives'
  time (``cct_mean`` 0.0 when the measured batches ran none); instance: None
  (before this row it printed 0.0): its steps run no collective as a flow (TP
  all-reduces are a term of the step time, ``profile.StepTimer``); with
  prefill units (a prefill scheduler in ``--prefill``) as on the unit engine.
* ``bytes_by_stage``: unit: the bytes attributed to the measured requests;
  instance: the whole run's network bytes per stage (the engine's
  ``fabric.delivered``; without the engine, the P2D bytes it issued, the same
  total once every flow has landed). ``network_bytes_by_stage`` (both): the
  network's delivered bytes per stage, whole run.
* ``batches``: unit: prefill batches started (whole run); instance: steps of
  every instance (whole run, decode steps included; None for a hand-made
  result without step counts).
* ``nonoverlap_mean``: unit (and the instance engine's prefill units): per
  request, the time its batch waited on the network; instance: 0.0, measured
  by construction (no step waits on the network: the KV leaves after the
  prompt's last step).
* ``reuse_share``, ``remote_reuse_share``: instance: 0.0 (its instances keep
  no prefix cache: no token is reused).
* ``preemptions``: instance: recompute preemptions for KV memory; unit: the
  decode units' with ``--decode steps``, else None (a prefill driver's
  preemptions at boundaries are another thing).

Decode and TDG keys (``tpot_*``, ``tbt_*``, ``max_tbt_attainment``,
``envelope_attainment``, ``token_deadline_attainment``, ``tdg_*``,
``effective_rps``, ``tpot_slo``, per priority ``*_high``/``*_low``) are None on
the unit engine with ``decode = "hold"`` (``--decode hold``): it runs no decode
iterations (a decode unit holds a request ``output_tokens x
decode_seconds_per_token`` for the router's load, nothing more). With
``decode = "steps"`` (the default) its decode units run as decode
instances and it fills the measured ones, ``tpot_mean/p50/p90/p99``,
``tbt_p50/p99/max`` and ``preemptions`` (recompute preemptions on the decode
units), the same way as the instance engine. With a TPOT SLO
(``ServingConfig.tpot_slo``, ``--tpot-slo``; by default the workload's, which
only the SLO workloads have) it also fills ``tpot_slo``, ``tpot_attainment``,
``max_tbt_attainment``, ``envelope_attainment`` and
``token_deadline_attainment`` (TTFT against each request's own SLO);
``slo_attainment`` stays its TTFT attainment (the MFS metric), and the TDG
keys stay None. ``busy_share`` is None there too (not measured). Per priority keys are
None on the instance engine when the workload has one priority.

Keys both engines fill from what ran: ``prefill`` (unit: the ``--prefill``
scheduler, None for the run-to-completion FCFS batch former), ``router``,
``pools``, ``instances`` (None on the unit engine), ``flips_p2d`` /
``flips_d2p`` (pool flips P->D / D->P; 0 without pools; None for a pool run
summarized without its engine), ``pools_end`` (the final P:D split; None
without pools), ``pruned`` (requests in the flow
policy's pruned set at the run's end, whole run: MFS's Algorithm 1; the
simulators never forget a request, so every one it pruned; None for a policy
that keeps no pruned set, or an instance result summarized without its
engine), ``deferred`` (tasks the unit engine's ``--prefill`` drivers deferred
because every request of theirs was pruned, whole run, and the same of the
instance engine's prefill units; None where no driver runs: the unit
engine's default FCFS and the instance engine's batch schedulers).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from laxflow.errors import UserError
from laxflow.integrations.metrics.tdg import TdgWeights, tdg_gain, tdg_ideal
from laxflow.policy.base import pruned_count
from laxflow.stage import STAGE_NAMES

if TYPE_CHECKING:
    from laxflow.sim.serving.instances.engine import InstanceEngine, InstanceResult
    from laxflow.sim.serving.instances.instance import Seq
    from laxflow.sim.serving.simulator import SimResult

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
_UNIT_BORN = (  # the unit engine's keys before the merge, in their order
    "cct_inflation", "remote_reuse_share", "ttft_p50", "slo_mean", "earliness_nonneg_mean", "earliness_p10",
    "earliness_p50", "earliness_p90", "reuse_share", "nonoverlap_mean", "bytes_by_stage", "network_bytes_by_stage",
    "batches", "wall_s", "sim_time", "network_events",
)
_DECODE = (  # decode and TDG keys: None on the unit engine with decode "hold" (_unit_decode fills its own)
    "tpot_attainment", "max_tbt_attainment", "envelope_attainment", "tpot_mean", "tpot_p50", "tpot_p90",
    "tpot_p99", "tbt_p50", "tbt_p99", "tbt_max", "token_deadline_attainment", "tdg_gain", "tdg_ratio", "tdg_w_p",
    "tdg_w_d", "effective_rps", "tpot_slo",
)
_LEVELS = {"high": 2.0, "low": 1.0}  # priority weights (slo_traces.PRIORITY_WEIGHTS)
_PRIORITY = tuple(f"{k}_{level}" for level in _LEVELS for k in ("slo_attainment", "tdg_ratio", "ttft_p99"))
_INSTANCE_BORN = (
    "rejected", "prefill", "router", "pools", "instances", "ttft_attainment", *_DECODE, "preemptions", "busy_share",
    *_PRIORITY, "flips_p2d", "flips_d2p", "pools_end",
)
ROW_KEYS = CONTRACT_KEYS + _UNIT_BORN + _INSTANCE_BORN + ("pruned", "deferred")
# Added to the row by the run functions (experiment.run_one, instances.run.run_instances); report.points
# drops the seed and pools the samples over seeds.
RUN_KEYS = ("seed", "ttft_samples", "slo_samples")

_TOL = 1 + 1e-9  # the instance engine's SLO tolerance (the unit engine's is met_slo's)


def met_slo(ttft: Any, slo: Any) -> Any:
    """Whether a unit-engine request met its TTFT SLO (floats or arrays): the rule of its rows, exports and benches."""
    return ttft <= slo * (1 + 1e-12)


def summarize(result: SimResult | InstanceResult, rate: float, label: dict[str, Any] | None = None,
              engine: InstanceEngine | None = None) -> dict[str, Any]:
    """Every metric of one run, as one flat dict with the keys of :data:`ROW_KEYS`.

    ``result``: a unit-level ``SimResult`` (then no ``label`` or ``engine``)
    or an ``InstanceResult`` with its ``label`` (``policy``, and ``prefill``,
    ``router``, ``pools``, ``instances`` where set) and, when the caller has
    it, the ``engine`` that ran it (its fabric's bytes, flow policy and pool
    dispatcher fill ``network_bytes_by_stage``, ``pruned`` and the flips).
    """
    from laxflow.sim.serving.simulator import SimResult

    if isinstance(result, SimResult):
        if label is not None or engine is not None:
            raise TypeError("summarize: a unit-level SimResult takes no label or engine")
        return _row(_unit(result, rate))
    if label is None:
        raise TypeError("summarize: an InstanceResult needs its label (at least the policy)")
    return _row(_instance(result, rate, label, engine))


def _row(values: dict[str, Any]) -> dict[str, Any]:
    """``values`` in :data:`ROW_KEYS` order; a key missing or unknown is a bug in this module."""
    if len(values) != len(ROW_KEYS) or set(values) != set(ROW_KEYS):
        missing, extra = sorted(set(ROW_KEYS) - set(values)), sorted(set(values) - set(ROW_KEYS))
        raise RuntimeError(f"metrics row: missing keys {missing}, unknown keys {extra}")
    return {k: values[k] for k in ROW_KEYS}


# -- the unit-level engine ---------------------------------------------------------


def _unit(result: SimResult, rate: float) -> dict[str, Any]:
    measured = result.measured
    ttft = np.array([s.ttft for s in measured], dtype=float)
    slo = np.array([s.slo for s in measured], dtype=float)
    early = np.array([s.deadline - s.finish for s in measured], dtype=float)
    met = met_slo(ttft, slo)
    reused = sum(s.route.reused_tokens for s in measured)
    remote = sum(s.route.remote_tokens for s in measured)
    bytes_by_stage = {st: float(sum(s.bytes.get(st, 0.0) for s in measured)) for st in STAGE_NAMES}
    attainment = float(met.mean())
    return {
        "policy": result.policy,
        "rate": rate,
        "slo_attainment": attainment,
        "ttft_mean": float(ttft.mean()),
        "ttft_p90": float(np.percentile(ttft, 90)),
        "ttft_p99": float(np.percentile(ttft, 99)),
        **_collective_keys(result.batches, measured),
        "earliness_mean": float(early.mean()),
        "requests": len(measured),
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
        "rejected": 0,
        "prefill": result.prefill,
        "router": None,
        "pools": None,
        "instances": None,
        "ttft_attainment": attainment,
        **dict.fromkeys(_DECODE),
        "preemptions": None,
        "busy_share": None,
        **dict.fromkeys(_PRIORITY),
        "flips_p2d": 0,
        "flips_d2p": 0,
        "pools_end": None,
        "pruned": result.pruned,
        "deferred": result.deferred,
        **_unit_decode(result),
    }


def _collective_keys(batches: list[Any], measured: list[Any]) -> dict[str, Any]:
    """``cct_mean`` and ``cct_inflation`` over the batches that prefilled the ``measured`` request states (prefill
    units of either engine): per layer, the stage-2 collectives' time, and its ratio to the same alone on an idle
    fabric."""
    ids = {s.batch for s in measured}
    ran = [b for b in batches if b.id in ids]
    cct = [c for b in ran for c in b.cct]
    idle_cct = sum(b.idle_cct * len(b.cct) for b in ran)
    return {"cct_mean": float(np.mean(cct)) if cct else 0.0,
            "cct_inflation": float(sum(cct) / idle_cct) if idle_cct > 0 else 1.0}


def _unit_decode(result: SimResult) -> dict[str, Any]:
    """Decode "steps": the decode units' measured keys, and with a TPOT SLO (``ServingConfig.tpot_slo``)
    the token attainments (TTFT against each request's own SLO); TDG keys stay None. "hold": none."""
    if result.decode is None:
        return {}
    seqs = [result.decode[s.index] for s in result.measured]
    rows = [request_metrics(s) for s in seqs]
    out = _decode_latencies(seqs, np.array([r["tpot"] for r in rows], dtype=float))
    if all(math.isfinite(s.tpot_slo) for s in seqs):
        ok_tpot = _met(seqs, rows)[1]
        out.update(tpot_attainment=float(np.sum(ok_tpot) / len(seqs)), **_token_envelopes(seqs, rows, len(seqs)),
                   tpot_slo=float(np.mean([s.tpot_slo for s in seqs])))
    return out


# -- the iteration-level engine ----------------------------------------------------


def request_metrics(s: Seq) -> dict[str, float]:
    """One served sequence's TTFT, TPOT ((last - first token) / (outputs - 1); 0 for one output) and largest gap."""
    t = s.token_times
    ttft = t[0] - s.arrival
    gaps = np.diff(t) if len(t) > 1 else np.zeros(0)
    tpot = float((t[-1] - t[0]) / (len(t) - 1)) if len(t) > 1 else 0.0
    return {"ttft": ttft, "tpot": tpot, "max_tbt": float(gaps.max()) if len(gaps) else 0.0}


def _pct(x: np.ndarray, q: float) -> float:
    return float(np.percentile(x, q)) if len(x) else 0.0


def _decode_latencies(seqs: list[Seq], tpot: np.ndarray) -> dict[str, Any]:
    """Both engines' measured decode keys: TPOT over the requests with more than one token (``tpot``: per
    request, ``request_metrics``), the gaps between consecutive tokens, recompute preemptions."""
    multi = np.array([len(s.token_times) > 1 for s in seqs])
    tbt = np.concatenate([np.diff(s.token_times) for s in seqs if len(s.token_times) > 1] or [np.zeros(0)])
    return {"tpot_mean": float(tpot[multi].mean()) if multi.any() else 0.0, "tpot_p50": _pct(tpot[multi], 50),
            "tpot_p90": _pct(tpot[multi], 90), "tpot_p99": _pct(tpot[multi], 99),
            "tbt_p50": _pct(tbt, 50), "tbt_p99": _pct(tbt, 99), "tbt_max": float(tbt.max()) if len(tbt) else 0.0,
            "preemptions": sum(s.preemptions for s in seqs)}


def _met(seqs: list[Seq], rows: list[dict[str, float]]) -> tuple[np.ndarray, np.ndarray]:
    """Per served request (``rows``: its ``request_metrics``), whether its TTFT and its TPOT met their SLOs."""
    ttft = np.array([r["ttft"] for r in rows])
    tpot = np.array([r["tpot"] for r in rows])
    return ttft <= np.array([s.ttft_slo for s in seqs]) * _TOL, tpot <= np.array([s.tpot_slo for s in seqs]) * _TOL


def _token_envelopes(seqs: list[Seq], rows: list[dict[str, float]], n: int) -> dict[str, float]:
    """Attainments over every token of the served ``seqs`` (``rows``: their ``request_metrics``) out of ``n``
    requests (the rest rejected, counted as misses): TTFT and the largest gap within their SLOs; every token
    inside the deadline envelope (FairBatching §3.1); and the share of tokens on time."""
    on_time = sum(sum(1 for i, t in enumerate(s.token_times) if t <= s.arrival + s.ttft_slo + i * s.tpot_slo)
                  for s in seqs)
    tokens = sum(len(s.token_times) for s in seqs)
    max_tbt_ok = [r["ttft"] <= s.ttft_slo * _TOL and r["max_tbt"] <= s.tpot_slo * _TOL for r, s in zip(rows, seqs)]
    envelope_ok = [all(t <= (s.arrival + s.ttft_slo + i * s.tpot_slo) * _TOL for i, t in enumerate(s.token_times))
                   for s in seqs]
    missed = [False] * (n - len(seqs))
    return {"max_tbt_attainment": float(np.mean(max_tbt_ok + missed)),
            "envelope_attainment": float(np.mean(envelope_ok + missed)), "token_deadline_attainment": on_time / tokens}


def _group(all_seqs: list[Seq], weights: TdgWeights) -> dict[str, Any]:
    """Latencies over the served requests; attainments and TDG over all (a rejected one misses, gains 0)."""
    seqs = [s for s in all_seqs if not s.rejected]
    n = len(all_seqs)
    rows = [request_metrics(s) for s in seqs]
    ttft = np.array([r["ttft"] for r in rows])
    tpot = np.array([r["tpot"] for r in rows])
    ok_ttft, ok_tpot = _met(seqs, rows)
    gains = [tdg_gain(s.arrival, s.ttft_slo, s.tpot_slo, s.token_times, s.weight, weights) for s in seqs]
    # A rejected request's ideal gain is what its prompt and outputs would have earned (ProServe Eq. 3).
    ideal = [tdg_ideal(len(s.token_times) if not s.rejected else s.target_outputs, s.weight, weights)
             for s in all_seqs]
    return {"slo_attainment": float(np.sum(ok_ttft & ok_tpot) / n), "tdg_ratio": float(sum(gains) / sum(ideal)),
            "ttft_attainment": float(np.sum(ok_ttft) / n), "tpot_attainment": float(np.sum(ok_tpot) / n),
            "gain": float(sum(gains)), "ttft": ttft, "tpot": tpot, "rows": rows, "served": seqs}


def _engine_facts(result: InstanceResult, label: dict[str, Any], engine: InstanceEngine | None) -> dict[str, Any]:
    """What the row reads from the engine rather than the result: network bytes, pruned set, pool flips."""
    if engine is None:
        # A bare result: its P2D bytes are the network's bytes (no other stage moves any yet); pruned
        # unknown; flips known to be 0 only when the run had no pools.
        pools = label.get("pools")
        return {"network_bytes_by_stage": {"reuse": 0.0, "collective": 0.0, "p2d": result.p2d_bytes},
                "pruned": None, "flips_p2d": None if pools else 0, "flips_d2p": None if pools else 0,
                "pools_end": None}
    keys = engine.dispatcher.result_keys() if hasattr(engine.dispatcher, "result_keys") else {}
    return {"network_bytes_by_stage": {st: float(engine.fabric.delivered.get(st, 0.0)) for st in STAGE_NAMES},
            "pruned": pruned_count(engine.network.policy), "flips_p2d": keys.get("flips_p2d", 0),
            "flips_d2p": keys.get("flips_d2p", 0), "pools_end": keys.get("pools_end")}


def _instance(result: InstanceResult, rate: float, label: dict[str, Any],
              engine: InstanceEngine | None) -> dict[str, Any]:
    seqs = result.measured
    weights = TdgWeights(result.w_p, result.w_d)
    g = _group(seqs, weights)
    ttft, tpot = g["ttft"], g["tpot"]
    everyone, seqs = seqs, g["served"]  # rejected requests (admission control) count below as misses
    if not seqs:
        raise UserError("every measured request was rejected by admission control: no latency to report")
    span = max(max(s.token_times[-1] for s in seqs), max(s.arrival for s in everyone)) - \
        min(s.arrival for s in everyone)
    slos = np.array([s.ttft_slo for s in seqs])
    early = slos - ttft
    facts = _engine_facts(result, label, engine)
    stats = list(result.instances.values())  # per instance (a hand-made result may lack the step counts)
    out: dict[str, Any] = {
        "policy": label["policy"], "rate": rate, "slo_attainment": g["slo_attainment"],
        "ttft_mean": float(ttft.mean()), "ttft_p90": _pct(ttft, 90), "ttft_p99": _pct(ttft, 99),
        "cct_mean": None, "earliness_mean": float(np.mean(slos) - ttft.mean()), "requests": len(everyone),
        "cct_inflation": None, "remote_reuse_share": 0.0, "ttft_p50": _pct(ttft, 50), "slo_mean": float(np.mean(slos)),
        "earliness_nonneg_mean": float(np.mean(np.maximum(0.0, early))),
        "earliness_p10": _pct(early, 10), "earliness_p50": _pct(early, 50), "earliness_p90": _pct(early, 90),
        "reuse_share": 0.0, "nonoverlap_mean": 0.0, "bytes_by_stage": dict(facts["network_bytes_by_stage"]),
        "batches": sum(int(i["steps"]) for i in stats) if all("steps" in i for i in stats) else None,
        "wall_s": result.wall_s, "sim_time": result.sim_time, "network_events": result.network_events,
        "rejected": len(everyone) - len(seqs),
        "prefill": label.get("prefill"), "router": label.get("router"), "pools": label.get("pools"),
        "instances": label.get("instances"), "ttft_attainment": g["ttft_attainment"],
        "tpot_attainment": g["tpot_attainment"], **_token_envelopes(seqs, g["rows"], len(everyone)),
        **_decode_latencies(seqs, tpot),
        "tdg_gain": g["gain"], "tdg_ratio": g["tdg_ratio"],
        "tdg_w_p": result.w_p, "tdg_w_d": result.w_d,
        "effective_rps": g["slo_attainment"] * (len(everyone) - 1) / span if span > 0 else 0.0,
        "tpot_slo": float(np.mean([s.tpot_slo for s in seqs])),
        "busy_share": float(np.mean([i["busy_s"] for i in stats]) / result.sim_time)
        if result.sim_time > 0 else 0.0,
        **dict.fromkeys(_PRIORITY),
        "deferred": None,
        **facts,
    }
    if engine is not None and engine.config.prefill_units:  # prefill units: their batches' collectives and stalls
        states = [engine.unit_states[s.id] for s in everyone]
        out.update(_collective_keys(engine.batches, states))
        out["nonoverlap_mean"] = float(np.mean([s.stall for s in states]))
        out["deferred"] = sum(u.driver.deferrals for u in engine.units)
    for level, weight in _LEVELS.items():
        part = [s for s in everyone if s.weight == weight]
        if part and any(not s.rejected for s in part) and any(s.weight != 1.0 for s in everyone):
            pg = _group(part, weights)
            out[f"slo_attainment_{level}"] = pg["slo_attainment"]
            out[f"tdg_ratio_{level}"] = pg["tdg_ratio"]
            out[f"ttft_p99_{level}"] = _pct(pg["ttft"], 99)
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
