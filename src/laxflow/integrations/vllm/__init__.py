"""laxflow inside vLLM (extra ``vllm``): scheduler classes, a KV connector wrapper, a general plugin.

* ``--scheduler-cls laxflow.integrations.vllm.scheduler.FlowPrefillScheduler``
  (or ``FairBatchingScheduler`` / ``SlideBatchingScheduler``): subclasses of
  vLLM's v1 ``Scheduler`` that order and size what each ``schedule()`` admits.
* ``kv_connector: LaxflowConnector`` with ``kv_connector_module_path:
  laxflow.integrations.vllm.connector``: wraps Mooncake/NIXL/any v1 connector.
* ``kv_connector: LaxflowNixlConnector`` with ``kv_connector_module_path:
  laxflow.integrations.vllm.nixl``: NixlConnector wrapped, its NIXL agent gated
  (:mod:`laxflow.adapters.nixl`), since the shim cannot see NIXL's traffic.
* the ``vllm.general_plugins`` entry point ``laxflow`` (:mod:`.plugin`).

Nothing here is imported by laxflow itself; vLLM imports these modules.
"""
