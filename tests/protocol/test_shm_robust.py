"""The rings survive what a hostile process can do to them: a corrupt slot, a
producer killed between claiming and publishing a slot, a reused pid."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from laxflow.protocol._shm import lib
from laxflow.protocol.shm import EventKind, proc_start_ticks


def test_corrupt_slot_never_hangs_a_producer(ring_producer, segment):
    """A garbage sequence number in the slot the producers are about to claim:
    the push gives up after a bounded number of tries, is counted as dropped,
    and the producing program finishes (today it spins forever)."""
    tail = segment.raw.events.tail
    segment.raw.events.slots[tail % lib.LXF_EVENT_RING_SLOTS].seq = tail + 12345
    proc = subprocess.run([str(ring_producer), segment.name, "2", "50", "--no-retry"], capture_output=True,
                          text=True, timeout=20)
    assert proc.returncode == 0, proc.stderr
    assert "dropped=" in proc.stdout
    dropped = int(proc.stdout.split("dropped=")[1].split()[0])
    assert dropped > 0
    assert segment.counters()["events_dropped"] == dropped


def test_consumer_repairs_a_corrupt_head_slot(segment):
    """The daemon's next drain puts a corrupt free slot back in order (counted),
    after which pushes go through again."""
    tail = segment.raw.events.tail
    segment.raw.events.slots[tail % lib.LXF_EVENT_RING_SLOTS].seq = tail + 999
    assert not segment.push_event(EventKind.SUBMIT, msg_id=1)
    assert len(segment.drain_events()) == 0
    assert segment.counters()["events_skipped"] == 1
    assert segment.push_event(EventKind.SUBMIT, msg_id=2)
    assert segment.drain_events()["msg_id"].tolist() == [2]


def test_consumer_skips_a_slot_its_producer_never_published(segment):
    """A producer dies after claiming slot `tail` (the tail moved, the slot was
    never published).  Events behind it are delivered once the slot has been
    pending longer than LXF_RING_SKIP_NS; the skipped slot is counted."""
    segment.drain_events()
    segment.raw.events.tail += 1  # claimed, never published: the dead producer
    for m in (11, 12, 13):
        assert segment.push_event(EventKind.SUBMIT, msg_id=m)
    assert len(segment.drain_events()) == 0  # still within the bound: wait for it
    deadline = time.monotonic() + 10
    got: list[int] = []
    while not got and time.monotonic() < deadline:
        time.sleep(lib.LXF_RING_SKIP_NS / 1e9 / 4)
        got = segment.drain_events()["msg_id"].tolist()
    assert got == [11, 12, 13]
    assert segment.counters()["events_skipped"] == 1
    # the ring keeps working across the skipped slot's next round
    assert segment.push_event(EventKind.SUBMIT, msg_id=14)
    assert segment.drain_events()["msg_id"].tolist() == [14]


def test_start_ticks_of_this_process():
    with open("/proc/self/stat") as f:
        want = int(f.read().rsplit(")", 1)[1].split()[19])
    assert proc_start_ticks(os.getpid()) == want
    assert proc_start_ticks(2**22 + 12345) is None  # no such pid


def test_reused_pid_is_not_a_live_process(segment):
    """A slot whose pid now belongs to another process (other start time) is
    released like a dead one."""
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        slot = segment.raw.procs[5]
        slot.pid = sleeper.pid
        slot.start_ticks = proc_start_ticks(sleeper.pid)
        assert segment.release_dead_procs() == []
        slot.start_ticks += 1  # the pid was reused by a process started later
        assert segment.release_dead_procs() == [sleeper.pid]
        assert slot.pid == 0
    finally:
        sleeper.kill()
        sleeper.wait()


def test_claim_records_start_ticks(segment):
    ticks = proc_start_ticks(os.getpid())
    p = lib.lxf_proc_claim(segment.raw, os.getpid(), ticks)
    assert p.pid == os.getpid() and p.start_ticks == ticks
    # the same pid with another start time is another process: a new slot
    q = lib.lxf_proc_claim(segment.raw, os.getpid(), ticks + 1)
    assert q != p and q.start_ticks == ticks + 1
    lib.lxf_proc_release(p)
    lib.lxf_proc_release(q)


@pytest.mark.parametrize("field", ["reattaches", "events_skipped", "wr_defer_timeouts", "injected_dropped"])
def test_new_counters_are_exposed(segment, field):
    assert segment.counters()[field] == 0
