"""SGLang's Mooncake KV backend with its transfers ordered by laxflow (``--disaggregation-transfer-backend mooncake``).

SGLang's prefill scheduler process owns one ``MooncakeKVManager``; its
transfer worker threads take a chunk (a request's bootstrap room and KV
page indices) off a queue and write the pages to the decode instance with
``engine.batch_transfer_sync`` (all layers in one call, or one call per
layer on an executor). :class:`LaxflowMooncakeKVManager`, which the plugin
puts in its place, changes only where those bytes go:

* :meth:`~LaxflowMooncakeKVManager.init_engine` wraps SGLang's shared
  ``MooncakeTransferEngine`` in :class:`GatedEngine`, whose transfers go
  through ``laxflow.adapters.mooncake.TransferEngine`` (permit gate, DSCP,
  SUBMIT/COMPLETION events; failing open without a daemon);
* a worker thread knows which room it is sending (its queue and executor are
  wrapped), so :meth:`~LaxflowMooncakeKVManager._transfer_data` tags each
  transfer with the request (``request_key`` of its rid, from the policy's
  or the batch hook's :data:`~laxflow.integrations.sglang.requests.TABLE`)
  and its TTFT deadline, and splits a multi-layer call into one message per
  layer (the layer a source address lies in), submitted together and waited
  for together: the daemon orders the layers of concurrent requests.

Calls SGLang makes on the engine without going through ``_transfer_data``
(staging buffers, TP-resliced sends) pass the gate as one message of the
thread's request, layer 0.
"""

from __future__ import annotations

import bisect
import logging
import math
import threading
from concurrent.futures import Future
from typing import Any

from sglang.srt.disaggregation.mooncake.conn import MooncakeKVManager

from laxflow.adapters.mooncake import TransferEngine
from laxflow.adapters.mooncake_config import MooncakeAdapterConfig
from laxflow.integrations.sglang.requests import TABLE, Tracked
from laxflow.integrations.sglang.settings import SglangSettings, load_settings

log = logging.getLogger("laxflow.sglang")

_context = threading.local()  # .room: the bootstrap room the calling thread is sending


def current_room() -> int | None:
    return getattr(_context, "room", None)


class _RoomQueue:
    """A transfer worker's queue: each chunk taken off it sets the worker thread's room."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def get(self) -> Any:
        chunk = self._inner.get()
        _context.room = getattr(chunk, "room", None)
        return chunk

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._inner, name)


def _in_room(room: int | None, fn: Any, args: tuple, kwargs: dict) -> Any:
    _context.room = room
    try:
        return fn(*args, **kwargs)
    finally:
        _context.room = None


class _RoomExecutor:
    """A transfer worker's executor: its tasks run with the submitting thread's room."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def submit(self, fn: Any, *args: Any, **kwargs: Any) -> Future:
        return self._inner.submit(_in_room, current_room(), fn, args, kwargs)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._inner, name)


def _tags(entry: Tracked | None) -> dict:
    if entry is None:
        return {"request": 0, "deadline": None}
    deadline = entry.deadline
    return {"request": entry.key, "deadline": deadline if math.isfinite(deadline) else None}


class GatedEngine:
    """SGLang's ``MooncakeTransferEngine`` whose writes go through laxflow's Mooncake adapter.

    Everything else (registration, session id, probes) is SGLang's engine's.
    ``laxflow`` is the adapter around the same Mooncake engine.
    """

    def __init__(self, sglang_engine: Any, protocol: str, config: MooncakeAdapterConfig | None = None) -> None:
        self._sglang = sglang_engine
        self.laxflow = TransferEngine(sglang_engine.engine, config or MooncakeAdapterConfig.from_env(),
                                      protocol=protocol)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._sglang, name)

    def submit_write(self, session_id: str, buffers: list[int], peers: list[int], lengths: list[int], *,
                     request: int, layer: int, deadline: float | None) -> Future:
        """One laxflow message (P2D stage); the Future gives 0 or Mooncake's error."""
        return self.laxflow.submit("write", session_id, list(buffers), list(peers), list(lengths),
                                   request=request, layer=layer, deadline=deadline)

    def batch_transfer_sync(self, session_id: str, buffers: list[int], peer_buffer_addresses: list[int],
                            lengths: list[int]) -> int:
        """SGLang's call, as one message of the calling thread's request; -1 on an exception, as SGLang's."""
        try:
            return self.submit_write(session_id, buffers, peer_buffer_addresses, lengths, layer=0,
                                     **_tags(TABLE.of_room(current_room()))).result()
        except Exception as exc:
            log.debug("laxflow: gated Mooncake write to %s failed: %s", session_id, exc)
            return -1

    def transfer_sync(self, session_id: str, buffer: int, peer_buffer_address: int, length: int) -> int:
        return self.batch_transfer_sync(session_id, [buffer], [peer_buffer_address], [length])

    def close(self) -> None:
        self.laxflow.close()


class LaxflowMooncakeKVManager(MooncakeKVManager):
    """SGLang's ``MooncakeKVManager`` with gated, tagged transfers; see the module docstring."""

    laxflow_settings: SglangSettings | None = None

    def init_engine(self) -> None:
        super().init_engine()
        self.laxflow_settings = load_settings()
        if self.engine is not None and not isinstance(self.engine, GatedEngine):
            self.engine = GatedEngine(self.engine, self.laxflow_settings.protocol)
        self._layer_starts: list[tuple[int, int, int]] | None = None

    def transfer_worker(self, queue: Any, executor: Any, staging_buffer: Any = None, worker_index: int = 0) -> Any:
        return super().transfer_worker(_RoomQueue(queue), _RoomExecutor(executor), staging_buffer, worker_index)

    def _transfer_data(self, mooncake_session_id: str, transfer_blocks: list[tuple[int, int, int]]) -> int:
        if not transfer_blocks:
            return 0
        if not isinstance(self.engine, GatedEngine):
            return super()._transfer_data(mooncake_session_id, transfer_blocks)
        tags = _tags(TABLE.of_room(current_room()))
        by_layer: dict[int, list[tuple[int, int, int]]] = {}
        for block in transfer_blocks:
            by_layer.setdefault(self.layer_of(block[0]), []).append(block)
        futures = []
        for layer in sorted(by_layer):
            src, dst, lengths = zip(*by_layer[layer])
            futures.append(self.engine.submit_write(mooncake_session_id, src, dst, lengths, layer=layer, **tags))
        ret = 0
        for future in futures:  # every write is waited for: none may outlive this call (SGLang frees the pages)
            try:
                status = future.result()
            except Exception:
                status = -1
            if status != 0 and ret == 0:
                ret = status
        return ret

    def layer_of(self, address: int) -> int:
        """The model layer whose KV buffer holds ``address`` (0 outside them: aux and state buffers).

        ``kv_args.kv_data_ptrs`` lists one buffer per layer (MLA), or the K
        buffers of every layer then the V buffers (MHA).
        """
        if getattr(self, "_layer_starts", None) is None:
            ptrs, lens = list(self.kv_args.kv_data_ptrs), list(self.kv_args.kv_data_lens)
            layers = len(ptrs) if getattr(self, "is_mla_backend", False) or len(ptrs) < 2 else len(ptrs) // 2
            self._layer_starts = sorted((p, p + n, i % max(1, layers)) for i, (p, n) in enumerate(zip(ptrs, lens)))
        starts = self._layer_starts
        i = bisect.bisect_right(starts, (address, math.inf, 0)) - 1
        if i >= 0 and starts[i][0] <= address < starts[i][1]:
            return starts[i][2]
        return 0

    def teardown(self) -> None:
        super().teardown()
        if isinstance(self.engine, GatedEngine):
            self.engine.close()
