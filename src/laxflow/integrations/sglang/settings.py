"""laxflow's settings inside SGLang, and per-request SLOs from ``sampling_params.custom_params``.

:func:`load_settings` is the only reader of ``LAXFLOW_SGLANG_*`` (and of
Mooncake's ``MOONCAKE_PROTOCOL`` / ``MC_FORCE_TCP``, to know the wrapped
engine's transport); the plugin calls it once per SGLang process, the policy
and the KV manager once each when SGLang builds them. :func:`request_slo`
runs on the scheduler's thread for every request laxflow sees.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from laxflow.integrations.vllm.settings import RequestSlo, VllmSettings
from laxflow.integrations.vllm.settings import request_slo as _request_slo

POLICIES = ("off", "flowprefill")
TRANSFERS = ("off", "mooncake")


@dataclass(frozen=True)
class SglangSettings:
    """Validated once. ``hooks``: "auto" (the node daemon when its socket exists), "off", or an address."""

    policy: str = "off"
    transfer: str = "off"
    hooks: str = "auto"
    profile: Path | None = None
    protocol: str = "rdma"  # the transport of SGLang's shared Mooncake engine

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"LAXFLOW_SGLANG_POLICY: expected one of {', '.join(POLICIES)}, got {self.policy!r}")
        if self.transfer not in TRANSFERS:
            raise ValueError(f"LAXFLOW_SGLANG_TRANSFER: expected one of {', '.join(TRANSFERS)}, got {self.transfer!r}")
        if self.profile is not None and not self.profile.is_file():
            raise ValueError(f"LAXFLOW_SGLANG_PROFILE: {str(self.profile)!r} is not a file")

    @property
    def enabled(self) -> bool:
        return self.policy != "off" or self.transfer != "off"

    def prefill_samples(self) -> list[tuple[float, float]]:
        """(tokens, seconds) for FlowPrefill's TTFT predictor: the profile's (vLLM's format), else the placeholder model."""
        return VllmSettings(profile=self.profile).prefill_samples()


def load_settings(env: Mapping[str, str] | None = None) -> SglangSettings:
    """From ``LAXFLOW_SGLANG_POLICY``, ``_TRANSFER``, ``_HOOKS``, ``_PROFILE``; ValueError names a bad one."""
    env = os.environ if env is None else env
    profile = env.get("LAXFLOW_SGLANG_PROFILE") or None
    protocol = "tcp" if env.get("MC_FORCE_TCP") == "1" else (env.get("MOONCAKE_PROTOCOL") or "rdma").lower()
    return SglangSettings(policy=(env.get("LAXFLOW_SGLANG_POLICY") or "off").lower(),
                          transfer=(env.get("LAXFLOW_SGLANG_TRANSFER") or "off").lower(),
                          hooks=env.get("LAXFLOW_SGLANG_HOOKS") or "auto",
                          profile=Path(profile) if profile else None, protocol=protocol)


def request_slo(custom_params: Mapping[str, Any] | None) -> RequestSlo:
    """``ttft_slo_ms``, ``tpot_slo_ms``, ``priority`` (lower first) from SGLang's ``custom_params``.

    The same keys and rules as the vLLM integration's ``extra_args``; a bad
    value is ignored and named in ``error``.
    """
    slo = _request_slo(custom_params if isinstance(custom_params, Mapping) else None)
    if slo.error:
        return RequestSlo(error=slo.error.replace("extra_args", "custom_params", 1))
    return slo
