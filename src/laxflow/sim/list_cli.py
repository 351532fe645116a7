"""``laxflow sim list models|deployments|workloads|presets|policies``: what the simulator knows, one line each.

Registered on the ``laxflow sim`` app by :mod:`laxflow.sim.cli`. Every line
starts with the name a flag takes (``--model``, ``--workload``, ``--preset``,
``--policies``), then two spaces and what it is.
"""

from __future__ import annotations

from typing import Callable

import typer

from laxflow.errors import UserError


def _models() -> list[tuple[str, str]]:
    from laxflow.sim.models import MODELS

    out = []
    for m in MODELS.values():
        ffn = f"{m.num_experts} experts top-{m.top_k}" if m.num_experts > 1 else "dense"
        out.append((m.name, f"{m.num_layers} layers, hidden {m.hidden}, {ffn}, context {m.max_context}"))
    return out


def _deployments() -> list[tuple[str, str]]:
    from laxflow.sim.models import DEPLOYMENTS

    return [(d.name, f"{d.model} TP{d.tp} EP{d.ep} SP{d.sp}, {d.gpus} GPUs per unit ({d.gpu.name}, "
                     f"{d.nic_gbps:g} Gbit/s NIC per GPU, {d.gpus_per_node} per server)")
            for d in DEPLOYMENTS.values()]


def _workloads() -> list[tuple[str, str]]:
    from laxflow.sim.workload import WORKLOADS

    return [(w.name, f"{w.kind}, target ~{w.target_mean_input} prompt tokens, {w.target_reuse:.0%} reuse, "
                     f"{w.block_size}-token blocks") for w in WORKLOADS.values()]


def _presets() -> list[tuple[str, str]]:
    from laxflow.sim.serving.experiment import PRESETS

    return [(p.name, p.description) for p in PRESETS.values()]


def _policies() -> list[tuple[str, str]]:
    from laxflow.policy.registry import available_policies, policy_class

    out = []
    for name in available_policies():
        doc = (policy_class(name).__doc__ or "").strip().splitlines()
        out.append((name, doc[0].rstrip(".") if doc else ""))
    return out


KINDS: dict[str, Callable[[], list[tuple[str, str]]]] = {
    "models": _models, "deployments": _deployments, "workloads": _workloads, "presets": _presets,
    "policies": _policies,
}


def list_(what: str = typer.Argument(..., help="models, deployments, workloads, presets or policies.")) -> None:
    """Print what exists, one per line: its name, then what it is."""
    if what not in KINDS:
        raise UserError(f"laxflow sim list: unknown {what!r} (expected one of {', '.join(KINDS)})")
    rows = KINDS[what]()
    width = max(len(name) for name, _ in rows)
    for name, text in rows:
        typer.echo(f"{name:<{width}}  {text}")


def register(app: typer.Typer) -> None:
    """Add ``list`` to the ``laxflow sim`` app."""
    app.command("list")(list_)
