"""Render the results pages from ``bench/results/*.json`` (called by ``bench/results.py``; not a bench).

Every laxflow number on a page is read from a bench's JSON; the papers'
numbers and the reasons for each gap are the text of the claim tables below
(:data:`PAPERS`). A claim whose bench has no JSON, or a JSON with an error,
renders as "not run in this regeneration" with the command that makes it;
a claim whose key is missing from a JSON renders as "not in this run's JSON".
Nothing here computes a number that is not derived from a JSON value (means,
ratios and 95 % Student-t half-widths over the per-seed values a bench kept).
"""

from __future__ import annotations

import datetime as dt
import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from results_benches import BENCHES  # bench/ is on the path (a script's folder, or the tests' conftest)

# Two-sided 95 % Student-t quantiles by degrees of freedom (1-30); above 30, 1.96 is within 4 %.
_T95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
        2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


class Missing(Exception):
    """A value a claim needs is not in its bench's JSON."""


def ci95(values: list[float]) -> float | None:
    """Half-width of the 95 % Student-t interval of the mean; None for fewer than two values."""
    vals = [float(v) for v in values if v is not None]
    if len(vals) < 2:
        return None
    df = len(vals) - 1
    t = _T95[df - 1] if df <= len(_T95) else 1.96
    return t * statistics.stdev(vals) / math.sqrt(len(vals))


def get(doc: Any, path: str) -> Any:
    """``doc`` at a dotted path (``points.fig13.policies.mfs.slo_attainment``); keys may contain '@'."""
    cur = doc
    for part in path.split("."):
        if isinstance(cur, dict) and part in cur:
            cur = cur[part]
        elif isinstance(cur, list) and part.isdigit() and int(part) < len(cur):
            cur = cur[int(part)]
        else:
            raise Missing(path)
    if cur is None:
        raise Missing(path)
    return cur


def num(x: float, digits: int = 3) -> str:
    """A number with ``digits`` significant digits, thousands separated."""
    if x == 0:
        return "0"
    mag = math.floor(math.log10(abs(x)))
    decimals = max(0, digits - 1 - mag)
    return f"{x:,.{decimals}f}"


def mean_ci(values: list[float], digits: int = 3, unit: str = "") -> str:
    """``mean ± half-width (n seeds: a, b, c)`` of per-seed values."""
    vals = [float(v) for v in values]
    if not vals:
        raise Missing("per-seed values")
    m = statistics.fmean(vals)
    h = ci95(vals)
    seeds = ", ".join(num(v, digits) for v in vals)
    if h is None:
        return f"{num(m, digits)}{unit} (1 seed, no interval)"
    return f"{num(m, digits)}{unit} ± {num(h, 2)} ({len(vals)} seeds: {seeds})"


def pct(x: float) -> str:
    return f"{x * 100:+.1f} %"


# ----------------------------------------------------------------- records


@dataclass(frozen=True)
class Record:
    """One bench's JSON as kept by ``bench/results.py`` (or its absence)."""

    name: str
    doc: dict | None

    @property
    def ok(self) -> bool:
        return self.doc is not None and "result" in self.doc and "error" not in self.doc

    @property
    def result(self) -> Any:
        return self.doc["result"]


def load(results: Path, names: list[str]) -> dict[str, Record]:
    """Every named bench's record; a missing or unreadable file is a record without a document."""
    out = {}
    for name in names:
        path = results / f"{name}.json"
        try:
            doc = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            doc = None
        out[name] = Record(name, doc if isinstance(doc, dict) else None)
    return out


def machine_text(doc: dict) -> str:
    m = doc.get("machine") or {}
    if isinstance(m, str):
        return m
    return f"{m.get('cpu', '?')}, {m.get('cores', '?')} cores, Python {m.get('python', '?')}, kernel {m.get('kernel', '?')}"


def command_of(name: str) -> str:
    b = BENCHES.get(name)
    return "python " + " ".join(b.args) if b else f"(no bench named {name})"


def not_run(rec: Record) -> str:
    """The cell for a claim whose bench did not produce a result this regeneration."""
    why = f"failed: {rec.doc['error']}" if rec.doc and "error" in rec.doc else "not run in this regeneration"
    return f"*{why}*: `python bench/results.py --only {rec.name}` (command in the runs table above)"


def header(title: str, records: list[Record], now: str) -> list[str]:
    """The page's title, the do-not-edit line and the runs it draws on."""
    machines = sorted({machine_text(r.doc) for r in records if r.ok})
    machine = machines[0] if len(machines) == 1 else ("several machines (see the runs below)" if machines
                                                       else "no machine (no bench of this page ran)")
    lines = [f"# {title}", "",
             f"> Generated by `make results` on {now} on {machine}; do not edit "
             "(edit `bench/results_render.py` and run `python bench/results.py --render-only`).", ""]
    lines += ["| bench | JSON | command | date | commit | machine | wall time | load average (start / end) |",
              "|---|---|---|---|---|---|---|---|"]
    for r in records:
        if r.ok:
            d = r.doc
            lines.append(f"| `{r.name}` | `bench/results/{r.name}.json` | `{d['command']}` | {d['date']} | `{d['commit'][:12]}` | "
                         f"{machine_text(d)} | {d.get('elapsed_s', '?')} s" + (f" ({d['resumed']})" if d.get("resumed") else "")
                         + f" | {d.get('load_avg_start', '?')} / {d.get('load_avg_end', '?')} |")
        else:
            why = f"failed: {r.doc['error']}" if r.doc and "error" in r.doc else "not run in this regeneration"
            lines.append(f"| `{r.name}` | - | `{command_of(r.name)}` | *{why}* | | | | |")
    lines.append("")
    return lines


# ----------------------------------------------------------------- claims


@dataclass(frozen=True)
class Claim:
    """One row: a paper's figure or claim, the paper's value, laxflow's (from a bench's JSON), the reason for the gap."""

    what: str
    paper: str
    bench: str
    value: Callable[[Any], str]
    reason: str


def claim_rows(claims: list[Claim], recs: dict[str, Record]) -> list[str]:
    lines = ["| claim | paper | laxflow (mean ± 95 % half-width over seeds) | why they differ |", "|---|---|---|---|"]
    for c in claims:
        rec = recs[c.bench]
        if not rec.ok:
            cell = not_run(rec)
        else:
            try:
                cell = c.value(rec.result)
            except (Missing, KeyError, TypeError, ValueError, ZeroDivisionError, statistics.StatisticsError) as exc:
                cell = f"*not in this run's JSON ({exc})*"
        lines.append(f"| {c.what} | {c.paper} | {cell} | {c.reason} |")
    lines.append("")
    return lines


# ---- MFS (paper 001) on the serving simulator: bench/sim_claims.py


def _point(res: dict, preset: str) -> dict:
    return get(res, f"points.{preset}")


def mfs_over_best(preset: str) -> Callable[[dict], str]:
    def value(res: dict) -> str:
        p = _point(res, preset)
        pol, best = get(p, "policies"), get(p, "best_baseline")
        m, b = pol["mfs"], pol[best]
        ratios = [x / y for x, y in zip(m["slo_attainment_seeds"], b["slo_attainment_seeds"]) if y > 0]
        d = get(p, "paired_diff")
        tie = "a tie (inside both intervals)" if p.get("tie") else "outside the intervals"
        return (f"**{num(get(p, 'mfs_over_best'))}x** over {best}, {tie}: MFS {mean_ci(m['slo_attainment_seeds'])}, "
                f"{best} {mean_ci(b['slo_attainment_seeds'])}; per-seed ratio {mean_ci(ratios)}; paired MFS − {best} "
                f"{d['mean']:+.3f} ± {d['ci95']:.3f}{' (excludes 0)' if d.get('excludes_0') else ''}; "
                f"at {p['rate']} req/s/GPU, {p['servers']} servers, {p['warmup']} + {p['requests']} requests")
    return value


def mfs_vs_fs(preset: str, key: str) -> Callable[[dict], str]:
    def value(res: dict) -> str:
        p = _point(res, preset)
        return (f"{pct(get(p, f'mfs_vs_fs.{key}'))} (ratio of the means over {p['seeds']} seeds; "
                "per-seed values of this metric are not kept, so no interval)")
    return value


def cct_inflation(preset: str) -> Callable[[dict], str]:
    def value(res: dict) -> str:
        pol = get(_point(res, preset), "policies")
        return "CCT / idle-fabric CCT: " + ", ".join(f"{k} {num(v['cct_inflation'])}" for k, v in pol.items())
    return value


MFS_REASON_CONTENTION = (
    "little contention to remove on the MoE presets: hierarchical EP (once per token and remote server) moves "
    "several times fewer inter-node bytes than pair-wise dispatch, per-QP fairness already protects a wide collective against a lone KV flow, and the A100 "
    "roofline at 200 Gbit/s keeps the all-to-alls a small share of a layer; at 0.8 of capacity queueing, which no "
    "network order changes, sets most of the attainment")
MFS_REASON_AGENT = (
    "the paper credits its agent gains to one-to-many stage-1/2 contention on victim units; here stage-1 (reuse) "
    "bytes are a few per cent of the network, because realized reuse stays well below the workload's 0.65 (follow-ups "
    "reach a unit before their parent's KV is stored at this load and run length); " + MFS_REASON_CONTENTION.split(";")[0])
MFS_REASON_SCALE = "reduced scale for a 2-core box: 16 servers and 100 + 200 requests per run (paper: 256 servers, 512 + 1024)"

MFS_CLAIMS = [
    Claim("Fig. 10a: Mixtral-8x22B, QwenA conversation, MFS over the best baseline, high load (`fig10-mixtral`)",
          "1.4-1.8x", "sim_claims", mfs_over_best("fig10-mixtral"), MFS_REASON_CONTENTION + "; " + MFS_REASON_SCALE),
    Claim("Fig. 11: Mixtral-8x22B, QwenB agent, over the best baseline (`fig11-mixtral`)", "1.4-1.7x", "sim_claims",
          mfs_over_best("fig11-mixtral"), MFS_REASON_AGENT),
    Claim("Fig. 11: DBRX, QwenB agent, over the best baseline (`fig11-dbrx`)", "2.0x", "sim_claims",
          mfs_over_best("fig11-dbrx"), MFS_REASON_AGENT),
    Claim("Fig. 13: DBRX, QwenA conversation, over the best baseline (`fig13`)", "2.2x", "sim_claims",
          mfs_over_best("fig13"), MFS_REASON_CONTENTION),
    Claim("Fig. 13: CCT vs FS (`fig13`)", "-52 %", "sim_claims", mfs_vs_fs("fig13", "cct_mean"),
          "FS's all-to-alls run close to their idle-fabric time here (CCT inflation in the table below), so the cut MFS "
          "can make is bounded by that inflation; the paper's Fig. 5 shows 1.8x CCT under contention"),
    Claim("Fig. 13: non-negative earliness vs FS (`fig13`)", "-42 %", "sim_claims",
          mfs_vs_fs("fig13", "nonneg_earliness"),
          "most requests already miss at this load (mean TTFT above the mean SLO), so earliness barely moves"),
    Claim("Fig. 9: testbed Mixtral-8x7B TP1 EP8, QwenA, mean TTFT vs FS (`testbed-qwenA`)", "-20.7 %", "sim_claims",
          mfs_vs_fs("testbed-qwenA", "ttft_mean"),
          "the paper runs 1 req/s/GPU on its testbed; ours runs at 0.8 of our capacity model's rate for it (the rate "
          "below), lower; the all-to-alls are a smaller share of a layer here than the ~60 % the paper's Fig. 5 implies"),
    Claim("Fig. 9: testbed, CCT vs FS (`testbed-qwenA`)", "-31.9 %", "sim_claims", mfs_vs_fs("testbed-qwenA", "cct_mean"),
          "as above: less of a layer is communication, so less CCT to cut"),
    Claim("Fig. 9: testbed, over the best baseline (`testbed-qwenA`)", "not given as a ratio", "sim_claims",
          mfs_over_best("testbed-qwenA"), "as above"),
    Claim("Fig. 12b: Llama3-8B TP4 SP4, Mooncake agent, over the best baseline (`fig12-agent`)", "1.4-1.9x",
          "sim_claims", mfs_over_best("fig12-agent"),
          "the one point with real contention (see the CCT inflation below); realized reuse stays below the workload's "
          "target, so the victim-unit contention the paper credits arises less; " + MFS_REASON_SCALE),
]


# ---- the same figures under the MFS paper's physics (bench sim_claims_paper: --physics paper)

PHYSICS_TEXT = (
    "`--physics paper` (`ServingConfig.with_physics`, `laxflow sim serve --physics paper`) switches the four modeling "
    "choices the reasons above name, for every policy alike, each also a flag of its own: pair-wise EP dispatch, "
    "every token straight to each of its top-k experts' GPUs (`--ep-comm pairwise`; the paper's simulator sizes "
    "dispatch per token and expert, §6.1, §6.3); fair sharing per flow group, a collective counting as one flow at a "
    "link (`--fairness group`; §6.3 Baselines, Fig. 6b); compute scaled so that a layer's blocking "
    "collectives are 60 % of it on an idle fabric (`--comm-share 0.6`; §2.2: collectives are 40-60 % of end-to-end "
    "latency, Fig. 5: CCT 1.8x gives TTFT about +50 %, so about 0.5 / 0.8 of a layer was collective); and the "
    "workload's reuse realized, a prompt's blocks reusable from its arrival (`--reuse-from routed`; §6.1, §6.3 "
    "reuse ratios). The paper gives no per-layer latencies in its text, so the compute share is inferred from Fig. 5, "
    "not read from a profile. Each point runs at 0.8 of the capacity under its own physics (the same method as "
    "`experiment.CAPACITY`), so both columns are equally loaded; the map's verdict applies the rule of `laxflow sim "
    "map` (paired MFS minus the best baseline; it pays where the 95 % interval excludes 0) to each column.")


def _margin_cell(res: dict, preset: str) -> str:
    p = _point(res, preset)
    pol, best = get(p, "policies"), get(p, "best_baseline")
    m, b, d = pol["mfs"], pol[best], get(p, "paired_diff")
    return (f"**{num(get(p, 'mfs_over_best'))}x** over {best} (MFS {num(m['slo_attainment'])} ± "
            f"{num(m['slo_attainment_ci95'], 2)}, {best} {num(b['slo_attainment'])} ± {num(b['slo_attainment_ci95'], 2)}; "
            f"CCT inflation FS {num(pol['fs']['cct_inflation'])}, MFS {num(m['cct_inflation'])}; {p['seeds']} seeds, "
            f"{p['rate']} req/s/GPU)")


def _verdict(res: dict, preset: str) -> str:
    d = get(_point(res, preset), "paired_diff")
    word = "pays" if d.get("excludes_0") and d["mean"] > 0 else ("loses" if d.get("excludes_0") else "tie")
    return f"{word} ({d['mean']:+.3f} ± {d['ci95']:.3f})"


def _fs_cell(res: dict, preset: str, key: str) -> str:
    p = _point(res, preset)
    return f"{pct(get(p, f'mfs_vs_fs.{key}'))} ({p['seeds']} seeds, ratio of the means)"


@dataclass(frozen=True)
class PhysicsClaim:
    what: str
    paper: str
    preset: str
    key: str | None = None  # None: MFS over the best baseline; else mfs_vs_fs.<key>


PHYSICS_CLAIMS = [
    PhysicsClaim("Fig. 10a: Mixtral-8x22B, QwenA conversation, over the best baseline", "1.4-1.8x", "fig10-mixtral"),
    PhysicsClaim("Fig. 10b: DBRX, QwenA conversation, over the best baseline", "up to 2.4x", "fig10-dbrx"),
    PhysicsClaim("Fig. 11: Mixtral-8x22B, QwenB agent, over the best baseline", "1.4-1.7x", "fig11-mixtral"),
    PhysicsClaim("Fig. 11: DBRX, QwenB agent, over the best baseline", "2.0x", "fig11-dbrx"),
    PhysicsClaim("Fig. 12a: Llama3-8B TP4 SP4, Mooncake conversation, over Karuna", "1.3-1.6x", "fig12-conv"),
    PhysicsClaim("Fig. 12b: Llama3-8B TP4 SP4, Mooncake agent, over Karuna", "1.4-1.9x", "fig12-agent"),
    PhysicsClaim("Fig. 13: DBRX, QwenA, over the best baseline", "2.2x", "fig13"),
    PhysicsClaim("Fig. 13a: CCT vs FS", "-52 %", "fig13", "cct_mean"),
    PhysicsClaim("Fig. 13b: non-negative earliness vs FS", "-42 %", "fig13", "nonneg_earliness"),
]


def physics_rows(recs: dict[str, Record]) -> list[str]:
    """Per figure: the paper, laxflow faithful, laxflow under the paper's physics, and the map's verdict of each."""
    lines = ["| figure (preset) | paper | laxflow, faithful physics | laxflow, the paper's physics | map's verdict: "
             "faithful / paper's physics |", "|---|---|---|---|---|"]
    for c in PHYSICS_CLAIMS:
        cells, verdicts = [], []
        for name in ("sim_claims", "sim_claims_paper"):
            rec = recs[name]
            if not rec.ok:
                cells.append(not_run(rec))
                verdicts.append("-")
                continue
            try:
                cells.append(_margin_cell(rec.result, c.preset) if c.key is None else
                             _fs_cell(rec.result, c.preset, c.key))
                verdicts.append(_verdict(rec.result, c.preset) if c.key is None else "-")
            except (Missing, KeyError, TypeError, ValueError, ZeroDivisionError) as exc:
                cells.append(f"*not in this run's JSON ({exc})*")
                verdicts.append("-")
        lines.append(f"| {c.what} (`{c.preset}`) | {c.paper} | {cells[0]} | {cells[1]} | {' / '.join(verdicts)} |")
    lines.append("")
    return lines


def _lines(rec: Record) -> list[dict]:
    res = rec.result
    return get(res, "lines") if isinstance(res, dict) and "lines" in res else [res]


def _paired_text(d: dict) -> str:
    """``mean ± half-width`` of a paired difference, `` *`` where the interval excludes 0."""
    return f"{d['mean']:+.3f} ± {d['ci95']:.3f}{' *' if d.get('excludes_0') else ''}"


def _diff_cell(line: dict) -> str:
    return (f"{_paired_text(get(line, 'paired_diff'))} vs {get(line, 'best_baseline')} "
            f"(MFS {num(line['policies']['mfs']['slo_attainment'])}, {num(get(line, 'mfs_over_best'))}x)")


def physics_sweep_rows(recs: dict[str, Record]) -> list[str]:
    """Per figure and load fraction: MFS minus the best baseline (paired) under each physics."""
    rec = recs["sim_physics_sweep"]
    if not rec.ok:
        return [not_run(rec), ""]
    table: dict[str, dict[float, dict[str, dict]]] = {}
    for line in _lines(rec):
        if line.get("fraction") is not None and line.get("seeds"):
            table.setdefault(line["preset"], {}).setdefault(line["fraction"], {})[line["physics"]] = line
    lines = ["Paired MFS minus the best baseline on the same requests (mean ± 95 % half-width over seeds; * where "
             "the interval excludes 0), with MFS's attainment and its ratio to the best baseline.", "",
             "| figure | load (of capacity) | faithful | the paper's physics |", "|---|---|---|---|"]
    for preset, by_fraction in table.items():
        for fraction, by_physics in sorted(by_fraction.items()):
            cells = []
            for physics in ("faithful", "paper"):
                line = by_physics.get(physics)
                try:
                    cells.append(_diff_cell(line) if line else "-")
                except (Missing, KeyError, TypeError):
                    cells.append("-")
            lines.append(f"| `{preset}` | {fraction:g} | {cells[0]} | {cells[1]} |")
    lines.append("")
    return lines


def _line_table(rec: Record, header: list[str], row: Callable[[dict], str]) -> list[str]:
    """A table of one row per JSON line of ``rec`` that has runs (a line missing a key is left out)."""
    if not rec.ok:
        return [not_run(rec), ""]
    lines = list(header)
    for line in _lines(rec):
        if not line.get("seeds"):
            continue
        try:
            lines.append(row(line))
        except (Missing, KeyError, TypeError):
            continue
    return lines + [""]


def _baselines_row(line: dict) -> str:
    pol, g = line["policies"], line["group_baselines"]

    def pair(a: str, b: str) -> str:
        return f"{num(pol[a]['slo_attainment'])} / {num(pol[b]['slo_attainment'])}"
    return (f"| `{line['preset']}` | {line['physics']} | {num(pol['mfs']['slo_attainment'])} | {pair('sjf', 'sjf-group')} | "
            f"{pair('karuna', 'karuna-group')} | **{num(line['mfs_over_best'])}x** over {line['best_baseline']}, "
            f"{_paired_text(line['paired_diff'])} | **{num(g['mfs_over_best'])}x** over {g['best_baseline']}, "
            f"{_paired_text(g['paired_diff'])} |")


def baselines_rows(recs: dict[str, Record], name: str = "sim_claims_baselines") -> list[str]:
    """Per figure and physics: MFS over the best baseline with SJF/Karuna per queue pair, and as one job."""
    return _line_table(recs[name], [
        "| figure | physics | MFS | SJF per pair / as one job | Karuna per pair / as one job | MFS over the best of fs, "
        "edf, sjf, karuna | MFS over the best of fs, edf, sjf-group, karuna-group |", "|---|---|---|---|---|---|---|"],
        _baselines_row)


def paper_range(text: str) -> tuple[float, float]:
    """The paper's margin as (low, high): "1.4-1.8x", "2.2x" (one value), "up to 2.4x" (low 1)."""
    body = text.removesuffix("x").strip()
    if body.startswith("up to "):
        return 1.0, float(body.removeprefix("up to "))
    lo, _, hi = body.partition("-")
    return float(lo), float(hi or lo)


def _reach_cell(rec: Record, preset: str) -> tuple[str, float | None]:
    """MFS over the best one-job baseline at ``preset`` under the paper's physics, and that ratio."""
    if not rec.ok:
        return not_run(rec), None
    for line in _lines(rec):
        if line.get("preset") == preset and line.get("physics") == "paper" and line.get("seeds"):
            g = line["group_baselines"]
            return (f"**{num(g['mfs_over_best'])}x** over {g['best_baseline']}, {_paired_text(g['paired_diff'])} "
                    f"({line['seeds']} seeds)"), float(g["mfs_over_best"])
    return "-", None


def ttft_parts_rows(rec: Record) -> list[str]:
    """Per policy: SLO attainment and the three TTFT parts (all measured requests / the missed ones)."""
    if not rec.ok:
        return [not_run(rec), ""]
    r = rec.result
    lines = [f"`{r['point']}` under {r['physics']} physics at {r['rate']} req/s/GPU, {r['servers']} servers, "
             f"{r['warmup']} + {r['requests']} requests, {r['seeds']} seeds; milliseconds, mean ± 95 % half-width "
             "over seeds, all measured requests / those that missed their SLO; the decode units' mean TPOT ('-': "
             "held, `--decode hold`):", "",
             "| policy | SLO attainment | queue | compute | P2D tail | TPOT |", "|---|---|---|---|---|---|"]
    for pol, v in r["policies"].items():
        def ms(key: str) -> str:
            return f"{num(v[key + '_ms']['mean'])} / {num(v['missed_' + key + '_ms']['mean'])}"
        att = v["slo_attainment"]
        tpot = f"{num(v['tpot_ms']['mean'])} ± {num(v['tpot_ms']['ci95'])}" if "tpot_ms" in v else "-"
        lines.append(f"| {pol} | {num(att['mean'])} ± {num(att['ci95'])} | {ms('queue')} | {ms('compute')} | "
                     f"{ms('p2d_tail')} | {tpot} |")
    return lines + [""]


def paper_margin_rows(recs: dict[str, Record]) -> list[str]:
    """Per figure: does MFS reach the paper's margin under the paper's physics, over the one-job baselines
    (fs, edf, sjf-group, karuna-group), at 16 servers and at the paper's 256?"""
    lines = ["| figure (preset) | paper | 16 servers | 256 servers | reaches the paper's margin? |",
             "|---|---|---|---|---|"]
    for c in PHYSICS_CLAIMS:
        if c.key is not None:
            continue
        lo, hi = paper_range(c.paper)
        small, r16 = _reach_cell(recs["sim_claims_baselines"], c.preset)
        big, r256 = _reach_cell(recs["sim_claims_paper_scale"], "fig10-dbrx" if c.preset == "fig13" else c.preset)
        verdicts = []
        for where, r in (("16", r16), ("256", r256)):
            if r is not None:
                verdicts.append(f"{where}: " + ("yes" if r >= lo else f"no ({num(r)}x < {num(lo)}x)")
                                + (" (beyond it)" if r > hi else ""))
        lines.append(f"| {c.what} (`{c.preset}`) | {c.paper} | {small} | {big} | {'; '.join(verdicts) or '-'} |")
    lines.append("")
    return lines


def _one_job_row(line: dict) -> str:
    pol, g = line["policies"], line["group_baselines"]
    cells = " | ".join(_att(pol[p]) for p in ONE_JOB)
    return (f"| `{line['preset']}` | {line['rate']} | {cells} | **{num(g['mfs_over_best'])}x** over {g['best_baseline']}, "
            f"{_paired_text(g['paired_diff'])} | {num(pol['fs']['cct_inflation'])} / {num(pol['mfs']['cct_inflation'])} |")


ONE_JOB = ("mfs", "fs", "edf", "sjf-group", "karuna-group")


def one_job_rows(recs: dict[str, Record], name: str) -> list[str]:
    """Per figure: SLO attainment (mean ± 95 % half-width) of MFS and the one-job baselines, MFS's margin."""
    return _line_table(recs[name], [
        "| figure | rate (req/s/GPU) | " + " | ".join(ONE_JOB) + " | MFS over the best | CCT inflation FS / MFS |",
        "|" + "---|" * (len(ONE_JOB) + 4)], _one_job_row)


def _ablation_row(line: dict) -> str:
    pol = line["policies"]
    bs = pol["fs"]["byte_share"]
    return (f"| `{line['preset']}` | `{line['physics']}` | {_diff_cell(line)} | "
            f"{num(pol['fs']['cct_inflation'])} / {num(pol['mfs']['cct_inflation'])} | "
            f"{bs['reuse'] * 100:.1f} / {bs['collective'] * 100:.1f} / {bs['p2d'] * 100:.1f} % | {line['rate']} |")


def physics_ablation_rows(recs: dict[str, Record]) -> list[str]:
    """Per figure: each of the paper's four choices alone over the faithful model, and all four."""
    return _line_table(recs["sim_physics_ablation"], [
        "| figure | physics | MFS minus the best baseline (paired) | CCT inflation FS / MFS | bytes: reuse / "
        "collective / P2D (FS) | rate (req/s/GPU) |", "|---|---|---|---|---|---|"], _ablation_row)


REACH_TEXT = (
    "Under the paper's physics, MFS over the best of the baselines as the paper's text describes them, a "
    "collective being one job to SJF and Karuna (`sjf-group`, `karuna-group`; see below for why that "
    "matters), at the 16-server scale of the tables above (`sim_claims_baselines`) and at the paper's 256 "
    "servers (`sim_claims_paper_scale`). The paper's number is a range read off its figure; \"reaches\" "
    "means MFS's mean ratio is at least its low end. Paired differences: * where the 95 % interval excludes 0.")


TTFT_PARTS_TEXT = (
    "Where Fig. 12a's margin goes (`bench/ttft_parts.py`): a TTFT on the prefill units is its queueing, its "
    "prefill (layers, collectives and reuse stalls) and the P2D tail (KV not yet landed when the compute "
    "ended). MFS gives the SP collectives the fabric and defers the P2D flows by their MLU (§4.3, one flow per "
    "layer, each its own bytes over the time to the request's deadline); the table shows where that moves a "
    "request's time, for all requests and for those that missed.")


BASELINES_TEXT = (
    "The paper does not say whether its SJF and Karuna see an EP all-to-all as one flow or as its queue pairs. "
    "`sjf` and `karuna` size each engine flow per queue pair: a collective's per-pair share is small, so SJF "
    "serves it early. `sjf-group` and `karuna-group` size a flow group by its whole bytes (`Flow.pairs` x size), "
    "so a wide all-to-all is the largest job. Both run on the same requests per seed at 0.8 of capacity under each "
    "physics; * where the paired 95 % interval excludes 0.")


CODESIGN_TEXT = (
    "MFS prunes a request (Algorithm 1) only when its deadline is infeasible, so pruning can feed FlowPrefill's "
    "deferral only where such requests exist: SLOs tight against the idle TTFT (SLO scale) or arrivals beyond "
    "capacity (load above 1). Each cell runs on the same requests per seed: MFS alone with pruning (FCFS batches), "
    "FlowPrefill alone (FS on the network), both blind (the pruned set not passed on) and both coupled (pruned "
    "tasks deferred). Paired differences: coupled minus blind is what the coupling itself adds; coupled minus the "
    "better one alone is what running both buys; * where the 95 % interval excludes 0. The decode units run "
    "decode batches within their KV memory (`--decode steps`); TTFT still ends at the last P2D byte, and decode "
    "reaches the prefill side only through the router's decode-unit load. TPOT is each combination's mean.")


def _att(c: dict) -> str:
    return f"{num(c['slo_attainment'])} ± {num(c['slo_attainment_ci95'], 2)}"


def _codesign_row(line: dict) -> str:
    c = line["combos"]
    tpot = " / ".join("-" if c[k].get("tpot_mean_ms") is None else num(c[k]["tpot_mean_ms"])
                      for k in ("mfs", "flowprefill", "blind", "coupled"))  # "-": a run with --decode hold
    return (f"| `{line['preset']}` | {line['physics']} | {line['slo_scale']:g} | {line['load']:g} | "
            f"{_att(c['mfs'])} | {_att(c['flowprefill'])} | {_att(c['blind'])} | {_att(c['coupled'])} | "
            f"{c['coupled']['pruned']:g} / {c['coupled']['deferred']:g} | {_paired_text(line['coupled_minus_blind'])} | "
            f"{_paired_text(line['coupled_minus_best_alone'])} ({line['best_alone']}) | {tpot} |")


def codesign_rows(recs: dict[str, Record]) -> list[str]:
    return _line_table(recs["codesign"], [
        "| preset | physics | SLO scale | load | MFS alone | FlowPrefill alone | blind | coupled | pruned / "
        "deferred (coupled) | coupled − blind | coupled − best alone | TPOT ms: MFS / FlowPrefill / blind / coupled |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|"], _codesign_row)


INSTANCE_TEXT = (
    "The instance engine (decode steps, KV memory, TPOT) with the network on: its only traffic is each prompt's KV, "
    "one flow from its prefill instance's port to its decode instance's (one port per instance of NIC x GPUs), and "
    "a request's first token is seen when that KV has landed. Llama3-8B TP1 on A800s, sarathi batches, every policy "
    "on the same requests per seed. `p2d`: azure-conv on 6 prefill : 2 decode instances; `arrow`: the "
    "`arrow-azure-code` cluster under a pool manager. `mfs` alone prunes nothing (`drop_budget` 0, as the daemon "
    "without a coordinator); `mfs-prune` runs Algorithm 1 itself (budget 1 per run). Paired differences against FS "
    "on the same requests; * where the 95 % interval excludes 0.")


def _instance_row(line: dict) -> str:
    pol, pair = line["policies"], line["paired_vs_fs"]
    cells = "; ".join(f"{p} {num(c['ttft_attainment'])} ± {num(c['ttft_attainment_ci95'], 2)}" for p, c in pol.items())
    return (f"| {line['experiment']} | {line['manager']} | {line['nic_gbps']:g} | {line['rate']:g} | "
            f"{cells} | {_paired_text(pair['mfs']['ttft_attainment'])} | "
            f"{_paired_text(pair['mfs-prune']['ttft_attainment'])} | {num(pol['fs']['tpot_mean'] * 1e3)} | "
            f"{_paired_text(pair['mfs']['tpot_mean_ms'])} |")


def instance_rows(recs: dict[str, Record]) -> list[str]:
    return _line_table(recs["instance_policies"], [
        "| experiment | instances / pools | NIC (Gbit/s) | rate (req/s/instance) | TTFT attainment per policy | "
        "MFS − FS | MFS-prune − FS | FS TPOT (ms) | MFS − FS TPOT (ms) |", "|---|---|---|---|---|---|---|---|---|"],
        _instance_row)


MAP_AXES = ("nic_gbps", "ep", "ep_comm", "kv_placement", "remote_reuse", "prompt_scale", "load")


def map_rows(recs: dict[str, Record]) -> list[str]:
    """The map's cells per row: the axis each cell varies from the row's base point, MFS minus the best
    baseline (paired; * where the interval excludes 0), FS's CCT inflation; then the heatmaps."""
    rec = recs["sim_map"]
    if not rec.ok:
        return [not_run(rec), ""]
    res = rec.result
    cells = get(res, "cells")
    lines = [f"{len(cells)} cells, {sum(len(c.get('seeds', [])) * len(c.get('policies', {})) for c in cells)} runs, "
             f"{res.get('wall_s', '?')} s of wall time (`{res.get('command', 'laxflow sim map')}`). Each cell: every "
             "policy on the same requests per seed, at the cell's load times its own capacity.", "",
             "| row | cell (what differs from the row's base point) | rate (req/s/GPU) | MFS − best baseline "
             "(paired) | FS CCT inflation | remote reuse |", "|---|---|---|---|---|---|"]
    for row in dict.fromkeys(c["row"] for c in cells):
        mine = [c for c in cells if c["row"] == row]
        base = {a: statistics.mode([c[a] for c in mine]) for a in MAP_AXES}
        for c in mine:
            diff = [f"{a} {c[a]}" for a in MAP_AXES if c[a] != base[a]]
            d = c.get("paired_diff") or {}
            cell = "base: " + ", ".join(f"{a} {base[a]}" for a in MAP_AXES) if not diff else ", ".join(diff)
            pd = "-" if d.get("mean") is None else _paired_text({**d, "ci95": d.get("ci95") or 0.0})
            fs = "-" if c.get("fs_cct_inflation") is None else (
                f"{num(c['fs_cct_inflation'])} ± {num(c.get('fs_cct_inflation_ci95') or 0.0, 2)}")
            lines.append(f"| {row} | {cell} | {num(c['rate'])} | {pd} (vs {c.get('best_baseline') or '-'}) | {fs} | "
                         f"{num(c.get('remote_reuse_share') or 0.0)} |")
    lines.append("")
    for path in res.get("plots", []):
        name = Path(path).name
        lines += [f"![{name}](map/{name})", ""]
    return lines


def testbed_ratio_value(key: str) -> Callable[[dict], str]:
    def value(res: dict) -> str:
        f = get(res, key)
        return mean_ci(get(f, "per_run"), unit="x") + " (testbed runs, not seeds)"
    return value


MFS_TESTBED_CLAIMS = [
    Claim("Fig. 9 on a real fabric (`laxflow testbed`, emulated: namespaces, HTB strict priority): CCT off / on",
          "1.47x (CCT -31.9 %)", "testbed_ratio", testbed_ratio_value("cct_ratio"),
          "a 2-core VM emulating the fabric in software: the switch and hosts share the CPUs with the workers, so "
          "ratios move by ±0.2 run to run; the target here is >= 1.3"),
    Claim("Fig. 9 on a real fabric: TTFT off / on", "1.26x (TTFT -20.7 %)", "testbed_ratio",
          testbed_ratio_value("ttft_ratio"), "as above"),
]


def mfs_detail(recs: dict[str, Record], name: str = "sim_claims") -> list[str]:
    """Per point: every policy's attainment with its interval, TTFT, CCT inflation and byte shares."""
    rec = recs[name]
    if not rec.ok:
        return [not_run(rec), ""]
    lines = []
    physics = " under the paper's physics" if name == "sim_claims_paper" else ""
    for key, p in get(rec.result, "points").items():
        lines += [f"### `{key}`{physics} at {p['rate']} req/s per prefill GPU ({p['servers']} servers, {p['warmup']} + "
                  f"{p['requests']} requests, {p['seeds']} seeds)", "",
                  "| policy | SLO attainment (mean ± 95 % half-width, per seed) | mean TTFT (ms) | CCT inflation | "
                  "bytes: reuse / collective / P2D | remote-reuse share |", "|---|---|---|---|---|---|"]
        for name, v in p.get("policies", {}).items():
            bs = v["byte_share"]
            lines.append(f"| {name} | {mean_ci(v['slo_attainment_seeds'])} | {num(v['ttft_mean'] * 1e3)} | "
                         f"{num(v['cct_inflation'])} | {bs['reuse'] * 100:.1f} / {bs['collective'] * 100:.1f} / "
                         f"{bs['p2d'] * 100:.1f} % | {num(v['remote_reuse_share'])} |")
        lines.append("")
    return lines


def workload_rows(recs: dict[str, Record]) -> list[str]:
    rec = recs["workload_calibration"]
    if not rec.ok:
        return [not_run(rec), ""]
    res = rec.result
    lines = ["| workload | target mean prompt (tokens) | measured (by run length) | target prefix reuse | measured | "
             "within 5 % / 0.05 |", "|---|---|---|---|---|---|"]
    for name, e in res.items():
        if not isinstance(e, dict):
            continue
        runs = {k: v for k, v in e.items() if k.isdigit()}
        lines.append(f"| {name} | {num(e['target_mean_input'])} | "
                     + ", ".join(f"{k}: {num(v['mean_input_tokens'])}" for k, v in runs.items())
                     + f" | {e['target_reuse']} | "
                     + ", ".join(f"{k}: {v['prefix_reuse_fraction']:.3f}" for k, v in runs.items())
                     + " | " + ("yes" if all(v["ok"] for v in runs.values()) else "no") + " |")
    lines.append("")
    return lines


def page_mfs(recs: dict[str, Record], now: str) -> list[str]:
    lines = header("MFS (paper 001): the paper's figures and laxflow's",
                   [recs[n] for n in ("sim_claims", "sim_claims_paper", "sim_claims_baselines", "sim_claims_scale",
                                      "sim_claims_paper_scale", "ttft_parts", "sim_physics_sweep", "sim_physics_ablation", "codesign",
                                      "instance_policies", "sim_map", "testbed_ratio", "workload_calibration")], now)
    lines += ["The serving simulator runs every policy (MFS and the baselines FS, SJF, EDF, Karuna) on the same "
              "requests per seed, each point at 0.8 of its model's capacity on its workload (never a rate picked per "
              "policy). A margin inside both intervals is a tie; the paired difference (MFS minus the best baseline "
              "on the same seed's requests) shows whether a small margin is consistent.", "",
              "## Figures 9-13 in the simulator", ""]
    lines += claim_rows(MFS_CLAIMS, recs)
    lines += ["## Figures 10-13 under both physics: is laxflow's MFS the paper's MFS?", "", PHYSICS_TEXT, ""]
    lines += physics_rows(recs)
    lines += ["### Does it reach the paper's margins?", "", REACH_TEXT, ""]
    lines += paper_margin_rows(recs)
    lines += [TTFT_PARTS_TEXT, ""]
    lines += ttft_parts_rows(recs["ttft_parts"])
    lines += ["### Against load", ""]
    lines += physics_sweep_rows(recs)
    lines += ["### Which of the four choices matters", "",
              "Each choice alone over the faithful model (`--physics field=value`), at 0.8 of the capacity under "
              "that physics.", ""]
    lines += physics_ablation_rows(recs)
    lines += ["### Which SJF and Karuna: a collective as one flow or as its queue pairs", "", BASELINES_TEXT, ""]
    lines += baselines_rows(recs)
    lines += ["At twice the cluster and longer runs (32 servers, 200 + 500 requests per run, 0.7 of capacity, "
              "3 seeds), under the paper's physics:", ""]
    lines += baselines_rows(recs, "sim_claims_scale")
    lines += ["At the paper's scale (§6.1: 256 servers of 8 GPUs, a 1:1 fat-tree of 200 Gbit/s links; 512 + 1536 "
              "requests per run, 0.8 of capacity, 3 seeds), under the paper's physics, over the one-job baselines. "
              "The agent points (Figs. 11, 12b) are left out: at this scale and load they saturate (MFS met 0.2-0.3 % "
              "of SLOs on seed 0).", ""]
    lines += one_job_rows(recs, "sim_claims_paper_scale")
    lines += ["## The map: where MFS pays", ""]
    lines += map_rows(recs)
    lines += ["## Co-design where MFS prunes: MFS with FlowPrefill", "", CODESIGN_TEXT, ""]
    lines += codesign_rows(recs)
    lines += ["## On the instance engine: P2D under contention, and Arrow's pools", "", INSTANCE_TEXT, ""]
    lines += instance_rows(recs)
    lines += ["## Figure 9 on the emulated testbed", ""]
    lines += claim_rows(MFS_TESTBED_CLAIMS, recs)
    lines += ["## Every policy at every point", ""]
    lines += mfs_detail(recs)
    lines += ["## Every policy at every point, under the paper's physics", ""]
    lines += mfs_detail(recs, "sim_claims_paper")
    lines += ["## Workloads (§6.1): synthetic generators against their published targets", ""]
    lines += workload_rows(recs)
    return lines


# ---- FlowPrefill (paper 000)


def fp_ratio(bench: str, baseline: str) -> Callable[[dict], str]:
    """FlowPrefill over a baseline: the ratio of means, and the per-seed ratios with their interval."""
    def value(res: dict) -> str:
        fp, b = get(res, "values.flowprefill"), get(res, f"values.{baseline}")
        goodput = res.get("metric") == "goodput"
        per_seed = [(x / y if goodput else y / x) for x, y in zip(fp, b) if x and y]
        unit = res.get("unit", "")
        return (f"**{num(get(res, f'flowprefill_ratio.{baseline}'))}x**; per seed {mean_ci(per_seed)}; "
                f"flowprefill {mean_ci(fp)}, {baseline} {mean_ci(b)} ({unit}; {res['warmup']} + {res['requests']} "
                "requests per run)")
    return value


def preemption_value(res: dict) -> str:
    return (f"**{num(get(res, 'ratio'))}x** (layer {num(res['layer_blocking_ms'])} ms / operator "
            f"{num(res['operator_blocking_ms'])} ms, mean over {res['trials']} trials each, {res['missed']} missed; "
            f"the long prefill alone took {num(res['long_prefill_ms'])} ms on this box; "
            "one seed: the JSON keeps no per-trial values, so no interval; target >= 2)")


FP_REASON_SETUP = ("arrivals are Poisson over Table 1's lengths (lognormal per category), not QwenTrace's own timestamps "
                   "and bursts; compute is a roofline, not A800 kernels")
FP_CLAIMS = [
    Claim("Fig. 9: goodput over FCFS (Llama3-8B, 1P1D, 90 % attainment)", "4.7-5.6x", "flowprefill_goodput",
          fp_ratio("flowprefill_goodput", "fcfs"), FP_REASON_SETUP),
    Claim("Fig. 9: goodput over EDF with 2k chunks", "up to 2.0x", "flowprefill_goodput",
          fp_ratio("flowprefill_goodput", "edf-cp2k"),
          "a 2k chunk of Llama3-8B takes about two thirds of the 0.25 s Text SLO in our compute model, and EDF without "
          "slack keeps computing requests already late; " + FP_REASON_SETUP),
    Claim("Fig. 9: goodput over EDF with 8k chunks", "up to 4.5x", "flowprefill_goodput",
          fp_ratio("flowprefill_goodput", "edf-cp8k"), FP_REASON_SETUP),
    Claim("Fig. 9: tightest SLO scale at a fixed rate, FCFS / FlowPrefill", "not given", "flowprefill_slo",
          fp_ratio("flowprefill_slo", "fcfs"),
          "the paper's fixed rate is not stated; ours is 2.9 req/s, about 40 % of FlowPrefill's goodput when it was chosen"),
    Claim("Fig. 9: tightest SLO scale, EDF-2k / FlowPrefill (x tighter)", "1.5-2.3x", "flowprefill_slo",
          fp_ratio("flowprefill_slo", "edf-cp2k"), "as above; chunking costs 3-4 % at 2k chunks in our model"),
    Claim("Fig. 9: tightest SLO scale, EDF-8k / FlowPrefill", "2.1-3.1x", "flowprefill_slo",
          fp_ratio("flowprefill_slo", "edf-cp8k"),
          "at our fixed rate an 8k chunk (about 0.7 s on Llama3-8B) blocks Text requests for several of their SLOs"),
    Claim("§6.4: preemption blocking time, layer-level over operator-level checks (real CPU engine)", "3.5-4.2x",
          "preemption", preemption_value,
          "a small Llama-like model (hidden 512, 8 layers) on CPU with 1 torch thread, on a shared box; the paper's "
          "operators are GPU kernels of a full model"),
]


def coupling_rows(recs: dict[str, Record]) -> list[str]:
    rec = recs["flowprefill_coupling"]
    if not rec.ok:
        return [not_run(rec), ""]
    res = rec.result
    lines = [f"`{res['preset']}`, rates {', '.join(num(r) for r in res['rates'])} {res['rate_unit']}, "
             f"{res['warmup']} + {res['requests']} requests per run.", "",
             "| combination | goodput (largest swept rate with >= 90 % attainment), mean ± 95 % half-width |",
             "|---|---|"]
    for name, seeds in get(res, "goodput_seeds").items():
        if seeds and all(isinstance(x, (int, float)) for x in seeds):
            cell = mean_ci(seeds)
        else:
            cell = ", ".join("-" if x is None else num(x) for x in seeds) + " per seed (-: no swept rate held 90 %)"
        lines.append(f"| {name} | {cell} |")
    lines.append("")
    return lines


def page_flowprefill(recs: dict[str, Record], now: str) -> list[str]:
    lines = header("FlowPrefill (paper 000): the paper's figures and laxflow's",
                   [recs[n] for n in ("flowprefill_goodput", "flowprefill_slo", "preemption", "flowprefill_coupling")],
                   now)
    lines += ["Goodput: per scheduler and seed, the largest instance rate with >= 90 % SLO attainment (geometric scan, "
              "then bisection to 3 %) on the 1P1D preset `flowprefill-llama3-8b` (qwen-multislo, Table 2 SLOs). "
              "SLO scale: the smallest multiple of Table 2's SLOs with >= 90 % at a fixed rate. Ratios are FlowPrefill "
              "over each baseline (goodput) or the baseline over FlowPrefill (SLO scale, \"x tighter\").", ""]
    lines += claim_rows(FP_CLAIMS, recs)
    lines += ["## Network and compute scheduled together (not a figure of either paper)", "",
              "MFS alone (the MFS paper's run-to-completion FCFS batch former), FlowPrefill alone (`flowprefill+fs`) "
              "and both, on the same requests.", ""]
    lines += coupling_rows(recs)
    return lines


# ---- Arrow (paper 002)


def arrow_over(baseline: str) -> Callable[[dict], str]:
    def value(res: dict) -> str:
        a = get(res, "sustainable_rate.arrow.per_seed")
        b = get(res, f"sustainable_rate.{baseline}.per_seed")
        per_seed = [x / y for x, y in zip(a, b) if y > 0]
        return (f"**{num(get(res, f'arrow_over.{baseline}'))}x**; per seed {mean_ci(per_seed)}; sustainable cluster "
                f"req/s: arrow {mean_ci(a)}, {baseline} {mean_ci(b)} ({res['instances']} instances, "
                f"{res['requests']} requests per run)")
    return value


def arrow_scaling(res: dict) -> str:
    if "scaling_rate_per_instance" not in res:
        raise Missing("the run skipped the scaling series: --scaling '' in its command")
    rows = get(res, "scaling_rate_per_instance")
    return "rate per instance by instance count: " + "; ".join(
        f"{s} " + " / ".join(f"{k}: {num(v)}" for k, v in row.items()) for s, row in rows.items()) + \
        " (means over seeds; per-seed values at other counts than 8 are not kept, so no interval)"


ARROW_REASON_SYNTH = "synthetic Azure Code lengths and bursts, not the real trace; runs shortened for the box"
ARROW_CLAIMS = [
    Claim("§7.2: Arrow over vLLM (one TP8 colocated instance), Azure Code", "5.62x", "arrow", arrow_over("vllm"),
          "our TP8 vLLM pays only the all-reduce bandwidth; all-reduce latency, kernel launches and thin GEMMs at TP8 "
          "are not charged, so it is optimistic; " + ARROW_REASON_SYNTH),
    Claim("§7.2: Arrow over vLLM-disaggregated (TP4 1P1D)", "7.78x", "arrow", arrow_over("vllm-disagg"),
          "the fixed 1:1 GPU split wastes half the GPUs on decode (Azure Code has very short outputs); v0.7.3's "
          "synchronous KV pull and buffer limits are not charged"),
    Claim("§7.3: Arrow over Minimal Load (`static-pd`, half:half)", "1.67x", "arrow", arrow_over("static-pd"),
          "same shape; our decode is lighter than the real trace's, so a fixed half:half split wastes more"),
    Claim("Arrow over round robin (`round-robin`, half:half)", "not given", "arrow", arrow_over("round-robin"),
          "an ablation of ours"),
    Claim("Arrow over 8 colocated TP1 replicas (not in the paper)", "-", "arrow", arrow_over("colocated"),
          "Algorithm 3 keeps at least one decode instance, so Arrow prefills on at most 7 of 8 GPUs while a colocated "
          "replica folds its few decodes into prefill steps almost free; Algorithm 1 flips only when no prefill "
          "instance can still meet the TTFT SLO, so the first burst's queues are already SLO-deep before a flip"),
    Claim("§7.4: scaling with instances", "near-linear", "arrow", arrow_scaling,
          "with 2 instances Arrow cannot flip (one of each is kept); its prefill share (N-1)/N grows with N; a burst is "
          "a fixed number of arrivals, so per instance it shrinks with N"),
]


def page_arrow(recs: dict[str, Record], now: str) -> list[str]:
    lines = header("Arrow (paper 002): the paper's figures and laxflow's", [recs["arrow"]], now)
    lines += ["Sustainable rate: per system and seed, the largest cluster request rate whose SLO attainment (TTFT and "
              "TPOT both within the workload's SLO, every request counted) is >= 90 %: a scan by x1.5 from 1 req/s "
              "per instance, then bisections. Instances are Llama3-8B on one A800 each (compute model). The search "
              "resolves a rate to a factor of 1.5^(1/2^b) for b bisections (the command's `--bisect`; 1: 1.22x), so "
              "with few bisections every system lands on the same grid and the per-seed ratios repeat; the rates "
              "themselves vary widely across seeds, since short runs of a bursty trace differ.", ""]
    lines += claim_rows(ARROW_CLAIMS, recs)
    return lines


# ---- FairBatching (paper 004) and ProServe (paper 003): bench/batching_repro.py


def _seeds_at(points: dict, config: str, key: str) -> dict[float, list[float]]:
    return {float(r): p[f"{key}_seeds"] for r, p in get(points, config).items()}


def peak_gain(exp: str, ours: str, bases: tuple[str, ...], gain_key: str) -> Callable[[dict], str]:
    """Peak effective RPS (rate x envelope attainment) of ``ours`` over the best of ``bases``, per seed."""
    def value(res: dict) -> str:
        pts = get(res, f"{exp}.points")
        def peaks(cfg: str) -> list[float]:
            by_rate = _seeds_at(pts, cfg, "envelope_attainment")
            n = len(next(iter(by_rate.values())))
            return [max(r * v[s] for r, v in by_rate.items()) for s in range(n)]
        mine = peaks(ours)
        best = [max(vals) for vals in zip(*(peaks(b) for b in bases))]
        per_seed = [m / b - 1 for m, b in zip(mine, best) if b > 0]
        return (f"**{pct(get(res, f'{exp}.{gain_key}'))}** (peak of the seed means); per seed "
                f"{mean_ci([g * 100 for g in per_seed], unit=' %')}; peak effective req/s of {ours} per seed "
                f"{mean_ci(mine)}")
    return value


def fb_ttft_ratio(res: dict) -> str:
    return (f"**{num(get(res, 'fb_single.ttft_p99_ratio'))}x** lower at {get(res, 'fb_single.ttft_p99_ratio_rate')} "
            "req/s (p99 of the seed means; per-seed p99s are not kept, so no interval)")


FB_REASON = ("our decode step (10-40 ms) is far under the 50 ms TPOT SLO, so Sarathi's decode-first costs prefills less; "
             "the compute model has no per-step fixed overhead; one model and trace, not a geometric mean over four")
FB_CLAIMS = [
    Claim("§5.2: TTFT p99 vs Sarathi with TPOT held (qwen-trace, one instance)", "up to 2.29x lower", "fairbatching",
          fb_ttft_ratio, FB_REASON),
    Claim("§5.3 Table 3: single-node capacity over the best of vLLM-Sarathi / vLLM-vanilla (peak effective RPS, "
          "envelope SLO)", "+20 %", "fairbatching",
          peak_gain("fb_single", "fairbatching+dplb", ("sarathi+dplb", "vllm+dplb"), "capacity_gain"), FB_REASON),
    Claim("§5.3: FairBatching with admission control (PAB), single-node capacity", "+90.1 %", "fairbatching",
          peak_gain("fb_single", "fairbatching-pab+dplb", ("sarathi+dplb", "vllm+dplb"), "capacity_gain_pab"),
          "rejected requests count as misses; when its peak is the grid's top rate the gain is a lower bound"),
    Claim("§5.5: PAB over request-count routing, 8 instances (over the best dplb configuration)", "+54.3 %",
          "fairbatching", peak_gain("fb_cluster", "fairbatching+pab",
                                    ("vllm+dplb", "sarathi+dplb", "fairbatching+dplb"), "pab_gain"),
          "Poisson arrivals of synthetic qwen-trace lengths balance well by request count, so PAB has little to "
          "correct; the paper's trace has bursts of long prompts"),
    Claim("§5.5: PAB over dplb + FairBatching", "+34.9 %", "fairbatching",
          peak_gain("fb_cluster", "fairbatching+pab", ("fairbatching+dplb",), "pab_over_dplb_fairbatching"),
          "as above"),
]


def ps_gain(path: str, key: str, ours: str) -> Callable[[dict], str]:
    """ProServe's largest margin over the best baseline at a rate; an interval where per-seed values exist."""
    def value(res: dict) -> str:
        g = get(res, f"{path}.gains.{key}")
        rate = g["at_rate"]
        text = f"**{pct(g['max_gain'])}** at {rate} req/s per instance"
        if key == "slo_attainment":
            pts = get(res, f"{path}.points")
            mine = _seeds_at(pts, ours, "slo_attainment")[float(rate)]
            others = {k: _seeds_at(pts, k, "slo_attainment")[float(rate)] for k in pts
                      if k.split("+")[0] != ours.split("+")[0]}
            best = max(others, key=lambda k: statistics.fmean(others[k]))
            per_seed = [m / b - 1 for m, b in zip(mine, others[best]) if b > 0]
            text += (f" over {best}; per seed {mean_ci([x * 100 for x in per_seed], unit=' %')}; "
                     f"attainment {mean_ci(mine)} vs {mean_ci(others[best])}")
        else:
            text += " (ratio of the seed means; per-seed TDG is not kept, so no interval)"
        return text
    return value


def ps_priority(workload: str) -> Callable[[dict], str]:
    def value(res: dict) -> str:
        pr = get(res, f"ps_single.{workload}.per_priority_at_top_rate")
        return "high / low attainment at the top rate: " + "; ".join(
            f"{k.split('+')[0]} {v['high']:.2f} / {v['low']:.2f}" for k, v in pr.items()) + " (seed means)"
    return value


PS_REASON_GRID = ("our top rate overloads every baseline, so the \"up to\" margin depends on the grid; the rates are a "
                  "fixed grid, the same for every system")
PS_CLAIMS = [
    Claim("§5.2: system gain (TDG ratio) over the best baseline, one colocated instance, qwen-trace", "up to +35 %",
          "proserve", ps_gain("ps_single.qwen-trace", "tdg_ratio", "slidebatching+dplb"), PS_REASON_GRID),
    Claim("§5.2: TDG ratio gain, sharegpt", "up to +35 %", "proserve",
          ps_gain("ps_single.sharegpt", "tdg_ratio", "slidebatching+dplb"),
          "sharegpt's w_p (mean input / mean output) weights decode tokens, which every policy delivers"),
    Claim("§5.2: SLO attainment over the best baseline, qwen-trace", "up to +52 %", "proserve",
          ps_gain("ps_single.qwen-trace", "slo_attainment", "slidebatching+dplb"),
          PS_REASON_GRID + "; SlideBatching lets some requests go very late to keep the rest on time"),
    Claim("§5.2: SLO attainment over the best baseline, sharegpt", "up to +52 %", "proserve",
          ps_gain("ps_single.sharegpt", "slo_attainment", "slidebatching+dplb"),
          "where every scheduler meets its SLOs at every rate of the grid (short runs of sharegpt's short prompts "
          "do not build queues) there is no margin to show; the grid is the same for every system"),
    Claim("§5.3: per priority, qwen-trace", "high slightly above low, neither starved; Sarathi-Priority starves low, "
          "Weighted VTC ignores SLOs", "proserve", ps_priority("qwen-trace"), "compare the rows: same shape as the paper"),
    Claim("§5.3: per priority, sharegpt", "as above", "proserve", ps_priority("sharegpt"), "as above"),
    Claim("Fig. 12: 4 colocated instances, slidebatching+gorouting over every scheduler x {gorouting, minload}, "
          "attainment", "both parts help", "proserve",
          ps_gain("ps_coloc", "slo_attainment", "slidebatching+gorouting"),
          "short runs pooled over 4 instances keep queues short at these rates, and GoRouting's reserved light "
          "instances pay only under contention"),
    Claim("§5.2 multi-node: 2 prefill + 2 decode instances, slidebatching+gorouting, attainment", "both improve TDG",
          "proserve", ps_gain("ps_disagg", "slo_attainment", "slidebatching+gorouting"),
          "on a prefill-only instance SlideBatching's budget (about the TTFT SLO) runs whole prompts per step, so "
          "arrivals wait behind long steps; Sarathi's 512-token chunks admit them sooner; `eta` (20 ms) is ours"),
]


def page_fairbatching(recs: dict[str, Record], now: str) -> list[str]:
    lines = header("FairBatching (paper 004): the paper's figures and laxflow's", [recs["fairbatching"]], now)
    lines += ["The instance engine (`laxflow.sim.serving.instances`) with its defaults: Llama3-8B on one A800 per "
              "instance, vLLM's KV sizing, the schedulers' and routers' default options; rates per instance on a fixed "
              "grid; every point the mean over the seeds. SLO met = every token inside the deadline envelope (§3.1). "
              "Effective RPS = rate x attainment (Table 3's metric).", ""]
    lines += claim_rows(FB_CLAIMS, recs)
    return lines


def page_proserve(recs: dict[str, Record], now: str) -> list[str]:
    lines = header("ProServe (paper 003): the paper's figures and laxflow's", [recs["proserve"]], now)
    lines += ["The instance engine as for FairBatching; `qwen-trace` and `sharegpt` with priorities 2 / 1 (half each); "
              "baselines: vLLM-FCFS, Weighted VTC, Sarathi, Sarathi-Priority and FairBatching (§5.1). TDG with "
              "w_p / w_d = mean input / mean output of the run for every policy.", ""]
    lines += claim_rows(PS_CLAIMS, recs)
    return lines


# ---- component benchmarks


@dataclass(frozen=True)
class Target:
    key: str
    op: str  # "<=", ">=", "==" or "" (reported, no target)
    bound: float | None
    note: str = ""


TARGETS: dict[str, list[Target]] = {
    "shim": [Target("passthrough_ns", "<=", 50), Target("defer_release_ns", "<=", 1000),
             Target("tagged_open_ns", "<=", 60), Target("reattach_ms", "<=", 200, "2 x the 100 ms staleness"),
             Target("python_drain_events_per_s", ">=", 500_000)],
    "control_plane": [Target("permit_p50_us", "<=", 100, "at 10,000 messages/s"), Target("permit_p99_us", "<=", 2000),
                      Target("inter_ms_1000", "<=", 20, "1,000 active batches"), Target("events_per_s", "", None),
                      Target("hooks_call_up_p50_us", "", None),
                      Target("hooks_call_down_p99_us", "<=", 1000, "microseconds, not the 200 ms timeout per call")],
    "control_plane_idle": [Target("permit_idle_p50_us", "", None), Target("permit_idle_p99_us", "", None),
                           Target("permit_idle_acquire_p50_us", "", None), Target("permit_idle_acquire_p99_us", "", None)],
    "policy": [Target("mfs_decision_us_small", "<=", 100), Target("mfs_decision_ms_10000", "<=", 20),
               Target("inter_ms_1000x2048", "<=", 20)],
    "network": [Target("event_us_small", "<=", 5.7, "half of the 11.4 before the C flow table"),
                Target("recompute_ms_5000", "<=", 10), Target("recompute_ms_20000", "", None),
                Target("events_per_s", "", None)],
    "sim": [Target("paper_over_calib", "<=", 45, "paper-scale FS run / pure-Python calibration loop"),
            Target("mfs_over_fs", "<=", 1.5), Target("paper_scale_s", "", None), Target("mfs_paper_scale_s", "", None)],
    "preemption": [Target("ratio", ">=", 2, "paper 3.5-4.2x"), Target("operator_blocking_ms", "", None),
                   Target("layer_blocking_ms", "", None)],
    "mooncake_adapter": [],  # no target: what the wrapper adds, reported (every key of the JSON)
    "batch_policies": [],
    "soak": [Target("errors", "==", 0), Target("iterations", "", None), Target("bytes_verified", "", None)],
}
BENCHMARKS = list(TARGETS)


def _flat(doc: Any, prefix: str = "") -> dict[str, Any]:
    out = {}
    if isinstance(doc, dict):
        for k, v in doc.items():
            out.update(_flat(v, f"{prefix}{k}."))
    elif isinstance(doc, (int, float)) and not isinstance(doc, bool):
        out[prefix[:-1]] = doc
    return out


def target_rows(name: str, rec: Record, link: str) -> list[str]:
    """One bench's rows: key, latest value, target, met."""
    if not rec.ok:
        return [f"| `{name}` | {not_run(rec)} | | | |"]
    res = rec.result
    targets = TARGETS[name] or [Target(k, "", None) for k in _flat(res) if not k.startswith("machine")][:16]
    rows = []
    for i, t in enumerate(targets):
        first = ("" if i else f"[`{name}`]({link}{name}.json)" if link else f"`{name}` (`bench/results/{name}.json`)")
        try:
            v = get(res, t.key)
        except Missing:
            rows.append(f"| {first} | `{t.key}` | not in this run's JSON | {t.op} {t.bound if t.bound is not None else ''} | |")
            continue
        if t.op:
            met = {"<=": v <= t.bound, ">=": v >= t.bound, "==": v == t.bound}[t.op]
            goal = f"{t.op} {num(t.bound) if t.bound else t.bound}" + (f" ({t.note})" if t.note else "")
            verdict = "met" if met else "**not met**"
        else:
            goal, verdict = (t.note or "reported"), ""
        rows.append(f"| {first} | `{t.key}` | {num(v) if isinstance(v, (int, float)) else v} | {goal} | {verdict} |")
    return rows


def page_benchmarks(recs: dict[str, Record], now: str, link: str, title: str) -> list[str]:
    lines = header(title, [recs[n] for n in BENCHMARKS], now)
    lines += ["Each benchmark's latest JSON (kept under `bench/results/`) and its target, once. Timings are from the "
              "machine and load named above: on a shared 2-core box under load from other jobs the control-plane and "
              "shim figures can be 10-1000x worse than on a quiet one (a starved daemon falls behind). A timing is "
              "never a test assertion.", "",
              "| bench | key | latest | target | |", "|---|---|---|---|---|"]
    for name in BENCHMARKS:
        lines += target_rows(name, recs[name], link)
    lines.append("")
    return lines


# ----------------------------------------------------------------- the one-engine merge (issue 34)

# What changed in the physics of each engine since the "before" commit, by bench: the reason a value may move.
MERGE_PHYSICS = {
    "sim_claims": "the unit engine (MFS presets): its decode units run decode batches (`--decode steps`, now the "
                  "default) instead of holding a request's load for its output tokens x 30 ms; TTFT still ends at "
                  "the last P2D byte, so a value moves only through the router's choice of decode unit (a unit's load "
                  "now ends when its decode does). Nothing else changed: with `--decode hold` the 12 "
                  "`bench/sim_digest.py` hashes are equal at every step, and the section below pairs hold and steps "
                  "on the same runs",
    "flowprefill": "the unit engine with `--prefill` drivers: decode batches by default, as for `sim_claims`; with one "
                   "decode unit (1P1D) the router has no choice, so no value may move",
    "batching_repro": "the instance engine: a disaggregated request's TTFT now ends when its KV has landed on the "
                      "decode instance (it ended when the prefill instance emitted the first token), so `ps_disagg` "
                      "may lose attainment by the P2D transfer time; colocated presets move no KV and stay",
    "arrow_repro": "the instance engine: TTFT at the last P2D byte, as for `batching_repro`; Arrow's pools move KV "
                   "between instances, so sustainable rates may fall",
}


def _seeds(values: list[float]) -> str:
    return ", ".join(num(v) for v in values)


def merge_rows(rec: Record) -> list[str]:
    """Per bench: how many values moved, and every moved one before and after, with the paired difference."""
    if not rec.ok:
        return [not_run(rec), ""]
    lines: list[str] = []
    for name, b in get(rec.result, "benches").items():
        rows = b["rows"]
        lines += [f"### `{name}`", "",
                  f"{len(rows)} values (before: `{b['before_commit'][:12]}`); {b['changed']} moved, {b['beyond']} "
                  f"beyond their paired 95 % interval. What changed on this engine: {MERGE_PHYSICS.get(name, '-')}.", ""]
        moved = [r for r in rows if r["changed"]]
        if moved:
            lines += ["| point | metric | before (seeds) | after (seeds) | after - before (paired) |",
                      "|---|---|---|---|---|"]
            for r in moved:
                ci = r["diff_ci95"]
                diff = f"{r['diff']:+.3g}" + ("" if ci is None else f" ± {ci:.2g}") + (" *" if r["beyond"] else "")
                lines.append(f"| {r['point']} | {r['metric']} | {num(r['before_mean'])} ({_seeds(r['before'])}) | "
                             f"{num(r['after_mean'])} ({_seeds(r['after'])}) | {diff} |")
            lines.append("")
    return lines


def decode_rows(recs: dict[str, Record], steps_bench: str = "sim_claims") -> list[str]:
    """``<steps_bench>_hold`` (``--decode hold``) beside ``steps_bench`` (decode steps), paired by seed."""
    hold, steps = recs[f"{steps_bench}_hold"], recs[steps_bench]
    for rec in (steps, hold):
        if not rec.ok:
            return [not_run(rec), ""]
    before = get(hold.result, "points")
    rows, margins, moved, beyond, total = [], [], 0, 0, 0
    for key, line in get(steps.result, "points").items():
        old = before.get(key)
        if old is None or old["rate"] != line["rate"]:
            continue
        point = f"{key}@{line['rate']:g}"
        for p, new in line["policies"].items():
            a, b = old["policies"][p]["slo_attainment_seeds"], new["slo_attainment_seeds"]
            d = [round(y - x, 6) for x, y in zip(a, b)]  # (the seeds are rounded to 3 digits)
            ci = ci95(d) or 0.0
            mean = round(sum(d) / len(d), 6) + 0.0  # (+ 0.0: no "-0")
            total += 1
            moved += any(d)
            out = abs(mean) > ci
            beyond += out
            tpot = new.get("tpot_mean")
            rows.append(f"| {point} | {p} | {num(old['policies'][p]['slo_attainment'])} ({_seeds(a)}) | "
                        f"{num(new['slo_attainment'])} ({_seeds(b)}) | {mean:+.3g} ± {ci:.2g}{' *' if out else ''} | "
                        f"{'-' if tpot is None else f'{tpot * 1e3:.2f} ms'} |")
        margins.append(f"| {point} | {_diff_cell(old)} | {_diff_cell(line)} |")
    return [f"{total} values; {moved} moved, {beyond} beyond their paired 95 % interval.", "",
            "| point | MFS over the best baseline, hold | the same, steps |", "|---|---|---|", *margins, "",
            "| point | policy | hold (seeds) | steps (seeds) | steps - hold (paired) | TPOT mean (steps) |",
            "|---|---|---|---|---|---|", *rows, ""]


def page_merge(recs: dict[str, Record], now: str) -> list[str]:
    lines = header("One serving simulator: results before and after the merge",
                   [recs[n] for n in ("merge_compare", "sim_claims", "sim_claims_hold", "sim_claims_paper",
                                      "sim_claims_paper_hold")], now)
    lines += ["Issue 34 merges the unit-level engine (the MFS experiments) and the iteration-level instance engine "
              "(FairBatching, ProServe, Arrow) into one. Results may change only where the old split was wrong, "
              "and each change larger than its interval is explained by the physics that changed. "
              "`bench/merge_compare.py` reruns, on this tree, every command recorded before the merge "
              "(`bench/results/premerge/`, 3 seeds, every preset) and pairs each value with its old one on the same "
              "seeds; * where the paired 95 % interval excludes 0.", ""]
    lines += merge_rows(recs["merge_compare"])
    lines += ["## Decode batches (`--decode steps`) against the decode hold", "",
              "The unit engine's decode units run a request as decode batches within their KV memory (`--decode "
              "steps`, the default: the instance engine's decode) or hold its load for its output tokens x 30 ms "
              "(`--decode hold`, as the MFS paper's simulator, which stops at the first token). TTFT ends at the "
              "last P2D byte either way, so only the router's choice of decode unit can move it: with `steps` a "
              "unit's load ends when its decode does, and the unit it picks is where the prompt's KV goes (its P2D "
              "flows' path). `sim_claims_hold` and `sim_claims` run the same points, seeds and policies under each; "
              "* where the paired 95 % interval excludes 0.", ""]
    lines += decode_rows(recs)
    lines += ["### Under the paper's physics", "",
              "The same pairing for `sim_claims_paper_hold` and `sim_claims_paper` (`--physics paper`: pair-wise EP "
              "dispatch, per-group fair sharing, collectives at 60 % of a layer, reuse from arrival), where the "
              "fabric is far busier, so a P2D flow's path weighs more.", ""]
    lines += decode_rows(recs, "sim_claims_paper")
    return lines


# ----------------------------------------------------------------- pages

PAPER_PAGES = {
    "mfs": ("MFS", "001", page_mfs),
    "flowprefill": ("FlowPrefill", "000", page_flowprefill),
    "arrow": ("Arrow", "002", page_arrow),
    "proserve": ("ProServe", "003", page_proserve),
    "fairbatching": ("FairBatching", "004", page_fairbatching),
}


def page_index(recs: dict[str, Record], now: str) -> list[str]:
    lines = header("Results", list(recs.values()), now)
    lines += ["One page per paper, the paper's numbers beside laxflow's with 95 % intervals over seeds and the reason "
              "for each gap, and one page of component benchmarks against their targets. Every page is written by "
              "`make results` (`bench/results.py`) from the JSON each bench printed in this regeneration, kept "
              "under `bench/results/`; `python bench/results.py --only NAME` re-runs one bench, `--render-only` "
              "re-renders without running.", ""]
    lines += [f"- [{label} (paper {num_})]({slug}.md)" for slug, (label, num_, _) in PAPER_PAGES.items()]
    lines += ["- [Component benchmarks and targets](benchmarks.md)",
              "- [One serving simulator: results before and after the merge](merge.md)", ""]
    return lines


def render_all(results: Path, root: Path, now: str | None = None) -> list[Path]:
    """Write every page from ``results`` (a folder of bench JSONs) under ``root``; returns the paths written."""
    now = now or dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    recs = load(results, list(BENCHES))
    pages: dict[Path, list[str]] = {root / "docs/results/index.md": page_index(recs, now)}
    for slug, (_, _, fn) in PAPER_PAGES.items():
        pages[root / f"docs/results/{slug}.md"] = fn(recs, now)
    pages[root / "docs/results/benchmarks.md"] = page_benchmarks(recs, now, "", "Component benchmarks")
    pages[root / "docs/results/merge.md"] = page_merge(recs, now)
    readme = page_benchmarks(recs, now, "results/", "Benchmarks (`bench/`)")
    readme += ["## Running them", "",
               "`make results` runs every bench below and the paper reproductions, keeps each JSON under "
               "`bench/results/` and writes `docs/results/` and this file. One bench alone: "
               "`python bench/results.py --only NAME`; the commands:", "", "| name | command | what |", "|---|---|---|"]
    readme += [f"| `{b.name}` | `python {' '.join(b.args)}` | {b.about} |" for b in BENCHES.values()]
    readme += ["", "Not run by `make results` (tools, not benchmarks): `capacity.py` recomputes the simulator's "
               "`CAPACITY` table, `sim_digest.py` hashes fixed serving runs to show a speed-up changed nothing, "
               "`sim_paper.py` runs the MFS presets at chosen rates (`sim_claims.py` makes the paper table), "
               "`_machine.py`, `_daemon_bench.py`, `_schedule_replay.py` and `shim_bench.c` are parts of the "
               "benches above. `testbed_ratio` and `testbed_fidelity` need root (network namespaces and qdiscs).", ""]
    pages[root / "bench/README.md"] = readme
    for path, lines in pages.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(lines).rstrip() + "\n")
    return list(pages)
