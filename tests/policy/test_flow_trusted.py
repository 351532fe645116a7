"""Flow.trusted builds the very flow the checked constructor builds, field by field."""

from __future__ import annotations

from dataclasses import fields

import numpy as np
import pytest

from laxflow.policy.flow import Flow, Stage


def _frozen(values, dtype) -> np.ndarray:
    out = np.array(values, dtype=dtype)
    out.flags.writeable = False
    return out


LINKS = _frozen([4, 1, 7], np.int64)
WEIGHTS = _frozen([1.0, 0.5, 2.0], np.float64)


def _same(a: Flow, b: Flow) -> None:
    for f in fields(Flow):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, np.ndarray):
            assert isinstance(y, np.ndarray) and x.dtype == y.dtype and np.array_equal(x, y), f.name
        else:
            assert type(x) is type(y) and x == y, f.name
    assert vars(a).keys() == vars(b).keys()  # nothing extra, nothing missing


@pytest.mark.parametrize(
    "kw",
    [
        {},  # every default: request from the id, batch from the request
        {"request": "r7"},  # batch from the request
        {"batch": "b2"},  # request from the id, batch given
        {
            "arrival": 0.25, "stage": Stage.COLLECTIVE, "request": "r1", "batch": "b1", "deadline": 3.5,
            "downstream": 0.125, "layer": 5, "current_layer": 4, "compute_done": True,
        },
        {"stage": Stage.REUSE, "deadline": None, "layer": 0, "current_layer": 0},
    ],
)
def test_trusted_equals_the_constructor_in_every_field(kw):
    checked = Flow(id="f", size=12.5, links=LINKS, weights=WEIGHTS, **kw)
    fast = Flow.trusted("f", 12.5, LINKS, WEIGHTS, **kw)
    _same(checked, fast)


def test_trusted_keeps_the_arrays_themselves():
    # The engine caches a frozen transfer shape's merged usage by the arrays' ids.
    fast = Flow.trusted("f", 1.0, LINKS, WEIGHTS)
    checked = Flow(id="f", size=1.0, links=LINKS, weights=WEIGHTS)
    assert fast.links is LINKS and fast.weights is WEIGHTS
    assert checked.links is LINKS and checked.weights is WEIGHTS


def test_trusted_flows_do_not_share_their_state_dict():
    a, b = Flow.trusted("a", 1.0, LINKS, WEIGHTS), Flow.trusted("b", 1.0, LINKS, WEIGHTS)
    a.state["x"] = 1
    assert b.state == {}
