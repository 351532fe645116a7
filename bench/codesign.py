"""MFS and FlowPrefill together where MFS prunes: does pruning feed deferral? JSON lines, one per cell.

    python bench/codesign.py --presets fig12-conv,fig12-agent --physics faithful,paper --slo-scales 1.5,2,3 \
        --loads 0.8,1.0,1.2 --seeds 5 --servers 16 --requests 200 --warmup 100 --jobs 2 --out out/codesign

MFS prunes a request (Algorithm 1, ``drop_budget`` 1: ``prefill_driver.MfsPruning``) only when its
deadline is infeasible, so the coupling can matter only where infeasible requests exist: SLOs tight
against the request's idle TTFT (``--slo-scales``) or arrivals beyond what the units sustain
(``--loads``, fractions of the preset's capacity, ``experiment.rates_at``; above 1 is overload), under
each ``--physics``. Each cell runs, on the same requests per seed:

* ``mfs``: MFS alone (pruning on) over the MFS paper's run-to-completion FCFS batch former;
* ``flowprefill``: FlowPrefill (S-EDF, operator-level preemption) alone, FS on the network;
* ``blind``: FlowPrefill and pruning MFS side by side, the pruned set not passed on
  (``ServingConfig.prefill_coupling`` False);
* ``coupled``: the same with the pruned set reaching FlowPrefill, which defers pruned tasks.

Per cell and combination: SLO attainment (mean ± 95 % half-width over seeds), pruned requests and
deferred tasks (means); then the paired differences on the same requests: ``coupled - blind`` (what
the coupling itself adds) and ``coupled - best alone`` (the higher of ``mfs`` and ``flowprefill``),
each with its interval and whether it excludes 0. The decode units run decode batches
(``--decode steps``, ``ServingConfig.decode``'s default) and each combination also reports its mean
TPOT; ``--decode hold`` holds them instead and reports none. Finished runs go to
``OUT/runs.jsonl`` at once; a rerun skips them. Not a test: only wall time depends on the machine.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

from _campaign import positive_floats, run_campaign
from laxflow.sim.map.figures import mean_ci, paired_diff
from laxflow.sim.serving.experiment import PRESETS, RunSpec, rates_at

PRUNING = "laxflow.sim.serving.prefill_driver:MfsPruning"
COMBOS = {  # name -> (prefill scheduler or None: the legacy batch former, flow policy, coupling)
    "mfs": (None, PRUNING, True),
    "flowprefill": ("flowprefill", "fs", True),
    "blind": ("flowprefill", PRUNING, False),
    "coupled": ("flowprefill", PRUNING, True),
}


def cell_specs(preset_name: str, physics: str, scale: float, load: float, seed: int,
               a: argparse.Namespace) -> dict[str, RunSpec]:
    preset = PRESETS[preset_name]
    cfg = preset.config().with_physics(physics)
    cfg = replace(cfg, cluster=replace(cfg.cluster, servers=min(a.servers, preset.servers)), warmup=a.warmup,
                  slo_scale=scale, decode=a.decode)
    rate = rates_at(cfg.model, preset.workload, (load,), physics)[0]
    out = {}
    for name, (prefill, policy, coupling) in COMBOS.items():
        out[name] = RunSpec(replace(cfg, prefill_coupling=coupling), preset.workload, rate, policy, a.requests, seed,
                            prefill=prefill)
    return out


def _paired(a: list[float], b: list[float]) -> dict:
    mean, half, excludes = paired_diff(a, b)
    return {"mean": round(mean, 4), "ci95": round(half or 0.0, 4), "excludes_0": excludes}


def summary(key: tuple, rows: dict[tuple, dict], seeds: list[int], rate: float) -> dict:
    preset, physics, scale, load = key
    line: dict = {"preset": preset, "physics": physics, "slo_scale": scale, "load": load, "rate": rate,
                  "seeds": len(seeds), "combos": {}}
    if not seeds:
        return line
    att = {c: [rows[(key, s, c)]["slo_attainment"] for s in seeds] for c in COMBOS}
    for c in COMBOS:
        mine = [rows[(key, s, c)] for s in seeds]
        mean, half = mean_ci(att[c])
        line["combos"][c] = {
            "slo_attainment": round(mean, 4), "slo_attainment_ci95": round(half or 0.0, 4),
            "slo_attainment_seeds": [round(x, 4) for x in att[c]],
            "pruned": round(sum(r.get("pruned") or 0 for r in mine) / len(mine), 2),
            "deferred": round(sum(r.get("deferred") or 0 for r in mine) / len(mine), 2),
        }
        if all(r.get("tpot_mean") is not None for r in mine):  # --decode steps
            line["combos"][c]["tpot_mean_ms"] = round(1e3 * sum(r["tpot_mean"] for r in mine) / len(mine), 3)
    best = max(("mfs", "flowprefill"), key=lambda c: sum(att[c]))  # ties: mfs
    line["best_alone"] = best
    line["coupled_minus_blind"] = _paired(att["coupled"], att["blind"])
    line["coupled_minus_best_alone"] = _paired(att["coupled"], att[best])
    return line


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--presets", default="fig12-conv,fig12-agent",
                    help="MFS presets whose prefill units are one attention group (FlowPrefill's unit: Llama3-8B "
                    "TP4 SP4 here; an MoE unit with attention-DP ranks is refused)")
    ap.add_argument("--slo-scales", default="1.5,2,3")
    ap.add_argument("--loads", default="0.8,1.0,1.2")
    ap.add_argument("--physics", default="faithful",
                    help="comma-separated: faithful, paper or field=value;... (config.parse_physics)")
    ap.add_argument("--decode", default="steps", choices=("hold", "steps"),
                    help="steps (default): the decode units run decode batches (TPOT per combination); hold: a "
                         "decode unit held output tokens x 30 ms, no TPOT")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--servers", type=int, default=16)
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", default="out/codesign")
    a = ap.parse_args(argv)
    presets = [p for p in a.presets.split(",") if p]
    from laxflow.sim.serving.plan import ModelRunner

    for p in presets:
        if p not in PRESETS:
            ap.error(f"--presets: unknown {p!r}")
        ranks = ModelRunner(PRESETS[p].model, PRESETS[p].deployment).attn_dp
        if ranks != 1:
            ap.error(f"--presets: {p!r} has {ranks} attention-DP ranks per prefill unit; FlowPrefill drives a unit "
                     "of one attention group (fig12-conv, fig12-agent)")
    scales, loads = positive_floats(a.slo_scales, "--slo-scales"), positive_floats(a.loads, "--loads")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    cells = [(p, ph, s, ld) for p in presets for ph in a.physics.split(",") for s in scales for ld in loads]

    def todo_for(seed: int) -> list[tuple[tuple, RunSpec]]:
        return [((cell, seed, name, a.decode), spec)
                for cell in cells for name, spec in cell_specs(*cell, seed, a).items()]

    def record(key: tuple, spec: RunSpec, row: dict) -> dict:
        cell, seed, name, decode = key
        keep = {k: row.get(k) for k in ("slo_attainment", "pruned", "deferred", "ttft_mean", "tpot_mean", "wall_s")}
        return {**keep, "cell": list(cell), "seed": seed, "combo": name, "decode": decode, "rate": spec.rate}

    # A run's key names its decode (rows recorded before decode batches were the default say none: hold),
    # so a resumed folder never mixes the two.
    done = run_campaign(out / "runs.jsonl", range(a.seeds), todo_for, record,
                        lambda r: (tuple(r["cell"]), r["seed"], r["combo"], r.get("decode", "hold")), a.jobs)
    done = {k[:3]: row for k, row in done.items() if k[3] == a.decode}
    for cell in cells:
        seeds = sorted({s for (c, s, _) in done if c == cell and all((cell, s, n) in done for n in COMBOS)})
        rate = cell_specs(*cell, 0, a)["mfs"].rate
        print(json.dumps(summary(cell, done, seeds, rate)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
