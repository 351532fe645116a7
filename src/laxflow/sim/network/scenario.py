"""Scenario files of ``laxflow sim flows``: load, validate, run.

A scenario is a set of named links and flows over them (JSON)::

    {"links": [{"id": "L", "capacity": 1.0}],
     "flows": [{"id": "A", "path": ["L"], "size": 2.0, "arrival": 0.0,
                "stage": "reuse", "request": "r1", "deadline": 18.0,
                "downstream": 9.0, "layer": 3, "current_layer": 1}]}

A flow group may give ``usage`` ({link id: weight > 0}) instead of ``path``,
and ``pairs`` (> 0, default 1): the point-to-point flows it stands for, its
``size`` being one pair's bytes (``Flow.pairs``; read by ``sjf-group``).
The whole file is validated before anything runs; the first problem raises a
:class:`~laxflow.errors.UserError` naming the flow (or link) and the field.
Called by the ``laxflow sim flows`` command and by tests.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from laxflow.errors import UserError, read_json_file, user_errors
from laxflow.policy.flow import Flow, Stage
from laxflow.policy.registry import create_policy
from laxflow.sim.events import EventQueue, Priority
from laxflow.sim.network.engine import FluidNetwork
from laxflow.sim.network.topology import Topology

_FLOW_FIELDS = (
    "id", "path", "usage", "size", "arrival", "stage", "request",
    "deadline", "downstream", "layer", "current_layer", "pairs",
)  # fmt: skip
# Relative tolerance of "finish <= due".
MET_REL_TOL = 1e-9


@dataclass(frozen=True)
class FlowSpec:
    """One validated flow of a scenario (a fresh Flow is built per run)."""

    id: str
    links: tuple[int, ...]
    weights: tuple[float, ...]
    size: float
    arrival: float
    stage: Stage
    request: str
    deadline: float | None
    downstream: float
    layer: int | None
    current_layer: int | None
    pairs: float = 1.0

    def build(self) -> Flow:
        return Flow(
            id=self.id, size=self.size, links=list(self.links), weights=list(self.weights),
            arrival=self.arrival, stage=self.stage, request=self.request, deadline=self.deadline,
            downstream=self.downstream, layer=self.layer, current_layer=self.current_layer, pairs=self.pairs,
        )  # fmt: skip


@dataclass(frozen=True)
class Scenario:
    source: str
    topology: Topology
    flows: tuple[FlowSpec, ...]


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate a scenario file (UserError on any problem)."""
    return parse_scenario(read_json_file(path, "scenario file"), str(path))


def parse_scenario(data: Any, source: str = "scenario") -> Scenario:
    """Validate already-parsed JSON (see the module docstring for the format)."""
    if not isinstance(data, dict):
        raise UserError(f"{source}: expected a JSON object with 'links' and 'flows'")
    links = data.get("links")
    if not isinstance(links, list) or not links:
        raise UserError(f"{source}: field 'links' must be a non-empty list")
    ids: list[str] = []
    caps: list[float] = []
    for k, link in enumerate(links):
        if not isinstance(link, dict):
            raise UserError(f"{source}: link #{k}: expected an object with 'id' and 'capacity'")
        link_id = link.get("id")
        if not isinstance(link_id, str) or not link_id:
            raise UserError(f"{source}: link #{k}: field 'id' must be a non-empty string")
        if link_id in ids:
            raise UserError(f"{source}: link {link_id!r}: duplicate id")
        ids.append(link_id)
        caps.append(_number(link.get("capacity"), f"{source}: link {link_id!r}: field 'capacity'", positive=True))
    topology = Topology.from_links(ids, caps)
    flows = data.get("flows")
    if not isinstance(flows, list) or not flows:
        raise UserError(f"{source}: field 'flows' must be a non-empty list")
    specs: list[FlowSpec] = []
    seen: set[str] = set()
    for k, raw in enumerate(flows):
        spec = _parse_flow(raw, k, topology, source)
        if spec.id in seen:
            raise UserError(f"{source}: flow {spec.id!r}: field 'id' is a duplicate")
        seen.add(spec.id)
        specs.append(spec)
    return Scenario(source, topology, tuple(specs))


def _parse_flow(raw: Any, k: int, topology: Topology, source: str) -> FlowSpec:
    if not isinstance(raw, dict):
        raise UserError(f"{source}: flow #{k}: expected an object")
    flow_id = raw.get("id")
    if not isinstance(flow_id, str) or not flow_id:
        raise UserError(f"{source}: flow #{k}: field 'id' is required (a non-empty string)")
    where = f"{source}: flow {flow_id!r}"
    for key in raw:
        if key not in _FLOW_FIELDS:
            raise UserError(f"{where}: unknown field {key!r} (expected {', '.join(_FLOW_FIELDS)})")
    links, weights = _parse_route(raw, topology, where)
    if "size" not in raw:
        raise UserError(f"{where}: field 'size' is required (bytes, > 0)")
    size = _number(raw["size"], f"{where}: field 'size'", positive=True)
    arrival = _number(raw.get("arrival", 0.0), f"{where}: field 'arrival'", minimum=0.0)
    stage_text = raw.get("stage", Stage.P2D.value)
    with user_errors(f"{where}: field 'stage'"):
        stage = Stage.parse(stage_text) if isinstance(stage_text, str) else Stage.parse(repr(stage_text))
    request = raw.get("request", flow_id)
    if not isinstance(request, str) or not request:
        raise UserError(f"{where}: field 'request' must be a non-empty string")
    deadline = raw.get("deadline")
    if deadline is not None:
        deadline = _number(deadline, f"{where}: field 'deadline'")
    downstream = _number(raw.get("downstream", 0.0), f"{where}: field 'downstream'", minimum=0.0)
    layer = _layer(raw.get("layer"), f"{where}: field 'layer'")
    current = _layer(raw.get("current_layer"), f"{where}: field 'current_layer'")
    pairs = _number(raw.get("pairs", 1.0), f"{where}: field 'pairs'", positive=True)
    return FlowSpec(flow_id, links, weights, size, arrival, stage, request, deadline, downstream, layer, current,
                    pairs)


def _parse_route(raw: dict, topology: Topology, where: str) -> tuple[tuple[int, ...], tuple[float, ...]]:
    if ("path" in raw) == ("usage" in raw):
        raise UserError(f"{where}: exactly one of field 'path' (list of link ids) or 'usage' is required")
    if "path" in raw:
        path = raw["path"]
        if not isinstance(path, list) or not path:
            raise UserError(f"{where}: field 'path' must be a non-empty list of link ids")
        for link_id in path:
            if not isinstance(link_id, str) or link_id not in topology:
                raise UserError(f"{where}: field 'path': unknown link {link_id!r}")
        if len(set(path)) != len(path):
            raise UserError(f"{where}: field 'path' crosses a link twice")
        return tuple(topology.index(x) for x in path), (1.0,) * len(path)
    usage = raw["usage"]
    if not isinstance(usage, dict) or not usage:
        raise UserError(f"{where}: field 'usage' must be a non-empty object {{link id: weight}}")
    links, weights = [], []
    for link_id, w in usage.items():
        if link_id not in topology:
            raise UserError(f"{where}: field 'usage': unknown link {link_id!r}")
        links.append(topology.index(link_id))
        weights.append(_number(w, f"{where}: field 'usage' weight of link {link_id!r}", positive=True))
    return tuple(links), tuple(weights)


def _number(value: Any, what: str, positive: bool = False, minimum: float | None = None) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise UserError(f"{what} must be a number (got {value!r})")
    x = float(value)
    if not math.isfinite(x):
        raise UserError(f"{what} must be finite (got {value!r})")
    if positive and x <= 0:
        raise UserError(f"{what} must be > 0 (got {value!r})")
    if minimum is not None and x < minimum:
        raise UserError(f"{what} must be >= {minimum:g} (got {value!r})")
    return x


def _layer(value: Any, what: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise UserError(f"{what} must be a non-negative integer (got {value!r})")
    return value


def run_scenario(scenario: Scenario, policy_name: str) -> dict[str, Any]:
    """Run one policy on the scenario; returns the ``laxflow sim flows --json`` object.

    Flows arrive at their ``arrival`` times (ARRIVAL events, file order at
    equal times). ``finish`` is null for a flow that never completes (the
    policy starved it and nothing else was left to happen), and then
    ``makespan`` is null too.
    """
    policy = create_policy(policy_name)
    queue = EventQueue()
    net = FluidNetwork(scenario.topology, policy, queue)
    flows = [spec.build() for spec in scenario.flows]
    for flow in flows:
        queue.push(flow.arrival, Priority.ARRIVAL, net.add_flow, flow)
    queue.run()
    rows = []
    for flow in flows:
        due = flow.due
        met = None
        if due is not None:
            met = flow.finish is not None and (
                flow.finish <= due or math.isclose(flow.finish, due, rel_tol=MET_REL_TOL, abs_tol=0.0)
            )
        rows.append({"id": flow.id, "finish": flow.finish, "due": due, "met": met})
    finishes = [f.finish for f in flows]
    makespan = None if any(t is None for t in finishes) else max(finishes)
    return {"policy": policy_name, "makespan": makespan, "flows": rows}
