"""``--pools NAME`` on the instance engine: the entry point ``run.py`` loads (``create_pool_dispatcher``).

The pool driver itself is :mod:`laxflow.sim.serving.pools_driver`; it needs
the built engine (its instances, compute model and workload) for Arrow's
startup profiles, while ``run.py`` makes the dispatcher before the engine.
So the dispatcher returned here builds the driver at the engine's first
call (the first arrival, on the event-loop thread), then forwards to it.
"""

from __future__ import annotations

from typing import Any, Sequence

from laxflow.errors import UserError
from laxflow.integrations.pools.registry import pool_manager_names
from laxflow.sim.serving.pools_driver import PoolDispatcher, PoolsConfig, attach_pools


class LazyPoolDispatcher:
    """A :class:`PoolDispatcher` built from the engine on first use.

    The initial split is the run's ``P:D`` (``--instances``), or half the
    instances prefill (rounded down, at least one) when ``--instances N``
    gives none: Arrow's pools are elastic, the baselines keep that split.
    """

    def __init__(self, name: str, prefill_instances: int | None, options: dict[str, Any] | None = None,
                 config: PoolsConfig = PoolsConfig()) -> None:
        if name not in pool_manager_names():
            raise UserError(f"--pools: unknown {name!r} (expected one of {', '.join(pool_manager_names())})")
        self.name, self.prefill_instances, self.options, self.config = name, prefill_instances, options, config
        self.driver: PoolDispatcher | None = None

    def _get(self, engine: Any) -> PoolDispatcher:
        if self.driver is None:
            p = self.prefill_instances if self.prefill_instances is not None else max(1, len(engine.instances) // 2)
            self.driver = attach_pools(engine, self.name, p, self.options, self.config)
            engine.dispatcher = self  # keep this object as the engine's dispatcher (stats live on the driver)
        return self.driver

    def prefill_target(self, engine: Any, seq: Any, now: float) -> str:
        return self._get(engine).prefill_target(engine, seq, now)

    def decode_target(self, engine: Any, seq: Any, now: float) -> str:
        return self._get(engine).decode_target(engine, seq, now)

    def after_step(self, engine: Any, instance: Any, now: float) -> None:
        self._get(engine).after_step(engine, instance, now)

    def stats(self) -> dict[str, Any]:
        return self.driver.stats() if self.driver is not None else {}


def create_pool_dispatcher(name: str, config: Any, samples: Sequence[Any] = ()) -> LazyPoolDispatcher:
    """The dispatcher for pool manager ``name`` on an engine built from ``config`` (InstanceSimConfig).

    ``samples`` (the batch profile) are not used: Arrow profiles TTFT alone over
    the local scheduler's chunks, and decode capacity, itself.
    """
    if config.instances < 2:
        raise UserError(f"--pools {name}: needs at least 2 instances (--instances N or P:D), got {config.instances}")
    return LazyPoolDispatcher(name, config.prefill_instances)
