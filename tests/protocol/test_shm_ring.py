"""Rings, permits, tags and commands: C producers, Python consumer, hypothesis."""

from __future__ import annotations

import os
import subprocess
import time
from collections import deque

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from laxflow.protocol._shm import ffi, lib
from laxflow.protocol.shm import CommandKind, EventKind, Gate, Permit, Segment, TagKind, TagValue, proc_start_ticks


def drain_while_producing(seg: Segment, procs: list[subprocess.Popen], expected: int, batch: int) -> np.ndarray:
    chunks, got = [], 0
    deadline = time.monotonic() + 60
    while got < expected and time.monotonic() < deadline:
        ev = seg.drain_events(batch)
        if len(ev):
            chunks.append(ev)
            got += len(ev)
        elif all(p.poll() is not None for p in procs):
            ev = seg.drain_events(batch)
            if not len(ev):
                break
            chunks.append(ev)
            got += len(ev)
    for p in procs:
        assert p.wait(30) == 0, p.stderr.read()
    chunks.append(seg.drain_events())
    return np.concatenate(chunks)


def check_exactly_once_in_order(events: np.ndarray, producers: dict[tuple[int, int], int]) -> None:
    """Each (pid, thread) produced msg_id 1..n: all present once, in order."""
    assert len(events) == sum(producers.values())
    for (pid, thread), n in producers.items():
        mine = events[(events["pid"] == pid) & (events["handle"] == thread)]
        assert np.array_equal(mine["msg_id"], np.arange(1, n + 1)), (pid, thread)
        assert np.array_equal(mine["bytes"], mine["msg_id"] * 64)
    assert set(events["kind"].tolist()) == {EventKind.SUBMIT}


def run_producers(ring_producer, seg: Segment, n_procs: int, n_threads: int, n_events: int, batch: int):
    procs = [
        subprocess.Popen([str(ring_producer), seg.name, str(n_threads), str(n_events)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(n_procs)
    ]
    events = drain_while_producing(seg, procs, n_procs * n_threads * n_events, batch)
    producers = {(p.pid, t): n_events for p in procs for t in range(n_threads)}
    check_exactly_once_in_order(events, producers)  # (refused pushes were retried)


def test_python_drains_c_producers_under_concurrency(ring_producer, segment):
    # 2 processes x 4 threads x 50,000 events: more than the ring holds, so
    # producers wrap around it many times while Python drains.
    run_producers(ring_producer, segment, n_procs=2, n_threads=4, n_events=50_000, batch=4096)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    n_procs=st.integers(1, 3),
    n_threads=st.integers(1, 4),
    n_events=st.integers(1, 30_000),
    batch=st.sampled_from([1, 7, 256, 8192]),
)
def test_no_event_lost_or_duplicated(ring_producer, segment, n_procs, n_threads, n_events, batch):
    if batch == 1:
        n_events = min(n_events, 2000)  # one event per Python call is slow, not different
    run_producers(ring_producer, segment, n_procs, n_threads, n_events, batch)


def test_full_ring_refuses_and_counts(ring_producer, segment):
    n = lib.LXF_EVENT_RING_SLOTS + 1000
    out = subprocess.run([str(ring_producer), segment.name, "1", str(n), "--no-retry"], capture_output=True,
                         text=True, check=True).stdout
    assert out.startswith(f"done pushed={lib.LXF_EVENT_RING_SLOTS} dropped=1000")
    assert segment.counters()["events_dropped"] == 1000
    events = np.concatenate([segment.drain_events() for _ in range(lib.LXF_EVENT_RING_SLOTS // 8192 + 1)])
    assert len(events) == lib.LXF_EVENT_RING_SLOTS
    assert np.array_equal(events["msg_id"], np.arange(1, lib.LXF_EVENT_RING_SLOTS + 1))
    assert segment.push_event(EventKind.LAYER_BOUNDARY, request_id=3, layer=9)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.one_of(st.tuples(st.just("push"), st.integers(0, 2**63)),
                          st.tuples(st.just("drain"), st.integers(1, 50))), max_size=200))
def test_ring_is_a_fifo(segment, ops):
    segment.drain_events()
    model: deque[int] = deque()
    for op, arg in ops:
        if op == "push":
            assert segment.push_event(EventKind.SUBMIT, msg_id=arg, request_id=arg ^ 1)
            model.append(arg)
        else:
            got = segment.drain_events(arg)
            want = [model.popleft() for _ in range(min(arg, len(model)))]
            assert got["msg_id"].tolist() == want
            assert (got["request_id"] == got["msg_id"] ^ 1).all()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(msg_id=st.integers(1, 2**40 - 1), gate=st.sampled_from(list(Gate)), level=st.integers(0, 255),
       dscp=st.integers(0, 63))
def test_permit_round_trip(segment, msg_id, gate, level, dscp):
    segment.set_permit(msg_id, gate, level, dscp)
    assert segment.get_permit(msg_id) == Permit(msg_id, gate, level, dscp)
    # another message in the same slot replaces it; the old one reads as absent
    other = msg_id + lib.LXF_PERMIT_SLOTS
    if other < 2**40:
        segment.set_permit(other, Gate.OPEN)
        assert segment.get_permit(msg_id) is None
    segment.clear_permit(msg_id)


tag_keys = st.tuples(st.integers(1, 2**31), st.sampled_from(list(TagKind)), st.integers(0, 2**24 - 1))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(tag_keys, st.integers(1, 2**40), st.integers(-1, 63)), max_size=60),
       st.data())
def test_tags_read_back_last_write(segment, writes, data):
    for pid in {k[0] for k, _, _ in writes}:
        segment.clear_pid_tags(pid)
    last = {}
    for key, msg, dscp in writes:
        value = TagValue(msg, request_id=msg + 1, bytes=msg * 2, stage=3, layer=msg % 80, dscp=dscp)
        segment.write_tag(*key, value)
        last[key] = value
    for key, value in last.items():
        assert segment.read_tag(*key) == value
    if last:
        gone = data.draw(st.sampled_from(sorted(last)))
        assert segment.remove_tag(*gone)
        assert segment.read_tag(*gone) is None
        for key, value in last.items():
            if key != gone:
                assert segment.read_tag(*key) == value
    for pid in {k[0] for k in last}:
        segment.clear_pid_tags(pid)
    assert all(segment.read_tag(*k) is None for k in last)


def test_commands_reach_one_process(segment):
    pid = 4242
    proc = lib.lxf_proc_claim(segment.raw, pid, 0)
    assert proc != ffi.NULL and pid in segment.proc_pids()
    assert not segment.send_command(4343, CommandKind.KICK)  # not attached
    for i in range(5):
        assert segment.send_command(pid, CommandKind.KICK, msg_id=i, value=i * 10)
    out = ffi.new("struct lxf_command[]", 16)
    n = lib.lxf_cmd_pop_batch(proc, out, 16)
    assert [(out[i].kind, out[i].msg_id, out[i].value) for i in range(n)] == [
        (CommandKind.KICK, i, i * 10) for i in range(5)
    ]
    for _ in range(lib.LXF_CMD_RING_SLOTS):
        assert segment.send_command(pid, CommandKind.RELEASE_ALL)
    assert not segment.send_command(pid, CommandKind.RELEASE_ALL)
    assert segment.counters()["cmds_dropped"] == 1
    lib.lxf_proc_release(proc)
    assert pid not in segment.proc_pids()


def test_dead_processes_are_released(segment):
    child = subprocess.Popen(["sleep", "0"])
    child.wait()
    lib.lxf_proc_claim(segment.raw, child.pid, 0)
    lib.lxf_proc_claim(segment.raw, os.getpid(), proc_start_ticks(os.getpid()))
    segment.tag_qp(child.pid, 300, request_id=1, stage=3, layer=0)
    assert segment.release_dead_procs() == [child.pid]
    assert segment.proc_pids() == [os.getpid()]
    assert segment.read_tag(child.pid, TagKind.QP, 300) is None


def test_message_ids_are_unique_and_nonzero(segment):
    ids = [segment.alloc_msg_id() for _ in range(1000)]
    assert len(set(ids)) == 1000 and 0 not in ids
