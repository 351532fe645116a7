"""The hooks link of the vLLM integration: laxflow's node daemon when there is one, counted skips when not.

Built once by each scheduler / connector object (engine-core process, or a
worker process); every call runs on the caller's thread. No daemon -> no
object is called and :attr:`HooksLink.skipped` counts what would have been
reported, so the serving path never waits on a missing daemon.
"""

from __future__ import annotations

import ctypes
import logging
from collections import Counter
from pathlib import Path
from typing import Any

log = logging.getLogger("laxflow.vllm")


def connect(setting: str) -> Any | None:
    """A ``laxflow.hooks`` client for ``setting`` ("auto", "off", or an address), or None."""
    if setting == "off":
        return None
    try:
        from laxflow.hooks import HooksClient
        from laxflow.hooks.client import client_address
    except ImportError:  # a laxflow without the daemon part
        return None
    address = client_address() if setting == "auto" else setting
    if setting == "auto" and address.startswith("ipc://") and not Path(address[len("ipc://"):]).exists():
        return None  # no daemon on this node
    return HooksClient(address, name="vllm")


class HooksLink:
    """Forwards lifecycle calls to ``hooks`` (a ``laxflow.hooks.Hooks``) or counts them as skipped."""

    def __init__(self, hooks: Any | None) -> None:
        self.hooks = hooks
        self.calls: Counter[str] = Counter()
        self.skipped: Counter[str] = Counter()
        self.failures = 0

    def call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        if self.hooks is None:
            self.skipped[name] += 1
            return None
        self.calls[name] += 1
        try:
            return getattr(self.hooks, name)(*args, **kwargs)
        except Exception as exc:  # the daemon must never stop serving
            self.failures += 1
            if self.failures == 1:
                log.warning("laxflow hooks: %s failed (%s); serving goes on", name, exc)
            return None


def shim_tagger() -> tuple[Any, Any] | None:
    """(set_tag, clear_tag) of the laxflow shim preloaded in this process (``laxflow run``), or None.

    ``set_tag(request_key, stage, layer, dscp)`` makes the calling thread's
    next connections / QPs carry that flow tag (native/shim_sockets.c);
    ``clear_tag()`` ends it. Looked up once per worker-side connector.
    """
    try:
        proc = ctypes.CDLL(None)
        set_tag, clear_tag = proc.laxflow_shim_set_tag, proc.laxflow_shim_clear_tag
    except (OSError, AttributeError):
        return None
    set_tag.argtypes = [ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint32, ctypes.c_int]
    set_tag.restype = ctypes.c_int
    clear_tag.argtypes, clear_tag.restype = [], None
    return set_tag, clear_tag
