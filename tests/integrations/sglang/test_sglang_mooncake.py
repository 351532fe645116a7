"""SGLang's Mooncake KV backend through laxflow: real SGLang engines, real Mooncake TCP transfers, a daemon.

Real: SGLang 0.5.23's ``MooncakeTransferEngine`` (two, in this process, P2P
handshake over loopback TCP), its ``MooncakeKVManager.send_kvcache`` code
(laxflow's subclass, built without its constructor: that one starts
bootstrap servers and needs a model's KV pools), its ``KVArgs`` and
``Req``; laxflow's Mooncake adapter and gate; the daemon's shared-memory
segment (``segment_daemon.SegmentDaemon``, the test deciding permits).
"""

import concurrent.futures
import threading

import numpy as np
import pytest
from segment_daemon import SegmentDaemon
from sglang_harness import make_req, published

pytest.importorskip("mooncake.engine", reason="extra 'mooncake' not installed")
pytest.importorskip("sglang.srt.disaggregation.mooncake.conn", reason="SGLang not installed: make sglang")

from sglang.srt.disaggregation.base.conn import KVArgs  # noqa: E402
from sglang.srt.distributed.device_communicators.mooncake_transfer_engine import (  # noqa: E402
    MooncakeTransferEngine,
)

from laxflow.adapters.gate import GateConfig  # noqa: E402
from laxflow.adapters.mooncake_config import MooncakeAdapterConfig  # noqa: E402
from laxflow.hooks.api import request_key  # noqa: E402
from laxflow.integrations.sglang.mooncake import GatedEngine, LaxflowMooncakeKVManager, _in_room  # noqa: E402
from laxflow.integrations.sglang.requests import TABLE  # noqa: E402
from laxflow.protocol.shm import EventKind, Gate, Stage  # noqa: E402

LAYERS, PAGES, ITEM = 3, 32, 4096  # per layer: K and V buffers of PAGES pages of ITEM bytes


@pytest.fixture(scope="module")
def engines():
    """Prefill and decode SGLang engines with their KV buffers registered (K of each layer, then V)."""
    import os

    saved = {k: os.environ.get(k) for k in ("MC_FORCE_TCP", "MOONCAKE_PROTOCOL")}
    os.environ.update(MC_FORCE_TCP="1", MOONCAKE_PROTOCOL="tcp")  # SGLang's engine reads them at construction
    try:
        with published():
            prefill, decode = MooncakeTransferEngine("127.0.0.1"), MooncakeTransferEngine("127.0.0.1")
    finally:
        for k, v in saved.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
    src = [(np.arange(PAGES * ITEM) * (i + 3) % 251).astype(np.uint8) for i in range(2 * LAYERS)]
    dst = [np.zeros(PAGES * ITEM, np.uint8) for _ in range(2 * LAYERS)]
    for engine, bufs in ((prefill, src), (decode, dst)):
        assert engine.batch_register([b.ctypes.data for b in bufs], [b.nbytes for b in bufs]) == 0
    return {"prefill": prefill, "decode": decode, "src": src, "dst": dst}


def make_manager(engines, shm_name: str) -> LaxflowMooncakeKVManager:
    """laxflow's KV manager over the prefill engine, with the fields ``send_kvcache`` reads."""
    m = LaxflowMooncakeKVManager.__new__(LaxflowMooncakeKVManager)
    args = KVArgs()
    args.kv_data_ptrs = [b.ctypes.data for b in engines["src"]]
    args.kv_data_lens = [b.nbytes for b in engines["src"]]
    args.kv_item_lens = [ITEM] * (2 * LAYERS)
    args.kv_layer_ids = None
    args.prefill_start_layer, args.prefill_end_layer = 0, LAYERS
    m.kv_args = args
    m.is_mla_backend = m.is_hybrid_mla_backend = False
    m.enable_custom_mem_pool, m.custom_mem_pool_type = False, None
    m.max_transfer_batch_indices = 0
    m.pp_size, m.pp_rank = 1, 0
    m.state_strides_validated = set()
    config = MooncakeAdapterConfig(gate=GateConfig(shm_name=shm_name, reattach_s=0.05))
    m.engine = GatedEngine(engines["prefill"], "tcp", config)
    return m


def send(m, engines, room, pages, executor):
    """SGLang's send of ``pages`` (prefill page i -> decode page i) for ``room``, as its transfer worker does."""
    idx = np.array(pages, np.int32)
    return _in_room(room, m.send_kvcache, (engines["decode"].get_session_id(), idx,
                                           [b.ctypes.data for b in engines["dst"]], idx, executor), {})


def test_kv_transfers_are_messages_the_daemon_sees(engines):
    daemon = SegmentDaemon(lambda ev: (Gate.OPEN, 2, 36))
    m = make_manager(engines, daemon.name)
    with published():
        req = make_req("req-7", 64, room=7, ttft_slo_ms=500)
        entry, _ = TABLE.track(req)
        with concurrent.futures.ThreadPoolExecutor(2) as ex:
            assert send(m, engines, 7, [1, 2, 5, 6, 7], ex) == 0
    try:
        for s, d in zip(engines["src"], engines["dst"]):
            for page in (1, 2, 5, 6, 7):
                assert np.array_equal(d[page * ITEM:(page + 1) * ITEM], s[page * ITEM:(page + 1) * ITEM])
        submits = daemon.of_kind(EventKind.SUBMIT)
        assert sorted(e["layer"] for e in submits) == list(range(LAYERS))  # one message per layer
        assert {e["request_id"] for e in submits} == {request_key("req-7")} == {entry.key}
        assert {e["stage"] for e in submits} == {Stage.P2D}
        assert all(e["bytes"] == 2 * 5 * ITEM for e in submits)  # K and V of five pages
        daemon.wait_for(lambda evs: sum(e["kind"] == EventKind.COMPLETION for e in evs) == LAYERS)
        assert all(r.msg_id and r.level == 2 and r.dscp == 36 for r in m.engine.laxflow.records)
    finally:
        m.engine.close()
        daemon.close()


def test_the_daemon_decides_which_request_goes_first(engines):
    held = []
    daemon = SegmentDaemon(lambda ev: held.append(ev) or None)  # the test opens each message itself
    m = make_manager(engines, daemon.name)
    done: list[str] = []
    results: dict[str, int] = {}
    context = published()
    context.__enter__()  # SGLang's send reads its published config, from the worker threads too
    for rid, room in (("loose", 11), ("tight", 12)):
        TABLE.track(make_req(rid, 64, room=room, ttft_slo_ms=100 if rid == "tight" else 9000))
    try:
        with concurrent.futures.ThreadPoolExecutor(2) as ex:
            threads = [threading.Thread(target=lambda r=rid, room=room, pages=pages: (
                results.__setitem__(r, send(m, engines, room, pages, ex)), done.append(r)))
                for rid, room, pages in (("loose", 11, [10, 11]), ("tight", 12, [20, 21]))]
            for t in threads:
                t.start()
            daemon.wait_for(lambda evs: sum(e["kind"] == EventKind.SUBMIT for e in evs) == 2 * LAYERS)
            assert done == []  # nothing moves without a permit
            by_request = {request_key("tight"): [], request_key("loose"): []}
            for ev in held:
                by_request[ev["request_id"]].append(ev["msg_id"])
            for msg in by_request[request_key("tight")]:
                daemon.open(msg, level=0, dscp=46)
            threads[1].join(10)
            assert done == ["tight"]
            for msg in by_request[request_key("loose")]:
                daemon.open(msg, level=3, dscp=10)
            threads[0].join(10)
            assert done == ["tight", "loose"] and results == {"tight": 0, "loose": 0}
        for b_src, b_dst in zip(engines["src"], engines["dst"]):
            assert np.array_equal(b_dst[20 * ITEM:22 * ITEM], b_src[20 * ITEM:22 * ITEM])
            assert np.array_equal(b_dst[10 * ITEM:12 * ITEM], b_src[10 * ITEM:12 * ITEM])
    finally:
        context.__exit__(None, None, None)
        m.engine.close()
        daemon.close()


def test_layer_of_maps_k_and_v_buffers_to_their_layer(engines):
    m = LaxflowMooncakeKVManager.__new__(LaxflowMooncakeKVManager)
    m.kv_args = KVArgs()
    m.kv_args.kv_data_ptrs = [b.ctypes.data for b in engines["src"]]
    m.kv_args.kv_data_lens = [b.nbytes for b in engines["src"]]
    m.is_mla_backend = False
    for i, b in enumerate(engines["src"]):
        assert m.layer_of(b.ctypes.data) == m.layer_of(b.ctypes.data + b.nbytes - 1) == i % LAYERS
    assert m.layer_of(1) == 0


def test_a_transfer_worker_knows_its_room_on_its_executor_too():
    """The wrappers laxflow's ``transfer_worker`` gives SGLang's loop: its real FastQueue, a thread pool."""
    from types import SimpleNamespace

    from sglang.srt.disaggregation.common.utils import FastQueue

    from laxflow.integrations.sglang.mooncake import _RoomExecutor, _RoomQueue, current_room

    queue = _RoomQueue(FastQueue())
    queue.put(SimpleNamespace(room=42))  # SGLang's re-enqueue goes through the wrapper too
    assert queue.get().room == 42 and current_room() == 42
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        assert _RoomExecutor(pool).submit(current_room).result() == 42
        assert pool.submit(current_room).result() is None  # the room is set only for the wrapped task
    _in_room(None, lambda: None, (), {})  # this thread sends nothing more
    assert current_room() is None
