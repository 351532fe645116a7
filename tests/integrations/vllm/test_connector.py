"""LaxflowConnector wrapping a recording connector, both built by vLLM's own KVConnectorFactory."""

import inspect
import os
import subprocess
import sys
from pathlib import Path

import pytest
import recording_connector as rc
from vllm_harness import make_request, make_scheduler, step

from laxflow.hooks.api import request_key

ROOT = Path(__file__).resolve().parents[3]


def kv_config(role="kv_both"):
    from vllm.config import KVTransferConfig
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

    if "LaxflowTestRecording" not in KVConnectorFactory._registry:
        KVConnectorFactory.register_connector("LaxflowTestRecording", "recording_connector", "RecordingConnector")
    return KVTransferConfig(kv_connector="LaxflowConnector",
                            kv_connector_module_path="laxflow.integrations.vllm.connector", kv_role=role,
                            kv_connector_extra_config={"laxflow_inner": "LaxflowTestRecording"})


def test_forwarded_list_is_every_method_of_the_pinned_base():
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1, SupportsHMA

    from laxflow.integrations.vllm import connector as c

    methods, props, classmethods = set(), set(), set()
    for base in (KVConnectorBase_V1, SupportsHMA):
        for name, obj in base.__dict__.items():
            if name.startswith("_") or name == "role":
                continue
            (classmethods if isinstance(obj, classmethod) else props if isinstance(obj, property)
             else methods).add(name)
    assert methods == set(c.FORWARDED)
    assert props == set(c.FORWARDED_PROPERTIES) and classmethods == set(c.FORWARDED_CLASSMETHODS)
    for name in methods | props | classmethods:  # each defined by the wrapper, none inherited from the base
        assert name in c.LaxflowConnector.__dict__, name
    assert not inspect.isabstract(c.LaxflowConnector)


def test_scheduler_and_worker_sides_forward_everything_with_laxflow_metadata(tmp_path):
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole

    from laxflow.integrations.vllm.connector import (
        FORWARDED, FORWARDED_CLASSMETHODS, FORWARDED_PROPERTIES, STAGE_P2D, LaxflowConnector,
        LaxflowConnectorMetadata,
    )

    rc.CALLS.clear()
    s = make_scheduler(tmp_path, kv_transfer_config=kv_config())
    sched_conn = s.connector
    assert isinstance(sched_conn, LaxflowConnector) and type(sched_conn.inner).__name__ == "RecordingConnector"
    s.add_request(make_request("slo", 40, max_tokens=2, extra_args={"ttft_slo_ms": 250}))
    s.add_request(make_request("plain", 20, max_tokens=2))
    out = step(s)
    meta = out.kv_connector_metadata
    assert isinstance(meta, LaxflowConnectorMetadata) and meta.inner.requests == ("slo", "plain")
    flow = meta.flows["slo"]
    assert (flow.key, flow.stage, flow.layers) == (request_key("slo"), STAGE_P2D, 2)
    assert flow.deadline == pytest.approx(s.requests["slo"].arrival_time + 0.25)
    assert meta.flows["plain"].deadline is None and meta.head(STAGE_P2D).request == "slo"
    while s.has_requests():
        step(s)
    scheduler_calls = {name for name, _ in rc.CALLS}
    assert {"on_new_request", "get_num_new_matched_tokens", "update_state_after_alloc", "build_connector_meta",
            "request_finished_all_groups"} <= scheduler_calls

    # worker side: built by vLLM's factory like a worker does, fed the scheduler's metadata
    rc.CALLS.clear()
    worker = KVConnectorFactory.create_connector(s.vllm_config, KVConnectorRole.WORKER, s.kv_cache_config)
    tags = []

    def set_tag(key, stage, layer, dscp):
        rc.TAG_SOURCE["tag"] = (key, stage, layer)
        tags.append((key, stage, layer))
        return 0

    def clear_tag():
        rc.TAG_SOURCE["tag"] = None

    worker._tagger = (set_tag, clear_tag)
    worker.bind_connector_metadata(meta)
    assert worker.last_bound.flows["slo"].deadline == flow.deadline  # laxflow metadata on the worker side
    worker.save_kv_layer("model.decoder.layers.1.self_attn.attn", None, None)
    worker.wait_for_save()
    assert ("save_kv_layer", (request_key("slo"), STAGE_P2D, 1)) in rc.CALLS
    assert ("wait_for_save", (request_key("slo"), STAGE_P2D, 1)) in rc.CALLS
    assert rc.TAG_SOURCE["tag"] is None  # cleared after each transfer call
    # every other method reaches the inner connector
    fake_req = s.requests.get("x") or make_request("x", 4)
    args = {
        "bind_connector_metadata": (meta,), "register_kv_caches": ({},), "set_host_xfer_buffer_ops": (None,),
        "handle_preemptions": (meta.inner,), "start_load_kv": (None,), "wait_for_layer_load": ("layers.0",),
        "save_kv_layer": ("layers.0", None, None), "get_finished": (set(),), "get_transfer_results": (set(),),
        "bind_kv_cache_manager": (None,), "bind_gpu_block_pool": (None,),
        "get_loaded_kv_cache_group_ids": (fake_req,), "get_num_new_matched_tokens": (fake_req, 0),
        "get_external_cache_hit_sources": (fake_req, 0), "update_state_after_alloc": (fake_req, None, 0),
        "build_connector_meta": (out,), "on_new_request": (fake_req,), "update_connector_output": (None,),
        "request_finished": (fake_req, []), "register_finished_partial_tail": (fake_req, ([],), []),
        "set_xfer_handshake_metadata": ({},), "set_xfer_handshake_metadata_pp_aware": ({},),
        "request_finished_all_groups": (fake_req, ([],)),
    }
    rc.CALLS.clear()
    for name in FORWARDED:
        try:
            getattr(worker, name)(*args.get(name, ()))
        except (AttributeError, TypeError, NotImplementedError, AssertionError, ValueError):
            pass  # the base behaviour may reject our dummy arguments; the call still reached the inner one
    reached = {name for name, _ in rc.CALLS}
    assert reached == set(FORWARDED), set(FORWARDED) - reached
    for name in FORWARDED_PROPERTIES:
        assert getattr(worker, name) == getattr(worker.inner, name)
    assert LaxflowConnector.get_required_kvcache_layout(s.vllm_config) is None
    assert LaxflowConnector.requires_piecewise_for_cudagraph({"laxflow_inner": "LaxflowTestRecording"}) is False
    assert len(FORWARDED_CLASSMETHODS) == 4


def test_missing_inner_connector_is_one_clear_error(tmp_path):
    from vllm.config import KVTransferConfig

    bad = KVTransferConfig(kv_connector="LaxflowConnector", kv_role="kv_both",
                           kv_connector_module_path="laxflow.integrations.vllm.connector")
    with pytest.raises(ValueError, match="laxflow_inner must name the connector to wrap"):
        make_scheduler(tmp_path, kv_transfer_config=bad)


def test_real_shim_tag_symbols_found_when_preloaded():
    shim = ROOT / "src" / "laxflow" / "_native" / "liblaxflow_shim.so"
    assert shim.is_file(), "make install builds the shim"
    code = ("from laxflow.integrations.vllm.hooks import shim_tagger; t = shim_tagger(); "
            "print(t is not None, t[0](7, 3, 2, -1), t[0](7, 3, 2, 99)); t[1]()")
    env = dict(os.environ, LD_PRELOAD=str(shim))
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert res.stdout.split() == ["True", "0", "-1"], res.stderr  # DSCP 99 refused by the shim itself
    res = subprocess.run([sys.executable, "-c", "from laxflow.integrations.vllm.hooks import shim_tagger; "
                          "print(shim_tagger())"], capture_output=True, text=True, timeout=120,
                         env={k: v for k, v in os.environ.items() if k != "LD_PRELOAD"})
    assert res.stdout.strip() == "None"
