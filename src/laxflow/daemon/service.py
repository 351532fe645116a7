"""The daemon process: the loop around the pure core.

:class:`Daemon` owns the node's shared-memory segment, the hooks server, the
coordinator uplink and the metrics endpoint, and runs one loop thread (the
caller's, :meth:`Daemon.run`) that, each iteration:

1. beats the heartbeat (four times per staleness period);
2. drains the shims' event ring in one batch into the core;
3. handles waiting hooks calls and coordinator messages;
4. samples port byte counters (sysfs ``tx_bytes``) every millisecond;
5. steps the core and writes its permits (gate, level, DSCP) into the permit
   table, clears finished messages' slots, answers permit waits, publishes
   pruning advice and sends batch reports to the coordinator;
6. when there was nothing to do: spins (yielding the CPU) for ``spin_us``
   after the last work, then blocks in one poll on the doorbell FIFO (rung
   by the first event pushed while the daemon sleeps, see
   ``native/laxflow_shm.h``), the hooks and coordinator sockets, until the
   next timer (heartbeat, the port counters while messages are live, the
   policy's timer).

After a step that opened gates it wakes the adapters that sleep on the
permit table (a futex in the segment), so neither side polls.

:meth:`Daemon.stop` (SIGTERM/SIGINT, from the signal handler) ends the loop;
:meth:`Daemon.shutdown` then opens every gate, tells every attached shim to
pass traffic through, and leaves the segment in place: a valid segment with
a heartbeat going stale, which shims treat as "pass through" and a
restarted daemon replaces.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time

import zmq

from laxflow.daemon.config import DaemonConfig
from laxflow.daemon.core import DaemonCore
from laxflow.daemon.hooks_server import HooksServer
from laxflow.daemon.metrics import DaemonMetrics
from laxflow.daemon.uplink import Uplink, wall_offset
from laxflow.errors import UserError
from laxflow.protocol import hooks as hm
from laxflow.protocol.shm import CommandKind, Gate, Segment, SegmentError

log = logging.getLogger("laxflow.daemon")


def create_segment(name: str, stale_ns: int, gid: int | None = None) -> Segment:
    """The node's segment (mode 0600, or 0660 and group gid); a dead daemon's leftover is replaced, a live
    daemon's is an error."""
    try:
        return Segment.create(name, stale_ns, gid)
    except SegmentError as first:
        try:
            old = Segment.attach(name)
        except SegmentError:
            raise UserError(str(first)) from None
        live = old.live()
        old.close(unlink=False)
        if live:
            raise UserError(f"--shm {name}: another daemon is running on this segment (heartbeat is fresh)") from None
        log.info("replacing segment %s left by a daemon that stopped", name)
        Segment.unlink_name(name)  # and its doorbell
        try:
            return Segment.create(name, stale_ns, gid)
        except SegmentError as exc:
            raise UserError(str(exc)) from None


class Daemon:
    """One node daemon. Build it, call :meth:`run` (blocks), then :meth:`shutdown`."""

    def __init__(self, config: DaemonConfig, unlink_on_exit: bool = False) -> None:
        self.config = config
        self.unlink_on_exit = unlink_on_exit
        self.core = DaemonCore(config.core)
        self.metrics = DaemonMetrics(config.node, [p.name for p in config.core.ports], config.core.mfs.levels)
        gid = config.group_id
        self.segment = create_segment(config.shm, config.stale_ms * 1_000_000, gid)
        self._stop = threading.Event()
        # stop() writes here so a loop blocked in its poll (until the next timer: the 4 Hz gauge refresh at most) ends
        # at once
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._ctx = zmq.Context()
        self.started = time.monotonic()
        try:
            self.hooks = HooksServer(self._ctx, config.hooks, self.core, config.node, wall_offset, self._status, gid)
            self.uplink: Uplink | None = None
            if config.coordinator:
                self.uplink = Uplink(config.coordinator, config.node, self.core, self._keys(), config.heartbeat_s,
                                     wall_offset)
                self.uplink.hello("start")
            self.metrics_port: int | None = None
            self._http = None
            if config.metrics_port is not None:
                self.metrics_port = self.metrics.serve(config.metrics_bind, config.metrics_port)
        except Exception:
            self._close_sockets()
            self.segment.close(unlink=True)
            raise
        self._counters = [(i, p.counter) for i, p in enumerate(config.core.ports) if p.counter]
        self._core_timer: float | None = None
        self._bell: int | None = None
        try:
            self._bell = self.segment.open_bell()
        except SegmentError as exc:
            log.warning("%s; the loop polls instead", exc)
        self._poller = zmq.Poller()
        for sock in [self.hooks.socket] + (self.uplink.link.sockets if self.uplink is not None else []):
            self._poller.register(sock, zmq.POLLIN)
        if self._bell is not None:
            self._poller.register(self._bell, zmq.POLLIN)
        self._poller.register(self._wake_r, zmq.POLLIN)
        self.segment.heartbeat()
        if config.group is not None:
            log.info("segment, doorbell and hooks sockets shared with group %s (mode 0660)", config.group)
        log.info("daemon %s: segment %s, hooks %s, %s", config.node, config.shm, config.hooks,
                 f"coordinator {config.coordinator}" if config.coordinator else "no coordinator: scheduling locally")

    # ------------------------------------------------------------ loop

    def stop(self) -> None:
        """Ask the loop to end (signal handlers, other threads); wakes it if it is blocked in its poll."""
        self._stop.set()
        fd = self._wake_w
        if fd is not None:  # None: already shut down
            try:
                os.write(fd, b"x")
            except OSError:  # the pipe is full: the loop is awake anyway
                pass

    def run(self) -> None:
        """The loop (see the module docstring), until :meth:`stop`."""
        poll = self.config.poll_us * 1e-6
        self._beat = self.config.stale_ms * 1e-3 / 4
        self._next_beat = self._next_counter = self._next_refresh = self._last_busy = 0.0
        # Right after work the next event is likely microseconds away (a layer's messages, a completion
        # after a permit): spin with sched_yield for spin_us, which picks it up without a wake-up yet gives
        # the core to any runnable thread. Then block until something arrives: the doorbell (an event
        # pushed into the ring), a hooks call, a coordinator message, or the next timer -- no polling, so
        # an idle daemon takes no CPU and a message after a quiet gap is seen at once.
        spin_s = self.config.spin_us * 1e-6
        stop = self._stop
        while not stop.is_set():
            try:
                busy = self._iteration(time.monotonic())
            except Exception:  # a bug must not stop the node's scheduling: count, log, go on
                self.core.stats["internal_errors"] = self.core.stats.get("internal_errors", 0) + 1
                log.exception("daemon loop iteration failed")
                busy = False
            now = time.monotonic()
            if busy:
                self._last_busy = now
            elif now - self._last_busy < spin_s:
                os.sched_yield()
            else:
                self._sleep(now, poll)

    def _sleep(self, now: float, poll: float) -> None:
        """Block until an input arrives or the next timer is due (the loop thread, when idle)."""
        if self._bell is None:
            time.sleep(poll)  # no doorbell (could not create it): the old polling nap
            return
        # The gauges a scraper reads (ring drops, heartbeat age, ...) stay current while idle too: with a
        # long staleness bound the next heartbeat can be minutes away.
        due = min(self._next_beat, self._next_refresh)
        if self.core.messages:
            due = min(due, self._next_counter) if self._counters else due  # link load while traffic flows
            if self._core_timer is not None:
                due = min(due, self._core_timer)
        if self.hooks.has_waiting:
            due = min(due, now + poll)  # permit waits time out
        if self.uplink is not None:
            due = min(due, self.uplink.next_due)
        if due <= now:
            return  # a timer is due: iterate now
        timeout_ms = math.ceil((due - now) * 1e3)  # zmq counts whole ms; never round a wait down to a spin
        if not self.segment.arm_bell():
            return  # events came in meanwhile
        try:
            if self._poller.poll(timeout_ms):
                self._drain_bell()
        finally:
            self.segment.disarm_bell()

    def _drain_bell(self) -> None:
        try:
            while os.read(self._bell, 4096):
                pass
        except BlockingIOError:
            pass

    def _iteration(self, now: float) -> bool:
        """One pass of the loop; True if it moved anything (events, calls or permits)."""
        seg, core, hooks, uplink = self.segment, self.core, self.hooks, self.uplink
        if now >= self._next_beat:
            seg.heartbeat()
            self._next_beat = now + self._beat
        busy = 0
        events = seg.drain_events()
        if len(events):
            busy += len(events)
            core.ingest(events)
        busy += hooks.drain(now)
        if uplink is not None:
            uplink.tick(now)
        if self._counters and now >= self._next_counter:
            self._read_counters(now)
            self._next_counter = now + self.config.counter_interval_s
        out = core.step(time.monotonic())
        self._core_timer = out.next_timer
        for p in out.permits:
            seg.set_permit(p.msg_id, Gate.OPEN, min(p.level, 255), p.dscp)
        if out.permits:
            seg.publish_permits()  # wake the adapters sleeping on the permit table
        for msg_id in out.cleared:
            seg.clear_permit(msg_id)
        if hooks.has_waiting:
            hooks.answer_permits(now)
        if out.decided:
            hooks.publish_pruned()
        if uplink is not None and out.reports:
            uplink.report(out.reports)
        self.metrics.observe_step(out)
        if now >= self._next_refresh:
            self._refresh(now)
            self._next_refresh = now + 0.25
        return bool(busy or out.permits)

    def shutdown(self) -> None:
        """Open every gate, tell shims to pass through, close sockets; the segment stays valid."""
        now = time.monotonic()
        for p in self.core.open_all(now):
            self.segment.set_permit(p.msg_id, Gate.OPEN, min(p.level, 255), p.dscp)
        for pid in self.segment.proc_pids():
            self.segment.send_command(pid, CommandKind.PASS_THROUGH)
        self._close_sockets()
        self.segment.close(unlink=self.unlink_on_exit)
        log.info("daemon %s stopped: gates open, shims pass through", self.config.node)

    # ------------------------------------------------------------ helpers

    def _close_sockets(self) -> None:
        for name in ("_wake_r", "_wake_w"):
            fd = getattr(self, name, None)
            if fd is not None:
                setattr(self, name, None)
                os.close(fd)
        if getattr(self, "_bell", None) is not None:
            os.close(self._bell)
            self._bell = None
        for part in (getattr(self, "hooks", None), getattr(self, "uplink", None)):
            if part is not None:
                part.close()
        self._ctx.term()

    def _keys(self):
        from laxflow.coordinator.client import Endpoints
        from laxflow.coordinator.keys import ClientKeys

        if self.config.keys_dir:
            return ClientKeys.load(self.config.keys_dir, name=self.config.node)
        if not Endpoints.parse(self.config.coordinator).loopback:
            raise UserError(f"--coordinator {self.config.coordinator}: not loopback, so CURVE keys are required "
                            "(keys_dir in the config file; laxflow keys generate DIR)")
        return None

    def _read_counters(self, now: float) -> None:
        for i, path in self._counters:
            try:
                with open(path, "rb") as f:
                    self.core.port_counter(i, float(int(f.read())), now)
            except (OSError, ValueError):
                pass  # an interface that went away: its load stays as last measured

    def _refresh(self, now: float) -> None:
        self.segment.release_dead_procs()
        age = max(0.0, (time.monotonic_ns() - self.segment.heartbeat_ns) * 1e-9)
        connected = self.uplink is not None and self.uplink.connected(now)
        heard = None if self.uplink is None or self.uplink.last_heard is None else now - self.uplink.last_heard
        self.metrics.refresh(self.core, age, self.segment.counters(), connected, heard, not connected)
        if self.uplink is not None:
            self.metrics.count_auth_failures(self.uplink.auth_failures)

    def _status(self) -> hm.Status:
        now = time.monotonic()
        connected = self.uplink is not None and self.uplink.connected(now)
        waiting = sum(self.core.queue_depths().values())
        refused = (self.uplink.refused or "") if self.uplink is not None else ""
        return hm.Status(self.config.node, "coordinated" if connected else "local", self.config.coordinator or "",
                         tuple(p.name for p in self.core.ports), len(self.core.messages), waiting, len(self.core.pruned()),
                         refused)

