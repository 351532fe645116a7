"""One policy code path: the daemon core gives every message the level the simulator's MFS gave it.

A small ``laxflow sim serve`` run (Mixtral-8x7B on 4 servers, KV reuse from a
remote unit, collectives, per-layer P2D with deadlines, compute end and the
stage-3 period) runs with the simulator's MFS wrapped in a recorder; its flow
events are then replayed through :class:`~laxflow.daemon.core.DaemonCore`.
"""

from __future__ import annotations

from collections import Counter

from sim_replay import RecordingPolicy, replay

from laxflow.policy.config import MfsConfig
from laxflow.policy.mfs import MfsPolicy
from laxflow.sim.serving.config import ClusterConfig, ServingConfig
from laxflow.sim.serving.simulator import ServingSimulator
from laxflow.sim.workload import Request

BLOCK = 16
PREFIX = tuple(range(1000, 1064))


def _request(i, arrival, tokens, prefix=()):
    blocks = -(-tokens // BLOCK)
    own = [hash(("own", i, b)) & ((1 << 62) - 1) for b in range(blocks - len(prefix))]
    return Request(id=f"r{i}", arrival=arrival, input_tokens=tokens, output_tokens=1,
                   block_hashes=tuple(prefix) + tuple(own), block_size=BLOCK)


def _record(mfs_config):
    config = ServingConfig(model="mixtral-8x7b", cluster=ClusterConfig(servers=8, gpus_per_server=4, topology="big-switch"), warmup=0)
    # r0 caches PREFIX on unit 0, r1 keeps unit 0 busy, r2 and r4 reuse the prefix from unit 1; the rest overlap.
    requests = [_request(0, 0.0, 64 * BLOCK, PREFIX), _request(1, 0.05, 8000), _request(2, 0.05, 74 * BLOCK, PREFIX),
                _request(3, 0.051, 3000), _request(4, 0.052, 70 * BLOCK, PREFIX), _request(5, 0.053, 9000),
                _request(6, 0.054, 1500), _request(7, 0.055, 4000)]
    sim = ServingSimulator(config, requests, "fs")  # only to build the topology; the run below uses the recorder
    topo = sim.cluster.topology
    policy = RecordingPolicy(MfsPolicy(mfs_config), topo.link_ids, topo.capacity)
    ServingSimulator(config, requests, policy).run()
    return policy.rec


def test_replay_gives_the_simulators_level_to_every_message_at_every_instant():
    mfs_config = MfsConfig(period=2e-3)
    rec = _record(mfs_config)
    core, rows = replay(rec, mfs_config)
    assert len(rec.facts) > 500 and len(rows) > 3000  # a real run, not a toy
    stages = Counter(f.stage.value for f in rec.facts.values())
    assert set(stages) == {"reuse", "collective", "p2d"}
    levels = Counter(q for _, _, q, _ in rows)
    assert len(levels) >= 4  # MLU and RLI levels both in play
    seen: dict[str, set[int]] = {}
    for _, fid, q, _ in rows:
        seen.setdefault(fid, set()).add(q)
    assert sum(len(v) > 1 for v in seen.values()) > 0  # promotions happened during the run
    mismatches = [r for r in rows if r[2] != r[3]]
    assert not mismatches, mismatches[:10]
    assert not core.messages  # every message completed


def test_replay_without_the_link_load_differs():
    """The check has teeth: a daemon that did not measure its ports' load would get MLU levels wrong."""
    import sim_replay

    mfs_config = MfsConfig(period=2e-3)
    rec = _record(mfs_config)
    real = sim_replay._counters
    sim_replay._counters = lambda core, link_bytes, now: None
    try:
        _, rows = replay(rec, mfs_config)
    finally:
        sim_replay._counters = real
    assert any(r[2] != r[3] for r in rows)
