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
from laxflow.integrations.pools.registry import pool_manager_class, pool_manager_names
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
            n = len(engine.instances)
            p = self.prefill_instances if self.prefill_instances is not None else max(1, n // 2)
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

    def result_keys(self) -> dict[str, Any]:
        """Flip counts (P->D, D->P) and the final P:D split for the run's row (``run.py``)."""
        return self.driver.result_keys() if self.driver is not None else {"flips_p2d": 0, "flips_d2p": 0}


def create_pool_dispatcher(name: str, config: Any, samples: Sequence[Any] = ()) -> LazyPoolDispatcher:
    """The dispatcher for pool manager ``name`` on an engine built from ``config`` (InstanceSimConfig,
    already through :func:`reshape_config`).

    ``samples`` (the batch profile) are not used: Arrow profiles TTFT alone over
    the local scheduler's chunks, and decode capacity, itself.
    """
    if name not in pool_manager_names():
        raise UserError(f"--pools: unknown {name!r} (expected one of {', '.join(pool_manager_names())})")
    if config.instances < 2 and not pool_manager_class(name).colocated:
        raise UserError(f"--pools {name}: needs at least 2 instances (--instances N or P:D), got {config.instances}")
    return LazyPoolDispatcher(name, config.prefill_instances)


def tp_deployment(base_name: str, factor: int) -> str:
    """The name of ``base_name``'s deployment widened ``factor`` times in tensor parallelism
    (``llama3-8b-tp1-a800`` x 8 -> one TP8 replica on 8 GPUs), added to the catalog on first use.

    The widened replica keeps the node, GPU and NIC of its base; it must fit one node (TP rides
    NVLink) and its TP degree must divide the model's KV heads (each GPU holds whole heads).
    """
    from dataclasses import replace

    from laxflow.sim.models import DEPLOYMENTS, get_deployment, get_model

    base = get_deployment(base_name)
    if factor == 1:
        return base.name
    tp, gpus = base.tp * factor, base.gpus * factor
    model = get_model(base.model)
    if gpus > base.gpus_per_node or model.num_kv_heads % tp:
        raise UserError(f"deployment {base.name}: one TP{tp} replica needs {gpus} GPUs in one node "
                        f"({base.gpus_per_node}) and TP dividing the model's {model.num_kv_heads} KV heads")
    name = f"{base.name}-x{factor}"
    if name not in DEPLOYMENTS:
        DEPLOYMENTS[name] = replace(base, name=name, tp=tp, gpus=gpus,
                                    source=f"{base.source}; widened x{factor} in TP for the vLLM baselines")
    return name


def reshape_config(config: Any) -> Any:
    """``config`` (InstanceSimConfig) with the instances its pool manager's ``shape`` asks for.

    ``as-given``: unchanged. The paper's vLLM baselines take the same GPUs as fewer, wider
    replicas: ``vllm`` one colocated TP-N instance (``--instances N``), ``vllm-disagg`` one
    prefill + one decode instance of TP N/2 each (``--instances N`` with N even, or ``P:D`` with
    P = D). Rates stay per original instance (the caller computes them before reshaping).
    """
    from dataclasses import replace

    if config.pools is None:
        return config
    name = config.pools
    if name not in pool_manager_names():
        raise UserError(f"--pools: unknown {name!r} (expected one of {', '.join(pool_manager_names())})")
    shape = pool_manager_class(name).shape
    if shape == "as-given":
        return config
    n = config.instances
    if shape == "one-tp-instance":
        if config.disaggregated:
            raise UserError(f"--pools {name}: one colocated instance over all GPUs; give --instances N, "
                            f"not P:D ({config.prefill_instances}:{n - config.prefill_instances})")
        return replace(config, deployment=tp_deployment(config.deployment, n), instances=1)
    if shape == "two-tp-instances":
        if n % 2 or (config.disaggregated and 2 * config.prefill_instances != n):
            raise UserError(f"--pools {name}: one prefill and one decode instance of half the GPUs each; "
                            f"give --instances N with N even (or P:D with P = D), got {n} instances"
                            + (f" as {config.prefill_instances}:{n - config.prefill_instances}"
                               if config.disaggregated else ""))
        return replace(config, deployment=tp_deployment(config.deployment, n // 2), instances=2, prefill_instances=1)
    raise RuntimeError(f"pool manager {name}: unknown shape {shape!r}")
