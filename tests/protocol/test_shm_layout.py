"""C and cffi agree on the layout: both read native/laxflow_shm.h."""

from __future__ import annotations

import os
import stat
import subprocess

import pytest
from shmtest import NATIVE, gcc, unique_name

from laxflow.protocol import shm_build
from laxflow.protocol._shm import ffi, lib
from laxflow.protocol.shm import EVENT_DTYPE, Segment, SegmentError


def struct_fields(ctype: str) -> list[str]:
    """Every (nested) field path of a struct, as C's offsetof accepts it."""
    paths = []
    for name, field in ffi.typeof(ctype).fields:
        paths.append(name)
        if field.type.kind == "struct":
            paths += [f"{name}.{sub}" for sub in struct_fields(field.type.cname)]
    return paths


STRUCTS = [
    "struct lxf_header", "struct lxf_counters", "struct lxf_event", "struct lxf_event_slot",
    "struct lxf_event_ring", "struct lxf_command", "struct lxf_cmd_slot", "struct lxf_cmd_ring",
    "struct lxf_proc", "struct lxf_permit", "struct lxf_permit_view", "struct lxf_tag_value",
    "struct lxf_flow_tag", "struct lxf_segment",
]
CONSTANTS = [n for n in dir(lib) if n.startswith("LXF_")]


def test_sizes_offsets_and_constants_match_c(tmp_path):
    lines = ['#include <stdio.h>', '#include <stddef.h>', '#include "laxflow_shm.h"', "int main(void) {"]
    expected = []
    for s in STRUCTS:
        lines.append(f'printf("sizeof {s} %zu\\n", sizeof({s}));')
        expected.append(f"sizeof {s} {ffi.sizeof(s)}")
        for f in struct_fields(s):
            lines.append(f'printf("offsetof {s} {f} %zu\\n", offsetof({s}, {f}));')
            expected.append(f"offsetof {s} {f} {ffi.offsetof(s, *f.split('.'))}")
    for c in CONSTANTS:
        lines.append(f'printf("{c} %llu\\n", (unsigned long long)({c}));')
        expected.append(f"{c} {getattr(lib, c) % 2**64}")
    lines.append("return 0; }")
    src = tmp_path / "layout.c"
    src.write_text("\n".join(lines))
    exe = gcc(tmp_path / "layout", f"-I{NATIVE}", str(src))
    got = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.splitlines()
    assert got == expected
    assert len(CONSTANTS) > 30


def test_cdef_is_the_header_section():
    header = (NATIVE / "laxflow_shm.h").read_text()
    cdef = shm_build.extract_cdef(header)
    assert "struct lxf_segment {" in cdef and "#include" not in cdef
    with pytest.raises(ValueError, match="markers"):
        shm_build.extract_cdef("struct x { int a; };")


def test_cache_line_layout():
    assert ffi.sizeof("struct lxf_event") == 56 and ffi.sizeof("struct lxf_event_slot") == 64
    for field in ("head", "tail", "slots"):
        assert ffi.offsetof("struct lxf_event_ring", field) % 64 == 0
    for field in ("counters", "events", "procs", "permits", "tags"):
        assert ffi.offsetof("struct lxf_segment", field) % 64 == 0
    assert EVENT_DTYPE.itemsize == ffi.sizeof("struct lxf_event")


def test_segment_mode_header_and_attach_errors(segment):
    mode = os.stat(f"/dev/shm{segment.name}").st_mode
    assert stat.S_IMODE(mode) == 0o600
    assert segment.raw.header.magic == lib.LXF_SHM_MAGIC and segment.version == lib.LXF_SHM_VERSION
    assert segment.live()
    with pytest.raises(SegmentError, match="cannot create"):
        Segment.create(segment.name)
    segment.raw.header.version = lib.LXF_SHM_VERSION + 1
    with pytest.raises(SegmentError, match="layout version"):
        Segment.attach(segment.name)
    segment.raw.header.version = lib.LXF_SHM_VERSION
    segment.raw.header.magic = 0
    with pytest.raises(SegmentError, match="bad magic"):
        Segment.attach(segment.name)
    with pytest.raises(SegmentError, match="no such segment"):
        Segment.attach(unique_name())


def test_heartbeat_staleness(segment):
    segment.stale_ns = 50_000_000
    segment.heartbeat()
    now = lib.lxf_now_ns()
    assert lib.lxf_segment_live(segment.raw, now, 0)
    assert not lib.lxf_segment_live(segment.raw, now + 60_000_000, 0)
    segment.stale_ns = 0  # falls back to the caller's default
    assert lib.lxf_segment_live(segment.raw, now + 60_000_000, 100_000_000)
    segment.raw.header.heartbeat_ns = 0
    assert not segment.live()
    assert lib.LXF_DEFAULT_STALE_NS == 100_000_000  # the default: 100 ms
