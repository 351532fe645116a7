"""Tensor parallelism over CPU processes: gloo on loopback, leader/follower pools (FlowPrefill §5.1).

Each rank is one process holding its shard of the model (``LlamaModel`` with
``tp_rank``/``tp_size``). Rank 0 runs the ``PrefillEngine`` (scheduler
thread + leader pool); every other rank runs ``ExecutionPool.follow``.
:class:`GlooCollective` is how they agree: the command to run next is
broadcast from rank 0 (``broadcast_object_list``), and at every check point
the ranks all_reduce (MAX) their preemption flags, so they suspend at the
same operator counter. All collectives of a rank are issued by its pool
worker thread, in the same order on every rank.

:func:`run_pair_rank` is one rank of a whole TP run (model, engine or
follower, a request script, optional random preemption flags), used by the
tests and usable as an example; start it with ``multiprocessing`` (spawn).
"""

from __future__ import annotations

import random
import socket
import threading
import time
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from laxflow.integrations.engine.model import LlamaModel, ModelConfig
from laxflow.integrations.engine.pool import ExecutionPool


class GlooCollective:
    """Flag agreement and command broadcast over the default (gloo) process group."""

    def __init__(self) -> None:
        self._flag = torch.zeros(1, dtype=torch.int32)
        self.agreements = 0  # check points passed (the synchronized counter)

    def agree_flag(self, local: bool) -> bool:
        self._flag[0] = int(local)
        dist.all_reduce(self._flag, op=dist.ReduceOp.MAX)
        self.agreements += 1
        return bool(self._flag[0])

    def agree_command(self, command: Any) -> Any:
        box = [command]
        dist.broadcast_object_list(box, src=0)
        return box[0]


def free_port() -> int:
    """A free TCP port on loopback for the process group's rendezvous."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_group(rank: int, world: int, port: int, timeout_s: float = 60.0) -> None:
    """Join the gloo group on 127.0.0.1:``port`` (each rank, once, before building its model)."""
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=timeout_s),
    )


def run_pair_rank(rank: int, world: int, port: int, spec: dict[str, Any], out: Any) -> None:
    """One rank of a TP run; puts a result dict on ``out`` (a multiprocessing queue).

    ``spec``: ``config`` (ModelConfig kwargs), ``requests`` (list of
    ``[delay_s, slo_s, token_ids]``, arrivals at rank 0 in order),
    ``flags`` (per rank, a list of delays in s after which that rank raises
    a preemption flag on its own), ``policy`` (prefill scheduler name),
    ``hold_first`` (rank 0 holds the first request at layer 1's start until
    the scheduler raised its preemption signal: makes a preemption certain).
    Result: rank, the pool's yields (task, kind, layer, op, ops_done), and on
    rank 0 whether every request's logits equal an uninterrupted TP run of
    the same batch (``bitwise``).
    """
    from laxflow.integrations.engine.engine import PrefillEngine
    from laxflow.integrations.prefill import TtftPredictor, create_prefill_scheduler

    torch.set_num_threads(1)
    try:
        init_group(rank, world, port)
        model = LlamaModel(ModelConfig(**spec["config"]), rank, world)
        coll = GlooCollective()
        delays = spec.get("flags", [[]] * world)[rank]
        if rank == 0:
            predictor = TtftPredictor([(1, 0.001), (256, 0.01), (1024, 0.05)])
            hold = _HoldFirst() if spec.get("hold_first") else None
            engine = PrefillEngine(model, create_prefill_scheduler(spec.get("policy", "flowprefill"), predictor),
                                   hooks=hold, collective=coll).start()
            if hold is not None:
                hold.pool = engine.pool
            pool = engine.pool
            flagger = _flagger(pool, delays)
            ids = []
            for i, (delay, slo, tokens) in enumerate(spec["requests"]):
                time.sleep(delay)
                ids.append(engine.add_request(tokens, slo).id)
                if i == 0 and hold is not None:  # the others arrive while the first is held
                    hold.reached.wait(30)
            for rid in ids:
                engine.result(rid, timeout=120)
            flagger.join()
            engine.close()
            tasks = [(t, logits) for t, logits in engine.completed_tasks]
            # uninterrupted reference of every batch, run by both ranks in step
            coll.agree_command([[r.payload for r in t.requests] for t, _ in tasks])
            bitwise = all(torch.equal(model.forward([r.payload for r in t.requests]), lg) for t, lg in tasks)
            out.put({"rank": 0, "yields": pool.yields, "bitwise": bitwise, "tasks": len(tasks),
                     "errors": [repr(e) for e in engine.errors], "agreements": coll.agreements})
        else:
            pool = ExecutionPool(model, collective=coll)
            flagger = _flagger(pool, delays)
            pool.follow()
            flagger.join()
            for batch in coll.agree_command(None):
                model.forward(batch)
            out.put({"rank": rank, "yields": pool.yields, "agreements": coll.agreements})
    except Exception as exc:  # reported, not raised: the parent test shows it
        out.put({"rank": rank, "error": repr(exc)})
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


class _HoldFirst:
    """Layer hooks that hold the first request at layer 1 until the pool's flag is raised."""

    def __init__(self) -> None:
        self.pool: ExecutionPool | None = None
        self.first: str | None = None
        self.reached = threading.Event()

    def layer_begin(self, batch: str, layer: int) -> None:
        self.first = self.first or batch
        if batch == self.first and layer == 1 and self.pool is not None:
            self.reached.set()
            end = time.monotonic() + 10
            while not self.pool._flag.is_set() and time.monotonic() < end:
                time.sleep(0.001)
            self.pool = None

    def layer_end(self, batch: str, layer: int, last: bool = False) -> None:
        pass


def _flagger(pool: ExecutionPool, delays: list[float]) -> threading.Thread:
    """A thread raising ``pool``'s flag after each delay (random preemption from any rank)."""

    def fire() -> None:
        for d in delays:
            time.sleep(d)
            pool.inject_preempt()

    t = threading.Thread(target=fire, daemon=True)
    t.start()
    return t


def random_flags(seed: int, count: int, spread_s: float) -> list[float]:
    rng = random.Random(seed)
    return [rng.uniform(0, spread_s) for _ in range(count)]
