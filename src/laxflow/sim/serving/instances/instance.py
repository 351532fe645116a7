"""One serving instance of the iteration-level simulator: its sequences, KV memory and steps.

Owned by :class:`.engine.InstanceEngine` (one thread, the event loop). Each
instance loops steps: ``begin_step(now)`` asks its batch scheduler for the
next ``IterationBatch`` over ``SequenceView`` s of the sequences it holds and
returns the step's seconds; ``end_step(now)`` applies the batch (prefill chunks
and decode tokens, each emitting token at the step's end) and returns the
sequences whose prefill completed and those that finished.

KV memory: an instance holds ``kv_capacity`` tokens. A sequence holds the KV
of what it computed (prompt chunks, then its fed-back outputs). The scheduler
may add at most the free tokens. When the decodes cannot all get their next
token's slot, or a step would be empty for lack of memory, the instance
preempts the most recently arrived sequence holding KV (vLLM's recompute
preemption): its KV is freed and it prefills again over prompt + outputs so
far (``folded_outputs``), keeping its next token's index and deadline.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from laxflow.errors import UserError
from laxflow.integrations.prefill.iteration import BatchScheduler, IterationBatch, SequenceView
from laxflow.sim.events import EventQueue, Priority

ROLES = ("colocated", "prefill", "decode")
IDLE_POLL = 1e-3  # s: a scheduler that deferred everything is asked again after this


def check_kv_fits(request_id: str, prompt: int, outputs: int, kv_capacity: int, holder: str,
                  deployment: str, way_out: str = "") -> None:
    """Raise UserError unless a request of ``prompt`` + ``outputs`` tokens fits ``holder``'s KV memory, before
    a run starts (a request that can never fit would otherwise wait forever); ``way_out`` ends the message."""
    if prompt + outputs > kv_capacity:
        raise UserError(f"request {request_id}: {prompt} prompt + {outputs} output tokens exceed {holder}'s KV "
                        f"memory ({kv_capacity} tokens of {deployment})" + (f"; {way_out}" if way_out else ""))


@dataclass
class Seq:
    """A request's progress (mutable; the engine's only copy)."""

    id: str
    arrival: float
    prompt: int
    target_outputs: int  # output tokens it will emit (the trace's output length, >= 1)
    ttft_slo: float
    tpot_slo: float
    weight: float = 1.0
    computed: int = 0  # of prompt + folded
    outputs: int = 0
    folded: int = 0  # outputs recomputed into the prompt after a preemption
    preemptions: int = 0
    # When the user sees each output token. The first is emitted at the end of the prompt's last prefill
    # step (prefill_end); a disaggregated request's rides with its KV and is seen when the last P2D byte
    # lands on the decode instance (kv_landed; the engine moves token_times[0] there).
    token_times: list[float] = field(default_factory=list)
    prefill_end: float | None = None
    kv_landed: float | None = None
    prefill_instance: str | None = None
    decode_instance: str | None = None  # the router's decode choice (disaggregated)
    rejected: bool = False  # refused at arrival by admission control (fairbatching-pab): never served
    # Per-layer P2D (config.p2d "layer", layers.py): the decode instance its KV leaves for (asked at its first
    # layered chunk), the KV tokens already sent (or on their way), its flows not landed yet (count, and the
    # network's live ones by id(flow)). Reset when the KV has landed; p2d_sent also by a recompute preemption.
    p2d_target: str | None = None
    p2d_sent: int = 0
    p2d_pending: int = 0
    p2d_live: dict = field(default_factory=dict)

    @property
    def prompt_tokens(self) -> int:
        return self.prompt + self.folded

    @property
    def is_prefill(self) -> bool:
        return self.computed < self.prompt_tokens

    @property
    def kv_tokens(self) -> int:
        """KV tokens held: computed prompt, plus outputs fed back (the newest token has no KV yet)."""
        if self.is_prefill:
            return self.computed
        return self.prompt_tokens + self.outputs - self.folded - 1

    @property
    def done(self) -> bool:
        return self.rejected or self.outputs >= self.target_outputs

    def view(self) -> SequenceView:
        return SequenceView(self.id, self.arrival, self.ttft_slo, self.tpot_slo, self.prompt_tokens,
                            self.computed, self.outputs, self.weight, self.folded)


class Instance:
    """One model replica: ``role`` colocated (mixed batches), prefill or decode.

    ``schedulers`` maps a role to its batch scheduler, so a pool manager can
    flip the role between steps (``engine.set_role``); the step in flight
    finishes under the old one.
    """

    def __init__(self, id: str, role: str, schedulers: dict[str, BatchScheduler], kv_capacity: int,
                 timer) -> None:
        if role not in ROLES:
            raise ValueError(f"instance {id}: role {role!r} is not one of {', '.join(ROLES)}")
        self.id, self.role, self.schedulers = id, role, schedulers
        self.kv_capacity = kv_capacity
        self.timer = timer
        self.seqs: dict[str, Seq] = {}  # resident, unfinished, not in transfer
        self.outbound: dict[str, Seq] = {}  # prefilled, KV being sent to a decode instance (still held here)
        self.batch: IterationBatch | None = None
        self.step_started = 0.0
        self.steps = 0
        self.busy_seconds = 0.0
        self.preemptions = 0
        self.last_step_end = -float("inf")
        self.pab = 0.0  # last reported Prefill Admission Budget (pab router)
        self.tokens_done = 0  # tokens computed (prefill + decode) since the start, for monitors
        self.polling = False  # an IDLE_POLL wake-up is pending for it

    @property
    def busy(self) -> bool:
        return self.batch is not None

    def kv_used(self) -> int:
        return sum(s.kv_tokens for s in self.seqs.values()) + sum(s.kv_tokens for s in self.outbound.values())

    def kv_free(self) -> int:
        return self.kv_capacity - self.kv_used()

    def add(self, seq: Seq) -> None:
        self.seqs[seq.id] = seq

    def waiting(self) -> int:
        return sum(1 for s in self.seqs.values() if s.is_prefill)

    def decoding(self) -> int:
        return sum(1 for s in self.seqs.values() if not s.is_prefill)

    def _preempt_one(self) -> bool:
        """Free the KV of the newest sequence holding any (vLLM recompute); False if none holds KV."""
        holders = [s for s in self.seqs.values() if s.kv_tokens > 0]
        if not holders:
            return False
        victim = max(holders, key=lambda s: (s.arrival, s.id))
        victim.folded = victim.outputs
        victim.computed = 0
        victim.p2d_sent = 0  # its KV is computed again, and (per-layer P2D) sent again
        victim.preemptions += 1
        self.preemptions += 1
        return True

    def kick(self, queue: EventQueue, step_end: Callable[["Instance"], None],
             run: Callable[["Instance", float], bool] | None = None) -> None:
        """Start the next step now if idle (an engine's loop, on its one thread).

        The step's end is a COMPUTE event calling ``step_end(self)``, unless
        ``run(self, seconds)`` takes the step over (returns True: it ends it
        itself). With nothing to run while sequences are held (the scheduler
        deferred them all, or KV is short), it asks again after ``IDLE_POLL``.
        """
        if self.busy or self.polling:
            return
        secs = self.begin_step(queue.now)
        if secs is not None:
            if run is None or not run(self, secs):
                queue.push(queue.now + secs, Priority.COMPUTE, step_end, self)
        elif self.seqs:
            self.polling = True
            queue.push(queue.now + IDLE_POLL, Priority.TIMER, self._poll, (queue, step_end, run))

    def _poll(self, loop: tuple) -> None:
        self.polling = False
        self.kick(*loop)

    def begin_step(self, now: float) -> float | None:
        """Form the next batch; returns its seconds, or None when there is nothing to run."""
        if not self.seqs:
            return None
        scheduler = self.schedulers[self.role]
        while True:
            decodes = self.decoding()
            free = self.kv_free()
            if free < decodes and decodes > 1 and self._preempt_one():
                continue  # every decode must be able to write its next token
            views = {s.id: s.view() for s in self.seqs.values()}
            batch = scheduler.schedule(list(views.values()), now, max(0, free))
            if batch.entries or free > 0 or not self._preempt_one():
                break
        if not batch.entries:
            return None
        self.batch, self.step_started = batch, now
        return self.timer.seconds([(e.new_tokens, views[e.id].context) for e in batch.entries])

    def end_step(self, now: float) -> tuple[list[Seq], list[Seq]]:
        """Apply the batch at ``now``: (sequences whose prompt completed this step, sequences finished)."""
        assert self.batch is not None
        prefilled, finished = [], []
        for e in self.batch.entries:
            s = self.seqs[e.id]
            self.tokens_done += e.new_tokens
            if e.is_prefill:
                s.computed += e.new_tokens
                if s.computed < s.prompt_tokens:
                    continue
                prefilled.append(s)
            if s.prefill_end is None and e.is_prefill:
                s.prefill_end = now
            s.outputs += 1
            s.token_times.append(now)
            if s.done:
                finished.append(s)
                del self.seqs[s.id]
        self.busy_seconds += now - self.step_started
        self.steps += 1
        self.last_step_end = now
        self.batch = None
        return prefilled, finished
