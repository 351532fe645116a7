"""laxflow's prefill policy as SGLang's SchedulePolicy, against SGLang 0.5.23's real classes.

Real: SGLang's ``SchedulePolicy`` (the base class and the baseline), its
``Req`` and ``SamplingParams``, its simulated ``RadixCache``, its published
runtime config, its ``HookRegistry``. Not real: the scheduler step around
the policy (``Scheduler.get_new_batch_prefill`` needs a model runner and KV
pools); :func:`step` stands in for it, calling the policy and admitting
from the head of the queue as SGLang's loop does.
"""

import time
from types import SimpleNamespace

import pytest
from sglang_harness import RecordingHooks, make_policy, make_req, published

pytest.importorskip("sglang.srt.managers.schedule_policy", reason="SGLang not installed: make sglang")

from sglang.srt.managers.schedule_policy import SchedulePolicy  # noqa: E402
from sglang.srt.plugins.hook_registry import HookRegistry, HookType  # noqa: E402

from laxflow.integrations.sglang import plugin  # noqa: E402
from laxflow.integrations.sglang.policy import (  # noqa: E402
    LaxflowSchedulePolicy,
    after_prefill_result,
    around_get_new_batch_prefill,
)
from laxflow.integrations.vllm.hooks import HooksLink  # noqa: E402


@pytest.fixture(autouse=True)
def _context():
    with published():
        yield


def step(scheduler, admit: int = 1):
    """A prefill step as SGLang's: order the queue with the policy, admit from its head, keep the rest."""

    def original(s):
        s.policy.calc_priority(s.waiting_queue, None, processed_tokens=0)
        batch, s.waiting_queue = s.waiting_queue[:admit], s.waiting_queue[admit:]
        return SimpleNamespace(batch_to_run=SimpleNamespace(reqs=batch) if batch else None)

    return around_get_new_batch_prefill(original, scheduler)


def test_tight_slo_request_scheduled_first():
    policy = make_policy(LaxflowSchedulePolicy)
    queue = [make_req("loose", 16, ttft_slo_ms=5000), make_req("plain", 16), make_req("tight", 16, ttft_slo_ms=80)]
    policy.begin_step(8192)
    policy.calc_priority(queue)
    assert [r.rid for r in queue] == ["tight", "loose", "plain"] and policy.end_step() == []


def test_slo_aware_admission_holds_what_would_miss_the_heads_deadline():
    policy = make_policy(LaxflowSchedulePolicy)
    s = SimpleNamespace(policy=policy, max_prefill_tokens=16384,
                        waiting_queue=[make_req("big", 4000), make_req("tight", 16, ttft_slo_ms=60),
                                       make_req("small", 16)])
    plan = step(s, admit=5)
    # 4000 more tokens take ~0.2 s by the placeholder model: past tight's 60 ms, so big sits the step out
    assert [r.rid for r in plan.batch_to_run.reqs] == ["tight", "small"]
    assert [r.rid for r in s.waiting_queue] == ["big"] and policy.laxflow_stats["admission_holds"] == 1


def test_pruned_request_deferred_and_lifecycle_reported():
    policy = make_policy(LaxflowSchedulePolicy)
    hooks = RecordingHooks()
    policy.laxflow_hooks = HooksLink(hooks)
    hooks.pruned_set = {"victim"}
    before = time.time()
    s = SimpleNamespace(policy=policy, max_prefill_tokens=8192,
                        waiting_queue=[make_req("victim", 50, ttft_slo_ms=100), make_req("a", 50, ttft_slo_ms=5000),
                                       make_req("b", 50, ttft_slo_ms=6000)])
    admitted = [step(s).batch_to_run.reqs[0].rid for _ in range(2)]
    assert admitted == ["a", "b"]
    assert [r.rid for r in s.waiting_queue] == ["victim"] and policy.laxflow_stats["pruned_deferrals"] == 2
    assert step(s).batch_to_run is None and [r.rid for r in s.waiting_queue] == ["victim"]
    hooks.pruned_set = set()
    plan = step(s)
    assert [r.rid for r in plan.batch_to_run.reqs] == ["victim"] and s.waiting_queue == []
    reg = {c[1]: c for c in hooks.calls if c[0] == "register_request"}
    assert sorted(reg) == ["a", "b", "victim"]
    assert before + 0.1 <= reg["victim"][2] <= time.time() + 0.1 and reg["victim"][3] == 50
    assert [c[2] for c in hooks.calls if c[0] == "batch_formed"] == [("a",), ("b",), ("victim",)]
    plan.batch_to_run.reqs[0].output_ids.append(7)  # the prefill produced its first token
    after_prefill_result(None, object(), plan.batch_to_run)
    assert ("request_done", "victim") in hooks.calls


@pytest.mark.parametrize("name", ["fcfs", "lof", "random"])
def test_without_slo_the_order_is_sglangs(name):
    import random

    reqs = [make_req(f"r{i}", 8 + i, max_new=(i * 7) % 5 + 1) for i in range(6)]
    ours, theirs = make_policy(LaxflowSchedulePolicy, name), make_policy(SchedulePolicy, name)
    a, b = list(reqs), list(reqs)
    random.seed(1)
    ours.begin_step(8192)
    ours.calc_priority(a)
    random.seed(1)
    theirs.calc_priority(b)
    assert [r.rid for r in a] == [r.rid for r in b] and ours.end_step() == []


def test_outside_a_prefill_step_the_policy_is_sglangs():
    policy = make_policy(LaxflowSchedulePolicy)
    queue = [make_req("loose", 16, ttft_slo_ms=5000), make_req("tight", 16, ttft_slo_ms=80)]
    policy.calc_priority(queue)  # e.g. the decode side's queue
    assert [r.rid for r in queue] == ["loose", "tight"]


@pytest.fixture
def registry(monkeypatch):
    monkeypatch.setattr(HookRegistry, "_hooks", type(HookRegistry._hooks)(list))
    monkeypatch.setattr(plugin, "REGISTERED", [])
    return HookRegistry._hooks


def test_plugin_registers_nothing_when_laxflow_is_off(registry):
    plugin.register()
    assert dict(registry) == {} and not plugin.SETTINGS.enabled


def test_plugin_registers_the_policy_and_the_kv_manager(registry, monkeypatch):
    monkeypatch.setenv("LAXFLOW_SGLANG_POLICY", "flowprefill")
    monkeypatch.setenv("LAXFLOW_SGLANG_TRANSFER", "mooncake")
    plugin.register()
    from laxflow.integrations.sglang.mooncake import LaxflowMooncakeKVManager

    assert registry[plugin.SCHEDULE_POLICY][0][:2] == (HookType.REPLACE, LaxflowSchedulePolicy)
    assert registry[plugin.MOONCAKE_KV_MANAGER][0][:2] == (HookType.REPLACE, LaxflowMooncakeKVManager)
    assert registry[plugin.GET_NEW_BATCH_PREFILL][0][0] == HookType.AROUND
    for target in (plugin.SCHEDULE_POLICY, plugin.GET_NEW_BATCH_PREFILL, plugin.MOONCAKE_KV_MANAGER,
                   *plugin.PREFILL_RESULTS):
        import pkgutil

        owner, attr = target.rsplit(".", 1)
        assert hasattr(pkgutil.resolve_name(owner), attr), target  # every target exists in this SGLang


def test_bad_setting_is_one_line(monkeypatch, registry):
    monkeypatch.setenv("LAXFLOW_SGLANG_POLICY", "edf")
    with pytest.raises(ValueError, match="LAXFLOW_SGLANG_POLICY: expected one of off, flowprefill, got 'edf'"):
        plugin.register()


def test_bad_custom_params_ignored_and_named(caplog):
    policy = make_policy(LaxflowSchedulePolicy)
    queue = [make_req("odd", 16, ttft_slo_ms="soon"), make_req("ok", 16)]
    policy.begin_step(8192)
    policy.calc_priority(queue)
    policy.end_step()
    assert [r.rid for r in queue] == ["odd", "ok"] and policy.laxflow_stats["bad_custom_params"] == 1
    assert any("custom_params ttft_slo_ms" in r.getMessage() for r in caplog.records)


APPLY = r"""
import importlib.metadata, sys
sys.path.append(sys.argv[1])
sys.path.insert(0, sys.argv[2])
import sglang_harness
sglang_harness.declare_torchvision_ops()
from sglang.srt.plugins import load_plugins
from sglang.srt.plugins.hook_registry import HookRegistry
eps = [ep for ep in importlib.metadata.entry_points(group="sglang.srt.plugins") if ep.name == "laxflow"]
if eps:
    load_plugins()  # SGLang's own loader finds laxflow's entry point
else:  # laxflow installed before the entry point existed: what load_plugins does with it
    from laxflow.integrations.sglang.plugin import register
    register()
    HookRegistry.apply_hooks()
import sglang.srt.managers.scheduler as scheduler
from sglang.srt.disaggregation.utils import KVClassType, TransferBackend, get_kv_class
from laxflow.integrations.sglang.mooncake import LaxflowMooncakeKVManager
from laxflow.integrations.sglang.policy import LaxflowSchedulePolicy
assert scheduler.SchedulePolicy is LaxflowSchedulePolicy, scheduler.SchedulePolicy
assert get_kv_class(TransferBackend.MOONCAKE, KVClassType.MANAGER) is LaxflowMooncakeKVManager
assert scheduler.Scheduler.get_new_batch_prefill.__wrapped__.__name__ == "get_new_batch_prefill"
print("entry point" if eps else "register()", "applied")
"""


def test_sglang_applies_the_plugin_to_its_own_classes(monkeypatch):
    """In a fresh process: SGLang's scheduler builds laxflow's policy and picks laxflow's Mooncake KV manager."""
    import subprocess
    import sys
    from pathlib import Path

    import sglang_harness

    monkeypatch.setenv("LAXFLOW_SGLANG_POLICY", "flowprefill")
    monkeypatch.setenv("LAXFLOW_SGLANG_TRANSFER", "mooncake")
    out = subprocess.run([sys.executable, "-c", APPLY, str(sglang_harness.SITE),
                          str(Path(sglang_harness.__file__).parent)],
                         capture_output=True, text=True, timeout=240)
    assert out.returncode == 0 and out.stdout.strip().endswith("applied"), out.stderr[-3000:]


def test_settings_read_once_with_one_line_errors(tmp_path):
    from laxflow.integrations.sglang.settings import load_settings

    s = load_settings({"LAXFLOW_SGLANG_TRANSFER": "Mooncake", "MC_FORCE_TCP": "1"})
    assert (s.policy, s.transfer, s.hooks, s.protocol, s.enabled) == ("off", "mooncake", "auto", "tcp", True)
    assert load_settings({"MOONCAKE_PROTOCOL": "RDMA"}).protocol == "rdma" and not load_settings({}).enabled
    with pytest.raises(ValueError, match="^LAXFLOW_SGLANG_TRANSFER: expected one of off, mooncake, got 'nixl'$"):
        load_settings({"LAXFLOW_SGLANG_TRANSFER": "nixl"})
    with pytest.raises(ValueError, match="^LAXFLOW_SGLANG_PROFILE: .*missing.json' is not a file$"):
        load_settings({"LAXFLOW_SGLANG_PROFILE": str(tmp_path / "missing.json")})
    profile = tmp_path / "p.json"
    profile.write_text('{"prefill": [[1, 0.01], [1000, 0.1], [4000, 0.5]]}')
    assert load_settings({"LAXFLOW_SGLANG_PROFILE": str(profile)}).prefill_samples()[1] == (1000.0, 0.1)
