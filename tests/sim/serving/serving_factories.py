"""Small factories for the serving-simulator tests: requests, configs, one-shot runs."""

from __future__ import annotations

import hashlib
from typing import Sequence

from laxflow.sim.serving.config import ClusterConfig, ServingConfig
from laxflow.sim.serving.simulator import ServingSimulator, SimResult
from laxflow.sim.workload import Request

BLOCK = 16


def create_request(i: int, arrival: float, tokens: int, prefix: Sequence[int] = (), salt: int = 0) -> Request:
    """A request whose first blocks are ``prefix`` and whose other blocks are unique to it."""
    blocks = -(-tokens // BLOCK)
    own = [_stable_hash("own", salt, i, b) for b in range(blocks - len(prefix))]
    return Request(id=f"r{i}", arrival=arrival, input_tokens=tokens, output_tokens=1,
                   block_hashes=tuple(prefix) + tuple(own), block_size=BLOCK)


def _stable_hash(*parts: object) -> int:
    """A block hash that is the same in every process (Python's hash() of a tuple is salted per process)."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 62) - 1)


def create_config(model: str = "mixtral-8x7b", servers: int = 2, **kw) -> ServingConfig:
    cluster_kw = {k: kw.pop(k) for k in list(kw) if k in ClusterConfig.__dataclass_fields__}
    cluster_kw.setdefault("topology", "big-switch")
    return ServingConfig(model=model, cluster=ClusterConfig(servers=servers, **cluster_kw), warmup=kw.pop("warmup", 0), **kw)


def run(config: ServingConfig, requests: Sequence[Request], policy: str = "fs") -> tuple[ServingSimulator, SimResult]:
    sim = ServingSimulator(config, requests, policy)
    return sim, sim.run()
