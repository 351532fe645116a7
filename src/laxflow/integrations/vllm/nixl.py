"""``LaxflowNixlConnector``: vLLM's ``NixlConnector``, wrapped, its NIXL transfers gated by laxflow.

Configured with ``--kv-transfer-config`` ``{"kv_connector": "LaxflowNixlConnector",
"kv_connector_module_path": "laxflow.integrations.vllm.nixl", "kv_role": ...,
"kv_connector_extra_config": {...}}``; the extra-config keys are
NixlConnector's own, and ``laxflow_inner`` defaults to ``NixlConnector``
(``NixlPushConnector`` for push mode).

It is :class:`~laxflow.integrations.vllm.connector.LaxflowConnector` (every
method of ``KVConnectorBase_V1`` forwarded, laxflow's metadata added to the
scheduler side's) plus one change on the worker side: the inner worker's
NIXL agent (``connector_worker.nixl_wrapper``, which vLLM makes in the
worker's constructor and calls for every transfer) is replaced by a
:class:`laxflow.adapters.nixl.NixlAgent` around it.  The shim cannot see
NIXL's traffic (UCX posts RDMA work requests on mlx5's direct path, and its
TCP transport opens its sockets on its own threads), so this is the path by
which a vLLM PD deployment on NIXL is scheduled: each transfer vLLM posts
waits for its permit from the node daemon (failing open) and is reported
with SUBMIT/COMPLETION; its connections to the peer carry the permit's
DSCP on UCX's TCP transport.

Tags: vLLM's pull worker (the decode side, ``kv_consumer``) READs a
request's KV from the prefill worker with the notification
``"<remote request id>:<consumers>"``; the bound metadata's
``reqs_to_recv`` maps that id to the local request, whose laxflow key and
deadline the wrapper's metadata carries, so each READ is a stage-3 (p2d)
message of its request.  A transfer with no such notification gets the
earliest-deadline flow of the step (the thread's tags during
``start_load_kv``).  Called on the worker's forward thread (tags) and on
the NIXL wrapper's threads (posts).
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from dataclasses import replace
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorMetadata, KVConnectorRole

from laxflow.adapters.nixl import NixlAdapterConfig, NixlAgent
from laxflow.integrations.vllm.connector import (
    STAGE_P2D, STAGE_REUSE, LaxflowConnector, LaxflowConnectorMetadata, _NameOnly, inner_config,
)

DEFAULT_INNER = "NixlConnector"
REMEMBERED = 65536  # remote request ids kept for READs posted in a later step (after a handshake)


def with_default_inner(vllm_config: Any) -> Any:
    """``vllm_config`` with ``laxflow_inner`` set to NixlConnector unless the user named one."""
    ktc = vllm_config.kv_transfer_config
    extra = dict(ktc.kv_connector_extra_config or {})
    if extra.get("laxflow_inner"):
        return vllm_config
    extra["laxflow_inner"] = DEFAULT_INNER
    cfg = copy.copy(vllm_config)
    object.__setattr__(cfg, "kv_transfer_config", replace(ktc, kv_connector_extra_config=extra))
    return cfg


class LaxflowNixlConnector(LaxflowConnector):
    """See the module docstring.  ``self.agent``: the laxflow NIXL agent (worker side; None on the scheduler's)."""

    def __init__(self, vllm_config: Any, role: KVConnectorRole, kv_cache_config: Any = None) -> None:
        super().__init__(with_default_inner(vllm_config), role, kv_cache_config)
        self.agent: NixlAgent | None = None
        self._by_remote: OrderedDict[str, dict] = OrderedDict()
        if role != KVConnectorRole.WORKER:
            return
        worker = getattr(self.inner, "connector_worker", None)
        nixl = getattr(worker, "nixl_wrapper", None)
        if nixl is None:
            raise ValueError(f"LaxflowNixlConnector: {type(self.inner).__name__} has no NIXL agent "
                             "(connector_worker.nixl_wrapper); wrap it with LaxflowConnector instead")
        self.agent = NixlAgent(nixl, config=NixlAdapterConfig.from_env(), tagger=self._tags_of)
        worker.nixl_wrapper = self.agent

    # ------------------------------------------------------------ worker side (additions)

    def bind_connector_metadata(self, connector_metadata: KVConnectorMetadata) -> None:
        super().bind_connector_metadata(connector_metadata)
        if not isinstance(connector_metadata, LaxflowConnectorMetadata):
            return
        for rid, req in (getattr(connector_metadata.inner, "reqs_to_recv", None) or {}).items():
            remote = getattr(req, "remote", None)
            if remote is None:
                continue
            flow = connector_metadata.flows.get(rid)
            tags = {"request": flow.key if flow else self._request_key(rid), "stage": STAGE_P2D, "layer": 0}
            if flow is not None and flow.deadline is not None:
                tags["deadline"] = flow.deadline
            self._by_remote[remote.request_id] = tags
            self._by_remote.move_to_end(remote.request_id)
            while len(self._by_remote) > REMEMBERED:
                self._by_remote.popitem(last=False)

    def _tags_of(self, notif: bytes) -> dict | None:
        """The tags of the READ whose notification is ``notif`` (None: unknown); on the thread that posts it."""
        try:
            remote_id = notif.decode().rsplit(":", 1)[0]
        except UnicodeDecodeError:
            return None
        return self._by_remote.get(remote_id)

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        meta = self._connector_metadata
        head = meta.head(STAGE_REUSE) if isinstance(meta, LaxflowConnectorMetadata) else None
        if self.agent is None or head is None:
            return super().start_load_kv(forward_context, **kwargs)
        with self.agent.tags(request=head.key, stage=STAGE_P2D, layer=0):
            return super().start_load_kv(forward_context, **kwargs)

    def shutdown(self):
        try:
            return self.inner.shutdown()
        finally:
            if self.agent is not None:
                self.agent.close()

    # ------------------------------------------------------------ the inner class, by default NixlConnector

    @classmethod
    def _inner_class(cls, vllm_config: Any) -> type:
        return KVConnectorFactory.get_connector_class(inner_config(with_default_inner(vllm_config)).kv_transfer_config)

    @classmethod
    def requires_piecewise_for_cudagraph(cls, extra_config: dict[str, Any]) -> bool:
        name = extra_config.get("laxflow_inner") or DEFAULT_INNER
        inner = KVConnectorFactory.get_connector_class(_NameOnly(name, extra_config.get("laxflow_inner_module_path")))
        return inner.requires_piecewise_for_cudagraph(extra_config)
