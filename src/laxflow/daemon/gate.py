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

Spare capacity (:func:`spare_grants`): the host's software queues are
strict priority and, like any priority queue, work-conserving: a lower class
sends whenever the higher ones leave the port idle. A granted message's
bytes may wait elsewhere -- a KV write to a decode port that other senders
share moves at its share there, and a transport that reports a write done
only once it is acknowledged holds its bytes "unfinished" after the last one
left -- and then the rule above would hold everything below it while this
port idles. So the core also watches the port's own byte counter: when at
least ``spare_share`` of the line rate went unused in every counter
interval of a stretch since the port's last grant -- 2 ms, and no shorter
than a 64 KiB super-packet takes at the line rate, which a NIC counts at
once (``CoreConfig.spare_quiet``, ``spare_burst``) -- and the rule above
grants nothing, the highest-ranked waiting messages go (one rank at a time:
the next waits for the counter to show spare capacity again with them
sending). Ports without a counter never grant this way. The rule trusts
the counter to count bytes as they leave; a counter refreshed only every
few hundred ms would look quiet all the time (``spare_share: null`` there).
"""

from __future__ import annotations

from typing import Sequence


def grants(rank: Sequence[int], remaining: Sequence[float], waiting: Sequence[bool], window: float) -> list[bool]:
    """Which messages of one port to grant now.

    ``rank``: host order per live message of the port (smaller goes first);
    ``remaining``: unfinished bytes per message; ``waiting``: True where the
    message has no permit yet. Returns one flag per message (a subset of
    ``waiting``). Plain Python: a port rarely holds more than a few dozen
    live messages, where this beats array set-up.
    """
    n = len(rank)
    out = [False] * n
    if not any(waiting):
        return out
    order = sorted(range(n), key=rank.__getitem__)
    ahead = 0.0  # unfinished bytes of strictly higher ranks
    group_bytes = 0.0
    current = None
    for i in order:
        if rank[i] != current:
            ahead += group_bytes
            group_bytes = 0.0
            current = rank[i]
            if ahead > 0.0 and ahead >= window:
                break  # this rank and every lower one waits
        group_bytes += remaining[i]
        if waiting[i]:
            out[i] = True
    return out


def spare_grants(rank: Sequence[int], waiting: Sequence[bool]) -> list[bool]:
    """The spare-capacity grant: the waiting messages of the highest waiting rank."""
    top = min((r for r, w in zip(rank, waiting) if w), default=None)
    return [w and r == top for r, w in zip(rank, waiting)]
