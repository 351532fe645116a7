"""The testbed's wire in the simulator model: packets through the fabric's own queues.

Used by :mod:`laxflow.testbed.sim_model` (one :class:`Wire` per model run,
on its event queue, single-threaded). It moves bytes the way the testbed's
qdiscs do, as measured on the fabric (``tc -s qdisc`` and ``ss -ti``
during the scenario: no drops; a whole 150-250 KB message sits in a host's
class queue at once, and the switch port toward the decode host holds a
124-140 KB median backlog of KV writes in "static"; veth and the bridge
carry GSO super-packets, tens of KB each, which HTB sends whole):

- every host egress (``hN-up``, the host's ``eth0`` tree) and every switch
  egress (``hN-down``, switch port ``pN``) is an HTB tree at the line rate
  (:func:`laxflow.testbed.fabric.priority_tree`): one FIFO per traffic
  class (the pfifo leaves), served in strict priority (higher TC first),
  packet by packet, never pre-empting a packet already sent; a packet is a
  GSO super-packet of the measured mean size (``ModelParams.skb_bytes``);
- the line rate is a token bucket of the tree's ``burst`` bytes (read from
  the fabric's own tc lines): a packet goes when the bucket is not in debt,
  then costs its segments' frames (66 bytes of Ethernet, IP and
  TCP-with-timestamps headers each), so an idle port lets its first ~15 KB
  and the packet that crosses it through at once, then the debt paces the
  rest at the line rate; veth and the bridge add no time, so a packet
  reaches the switch port the moment its host lets it go;
- a message's packets all join the sender's class queue when it is written
  (measured: a whole message sits in the host queue; the TCP window, 190-300
  segments per connection, bounded only the KV store's backlog), and it is
  delivered when its last packet leaves the switch port toward the receiver;
- the pfifo limit (``queue_packets``, 1000 frames: 1.5 MB) was never
  reached on the testbed (0 drops); the model counts any frame that finds
  its queue at the limit (``Port.over_limit``, in the model's output).

ACKs: the receiver acknowledges each delivered packet (GRO takes a GSO
packet in whole) with a 66-byte packet in its socket's class, back through
its host's and the sender's switch port queues; it frees the sender's
window when it arrives, so an ACK queued behind data (one class, "off")
slows a window-bound sender, as on the testbed.

Counters: each port's cumulative bytes as the hosts' veth ``tx_bytes`` and
``rx_bytes`` count them (a packet's payload and its headers once, ACKs
included).
"""

from __future__ import annotations

import math
import re
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from laxflow.policy.dscp import default_dscp_map
from laxflow.sim.events import EventQueue, Priority
from laxflow.testbed.fabric import FabricConfig, TRAFFIC_CLASSES, priority_tree, tc_of_dscp

MSS, HEADERS = 1448, 66  # TCP payload per frame (timestamps on) and the frame's headers
ACK_FRAME = 66  # a delayed ACK: one per two segments, back along the reverse path
GOODPUT = MSS / (MSS + HEADERS)  # payload share of the line rate (HTB charges every segment's headers)
TC_OF_DSCP = tc_of_dscp(default_dscp_map(8))
QUEUE_PACKETS = FabricConfig.__dataclass_fields__["queue_packets"].default


def htb_burst(rate_bps: int) -> int:
    """The bytes an idle HTB tree of the fabric lets through at once (its ``burst``), from its own tc lines."""
    lines = priority_tree("x", rate_bps, default_dscp_map(8), QUEUE_PACKETS)
    return int(re.search(r" burst (\d+) ", lines[1]).group(1))  # the root class 1:1, which every leaf borrows from


class Window:
    """One TCP connection's congestion window: at most ``segments`` of its segments between its socket and
    their ACK; the rest wait in the socket buffer and go as ACKs come back."""

    def __init__(self, segments: float) -> None:
        self.segments = segments
        self.inflight = 0
        self.waiting: deque[tuple["Message", float, int]] = deque()


@dataclass
class Message:
    """One message's packets on their way src -> dst; ``on_done`` runs when its last packet is delivered."""

    src: int
    dst: int
    frames: int
    on_done: Callable[[], None]
    hops: tuple["Port", "Port"] = field(default=None)  # type: ignore[assignment]
    window: Window | None = None
    ack_tc: int = 0  # the receiver's ACKs' traffic class (its socket's)


@dataclass
class Ack:
    """The receiver's ACK of one delivered packet: back dst -> src; frees ``segments`` of the sender's window."""

    segments: int
    window: Window | None
    hops: tuple["Port", "Port"]


class Port:
    """One egress port: an HTB tree at line rate, strict priority by TC, a FIFO of frames per TC."""

    def __init__(self, wire: "Wire", index: int, rate: float, burst: float) -> None:
        self.wire, self.index, self.rate, self.burst = wire, index, rate, burst
        self.tokens, self.t = float(burst), 0.0  # bucket level (bytes) at time t
        self.queues: list[deque[tuple[Message, float]]] = [deque() for _ in TRAFFIC_CLASSES]
        self.waiting = False  # a wake-up is scheduled (the bucket is in debt and frames wait)
        self.tx = 0.0  # bytes the veth counted (its headers once per packet, as tx_bytes / rx_bytes do)
        self.over_limit = 0  # frames that found their class queue at the pfifo limit

    def put(self, msg: Message, payloads: list[float], tc: int) -> None:
        """Packets of ``msg`` join class ``tc``'s FIFO (payload bytes each)."""
        q = self.queues[tc]
        # pfifo would drop packets beyond its limit (the testbed never did); counted, reported, kept
        self.over_limit += max(0, len(q) + len(payloads) - QUEUE_PACKETS)
        q.extend((msg, p) for p in payloads)
        if not self.waiting:
            self._serve()

    def busy(self) -> bool:
        return self.waiting or any(self.queues)

    def _serve(self) -> None:
        now = self.wire.q.now
        self.tokens = min(self.burst, self.tokens + (now - self.t) * self.rate)
        self.t = now
        while True:
            tc = next((c for c in range(len(self.queues) - 1, -1, -1) if self.queues[c]), None)
            if tc is None:
                self.waiting = False
                return
            if self.tokens < -1e-6:  # in debt (beyond float dust: a wake-up at the refill time must send)
                self.waiting = True
                self.wire.q.push(now - self.tokens / self.rate, Priority.COMPLETION, self._serve)
                return
            msg, payload = self.queues[tc].popleft()
            self.tokens -= payload + HEADERS * max(1, math.ceil(payload / MSS))  # HTB charges every segment's headers
            self.tx += payload + HEADERS
            self.wire.forward(self, msg, payload, tc)


class Wire:
    """The fabric's ports: ``link(f"h{n}-up")`` and ``link(f"h{n}-down")``; messages in, deliveries out."""

    def __init__(self, q: EventQueue, hosts: int, rate: float, burst: float) -> None:
        self.q = q
        self.names = [f"h{h}-{d}" for d in ("up", "down") for h in range(hosts)]
        self.ports = [Port(self, i, rate, burst) for i in range(len(self.names))]
        self.instant = [0.0] * len(self.names)  # bytes the model delivered at once (a negative overhead)

    def link(self, name: str) -> int:
        return self.names.index(name)

    def send(self, src: int, dst: int, nbytes: float, tc: int, on_done: Callable[[], None],
             skb: float = MSS, window: Window | None = None, ack_tc: int = 0) -> None:
        """``nbytes`` of payload src -> dst in traffic class ``tc``, in packets of ``skb`` payload bytes
        (whole segments: a GSO super-packet, or one frame); they join src's queue now, or, on a connection
        with a ``window``, as its window lets them."""
        size = MSS * max(1, round(skb / MSS))
        full, rest = divmod(nbytes, size)
        payloads = [float(size)] * int(full) + ([rest] if rest > 0 else [])
        if not payloads:
            on_done()
            return
        up, down = self.ports[self.link(f"h{src}-up")], self.ports[self.link(f"h{dst}-down")]
        msg = Message(src, dst, len(payloads), on_done, (up, down), window, ack_tc)
        if window is None:
            up.put(msg, payloads, tc)
            return
        window.waiting.extend((msg, p, tc) for p in payloads)
        self._release(window)

    def _release(self, w: Window) -> None:
        while w.waiting:
            msg, payload, tc = w.waiting[0]
            segs = math.ceil(payload / MSS)
            if w.inflight and w.inflight + segs > w.segments:
                return
            w.waiting.popleft()
            w.inflight += segs
            msg.hops[0].put(msg, [payload], tc)

    def forward(self, port: Port, msg: Message | Ack, payload: float, tc: int) -> None:
        """A packet left ``port``: at the switch port next, or delivered (data: the receiver ACKs it)."""
        if port is msg.hops[0]:
            msg.hops[1].put(msg, [payload], tc)
            return
        if isinstance(msg, Ack):
            if msg.window is not None:
                msg.window.inflight -= msg.segments
                self._release(msg.window)
            return
        back = (self.ports[self.link(f"h{msg.dst}-up")], self.ports[self.link(f"h{msg.src}-down")])
        back[0].put(Ack(math.ceil(payload / MSS), msg.window, back), [0.0], msg.ack_tc)
        msg.frames -= 1
        if msg.frames == 0:
            msg.on_done()

    def deliver_at_once(self, src: int, dst: int, nbytes: float) -> None:
        """Count bytes the model hands over at once (an idle path's measured burst) on both paths' counters."""
        for name in (f"h{src}-up", f"h{dst}-down"):
            self.instant[self.link(name)] += nbytes
        for name in (f"h{dst}-up", f"h{src}-down"):
            self.instant[self.link(name)] += nbytes / (2 * MSS) * ACK_FRAME

    def counter(self, link: int) -> float:
        """The port's cumulative bytes (its data and ACK packets, any burst), as the veth counts them."""
        return self.ports[link].tx + self.instant[link]

    def idle(self, src: int, dst: int) -> bool:
        """Whether both ports a message src -> dst crosses are empty."""
        return not (self.ports[self.link(f"h{src}-up")].busy() or self.ports[self.link(f"h{dst}-down")].busy())
