import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(autouse=True)
def _vllm_env(tmp_path, monkeypatch):
    """vLLM offline, its cache in this test's temp folder, laxflow's hooks off unless a test injects some."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "vllm-cache"))
    monkeypatch.setenv("LAXFLOW_VLLM_HOOKS", "off")
    monkeypatch.delenv("LAXFLOW_VLLM_PROFILE", raising=False)
    monkeypatch.delenv("LAXFLOW_VLLM_BATCH_OPTIONS", raising=False)
