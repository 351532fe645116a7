"""Typed configuration of the ``mfs`` policy.

Built once by whoever creates the policy (the simulator from CLI flags or a
scenario, the daemon from its config file) and validated here, with messages
that name the field and the valid range. Nothing else reads environment
variables or files for these values.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, Mapping

from laxflow.errors import UserError
from laxflow.policy.dscp import MAX_LEVELS, DscpMap, default_dscp_map


@dataclass(frozen=True)
class MfsConfig:
    """MFS knobs (paper defaults).

    ``levels`` K: RMLQ levels, level 0 the reserved top (see ``mfs/policy.py``).
    ``E``, ``U``: MLU thresholds Q_j = U * E**-j (E > 1, 0 < U <= 1).
    ``period``: seconds between stage-3 promotions once a request's compute
    has ended (§4.5); before that, promotion happens at layer boundaries.
    ``drop_budget``: how many new requests one run of Algorithm 1 may prune
    when the policy orders batches itself (no coordinator). Default 0: alone,
    the policy only sees live flows' bytes and ``downstream`` times, too crude
    to doom a request (on Table 1 a budget of 2 prunes the collective B: C's
    bytes, counted first in RED order with no overlap, leave B no room). The
    coordinator, which knows compute profiles and whole traffic matrices,
    prunes and hands the result over with ``MfsPolicy.set_order``.
    ``load_window``: time constant (s) of the policy's moving average of
    explicit-deadline traffic per link, subtracted from the measured link
    load to get MLU's rho. It must equal ``Snapshot.load_window``, the window
    of whoever measures link load (the engine's or the daemon's; all default
    to 10 ms), so the two averages cancel exactly: ``decide`` refuses a
    snapshot with another window.
    ``dscp``: level -> DSCP map; ``None`` means the default for ``levels``.
    """

    levels: int = 8
    E: float = 4.0
    U: float = 0.5
    period: float = 1e-3
    drop_budget: int = 0
    load_window: float = 0.01
    dscp: DscpMap | None = None

    def __post_init__(self) -> None:
        if isinstance(self.levels, bool) or not isinstance(self.levels, int) or not 2 <= self.levels <= MAX_LEVELS:
            raise UserError(f"mfs config: levels must be an integer in 2..{MAX_LEVELS}, got {self.levels!r}")
        if not _finite(self.E) or self.E <= 1:
            raise UserError(f"mfs config: E must be a number > 1 (threshold ratio), got {self.E!r}")
        if not _finite(self.U) or not 0 < self.U <= 1:
            raise UserError(f"mfs config: U must be a number in (0, 1] (top MLU threshold), got {self.U!r}")
        if not _finite(self.period) or self.period <= 0:
            raise UserError(f"mfs config: period must be a number of seconds > 0, got {self.period!r}")
        if not _finite(self.load_window) or self.load_window <= 0:
            raise UserError(f"mfs config: load_window must be a number of seconds > 0, got {self.load_window!r}")
        if isinstance(self.drop_budget, bool) or not isinstance(self.drop_budget, int) or self.drop_budget < 0:
            raise UserError(f"mfs config: drop_budget must be an integer >= 0, got {self.drop_budget!r}")
        if self.dscp is not None and self.dscp.levels != self.levels:
            raise UserError(f"mfs config: dscp map has {self.dscp.levels} levels but levels = {self.levels}")

    @property
    def dscp_map(self) -> DscpMap:
        return self.dscp if self.dscp is not None else default_dscp_map(self.levels)

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> "MfsConfig":
        """From keyword options (``create_policy('mfs', period=0.01)``, a config file)."""
        names = {f.name for f in fields(cls)}
        for key in values:
            if key not in names:
                raise UserError(f"mfs config: unknown option {key!r} (expected one of {', '.join(sorted(names))})")
        kw = dict(values)
        if isinstance(kw.get("dscp"), Mapping):
            raw = kw["dscp"]
            try:
                kw["dscp"] = DscpMap(
                    level_dscp=tuple(raw["levels"]),
                    level_tc=tuple(raw["level_tc"]),
                    scavenger_dscp=int(raw.get("scavenger", 8)),
                    scavenger_tc=int(raw.get("scavenger_tc", 0)),
                )
            except (KeyError, TypeError, ValueError) as exc:
                raise UserError(f"mfs config: dscp must have 'levels' and 'level_tc' lists of codepoints ({exc})") from None
        return cls(**kw)


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
