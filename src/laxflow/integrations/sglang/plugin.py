"""laxflow's SGLang general plugin (entry point ``sglang.srt.plugins: laxflow``).

SGLang's ``load_plugins()`` calls :func:`register` early in each of its
processes (engine, scheduler, detokenizer), once per process, then applies
the hooks registered here with its ``HookRegistry``. With
``LAXFLOW_SGLANG_POLICY`` and ``LAXFLOW_SGLANG_TRANSFER`` both off (the
default) nothing is registered and SGLang runs as it would without laxflow.
A bad ``LAXFLOW_SGLANG_*`` value stops start-up with one line naming it
(SGLang logs a plugin's exception and goes on, so it is also logged here).
"""

from __future__ import annotations

import logging

log = logging.getLogger("laxflow.sglang")

SETTINGS = None  # the settings this process loaded (read by tests and diagnostics)
REGISTERED: list[str] = []  # the targets this process registered hooks on

SCHEDULE_POLICY = "sglang.srt.managers.schedule_policy.SchedulePolicy"
GET_NEW_BATCH_PREFILL = "sglang.srt.managers.scheduler.Scheduler.get_new_batch_prefill"
PREFILL_RESULTS = (
    "sglang.srt.managers.scheduler_components.batch_result_processor.SchedulerBatchResultProcessor"
    ".process_batch_result_prefill",
    "sglang.srt.disaggregation.prefill.SchedulerDisaggregationPrefillMixin.process_batch_result_disagg_prefill",
)
MOONCAKE_KV_MANAGER = "sglang.srt.disaggregation.mooncake.conn.MooncakeKVManager"


def register() -> None:
    global SETTINGS
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from laxflow.integrations.sglang.settings import load_settings

    try:
        SETTINGS = load_settings()
    except ValueError as exc:
        log.error("laxflow sglang plugin: %s", exc)
        raise
    if not SETTINGS.enabled:
        log.info("laxflow sglang plugin: LAXFLOW_SGLANG_POLICY and LAXFLOW_SGLANG_TRANSFER off; nothing registered")
        return
    from laxflow.integrations.sglang import policy

    targets: list[tuple[str, object, object]] = [(GET_NEW_BATCH_PREFILL, policy.around_get_new_batch_prefill,
                                                  HookType.AROUND)]
    if SETTINGS.policy != "off":
        targets.append((SCHEDULE_POLICY, policy.LaxflowSchedulePolicy, HookType.REPLACE))
        targets += [(t, policy.after_prefill_result, HookType.AFTER) for t in PREFILL_RESULTS]
    if SETTINGS.transfer == "mooncake":
        from laxflow.integrations.sglang.mooncake import LaxflowMooncakeKVManager

        targets.append((MOONCAKE_KV_MANAGER, LaxflowMooncakeKVManager, HookType.REPLACE))
    for target, hook, kind in targets:
        if target not in REGISTERED:
            HookRegistry.register(target, hook, kind)
            REGISTERED.append(target)
    log.info("laxflow sglang plugin: policy=%s transfer=%s hooks=%s", SETTINGS.policy, SETTINGS.transfer,
             SETTINGS.hooks)
