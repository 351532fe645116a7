"""The contention scenario in the simulator: the testbed's prediction.

Mirrors :mod:`laxflow.testbed.worker` and the testbed's daemons, called by
``bench/testbed_fidelity.py`` (and the tests) on the main thread. What it
models, piece by piece, as the testbed physically does it:

- **The wire** (:mod:`laxflow.testbed.sim_wire`): frames through the
  fabric's own queues, as its qdiscs move them: per host egress (``hN-up``)
  and per switch port (``hN-down``) an HTB tree at the line rate (its token
  bucket and burst) with one FIFO per traffic class served in strict
  priority; a message's frames join the sender's class queue when it is
  written, so bytes queue at the host and at the switch port (no TCP
  window held a message back on this fabric, and no pfifo ever dropped).
- **Connections** (:class:`_Conn`): a worker's ``sendall`` returns after
  the measured ``sendall_s`` (the socket buffer takes the message; a sent
  message then reports COMPLETION to its daemon); a message in another
  class than the connection's previous one first waits for those bytes to
  be delivered (the shim's ``wait_drained``). A message that finds its
  connection idle pays the stage's measured residual overhead
  (``ModelParams.overhead_s``: its time alone on the idle testbed minus its
  time alone in this model): a start delay if positive; if negative, that
  many seconds of its bytes arrive at once, when its path is empty.
- **Processes**: per prefill rank, requests in arrival order: all the
  request's reads asked at once (served in order on the rank's kvstore
  connection), layer j computes once its read is in for the measured real
  sleep (``compute_s``), then the all_to_all (both directions; a rank's CCT
  ends when its own ``sendall`` has returned and the peer's bytes are in, its
  own bytes perhaps still queued on the way), then the layer's KV
  write on the rank's decode connection. TTFT = the request's last write
  acknowledged at the rank (the later rank) - arrival.
- **The small application messages** cross the fabric like any packet:
  each read's request (rank -> kvstore) before its bytes come back, and
  each KV write's acknowledgement (decode -> rank), in the class of the
  sides that only ask and acknowledge (``scenario.ack_dscp``: the top class
  in ``static`` and ``on``, so they pass the bulk queues; class 0 with
  everything else in ``off``, so a read's request waits at the rank's host
  queue behind the rank's own KV writes, and a write's acknowledgement at
  the rank's switch port behind reads and all_to_all bytes).
- **Classes by mode**: ``off`` all DSCP 0; ``static`` the stage's DSCP
  (:func:`laxflow.testbed.scenario.stage_dscp`); ``on`` the permit's DSCP,
  from one :class:`laxflow.daemon.core.DaemonCore` per host, the daemons'
  own state machine (MFS policy, permit rule, ports ``eth0`` and
  ``eth0-rx`` with the testbed's windows), fed as the testbed feeds it:
  hooks calls (request, batch), messages submitted on the initiating host's
  port, layer boundaries and completions, and each port's own byte counter
  (the veth's bytes: payload and headers once per packet, ACKs included) every
  ``counter_interval_s``. Each daemon sees only its own ports' load, as on
  the testbed. A submit and a completion reach the daemon half a permit
  latency late and a permit reaches the worker half a latency after the
  grant; the latency per stage is measured (``ModelParams.permit_s``).

Not modelled (the fidelity report's reasons): host stalls -- the model is
deterministic, or with a seed draws compute sleeps and message overheads
from their measured samples, but the testbed's CCT tail under load (p99 3-5x
the mean) is in no isolated measurement; the coordinator's RED order (the
daemons decide without one); the hooks' ZeroMQ round trips; TCP beyond
its measured window (pacing, slow start, loss: none was seen).
"""

from __future__ import annotations

import inspect
import math
import random
import statistics
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Any, Callable


from laxflow.adapters.sockets import wait_drained
from laxflow.daemon.config import DaemonConfig
from laxflow.daemon.core import CoreConfig, DaemonCore
from laxflow.daemon.ports import PortSpec
from laxflow.policy.config import MfsConfig
from laxflow.policy.flow import Stage
from laxflow.sim.events import EventQueue, Priority
from laxflow.testbed.decision_trace import DecisionTrace
from laxflow.testbed.fabric import parse_rate
from laxflow.testbed.mfs_io import RX_PORT
from laxflow.testbed.worker import ACK, KVREQ, job_traffic
from laxflow.testbed.scenario import ScenarioConfig, ack_dscp, stage_dscp
from laxflow.testbed.sim_wire import GOODPUT, MSS, TC_OF_DSCP, Window, Wire, htb_burst
HOSTS, KVSTORE, DECODE = 4, 2, 3
KVRESP_BYTES, HDR_BYTES = 16, 24  # the workers' application headers (read response, KV write)
KVREQ_BYTES, ACK_BYTES = KVREQ.size, ACK.size  # a read's request, a write's (or a probe's) acknowledgement
# s: the longest a connection's class switch waits for its earlier bytes (the worker's wait_drained default)
DRAIN_LIMIT = inspect.signature(wait_drained).parameters["timeout"].default
RX_WINDOW = 1e12  # the testbed's eth0-rx: classifies, never holds (scenario.ControlPlane)
COUNTER_INTERVAL = DaemonConfig.__dataclass_fields__["counter_interval_s"].default
MODES = ("off", "static", "on")


@dataclass(frozen=True)
class ModelParams:
    """The model's measured inputs; ``sources`` says where each came from (in the bench's JSON).

    ``overhead_s``: per stage (1, 2, 3), a message alone on an idle path takes its bytes at goodput plus
    this. Positive: host time before its bytes go (a start delay, paid when its connection is idle).
    Negative: the fabric's burst (the HTB buckets let the first bytes of an idle path through at once):
    that many seconds' worth of bytes are delivered at once when the message's links carry nothing else.
    ``compute_s``: one layer's compute sleep as it really lasts (None: the scenario's nominal).
    ``permit_s``: per stage, submit -> permit at the worker for a message the daemon does not hold.
    ``sendall_s``: per stage, how long ``sendall`` takes to return (the socket buffer takes the message):
    then the worker reports the message COMPLETE to its daemon (stage 1 completes when its bytes are in).
    ``skb_bytes``: per stage, the payload of one packet the qdiscs move (a GSO super-packet; MSS: one frame).
    ``window_segments``: per stage, each connection's TCP congestion window in segments (None: unbounded).
    ``compute_samples_s``, ``overhead_samples_s``: measured samples (each compute sleep; each probe's
    overhead), drawn from per layer and per message when the model runs with a seed (the testbed's jitter).
    """

    overhead_s: dict[int, float] = field(default_factory=lambda: {1: 0.0, 2: 0.0, 3: 0.0})
    compute_s: float | None = None
    permit_s: dict[int, float] = field(default_factory=lambda: {1: 0.0, 2: 0.0, 3: 0.0})
    sendall_s: dict[int, float] = field(default_factory=lambda: {1: 0.0, 2: 0.0, 3: 0.0})
    skb_bytes: dict[int, float] = field(default_factory=lambda: {1: MSS, 2: MSS, 3: MSS})
    window_segments: dict[int, float] | None = None
    compute_samples_s: tuple[float, ...] = ()
    overhead_samples_s: dict[int, tuple[float, ...]] | None = None
    sources: dict[str, str] = field(default_factory=lambda: {"overhead_s": "none (0)", "compute_s": "nominal",
                                                             "permit_s": "none (0)", "sendall_s": "none (0)",
                                                             "skb_bytes": "none (one frame)"})

    def __post_init__(self) -> None:
        for name in ("overhead_s", "permit_s", "sendall_s", "skb_bytes"):
            d = getattr(self, name)
            low = {"overhead_s": -math.inf, "skb_bytes": 1.0}.get(name, 0.0)
            if set(d) != {1, 2, 3} or not all(math.isfinite(v) and v >= low for v in d.values()):
                raise ValueError(f"model params: {name} needs stages 1, 2, 3 with finite values"
                                 f"{'' if name == 'overhead_s' else f' >= {low:g}'}, got {d!r}")
        w = self.window_segments
        if w is not None and (set(w) != {1, 2, 3} or not all(math.isfinite(v) and v >= 1 for v in w.values())):
            raise ValueError(f"model params: window_segments needs stages 1, 2, 3 with >= 1 segment, got {w!r}")
        if self.compute_s is not None and not (math.isfinite(self.compute_s) and self.compute_s >= 0):
            raise ValueError(f"model params: compute_s must be >= 0 s, got {self.compute_s!r}")

    def with_permits(self, wait_ms: dict[str, float], source: str) -> "ModelParams":
        """The permit latency per stage from measured submit -> permit waits (ms, keys "1", "2", "3").

        Stage 1's reads (``eth0-rx`` never holds) and stage 2's all_to_all
        (the top rank on ``eth0``) are not held by the daemon: their wait is
        the latency. Stage 3 is held behind higher ranks on ``eth0``; the
        model's daemon holds it itself, so its latency is stage 2's (the
        same port and path).
        """
        lat = {1: wait_ms["1"] / 1000, 2: wait_ms["2"] / 1000, 3: wait_ms["2"] / 1000}
        return replace(self, permit_s=lat, sources=dict(self.sources, permit_s=source))


class _Model:
    """One run of the scenario in one mode; see the module doc. Single-threaded, driven by its event queue."""

    def __init__(self, cfg: ScenarioConfig, mode: str, params: ModelParams, slo: float, trace: bool = False,
                 seed: int | None = None) -> None:
        self.cfg, self.mode, self.params, self.slo, self.trace = cfg, mode, params, slo, trace
        # seed: draw each compute sleep and each message's overhead from the measured samples
        self.rng = None if seed is None else random.Random(seed)
        self.rate = parse_rate(cfg.rate) / 8
        self.q = EventQueue()
        self.wire = Wire(self.q, HOSTS, self.rate, htb_burst(parse_rate(cfg.rate)))
        self.compute = cfg.compute_ms / 1000 if params.compute_s is None else params.compute_s
        total = cfg.requests + cfg.warmup
        self.arrivals = [i * cfg.interarrival_ms / 1000 for i in range(total)]
        self.daemons = [_Daemon(self, h) for h in range(HOSTS)] if mode == "on" else None
        self.kv_conn = {r: _Conn(self, KVSTORE, r, 1) for r in (0, 1)}
        self.dec_conn = {r: _Conn(self, r, DECODE, 3) for r in (0, 1)}
        self.a2a_conn = {r: _Conn(self, r, 1 - r, 2) for r in (0, 1)}
        self.cct: list[tuple[int, float]] = []
        # (what, rank, request) -> per layer, s after arrival: read in, compute start, all_to_all end, write acked
        self.timeline: dict[tuple[str, int, int], list[float]] = {}
        self.done: dict[tuple[int, int], float] = {}
        self.a2a: dict[tuple[int, int], dict[str, Any]] = {}
        self.waits: dict[int, list[float]] = {1: [], 2: [], 3: []}
        self.permit_dscp: dict[str, int] = {}
        self.finished = 0

    def link(self, name: str) -> int:
        return self.wire.link(name)

    def mark(self, what: str, rank: int, req: int, layer: int) -> None:
        """A timeline point (see ``timeline``): now, relative to the request's arrival."""
        self.timeline.setdefault((what, rank, req), [0.0] * self.cfg.layers)[layer] = self.q.now - self.arrivals[req]

    def compute_time(self) -> float:
        """One layer's compute: the measured mean, or (seeded) one of the measured sleeps."""
        samples = self.params.compute_samples_s
        return self.rng.choice(samples) if self.rng is not None and samples else self.compute

    def overhead(self, stage: int) -> float:
        """A message's overhead: the calibration's median, or (seeded) one of its probes' own."""
        samples = (self.params.overhead_samples_s or {}).get(stage)
        return self.rng.choice(samples) if self.rng is not None and samples else self.params.overhead_s[stage]

    def counter(self, link: int) -> float:
        """The link's cumulative wire bytes now (frames of data, and ACK frames of the reverse streams)."""
        return self.wire.counter(link)

    def static_dscp(self, stage: int) -> int:
        return stage_dscp(self.mode)[stage]

    def path_idle(self, src: int, dst: int) -> bool:
        """Whether the ports a message src -> dst crosses are empty (its bytes meet empty queues)."""
        return self.wire.idle(src, dst)

    def note(self, src: int, dst: int, nbytes: int, on_done: Callable[[], None]) -> None:
        """A small application message src -> dst (a read's request, an acknowledgement) in the class
        of the sides that only ask and acknowledge (``scenario.ack_dscp``)."""
        self.wire.send(src, dst, nbytes, TC_OF_DSCP.get(ack_dscp(self.mode), 0), on_done)

    def start_flow(self, src: int, dst: int, nbytes: float, dscp: int, stage: int, on_done: Callable[[], None],
                   instant: float = 0.0, window: Window | None = None, ack_tc: int = 0) -> None:
        """Bytes src -> dst in class ``dscp``; ``instant`` of them are delivered at once (an idle path's burst)."""
        instant = min(max(instant, 0.0), nbytes - 1.0)
        if instant > 0:
            self.wire.deliver_at_once(src, dst, instant)
        self.wire.send(src, dst, nbytes - instant, TC_OF_DSCP.get(dscp, 0), on_done, self.params.skb_bytes[stage],
                       window, ack_tc)

    def run(self) -> dict[str, Any]:
        for rank in (0, 1):
            self.q.push(self.arrivals[0], Priority.ARRIVAL, _Rank(self, rank).start, 0)
        if self.daemons:
            self.q.push(0.0, Priority.TIMER, self._tick)
        self.q.run()
        w, L = self.cfg.warmup, self.cfg.layers
        if len(self.done) != 2 * len(self.arrivals):
            raise RuntimeError(f"model ({self.mode}): {len(self.done)} of {2 * len(self.arrivals)} rank-requests ended")
        ttft = [max(self.done[(0, i)], self.done[(1, i)]) - a for i, a in enumerate(self.arrivals)][w:]
        cct = [c for req, c in self.cct if req >= w]
        out: dict[str, Any] = {"cct_mean": statistics.fmean(cct), "ttft_mean": statistics.fmean(ttft),
                               "cct_median": statistics.median(cct),
                               "slo_attainment": sum(t <= self.slo for t in ttft) / len(ttft), "slo_s": self.slo,
                               "compute_s": self.compute, "ttft_per_request": ttft,
                               "over_limit_frames": sum(p.over_limit for p in self.wire.ports),
                               "timeline_ms": {k: [round(1000 * statistics.median(
                                   self.timeline[(k, r, i)][j] for r in (0, 1) for i in range(w, len(self.arrivals))), 2)
                                   for j in range(L)] for k in ("read", "compute", "a2a", "acked")}}
        if self.daemons:
            out["permit_wait_ms_prefill"] = {str(s): 1000 * statistics.fmean(v) if v else 0.0
                                             for s, v in self.waits.items()}
            out["permit_dscp_prefill"] = dict(sorted(self.permit_dscp.items()))
            if self.trace:
                out["decisions"] = [dict(r, node=f"h{d.host}") for d in self.daemons if d.tracer
                                    for r in d.tracer.at_grant()]
                out["a2a_holds"] = [dict(r, node=f"h{d.host}") for d in self.daemons if d.tracer
                                    for r in d.tracer.holds()]
        assert len(cct) == 2 * L * (len(self.arrivals) - w)
        return out

    def _tick(self) -> None:
        # the daemons' loop: every counter interval, each port's byte counter, then a step
        for d in self.daemons or ():
            d.sample()
            d.step()
        if self.finished < 2 * len(self.arrivals):
            self.q.push(self.q.now + COUNTER_INTERVAL, Priority.TIMER, self._tick)


class _Daemon:
    """One host's daemon: the real DaemonCore, its inputs delayed as the ring and permit path delay them."""

    def __init__(self, m: _Model, host: int) -> None:
        self.m, self.host = m, host
        ports = (PortSpec("eth0", m.rate, counter="tx_bytes"),
                 PortSpec(RX_PORT, m.rate, counter="rx_bytes", window=RX_WINDOW))
        self.core = DaemonCore(CoreConfig(ports=ports, mfs=MfsConfig.from_mapping({}),
                                          window_bytes=m.cfg.window_bytes, spare_share=m.cfg.spare_share))
        self.waiting: dict[int, tuple[int, float, Callable[[int], None]]] = {}
        self.next_id = 1
        self.timers: set[float] = set()
        self.up, self.down = m.link(f"h{host}-up"), m.link(f"h{host}-down")
        self.tracer = DecisionTrace(self.core) if m.trace else None

    def sample(self) -> None:
        now = self.m.q.now
        self.core.port_counter("eth0", self.m.counter(self.up), now)
        self.core.port_counter(RX_PORT, self.m.counter(self.down), now)

    def step(self) -> None:
        q = self.m.q
        res = self.core.step(q.now)
        for p in res.permits:
            stage, t0, cb = self.waiting.pop(p.msg_id)
            half = self.m.params.permit_s[stage] / 2
            q.push(q.now + half, Priority.ARRIVAL, self._permitted, stage, t0, p.dscp, cb)
        if res.next_timer is not None and res.next_timer > q.now and res.next_timer not in self.timers:
            self.timers.add(res.next_timer)  # the policy's timer (stage-3 period), once per time
            q.push(res.next_timer, Priority.TIMER, self.step)

    def _permitted(self, stage: int, t0: float, dscp: int, cb: Callable[[int], None]) -> None:
        self.m.waits[stage].append(self.m.q.now - t0)
        key = f"s{stage}:{dscp}"
        self.m.permit_dscp[key] = self.m.permit_dscp.get(key, 0) + 1
        cb(dscp)

    def later(self, stage: int, fn: Callable[..., None], *args: Any) -> None:
        """``fn(*args)`` on the core half a permit latency from now (the shared-memory ring), then a step."""
        def run() -> None:
            fn(*args, self.m.q.now)
            self.step()
        self.m.q.push(self.m.q.now + self.m.params.permit_s[stage] / 2, Priority.ARRIVAL, run)

    def now(self, fn: Callable[..., None], *args: Any) -> None:
        """A hooks call (the worker waits for its answer): on the core at once."""
        fn(*args, self.m.q.now)
        self.step()

    def submit(self, port: str, request: int, stage: int, layer: int, nbytes: int, cb: Callable[[int], None]) -> int:
        msg = self.next_id
        self.next_id += 1
        self.waiting[msg] = (stage, self.m.q.now, cb)
        st = {1: Stage.REUSE, 2: Stage.COLLECTIVE, 3: Stage.P2D}[stage]
        self.later(stage, lambda now: self.core.submit(msg, str(request), st, layer, nbytes, now, port=port))
        return msg

    def complete(self, stage: int, msg: int) -> None:
        self.later(stage, lambda now: self.core.complete(msg, now))


class _Conn:
    """One TCP connection src -> dst (see the module doc): the worker's ``sendall`` and the shim's class switch.

    ``send`` is the worker's send of one message: its bytes go on the
    connection's byte stream (:class:`_Fifo`) after the stage's
    host overhead if the connection was idle, and ``on_sent`` (the worker's
    COMPLETION to its daemon) runs ``sendall_s`` later. A message in another
    class than the connection's previous one waits until the previous bytes
    are delivered, ``DRAIN_LIMIT`` at most (:func:`laxflow.adapters.sockets.wait_drained`),
    as the worker's ``_switch_class`` does; messages keep their order.
    """

    def __init__(self, m: _Model, src: int, dst: int, stage: int) -> None:
        self.m, self.src, self.dst, self.stage = m, src, dst, stage
        self.pending: deque[tuple[float, int, Callable[[], None], Callable[[], None] | None]] = deque()
        self.in_flight = 0  # messages handed to the egress queue, not yet delivered
        self.dscp: int | None = None
        self.blocked = False  # the head waits for a drain
        self.gen = 0
        self.fifo = _Fifo(m, stage)
        self.ready = 0.0  # when the last message sent reaches the byte stream

    def send(self, nbytes: float, dscp: int, on_done: Callable[[], None],
             on_sent: Callable[[], None] | None = None) -> None:
        self.pending.append((nbytes, dscp, on_done, on_sent))
        if len(self.pending) == 1 and not self.blocked:
            self._pump()

    def _pump(self) -> None:
        q = self.m.q
        while self.pending and not self.blocked:
            nbytes, dscp, on_done, on_sent = self.pending[0]
            if self.dscp is not None and dscp != self.dscp and self.in_flight:
                self.blocked = True  # wait_drained: until the earlier bytes are in, 20 ms at most
                self.gen += 1
                q.push(q.now + DRAIN_LIMIT, Priority.TIMER, self._unblock, self.gen)
                return
            self.pending.popleft()
            self.dscp = dscp
            idle = self.in_flight == 0
            self.in_flight += 1
            overhead = self.m.overhead(self.stage)
            delay = max(0.0, overhead) if idle else 0.0

            def delivered(on_done: Callable[[], None] = on_done) -> None:
                self.in_flight -= 1
                on_done()
                if self.blocked and not self.in_flight:
                    self._unblock(self.gen)

            self.ready = max(q.now + delay, self.ready)  # in order behind an earlier message's overhead
            q.push(self.ready, Priority.ARRIVAL, self.fifo.push,
                   _Msg(self.src, self.dst, nbytes, dscp, self.stage, delivered, idle, overhead))
            if on_sent is not None:
                q.push(q.now + self.m.params.sendall_s[self.stage], Priority.ARRIVAL, on_sent)

    def _unblock(self, gen: int) -> None:
        if self.blocked and gen == self.gen:
            self.blocked = False
            self._pump()


@dataclass
class _Msg:
    src: int
    dst: int
    nbytes: float
    dscp: int
    stage: int
    delivered: Callable[[], None]
    idle: bool  # its connection was idle when it was sent (an idle path may give it the fabric's burst)
    overhead: float  # the stage's overhead for this message (s, signed)


class _Fifo:
    """A connection's byte stream into its host's class queue: a message's frames join it when it is written.

    Frames of one connection stay in order because a connection uses one
    class at a time (the drain before a class switch, :class:`_Conn`) and a
    class queue is a FIFO. A message written onto an idle connection whose
    path is empty gets the stage's negative overhead, if any, at once.
    """

    def __init__(self, m: _Model, stage: int) -> None:
        self.m = m
        w = m.params.window_segments
        self.window = None if w is None else Window(w[stage])
        # the receiver's socket class: the rank's read side and the decode host ack in ack_dscp, the
        # all_to_all's receiver in stage 2's class (worker.prefill / scenario._run_job)
        ack = stage_dscp(m.mode)[2] if stage == 2 else ack_dscp(m.mode)
        self.ack_tc = TC_OF_DSCP.get(ack, 0)

    def push(self, msg: _Msg) -> None:
        m = self.m
        off = msg.overhead
        burst = -off * m.rate * GOODPUT if off < 0 and msg.idle and m.path_idle(msg.src, msg.dst) else 0.0
        m.start_flow(msg.src, msg.dst, msg.nbytes, msg.dscp, msg.stage, msg.delivered, instant=burst, window=self.window,
                     ack_tc=self.ack_tc)


class _Rank:
    """One prefill rank's worker (:func:`laxflow.testbed.worker.prefill`)."""

    def __init__(self, m: _Model, rank: int) -> None:
        self.m, self.rank = m, rank
        self.daemon = m.daemons[rank] if m.daemons else None
        self.acked: dict[int, int] = {}

    def start(self, req: int) -> None:
        m, L, d = self.m, self.m.cfg.layers, self.daemon
        rid, batch = 1000 + req, f"b{1000 + req}-r{self.rank}"
        self.req, self.batch, self.layer = req, batch, 0
        self.read_in = [False] * L
        self.computing = False
        if d is not None:
            deadline = m.arrivals[req] + m.slo if math.isfinite(m.slo) else None
            d.now(lambda now: d.core.register_request(str(rid), deadline, 1000, 1000))
            traffic = job_traffic({"layers": L, "kv_bytes": m.cfg.kv_bytes, "a2a_bytes": m.cfg.a2a_bytes,
                                   "reuse_bytes": m.cfg.reuse_bytes}, rid)  # as the testbed's ranks declare it
            d.now(lambda now: d.core.batch_formed(batch, [str(rid)], now, compute=L * m.cfg.compute_ms / 1000,
                                                  traffic=traffic))
        for layer in range(L):
            if d is None:
                self._ask(layer, m.static_dscp(1) if m.mode != "off" else 0, None)
            else:
                box: dict[str, int] = {}
                box["msg"] = d.submit(RX_PORT, rid, 1, layer, m.cfg.reuse_bytes,
                                      lambda dscp, j=layer, b=box: self._ask(j, dscp, b["msg"]))

    def _ask(self, layer: int, dscp: int, msg: int | None) -> None:
        req = self.req

        def arrived() -> None:
            self.m.mark("read", self.rank, req, layer)
            if msg is not None:
                self.daemon.complete(1, msg)
            self.read_in[layer] = True
            self._maybe_compute()

        m = self.m
        # the request crosses to the kvstore first, which then answers on the connection, in order
        m.note(self.rank, KVSTORE, KVREQ_BYTES,
               lambda: m.kv_conn[self.rank].send(m.cfg.reuse_bytes + KVRESP_BYTES, dscp, arrived))

    def _maybe_compute(self) -> None:
        j = self.layer
        if j < self.m.cfg.layers and self.read_in[j] and not self.computing:
            self.computing = True
            self.m.mark("compute", self.rank, self.req, j)
            if self.daemon is not None:
                self.daemon.later(2, self.daemon.core.layer_begin, self.batch, j)
            self.m.q.push(self.m.q.now + self.m.compute_time(), Priority.COMPUTE, self._computed, j)

    def _computed(self, j: int) -> None:
        m, d, rid = self.m, self.daemon, 1000 + self.req
        if d is not None and j == m.cfg.layers - 1:
            d.later(2, d.core.compute_done, self.batch)
        key = (self.req, j)
        s = m.a2a.setdefault(key, {"start": {}, "in": set(), "sent": set(), "closed": set(), "ranks": {}})
        s["start"][self.rank], s["ranks"][self.rank] = m.q.now, self
        if d is None:
            self._a2a_send(key, m.static_dscp(2) if m.mode != "off" else 0, None)
        else:
            box: dict[str, int] = {}
            box["msg"] = d.submit("eth0", rid, 2, j, m.cfg.a2a_bytes,
                                  lambda dscp, b=box: self._a2a_send(key, dscp, b["msg"]))

    def _a2a_send(self, key: tuple[int, int], dscp: int, msg: int | None) -> None:
        """This rank's half of the exchange. As the worker: a sender thread's ``sendall`` while the rank
        drains the peer's bytes; the rank's all_to_all ends once both are done (its own bytes may still
        be queued on the way to the peer)."""
        m, completion = self.m, self._completion(2, msg)

        def close() -> None:
            s = m.a2a[key]
            for r, rank in list(s["ranks"].items()):
                if r in s["sent"] and 1 - r in s["in"] and r not in s["closed"]:
                    s["closed"].add(r)
                    m.cct.append((key[0], m.q.now - s["start"][r]))
                    rank._layer_done(key[1])

        def delivered() -> None:  # this rank's bytes are in at the peer
            m.a2a[key]["in"].add(self.rank)
            close()

        def sent() -> None:  # this rank's sendall returned
            m.a2a[key]["sent"].add(self.rank)
            if completion is not None:
                completion()
            close()

        m.a2a_conn[self.rank].send(m.cfg.a2a_bytes, dscp, delivered, sent)

    def _completion(self, stage: int, msg: int | None) -> Callable[[], None] | None:
        """The worker's COMPLETION to its daemon once ``sendall`` returned (on), else nothing."""
        if msg is None:
            return None
        return lambda: self.daemon.complete(stage, msg)

    def _layer_done(self, j: int) -> None:
        m, d, req = self.m, self.daemon, self.req
        self.computing, self.layer = False, j + 1
        m.mark("a2a", self.rank, req, j)
        nbytes = m.cfg.kv_bytes + HDR_BYTES
        if d is None:
            self._write(req, j, m.static_dscp(3) if m.mode != "off" else 0, None)
        else:
            box: dict[str, int] = {}
            box["msg"] = d.submit("eth0", 1000 + req, 3, j, nbytes,
                                  lambda dscp, b=box: self._write(req, j, dscp, b["msg"]))
        if j + 1 < m.cfg.layers:
            self._maybe_compute()
        elif req + 1 < len(m.arrivals):
            m.q.push(max(m.q.now, m.arrivals[req + 1]), Priority.ARRIVAL, self.start, req + 1)

    def _write(self, req: int, j: int, dscp: int, msg: int | None) -> None:
        def acked() -> None:  # the decode host's acknowledgement is in at the rank
            self.m.mark("acked", self.rank, req, j)
            self.acked[req] = self.acked.get(req, 0) + 1
            if self.acked[req] == self.m.cfg.layers:
                self.m.done[(self.rank, req)] = self.m.q.now
                self.m.finished += 1
                if self.daemon is not None:
                    self.daemon.now(self.daemon.core.request_done, str(1000 + req))

        def delivered() -> None:  # the write's bytes are in at decode, which acknowledges them
            self.m.note(DECODE, self.rank, ACK_BYTES, acked)

        self.m.dec_conn[self.rank].send(self.m.cfg.kv_bytes + HDR_BYTES, dscp, delivered, self._completion(3, msg))


def predict(cfg: ScenarioConfig, mode: str, params: ModelParams | None = None, slo: float | None = None,
            trace: bool = False, seed: int | None = None) -> dict[str, Any]:
    """Run the scenario in ``mode`` (off, static, on); cct_mean, ttft_mean (s), slo_attainment, ...

    ``slo``: the TTFT SLO (s); None: ``slo_factor`` x the model's own
    low-load TTFT. The first ``cfg.warmup`` requests run and are left out.
    ``trace`` ("on"): the daemons' KV-write decisions at grant in ``decisions``
    (:mod:`laxflow.testbed.decision_trace`). ``seed``: each compute sleep and
    message overhead drawn from ``params``' measured samples (None: their means).
    """
    if mode not in MODES:
        raise ValueError(f"model: mode must be one of {', '.join(MODES)}, got {mode!r}")
    params = params or ModelParams()
    if slo is None:
        slo = cfg.slo_factor * low_load_ttft(cfg, params)
    return _Model(cfg, mode, params, slo, trace, seed).run()


def low_load_ttft(cfg: ScenarioConfig, params: ModelParams | None = None) -> float:
    """The model's TTFT at low load (off, requests far apart): the SLO base, as the testbed measures it."""
    return predict(cfg.low_load(warmup=0), "off", params, slo=math.inf)["ttft_mean"]


def predict_modes(cfg: ScenarioConfig, params: ModelParams | None = None, slo: float | None = None,
                  modes: tuple[str, ...] = ("off", "on")) -> dict[str, Any]:
    """Each mode, plus the ratios, as ``testbed run`` reports them (same SLO for all)."""
    if slo is None:
        slo = cfg.slo_factor * low_load_ttft(cfg, params)
    out: dict[str, Any] = {mode: predict(cfg, mode, params, slo) for mode in modes}
    out.update(cct_ratio=out["off"]["cct_mean"] / out["on"]["cct_mean"],
               ttft_ratio=out["off"]["ttft_mean"] / out["on"]["ttft_mean"])
    return out


def alone_s(cfg: ScenarioConfig, stage: int, skb_bytes: float = MSS, probe: bool = True) -> float:
    """The model's time for one stage-``stage`` message alone on the idle wire, as the calibration probes it.

    Stage 1: a read's bytes kvstore -> rank 0; stage 2: one all_to_all
    direction rank 0 -> rank 1; stage 3: a KV write rank 0 -> decode, in
    packets of ``skb_bytes``. With ``probe`` also the probe's small message
    (:mod:`laxflow.testbed.calibrate` times request -> last byte in for a
    read, first byte -> acknowledgement for the others): the read's request
    before its bytes, the receiver's acknowledgement after the message. The
    calibration's overhead is the measured time minus this.
    """
    src, dst, nbytes = {1: (KVSTORE, 0, cfg.reuse_bytes + KVRESP_BYTES), 2: (0, 1, cfg.a2a_bytes + HDR_BYTES),
                        3: (0, DECODE, cfg.kv_bytes + HDR_BYTES)}[stage]
    m = _Model(cfg, "off", ModelParams(skb_bytes={1: skb_bytes, 2: skb_bytes, 3: skb_bytes}), slo=math.inf)
    got: list[float] = []

    def done() -> None:
        got.append(m.q.now)

    def message() -> None:
        acked = (lambda: m.note(dst, src, ACK_BYTES, done)) if probe and stage != 1 else done
        m.start_flow(src, dst, nbytes, 0, stage, acked)

    if probe and stage == 1:
        m.note(dst, src, KVREQ_BYTES, message)
    else:
        message()
    m.q.run()
    return got[0]


__all__ = ["GOODPUT", "ModelParams", "alone_s", "low_load_ttft", "predict", "predict_modes"]
