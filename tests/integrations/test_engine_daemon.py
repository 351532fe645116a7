"""The CPU engine with a live ``laxflow daemon`` process over ZeroMQ: layer hooks reach it, and a
request the daemon prunes is deferred by the engine's scheduler (network and compute together)."""

from __future__ import annotations

import re
import sys
import threading
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="the engine needs the torch extra: pip install 'laxflow[torch]'")

sys.path.insert(0, str(Path(__file__).parents[1] / "daemon"))
from daemontest import DaemonProc, wait_for  # noqa: E402  (tests/daemon/daemontest.py)

from laxflow.hooks import HooksClient  # noqa: E402
from laxflow.integrations.engine import LlamaModel, ModelConfig, PrefillEngine  # noqa: E402
from laxflow.integrations.prefill import TtftPredictor, create_prefill_scheduler  # noqa: E402

CONFIG = ModelConfig(vocab=512, hidden=128, layers=4, heads=8, kv_heads=4, ffn=352, seed=11)
PRED = TtftPredictor([(1, 0.001), (256, 0.01), (1024, 0.05)])


def tokens(n: int, seed: int) -> list[int]:
    return torch.randint(0, CONFIG.vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


class GatedHooks:
    """The engine's layer hooks: a real HooksClient (worker thread), holding the worker when ``gate``'s
    batch begins layer 1, so the test decides when the long prefill passes its next operator boundary."""

    def __init__(self, client: HooksClient, gate: str) -> None:
        self.client, self.gate = client, gate
        self.members: dict[str, list[str]] = {}
        self.layers: list[tuple[str, int]] = []
        self.reached, self.go = threading.Event(), threading.Event()

    def batch_formed(self, batch, requests):
        self.members[batch] = list(requests)
        self.client.batch_formed(batch, requests)

    def layer_begin(self, batch, layer):
        self.layers.append((batch, layer))
        self.client.layer_begin(batch, layer)
        if self.gate in self.members[batch] and layer == 1 and not self.reached.is_set():
            self.reached.set()
            assert self.go.wait(60)

    def layer_end(self, batch, layer, last=False):
        self.client.layer_end(batch, layer, last)


def _layer_events(daemon: DaemonProc) -> float:
    m = re.search(r'laxflow_daemon_events_total\{kind="layer_boundary",node="n1"\} ([0-9.e+]+)', daemon.metrics())
    return float(m.group(1)) if m else 0.0


@pytest.mark.parametrize("coupled", [True, False])
def test_engine_hooks_reach_a_live_daemon_and_a_pruned_request_is_deferred(tmp_path, coupled):
    daemon = DaemonProc(tmp_path, config={"window_bytes": 0, "mfs": {"drop_budget": 1}})
    model = LlamaModel(CONFIG)
    doomed_ids, ok_ids = tokens(200, 1), tokens(40, 2)
    clients = [HooksClient(daemon.hooks, timeout_ms=2000, name=n) for n in ("layers", "sched", "transport")]
    layer_client, sched_client, transport = clients
    try:
        hooks = GatedHooks(layer_client, gate="doomed")
        engine = PrefillEngine(model, create_prefill_scheduler("flowprefill", PRED), hooks=hooks,
                               network=sched_client if coupled else None)
        with engine:
            engine.add_request(doomed_ids, slo=20.0, request_id="doomed")
            assert hooks.reached.wait(60)
            # The layer hooks went over ZeroMQ to the daemon process: its core counted the layer boundary.
            wait_for(lambda: _layer_events(daemon) >= 1, timeout=20, what="the daemon counting the engine's layers")
            # A later, laxer request: S-EDF alone keeps the earlier-deadline prefill running.
            engine.add_request(ok_ids, slo=60.0, request_id="ok")
            # The KV transport announces doomed's P2D: 10 TB due in 20 s on a 100 Gbps port cannot
            # make it, so the daemon's MFS prunes the request (scavenger class) and advises it.
            if not coupled:  # the engine registers its requests only through ``network``: do it here
                transport.register_request("doomed", deadline=time.time() + 20.0, prompt_tokens=len(doomed_ids))
            transport.message_submit(1, "doomed", "p2d", 0, 1e13)
            wait_for(lambda: transport.pruned() == {"doomed"}, timeout=20, what="the daemon pruning doomed")
            if coupled:
                wait_for(lambda: engine.scheduler.deferrals == 1, timeout=20, what="the engine deferring doomed")
            hooks.go.set()
            ok, doomed = engine.result("ok", 120), engine.result("doomed", 120)
        assert engine.errors == [] and engine.pool.hook_errors == 0
        order = [task.head.id for task, _ in engine.completed_tasks]
        doomed_task = next(t for t, _ in engine.completed_tasks if t.head.id == "doomed")
        if coupled:
            # Deferred at the next operator boundary after layer 1 began; ok computed first; doomed resumed.
            assert order == ["ok", "doomed"]
            assert [y[0] for y in engine.pool.yields] == [doomed_task.id]
            assert engine.scheduler.deferred == [] and engine.scheduler.idle()
        else:
            assert order == ["doomed", "ok"] and engine.pool.yields == []
        assert torch.equal(doomed, model.forward([doomed_ids])[0])
        assert torch.equal(ok, model.forward([ok_ids])[0])
        assert (f"prefill-{doomed_task.id}", 0) in hooks.layers and all(c.failures == 0 for c in clients)
        wait_for(lambda: _layer_events(daemon) >= CONFIG.layers, timeout=20, what="every layer at the daemon")
    finally:
        hooks.go.set()
        for c in clients:
            c.close()
        daemon.cleanup()
