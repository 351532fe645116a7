"""The two doorbells of the segment: event pushers wake a sleeping daemon
(FIFO), the daemon wakes processes waiting for permits (futex)."""

from __future__ import annotations

import os
import select
import subprocess
import threading
import time

from laxflow.protocol.shm import EventKind, Segment


def _rung(fd: int, timeout: float = 0.0) -> bytes:
    ready, _, _ = select.select([fd], [], [], timeout)
    if not ready:
        return b""
    try:
        return os.read(fd, 4096)
    except BlockingIOError:
        return b""


def test_a_push_rings_an_armed_bell_once_and_disarms_it(segment):
    fd = segment.open_bell()
    other = Segment.attach(segment.name)
    try:
        assert segment.arm_bell()
        assert other.push_event(EventKind.SUBMIT, 1, 7, 100, 2, 0, 1)
        assert _rung(fd, 2.0) == b"\x01"
        assert segment.raw.header.bell_armed == 0
        # Disarmed: the next pushes (the daemon is awake now) write nothing.
        assert other.push_event(EventKind.SUBMIT, 2, 7, 100, 2, 0, 1)
        assert _rung(fd, 0.05) == b""
    finally:
        other.close()
        os.close(fd)


def test_arming_fails_while_events_wait_so_none_is_slept_through(segment):
    fd = segment.open_bell()
    try:
        assert segment.push_event(EventKind.SUBMIT, 1, 7, 100, 2, 0, 1)  # pushed while the daemon was awake
        assert not segment.arm_bell()  # the daemon must drain first instead of sleeping on it
        assert segment.raw.header.bell_armed == 0
        assert len(segment.drain_events()) == 1
        assert segment.arm_bell()
        segment.disarm_bell()
    finally:
        os.close(fd)


def test_a_c_producer_rings_the_bell(ring_producer, segment):
    """The shim's pushes (the same shm.c, in another process) ring it too."""
    fd = segment.open_bell()
    try:
        assert segment.arm_bell()
        proc = subprocess.run([str(ring_producer), segment.name, "1", "1"], capture_output=True, text=True,
                              timeout=20)
        assert proc.returncode == 0, proc.stderr
        assert _rung(fd, 2.0) == b"\x01"
    finally:
        os.close(fd)


def test_no_reader_means_no_ring_and_the_push_still_lands(segment):
    """A daemon gone (its bell removed): pushing still works, fails open."""
    fd = segment.open_bell()
    os.close(fd)
    os.unlink(segment.bell_path)
    assert segment.arm_bell()
    assert segment.push_event(EventKind.SUBMIT, 1, 7, 100, 2, 0, 1)
    assert len(segment.drain_events()) == 1


def test_the_owner_removes_its_bell_on_close():
    from shmtest import unique_name

    seg = Segment.create(unique_name())
    fd = seg.open_bell()
    path = seg.bell_path
    assert os.path.exists(path) and (os.stat(path).st_mode & 0o777) == 0o600
    os.close(fd)
    seg.close()
    assert not os.path.exists(path)


def test_permit_waiters_wake_on_publish_and_time_out_without_one(segment):
    seq = segment.permit_seq()
    assert not segment.wait_permits(seq, 0.02)  # nothing published: times out
    woke: list[bool] = []
    t = threading.Thread(target=lambda: woke.append(segment.wait_permits(seq, 10.0)))
    t.start()
    time.sleep(0.05)
    assert t.is_alive()  # asleep on the futex, not returning early
    segment.publish_permits()
    t.join(5)
    assert woke == [True]
    assert segment.permit_seq() == (seq + 1) & 0xFFFFFFFF
    assert segment.wait_permits(seq, 10.0)  # already published since seq: returns at once
