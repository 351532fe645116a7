"""The permit rule: which waiting messages of one NIC port may go now.

Called by :class:`~laxflow.daemon.core.DaemonCore` after every decision, once
per port, on the daemon's loop thread. Pure.

The rule (MFS §5, the host's software strict priority):

    A message waiting on port p is granted when the unfinished bytes of the
    messages on p that rank above it -- granted or not -- are below the
    port's work-conserving window W (default one bandwidth-delay product).
    With nothing above it unfinished it is always granted.

"Rank above" is the policy's host order (``Decision.level``: RMLQ level,
then RLI, then the RED rank of the batch), so two batches at the same RMLQ
level go in RED order. Messages of equal rank never hold each other back
(they share the port max-min fair, as in the simulator's engine). W lets a
lower rank start while the last W bytes of the higher ones drain, so the
port does not idle for one completion round-trip; W = 0 is strict priority
without overlap. Unfinished bytes are the message size minus the bytes its
completions (or progress reports) have accounted for.
"""

from __future__ import annotations

import numpy as np


def grants(rank: np.ndarray, remaining: np.ndarray, waiting: np.ndarray, window: float) -> np.ndarray:
    """Which messages of one port to grant now.

    ``rank``: host order per live message of the port (smaller goes first);
    ``remaining``: unfinished bytes per message; ``waiting``: True where the
    message has no permit yet. Returns a boolean mask (subset of ``waiting``).
    """
    n = rank.size
    out = np.zeros(n, dtype=bool)
    if n == 0 or not waiting.any():
        return out
    order = np.argsort(rank, kind="stable")
    r = rank[order]
    rem = remaining[order]
    # Bytes of strictly higher ranks ahead of each message: the cumulative sum
    # up to the start of its rank group.
    start = np.searchsorted(r, r, side="left")
    before = np.concatenate([[0.0], np.cumsum(rem)])[start]
    ok = (before <= 0.0) | (before < window)
    out[order] = ok & waiting[order]
    return out
