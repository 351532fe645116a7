"""The cluster: servers, GPUs, NICs, the network topology, and unit placement.

Built once per simulation by :class:`~laxflow.sim.serving.simulator.ServingSimulator`.
GPU g has NIC g; server s holds GPUs ``s*G .. s*G+G-1``. Prefill units take
consecutive GPUs of the prefill servers, decode units those of the decode
servers. Traffic between two GPUs of the same server rides the intra-node
fabric (NVSwitch), which is not shared with the network: it never becomes a
flow, only a transfer time at NVSwitch speed.

Every transfer shape the simulator issues (a collective inside a unit, a KV
move from one unit to another) is turned into a :class:`Pattern` once and
cached: the sparse usage vector of its network part plus how many network
bytes and how much per-GPU NVSwitch traffic one unit of payload makes. A
flow of any size then reuses the same usage arrays.

Per-flow fairness: a transfer shape is a group of point-to-point flows (one
per inter-server GPU pair, i.e. one per queue pair), and per-QP congestion
control shares a link equally among the flows that cross it, whichever
group they belong to. The network engine runs max-min on one rate per flow
group, so a group of P pairs is handed to it in per-pair units: size = bytes
/ P, usage weight on link l = (pairs crossing l) = P x (bytes on l / bytes).
Max-min on that rate gives every pair crossing a link the same share as a
lone flow there (the MFS paper's Fig. 6b: one all-to-all flow and one KV
flow into a port get 50/50), and the group's completion time is unchanged
(bytes / (P x per-pair rate)). Pairs of one group carry equal bytes here
(uniform all-to-alls, rings, KV shards), so per-pair units are exact.

Per-group fairness (``ClusterConfig.fairness = "group"``, the MFS paper's
fair-sharing baseline, see ``config.FAIRNESS``): the group counts as ONE
flow at its busiest link instead. Its weights are divided by their largest
value W and its size multiplied by W (``Pattern.pairs`` becomes P / W, the
group's units), so max-min gives the group the share of one flow at the link
where it has the most pairs; bytes per link and the idle completion time are
the same as under per-pair units.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np

from laxflow.errors import UserError
from laxflow.sim.network import Topology, big_switch, leaf_spine, mfs_testbed
from laxflow.sim.serving.config import ClusterConfig


@dataclass(frozen=True)
class Unit:
    """A model replica: a prefill or decode unit on consecutive GPUs."""

    index: int
    kind: str  # "prefill" or "decode"
    gpus: tuple[int, ...]  # GPU (= NIC) numbers

    @property
    def name(self) -> str:
        return f"{self.kind[0]}{self.index}"


@dataclass(frozen=True)
class Pattern:
    """How one unit of payload of a transfer shape loads the fabric.

    For payload x (bytes, in the shape's own unit: per GPU for a collective,
    in total for a unit-to-unit move) the network flow group moves
    ``x * net_bytes`` bytes with usage ``(links, weights)``, and the busiest
    GPU sends ``x * intra_bytes`` bytes over NVSwitch.
    """

    links: np.ndarray
    weights: np.ndarray  # per-pair units: pairs of the group crossing each link (see module docstring)
    net_bytes: float
    intra_bytes: float
    bottleneck: float  # bytes/s of the whole group alone on an idle network (inf if no network part)
    # The group's units on the network: its inter-server GPU pairs (point-to-point flows) under per-QP
    # fairness, pairs / (largest weight) under per-group fairness; flow size = bytes / pairs.
    pairs: float = 1


class Cluster:
    """Topology plus placement; answers transfer patterns (cached)."""

    def __init__(self, config: ClusterConfig, prefill_unit_gpus: int, decode_unit_gpus: int | None = None) -> None:
        config.validate()
        self.config = config
        g = config.gpus_per_server
        self.gpus_per_server = g
        self.num_gpus = config.servers * g
        self.topology: Topology = self._build_topology(config)
        prefill_gpus = config.prefill_servers * g
        decode_gpus = self.num_gpus - prefill_gpus
        d_size = decode_unit_gpus or config.decode_unit_gpus or prefill_unit_gpus
        if prefill_unit_gpus > prefill_gpus:
            raise UserError(
                f"cluster: a prefill unit needs {prefill_unit_gpus} GPUs but the {config.prefill_servers} prefill "
                f"servers have {prefill_gpus}; raise --servers"
            )
        if d_size > decode_gpus:
            raise UserError(f"cluster: a decode unit needs {d_size} GPUs but the decode servers have {decode_gpus}; raise --servers")
        self.prefill_units = [
            Unit(i, "prefill", tuple(range(i * prefill_unit_gpus, (i + 1) * prefill_unit_gpus)))
            for i in range(prefill_gpus // prefill_unit_gpus)
        ]
        self.decode_units = [
            Unit(i, "decode", tuple(range(prefill_gpus + i * d_size, prefill_gpus + (i + 1) * d_size)))
            for i in range(decode_gpus // d_size)
        ]
        self._patterns: dict[tuple, Pattern] = {}

    @staticmethod
    def _build_topology(config: ClusterConfig) -> Topology:
        """The ``config.topology`` fabric over every GPU's NIC (``servers x gpus_per_server`` of them)."""
        g = config.gpus_per_server
        num_gpus = config.servers * g
        cap = config.nic_bytes_per_s
        if config.topology == "fat-tree":
            return leaf_spine(num_gpus, min(config.nics_per_leaf, num_gpus), cap, config.oversubscription)
        if config.topology == "big-switch":
            return big_switch(num_gpus, cap)
        return mfs_testbed(config.servers, g, cap)

    @classmethod
    def placed(cls, config: ClusterConfig, prefill_units: Sequence[Unit], decode_units: Sequence[Unit]) -> "Cluster":
        """``config``'s servers and fabric with units its caller placed (GPU numbers < servers x gpus_per_server).

        For an engine whose replicas are its own (the iteration-level engine's
        ``placement="cluster"``: ``instances/fabric.py``'s ``instance_cluster``);
        the prefill / decode server split of ``config`` is not applied.
        """
        config.validate()
        self = cls.__new__(cls)
        self.config = config
        self.gpus_per_server = config.gpus_per_server
        self.num_gpus = config.servers * config.gpus_per_server
        for unit in (*prefill_units, *decode_units):
            if not unit.gpus or min(unit.gpus) < 0 or max(unit.gpus) >= self.num_gpus:
                raise UserError(f"cluster: unit {unit.name} has GPUs {unit.gpus} outside the {self.num_gpus} GPUs of "
                                f"{config.servers} servers x {config.gpus_per_server}; raise --servers")
        self.topology = self._build_topology(config)
        self.prefill_units, self.decode_units = list(prefill_units), list(decode_units)
        self._patterns = {}
        return self

    @classmethod
    def on_topology(cls, topology: Topology, gpus_per_server: int) -> "Cluster":
        """GPU (= NIC) ``g`` of ``topology`` on server ``g // gpus_per_server``, and nothing placed.

        For an engine that places its own replicas and asks only transfer
        patterns (the iteration-level engine: ``instances/fabric.py``'s
        ``instance_ports``); no ``ClusterConfig`` (``config`` is None) and no units.
        """
        self = cls.__new__(cls)
        self.config = None  # type: ignore[assignment]
        self.gpus_per_server = gpus_per_server
        self.num_gpus = topology.num_nics
        self.topology = topology
        self.prefill_units, self.decode_units = [], []
        self._patterns = {}
        return self

    @property
    def prefill_gpus(self) -> int:
        return sum(len(u.gpus) for u in self.prefill_units)

    def server_of(self, gpu: int) -> int:
        return gpu // self.gpus_per_server

    # -- patterns ------------------------------------------------------------------

    def collective(self, unit: Unit, kind: str, groups: Sequence[Sequence[int]]) -> Pattern:
        """A collective among the unit's GPUs, per GPU payload 1 byte (cached).

        ``kind`` is ``"uniform"`` (each GPU spreads its bytes evenly over all
        members of its group, itself included: uniform MoE routing, where the
        share a GPU keeps never leaves it) or ``"ring"`` (each GPU sends its
        bytes to the next member: ring attention, ring all-reduce). ``groups``
        are positions in ``unit.gpus``.
        """
        key = ("coll", unit.kind, unit.index, kind, tuple(map(tuple, groups)))
        if key not in self._patterns:
            traffic: dict[tuple[int, int], float] = {}
            for group in groups:
                members = [unit.gpus[i] for i in group]
                n = len(members)
                if n < 2:
                    continue
                for a, src in enumerate(members):
                    if kind == "ring":
                        peers = [(members[(a + 1) % n], 1.0)]
                    else:
                        peers = [(dst, 1.0 / n) for dst in members if dst != src]
                    for dst, share in peers:
                        traffic[(src, dst)] = traffic.get((src, dst), 0.0) + share
            self._patterns[key] = self.pattern(traffic)
        return self._patterns[key]

    def ep_hierarchical(self, unit: Unit, hits: Sequence[float], fanout: float) -> Pattern:
        """Hierarchical MoE dispatch/combine over the unit, per GPU payload 1 byte (cached).

        Each GPU sends ``hits[n]`` of its payload to the GPU of the same local
        rank on the unit's n-th server (once per token and remote node, see
        ``laxflow.sim.models.collectives``); ``fanout`` is the NVSwitch bytes
        per payload byte a GPU moves to hand tokens to its node's experts.
        """
        key = ("ep-hier", unit.kind, unit.index, tuple(hits), fanout)
        if key not in self._patterns:
            servers: dict[int, list[int]] = {}
            for g in unit.gpus:
                servers.setdefault(self.server_of(g), []).append(g)
            nodes = [servers[k] for k in sorted(servers)]
            traffic: dict[tuple[int, int], float] = {}
            for a, members in enumerate(nodes):
                for pos, src in enumerate(members):
                    for b, peers in enumerate(nodes):
                        if b != a and hits[b] > 0:
                            traffic[(src, peers[pos % len(peers)])] = hits[b]
            p = self.pattern(traffic) if traffic else Pattern(np.zeros(0, dtype=np.int64), np.zeros(0), 0.0, 0.0,
                                                             float("inf"), 0)
            self._patterns[key] = replace(p, intra_bytes=fanout)
        return self._patterns[key]

    def transfer(self, src: Sequence[int], dst: Sequence[int]) -> Pattern:
        """KV sharded evenly over GPUs ``src``, GPU k to GPU ``dst[k mod |dst|]``; total payload 1 byte (cached)."""
        key = ("move", tuple(src), tuple(dst))
        if key not in self._patterns:
            self._patterns[key] = self.pattern(self.transfer_traffic(src, dst, 1.0))
        return self._patterns[key]

    @staticmethod
    def transfer_traffic(src: Sequence[int], dst: Sequence[int], payload: float) -> dict[tuple[int, int], float]:
        m = len(src)
        traffic: dict[tuple[int, int], float] = {}
        for k, s in enumerate(src):
            d = dst[k % len(dst)]
            traffic[(s, d)] = traffic.get((s, d), 0.0) + payload / m
        return traffic

    def pattern(self, traffic: dict[tuple[int, int], float]) -> Pattern:
        """The pattern of a src->dst byte matrix (GPU numbers): network part and NVSwitch part."""
        net = {p: b for p, b in traffic.items() if self.server_of(p[0]) != self.server_of(p[1]) and b > 0}
        intra: dict[int, float] = {}
        for (s, d), b in traffic.items():
            if s != d and self.server_of(s) == self.server_of(d):
                intra[s] = intra.get(s, 0.0) + b
        intra_bytes = max(intra.values(), default=0.0)
        if not net:
            empty = np.zeros(0, dtype=np.int64)
            return Pattern(empty, np.zeros(0), 0.0, intra_bytes, float("inf"), 0)
        links, weights, total = self.topology.usage(net)
        bottleneck = float(np.min(self.topology.capacity[links] / weights))
        weights = weights * len(net)
        units: float = len(net)
        if self.config is not None and self.config.fairness == "group":
            top = float(weights.max())
            weights, units = weights / top, units / top
        # Read-only: every flow of this shape shares these arrays, and the
        # network engine merges and checks a frozen pair once per run.
        links.flags.writeable = False
        weights.flags.writeable = False
        return Pattern(links, weights, total, intra_bytes, bottleneck, units)
