"""Where requests go: the engine's one plug point for routers and pool managers.

The engine calls a :class:`Dispatcher` (one per run, on the event-loop thread):

* ``prefill_target(engine, seq, now)`` at each arrival: the instance that
  prefills ``seq`` (colocated: it also decodes there);
* ``decode_target(engine, seq, now)`` when a prefill-role instance finished
  ``seq``'s prompt: the instance that decodes it (the same id: it stays, no
  KV moves);
* ``after_step(engine, instance, now)`` after each step of each instance
  (reports, monitors, role flips via ``engine.set_role``).

:class:`RouterDispatcher` drives a ``laxflow.integrations.routing`` router:
it sees each instance's last report (:meth:`EngineView.report`, refreshed
after every step), so the ``pab`` and ``dplb`` routers' local views between
reports behave as in the papers. An Arrow-style pool manager implements the
same three calls and flips instances between roles.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping, Protocol

from laxflow.integrations.prefill.fairbatching import prefill_admission_budget
from laxflow.integrations.prefill.latency import LinearBatchModel
from laxflow.integrations.routing.base import InstanceView, Router, most_free_decode

if TYPE_CHECKING:
    from laxflow.sim.serving.instances.instance import Instance, Seq


class EngineView(Protocol):
    """What a dispatcher sees of the engine (``InstanceEngine`` is one)."""

    instances: Mapping[str, "Instance"]

    def report(self, inst: "Instance") -> InstanceView: ...

    def set_role(self, instance_id: str, role: str) -> None: ...


class Dispatcher(Protocol):
    def prefill_target(self, engine: EngineView, seq: "Seq", now: float) -> str: ...

    def decode_target(self, engine: EngineView, seq: "Seq", now: float) -> str: ...

    def after_step(self, engine: EngineView, instance: "Instance", now: float) -> None: ...


class RouterDispatcher:
    """A router over the colocated/prefill instances; decode choice from the same decision."""

    def __init__(self, router: Router, pab_model: LinearBatchModel | None, ttft_slo: float, tpot_slo: float) -> None:
        self.router = router
        self.pab_model = pab_model  # set when the router reads PAB: computed after each step
        self.ttft_slo, self.tpot_slo = ttft_slo, tpot_slo

    def prefill_target(self, engine: EngineView, seq: "Seq", now: float) -> str:
        front = [engine.report(i) for i in engine.instances.values() if i.role != "decode"]
        back = [engine.report(i) for i in engine.instances.values() if i.role == "decode"]
        decision = self.router.route(seq.view(), front, now, back)
        seq.decode_instance = decision.decode
        return decision.prefill

    def decode_target(self, engine: EngineView, seq: "Seq", now: float) -> str:
        target = seq.decode_instance
        if target is None or engine.instances[target].role != "decode":
            # The router made no choice (or that instance left the decode role): most free KV now.
            target = most_free_decode([engine.report(i) for i in engine.instances.values() if i.role == "decode"])
        return target or seq.prefill_instance  # no decode instance at all: decode where it prefilled

    def after_step(self, engine: EngineView, instance: "Instance", now: float) -> None:
        if self.pab_model is not None:
            instance.pab = prefill_admission_budget([s.view() for s in instance.seqs.values()], now, self.pab_model,
                                                    self.ttft_slo, self.tpot_slo)
