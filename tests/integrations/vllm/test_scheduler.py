"""laxflow's scheduler classes inside a real vLLM 0.32.0 v1 Scheduler (CPU, no model weights)."""

import time

from laxflow.hooks.api import Hooks
from vllm_harness import make_request, make_scheduler, step

from laxflow.integrations.vllm.hooks import HooksLink
from laxflow.integrations.vllm.scheduler import FairBatchingScheduler, FlowPrefillScheduler, SlideBatchingScheduler


class RecordingHooks(Hooks):
    """The hooks interface as the daemon would answer it, with a settable pruned set."""

    def __init__(self):
        self.calls = []
        self.pruned_set = set()

    def register_request(self, request, deadline, prompt_tokens, reused_tokens=0, priority=0):
        self.calls.append(("register_request", request, deadline, prompt_tokens, priority))

    def batch_formed(self, batch, requests, compute_s=0.0, traffic=None):
        self.calls.append(("batch_formed", batch, tuple(requests)))

    def layer_begin(self, batch, layer):
        self.calls.append(("layer_begin", batch, layer))

    def layer_end(self, batch, layer, last=False):
        self.calls.append(("layer_end", batch, layer, last))

    def message_submit(self, msg_id, request, stage, layer, nbytes, port="", downstream=0.0):
        self.calls.append(("message_submit", msg_id, request, stage, layer))

    def wait_permit(self, msg_id, timeout_s=1.0):
        return None

    def message_progress(self, msg_id, bytes_done):
        pass

    def message_complete(self, msg_id):
        self.calls.append(("message_complete", msg_id))

    def request_done(self, request):
        self.calls.append(("request_done", request))

    def pruned(self):
        return set(self.pruned_set)

    def subscribe_pruned(self, callback):
        pass

    def dispatch_advice(self, request, instances):
        return []


def scheduled(out):
    return dict(out.num_scheduled_tokens)


def test_no_slo_means_vllm_behaviour(tmp_path):
    from vllm.v1.core.sched.scheduler import Scheduler

    runs = []
    for cls in (Scheduler, FlowPrefillScheduler, FairBatchingScheduler, SlideBatchingScheduler):
        s = make_scheduler(tmp_path, cls, max_num_batched_tokens=256)
        now = time.time()
        for i, n in enumerate((300, 40, 120, 500, 8)):
            s.add_request(make_request(f"r{i}", n, max_tokens=3, arrival=now + i * 1e-3))
        trace = []
        while s.has_requests():
            trace.append(scheduled(step(s)))
        runs.append(trace)
    assert len(runs[0]) > 3
    assert runs[1] == runs[0] and runs[2] == runs[0] and runs[3] == runs[0]


def test_tight_slo_admitted_ahead_of_earlier_loose_ones(tmp_path):
    from vllm.v1.core.sched.scheduler import Scheduler

    firsts = {}
    for cls in (Scheduler, FlowPrefillScheduler):
        s = make_scheduler(tmp_path, cls, max_num_batched_tokens=256)
        now = time.time()
        for i in range(3):
            s.add_request(make_request(f"loose{i}", 200, arrival=now - 1.0 + i * 0.01,
                                       extra_args={"ttft_slo_ms": 20000}))
        s.add_request(make_request("tight", 200, arrival=now, extra_args={"ttft_slo_ms": 500}))
        firsts[cls.__name__] = scheduled(step(s))
    assert list(firsts["Scheduler"]) == ["loose0", "loose1"]  # vLLM: FCFS, budget split over two
    # FlowPrefill: the tight request first; Algorithm 1 adds no loose one (200 + 200 > 256-token budget)
    assert firsts["FlowPrefillScheduler"] == {"tight": 200}


def test_running_prefill_sits_out_a_step_for_a_tighter_request(tmp_path):
    s = make_scheduler(tmp_path, FlowPrefillScheduler, max_num_batched_tokens=128)
    s.add_request(make_request("long", 1000, extra_args={"ttft_slo_ms": 60000}))
    assert scheduled(step(s)) == {"long": 128}
    s.add_request(make_request("tight", 100, extra_args={"ttft_slo_ms": 300}))
    out = step(s)
    assert "long" not in out.num_scheduled_tokens and out.num_scheduled_tokens["tight"] == 100
    assert s.laxflow_stats["step_preemptions"] == 1
    # the preempted prefill resumes where it stopped, once the tight one is done prefilling
    out = step(s)
    assert out.num_scheduled_tokens["long"] > 0 and s.requests["long"].num_computed_tokens > 128


def test_priority_from_extra_args(tmp_path):
    s = make_scheduler(tmp_path, FlowPrefillScheduler, max_num_batched_tokens=100)
    now = time.time()
    s.add_request(make_request("low", 100, arrival=now - 1, extra_args={"priority": 5}))
    s.add_request(make_request("mid", 100, arrival=now - 0.5, extra_args={"priority": "1"}))
    s.add_request(make_request("high", 100, arrival=now, extra_args={"priority": -3}))
    admitted = []
    for _ in range(4):
        admitted += [r.req_id for r in step(s).scheduled_new_reqs]
    assert admitted == ["high", "mid", "low"]  # vLLM's convention: lower value first


def test_bad_extra_args_ignored_with_one_warning(tmp_path, caplog):
    s = make_scheduler(tmp_path, FlowPrefillScheduler)
    s.add_request(make_request("bad", 10, extra_args={"ttft_slo_ms": "soon"}))
    assert scheduled(step(s)) == {"bad": 10}
    assert s.laxflow_stats["bad_extra_args"] == 1
    assert any("ttft_slo_ms" in r.getMessage() and "soon" in r.getMessage() for r in caplog.records)


def test_pruned_request_deferred_and_lifecycle_reported(tmp_path):
    s = make_scheduler(tmp_path, FlowPrefillScheduler, max_num_batched_tokens=256)
    hooks = RecordingHooks()
    s.laxflow_hooks = HooksLink(hooks)
    hooks.pruned_set = {"victim"}
    s.add_request(make_request("victim", 50, extra_args={"ttft_slo_ms": 100}))
    s.add_request(make_request("other", 50, extra_args={"ttft_slo_ms": 5000}))
    for _ in range(3):
        out = step(s)
        assert "victim" not in out.num_scheduled_tokens
    assert s.requests["victim"].num_computed_tokens == 0 and s.laxflow_stats["pruned_deferrals"] == 3
    hooks.pruned_set = set()
    assert step(s).num_scheduled_tokens["victim"] == 50
    names = [c[0] for c in hooks.calls]
    assert names.count("register_request") == 2
    reg = {c[1]: c for c in hooks.calls if c[0] == "register_request"}
    assert abs(reg["victim"][2] - (s.requests["victim"].arrival_time + 0.1)) < 1e-9 and reg["victim"][3] == 50
    assert ("batch_formed", f"step-{s.current_step}", ("victim",)) in hooks.calls
    assert ("request_done", "other") in hooks.calls and ("request_done", "victim") in hooks.calls


def test_no_daemon_skips_and_counts(tmp_path):
    s = make_scheduler(tmp_path, FlowPrefillScheduler)
    assert s.laxflow_hooks.hooks is None
    s.add_request(make_request("a", 10))
    step(s)
    assert s.laxflow_hooks.skipped["register_request"] == 1 and s.laxflow_hooks.skipped["request_done"] == 1


def test_fairbatching_sizes_the_step_by_its_time_budget(tmp_path):
    s = make_scheduler(tmp_path, FairBatchingScheduler, max_num_batched_tokens=2048)
    now = time.time()
    for i in range(4):  # decoding requests with a tight TPOT
        s.add_request(make_request(f"d{i}", 16, max_tokens=50, arrival=now - 1,
                                   extra_args={"ttft_slo_ms": 1000, "tpot_slo_ms": 30}))
    step(s)
    s.add_request(make_request("big", 1800, arrival=now, extra_args={"ttft_slo_ms": 5000, "tpot_slo_ms": 100}))
    out = step(s)
    batch = s.last_batch
    assert batch is not None and out.total_num_scheduled_tokens == batch.tokens
    assert set(out.num_scheduled_tokens) == set(batch.ids)
    # the time budget (min TPOT 30 ms under the default latency model) caps the prefill chunk well below
    # vLLM's 2048-token budget, and every decode still gets its token
    assert batch.time_budget <= 0.03 + 1e-9 and out.total_num_scheduled_tokens < 1800
    assert all(out.num_scheduled_tokens[f"d{i}"] == 1 for i in range(4))
    assert batch.predicted_seconds <= batch.time_budget + 1e-9


def run_to_completion(s, limit=400):
    trace = []
    while s.has_requests() and len(trace) < limit:
        out = step(s)
        trace.append((out, s.last_batch))
    assert not s.has_requests(), "every request finishes"
    return trace


def test_slidebatching_steps_follow_its_batches_to_completion(tmp_path, monkeypatch):
    monkeypatch.setenv("LAXFLOW_VLLM_BATCH_OPTIONS", '{"setting": "colocated", "gamma": 1.5}')
    s = make_scheduler(tmp_path, SlideBatchingScheduler, max_num_batched_tokens=1024)
    assert s.policy.config.gamma == 1.5
    now = time.time()
    for i, (n, ttft, tpot) in enumerate(((600, 3000, 100), (64, 300, 40), (300, 1000, 60), (32, 200, 30))):
        s.add_request(make_request(f"r{i}", n, max_tokens=5, arrival=now + i * 1e-3,
                                   extra_args={"ttft_slo_ms": ttft, "tpot_slo_ms": tpot}))
    trace = run_to_completion(s)
    for out, batch in trace:
        if out.total_num_scheduled_tokens:
            assert set(out.num_scheduled_tokens) <= set(batch.ids)
            assert out.total_num_scheduled_tokens <= batch.tokens
    # the tight short request's prefill is admitted in the first step, ahead of the earlier 600-token one
    first = trace[0][0]
    assert "r3" in first.num_scheduled_tokens and "r1" in first.num_scheduled_tokens
