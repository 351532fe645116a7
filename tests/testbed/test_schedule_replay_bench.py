"""bench/_schedule_replay.py: the policies ``bench/sim.py --split`` times.

Its split is only a measurement if the replayed schedule is the mfs run it
recorded, and fs keeping the link-load average is fs: checked here on a
small serving run, with the replay's own guard against leaving the
recorded run.
"""

from __future__ import annotations

import pytest

from bench_module import load_bench
from laxflow.policy.mfs.policy import NATIVE
from laxflow.sim.serving.config import ClusterConfig, ServingConfig
from laxflow.sim.serving.experiment import CAPACITY, RunSpec, build_workload
from laxflow.sim.serving.simulator import ServingSimulator

replay = load_bench("_schedule_replay")

native_only = pytest.mark.skipif(not NATIVE, reason="mfs's C core is not built")


def _run(policy):
    cfg = ServingConfig(model="mixtral-8x22b", cluster=ClusterConfig(servers=32), warmup=16)
    rate = 0.7 * CAPACITY[("mixtral-8x22b", "qwen-conv")]
    reqs = build_workload(RunSpec(cfg, "qwen-conv", rate, "fs", 48, seed=0))
    sim = ServingSimulator(cfg, reqs, policy)
    res = sim.run()
    return sim, (res.network_events, [s.ttft for s in res.states], res.stage_bytes_delivered)


@native_only
def test_the_replayed_schedule_is_the_recorded_mfs_run():
    recording = replay.RecordingMfs()
    _, recorded = _run(recording)
    _, plain = _run("mfs")
    assert recorded == plain  # recording changes nothing
    assert any(timer is not None for _, timer in recording.decisions)  # (the run has mfs's timers to replay)
    replayed_policy = replay.ReplayedSchedule(recording)
    sim, replayed = _run(replayed_policy)
    assert replayed == recorded
    assert replayed_policy.complete and replayed_policy.replayed == len(recording.decisions)
    assert replayed_policy.copy_s > 0
    assert sim.network.link_load is not None  # kept, as for mfs


class _Watched:
    """A policy's decide calls, seen: whether each snapshot was incremental, and the Decisions (kept alive,
    so that two distinct ones never share an id)."""

    def __init__(self, policy):
        self.incremental: list[bool] = []
        self.decisions: list = []
        decide = policy.decide

        def watched(snap):
            decision = decide(snap)
            self.incremental.append(snap.tag is not None)
            self.decisions.append(decision)
            return decision

        policy.decide = watched

    def handed_out_again(self) -> float:
        """The share of calls whose Decision object had been handed out before."""
        seen, again = set(), 0
        for d in self.decisions:
            again += id(d) in seen
            seen.add(id(d))
        return again / len(self.decisions)


@native_only
def test_the_replay_takes_the_engine_path_mfs_takes():
    """Incremental snapshots in, and the same Decision objects handed out again (one per flow count), as
    mfs's C core does: else the engine checks and converts a new decision's arrays at every event, and
    the split counts that work, which mfs's run does not do, as the schedule's."""
    recording = replay.RecordingMfs()
    mfs_seen = _Watched(recording)
    _run(recording)
    replayed_policy = replay.ReplayedSchedule(recording)
    seen = _Watched(replayed_policy)
    _run(replayed_policy)
    assert all(mfs_seen.incremental) and all(seen.incremental)
    assert mfs_seen.handed_out_again() > 0.5  # (what the replay must match)
    assert seen.handed_out_again() > 0.5


@native_only
def test_a_replay_that_leaves_the_recorded_run_raises():
    recording = replay.RecordingMfs()
    _run(recording)
    short = replay.RecordingMfs()
    short.tape, short.decisions = recording.tape, recording.decisions[:-1]
    with pytest.raises(RuntimeError, match="the recording holds"):
        _run(replay.ReplayedSchedule(short))
    other = replay.RecordingMfs()
    k = len(recording.decisions) // 2
    n, timer = recording.decisions[k]
    other.tape, other.decisions = recording.tape, [*recording.decisions[:k], (n + 1, timer), *recording.decisions[k + 1:]]
    with pytest.raises(RuntimeError, match=f"decision {k} is over {n} flows, the recorded one over {n + 1}"):
        _run(replay.ReplayedSchedule(other))


def test_fs_keeping_the_link_load_is_fs():
    sim, kept = _run(replay.FsKeepingLinkLoad())
    _, plain = _run("fs")
    assert kept == plain
    assert sim.network.link_load is not None
    assert sim.network.link_load.max() > 0  # the average was kept, not left at 0
