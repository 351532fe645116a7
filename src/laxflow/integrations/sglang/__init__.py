"""laxflow inside SGLang (extra ``sglang``): a schedule policy and a gated Mooncake KV backend.

Both arrive through SGLang's general-plugin entry point (``sglang.srt.plugins``:
``laxflow``, :mod:`.plugin`), which SGLang loads in its scheduler process
before the engine starts; nothing is patched unless ``LAXFLOW_SGLANG_*``
asks for it (:mod:`.settings`):

* ``LAXFLOW_SGLANG_POLICY=flowprefill``: SGLang's ``SchedulePolicy`` becomes
  :class:`.policy.LaxflowSchedulePolicy` (FlowPrefill's S-EDF order,
  SLO-aware admission, pruned requests deferred); ``--schedule-policy``
  still orders what laxflow knows nothing about.
* ``LAXFLOW_SGLANG_TRANSFER=mooncake``: with
  ``--disaggregation-transfer-backend mooncake``, SGLang's
  ``MooncakeKVManager`` becomes :class:`.mooncake.LaxflowMooncakeKVManager`,
  whose KV writes go through ``laxflow.adapters.mooncake`` (one message per
  request and layer, deadline from the request's SLO).

Nothing here is imported by laxflow itself; SGLang imports these modules.
"""
