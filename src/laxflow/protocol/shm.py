"""Python side of the shared-memory protocol between the shim and the daemon.

The node daemon creates one :class:`Segment` per node and, on its own thread,
beats (:meth:`Segment.heartbeat`), drains shim events in batches
(:meth:`Segment.drain_events`), writes permits (:meth:`Segment.set_permit`) and
sends commands to one process (:meth:`Segment.send_command`).  Adapters in the
serving process write flow tags (:meth:`Segment.tag_qp`, :meth:`Segment.tag_socket`)
and may push their own events.  The layout and the ring code are the C ones
(``native/laxflow_shm.h``, ``native/shm.c``) through cffi, so both sides run
the same code on the same bytes.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from enum import IntEnum

import numpy as np

from laxflow.stage import STAGE_CODES, STAGE_NONE
from laxflow.protocol._shm import ffi, lib

LAYOUT_VERSION: int = lib.LXF_SHM_VERSION
DEFAULT_NAME = "/laxflow"
# The layer of a LAYER_BOUNDARY event meaning "the request's prefill compute ended".
COMPUTE_DONE_LAYER: int = lib.LXF_LAYER_COMPUTE_DONE


class EventKind(IntEnum):
    SUBMIT = lib.LXF_EV_SUBMIT
    COMPLETION = lib.LXF_EV_COMPLETION
    LAYER_BOUNDARY = lib.LXF_EV_LAYER_BOUNDARY


# lxf_event.stage and lxf_tag_value.stage: the one stage table (laxflow.stage, the header's LXF_STAGE_*).
Stage = IntEnum("Stage", [("NONE", STAGE_NONE), *((stage.name, code) for stage, code in STAGE_CODES.items())],
                module=__name__)


class CommandKind(IntEnum):
    KICK = lib.LXF_CMD_KICK
    RELEASE_ALL = lib.LXF_CMD_RELEASE_ALL
    PASS_THROUGH = lib.LXF_CMD_PASS_THROUGH
    ENFORCE = lib.LXF_CMD_ENFORCE


class Gate(IntEnum):
    CLOSED = lib.LXF_GATE_CLOSED
    OPEN = lib.LXF_GATE_OPEN


class TagKind(IntEnum):
    QP = lib.LXF_TAG_QP
    SOCKET = lib.LXF_TAG_SOCKET


_ATTACH_ERRORS = {
    lib.LXF_ATTACH_NOENT: "no such segment",
    lib.LXF_ATTACH_SHORT: "segment smaller than the layout",
    lib.LXF_ATTACH_BADMAGIC: "not a laxflow segment (bad magic)",
    lib.LXF_ATTACH_BADVERSION: f"layout version is not {LAYOUT_VERSION}",
    lib.LXF_ATTACH_ERROR: "cannot map",
    lib.LXF_ATTACH_DENIED: "permission denied (the daemon shares it only with its 'group')",
}

SHM_DIR = "/dev/shm"  # where glibc's shm_open keeps POSIX segments (the doorbell lives there too)


def share_with_group(path: str, gid: int | None) -> None:
    """Give a segment, doorbell or socket file to group ``gid``, mode 0660; nothing when gid is None (0600 stays).

    Called by the daemon on what it creates, so that serving jobs of other
    users in its configured group can attach; raises OSError (EPERM when
    the daemon's user is neither root nor a member of the group).
    """
    if gid is None:
        return
    os.chown(path, -1, gid)
    os.chmod(path, 0o660)


class SegmentError(Exception):
    """A segment could not be created or attached; the message says which and why."""


def _struct_dtype(ctype: str, fields: list[tuple[str, str]]) -> np.dtype:
    """numpy view of a C struct, offsets taken from cffi (hence from the header)."""
    return np.dtype(
        {
            "names": [name for name, _ in fields],
            "formats": [fmt for _, fmt in fields],
            "offsets": [ffi.offsetof(ctype, name) for name, _ in fields],
            "itemsize": ffi.sizeof(ctype),
        }
    )


EVENT_DTYPE = _struct_dtype(
    "struct lxf_event",
    [
        ("kind", "<u4"),
        ("pid", "<u4"),
        ("msg_id", "<u8"),
        ("request_id", "<u8"),
        ("bytes", "<u8"),
        ("t_ns", "<u8"),
        ("stage", "<u4"),
        ("layer", "<u4"),
        ("handle", "<u8"),
    ],
)

COUNTER_NAMES = (
    "events_dropped",
    "cmds_dropped",
    "tags_full",
    "wr_deferred",
    "wr_released",
    "wr_failopen",
    "wr_post_errors",
    "shim_internal_errors",
    "events_skipped",
    "reattaches",
    "wr_defer_timeouts",
    "injected_dropped",
    "sock_tos_set",
    "sock_msgs",
)


def proc_start_ticks(pid: int) -> int | None:
    """Start time of process pid in clock ticks since boot (field 22 of
    /proc/<pid>/stat), or None when there is no such process.

    A process is (pid, start time): the shim records its own in its slot, and
    the daemon compares it to tell a live process from a reused pid.
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # the command name (field 2) may hold spaces and parentheses: split after the last ')'
    return int(stat.rsplit(b")", 1)[1].split()[19])


@dataclass(frozen=True)
class TagValue:
    """What a flow tag says about a QP or socket (``struct lxf_tag_value``)."""

    msg_id: int
    request_id: int = 0
    bytes: int = 0
    stage: int = Stage.NONE
    layer: int = 0
    dscp: int = -1


@dataclass(frozen=True)
class Permit:
    """A message's permit as the shim reads it (``struct lxf_permit_view``)."""

    msg_id: int
    gate: Gate
    level: int
    dscp: int


class Segment:
    """One mapped segment.  Create it in the daemon, attach to it elsewhere.

    Not thread-safe for draining: one thread drains events (the rings are
    multi-producer, single-consumer).  Everything else may be called from
    any thread.
    """

    def __init__(self, ptr, name: str, owner: bool, drain_batch: int = 8192) -> None:
        self._seg = ptr
        self.name = name
        self.owner = owner
        self._pid = os.getpid()
        self._buf = ffi.new("struct lxf_event[]", drain_batch)
        self._buf_view = np.frombuffer(ffi.buffer(self._buf), dtype=EVENT_DTYPE)
        self._cmd = ffi.new("struct lxf_command *")
        self._ev = ffi.new("struct lxf_event *")
        self._tag = ffi.new("struct lxf_tag_value *")
        self._permit = ffi.new("struct lxf_permit_view *")
        self.gid: int | None = None  # the group the owner shared it with (create), None: mode 0600

    # ------------------------------------------------------------ lifecycle

    @classmethod
    def create(cls, name: str = DEFAULT_NAME, stale_ns: int = 0, gid: int | None = None) -> Segment:
        """Create the node's segment, mode 0600 (or 0660 and group ``gid``); fails if it already exists."""
        ptr = lib.lxf_segment_create(name.encode(), stale_ns)
        if ptr == ffi.NULL:
            err = ffi.errno
            raise SegmentError(f"cannot create shared-memory segment {name!r}: {os.strerror(err)}")
        seg = cls(ptr, name, owner=True)
        seg.gid = gid
        try:
            share_with_group(SHM_DIR + name, gid)
        except OSError as exc:
            seg.close(unlink=True)
            raise SegmentError(f"cannot give shared-memory segment {name!r} to group {gid}: {exc.strerror} "
                               "(the daemon's user must be root or a member of the group)") from None
        return seg

    @classmethod
    def attach(cls, name: str = DEFAULT_NAME) -> Segment:
        """Map an existing segment; raises SegmentError naming what is wrong."""
        status = ffi.new("int *")
        ptr = lib.lxf_segment_attach(name.encode(), status)
        if ptr == ffi.NULL:
            raise SegmentError(f"cannot attach shared-memory segment {name!r}: {_ATTACH_ERRORS[status[0]]}")
        return cls(ptr, name, owner=False)

    @staticmethod
    def unlink_name(name: str = DEFAULT_NAME) -> bool:
        """Remove a segment by name (a daemon's leftover) and its doorbell; True if the segment existed.

        A daemon that was killed leaves both; its bell's name is in the
        segment's header, so it is read (when the layout is this one) before
        the name goes.
        """
        try:
            seg = Segment.attach(name)
        except SegmentError:
            pass
        else:
            bell = seg.bell_path
            seg.close(unlink=False)
            with contextlib.suppress(OSError):
                os.unlink(bell)
        return lib.lxf_segment_unlink(name.encode()) == 0

    def close(self, unlink: bool | None = None) -> None:
        """Unmap; the owner also removes the name unless unlink=False."""
        if self._seg is None:
            return
        self._buf_view = None
        bell = self.bell_path if self.owner else None
        lib.lxf_segment_detach(self._seg)
        self._seg = None
        if bell is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(bell)  # pushers find no reader and skip the ring; a successor makes its own
        if self.owner if unlink is None else unlink:
            lib.lxf_segment_unlink(self.name.encode())

    def __enter__(self) -> Segment:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --------------------------------------------------------------- header

    @property
    def raw(self):
        """The cffi ``struct lxf_segment *`` (tests and benchmarks)."""
        return self._seg

    @property
    def version(self) -> int:
        return self._seg.header.version

    @property
    def heartbeat_ns(self) -> int:
        return self._seg.header.heartbeat_ns

    @property
    def stale_ns(self) -> int:
        return self._seg.header.stale_ns

    @stale_ns.setter
    def stale_ns(self, value: int) -> None:
        self._seg.header.stale_ns = value

    def heartbeat(self) -> None:
        """Called by the daemon at least every stale_ns / 4 to keep shims gating."""
        lib.lxf_heartbeat(self._seg)

    def live(self) -> bool:
        return bool(lib.lxf_segment_live(self._seg, lib.lxf_now_ns(), lib.LXF_DEFAULT_STALE_NS))

    def counters(self) -> dict[str, int]:
        c = self._seg.counters
        return {name: int(getattr(c, name)) for name in COUNTER_NAMES}

    def alloc_msg_id(self) -> int:
        return int(lib.lxf_msg_id_alloc(self._seg))

    # --------------------------------------------------------------- events

    def push_event(
        self,
        kind: int,
        msg_id: int = 0,
        request_id: int = 0,
        bytes: int = 0,
        stage: int = 0,
        layer: int = 0,
        handle: int = 0,
    ) -> bool:
        """Push one event as an adapter would; False when the ring is full (counted)."""
        ev = self._ev
        ev.kind, ev.pid, ev.msg_id, ev.request_id = kind, self._pid, msg_id, request_id
        ev.bytes, ev.t_ns, ev.stage, ev.layer, ev.handle = bytes, lib.lxf_now_ns(), stage, layer, handle
        return lib.lxf_event_push(self._seg, ev) == 0

    def drain_events(self, max_events: int | None = None) -> np.ndarray:
        """Take up to max_events (default: one batch) events, oldest first.

        Returns a structured array of EVENT_DTYPE owning its data.  Called by
        the daemon's event loop, one thread only.
        """
        limit = len(self._buf) if max_events is None else min(max_events, len(self._buf))
        n = lib.lxf_event_pop_batch(self._seg, self._buf, limit)
        return self._buf_view[:n].copy()

    # ------------------------------------------------------------- commands

    def proc_pids(self) -> list[int]:
        """Pids of processes whose shim has attached."""
        return [p.pid for p in self._seg.procs if p.pid]

    def procs(self) -> list[tuple[int, int]]:
        """(pid, start_ticks) of every attached process: its identity (see proc_start_ticks)."""
        return [(int(p.pid), int(p.start_ticks)) for p in self._seg.procs if p.pid]

    def release_dead_procs(self) -> list[int]:
        """Free the slots and tags of attached processes that have exited.

        Called periodically by the daemon: a process killed outright never
        runs the shim's destructor that frees its slot.  A process is its pid
        and its start time: a pid now held by a process started at another
        time (pid reuse) counts as dead.  A slot without a start time (0) is
        judged by its pid alone.
        """
        dead = []
        for proc in self._seg.procs:
            pid = proc.pid
            if not pid:
                continue
            ticks = proc_start_ticks(pid)
            if ticks is None or (proc.start_ticks and ticks != proc.start_ticks):
                lib.lxf_proc_release(ffi.addressof(proc))
                self.clear_pid_tags(pid)
                dead.append(pid)
        return dead

    def send_command(self, pid: int, kind: int, msg_id: int = 0, arg: int = 0, value: int = 0) -> bool:
        """Queue a command for one attached process; False if it is not attached or its ring is full."""
        proc = lib.lxf_proc_find(self._seg, pid)
        if proc == ffi.NULL:
            return False
        cmd = self._cmd
        cmd.kind, cmd.arg, cmd.msg_id, cmd.value = kind, arg, msg_id, value
        return lib.lxf_cmd_push(self._seg, proc, cmd) == 0

    # -------------------------------------------------------------- permits

    def set_permit(self, msg_id: int, gate: int, level: int = 0, dscp: int = 0) -> None:
        if not 0 <= dscp <= 63:
            raise ValueError(f"dscp: expected 0..63, got {dscp}")
        if not 0 <= level <= 255:
            raise ValueError(f"level: expected 0..255, got {level}")
        lib.lxf_permit_set(self._seg, msg_id, gate, level, dscp)

    def get_permit(self, msg_id: int) -> Permit | None:
        if not lib.lxf_permit_get(self._seg, msg_id, self._permit):
            return None
        p = self._permit
        return Permit(int(p.msg_id), Gate(p.gate), int(p.level), int(p.dscp))

    def clear_permit(self, msg_id: int) -> None:
        lib.lxf_permit_clear(self._seg, msg_id)

    def publish_permits(self) -> None:
        """Daemon, after a step that opened gates: wake the processes sleeping in :meth:`wait_permits`."""
        lib.lxf_permit_publish(self._seg)

    def permit_seq(self) -> int:
        """The permit sequence to pass to :meth:`wait_permits`: read it *before* checking the permits."""
        return int(lib.lxf_permit_seq(self._seg))

    def wait_permits(self, seq: int, timeout_s: float) -> bool:
        """Sleep (GIL released) until the daemon publishes permits after ``seq``; False on timeout."""
        return bool(lib.lxf_permit_wait(self._seg, seq, max(0, int(timeout_s * 1e9))))

    # --------------------------------------------------------------- doorbell

    @property
    def bell_path(self) -> str:
        """The FIFO event pushers ring when the daemon sleeps (unique to this daemon instance)."""
        buf = ffi.new("char[]", lib.LXF_BELL_PATH_MAX)
        lib.lxf_bell_path(self._seg, buf)
        return ffi.string(buf).decode()

    def open_bell(self) -> int:
        """Daemon: create the doorbell FIFO and open it (non-blocking); returns its fd for poll().

        Mode 0600, or 0660 and the segment's group when it was created with one.
        """
        fd = lib.lxf_bell_create(self._seg)
        if fd < 0:
            raise SegmentError(f"cannot create doorbell {self.bell_path!r}: {os.strerror(ffi.errno)}")
        try:
            share_with_group(self.bell_path, self.gid)
        except OSError as exc:
            os.close(fd)
            raise SegmentError(f"cannot give doorbell {self.bell_path!r} to group {self.gid}: {exc.strerror}") from None
        return fd

    def arm_bell(self) -> bool:
        """Daemon, before it blocks: True when armed (no event waits), False when events came first."""
        return bool(lib.lxf_bell_arm(self._seg))

    def disarm_bell(self) -> None:
        """Daemon, once awake again (pushers then skip the bell)."""
        lib.lxf_bell_disarm(self._seg)

    # ------------------------------------------------------------ flow tags

    def write_tag(self, pid: int, kind: int, handle: int, value: TagValue) -> None:
        if not -1 <= value.dscp <= 63:
            raise ValueError(f"dscp: expected -1..63, got {value.dscp}")
        t = self._tag
        t.msg_id, t.request_id, t.bytes = value.msg_id, value.request_id, value.bytes
        t.stage, t.layer, t.dscp, t.flags = value.stage, value.layer, value.dscp, 0
        if lib.lxf_tag_write(self._seg, pid, kind, handle, t) != 0:
            raise SegmentError(f"flow-tag registry full around ({pid}, {kind}, {handle})")

    def read_tag(self, pid: int, kind: int, handle: int) -> TagValue | None:
        if not lib.lxf_tag_read(self._seg, pid, kind, handle, self._tag):
            return None
        t = self._tag
        return TagValue(int(t.msg_id), int(t.request_id), int(t.bytes), int(t.stage), int(t.layer), int(t.dscp))

    def remove_tag(self, pid: int, kind: int, handle: int) -> bool:
        return bool(lib.lxf_tag_remove(self._seg, pid, kind, handle))

    def clear_pid_tags(self, pid: int) -> int:
        """Free every tag of a process that has exited; returns how many."""
        return int(lib.lxf_tag_clear_pid(self._seg, pid))

    def tag_qp(
        self,
        pid: int,
        qp_num: int,
        request_id: int,
        stage: int,
        layer: int,
        bytes: int = 0,
        dscp: int = -1,
        msg_id: int | None = None,
    ) -> int:
        """Say that QP qp_num of process pid now carries a new message; returns its id.

        Called by adapters before posting a layer's transfer or a collective.
        """
        if msg_id is None:
            msg_id = self.alloc_msg_id()
        self.write_tag(pid, TagKind.QP, qp_num, TagValue(msg_id, request_id, bytes, stage, layer, dscp))
        return msg_id

    def tag_socket(
        self, pid: int, fd: int, request_id: int, stage: int, layer: int, bytes: int = 0, dscp: int = -1
    ) -> int:
        """Same as tag_qp for a TCP socket (Mooncake's TCP transport, Gloo)."""
        msg_id = self.alloc_msg_id()
        self.write_tag(pid, TagKind.SOCKET, fd, TagValue(msg_id, request_id, bytes, stage, layer, dscp))
        return msg_id
