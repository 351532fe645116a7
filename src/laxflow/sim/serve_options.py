"""The flags of ``laxflow sim serve`` and ``laxflow sim sweep``, defined once, and ``--config`` files.

:data:`FLAGS` is the one list; :func:`command` turns a function taking the
resolved values into a typer command with the flags its command uses, and
fills flags the user did not give on the command line from ``--config FILE``
(TOML, or YAML with pyyaml): the command line wins, the file comes next,
the built-in default last. Called at import by :mod:`laxflow.sim.serve_cli`;
the resolution runs in the CLI process before anything is simulated.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import typer

from laxflow.errors import UserError

BOTH = frozenset({"serve", "sweep"})


@dataclass(frozen=True)
class Flag:
    """One command-line flag: its parameter name, spelling, type, default and which commands have it."""

    name: str
    flag: str
    kind: str  # how a --config value is checked: int, float, str, list, seeds, path, bool
    help: str
    default: Any = None
    commands: frozenset[str] = BOTH

    @property
    def key(self) -> str:
        """Its key in a --config file: the flag without dashes."""
        return self.flag.lstrip("-")


_TYPES = {"int": Optional[int], "float": Optional[float], "str": Optional[str], "list": Optional[str],
          "seeds": Optional[str], "path": Optional[Path], "bool": bool}

FLAGS: tuple[Flag, ...] = (
    Flag("preset", "--preset", "str", "demo, testbed-qwenA, testbed-qwenB, fig10-mixtral, ..., fig13 "
         "(laxflow sim list presets)."),
    Flag("config", "--config", "path", "TOML or YAML file of flags (keys: flag names without --); "
         "command-line flags win."),
    Flag("model", "--model", "str", "Model name (laxflow sim list models)."),
    Flag("workload", "--workload", "str", "Synthetic workload (laxflow sim list workloads; with the instance "
         "engine: azure-code, azure-conv, burstgpt, mooncake-clip, qwen-trace, sharegpt, each with its SLOs)."),
    Flag("rate", "--rate", "float", "Requests/s per prefill GPU, Poisson arrivals (preset: its highest rate; "
         "a trace: its own timestamps).", commands=frozenset({"serve"})),
    Flag("rates", "--rates", "list", "Comma-separated requests/s per prefill GPU.", commands=frozenset({"sweep"})),
    Flag("policies", "--policies", "list", "Comma-separated flow policies (registered names or module:Class)."),
    Flag("prefill", "--prefill", "list", "Comma-separated prefill schedulers (flowprefill, fcfs, edf-cp2k, "
         "edf-cp8k, edf-layer) driving every prefill unit (all but fcfs with preemption, and on one attention-DP "
         "rank; with --instances P:D the prefill instances are such units), or iteration-level batch schedulers "
         "(fairbatching, fairbatching-pab, sarathi, vllm, slidebatching, weighted-vtc, edf, sjf, priority) on the "
         "instance engine (decode modelled); "
         "runs each with every policy. Default: fcfs (run-to-end batches, one per attention-DP rank)."),
    Flag("router", "--router", "list", "Comma-separated request routers of the instance engine (pab, dplb, "
         "gorouting, minload); default dplb, and with --pools the pool manager dispatches."),
    Flag("pools", "--pools", "list", "Comma-separated pool managers of the instance engine (laxflow sim list: "
         "integrations.pools)."),
    Flag("instances", "--instances", "str", "Instance engine: N PD-colocated instances, or P:D prefill:decode "
         "instances (disaggregated); the rate is then requests/s per instance (default 1)."),
    Flag("network", "--network", "str", "Instance engine: fabric (every transfer is a flow on the network under "
         "the flow policy; default) or ideal (transfers cost nothing and land at once)."),
    Flag("decode", "--decode", "str", "Prefill-unit engine: steps (decode units run continuous decode batches "
         "with KV memory: TPOT and TBT are measured; default) or hold (a decode unit is held output tokens x 30 ms "
         "for the router's load, no decode runs). The instance engine always runs decode steps."),
    Flag("p2d", "--p2d", "str", "Instance engine: prompt (a prompt's KV leaves whole after its last prefill step; "
         "default with batch schedulers) or layer (each chunk's KV leaves layer by layer as its step computes it; "
         "prefill units' only choice)."),
    Flag("placement", "--placement", "str", "Instance engine: ports (one port per instance, NIC x its GPUs, on a "
         "non-blocking switch; default with batch schedulers) or cluster (instances on consecutive GPUs of the "
         "--servers/--topology cluster, prefill first, one NIC per GPU; prefill units' only choice)."),
    Flag("dispatch", "--dispatch", "str", "Prefill-unit routing: load (prefix overlap + queued tokens; default) "
         "or ttft (network-inclusive TTFT estimate, as the hooks' dispatch_advice)."),
    Flag("requests", "--requests", "int", "Measured requests per run (default 1024; at most 1,000,000 with "
         "the warm-up)."),
    Flag("warmup", "--warmup", "int", "Warm-up requests left out of the metrics (512)."),
    Flag("seed", "--seed", "int", "Workload seed (0); the first of --seeds N."),
    Flag("seeds", "--seeds", "seeds", "N: run every point on N seeds from --seed; or a comma-separated seed "
         "list. Reports the mean and a 95% confidence interval."),
    Flag("servers", "--servers", "int", "Servers, half prefill, half decode (256)."),
    Flag("slo_scale", "--slo-scale", "float", "SLO = this x TTFT alone on the idle cluster (3)."),
    Flag("tpot_slo", "--tpot-slo", "float", "Each request's TPOT SLO in seconds, both engines (default: the "
         "workload's; the SLO workloads have one, the MFS workloads none). With it the prefill units' decode steps "
         "report tpot_attainment and the token envelopes' attainments beside TTFT's."),
    Flag("topology", "--topology", "str", "fat-tree, big-switch or testbed."),
    Flag("nic_gbps", "--nic-gbps", "float", "NIC bandwidth per GPU in Gbit/s, both engines (default: the "
         "deployment's); a preset's rates stay as they are (sim map normalizes load per NIC)."),
    Flag("kv_placement", "--kv-placement", "str", "Where reusable KV lives: pool (the paper's: on the unit that "
         "computed it, others fetch it) or local-cache (every unit keeps a copy). Default: the preset's."),
    Flag("physics", "--physics", "str", "faithful (default: laxflow's model) or paper (the MFS paper's "
         "assumptions: pairwise EP dispatch, fair sharing per flow group, collectives 60 % of an idle layer, the "
         "workload's reuse realized); a preset's rates become the same fractions of the capacity under it. "
         "The four flags below override one choice each."),
    Flag("ep_comm", "--ep-comm", "str", "MoE exchange of every MoE unit: hierarchical, allgather or pairwise "
         "(default: the deployment's)."),
    Flag("fairness", "--fairness", "str", "How a link is shared: qp (per queue pair, RDMA congestion control; "
         "default) or group (per flow group: a collective counts as one flow, the paper's fair sharing)."),
    Flag("comm_share", "--comm-share", "float", "Scale compute so a layer's blocking collectives are this share "
         "of it on an idle fabric (default: the roofline's compute)."),
    Flag("reuse_from", "--reuse-from", "str", "When a prompt's KV becomes reusable: stored (when its prefill "
         "ends; default) or routed (from its arrival: the workload's reuse ratio realized)."),
    Flag("trace", "--trace", "path", "Replay a trace file instead of a synthetic workload."),
    Flag("trace_format", "--trace-format", "str", "Trace format: qwen-bailian, mooncake, azure, burstgpt "
         "(with --trace)."),
    Flag("time_scale", "--time-scale", "float", "Replay --trace at its own timestamps divided by this "
         "(2: twice as fast, bursts kept); --rate instead re-times arrivals as Poisson.",
         commands=frozenset({"serve"})),
    Flag("json_out", "--json", "path", "Write results as JSON to this file ('-': stdout, the table goes to "
         "stderr)."),
    Flag("plot", "--plot", "path", "Write a plot (.png, .pdf, .svg, ...): serve: attainment and TTFT CDFs; "
         "sweep: attainment against rate."),
    Flag("requests_out", "--requests-out", "path", "Write one row per measured request and policy (.csv or "
         ".jsonl)."),
    Flag("jobs", "--jobs", "int", "Parallel worker processes (0: one per CPU, up to 8).", default=0),
    Flag("ray_address", "--ray", "str", "Run on a Ray cluster at this address (extra 'ray').",
         commands=frozenset({"sweep"})),
    Flag("quiet", "--quiet", "bool", "No progress bar.", default=False),
)


def flags_of(which: str) -> list[Flag]:
    return [f for f in FLAGS if which in f.commands]


def command(run: Callable[[dict[str, Any]], None], which: str, doc: str) -> Callable[..., None]:
    """A typer command for ``which`` (serve or sweep) that calls ``run(values)`` with every flag resolved."""
    flags = flags_of(which)

    def cmd(ctx: typer.Context, **given: Any) -> None:
        values = dict(given)
        path = values.pop("config")
        if path is not None:
            for name, value in load_config(path, which).items():
                # A flag typed on the command line wins over the file.
                if ctx.get_parameter_source(name).name not in ("COMMANDLINE", "ENVIRONMENT"):
                    values[name] = value
        run(values)

    params = [inspect.Parameter("ctx", inspect.Parameter.KEYWORD_ONLY, annotation=typer.Context)]
    for f in flags:
        params.append(inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, annotation=_TYPES[f.kind],
                                        default=typer.Option(f.default, f.flag, help=f.help)))
    cmd.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    cmd.__annotations__ = {p.name: p.annotation for p in params}
    cmd.__doc__ = doc
    cmd.__name__ = which
    return cmd


# -- --config FILE -----------------------------------------------------------------


def _read(path: Path) -> dict[str, Any]:
    where = f"--config: {str(path)!r}"
    if path.is_dir():
        raise UserError(f"{where}: is a directory, expected a .toml or .yaml file")
    suffix = path.suffix.lower()
    if suffix not in (".toml", ".yaml", ".yml"):
        raise UserError(f"{where}: expected a .toml, .yaml or .yml file")
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise UserError(f"{where}: cannot read ({exc.strerror})") from None
    except UnicodeDecodeError as exc:
        raise UserError(f"{where}: not UTF-8 text (byte {exc.start})") from None
    if suffix == ".toml":
        import tomllib

        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise UserError(f"{where}: not valid TOML ({exc})") from None
    else:
        try:
            import yaml
        except ImportError:
            raise UserError(f"{where}: YAML needs the pyyaml package (or write the file as TOML)") from None
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            at = f" at line {mark.line + 1} column {mark.column + 1}" if mark else ""
            raise UserError(f"{where}: not valid YAML ({getattr(exc, 'problem', None) or 'syntax error'}{at})") \
                from None
        data = {} if data is None else data
    if not isinstance(data, dict):
        raise UserError(f"{where}: expected a table of flag = value, got {type(data).__name__}")
    return data


def _check(f: Flag, value: Any, where: str) -> Any:
    """``value`` from a config file as the flag's command-line value, or one UserError."""
    bad = UserError(f"{where}: key '{f.key}': expected {_EXPECTED[f.kind]}, got {value!r}")
    if f.kind == "bool":
        if not isinstance(value, bool):
            raise bad
        return value
    if f.kind == "int" or (f.kind == "seeds" and isinstance(value, int)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad
        return value if f.kind == "int" else str(value)
    if f.kind == "float":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise bad
        return float(value)
    if f.kind in ("list", "seeds") and isinstance(value, list):
        if not value or not all(isinstance(v, (str, int, float)) and not isinstance(v, bool) for v in value):
            raise bad
        return ",".join(str(v) for v in value)
    if not isinstance(value, str):
        raise bad
    return Path(value) if f.kind == "path" else value


_EXPECTED = {"int": "an integer", "float": "a number", "str": "a string", "list": "a list or a comma-separated "
             "string", "seeds": "a number of seeds or a list of seeds", "path": "a file path string",
             "bool": "true or false"}


def load_config(path: Path, which: str) -> dict[str, Any]:
    """Flag values from a config file, by parameter name; unknown or mistyped keys are one UserError."""
    where = f"--config: {str(path)!r}"
    data = _read(path)
    known = {f.key: f for f in flags_of(which) if f.name != "config"}
    known.update({f.name: f for f in known.values()})  # slo_scale as well as slo-scale
    out: dict[str, Any] = {}
    for key, value in data.items():
        f = known.get(str(key))
        if f is None:
            raise UserError(f"{where}: unknown key {key!r} for sim {which} "
                            f"(expected one of {', '.join(k for k in known if '_' not in k)})")
        out[f.name] = _check(f, value, where)
    return out
