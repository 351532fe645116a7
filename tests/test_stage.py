"""The one stage table: LXF_STAGE_* of native/laxflow_shm.h, read through laxflow._stage_codes."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from laxflow.policy import flow
from laxflow.stage import STAGE_CODES, STAGE_NONE, STAGE_OF_CODE, Stage
from laxflow.protocol import hooks, shm

ROOT = Path(__file__).resolve().parents[1]
HEADER = ROOT / "native" / "laxflow_shm.h"


def header_defines() -> dict[str, int]:
    return {name: int(value) for name, value in
            re.findall(r"^#define LXF_STAGE_([A-Z0-9_]+) (\d+)", HEADER.read_text(), re.MULTILINE)}


def test_the_compiled_codes_are_the_headers():
    # Fails when laxflow._stage_codes is older than the header: rebuild it.
    defines = header_defines()
    assert defines == {"NONE": STAGE_NONE, **{s.name: code for s, code in STAGE_CODES.items()}}
    assert {s.value for s in Stage} == {name.lower() for name in defines} - {"none"}


def test_every_user_takes_the_one_table():
    assert flow.Stage is Stage and flow.STAGE_CODES is STAGE_CODES and flow.STAGE_OF_CODE is STAGE_OF_CODE
    assert {s.name: int(s) for s in shm.Stage} == {"NONE": STAGE_NONE, **{s.name: c for s, c in STAGE_CODES.items()}}
    assert hooks.STAGES == tuple(s.value for s in Stage)
    for stage, code in STAGE_CODES.items():
        assert stage.code == code and STAGE_OF_CODE[code] is stage and Stage.parse(stage.value) is stage


def test_an_unknown_stage_is_named_with_the_choices():
    with pytest.raises(ValueError, match=r"unknown stage 'decode' \(expected one of reuse, collective, p2d\)"):
        Stage.parse("decode")
    with pytest.raises(ValueError, match=r"stage 'decode' \(expected one of reuse, collective, p2d\)"):
        hooks.Submit(1, "r", "decode", 0, 1.0, "", 0.0).validate()


def test_the_builder_reads_the_names_from_the_header_and_refuses_a_header_without_them():
    spec = importlib.util.spec_from_file_location("stage_build", ROOT / "src" / "laxflow" / "stage_build.py")
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    assert build.stage_names(HEADER.read_text()) == [f"LXF_STAGE_{name}" for name in header_defines()]
    with pytest.raises(ValueError, match=r"laxflow_shm.h: expected '#define LXF_STAGE_<NAME> <code>' lines"):
        build.stage_names("#define LXF_EV_SUBMIT 1\n")
