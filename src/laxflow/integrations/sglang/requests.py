"""What laxflow knows of SGLang's requests in one scheduler process: SLO, deadline, bootstrap room.

The schedule policy (scheduler thread) records each request the first time
it sees one; the gated Mooncake KV manager (its transfer worker threads)
looks a transfer's bootstrap room up to tag the transfer with the request's
id and deadline. One table per process (:data:`TABLE`), holding the last
:data:`KEEP` requests: a request's transfers end soon after its prefill, and
no caller has to remember to drop what it added.
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from laxflow.hooks.api import request_key
from laxflow.integrations.sglang.settings import request_slo
from laxflow.integrations.vllm.settings import RequestSlo

KEEP = 65536


@dataclass(frozen=True)
class Tracked:
    """One request: ``arrival`` is ``time.time()`` when laxflow first saw it (the hooks API's clock)."""

    rid: str
    arrival: float
    slo: RequestSlo
    room: int | None

    @property
    def deadline(self) -> float:
        """Absolute TTFT deadline (``time.time()`` units); inf without a TTFT SLO."""
        return self.arrival + self.slo.ttft_s if self.slo.ttft_s is not None else math.inf

    @property
    def key(self) -> int:
        """The request's 63-bit id in shared memory (``laxflow.hooks.api.request_key``)."""
        return request_key(self.rid)


class RequestTable:
    """rid -> :class:`Tracked` and bootstrap room -> rid, bounded to ``keep`` requests; thread-safe."""

    def __init__(self, keep: int = KEEP) -> None:
        self.keep = keep
        self._lock = threading.Lock()
        self._by_rid: OrderedDict[str, Tracked] = OrderedDict()
        self._room_rid: dict[int, str] = {}

    def track(self, req: Any, now: float | None = None) -> tuple[Tracked, bool]:
        """The entry of SGLang ``Req`` ``req`` (made on first sight) and whether it is new."""
        with self._lock:
            found = self._by_rid.get(req.rid)
            if found is not None:
                return found, False
            params = getattr(req, "sampling_params", None)
            room = getattr(req, "bootstrap_room", None)
            entry = Tracked(req.rid, time.time() if now is None else now,
                            request_slo(getattr(params, "custom_params", None)), room)
            self._by_rid[req.rid] = entry
            if room is not None:
                self._room_rid[room] = req.rid
            while len(self._by_rid) > self.keep:
                _, old = self._by_rid.popitem(last=False)
                if old.room is not None and self._room_rid.get(old.room) == old.rid:
                    del self._room_rid[old.room]
            return entry, True

    def get(self, rid: str) -> Tracked | None:
        with self._lock:
            return self._by_rid.get(rid)

    def of_room(self, room: int | None) -> Tracked | None:
        with self._lock:
            rid = self._room_rid.get(room) if room is not None else None
            return self._by_rid.get(rid) if rid is not None else None

    def clear(self) -> None:
        with self._lock:
            self._by_rid.clear()
            self._room_rid.clear()

    def __len__(self) -> int:
        return len(self._by_rid)


TABLE = RequestTable()
