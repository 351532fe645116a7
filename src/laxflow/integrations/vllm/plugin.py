"""laxflow's vLLM general plugin (entry point ``vllm.general_plugins: laxflow``).

vLLM calls :func:`register` in every process it starts (API server, engine
core, workers) from ``vllm.plugins.load_general_plugins``, possibly more
than once per process. It registers ``LaxflowConnector`` with vLLM's
``KVConnectorFactory`` (so ``"kv_connector": "LaxflowConnector"`` works
without ``kv_connector_module_path``) and validates laxflow's settings once,
so a bad ``LAXFLOW_VLLM_*`` value stops start-up with one line naming it.
"""

from __future__ import annotations

import logging

log = logging.getLogger("laxflow.vllm")

CONNECTOR_NAME = "LaxflowConnector"
SETTINGS = None  # the settings this process loaded (read by tests and by `laxflow` diagnostics)


def register() -> None:
    global SETTINGS
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

    from laxflow.integrations.vllm.settings import load_settings

    SETTINGS = load_settings()  # ValueError with one line naming the bad variable
    if CONNECTOR_NAME not in KVConnectorFactory._registry:  # vLLM refuses a second registration
        KVConnectorFactory.register_connector(CONNECTOR_NAME, "laxflow.integrations.vllm.connector",
                                              "LaxflowConnector")
    log.info("laxflow plugin: %s registered; hooks=%s", CONNECTOR_NAME, SETTINGS.hooks)
