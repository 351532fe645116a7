"""``LaxflowConnector``: any vLLM v1 KV connector, wrapped, with laxflow's metadata and flow tags.

Configured with ``--kv-transfer-config`` ``{"kv_connector": "LaxflowConnector",
"kv_connector_module_path": "laxflow.integrations.vllm.connector",
"kv_connector_extra_config": {"laxflow_inner": "MooncakeConnector", ...}}``
(``laxflow_inner_module_path`` for an out-of-tree inner connector). The other
extra-config keys are the inner connector's own; it sees the same config with
its own name in ``kv_connector``.

vLLM builds two instances: the scheduler-side one in the engine-core process
(called on the scheduler thread) and the worker-side one in each worker
process (called on the forward thread). Every method of
``KVConnectorBase_V1`` is forwarded to the inner connector (composition);
``FORWARDED`` lists them and a test checks the list against the pinned vLLM.
Added:

* scheduler side: ``build_connector_meta`` wraps the inner metadata in
  :class:`LaxflowConnectorMetadata` with, per request of the step, its laxflow
  key, stage (1: KV loaded from elsewhere, 3: KV produced for a decode node),
  the model's layer count and the TTFT deadline (from ``extra_args``);
* worker side: around the inner ``start_load_kv`` / ``wait_for_layer_load``
  (stage 1) and ``save_kv_layer`` / ``wait_for_save`` (stage 3) the calling
  thread carries the shim's flow tag (``laxflow_shim_set_tag`` from the
  preloaded shim, found with ctypes), so transfers the inner connector does
  on that thread are scheduled as that stage's messages; layer progress goes
  to ``laxflow.hooks``. Without the shim or the daemon the calls are counted
  and skipped. Transfers an inner connector starts on its own threads keep
  whatever tag those threads have (Mooncake's TCP transport tags sockets at
  connect: see the shim's docs).
"""

from __future__ import annotations

import abc
import copy
import logging
import math
import re
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    SupportsHMA,
)

from laxflow.integrations.vllm.hooks import HooksLink, connect, shim_tagger
from laxflow.integrations.vllm.settings import load_settings, request_slo
from laxflow.stage import Stage

log = logging.getLogger("laxflow.vllm")

STAGE_REUSE, STAGE_P2D = Stage.REUSE.code, Stage.P2D.code  # LXF_STAGE_* of native/laxflow_shm.h
_LAYER = re.compile(r"(?:^|\.)(?:layers|h|blocks|layer)\.(\d+)(?:\.|$)")

# Every public method of the pinned KVConnectorBase_V1 (vLLM 0.32.0), forwarded to the inner connector.
FORWARDED = (
    "get_mem_pool_context", "bind_connector_metadata", "clear_connector_metadata", "has_connector_metadata",
    "register_kv_caches", "set_host_xfer_buffer_ops", "finish_forward", "reset_capture_state",
    "handle_preemptions", "start_load_kv", "wait_for_layer_load", "save_kv_layer", "wait_for_save", "get_finished",
    "get_transfer_results", "get_block_ids_with_load_errors", "shutdown", "get_kv_connector_stats",
    "get_kv_connector_kv_cache_events", "get_handshake_metadata", "build_connector_worker_meta",
    "bind_kv_cache_manager", "bind_gpu_block_pool", "get_loaded_kv_cache_group_ids", "get_num_new_matched_tokens",
    "get_external_cache_hit_sources", "update_state_after_alloc", "build_connector_meta", "on_new_request",
    "update_connector_output", "request_finished", "register_finished_partial_tail", "take_events",
    "has_pending_block_frees", "has_pending_push_work", "get_finished_count", "set_xfer_handshake_metadata",
    "set_xfer_handshake_metadata_pp_aware", "reset_cache", "request_finished_all_groups",
)
FORWARDED_PROPERTIES = ("supports_divergent_local_hybrid_hits", "requires_kv_delivery")
FORWARDED_CLASSMETHODS = ("get_required_kvcache_layout", "requires_piecewise_for_cudagraph",
                          "build_kv_connector_stats", "build_prom_metrics")


@dataclass(frozen=True)
class FlowInfo:
    """laxflow's view of one request's KV traffic in a step."""

    request: str
    key: int  # laxflow.hooks.request_key(request): the id shim events carry
    stage: int  # STAGE_REUSE or STAGE_P2D
    layers: int  # the model's layer count: transfers go layer 0 .. layers-1
    deadline: float | None  # absolute TTFT deadline (time.time() clock), None without an SLO


@dataclass
class LaxflowConnectorMetadata(KVConnectorMetadata):
    """What the scheduler side sends the workers each step: the inner metadata plus laxflow's."""

    inner: KVConnectorMetadata | None
    batch: str = ""
    flows: dict[str, FlowInfo] = field(default_factory=dict)

    def head(self, stage: int) -> FlowInfo | None:
        """The flow of ``stage`` with the earliest deadline (the one the step's tag carries)."""
        flows = [f for f in self.flows.values() if f.stage == stage]
        if not flows:
            return None
        return min(flows, key=lambda f: (f.deadline if f.deadline is not None else math.inf, f.request))


def inner_config(vllm_config: Any) -> Any:
    """``vllm_config`` as the inner connector must see it: its own name and module path."""
    ktc = vllm_config.kv_transfer_config
    extra = dict(ktc.kv_connector_extra_config or {})
    name = extra.get("laxflow_inner")
    if not name or not isinstance(name, str):
        raise ValueError("LaxflowConnector: kv_connector_extra_config.laxflow_inner must name the connector to "
                         "wrap (e.g. MooncakeConnector)")
    if name == "LaxflowConnector":
        raise ValueError("LaxflowConnector: laxflow_inner cannot be LaxflowConnector itself")
    inner_ktc = replace(ktc, kv_connector=name, kv_connector_module_path=extra.get("laxflow_inner_module_path"))
    cfg = copy.copy(vllm_config)
    object.__setattr__(cfg, "kv_transfer_config", inner_ktc)
    return cfg


def layer_index(layer_name: str) -> int:
    """The layer number in a vLLM attention layer name (``model.layers.7.self_attn.attn`` -> 7), -1 if none."""
    m = _LAYER.search(layer_name)
    return int(m.group(1)) if m else -1


class LaxflowConnector(KVConnectorBase_V1, SupportsHMA):
    """See the module docstring. ``self.inner`` is the wrapped connector, built through vLLM's factory."""

    def __init__(self, vllm_config: Any, role: KVConnectorRole, kv_cache_config: Any = None) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        from laxflow.hooks.api import request_key

        self._request_key = request_key
        cfg = inner_config(vllm_config)
        inner_cls = KVConnectorFactory.get_connector_class(cfg.kv_transfer_config)
        self.inner = inner_cls(cfg, role, kv_cache_config)
        self.settings = load_settings()
        self.hooks = HooksLink(connect(self.settings.hooks))
        self.stats: Counter[str] = Counter()
        self.layers = vllm_config.model_config.get_num_layers(vllm_config.parallel_config)
        self.producer = bool(self._kv_transfer_config.is_kv_producer)
        self._deadlines: dict[str, float | None] = {}
        self._loading: set[str] = set()
        self._tagger = shim_tagger() if role == KVConnectorRole.WORKER else None
        self.last_bound: LaxflowConnectorMetadata | None = None

    # ------------------------------------------------------------ scheduler side (additions)

    def _remember(self, request: Any) -> None:
        if request.request_id not in self._deadlines:
            slo = request_slo(request.sampling_params.extra_args if request.sampling_params else None)
            self._deadlines[request.request_id] = (request.arrival_time + slo.ttft_s if slo.ttft_s else None)

    def on_new_request(self, request: Any) -> None:
        self._remember(request)
        return self.inner.on_new_request(request)

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int):
        self._remember(request)
        if num_external_tokens > 0:
            self._loading.add(request.request_id)
        return self.inner.update_state_after_alloc(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output: Any) -> LaxflowConnectorMetadata:
        inner = self.inner.build_connector_meta(scheduler_output)
        flows = {}
        for rid in scheduler_output.num_scheduled_tokens:
            stage = STAGE_REUSE if rid in self._loading else STAGE_P2D if self.producer else 0
            if stage:
                flows[rid] = FlowInfo(rid, self._request_key(rid), stage, self.layers, self._deadlines.get(rid))
        self._loading.clear()
        step = getattr(scheduler_output, "laxflow_step", None) or len(scheduler_output.num_scheduled_tokens)
        self.stats["metas"] += 1
        return LaxflowConnectorMetadata(inner=inner, batch=f"kv-{self.stats['metas']}-{step}", flows=flows)

    def request_finished(self, request: Any, block_ids: list[int]):
        self._deadlines.pop(request.request_id, None)
        return self.inner.request_finished(request, block_ids)

    def request_finished_all_groups(self, request: Any, block_ids: tuple[list[int], ...]):
        self._deadlines.pop(request.request_id, None)
        if isinstance(self.inner, SupportsHMA):
            return self.inner.request_finished_all_groups(request, block_ids)
        if len(block_ids) != 1:
            raise ValueError(f"LaxflowConnector: {type(self.inner).__name__} does not support the hybrid KV "
                             "cache manager; start vLLM with --disable-hybrid-kv-cache-manager")
        return self.inner.request_finished(request, block_ids[0])

    # ------------------------------------------------------------ worker side (additions)

    def bind_connector_metadata(self, connector_metadata: KVConnectorMetadata) -> None:
        super().bind_connector_metadata(connector_metadata)
        if isinstance(connector_metadata, LaxflowConnectorMetadata):
            self.last_bound = connector_metadata
            return self.inner.bind_connector_metadata(connector_metadata.inner)
        return self.inner.bind_connector_metadata(connector_metadata)

    def clear_connector_metadata(self) -> None:
        super().clear_connector_metadata()
        return self.inner.clear_connector_metadata()

    def _tag(self, stage: int, layer: int) -> bool:
        meta = self._connector_metadata
        head = meta.head(stage) if isinstance(meta, LaxflowConnectorMetadata) else None
        if head is None:
            return False
        if self._tagger is None:
            self.stats["untagged"] += 1
            return False
        self._tagger[0](head.key, stage, max(layer, 0), -1)
        self.stats["tagged"] += 1
        return True

    def _untag(self, tagged: bool) -> None:
        if tagged and self._tagger is not None:
            self._tagger[1]()

    def _batch(self) -> str | None:
        meta = self._connector_metadata
        return meta.batch if isinstance(meta, LaxflowConnectorMetadata) and meta.flows else None

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        tagged = self._tag(STAGE_REUSE, 0)
        try:
            return self.inner.start_load_kv(forward_context, **kwargs)
        finally:
            self._untag(tagged)

    def wait_for_layer_load(self, layer_name: str) -> None:
        layer = layer_index(layer_name)
        batch = self._batch()
        if batch is not None:
            self.hooks.call("layer_begin", batch, layer)
        tagged = self._tag(STAGE_REUSE, layer)
        try:
            return self.inner.wait_for_layer_load(layer_name)
        finally:
            self._untag(tagged)

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kwargs: Any) -> None:
        layer = layer_index(layer_name)
        tagged = self._tag(STAGE_P2D, layer)
        try:
            return self.inner.save_kv_layer(layer_name, kv_layer, attn_metadata, **kwargs)
        finally:
            self._untag(tagged)
            batch = self._batch()
            if batch is not None:
                self.hooks.call("layer_end", batch, layer, layer == self.layers - 1)

    def wait_for_save(self):
        tagged = self._tag(STAGE_P2D, self.layers - 1)
        try:
            return self.inner.wait_for_save()
        finally:
            self._untag(tagged)

    # ------------------------------------------------------------ pure forwarding

    @property
    def supports_divergent_local_hybrid_hits(self) -> bool:
        return self.inner.supports_divergent_local_hybrid_hits

    @property
    def requires_kv_delivery(self) -> bool:
        return self.inner.requires_kv_delivery

    @classmethod
    def _inner_class(cls, vllm_config: Any) -> type:
        return KVConnectorFactory.get_connector_class(inner_config(vllm_config).kv_transfer_config)

    @classmethod
    def get_required_kvcache_layout(cls, vllm_config: Any) -> str | None:
        return cls._inner_class(vllm_config).get_required_kvcache_layout(vllm_config)

    @classmethod
    def requires_piecewise_for_cudagraph(cls, extra_config: dict[str, Any]) -> bool:
        name = extra_config.get("laxflow_inner")
        if not name:
            return False
        inner = KVConnectorFactory.get_connector_class(_NameOnly(name, extra_config.get("laxflow_inner_module_path")))
        return inner.requires_piecewise_for_cudagraph(extra_config)

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None):
        # No config argument: the inner class comes from the config vLLM has set current in this process.
        from vllm.config import get_current_vllm_config

        config = get_current_vllm_config()
        if config.kv_transfer_config is None:
            return None
        return cls._inner_class(config).build_kv_connector_stats(data)

    @classmethod
    def build_prom_metrics(cls, vllm_config: Any, metric_types: Any, labelnames: Any, per_engine_labelvalues: Any):
        return cls._inner_class(vllm_config).build_prom_metrics(vllm_config, metric_types, labelnames,
                                                                per_engine_labelvalues)


@dataclass(frozen=True)
class _NameOnly:
    """Enough of a KVTransferConfig for ``KVConnectorFactory.get_connector_class``."""

    kv_connector: str
    kv_connector_module_path: str | None = None


def _forwarder(name: str):
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.inner, name)(*args, **kwargs)

    forward.__name__ = name
    forward.__doc__ = f"Forwarded to the inner connector's ``{name}``."
    return forward


for _name in FORWARDED:  # the methods with nothing to add: plain forwarding, one definition each
    if _name not in LaxflowConnector.__dict__:
        setattr(LaxflowConnector, _name, _forwarder(_name))
abc.update_abstractmethods(LaxflowConnector)
