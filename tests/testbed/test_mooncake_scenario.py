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


def test_bad_static_dscp_is_one_clear_error() -> None:
    from laxflow.adapters.mooncake_config import MooncakeAdapterConfig

    with pytest.raises(UserError, match="static_dscp"):
        MooncakeAdapterConfig(static_dscp={1: 64})


@mooncake
def test_read_goes_to_the_segment_of_its_class(tmp_path) -> None:
    """Loopback, no root: two targets serve different bytes, each in its own class (the KV store's
    per-class segments); a read with static class 36 is sent to the 36 segment, and that segment's
    accepted connection, which sends the read's bytes, carries DSCP 36."""
    import ctypes
    import socket

    from laxflow.adapters.gate import GateConfig
    from laxflow.adapters.mooncake import TransferEngine
    from laxflow.adapters.mooncake_config import MooncakeAdapterConfig
    from laxflow.adapters.sockets import tcp_sockets
    from laxflow.testbed.mooncake_traffic import _engine, _listeners_to_class

    size = 1 << 17
    bufs = {d: ctypes.create_string_buffer(bytes([d]) * size, size) for d in (0, 36)}
    targets, ports = {}, {}
    for d, buf in bufs.items():
        eng, listeners = _listeners_to_class(lambda: _engine("127.0.0.1"), d)
        assert eng.register_memory(ctypes.addressof(buf), size) == 0
        targets[d] = (eng, ctypes.addressof(buf))
        ports[d] = {s.local[1] for s in listeners}
    wrapper = TransferEngine(config=MooncakeAdapterConfig(
        gate=GateConfig(shm_name=f"/lxfmcseg-{os.getpid()}"), static_dscp={1: 36}))
    try:
        assert wrapper.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
        dst = ctypes.create_string_buffer(size)
        assert wrapper.register_memory(ctypes.addressof(dst), size) == 0
        names = {d: f"127.0.0.1:{eng.get_rpc_port()}" for d, (eng, _) in targets.items()}
        # both targets' buffers sit at different addresses: read the same offset of the 36 one's
        fut = wrapper.submit("read", names[0], [ctypes.addressof(dst)], [targets[36][1]], [size], request=7,
                             stage=1, segments=names)
        assert fut.result(timeout=30) == 0
        assert dst.raw == bytes([36]) * size
        served = [s for s in tcp_sockets() if s.state == "ESTABLISHED" and s.local[1] in ports[36]]
        assert served, "no connection accepted by the 36 segment"
        for s in served:
            with socket.socket(fileno=os.dup(s.fd)) as k:
                assert k.getsockopt(socket.IPPROTO_IP, socket.IP_TOS) >> 2 == 36
        assert [r.dscp for r in wrapper.records] == [36]
    finally:
        wrapper.close()
