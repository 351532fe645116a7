"""A prefill instance that is a prefill unit: the unit engine's prefill model on the instance engine.

Built by :class:`.engine.InstanceEngine` for every prefill-role instance when
its ``scheduler`` is a prefill scheduler (``--prefill fcfs|flowprefill|edf-*``
with ``--instances P:D``), instead of an iteration-level
:class:`~.instance.Instance`. Its prompts run as the unit engine's do
(:class:`~laxflow.sim.serving.layered_prefill.LayeredPrefill`): whole-prompt
tasks of the prefill scheduler, each a
:class:`~laxflow.sim.serving.batch.BatchRun` of the deployment's layer plan,
its collectives and each layer's P2D KV flows on the engine's network. When a
prompt's last layer is computed its first token is emitted (``prefill_end``);
the KV stays held here until its last layer lands on the decode instance the
dispatcher chose at arrival, where the first token is seen (``kv_landed``)
and the request decodes.

It shows the engine and its dispatcher what an :class:`~.instance.Instance`
shows (``id``, ``role``, ``seqs``, ``outbound``, ``kv_free()``, ``waiting()``,
``decoding()``, ``busy`` and the step counters); it has no batch scheduler to
flip (no ``--pools``), and ``kick`` does nothing: its driver starts batches
itself, on the engine's events.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from laxflow.sim.serving.instances.instance import Seq

if TYPE_CHECKING:
    from laxflow.sim.serving.layered_prefill import LayeredPrefill
    from laxflow.sim.serving.request_state import RequestState


class UnitInstance:
    """One prefill unit as a prefill-role instance (module docstring)."""

    def __init__(self, id: str, prefill: "LayeredPrefill", kv_capacity: int) -> None:
        self.id, self.role = id, "prefill"
        self.prefill = prefill
        self.driver = prefill.driver
        self.schedulers = {"prefill": prefill.driver.scheduler}  # (no admission control: prefill schedulers have none)
        self.kv_capacity = kv_capacity
        self.seqs: dict[str, Seq] = {}  # arrived, prompt not yet computed
        self.outbound: dict[str, Seq] = {}  # prompt computed, KV on its way to the decode instance
        self.steps = 0  # batches whose compute ended
        self.busy_seconds = 0.0  # their compute, collectives and reuse stalls
        self.pab = 0.0
        self.tokens_done = 0
        self.polling = False

    @property
    def busy(self) -> bool:
        return self.driver.current is not None

    @property
    def preemptions(self) -> int:
        return self.driver.switches

    def kv_used(self) -> int:
        return sum(s.kv_tokens for s in self.seqs.values()) + sum(s.kv_tokens for s in self.outbound.values())

    def kv_free(self) -> int:
        return self.kv_capacity - self.kv_used()

    def waiting(self) -> int:
        return len(self.seqs)

    def decoding(self) -> int:
        return 0

    def kick(self, *_: Any) -> None:
        """Nothing to start: the driver starts its batches on the engine's events."""

    def admit(self, seq: Seq, state: "RequestState") -> None:
        """``seq`` arrived here with its request ``state``: the driver puts it on a rank and its scheduler
        hears it after every arrival of this instant."""
        self.seqs[seq.id] = seq
        self.driver.arrival(state)

    def computed(self, seq: Seq, now: float) -> None:
        """``seq``'s prompt computed at ``now``: its first token is emitted; its KV is held until it lands."""
        del self.seqs[seq.id]
        self.outbound[seq.id] = seq
        seq.computed = seq.prompt_tokens
        seq.prefill_end = now
        seq.outputs = 1
        seq.token_times.append(now)
        self.tokens_done += seq.prompt_tokens

    def landed(self, seq: Seq) -> None:
        """``seq``'s KV landed on its decode instance: freed here."""
        del self.outbound[seq.id]
