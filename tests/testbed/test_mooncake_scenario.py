"""``testbed run --transport mooncake``: stages 1 and 3 as real Mooncake transfers, end to end.

Root only (namespaces, qdiscs); skips with the reason otherwise, and when
the Mooncake wheel is missing. Short and bounded (3 requests, modes off and
on), a unique fabric name, torn down (checked). Asserts behaviour, never
timing: every byte read and written verified, "off" one class on the wire,
"on" the permits' classes on the wire, reads carried by the permit's
segment class.
"""

from __future__ import annotations

import importlib.util
import json
import os

import pytest
from typer.testing import CliRunner

from laxflow.cli import app
from laxflow.errors import UserError
from laxflow.testbed.fabric import existing_namespaces
from laxflow.testbed.scenario import ScenarioConfig

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="testbed needs root (network namespaces and qdiscs)")
mooncake = pytest.mark.skipif(importlib.util.find_spec("mooncake") is None,
                              reason="mooncake-transfer-engine-non-cuda not installed (extra 'mooncake')")


@root_only
@mooncake
def test_mooncake_transport_end_to_end() -> None:
    name = f"m{os.getpid() % 100000}t"
    requests, warmup, layers = 3, 1, 4
    result = CliRunner().invoke(app, ["testbed", "run", "--scenario", "contention", "--name", name,
                                      "--transport", "mooncake", "--modes", "off,on", "--requests", str(requests),
                                      "--warmup", str(warmup), "--layers", str(layers), "--json"])
    try:
        assert result.exit_code == 0, result.output
        out = json.loads(result.output)
        per_mode = 2 * (requests + warmup) * layers  # ranks x requests x layers
        for mode in ("off", "on"):
            r = out[mode]
            assert r["transport"] == "mooncake"
            # every read's bytes equal the KV store's, every write's bytes are in its decode slot
            assert r["bytes_verified"] == {"reads": per_mode, "reads_bad": 0, "writes": per_mode,
                                           "writes_bad": 0}, r["bytes_verified"]
            assert r["cct_mean"] > 0 and r["ttft_mean"] > 0
        assert set(out["off"]["dscp_seen"]) <= {"0"}, out["off"]["dscp_seen"]  # off: one class on the wire
        used = out["on"]["permit_dscp_prefill"]  # "s<stage>:<dscp>" -> transfers
        stages = {k.split(":")[0] for k in used}
        assert {"s1", "s3"} <= stages, used  # Mooncake's reads and writes ran under daemon permits
        # a transfer may fail open on a loaded machine (stale heartbeat): most, not all, carry a permit
        assert sum(v for k, v in used.items() if k[:2] in ("s1", "s3")) >= per_mode, used
        seen = {int(k): v for k, v in out["dscp_seen"].items() if v > 0}
        # every class a permit gave is on the switch's egress ports (reads: the target segment's class)
        assert {int(k.split(":")[1]) for k in used} <= set(seen), (used, out["dscp_seen"])
        # nothing of the job is left in DSCP 0 but connection set-up (handshakes, first contacts)
        assert seen.get(0, 0) <= 0.02 * sum(seen.values()), out["dscp_seen"]
    finally:
        CliRunner().invoke(app, ["testbed", "down", "--name", name])
    assert not any(ns.startswith(f"{name}-") for ns in existing_namespaces())


def test_bad_transport_is_one_clear_error() -> None:
    with pytest.raises(UserError, match="transport must be tcp or mooncake"):
        ScenarioConfig(transport="rdma")
