"""The hooks interface in process: straight into a daemon core, with the caller's clock."""

from __future__ import annotations

from laxflow.daemon.core import CoreConfig, DaemonCore
from laxflow.daemon.inprocess import InProcessHooks
from laxflow.daemon.ports import PortSpec
from laxflow.hooks import Instance


def test_in_process_hooks_drive_a_core_with_the_callers_clock():
    clock = [0.0]
    core = DaemonCore(CoreConfig(ports=(PortSpec("eth0", 12.5e9),), window_bytes=0.0))
    hooks = InProcessHooks(core, lambda: clock[0])
    pruned_seen = []
    hooks.subscribe_pruned(pruned_seen.append)
    hooks.register_request("a", deadline=1.0, prompt_tokens=10)
    hooks.batch_formed("b", ["a"])
    hooks.layer_begin("b", 0)
    hooks.message_submit(1, "a", "collective", 0, 1e6)
    hooks.message_submit(2, "a", "reuse", 2, 1e6)
    assert hooks.wait_permit(1) == (1, 38)
    assert hooks.wait_permit(2) is None
    clock[0] = 1e-4
    hooks.message_complete(1)
    assert hooks.wait_permit(2) == (3, 36)
    core.apply_order({"b": 0}, ["a"])
    hooks.poll()
    assert pruned_seen == [{"a"}] and hooks.pruned() == {"a"}
    ranked = hooks.dispatch_advice("x", [Instance("i1", 0.1, 0.0, 0.0, "", 0.0), Instance("i0", 0.0, 0.0, 0.0, "", 0.0)])
    assert [e.name for e in ranked] == ["i0", "i1"]
