"""LaxflowNixlConnector around vLLM's real NixlConnector (nixl_connector_check.py, in its own process)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from laxflow.hooks.api import request_key

pytest.importorskip("nixl._api", reason="nixl not installed (make nixl)")

HERE = Path(__file__).resolve().parent


def test_decode_side_reads_are_gated_as_their_requests_p2d_messages(tmp_path):
    env = {**os.environ, "UCX_TLS": "tcp", "UCX_NET_DEVICES": "lo", "UCX_MODULES": "^ib*"}  # see test_nixl.py
    run = subprocess.run([sys.executable, str(HERE / "nixl_connector_check.py"), str(tmp_path)], env=env,
                         capture_output=True, text=True, timeout=240)
    lines = [ln for ln in run.stdout.splitlines() if ln.startswith("RESULT ")]
    assert run.returncode == 0 and lines, run.stdout[-3000:] + run.stderr[-3000:]
    out = json.loads(lines[-1][len("RESULT "):])
    assert out["scheduler"] == ["LaxflowNixlConnector", "NixlPullConnector"]  # NixlConnector by default
    # the scheduler side's metadata: laxflow's around NIXL's, the remote request known
    assert out["meta"] == ["LaxflowConnectorMetadata", "NixlConnectorMetadata", ["r1"], "prefill-r1"]
    # the worker side: vLLM's own worker calls laxflow's agent, which wraps NIXL's
    assert out["worker"] == ["LaxflowNixlConnector", "NixlPullConnector", True, "nixl_agent"]
    assert out["state"] == "DONE" and out["bytes_match"]
    # vLLM's notification named the request: one stage-3 message of r1, its bytes counted
    assert out["submits"] == [{"request_id": request_key("r1"), "stage": 3, "layer": 0, "bytes": 1 << 20}]
    assert out["notifs"] == ["prefill-r1:1"]
    assert out["records"] == [["READ", True, 1, 36]]
    assert out["gate_closed"]  # shutdown() closed the gate


def test_inner_connector_defaults_to_nixl_and_stays_overridable():
    from vllm.config import KVTransferConfig

    from laxflow.integrations.vllm.nixl import LaxflowNixlConnector, with_default_inner

    class Cfg:  # what with_default_inner reads of a VllmConfig
        def __init__(self, extra):
            self.kv_transfer_config = KVTransferConfig(kv_connector="LaxflowNixlConnector", kv_role="kv_consumer",
                                                       kv_connector_extra_config=extra)

    plain = with_default_inner(Cfg({"backends": ["UCX"]}))
    assert plain.kv_transfer_config.kv_connector_extra_config == {"backends": ["UCX"], "laxflow_inner": "NixlConnector"}
    named = Cfg({"laxflow_inner": "NixlPushConnector"})
    assert with_default_inner(named) is named
    assert LaxflowNixlConnector._inner_class(plain).__name__ == "NixlPullConnector"
    assert LaxflowNixlConnector._inner_class(named).__name__ == "NixlPushConnector"
    assert LaxflowNixlConnector.requires_piecewise_for_cudagraph({}) is False
