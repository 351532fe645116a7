"""RMLQ level -> DSCP codepoint -> switch traffic class.

The node daemon tags each flow's packets with the DSCP of its RMLQ level (the
shim writes it into ``grh.traffic_class`` for RoCE, ``IP_TOS`` for TCP); the
switches trust DSCP and map it to a strict-priority queue. The testbed's
switch and NIC configuration is generated from :meth:`DscpMap.rows`, so this
table is the one source of truth.

Default for K levels (K <= 16), chosen to sit beside a RoCE fabric's own
classes without touching them:

=============  ==============  ====  ===========================================
level          DSCP            TC    why
=============  ==============  ====  ===========================================
0 (top)        32 + K - 1      5     reserved: the most urgent explicit-deadline
1 .. K-1       32 + K - 1 - l  4..1  RLI / MLU levels: level l on TC 5 - l,
                                     capped at TC 1
scavenger      8 (CS1)         0     pruned requests: served when idle
=============  ==============  ====  ===========================================

For K = 8 that is levels 0..7 -> DSCP 39..32, TCs (5, 4, 3, 2, 1, 1, 1, 1).
Five queues hold eight levels, so some levels must share one. MFS §4.5 maps
RLI onto the physical queues "by capping the RLI value at K - 1": the most
urgent levels keep a queue each, and the loosest share the lowest. This
matters on the wire. With level 1 (RLI 0: a collective, a read its layer
waits for) and level 2 (RLI 1, a P2D write MLU finds moderately urgent) on
one TC, as an even fold once had it, a strict-priority switch shares the
collective's queue fairly with those writes. On the testbed the all_to_all
then ran 2-5 ms (10-25 %) slower than with the queues kept apart.
DSCP 48 (CNP, TC 6) and DSCP 26 (the default lossless RoCE class, TC 3) are
never used for a level: congestion notifications keep their own
highest-priority queue, and RDMA traffic laxflow does not manage keeps its
usual class. Levels share TC 3 with that class, which is lossless, so enable
PFC on every TC this map uses for RDMA traffic. A switch with fewer queues
can fold further; the DSCP codepoints stay distinct per level so hosts and
packet captures can still tell levels apart.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

CNP_DSCP = 48  # RoCE congestion notification packets (DCQCN), TC 6
LOSSLESS_DSCP = 26  # the usual lossless RoCE data class, TC 3
RESERVED_DSCP = {CNP_DSCP: "CNP", LOSSLESS_DSCP: "default lossless RoCE"}
MAX_LEVELS = 16


@dataclass(frozen=True)
class DscpMap:
    """DSCP and traffic class of each RMLQ level and of the scavenger class."""

    level_dscp: tuple[int, ...]  # index = level (0 = top)
    level_tc: tuple[int, ...]
    scavenger_dscp: int = 8
    scavenger_tc: int = 0

    def __post_init__(self) -> None:
        if len(self.level_dscp) != len(self.level_tc) or not self.level_dscp:
            raise ValueError("dscp map: level_dscp and level_tc must be non-empty and of equal length (one per level)")
        codes = list(self.level_dscp) + [self.scavenger_dscp]
        for code in codes:
            if not 0 <= code <= 63:
                raise ValueError(f"dscp map: DSCP {code} out of range (expected 0..63)")
            if code in RESERVED_DSCP:
                raise ValueError(f"dscp map: DSCP {code} is reserved for {RESERVED_DSCP[code]} (choose another codepoint)")
        if len(set(codes)) != len(codes):
            raise ValueError("dscp map: every level and the scavenger class need distinct DSCP codepoints")
        for tc in list(self.level_tc) + [self.scavenger_tc]:
            if not 0 <= tc <= 7 or tc == 6:
                raise ValueError(f"dscp map: traffic class {tc} invalid (expected 0..7, not 6 which CNP uses)")

    @property
    def levels(self) -> int:
        return len(self.level_dscp)

    @cached_property
    def codes(self) -> np.ndarray:
        """DSCP per queue as uint8, index ``levels`` = scavenger: ``codes[queue]`` tags a whole decision."""
        out = np.array(self.level_dscp + (self.scavenger_dscp,), dtype=np.uint8)
        out.flags.writeable = False
        return out

    def dscp(self, level: int) -> int:
        """DSCP of RMLQ ``level``; ``level == levels`` is the scavenger class."""
        return self.scavenger_dscp if level >= self.levels else self.level_dscp[level]

    def tos(self, level: int) -> int:
        """The IPv4 TOS / RoCE GRH traffic_class byte (DSCP << 2, ECN bits 0)."""
        return self.dscp(level) << 2

    def rows(self) -> list[dict[str, Any]]:
        out = []
        for level, (code, tc) in enumerate(zip(self.level_dscp, self.level_tc)):
            meaning = "top: most urgent explicit-deadline flows" if level == 0 else f"RMLQ level {level}"
            out.append({"level": str(level), "dscp": code, "tc": tc, "meaning": meaning})
        out.append({"level": "scavenger", "dscp": self.scavenger_dscp, "tc": self.scavenger_tc, "meaning": "pruned requests"})
        for code, what in sorted(RESERVED_DSCP.items()):
            out.append({"level": "reserved", "dscp": code, "tc": 6 if code == CNP_DSCP else 3, "meaning": what})
        return out

    def as_json(self) -> dict[str, Any]:
        return {
            "levels": list(self.level_dscp),
            "level_tc": list(self.level_tc),
            "scavenger": self.scavenger_dscp,
            "scavenger_tc": self.scavenger_tc,
            "reserved": {str(k): v for k, v in sorted(RESERVED_DSCP.items())},
        }


def default_dscp_map(levels: int = 8) -> DscpMap:
    """The documented default for ``levels`` RMLQ levels (2..16)."""
    if not 2 <= levels <= MAX_LEVELS:
        raise ValueError(f"dscp map: levels must be in 2..{MAX_LEVELS} for the default map, got {levels}")
    dscp = tuple(32 + levels - 1 - lv for lv in range(levels))
    # One queue per level from the top (level 0 on TC 5), the loosest levels capped onto TC 1 (MFS §4.5).
    tc = tuple(max(5 - lv, 1) for lv in range(levels))
    return DscpMap(level_dscp=dscp, level_tc=tc)
