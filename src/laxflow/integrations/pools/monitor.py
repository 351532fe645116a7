"""Arrow's instance monitor over token intervals (paper 002 §5.2, Insight 3).

One ``TokenIntervalMonitor`` per instance. The instance (simulator instance
or engine step hook, on its own thread) calls ``record(t)`` at the end of
every step that emitted decode tokens and ``idle()`` when it has no decode
left, so an idle gap is not counted as a slow token. The monitor's
``average()`` fills ``PoolInstance.avg_token_interval`` in each report.
"""

from __future__ import annotations

from collections import deque


class TokenIntervalMonitor:
    """Mean gap between consecutive token-emitting steps over the last ``window`` gaps."""

    def __init__(self, window: int = 32) -> None:
        if not (isinstance(window, int) and window >= 1):
            raise ValueError(f"TokenIntervalMonitor.window: must be an integer >= 1, got {window!r}")
        self.gaps: deque[float] = deque(maxlen=window)
        self.last: float | None = None

    def record(self, t: float) -> None:
        if self.last is not None:
            if t < self.last:
                raise ValueError(f"token time {t} is before the previous one {self.last}")
            self.gaps.append(t - self.last)
        self.last = t

    def idle(self) -> None:
        self.last = None

    def average(self) -> float:
        return sum(self.gaps) / len(self.gaps) if self.gaps else 0.0
