"""The laxflow general plugin, found and run by vLLM's own plugin loader."""

import subprocess
import sys


def test_vllm_plugin_loader_registers_the_connector():
    code = (
        "import vllm.plugins as p\n"
        "from vllm.plugins import load_plugins_by_group\n"
        "found = load_plugins_by_group('vllm.general_plugins')\n"
        "assert 'laxflow' in found, found\n"
        "p.load_general_plugins()\n"
        "from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory\n"
        "cls = KVConnectorFactory.get_connector_class_by_name('LaxflowConnector')\n"
        "import laxflow.integrations.vllm.plugin as lp\n"
        "print(cls.__module__, lp.SETTINGS.hooks)\n"
        "lp.register()  # a second load in one process is harmless\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.split()[-2:] == ["laxflow.integrations.vllm.connector", "off"]


def test_bad_setting_is_one_line(monkeypatch):
    import pytest

    from laxflow.integrations.vllm.settings import load_settings

    with pytest.raises(ValueError, match="LAXFLOW_VLLM_BATCH_OPTIONS: not JSON"):
        load_settings({"LAXFLOW_VLLM_BATCH_OPTIONS": "{oops"})
    with pytest.raises(ValueError, match="profile '/nonexistent.json' is not a file"):
        load_settings({"LAXFLOW_VLLM_PROFILE": "/nonexistent.json"})
