"""laxflow's settings inside vLLM, and per-request SLOs from ``sampling_params.extra_args``.

:func:`load_settings` is the only reader of ``LAXFLOW_VLLM_*`` variables; the
scheduler classes call it once in their constructor (engine-core process),
the connector once per role, the plugin once per process. :func:`request_slo`
is called by the scheduler on its own thread for every request it sees.
"""

from __future__ import annotations

import json
import logging
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

log = logging.getLogger("laxflow.vllm")

# Latency model used when no profile is given: a few ms per step plus a cost per
# new token and per context token. Placeholders of the right shape, NOT measured:
# give --profile (LAXFLOW_VLLM_PROFILE) a JSON profile of your model on your GPU.
DEFAULT_STEP_S = 0.005
DEFAULT_TOKEN_S = 50e-6
DEFAULT_CONTEXT_S = 2e-6


@dataclass(frozen=True)
class VllmSettings:
    """Validated once. ``hooks``: "auto" (use the node daemon when its socket exists), "off", or an address."""

    hooks: str = "auto"
    profile: Path | None = None
    step_s: float = DEFAULT_STEP_S
    token_s: float = DEFAULT_TOKEN_S
    context_s: float = DEFAULT_CONTEXT_S
    batch_options: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("step_s", "token_s", "context_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"laxflow vllm settings: {name} must be a finite number >= 0, got {value!r}")
        if self.profile is not None and not self.profile.is_file():
            raise ValueError(f"laxflow vllm settings: profile {str(self.profile)!r} is not a file")

    def prefill_samples(self) -> list[tuple[float, float]]:
        """(tokens, seconds) for FlowPrefill's TTFT predictor: the profile's, else the default model's."""
        data = self._profile()
        if data is not None and "prefill" in data:
            return [(float(n), float(s)) for n, s in data["prefill"]]
        return [(float(n), self.step_s + self.token_s * n + self.context_s * n * n / 2) for n in
                (1, 64, 256, 1024, 2048, 4096, 8192)]

    def batch_samples(self):
        """``BatchSample``s for FairBatching/SlideBatching: the profile's, else the default model's."""
        from laxflow.integrations.prefill.iteration import BatchSample

        data = self._profile()
        if data is not None and "batches" in data:
            return [BatchSample(tuple((int(n), int(c), bool(p)) for n, c, p in b["entries"]), float(b["seconds"]))
                    for b in data["batches"]]
        out = []
        for new, ctx, pre, k in ((1, 512, False, 8), (1, 2048, False, 32), (256, 0, True, 1), (1024, 0, True, 1),
                                 (512, 1024, True, 2), (2048, 0, True, 1), (1, 64, False, 1), (4096, 0, True, 1)):
            entries = tuple((new, ctx, pre) for _ in range(k))
            seconds = self.step_s + sum(self.token_s * n + self.context_s * c for n, c, _ in entries)
            out.append(BatchSample(entries, seconds))
        return out

    def _profile(self) -> dict | None:
        if self.profile is None:
            return None
        try:
            data = json.loads(self.profile.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(f"laxflow vllm settings: profile {str(self.profile)!r}: {exc}") from None
        if not isinstance(data, dict):
            raise ValueError(f"laxflow vllm settings: profile {str(self.profile)!r}: expected a JSON object")
        return data


def load_settings(env: Mapping[str, str] | None = None) -> VllmSettings:
    """Settings from ``LAXFLOW_VLLM_HOOKS``, ``LAXFLOW_VLLM_PROFILE``, ``LAXFLOW_VLLM_BATCH_OPTIONS`` (JSON)."""
    env = os.environ if env is None else env
    profile = env.get("LAXFLOW_VLLM_PROFILE") or None
    options_text = env.get("LAXFLOW_VLLM_BATCH_OPTIONS") or "{}"
    try:
        options = json.loads(options_text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"LAXFLOW_VLLM_BATCH_OPTIONS: not JSON ({exc})") from None
    if not isinstance(options, dict):
        raise ValueError("LAXFLOW_VLLM_BATCH_OPTIONS: expected a JSON object of batch-scheduler options")
    return VllmSettings(hooks=env.get("LAXFLOW_VLLM_HOOKS") or "auto",
                        profile=Path(profile) if profile else None, batch_options=options)


@dataclass(frozen=True)
class RequestSlo:
    """What laxflow reads of one vLLM request; SLOs in seconds, None when not given."""

    ttft_s: float | None = None
    tpot_s: float | None = None
    priority: int = 0  # vLLM's convention: lower value is served first
    error: str | None = None  # the one line naming a bad value (the value is then ignored)

    @property
    def given(self) -> bool:
        return self.ttft_s is not None or self.tpot_s is not None or self.priority != 0


def request_slo(extra_args: Mapping[str, Any] | None) -> RequestSlo:
    """``ttft_slo_ms``, ``tpot_slo_ms``, ``priority`` from ``sampling_params.extra_args`` (``vllm_xargs``)."""
    if not extra_args:
        return RequestSlo()
    values: dict[str, Any] = {}
    for key, name in (("ttft_slo_ms", "ttft_s"), ("tpot_slo_ms", "tpot_s")):
        raw = extra_args.get(key)
        if raw is None:
            continue
        try:
            ms = float(raw)
        except (TypeError, ValueError):
            return RequestSlo(error=f"extra_args {key}: expected milliseconds > 0, got {raw!r}")
        if not (math.isfinite(ms) and ms > 0):
            return RequestSlo(error=f"extra_args {key}: expected milliseconds > 0, got {raw!r}")
        values[name] = ms / 1000.0
    raw = extra_args.get("priority", 0)
    if isinstance(raw, bool) or not isinstance(raw, (int, str)) or not str(raw).lstrip("-").isdigit():
        return RequestSlo(error=f"extra_args priority: expected an integer, got {raw!r}")
    return RequestSlo(priority=int(raw), **values)
