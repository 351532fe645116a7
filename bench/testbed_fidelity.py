"""Fidelity: the contention scenario predicted by the simulator model vs measured on the testbed.

    python bench/testbed_fidelity.py [--requests N] [--repeat R] [--modes off,static,on]
                                     [--interarrival-ms MS] [--json] [--sim-only]

As root, per repeat, on one fabric (``laxflow testbed`` namespaces, torn
down after): the measured low-load TTFT (the SLO base, as ``testbed run``),
the calibration (:func:`laxflow.testbed.calibrate.calibrate`: each stage's
message alone, the compute sleep), then the modes as ``testbed run`` runs
them (:func:`laxflow.testbed.scenario.run_mode`, captured). Then the model
(:mod:`laxflow.testbed.sim_model`) predicts each mode with parameters that
were all measured: the calibration's per-message overheads and sendall durations, the
mode's own compute sleeps' real mean, and (``on``) the permit latency from
the on run's submit -> permit waits; each parameter's source is in the
JSON. Predicted and measured CCT and TTFT side by side, the relative error
(measured / predicted - 1) and whether it is within 20 %. Nothing is fitted:
a parameter is never chosen to make an error small.

How well a TTFT can be predicted depends on the load. Per mode the JSON
also gives each side's ``ttft_slope_ms_per_request`` (least squares over
the measured requests: how much each request waits longer than the one
before; > 0 where requests arrive faster than a rank finishes them, so a
queue builds) and ``ttft_band_wire_5pct``: the model's TTFT with every
transfer 5 % faster and 5 % slower (the line rate x 1.05 and x 0.95, the
rest as measured). Near saturation a few percent of wire time moves TTFT
by tens of percent: a measured TTFT inside the band is within a 5 % error
of the wire model. ``--interarrival-ms`` runs the scenario at another load
(default: the scenario's 200 ms, the contention point).

Stage 2 defaults to the workers' TCP exchange (``--collective tcp``), which
is what the model models (not Gloo's ring of messages). Without root, or
with ``--sim-only``, only the model runs (its parameters then all 0 /
nominal). Timing is the machine's: the JSON carries the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import threading
from dataclasses import asdict, replace
from typing import Any

from laxflow.errors import UserError
from laxflow.testbed.fabric import parse_rate
from laxflow.testbed.scenario import MODES, ScenarioConfig
from laxflow.testbed.decision_trace import summarize as summarize_decisions, summarize_holds
from laxflow.testbed.sim_model import ModelParams, low_load_ttft, predict

METRICS = ("cct_mean", "ttft_mean")
SEEDS = 8


def params_json(p: ModelParams) -> dict[str, Any]:
    out = asdict(p)
    for k in ("overhead_s", "permit_s", "sendall_s"):
        out[k[:-2] + "_ms"] = {str(s): round(v * 1000, 3) for s, v in out.pop(k).items()}
    out["skb_bytes"] = {str(s): round(v) for s, v in out["skb_bytes"].items()}
    samples = out.pop("compute_samples_s")  # their spread, not every value
    out["compute_samples_ms"] = _spread([1000 * x for x in samples]) if samples else None
    out["overhead_samples_ms"] = {str(s): _spread([1000 * x for x in v])
                                  for s, v in (out.pop("overhead_samples_s") or {}).items()}
    out["compute_ms"] = None if p.compute_s is None else round(p.compute_s * 1000, 3)
    del out["compute_s"]
    return out


class CwndSampler:
    """During one mode's run: every ``PERIOD_S``, the TCP congestion window of the scenario's sending sockets.

    ``ss -N <namespace> -ti`` (root; one process per host and sample, ~10 per
    second): stage 1 the KV store's sockets on h2 (port 7001), stage 2 and 3
    the prefill ranks' all_to_all and decode sockets on h0 and h1 (peer ports
    7100-7101 and 7002). A sample counts when the socket has unacknowledged
    data (it was sending). Started and stopped by :func:`one_run` around
    :func:`laxflow.testbed.scenario.run_mode`, on its own thread.
    """

    PERIOD_S = 0.1

    def __init__(self, tb: Any) -> None:
        self.tb = tb
        self.cwnd: dict[int, list[int]] = {1: [], 2: [], 3: []}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "CwndSampler":
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()

    def _run(self) -> None:
        while not self.stop.wait(self.PERIOD_S):
            for host in (0, 1, 2):
                out = subprocess.run(["ss", "-N", self.tb.netns(host), "-tinH", "state", "established"],
                                     capture_output=True, text=True).stdout.splitlines()
                for head, info in zip(out[::2], out[1::2]):
                    cols = head.split()
                    stage = _stage_of(host, cols[2].rsplit(":", 1)[-1], cols[3].rsplit(":", 1)[-1])
                    cwnd, unacked = re.search(r"cwnd:(\d+)", info), re.search(r"unacked:(\d+)", info)
                    if stage and cwnd and unacked:
                        self.cwnd[stage].append(int(cwnd.group(1)))

    def medians(self) -> dict[str, float]:
        return {str(k): statistics.median(v) for k, v in self.cwnd.items() if v}


def _stage_of(host: int, local: str, peer: str) -> int | None:
    if host == 2:
        return 1 if local == "7001" else None
    return {"7002": 3, "7100": 2, "7101": 2}.get(peer)


def mode_params(base: ModelParams, mode: str, measured: dict[str, Any]) -> ModelParams:
    """The calibration's parameters plus what the mode's own run measured (compute sleeps, TCP windows; on:
    permit waits)."""
    p = replace(base, compute_s=measured[mode]["compute_ms_real"] / 1000,
                compute_samples_s=tuple(x / 1000 for x in measured[mode].get("compute_ms_samples", ())),
                sources=dict(base.sources, compute_s=f"the {mode} run: its ranks' compute sleeps, real mean (seeded: "
                                                     "each sleep drawn from them)"))
    cwnd = measured[mode].get("cwnd_segments", {})
    if set(cwnd) == {"1", "2", "3"}:
        p = replace(p, window_segments={int(k): v for k, v in cwnd.items()},
                    sources=dict(p.sources, window_segments=f"the {mode} run: median TCP cwnd of the sending sockets "
                                                            "(ss -ti every 0.1 s, samples with data unacknowledged)"))
    if mode == "on":
        p = p.with_permits(measured["on"]["permit_wait_ms_prefill"],
                           "the on run's submit -> permit waits (workers' permit_wait_s): stage 1 for reads "
                           "(eth0-rx never holds), stage 2 for the all_to_all and the KV writes (same port; the "
                           "model's daemon adds any holding)")
    return p


def ttft_slope_ms(ttfts: list[float]) -> float | None:
    """Least-squares slope of TTFT over request order, ms per request (None: fewer than 2)."""
    if len(ttfts) < 2:
        return None
    return 1000 * statistics.linear_regression(range(len(ttfts)), ttfts).slope


def wire_scaled(cfg: ScenarioConfig, factor: float) -> ScenarioConfig:
    """``cfg`` with its line rate times ``factor`` (the model's wire that much faster or slower)."""
    return replace(cfg, rate=f"{parse_rate(cfg.rate) * factor / 1000:.3f}kbit")


def _spread(xs: list[float]) -> dict[str, float]:
    return {"mean": statistics.fmean(xs), "min": min(xs), "max": max(xs)}


def one_run(cfg: ScenarioConfig, reps: int | None = None, keep_decisions: bool = False,
            seeds: int = SEEDS) -> dict[str, Any]:
    """One fabric: measured low-load TTFT, calibration (``reps`` probes per stage; None: its default), the modes.

    ``keep_decisions``: also every KV write's decision record, both sides (else their summary only).
    ``seeds``: model runs with the measured jitter drawn per seed (``predicted[mode]["seeded"]``).
    """
    from laxflow.testbed.calibrate import REPS, calibrate
    from laxflow.testbed.fabric import FabricConfig, Testbed
    from laxflow.testbed.scenario import low_load_ttft as measured_low_load
    from laxflow.testbed.scenario import run_mode

    cfg = replace(cfg, trace_decisions=True)  # the daemons' KV-write decisions, compared with the model's
    load = os.getloadavg()
    with Testbed(FabricConfig(hosts=4, rate=cfg.rate, name=cfg.name)) as tb:
        low = measured_low_load(tb, cfg)
        slo = cfg.slo_factor * low
        base, calib = calibrate(tb, cfg, reps or REPS)
        measured = {}
        for mode in cfg.modes:
            with CwndSampler(tb) as cwnd:
                measured[mode] = run_mode(tb, cfg, mode, capture=True, slo=slo)
            measured[mode]["cwnd_segments"] = cwnd.medians()
    out: dict[str, Any] = {"loadavg_start": load, "loadavg_end": os.getloadavg(), "slo_s": slo,
                           "calibration": calib, "low_load_ttft": {"measured": low}}
    # the off run's parameters (its TCP windows, compute): the low-load run is mode off too
    out["low_load_ttft"]["predicted"] = low_load_ttft(cfg, mode_params(base, "off", measured))
    out["params"], out["predicted"], out["measured"], out["rel_error"] = {}, {}, {}, {}
    for mode in cfg.modes:
        p = mode_params(base, mode, measured)
        pred = predict(cfg, mode, p, slo=slo, trace=mode == "on")  # both sides judge the testbed's SLO
        if mode == "on":
            both = {"predicted": pred.pop("decisions"), "measured": measured["on"].pop("decisions", [])}
            out["decisions"] = {k: summarize_decisions(v) for k, v in both.items()}
            out["decisions"]["a2a_holds"] = {"predicted": summarize_holds(pred.pop("a2a_holds", None) or []),
                                             "measured": summarize_holds(measured["on"].pop("a2a_holds", None) or [])}
            if keep_decisions:
                out["decisions"]["records"] = both
        band = [predict(wire_scaled(cfg, f), mode, p, slo=slo)["ttft_mean"] for f in (1.05, 0.95)]  # [faster, slower]
        pred["ttft_band_wire_5pct"] = band
        pred["ttft_per_request"] = [round(t, 4) for t in pred["ttft_per_request"]]
        pred["ttft_slope_ms_per_request"] = ttft_slope_ms(pred["ttft_per_request"])  # (of the values the JSON holds)
        out["params"][mode] = params_json(p)
        # the testbed's jitter: each compute sleep from the run's, each message's overhead from the probes'
        seeded = [predict(cfg, mode, p, slo=slo, seed=k) for k in range(seeds)]
        pred["seeded"] = {k: _spread([r[k] for r in seeded]) for k in METRICS}
        pred["seeded"]["seeds"] = seeds
        out["predicted"][mode] = pred
        keep = ("cct_mean", "ttft_mean", "slo_attainment", "cct_median", "cct_p99", "compute_ms_real", "permit_wait_ms_prefill",
                "cwnd_segments", "timeline_ms",
                "permit_dscp_prefill", "dscp_seen", "ttft_per_request")
        out["measured"][mode] = {k: measured[mode][k] for k in keep if k in measured[mode]}
        out["measured"][mode]["ttft_slope_ms_per_request"] = ttft_slope_ms(measured[mode].get("ttft_per_request", []))
        out["measured"][mode]["ttft_in_wire_band"] = min(band) <= measured[mode]["ttft_mean"] <= max(band)
        out["rel_error"][mode] = {k: measured[mode][k] / pred[k] - 1 for k in METRICS}
    out["within_20pct"] = {m: {k: abs(e) <= 0.2 for k, e in errs.items()} for m, errs in out["rel_error"].items()}
    return out


def summarize(runs: list[dict[str, Any]], modes: tuple[str, ...]) -> dict[str, Any]:
    """Per mode and metric: predicted, measured and error over the repeats (mean, min, max)."""
    return {mode: {k: {"predicted": _spread([r["predicted"][mode][k] for r in runs]),
                       "predicted_seeded": _spread([r["predicted"][mode]["seeded"][k]["mean"] for r in runs]),
                       "measured": _spread([r["measured"][mode][k] for r in runs]),
                       "rel_error": _spread([r["rel_error"][mode][k] for r in runs]),
                       "rel_error_seeded": _spread([r["measured"][mode][k] / r["predicted"][mode]["seeded"][k]["mean"] - 1
                                                    for r in runs]),
                       "within_20pct_runs": sum(r["within_20pct"][mode][k] for r in runs)}
                   for k in METRICS}
            | {"ttft_slope_ms_per_request": {side: _spread([r[side][mode]["ttft_slope_ms_per_request"] for r in runs])
                                             for side in ("predicted", "measured")},
               "ttft_in_wire_band_runs": sum(r["measured"][mode]["ttft_in_wire_band"] for r in runs)}
            for mode in modes}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--name", default=f"fid{os.getpid() % 100000}")
    ap.add_argument("--collective", default="tcp", help="stage 2: tcp (default, what the model models), gloo, auto")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--interarrival-ms", type=float, default=None,
                    help="time between requests (default: the scenario's 200 ms, the contention point)")
    ap.add_argument("--sim-only", action="store_true")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--decisions", action="store_true", help="keep every KV write's decision record (both sides)")
    args = ap.parse_args()
    extra = {} if args.interarrival_ms is None else {"interarrival_ms": args.interarrival_ms}
    cfg = ScenarioConfig(name=args.name, requests=args.requests, collective=args.collective,
                         modes=tuple(args.modes.split(",")), **extra)
    out: dict[str, Any] = {"config": asdict(cfg), "machine": f"{os.cpu_count()} CPUs"}
    if args.sim_only or os.geteuid() != 0:
        out["why_not_measured"] = "--sim-only" if args.sim_only else "the testbed needs root"
        out["predicted"] = {m: predict(cfg, m) for m in cfg.modes}
    else:
        out["runs"], out["failed_runs"] = [], []
        for _ in range(args.repeat):
            try:
                out["runs"].append(one_run(cfg, keep_decisions=args.decisions))
            except UserError as exc:  # a run that did not finish is reported, the others still count
                out["failed_runs"].append(str(exc))
        if not out["runs"]:
            raise SystemExit(f"testbed_fidelity: no run finished: {out['failed_runs']}")
        out["summary"] = summarize(out["runs"], cfg.modes)
    if args.json:
        json.dump(out, sys.stdout)
        print()
        return
    if "runs" not in out:
        for m, p in out["predicted"].items():
            print(f"{m:>6} predicted CCT {p['cct_mean'] * 1000:6.1f} ms  TTFT {p['ttft_mean'] * 1000:6.1f} ms")
        print(f"(measured: not run, {out['why_not_measured']})")
        return
    print(f"{'mode':>6} {'metric':>9} {'predicted':>10} {'measured':>10} {'error':>7}  (mean of {args.repeat}; "
          f"error min..max)")
    for m, row in out["summary"].items():
        for k in METRICS:
            s, e = row[k], row[k]["rel_error"]
            print(f"{m:>6} {k:>9} {s['predicted']['mean'] * 1000:8.1f}ms {s['measured']['mean'] * 1000:8.1f}ms "
                  f"{e['mean'] * 100:+6.0f}%  ({e['min'] * 100:+.0f}..{e['max'] * 100:+.0f} %)")


if __name__ == "__main__":
    main()
