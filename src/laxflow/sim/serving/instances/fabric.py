"""Transfers as flows: every byte a serving engine moves between GPUs, on the run's flow-level network.

One :class:`Fabric` per run, built by its engine (the unit-level
:class:`~laxflow.sim.serving.batch.BatchContext`, the iteration-level
:class:`~.engine.InstanceEngine`) over a :class:`~laxflow.sim.serving.cluster.Cluster`
(topology plus which server each GPU sits on) and the run's
:class:`~laxflow.sim.network.FluidNetwork`; everything runs on the engine's
one thread and :class:`~laxflow.sim.events.EventQueue`.

A transfer is (stage, bytes, source GPUs, destination GPUs, deadline, layer,
downstream). Its bytes between GPUs of different servers are one flow group
on the network (per-pair units, see ``cluster.py``), under the run's flow
policy; its bytes between GPUs of one server ride NVSwitch, which is not
shared: a time at ``nvswitch_bytes_per_s`` for the busiest GPU, its own event
only when it can land after the network part. The work is split in two so the
hot path stays cheap (hundreds of thousands of flows at paper scale):

* :meth:`Fabric.shape` / :meth:`Fabric.move`, once per transfer shape (a
  batch's collective repeats every layer, a request's per-layer KV is the
  same every layer): a :class:`Shape` holding the float results every flow of
  that shape shares;
* :meth:`Fabric.issue`, once per flow: the flow on the network (and the
  NVSwitch event), the bytes counted per stage in :attr:`Fabric.delivered`
  when the network part lands.

:class:`IdealFabric` is the iteration-level engine's ``--network ideal``:
transfers cost nothing and land at once; :func:`create_fabric` picks one by
its ``--network`` name (:data:`NETWORKS`).

Placement of the iteration-level engine (:func:`instance_ports`, the rule
until its instances get server placement and per-layer P2D): instance k is
server k, and the NICs of its GPUs are bonded into ONE port of NIC x GPUs
bytes/s on a non-blocking switch (``big_switch``, one port per instance). So
an instance's KV leaves through its port whole, as one flow src port -> dst
port; no two instances share a server (no P2D over NVSwitch) or a link other
than their own ports; traffic inside an instance (TP all-reduces) is no flow
(the step time's NVLink term, ``profile.StepTimer``). ``--servers`` and
``--topology`` do not apply to this placement.

The second placement (:func:`instance_cluster`, ``InstanceSimConfig.placement
= "cluster"``): the instances are units of a ``ClusterConfig``-backed
:class:`~laxflow.sim.serving.cluster.Cluster` (``--servers``, ``--topology``,
the deployment's node: GPUs and NIC per server), on consecutive GPUs in the
engine's instance order, prefill instances first, one NIC per GPU. Two
instances on one server move KV over NVSwitch (no flow); across servers a
TP-g instance's KV is g per-GPU pairs (per-pair units, ``cluster.py``), the
same bytes as the bonded port of :func:`instance_ports`, not the same flow.
Under either placement the traffic inside a batch-scheduler or decode
instance (TP all-reduces, EP all-to-alls of a wide one) is a term of its step
time (``profile.StepTimer``), no flow; only prefill units
(``instances/unit.py``) run their layer plan's collectives as flows.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Sequence

import numpy as np

from laxflow.errors import UserError
from laxflow.policy.flow import Flow, Stage
from laxflow.sim.events import EventQueue, Priority
from laxflow.sim.network import FluidNetwork, big_switch
from laxflow.sim.serving.cluster import Cluster, Pattern, Unit
from laxflow.sim.serving.config import ClusterConfig
from laxflow.sim.serving.instances.config import NETWORKS


class Shape(NamedTuple):
    """One transfer with its payload applied to its pattern: what every flow issued for it shares,
    computed once (a transfer repeats layer after layer) by :meth:`Fabric.shape`."""

    stage: Stage
    net: float  # bytes over the network, true bytes (0: no network part)
    size: float  # the flow's size, in the engine's per-pair units
    links: np.ndarray  # the pattern's read-only usage arrays (the engine caches their merge by id)
    weights: np.ndarray
    intra: float  # s of the busiest GPU's NVSwitch part
    intra_event: bool  # whether the NVSwitch part gets its own event (it may land after the network part)
    key: str  # the stage's key in Fabric.delivered (its value, read once: an enum property per flow is not free)
    pairs: float  # the pattern's units: net / size (Flow.pairs)


class Fabric:
    """The run's transfers: shapes from the cluster's patterns, flows on its network, bytes per stage."""

    def __init__(self, queue: EventQueue, network: FluidNetwork, cluster: Cluster,
                 nvswitch_bytes_per_s: float) -> None:
        self.queue = queue
        self.network = network
        self.cluster = cluster
        self.nvswitch = nvswitch_bytes_per_s  # bytes/s per GPU
        # Bytes each stage's flows delivered over the network (true bytes, not the engine's per-pair units).
        self.delivered: dict[str, float] = {"reuse": 0.0, "collective": 0.0, "p2d": 0.0}

    # -- shapes (once per transfer shape) -----------------------------------------------

    def shape(self, stage: Stage, payload: float, pattern: Pattern) -> Shape:
        """``payload`` of ``pattern`` as issued by :meth:`issue` (the same float operations, done once)."""
        net = payload * pattern.net_bytes
        intra = payload * pattern.intra_bytes / self.nvswitch
        # The network part cannot land sooner than at its idle bottleneck rate,
        # so an NVSwitch part no longer than that never decides: skip its event.
        intra_event = intra > 0 and (net <= 0 or intra > net / pattern.bottleneck)
        size = net / pattern.pairs if net > 0 else 0.0
        return Shape(stage, net, size, pattern.links, pattern.weights, intra, intra_event, stage.value, pattern.pairs)

    def move(self, stage: Stage, nbytes: float, src: Sequence[int], dst: Sequence[int]) -> Shape:
        """``nbytes`` sharded evenly over GPUs ``src``, GPU k to GPU ``dst[k mod |dst|]`` (a KV move)."""
        return self.shape(stage, nbytes, self.cluster.transfer(src, dst))

    # -- flows (once per flow) ---------------------------------------------------------

    def issue(self, fid: str, shape: Shape, layer: int | None, deadline: float | None, downstream: float,
              request: str, batch: str, current_layer: int | None, compute_done: bool, live: dict[int, Flow],
              then: Callable[[Any], None], arg: Any) -> int:
        """Issue one transfer of ``shape`` now; returns how many parts will call ``then(arg)`` (0: none).

        ``live`` holds the network flow by ``id(flow)`` until its last byte lands
        (its owner updates ``current_layer`` / ``compute_done`` there and names
        them to ``network.reschedule``). Positional only on purpose: the hot path.
        """
        parts = 0
        net = shape.net
        if net > 0:
            # In per-pair units (cluster.py: every point-to-point flow of the group is one flow at each link).
            # The shape's arrays are the pattern's validated int64/float64 ones: no checks needed.
            flow = Flow.trusted(
                fid, shape.size, shape.links, shape.weights, stage=shape.stage, request=request, batch=batch,
                deadline=deadline, downstream=downstream, layer=layer, current_layer=current_layer,
                compute_done=compute_done, pairs=shape.pairs,
            )
            live[id(flow)] = flow
            delivered = self.delivered

            def landed(f: Flow, then=then, arg=arg, net=net, key=shape.key) -> None:
                live.pop(id(f), None)
                delivered[key] += net
                then(arg)

            self.network.add_flow(flow, landed)
            parts += 1
        if shape.intra_event:
            self.queue.push(self.queue.now + shape.intra, Priority.COMPUTE, then, arg)
            parts += 1
        return parts


class IdealFabric(Fabric):
    """``--network ideal``: every transfer costs nothing and lands at once.

    Its parts land in one COMPLETION event at the issuing time (after the
    event that issued it, as a network completion would); no flow reaches
    the network. The network bytes it would have moved count in
    ``delivered`` all the same (moved at no cost).
    """

    def issue(self, fid: str, shape: Shape, layer: int | None, deadline: float | None, downstream: float,
              request: str, batch: str, current_layer: int | None, compute_done: bool, live: dict[int, Flow],
              then: Callable[[Any], None], arg: Any) -> int:
        if shape.net <= 0 and not shape.intra_event:
            return 0
        self.delivered[shape.key] += shape.net
        self.queue.push(self.queue.now, Priority.COMPLETION, then, arg)
        return 1


def create_fabric(network: str, queue: EventQueue, flow_network: FluidNetwork, cluster: Cluster,
                  nvswitch_bytes_per_s: float) -> Fabric:
    """The fabric a ``--network`` choice names (one of :data:`NETWORKS`)."""
    if network == "fabric":
        return Fabric(queue, flow_network, cluster, nvswitch_bytes_per_s)
    if network == "ideal":
        return IdealFabric(queue, flow_network, cluster, nvswitch_bytes_per_s)
    raise UserError(f"--network: unknown {network!r} (expected one of {', '.join(NETWORKS)})")


def instance_ports(instances: Sequence[str], port_bytes_per_s: float) -> tuple[Cluster, dict[str, tuple[int, ...]]]:
    """The iteration-level engine's placement (module docstring): one server and one port per instance.

    Returns the cluster (a ``big_switch`` of ``len(instances)`` ports of
    ``port_bytes_per_s``, one GPU = one NIC per server) and, per instance id,
    the GPUs its KV leaves from and lands on (``(k,)`` for the k-th).
    """
    cluster = Cluster.on_topology(big_switch(len(instances), port_bytes_per_s), gpus_per_server=1)
    return cluster, {iid: (k,) for k, iid in enumerate(instances)}


def instance_cluster(config: ClusterConfig, roles: Sequence[tuple[str, str]],
                     gpus: int) -> tuple[Cluster, dict[str, tuple[int, ...]]]:
    """The ``placement="cluster"`` rule (module docstring) for ``roles`` (instance id, role) of ``gpus`` GPUs each.

    ``config`` is resolved (its node fields set). Instance k of the order
    "prefill and colocated first, then decode" (the engine's own order) takes
    GPUs ``k*gpus .. k*gpus+gpus-1``; its unit is a prefill unit unless its
    role is decode. Returns the cluster and, per instance id, its GPUs.
    An instance wider than a server spans whole servers (a prefill unit's EP
    group across servers). Raises ``UserError`` when the servers are too few
    or an instance would straddle two servers.
    """
    per = config.gpus_per_server
    order = [iid for iid, role in roles if role != "decode"] + [iid for iid, role in roles if role == "decode"]
    need = len(order) * gpus
    if need > config.servers * per:
        raise UserError(f"--servers: {len(order)} instances of {gpus} GPUs need {need} GPUs, but {config.servers} "
                        f"servers x {per} GPUs have {config.servers * per}")
    if (per % gpus if gpus <= per else gpus % per):
        raise UserError(f"--servers: an instance of {gpus} GPUs neither fits a whole number of times on a server of "
                        f"{per} GPUs nor spans whole servers (instances may not straddle servers)")
    kinds = dict(roles)
    units: dict[str, list[Unit]] = {"prefill": [], "decode": []}
    placed: dict[str, tuple[int, ...]] = {}
    for k, iid in enumerate(order):
        kind = "decode" if kinds[iid] == "decode" else "prefill"
        placed[iid] = tuple(range(k * gpus, (k + 1) * gpus))
        units[kind].append(Unit(len(units[kind]), kind, placed[iid]))
    cluster = Cluster.placed(config, units["prefill"], units["decode"])
    return cluster, {iid: placed[iid] for iid, _ in roles}
