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
6. when there was nothing to do: spins (yielding the CPU) for 2 ms after
   the last work, then sleeps, backing off from ``poll_us`` to 20x.

:meth:`Daemon.stop` (SIGTERM/SIGINT, from the signal handler) ends the loop;
:meth:`Daemon.shutdown` then opens every gate, tells every attached shim to
pass traffic through, and leaves the segment in place: a valid segment with
a heartbeat going stale, which shims treat as "pass through" and a
restarted daemon replaces.
"""

from __future__ import annotations

import logging
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
from laxflow.hooks import messages as hm
from laxflow.protocol.shm import CommandKind, Gate, Segment, SegmentError

log = logging.getLogger("laxflow.daemon")


def create_segment(name: str, stale_ns: int) -> Segment:
    """The node's segment (mode 0600); a dead daemon's leftover is replaced, a live daemon's is an error."""
    try:
        return Segment.create(name, stale_ns)
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
        Segment.unlink_name(name)
        try:
            return Segment.create(name, stale_ns)
        except SegmentError as exc:
            raise UserError(str(exc)) from None


class Daemon:
    """One node daemon. Build it, call :meth:`run` (blocks), then :meth:`shutdown`."""

    def __init__(self, config: DaemonConfig, unlink_on_exit: bool = False) -> None:
        self.config = config
        self.unlink_on_exit = unlink_on_exit
        self.core = DaemonCore(config.core)
        self.metrics = DaemonMetrics(config.node, [p.name for p in config.core.ports], config.core.mfs.levels)
        self.segment = create_segment(config.shm, config.stale_ms * 1_000_000)
        self._stop = threading.Event()
        self._ctx = zmq.Context()
        self.started = time.monotonic()
        try:
            self.hooks = HooksServer(self._ctx, config.hooks, self.core, config.node, wall_offset, self._status)
            self.uplink: Uplink | None = None
            if config.coordinator:
                self.uplink = Uplink(config.coordinator, config.node, self.core, self._keys(), config.heartbeat_s,
                                     wall_offset)
                self.uplink.hello("start")
            self.metrics_port: int | None = None
            self._http = None
            if config.metrics_port is not None:
                self.metrics_port = self.metrics.serve(config.metrics_host, config.metrics_port)
        except Exception:
            self._close_sockets()
            self.segment.close(unlink=True)
            raise
        self._counters = [(i, p.counter) for i, p in enumerate(config.core.ports) if p.counter]
        self.segment.heartbeat()
        log.info("daemon %s: segment %s, hooks %s, %s", config.node, config.shm, config.hooks,
                 f"coordinator {config.coordinator}" if config.coordinator else "no coordinator: scheduling locally")

    # ------------------------------------------------------------ loop

    def stop(self) -> None:
        """Ask the loop to end (signal handlers, other threads)."""
        self._stop.set()

    def run(self) -> None:
        """The loop (see the module docstring), until :meth:`stop`."""
        poll = self.config.poll_us * 1e-6
        self._beat = self.config.stale_ms * 1e-3 / 4
        self._next_beat = self._next_counter = self._next_refresh = self._last_busy = 0.0
        # Adaptive wait. Right after work the next event is likely microseconds away (a layer's messages,
        # a completion after a permit): spin with sched_yield, which picks it up without a timer wake-up
        # (a 20 us sleep is ~60-80 us on Linux, milliseconds on a loaded box) yet gives the core to any
        # runnable thread. Quiet for spin_us: sleep, doubling from poll_us up to 20x (an idle daemon costs
        # little CPU, and stays within one nap of the heartbeat).
        spin_s, nap_max = self.config.spin_us * 1e-6, min(self._beat, 20 * poll)
        nap = poll
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
                nap = poll
            elif now - self._last_busy < spin_s:
                os.sched_yield()
            else:
                time.sleep(nap)
                nap = min(2 * nap, nap_max)

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
        for p in out.permits:
            seg.set_permit(p.msg_id, Gate.OPEN, min(p.level, 255), p.dscp)
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

    def _status(self) -> hm.Status:
        now = time.monotonic()
        connected = self.uplink is not None and self.uplink.connected(now)
        waiting = sum(self.core.queue_depths().values())
        return hm.Status(self.config.node, "coordinated" if connected else "local", self.config.coordinator or "",
                         tuple(p.name for p in self.core.ports), len(self.core.messages), waiting, len(self.core.pruned()))

