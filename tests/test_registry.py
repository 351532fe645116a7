"""The one name -> class registry (``laxflow.registry``) and every family that uses it."""

from __future__ import annotations

import pytest

from laxflow.integrations.pools import registry as pools
from laxflow.integrations.prefill import registry as prefill
from laxflow.integrations.routing import registry as routing
from laxflow.policy import registry as policies
from laxflow.registry import Registry


class Base:
    pass


class Impl(Base):
    pass


class Other:
    pass


HERE = __name__


def make() -> Registry[Base]:
    return Registry("widget", Base, {"impl": f"{HERE}:Impl", "broken": f"{HERE}:Missing", "alien": f"{HERE}:Other"})


def test_builtins_are_imported_on_first_use_and_kept():
    reg = make()
    assert reg.names() == ["alien", "broken", "impl"]
    assert "impl" not in reg._loaded
    assert reg.get("impl") is Impl
    assert reg._loaded["impl"] is Impl


def test_module_class_is_accepted_but_not_registered():
    reg = make()
    assert reg.get(f"{HERE}:Impl") is Impl
    assert reg.names() == ["alien", "broken", "impl"]


def test_every_class_must_subclass_the_base():
    reg = make()
    with pytest.raises(ValueError, match=rf"^widget 'alien' is not a {HERE}\.Base subclass$"):
        reg.get("alien")
    with pytest.raises(ValueError, match=rf"^widget '{HERE}:Other' is not a .*Base subclass$"):
        reg.get(f"{HERE}:Other")
    with pytest.raises(ValueError, match=r"^widget 'other' is not a .*Base subclass$"):
        reg.register("other", Other)
    assert "other" not in reg.names()


def test_errors_name_the_thing_and_the_choices():
    reg = make()
    with pytest.raises(ValueError, match=r"^unknown widget 'nope' \(expected one of alien, broken, impl or module:Class\)$"):
        reg.get("nope")
    with pytest.raises(ValueError, match=rf"^widget '{HERE}:Missing' cannot be loaded: .*Missing"):
        reg.get(f"{HERE}:Missing")
    with pytest.raises(ValueError, match=r"^widget 'broken' cannot be loaded"):
        reg.get("broken")
    with pytest.raises(ValueError, match=r"^widget 'no_such_module_xyz:A' cannot be loaded: No module named"):
        reg.get("no_such_module_xyz:A")
    for bad in (":Impl", f"{HERE}:"):
        with pytest.raises(ValueError, match="expected a registered name or module:Class"):
            reg.get(bad)


def test_names_are_unique():
    reg = make()
    reg.register("lazy", f"{HERE}:Impl")
    reg.register("eager", Impl)
    assert reg.get("lazy") is Impl and reg.get("eager") is Impl
    for name in ("impl", "lazy", "eager"):
        with pytest.raises(ValueError, match=f"^widget '{name}' is already registered$"):
            reg.register(name, Impl)


def test_base_name_spells_the_base_in_errors():
    reg = Registry("widget", Base, {"alien": f"{HERE}:Other"}, base_name="laxflow.Base")
    with pytest.raises(ValueError, match=r"^widget 'alien' is not a laxflow\.Base subclass$"):
        reg.get("alien")


def test_the_module_imports_nothing_of_laxflow():
    """policy/ (the lowest layer) uses it, so it must not import a higher one."""
    import laxflow.registry as mod

    source = open(mod.__file__).read()
    assert "from laxflow" not in source and "import laxflow" not in source


# Every family: (class lookup, kind, a built-in name, a class of another family).
FAMILIES = [
    (policies.policy_class, "policy", "fs", "laxflow.integrations.routing.pab:PabRouter"),
    (prefill.prefill_scheduler_class, "prefill scheduler", "fcfs", "laxflow.policy.sjf:ShortestJobFirst"),
    (prefill.batch_scheduler_class, "batch scheduler", "sarathi", "laxflow.integrations.prefill.fcfs:Fcfs"),
    (routing.router_class, "router", "pab", "laxflow.integrations.pools.arrow:Arrow"),
    (pools.pool_manager_class, "pool manager", "arrow", "laxflow.integrations.prefill.sarathi:Sarathi"),
]


@pytest.mark.parametrize("lookup, kind, builtin, alien", FAMILIES)
def test_every_family_checks_its_base_and_takes_module_class(lookup, kind, builtin, alien):
    cls = lookup(builtin)
    assert lookup(f"{cls.__module__}:{cls.__name__}") is cls
    with pytest.raises(ValueError, match=f"^{kind} '{alien}' is not a .* subclass$"):
        lookup(alien)
    with pytest.raises(ValueError, match=f"^unknown {kind} 'nope' \\(expected one of .*{builtin}.* or module:Class\\)$"):
        lookup("nope")


def test_flow_policy_errors_keep_their_wording():
    with pytest.raises(ValueError, match=r"^policy 'laxflow.integrations.routing.pab:PabRouter' is not a "
                                         r"laxflow\.policy\.FlowPolicy subclass$"):
        policies.policy_class("laxflow.integrations.routing.pab:PabRouter")


