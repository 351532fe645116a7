"""The three stages of traffic in one prefill (MFS §3) and their codes.

The codes are laxflow's one stage encoding: the policies' arrays, the
shared memory between shim and daemon (``lxf_event.stage``,
``lxf_tag_value.stage``) and the native cores all use them. They are
written once, as ``LXF_STAGE_*`` in ``native/laxflow_shm.h``, and read here
from that header through the cffi module ``laxflow._stage_codes``
(built by ``stage_build.py``, as the shared-memory layout is read by
``laxflow.protocol._shm``). ``laxflow.protocol.shm.Stage`` and the hooks'
stage names (``laxflow.protocol.hooks.STAGES``) are made from this table.
It sits below every package (policy, protocol, hooks, the daemon import it)
and imports nothing of laxflow but that module.

A stage is named by its ``LXF_STAGE_<NAME>`` (``Stage.<NAME>``, value the
lower-case name); ``LXF_STAGE_NONE`` is the code of a message whose stage no
one told (the shim saw it, no adapter tagged it).
"""

from __future__ import annotations

from enum import Enum

from laxflow._stage_codes import lib as _header


class Stage(str, Enum):
    """The three stages of traffic in one prefill (MFS §3), in order (``STAGE_NAMES``)."""

    REUSE = "reuse"  # stage 1: reusable KV fetched before a layer computes
    COLLECTIVE = "collective"  # stage 2: EP/SP/TP collectives that block compute
    P2D = "p2d"  # stage 3: a layer's KV to the decode unit

    @classmethod
    def parse(cls, value: str) -> "Stage":
        try:
            return cls(value)
        except ValueError:
            choices = ", ".join(s.value for s in cls)
            raise ValueError(f"unknown stage {value!r} (expected one of {choices})") from None

    @property
    def code(self) -> int:
        """The stage's code (``STAGE_CODES``)."""
        return STAGE_CODES[self]


def _header_codes() -> dict[str, int]:
    """``LXF_STAGE_<NAME>`` -> code, as compiled from the header; its names must be Stage's and NONE."""
    codes = {name[len("LXF_STAGE_"):]: int(getattr(_header, name)) for name in dir(_header)
             if name.startswith("LXF_STAGE_")}
    expected = {"NONE", *Stage.__members__}
    if set(codes) != expected or len(set(codes.values())) != len(codes):
        raise ImportError(f"laxflow._stage_codes has LXF_STAGE_* {codes}, expected one distinct code for "
                          f"each of {sorted(expected)}: Stage and native/laxflow_shm.h disagree, or the module is "
                          "older than the header (rebuild it: pip install -e .)")
    return codes


_CODES = _header_codes()
STAGE_NONE: int = _CODES["NONE"]
STAGE_CODES: dict[Stage, int] = {stage: _CODES[stage.name] for stage in Stage}
STAGE_OF_CODE: dict[int, Stage] = {code: stage for stage, code in STAGE_CODES.items()}

STAGE_NAMES: tuple[str, ...] = tuple(s.value for s in Stage)  # ("reuse", "collective", "p2d"): report columns
