"""SGLang for these tests: the folder ``make sglang`` fills, put on sys.path here only.

SGLang 0.5.23 and the packages its scheduler, schedule policy and Mooncake
backend import live in ``<venv>/sglang-0.5.23`` (the Makefile's
``SGLANG_SITE``), away from vLLM's tests. On CPU torch, torchvision's CUDA
extension cannot load and torchvision's import then fails registering fake
kernels for ``torchvision::nms`` / ``qnms``; their schemas (no kernels) are
declared here first so SGLang's modules import. Nothing here calls them.
"""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[2] / "adapters"))  # segment_daemon

from sglang_harness import SITE, declare_torchvision_ops  # noqa: E402

if SITE.is_dir() and str(SITE) not in sys.path:
    sys.path.append(str(SITE))
declare_torchvision_ops()


@pytest.fixture(autouse=True)
def _sglang_env(monkeypatch):
    """laxflow's hooks off unless a test injects some; Mooncake over TCP; HF offline."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("LAXFLOW_SGLANG_HOOKS", "off")
    for name in ("LAXFLOW_SGLANG_POLICY", "LAXFLOW_SGLANG_TRANSFER", "LAXFLOW_SGLANG_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MC_FORCE_TCP", "1")
    monkeypatch.setenv("MOONCAKE_PROTOCOL", "tcp")
    if "laxflow.integrations.sglang.requests" in sys.modules:
        sys.modules["laxflow.integrations.sglang.requests"].TABLE.clear()  # rids repeat across tests
