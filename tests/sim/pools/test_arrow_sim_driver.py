"""The pool driver on hand-checked small clusters: profiles, snapshots, flips, settling, the monitor.

The engine here is a minimal stand-in with the attributes the driver reads
(documented in ``pools_driver``); the end-to-end runs on the real
iteration-level engine are in ``test_arrow_sim_engine.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from laxflow.errors import UserError
from laxflow.integrations.pools import Pool, PoolMove
from laxflow.integrations.prefill.sarathi import Sarathi
from laxflow.sim.serving.pools_driver import (
    PoolsConfig,
    attach_pools,
    max_running_tokens,
    ttft_profile,
)


class LinearTimer:
    """0.01 s + 0.1 ms per new token + 1 us per context token, per step."""

    def seconds(self, entries):
        return 0.01 + 1e-4 * sum(n for n, _ in entries) + 1e-6 * sum(c for _, c in entries)


@dataclass
class StubSeq:
    id: str
    prompt: int
    computed: int = 0
    outputs: int = 0
    arrival: float = 0.0
    ttft_slo: float = 1.0
    tpot_slo: float = 0.1
    prefill_instance: str | None = None

    @property
    def prompt_tokens(self) -> int:
        return self.prompt

    @property
    def is_prefill(self) -> bool:
        return self.computed < self.prompt


@dataclass
class StubInstance:
    id: str
    role: str
    kv_capacity: int = 100_000
    seqs: dict = field(default_factory=dict)
    schedulers: dict = field(default_factory=lambda: {"prefill": Sarathi()})

    def decoding(self) -> int:
        return sum(1 for s in self.seqs.values() if not s.is_prefill)


class StubEngine:
    def __init__(self, n: int, seqs: list[StubSeq]) -> None:
        self.instances = {f"i{k}": StubInstance(f"i{k}", "colocated") for k in range(n)}
        self.timer = LinearTimer()
        self.seqs = seqs
        self.dispatcher = None
        self.role_log: list[tuple[str, str]] = []

    def set_role(self, iid: str, role: str) -> None:
        self.instances[iid].role = role
        self.role_log.append((iid, role))

    def hold(self, iid: str, *seqs: StubSeq) -> None:
        for s in seqs:
            self.instances[iid].seqs[s.id] = s


def engine4(prompt: int = 2048) -> StubEngine:
    return StubEngine(4, [StubSeq("w", prompt)])


def test_profiles_time_the_local_schedulers_chunks():
    e = engine4()
    # 1024 tokens under Sarathi's 512-token budget: two chunks, the second reading 512 cached tokens.
    samples = dict(ttft_profile(e, Sarathi(), 1024, points=3))
    assert samples[1024.0] == pytest.approx((0.01 + 0.0512) + (0.01 + 0.0512 + 0.000512))
    assert samples[512.0] == pytest.approx(0.01 + 0.0512)
    # Decode step of b sequences of 1024 tokens: 0.01 + b * (1e-4 + 1.024e-3) <= 0.1 -> b = 80.
    assert max_running_tokens(e, 1_000_000, 0.1) == 80 * 1024
    assert max_running_tokens(e, 50_000, 0.1) == 50_000  # the KV cache is the tighter bound


def test_attach_sets_pools_and_roles():
    e = engine4()
    d = attach_pools(e, "arrow", 2)
    assert e.dispatcher is d
    assert d.table.pools == {"i0": Pool.PREFILL, "i1": Pool.PREFILL, "i2": Pool.DECODE, "i3": Pool.DECODE}
    assert [i.role for i in e.instances.values()] == ["prefill", "prefill", "decode", "decode"]
    assert d.manager.config.max_running_tokens == 80 * 1024
    with pytest.raises(UserError, match="--pools arrow: needs at least one prefill and one decode"):
        attach_pools(engine4(), "arrow", 4)
    with pytest.raises(UserError, match="--pools elastic: unknown pool manager 'elastic'"):
        attach_pools(engine4(), "elastic", 2)
    with pytest.raises(UserError, match="--pools arrow: ArrowConfig.low_decode_load"):
        attach_pools(engine4(), "arrow", 2, {"low_decode_load": 3.0})
    with pytest.raises(UserError, match="monitor_period"):
        PoolsConfig(monitor_period=0)


def test_snapshot_counts_predicted_work_and_decode_load():
    e = engine4()
    d = attach_pools(e, "arrow", 2)
    e.hold("i0", StubSeq("a", 1024, computed=512), StubSeq("b", 512))
    e.hold("i2", StubSeq("c", 100, computed=100, outputs=5), StubSeq("e", 300, computed=300, outputs=1))
    snap = d.snapshot(e)
    p = snap.get("i0")
    assert p.queued_prefill_tokens == (1024, 512) and p.prefill_elapsed == pytest.approx(d.predictor(512))
    # Left to run: all of b, and a's predicted 1024-token time less its first chunk's.
    assert d.manager.prefill_delay(p) == pytest.approx(d.predictor(1024) + d.predictor(512) - d.predictor(512))
    dec = snap.get("i2")
    assert (dec.running_tokens, dec.decoding, dec.avg_token_interval) == (105 + 301, 2, 0.0)


def test_prefill_flip_reaches_the_engine_and_settles_when_drained():
    e = engine4()
    d = attach_pools(e, "arrow", 2)
    # Both P instances hold a 2048-token prompt (~0.43 s predicted); a new 2048-token request with a
    # 0.5 s TTFT SLO fits on neither, decode load is low: Algorithm 3 flips the D instance with the
    # fewest running tokens (i3, idle -> straight to P) and sends the prefill there.
    e.hold("i0", StubSeq("q0", 2048))
    e.hold("i1", StubSeq("q1", 2048))
    e.hold("i2", StubSeq("c", 100, computed=100, outputs=3))
    new = StubSeq("r", 2048, ttft_slo=0.5)
    assert d.prefill_target(e, new, 0.0) == "i3"
    assert d.table.pools["i3"] is Pool.PREFILL and e.instances["i3"].role == "prefill"
    assert d.table.flips == [(0.0, PoolMove("i3", Pool.DECODE, Pool.PREFILL))]
    # Algorithm 3 keeps one decode-capable instance: i2 stays, the prefill falls back to t1.
    assert d.prefill_target(e, StubSeq("r2", 2048, ttft_slo=0.5), 0.0) in ("i0", "i1", "i3")
    assert d.table.pools["i2"] is Pool.DECODE
    # Decode dispatch with no D instance fitting flips a P one (Algorithm 4, least prefill delay).
    e.instances["i2"].seqs["c"].outputs = 200_000  # over Max Running Tokens
    done = StubSeq("q0", 2048, computed=2048, outputs=1, prefill_instance="i0")
    target = d.decode_target(e, done, 0.1)
    assert d.table.pools[target] in (Pool.P_TO_D, Pool.DECODE) and e.instances[target].role == "decode"
    # A P->D instance settles to D at the end of the step that drained its prefills.
    e.instances[target].seqs.clear()
    e.instances[target].seqs["x"] = StubSeq("x", 10, computed=10, outputs=1)
    d.next_rebalance = 99.0
    d.after_step(e, e.instances[target], 0.2)
    assert d.table.pools[target] is Pool.DECODE


def test_monitor_and_periodic_rebalance():
    e = engine4()
    d = attach_pools(e, "arrow", 2, config=PoolsConfig(monitor_period=1.0))
    dec = e.instances["i2"]
    e.hold("i2", StubSeq("c", 100, computed=100, outputs=3))
    e.hold("i0", StubSeq("p", 100))
    d.next_rebalance = 0.9
    for t in (0.0, 0.3, 0.6):  # token gaps of 0.3 s on the only decode instance, over the 0.1 s TPOT
        d.after_step(e, dec, t)
    assert d.snapshot(e).get("i2").avg_token_interval == pytest.approx(0.3)
    assert d.table.flips == []  # not yet the monitor's time
    d.after_step(e, dec, 0.9)  # rebalance: the decode pool is slow -> Algorithm 4 flips a P instance
    assert d.rebalances == 1 and len(d.table.flips) == 1
    flip = d.table.flips[0][1]
    assert flip.src is Pool.PREFILL and flip.instance == "i1"  # i1 holds nothing: least prefill delay
    assert flip.dst is Pool.DECODE and e.instances["i1"].role == "decode"
    assert d.next_rebalance == pytest.approx(1.9)
    # Without decodes left the instance idles: the next gap is not measured from the last token.
    dec.seqs.clear()
    d.after_step(e, dec, 1.0)
    assert d.snapshot(e).get("i2").avg_token_interval == 0.0  # nothing decoding: no interval reported
    dec.seqs["c2"] = StubSeq("c2", 100, computed=100, outputs=1)
    d.after_step(e, dec, 1.5)
    assert d.monitors["i2"].average() == pytest.approx(0.3)  # no 0.9..1.5 gap was added
    assert d.stats()["pool_flips"] == 1 and d.stats()["pools_end"]["D"] == 3


def test_static_managers_keep_their_pools():
    for name in ("static-pd", "round-robin"):
        e = engine4()
        d = attach_pools(e, name, 2)
        e.hold("i0", StubSeq("q0", 2048))
        e.hold("i1", StubSeq("q1", 2048))
        assert d.prefill_target(e, StubSeq("r", 2048, ttft_slo=0.01), 0.0) in ("i0", "i1")
        assert d.decode_target(e, StubSeq("r", 2048, computed=2048, outputs=1, prefill_instance="i0"), 0.1) \
            in ("i2", "i3")
        d.after_step(e, e.instances["i2"], 5.0)
        assert d.table.flips == [] and e.role_log == [("i0", "prefill"), ("i1", "prefill"),
                                                      ("i2", "decode"), ("i3", "decode")]
