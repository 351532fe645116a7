"""One step of a prefill instance run layer by layer, its prompts' KV leaving as each layer ends.

Used when ``InstanceSimConfig.p2d`` is ``"layer"``. Created and started by
:meth:`.engine.InstanceEngine._kick` for a step that moves network bytes: a
prefill-role step with prefill chunks whose KV goes to a decode instance
other than this one (:meth:`.engine.InstanceEngine._layer_sends` picks
them), with a :class:`Host`: what it uses of the engine; from then on
driven only by events on the engine's queue, on its one thread. Every other
step (decode-only, colocated, a prefill step with nothing to send) stays
one event at the step's end, as in ``"prompt"`` mode.

The step's seconds come whole from the compute model (``profile.StepTimer``:
L layers of compute plus the NVLink TP term); the step is cut into L equal
layers, layer j ending at ``start + secs*(j+1)/L`` and the last at exactly
``start + secs``, so the step ends at the same float as the single event.

Per-layer P2D rule: each chunk runs all L layers; the KV of a chunk's layer j
(its tokens x the model's per-token KV / L, to the chunk's decode instance,
GPU k to GPU k mod |dst| through the run's :class:`~.fabric.Fabric`) leaves
when layer j ends, as one transfer ``{seq}.L{j}.p2d`` with ``layer=j``, the
request's ``arrival + ttft_slo`` as its deadline and ``downstream`` 0, the
P2D rule of the prefill units too (``batch.py``): nothing of the request waits
for a layer's KV but its TTFT (the later layers and chunks compute while it
moves). KV of a
prompt computed in an earlier step that sent none (a step under another
role) rides with its next layered chunk. At every layer boundary the live
P2D flows of the step's requests get ``current_layer`` (and, at the end of
a prompt's last chunk, ``compute_done``) and the network reschedules them
(when any is live).
The engine then ends the step as usual (``Host.step_end``: first token emitted on this
instance at the step's end); the prompt's KV is held there until its last flow lands
(``Host.landed``), and only then joins the decode instance.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, NamedTuple

from laxflow.policy.flow import Flow
from laxflow.sim.events import EventQueue, Priority
from laxflow.sim.serving.instances.fabric import Shape

if TYPE_CHECKING:
    from laxflow.sim.serving.instances.instance import Instance, Seq


class Host(NamedTuple):
    """What a layered step uses of the engine that runs it (one per engine)."""

    queue: EventQueue
    layers: int  # the model's layers
    issue: Callable[..., int]  # the fabric's Fabric.issue: one transfer's flows, their count
    reschedule: Callable[[list[Flow]], None]  # the network's: these flows' progress changed
    landed: Callable[["Seq"], None]  # one of a request's layer transfers landed
    step_end: Callable[["Instance"], None]  # the step is over (at its end's event)


class Send(NamedTuple):
    """One chunk's KV of one request in a layered step."""

    seq: "Seq"
    shape: Shape  # one layer's KV to the decode instance
    completes: bool  # the chunk ends the prompt: its flows' compute is done at the step's end


class LayeredStep:
    """The layer-by-layer execution of one prefill step that sends KV (module docstring)."""

    def __init__(self, host: Host, inst: "Instance", secs: float, sends: list[Send]) -> None:
        self.host = host
        self.inst = inst
        self.queue = host.queue
        self.start = self.queue.now
        self.secs = secs
        self.layers = host.layers
        self.sends = sends
        self.tag = f"{inst.id}.s{inst.steps}"

    @property
    def flows(self) -> list[Flow]:
        """The live P2D flows of this step's requests (earlier chunks' too), on the network now."""
        return [f for send in self.sends for f in send.seq.p2d_live.values()]

    def begin(self) -> None:
        """Called by the engine right after the step's batch is formed: layer 0 starts now."""
        self._progress(0)
        self._push(0)

    def _push(self, j: int) -> None:
        end = self.start + self.secs if j == self.layers - 1 else self.start + self.secs * (j + 1) / self.layers
        self.queue.push(end, Priority.COMPUTE, self._layer_end, j)

    def _progress(self, layer: int, done: bool = False) -> None:
        flows = self.flows
        for f in flows:
            f.current_layer = layer
        if done:
            for send in self.sends:
                if send.completes:
                    for f in send.seq.p2d_live.values():
                        f.compute_done = True
        if flows:  # (none live: nothing to tell the policy, and no recompute to cause)
            self.host.reschedule(flows)

    def _layer_end(self, j: int) -> None:
        issue, landed = self.host.issue, self.host.landed
        for seq, shape, _ in self.sends:
            seq.p2d_pending += issue(f"{seq.id}.L{j}.p2d", shape, j, seq.arrival + seq.ttft_slo, 0.0,
                                     seq.id, self.tag, j, False, seq.p2d_live, landed, seq)
        if j + 1 < self.layers:
            self._progress(j + 1)
            self._push(j + 1)
            return
        self._progress(j, done=True)
        self.host.step_end(self.inst)
