"""Network topologies for the flow-level engine.

A :class:`Topology` is a table of directed links (ids and capacities) plus,
for NIC-based topologies, a deterministic router from NIC to NIC. The engine
only ever sees link indices; the serving simulator and the scenario loader use
``path`` and ``usage`` to turn transfers into a flow's sparse usage vector.

Three families (and bare links for scenario files):

* :func:`big_switch` — non-blocking: each NIC has an egress port (NIC to
  switch) and an ingress port (switch to NIC); a route is those two links.
* :func:`leaf_spine` — two tiers: NICs under leaves, every leaf connected to
  every spine. A leaf's uplinks add up to its NICs' capacity divided by the
  oversubscription. Cross-leaf routes pick one spine by a deterministic hash
  of (src, dst) (ECMP), so a run is the same on every machine.
* :func:`mfs_testbed` — the MFS testbed: servers with several NICs under one
  non-blocking ToR.

Units: capacities in bytes/s.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np


class Topology:
    """A set of directed links, optionally with NICs and a router.

    Built once per simulation by one of the factories below (or
    :meth:`from_links` for scenario files) and read by the engine and the
    workload generators; never mutated after construction.
    """

    def __init__(self, link_ids: Sequence[str], capacity: Sequence[float] | np.ndarray, num_nics: int = 0) -> None:
        self.link_ids: list[str] = list(link_ids)
        self.capacity: np.ndarray = np.asarray(capacity, dtype=np.float64).copy()
        if self.capacity.shape != (len(self.link_ids),):
            raise ValueError("topology: one capacity per link id is required")
        if not np.all(np.isfinite(self.capacity)) or np.any(self.capacity <= 0):
            raise ValueError("topology: link capacities must be finite and > 0")
        self._index: dict[str, int] = {}
        for i, link_id in enumerate(self.link_ids):
            if link_id in self._index:
                raise ValueError(f"topology: duplicate link id {link_id!r}")
            self._index[link_id] = i
        self.num_nics = int(num_nics)

    # -- links -----------------------------------------------------------------

    @classmethod
    def from_links(cls, ids: Sequence[str], capacity: Sequence[float]) -> "Topology":
        """Bare links with no NICs (scenario files name links directly)."""
        return cls(ids, capacity, num_nics=0)

    @property
    def num_links(self) -> int:
        return len(self.link_ids)

    def index(self, link_id: str) -> int:
        """Position of ``link_id`` in the link table (KeyError if unknown)."""
        return self._index[link_id]

    def __contains__(self, link_id: object) -> bool:
        return link_id in self._index

    # -- NICs and routes ------------------------------------------------------------

    def egress(self, nic: int) -> int:
        """Link index of the NIC's uplink (out of the NIC)."""
        self._check_nic(nic)
        return 2 * int(nic)

    def ingress(self, nic: int) -> int:
        """Link index of the NIC's downlink (into the NIC)."""
        self._check_nic(nic)
        return 2 * int(nic) + 1

    def _check_nic(self, nic: int) -> None:
        if not 0 <= int(nic) < self.num_nics:
            raise ValueError(f"NIC {nic} out of range (topology has {self.num_nics} NICs)")

    def path(self, src_nic: int, dst_nic: int) -> np.ndarray:
        """Link indices of the route from ``src_nic`` to ``dst_nic`` (empty if equal)."""
        self._check_nic(src_nic)
        self._check_nic(dst_nic)
        _, links = self.route_many(np.array([src_nic], dtype=np.int64), np.array([dst_nic], dtype=np.int64))
        return links

    def route_many(self, src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Routes of many (src, dst) pairs at once.

        Returns ``(pair, link)``: entry k says pair ``pair[k]`` crosses link
        ``link[k]``; a pair's links appear in path order. Subclasses with NICs
        override this; bare-link topologies have no router.
        """
        raise ValueError("this topology has no NICs: name links directly")

    def usage(self, traffic: Mapping[tuple[int, int], float]) -> tuple[np.ndarray, np.ndarray, float]:
        """Sparse usage vector of a flow group from a src->dst byte matrix.

        ``weight(link) = bytes crossing link / total bytes``. Pairs with
        src == dst cross no link but count towards the total, so the flow's
        size is ``total_bytes``; alone on the network the group then takes
        max over links of (bytes on link / capacity), with or without them.
        Called by workload builders once per collective. Returns
        ``(links, weights, total_bytes)`` with links sorted ascending.
        """
        if not traffic:
            raise ValueError("usage: empty traffic matrix")
        keys = list(traffic.keys())
        src = np.fromiter((k[0] for k in keys), dtype=np.int64, count=len(keys))
        dst = np.fromiter((k[1] for k in keys), dtype=np.int64, count=len(keys))
        size = np.fromiter(traffic.values(), dtype=np.float64, count=len(keys))
        if np.any(size < 0) or not np.all(np.isfinite(size)):
            raise ValueError("usage: traffic bytes must be finite and >= 0")
        if np.any((src < 0) | (src >= self.num_nics) | (dst < 0) | (dst >= self.num_nics)):
            raise ValueError(f"usage: NIC out of range (topology has {self.num_nics} NICs)")
        total = float(size.sum())
        if total <= 0:
            raise ValueError("usage: traffic matrix moves no bytes")
        pair, link = self.route_many(src, dst)
        per_link = np.bincount(link, weights=size[pair], minlength=self.num_links)
        links = np.flatnonzero(per_link > 0)
        return links.astype(np.int64), per_link[links] / total, total


def _ecmp_hash(src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """A fixed 64-bit mix of (src, dst) (splitmix64 finalizer): same on every run."""
    x = (src.astype(np.uint64) << np.uint64(32)) ^ dst.astype(np.uint64)
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        x = x ^ (x >> np.uint64(31))
    return x


class BigSwitch(Topology):
    """Non-blocking switch: a route is the source's egress and the destination's ingress."""

    def route_many(self, src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        src = np.asarray(src, dtype=np.int64)
        dst = np.asarray(dst, dtype=np.int64)
        pair = np.flatnonzero(src != dst)
        links = np.stack([2 * src[pair], 2 * dst[pair] + 1], axis=1).ravel()
        return np.repeat(pair, 2), links


class LeafSpine(Topology):
    """Two-tier leaf-spine. Link layout: 2*num_nics host links, then per leaf
    and spine an uplink (leaf to spine) and a downlink (spine to leaf)."""

    def __init__(self, num_nics: int, nics_per_leaf: int, capacity: float, oversubscription: float, num_spines: int):
        self.nics_per_leaf = nics_per_leaf
        self.num_leaves = -(-num_nics // nics_per_leaf)
        self.num_spines = num_spines
        spine_capacity = nics_per_leaf * capacity / (oversubscription * num_spines)
        ids = [f"nic{n}.{d}" for n in range(num_nics) for d in ("out", "in")]
        caps = [capacity] * (2 * num_nics)
        for leaf in range(self.num_leaves):
            for spine in range(num_spines):
                ids += [f"leaf{leaf}>spine{spine}", f"spine{spine}>leaf{leaf}"]
                caps += [spine_capacity, spine_capacity]
        super().__init__(ids, caps, num_nics=num_nics)

    def uplink(self, leaf: int, spine: int) -> int:
        return 2 * self.num_nics + 2 * (leaf * self.num_spines + spine)

    def downlink(self, spine: int, leaf: int) -> int:
        return self.uplink(leaf, spine) + 1

    def spine_of(self, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
        """The ECMP choice for each (src, dst) pair."""
        return (_ecmp_hash(src, dst) % np.uint64(self.num_spines)).astype(np.int64)

    def route_many(self, src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        src = np.asarray(src, dtype=np.int64)
        dst = np.asarray(dst, dtype=np.int64)
        leaf_s, leaf_d = src // self.nics_per_leaf, dst // self.nics_per_leaf
        local = np.flatnonzero((src != dst) & (leaf_s == leaf_d))
        remote = np.flatnonzero(leaf_s != leaf_d)
        spine = self.spine_of(src[remote], dst[remote])
        base = 2 * self.num_nics
        local_links = np.stack([2 * src[local], 2 * dst[local] + 1], axis=1)
        remote_links = np.stack(
            [
                2 * src[remote],
                base + 2 * (leaf_s[remote] * self.num_spines + spine),
                base + 2 * (leaf_d[remote] * self.num_spines + spine) + 1,
                2 * dst[remote] + 1,
            ],
            axis=1,
        )
        pair = np.concatenate([np.repeat(local, 2), np.repeat(remote, 4)])
        links = np.concatenate([local_links.ravel(), remote_links.ravel()])
        order = np.argsort(pair, kind="stable")  # group each pair's links, path order kept
        return pair[order], links[order]


def big_switch(num_nics: int, capacity: float) -> BigSwitch:
    """Non-blocking switch with ``num_nics`` NICs, each port ``capacity`` bytes/s."""
    _positive_int("num_nics", num_nics)
    return BigSwitch([f"nic{n}.{d}" for n in range(num_nics) for d in ("out", "in")], [capacity] * (2 * num_nics), num_nics)


def leaf_spine(
    num_nics: int,
    nics_per_leaf: int,
    capacity: float,
    oversubscription: float = 1.0,
    num_spines: int | None = None,
) -> LeafSpine:
    """Two-tier leaf-spine (fat-tree) with ECMP by a deterministic hash of (src, dst).

    ``capacity`` is each NIC's port speed (bytes/s); every leaf has
    ``num_spines`` uplinks (default ``nics_per_leaf``) whose total is the
    leaf's NIC capacity divided by ``oversubscription`` (1.0: non-blocking).
    """
    _positive_int("num_nics", num_nics)
    _positive_int("nics_per_leaf", nics_per_leaf)
    if not (np.isfinite(oversubscription) and oversubscription > 0):
        raise ValueError(f"leaf_spine: oversubscription must be > 0 (got {oversubscription!r})")
    spines = nics_per_leaf if num_spines is None else num_spines
    _positive_int("num_spines", spines)
    return LeafSpine(num_nics, nics_per_leaf, capacity, oversubscription, spines)


class MfsTestbed(BigSwitch):
    """Servers with several NICs each under one non-blocking ToR.

    NIC ``s * nics_per_server + j`` is NIC j of server s; link ids name both.
    """

    def __init__(self, servers: int, nics_per_server: int, capacity: float) -> None:
        self.servers = servers
        self.nics_per_server = nics_per_server
        ids = [f"s{s}n{j}.{d}" for s in range(servers) for j in range(nics_per_server) for d in ("out", "in")]
        super().__init__(ids, [capacity] * len(ids), servers * nics_per_server)

    def nic(self, server: int, index: int) -> int:
        if not (0 <= server < self.servers and 0 <= index < self.nics_per_server):
            raise ValueError(f"no NIC {index} on server {server}")
        return server * self.nics_per_server + index

    def server_of(self, nic: int) -> int:
        self._check_nic(nic)
        return int(nic) // self.nics_per_server


def mfs_testbed(servers: int, nics_per_server: int, capacity: float) -> MfsTestbed:
    """The MFS testbed: ``servers`` servers with ``nics_per_server`` NICs each under one ToR."""
    _positive_int("servers", servers)
    _positive_int("nics_per_server", nics_per_server)
    return MfsTestbed(servers, nics_per_server, capacity)


def _positive_int(name: str, value: int) -> None:
    if int(value) != value or value < 1:
        raise ValueError(f"{name} must be a positive integer (got {value!r})")
