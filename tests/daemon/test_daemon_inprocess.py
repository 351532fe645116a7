"""The hooks interface in process: straight into a daemon core, with the caller's clock."""

from __future__ import annotations

from laxflow.daemon.core import CoreConfig, DaemonCore
from laxflow.daemon.inprocess import InProcessHooks
from laxflow.daemon.ports import PortSpec
from laxflow.hooks import Instance, request_key


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


def create_hooks(clock):
    core = DaemonCore(CoreConfig(ports=(PortSpec("eth0", 12.5e9),), window_bytes=0.0))
    return core, InProcessHooks(core, lambda: clock[0])


def test_names_of_done_requests_are_dropped_100k():
    # key -> name entries are the one thing the hooks keep per request: 100k requests in a row must not leave 100k.
    clock = [0.0]
    core, hooks = create_hooks(clock)
    most = 0
    for i in range(100_000):
        name = f"req-{i}"
        hooks.register_request(name, deadline=clock[0] + 1.0, prompt_tokens=10)
        if i % 10 == 0:  # every tenth in a batch of its own, the way an engine reports one
            hooks.batch_formed(f"b{i}", [name])
            hooks.layer_end(f"b{i}", 0, last=True)
        hooks.request_done(name)
        most = max(most, len(hooks._names))
        clock[0] += 1e-5
    hooks.poll()
    assert most <= 1 and len(hooks._names) == 0
    assert not core.requests


def test_names_of_requests_the_core_forgot_are_dropped():
    # An engine that never says request_done: the core forgets each record batch_idle past its deadline; the
    # hooks forget the name with it.
    clock = [0.0]
    core, hooks = create_hooks(clock)
    most = core_most = 0
    for i in range(100_000):
        hooks.register_request(f"req-{i}", deadline=clock[0], prompt_tokens=10)
        clock[0] += 1e-4  # 100k requests in 10 s: the core keeps each for 1 to 1.5 s (batch_idle 1 s)
        if i % 100 == 0:
            hooks.poll()
        most, core_most = max(most, len(hooks._names)), max(core_most, len(core.requests))
    assert core_most <= 16_000
    assert most <= max(1024, 2 * core_most)


def test_a_pruned_request_keeps_its_name_until_it_leaves_the_pruned_set():
    clock = [0.0]
    core, hooks = create_hooks(clock)
    seen = []
    hooks.subscribe_pruned(seen.append)
    for r in ("a", "b"):
        hooks.register_request(r, deadline=1.0, prompt_tokens=10)
    hooks.batch_formed("batch", ["a", "b"])
    key_a = str(request_key("a"))
    core.apply_order({"batch": 0}, [key_a])
    hooks.poll()
    hooks.request_done("a")  # done while pruned: pruned() still says "a", not its key
    hooks.poll()
    assert hooks.pruned() == {"a"} and seen == [{"a"}]
    core.apply_order({"batch": 0}, [])
    hooks.poll()
    assert seen == [{"a"}, set()]
    assert key_a not in hooks._names  # gone with the pruned set it was in
