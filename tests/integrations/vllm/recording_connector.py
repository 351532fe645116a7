"""A v1 KV connector that records every call it gets (registered through vLLM's KVConnectorFactory by the tests).

Stands in for Mooncake/NIXL, which need RDMA or a peer this machine lacks.
``CURRENT_TAG`` is read from the test's tagger inside the transfer calls, to
show the flow tag is set while the inner connector runs.
"""

from __future__ import annotations

from dataclasses import dataclass

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorTransferResults,
    SupportsHMA,
)

CALLS: list[tuple[str, object]] = []
TAG_SOURCE = {"tag": None}  # the test's tagger writes the current tag here


@dataclass
class RecordingMeta(KVConnectorMetadata):
    requests: tuple[str, ...]


class RecordingConnector(KVConnectorBase_V1, SupportsHMA):
    def _rec(self, name, payload=None):
        CALLS.append((name, payload if payload is not None else TAG_SOURCE["tag"]))

    # abstract ones
    def start_load_kv(self, forward_context, **kwargs):
        self._rec("start_load_kv")

    def wait_for_layer_load(self, layer_name):
        self._rec("wait_for_layer_load")

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        self._rec("save_kv_layer")

    def wait_for_save(self):
        self._rec("wait_for_save")

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        self._rec("get_num_new_matched_tokens", request.request_id)
        return 0, False

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        self._rec("update_state_after_alloc", request.request_id)

    def build_connector_meta(self, scheduler_output):
        self._rec("build_connector_meta", tuple(scheduler_output.num_scheduled_tokens))
        return RecordingMeta(tuple(scheduler_output.num_scheduled_tokens))

    def request_finished_all_groups(self, request, block_ids):
        self._rec("request_finished_all_groups", request.request_id)
        return False, None

    # the rest: record, then the base behaviour
    def bind_connector_metadata(self, connector_metadata):
        self._rec("bind_connector_metadata", connector_metadata)
        super().bind_connector_metadata(connector_metadata)

    def get_transfer_results(self, finished_req_ids):
        self._rec("get_transfer_results")
        return KVConnectorTransferResults()


def _recorder(name):
    base = getattr(KVConnectorBase_V1, name)

    def method(self, *args, **kwargs):
        self._rec(name)
        return base(self, *args, **kwargs)

    return method


for _name in ("get_mem_pool_context", "clear_connector_metadata", "has_connector_metadata", "register_kv_caches",
              "set_host_xfer_buffer_ops", "finish_forward", "reset_capture_state", "handle_preemptions",
              "get_finished", "get_block_ids_with_load_errors", "shutdown", "get_kv_connector_stats",
              "get_kv_connector_kv_cache_events", "get_handshake_metadata", "build_connector_worker_meta",
              "bind_kv_cache_manager", "bind_gpu_block_pool", "get_loaded_kv_cache_group_ids",
              "get_external_cache_hit_sources", "on_new_request", "update_connector_output", "request_finished",
              "register_finished_partial_tail", "take_events", "has_pending_block_frees", "has_pending_push_work",
              "get_finished_count", "set_xfer_handshake_metadata", "set_xfer_handshake_metadata_pp_aware",
              "reset_cache"):
    setattr(RecordingConnector, _name, _recorder(_name))
