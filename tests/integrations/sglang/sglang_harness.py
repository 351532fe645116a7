"""Real SGLang objects for the tests: a published runtime context, requests, hooks that record."""

from __future__ import annotations

import contextlib
import importlib.util
import sys
from array import array
from pathlib import Path

from laxflow.hooks.api import Hooks

SGLANG_VERSION = "0.5.23"  # the Makefile's SGLANG_VERSION
SITE = Path(sys.prefix) / f"sglang-{SGLANG_VERSION}"  # the Makefile's SGLANG_SITE


def declare_torchvision_ops() -> None:
    """Without a loadable torchvision extension, declare the two op schemas its import registers fakes for."""
    import torch

    spec = importlib.util.find_spec("torchvision")
    if spec is None or not spec.submodule_search_locations:
        return
    ext = sorted(Path(spec.submodule_search_locations[0]).glob("_C*.so"))
    try:
        if ext:
            torch.ops.load_library(str(ext[0]))
            return
    except OSError:
        pass
    for op in ("nms", "qnms"):
        try:
            torch.library.define(f"torchvision::{op}", "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        except RuntimeError:  # already declared
            pass


@contextlib.contextmanager
def published(**server_args):
    """SGLang's process-wide config for a prefill server (what its launcher publishes), reset after."""
    from sglang.srt.runtime_context import SpawnRanks, publish, reset_context
    from sglang.srt.server_args import ServerArgs

    reset_context()
    publish(ServerArgs(model_path="dummy", **{"disaggregation_mode": "prefill", **server_args}), role="test",
            ranks=SpawnRanks(world_rank=0, dp_rank=None))
    try:
        yield
    finally:
        reset_context()


def make_req(rid: str, prompt: int, max_new: int = 16, room: int | None = None, **custom):
    """An SGLang ``Req`` with ``prompt`` tokens; ``custom`` goes to ``sampling_params.custom_params``."""
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.sampling.sampling_params import SamplingParams

    params = SamplingParams(max_new_tokens=max_new, custom_params=dict(custom) or None)
    return Req(rid, "", array("q", range(1, prompt + 1)), params, bootstrap_room=room)


def make_policy(cls, name: str = "fcfs"):
    """``cls`` (SGLang's ``SchedulePolicy`` or laxflow's) over a real simulated radix cache."""
    from sglang.srt.mem_cache.radix_cache import RadixCache

    return cls(name, RadixCache.create_simulated(), False, False, False)


class RecordingHooks(Hooks):
    """The hooks interface as the daemon would answer it, with a settable pruned set."""

    def __init__(self):
        self.calls = []
        self.pruned_set = set()

    def register_request(self, request, deadline, prompt_tokens, reused_tokens=0, priority=0):
        self.calls.append(("register_request", request, deadline, prompt_tokens, reused_tokens, priority))

    def batch_formed(self, batch, requests, compute_s=0.0, traffic=None):
        self.calls.append(("batch_formed", batch, tuple(requests)))

    def layer_begin(self, batch, layer):
        pass

    def layer_end(self, batch, layer, last=False):
        pass

    def message_submit(self, msg_id, request, stage, layer, nbytes, port="", downstream=0.0):
        pass

    def wait_permit(self, msg_id, timeout_s=1.0):
        return None

    def message_progress(self, msg_id, bytes_done):
        pass

    def message_complete(self, msg_id):
        pass

    def request_done(self, request):
        self.calls.append(("request_done", request))

    def pruned(self):
        return set(self.pruned_set)

    def subscribe_pruned(self, callback):
        pass

    def dispatch_advice(self, request, instances):
        return []
