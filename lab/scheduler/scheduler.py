"""The scheduling mechanism: budgets, chunked prefill, allocation, preemption, stop checks.

There are no prefill/decode phases. Each request is owed `num_tokens - num_computed_tokens`
tokens; a step serves running requests first (in list order), then waiting ones in policy order,
within `max_num_batched_tokens` and `max_num_seqs`. *Who* is next, *who* is preempted (with a
read-only view of the KV cache) and at most how many tokens a request gets in a step
(`token_cap`) are the queue policy's call; *what happens* to a preempted request is the
preemption strategy's.

Speculative decoding (lab/speculative): a running request may end with drafts
(`spec_token_ids`, set from the previous step's ModelRunnerOutput). They are owed like any
token and count against the budget; a step that cannot schedule them all schedules a prefix.
After the step the rejected ones are taken back: num_computed_tokens steps back over them and
the blocks past the computed tokens are freed (`KVCacheManager.trim`; the worker drops them from
its block table when the request is next scheduled: CachedRequestData.trimmed); only accepted
tokens ever reach the prefix cache. The emitted tokens are appended one by one with a stop check
after each, so a stop inside an accepted run ends the request there.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from lab.cache.manager import KVCacheManager, KVCacheStats
from lab.cache.view import KVCacheView
from lab.core.request import Request, RequestStatus
from lab.core.step import (
    CachedRequestData,
    ModelRunnerOutput,
    NewRequestData,
    SchedulerOutput,
    StepShape,
)
from lab.scheduler.preemption import Admission, PreemptionStrategy, admit_from_prefix
from lab.scheduler.queues import RequestQueue
from lab.scheduler.recovery import StepRecovery


@dataclass
class SchedulerConfig:
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    long_prefill_token_threshold: int = 0
    num_speculative_tokens: int = 0  # the proposer's k (lab/speculative); 0: no speculation

    def __post_init__(self) -> None:
        for name in ("max_num_seqs", "max_num_batched_tokens", "max_model_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 1")
        if self.num_speculative_tokens < 0:
            raise ValueError("num_speculative_tokens must be >= 0 (0 = off)")
        if self.long_prefill_token_threshold < 0:
            raise ValueError("long_prefill_token_threshold must be >= 0 (0 = off)")


@dataclass
class _StepPlan:
    """What one call to schedule() has decided so far."""

    budget: int
    num_tokens: dict[str, int] = field(default_factory=dict)
    new_blocks: dict[str, tuple[list[int], ...]] = field(default_factory=dict)  # per KV group
    new_reqs: list[Request] = field(default_factory=list)
    resumed: set[str] = field(default_factory=set)
    preempted: list[Request] = field(default_factory=list)
    admitted: dict[str, tuple[RequestStatus, int]] = field(default_factory=dict)  # state before


@dataclass
class StepEvents:
    """Per-step counters the engine turns into StepStats."""

    num_preempted: int = 0
    preempted_by_strategy: dict[str, int] = field(default_factory=dict)
    num_prefill_tokens: int = 0
    num_decode_tokens: int = 0
    swap_out_blocks: int = 0
    swap_in_blocks: int = 0
    num_swap_fallbacks: int = 0  # swap-outs refused (swap space full): recomputed instead
    swap_in_cached_blocks: int = 0  # swapped blocks found still cached on the device (no copy)


@dataclass
class SpecDecodeCounts:
    """What one update_from_output saw of speculative decoding: requests that verified drafts,
    drafts verified, drafts accepted (in total and at each draft position 0..k-1). Counted at
    the update, not the schedule: with async scheduling another step has been scheduled by
    then."""

    num_spec_reqs: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_position: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class SchedulerStats:
    """What the engine reports of a step: queue sizes after it, its events, the KV cache, and
    the names of the queue policy and the preemption strategy (`plugin_name`)."""

    num_running_reqs: int
    num_waiting_reqs: int  # swapped ones not included
    num_swapped_reqs: int
    events: StepEvents
    kv: KVCacheStats
    queue_policy: str = ""
    preemption_strategy: str = ""


def plugin_name(plugin: object) -> str:
    """A plug-in's `name` when its own class sets one, else its class name (so a subclass of
    FCFSQueue that sets none is not reported as fcfs)."""
    cls = type(plugin)
    name = cls.__dict__.get("name")
    return name if isinstance(name, str) and name else cls.__name__


class Scheduler(StepRecovery):
    """One piece of mechanism; the policy and strategy are plug-ins."""

    def __init__(
        self,
        config: SchedulerConfig,
        kv_manager: KVCacheManager,
        queue: RequestQueue,
        preemption: PreemptionStrategy,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.config = config
        self.kv = kv_manager
        self.kv_view = KVCacheView(kv_manager)  # what the policy's victim choice may read
        self.waiting = queue
        self.preemption = preemption
        self.clock = clock
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        self.finished_req_ids: set[str] = set()
        self.events = StepEvents()
        self.spec_counts = self.new_spec_counts()
        self.plugin_names = (plugin_name(queue), plugin_name(preemption))
        # a policy that keeps RequestQueue.token_cap (no cap) is not asked every request
        self._asks_caps = type(queue).token_cap is not RequestQueue.token_cap
        # per step scheduled and not yet updated: request id -> (request, tokens computed once
        # the step ran); the Request objects, as an id may be reused once its request ended
        self._steps: dict[int, dict[str, tuple[Request, int]]] = {}
        self._step_ids = itertools.count(1)
        # requests whose blocks past their computed tokens were freed (KVCacheManager.trim)
        # since they were last scheduled: the worker's block table must drop them too
        self._trimmed: set[str] = set()

    # -- requests in and out -------------------------------------------------------------------
    def add_request(self, request: Request) -> None:
        self.requests[request.request_id] = request
        self.waiting.add(request)

    def abort_requests(
        self, request_ids: list[str], status: RequestStatus = RequestStatus.FINISHED_ABORTED,
    ) -> list[Request]:
        """Finish requests wherever they are (as aborted, or with `status`: the frontend stops
        a request whose text hit a stop string) and free everything they hold."""
        aborted = []
        for rid in request_ids:
            req = self.requests.get(rid)
            if req is None or req.is_finished:
                continue
            self._detach(req)
            self._finish(req, status)
            aborted.append(req)
        return aborted

    def _detach(self, req: Request) -> None:
        """Take an unfinished request out of the running list or the waiting queue."""
        if req.status == RequestStatus.RUNNING:
            self.running.remove(req)
        else:
            self.waiting.remove(req)

    def has_unfinished_requests(self) -> bool:
        return bool(self.running) or bool(self.waiting)

    @property
    def num_waiting(self) -> int:
        """Requests in the waiting queue, swapped ones included."""
        return len(self.waiting)

    @property
    def num_swapped(self) -> int:
        """Waiting requests whose KV blocks are parked in the swap space."""
        return self.kv.num_swapped_reqs

    def stats(self) -> SchedulerStats:
        """Queue sizes, this step's events, and the KV cache's counters since the last call."""
        return SchedulerStats(len(self.running), self.num_waiting - self.num_swapped,
                              self.num_swapped, self.events, self.kv.stats(), *self.plugin_names)

    # -- schedule ------------------------------------------------------------------------------
    def new_spec_counts(self) -> SpecDecodeCounts:
        """An update's speculative counters, all zero (one per draft position)."""
        return SpecDecodeCounts(accepted_per_position=[0] * self.config.num_speculative_tokens)

    def schedule(self) -> SchedulerOutput:
        self.events = StepEvents()
        self.waiting.on_step(self.clock())
        plan = _StepPlan(budget=self.config.max_num_batched_tokens)
        self._schedule_running(plan)
        if not plan.preempted:
            self._schedule_waiting(plan)
        return self._make_output(plan)

    def _num_tokens_ahead(self, req: Request) -> int:
        """The tokens the worker will hold for `req` when the step being scheduled runs (the
        async scheduler adds the tokens of steps still in flight), its drafts included."""
        return req.num_tokens_with_spec

    def _may_admit(self, req: Request) -> bool:
        """Whether a waiting request may be admitted now (the async scheduler waits for a
        preempted request's tokens still in flight)."""
        return True

    def _on_scheduled(self, req: Request) -> None:
        """After `req` got its tokens of this step (num_computed_tokens advanced)."""

    def _tokens_owed(self, req: Request, budget: int) -> int:
        n = self._num_tokens_ahead(req) - req.num_computed_tokens
        cap = self._step_cap(req)
        if cap is not None and cap < n:
            n = cap
        return min(n, budget, self.config.max_model_len - 1 - req.num_computed_tokens)

    def _step_cap(self, req: Request) -> int | None:
        """The most tokens `req` may get this step: the smaller of long_prefill_token_threshold
        (when > 0) and the policy's token_cap; None: neither caps it."""
        cap = self.waiting.token_cap(req) if self._asks_caps else None
        if cap is not None and (not isinstance(cap, int) or isinstance(cap, bool) or cap < 1):
            raise ValueError(f"{type(self.waiting).__name__}.token_cap returned {cap!r} for "
                             f"request {req.request_id!r}: it must be None (no cap) or an "
                             "integer >= 1")
        threshold = self.config.long_prefill_token_threshold
        if threshold > 0 and (cap is None or threshold < cap):
            return threshold
        return cap

    def _schedule_running(self, plan: _StepPlan) -> None:
        i = 0
        while i < len(self.running) and plan.budget > 0:
            req = self.running[i]
            n = self._tokens_owed(req, plan.budget)
            if n <= 0:
                i += 1
                continue
            before = len(self.running)
            blocks = self._allocate_or_preempt(req, n, plan)
            if blocks is None:  # the request preempted itself
                break
            plan.num_tokens[req.request_id] = n
            plan.new_blocks[req.request_id] = tuple([b.block_id for b in group]
                                                    for group in blocks)
            plan.budget -= n
            # victims may sit before this request: find it again only after a preemption
            i = i + 1 if len(self.running) == before else self.running.index(req) + 1

    def _allocate_or_preempt(self, req: Request, n: int, plan: _StepPlan):
        """Allocate n slots for a running request, preempting victims until it fits."""
        while True:
            blocks = self.kv.allocate_slots(req, n)
            if blocks is not None:
                return blocks
            victim = self.waiting.victim(self.running, self.kv_view)
            self._preempt(victim, plan)
            if victim is req:
                return None

    def _preempt(self, victim: Request, plan: _StepPlan) -> None:
        if victim.request_id in plan.admitted:  # admitted this step: the worker never saw it
            self._unadmit(victim, plan)
            return
        self.running.remove(victim)
        given_back = plan.num_tokens.pop(victim.request_id, 0)
        plan.budget += given_back  # a victim scheduled earlier this step returns its budget
        plan.new_blocks.pop(victim.request_id, None)
        victim.spec_token_ids = []  # proposed for a step that will not come
        victim.times.preempted_at = self.clock()
        action = self.preemption.preempt(victim, self.kv, self.waiting)
        if victim.status == RequestStatus.SWAPPED:
            victim.times.swapped_at = victim.times.preempted_at
        plan.preempted.append(victim)
        self.events.num_preempted += 1
        by = self.events.preempted_by_strategy
        by[action] = by.get(action, 0) + 1

    def _unadmit(self, req: Request, plan: _StepPlan) -> None:
        """Take back an admission made earlier in this step, as if it had not happened (nothing
        of this step reached the prefix cache: blocks are committed after the step)."""
        self.running.remove(req)
        plan.budget += plan.num_tokens.pop(req.request_id)
        plan.new_blocks.pop(req.request_id)
        plan.new_reqs = [r for r in plan.new_reqs if r is not req]
        plan.resumed.discard(req.request_id)
        req.status, req.num_computed_tokens = plan.admitted.pop(req.request_id)
        self.preemption.unresume(req, self.kv)
        if req.status == RequestStatus.SWAPPED:
            req.times.swapped_at = self.clock()
        if req.status != RequestStatus.WAITING:
            req.times.preempted_at = self.clock()
        self.waiting.prepend(req)

    def _schedule_waiting(self, plan: _StepPlan) -> None:
        while self.waiting and plan.budget > 0:
            req = self.waiting.peek()
            if not self._may_admit(req):
                break
            if len(self.running) >= self.config.max_num_seqs:
                if self._make_room(req, plan):
                    continue
                break
            admission = self._try_allocate(req, plan.budget)
            if admission is None:
                if self._make_room(req, plan):
                    continue
                break  # head-of-line blocking keeps the policy's order
            self.waiting.pop()
            self._admit(req, admission.num_hit_tokens, plan)
            plan.num_tokens[req.request_id] = admission.num_new_tokens
            plan.new_blocks[req.request_id] = self.kv.get_block_ids(req.request_id)
            plan.budget -= admission.num_new_tokens

    def _try_allocate(self, req: Request, budget: int) -> Admission | None:
        """Allocate a waiting request's first chunk: new requests from the prefix cache,
        preempted ones as their strategy resumes them. None: not now."""
        if not self.preemption.can_admit(req, self.kv, self.running):
            return None

        cap = self._step_cap(req)

        def chunk(owed: int) -> int:
            return min(owed, budget, cap if cap is not None else owed)

        if req.status == RequestStatus.WAITING:
            return admit_from_prefix(req, self.kv, chunk)
        return self.preemption.resume(req, self.kv, chunk)

    def _make_room(self, req: Request, plan: _StepPlan) -> bool:
        """Let the policy preempt a running request in favour of waiting `req` (priority)."""
        if not self.preemption.preempts:
            return False
        victim = self.waiting.preempt_for(req, self.running, self.kv_view)
        if victim is None or victim is req:
            return False
        self._preempt(victim, plan)
        return True

    def _admit(self, req: Request, num_hit: int, plan: _StepPlan) -> None:
        now = self.clock()
        plan.admitted[req.request_id] = (req.status, req.num_computed_tokens)
        if req.status == RequestStatus.WAITING:
            plan.new_reqs.append(req)
        else:  # preempted or swapped: the worker still holds its state
            plan.resumed.add(req.request_id)
            _resume_times(req, now)
        if req.times.first_scheduled is None:
            req.times.first_scheduled = now
        if req.num_cached_tokens < 0:
            req.num_cached_tokens = num_hit
        req.status = RequestStatus.RUNNING
        req.num_computed_tokens += num_hit  # 0 + hits when new or recomputed; kept when swapped
        self.running.append(req)

    def _make_output(self, plan: _StepPlan) -> SchedulerOutput:
        swaps = self.kv.take_swap_step()
        out = SchedulerOutput(
            num_scheduled_tokens=plan.num_tokens,
            total_num_scheduled_tokens=sum(plan.num_tokens.values()),
            finished_req_ids=self.finished_req_ids,
            preempted_req_ids={r.request_id for r in plan.preempted},
            swap_out=swaps.swap_out,
            swap_in=swaps.swap_in,
            step_id=next(self._step_ids),
        )
        self.events.swap_out_blocks = len(swaps.swap_out)
        self.events.swap_in_blocks = len(swaps.swap_in)
        self.events.num_swap_fallbacks = swaps.num_refused
        self.events.swap_in_cached_blocks = swaps.num_reclaimed
        new_ids = {r.request_id for r in plan.new_reqs}
        chunks = []  # (new tokens, computed before, length) per scheduled request
        record: dict[str, tuple[Request, int]] = {}
        for req in self.running:
            rid = req.request_id
            if rid not in plan.num_tokens:
                continue
            self._count_tokens(req, plan.num_tokens[rid])
            if rid in new_ids:
                out.scheduled_new_reqs.append(NewRequestData(
                    rid, req.prompt_token_ids, req.sampling_params,
                    plan.new_blocks[rid], req.num_computed_tokens))
            else:
                trimmed = rid in self._trimmed
                if trimmed:
                    self._trimmed.discard(rid)
                out.scheduled_cached_reqs.append(CachedRequestData(
                    rid, plan.new_blocks[rid], req.num_computed_tokens,
                    resumed_from_preemption=rid in plan.resumed, trimmed=trimmed))
            chunks.append((plan.num_tokens[rid], req.num_computed_tokens,
                           self._num_tokens_ahead(req)))
            self._take_drafts(req, plan.num_tokens[rid], out)
            req.num_computed_tokens += plan.num_tokens[rid]  # the next chunk can go next step
            record[rid] = (req, req.num_computed_tokens)
            self._on_scheduled(req)
        out.shape = StepShape.of(chunks, len(swaps.swap_in), len(swaps.swap_out),
                                 len(new_ids) + len(plan.resumed),
                                 sum(map(len, out.scheduled_spec_decode_tokens.values())))
        if record:
            self._steps[out.step_id] = record
        self._check_invariants(out)
        self.finished_req_ids = set()  # last: a schedule() that raises keeps them for the next
        return out

    @staticmethod
    def _take_drafts(req: Request, n: int, out: SchedulerOutput) -> None:
        """Move the drafts the request's `n` scheduled tokens reach into the step's output (a
        budget-cut step schedules a prefix of them; the rest are dropped, as in vLLM)."""
        if not req.spec_token_ids:
            return
        num_spec = req.num_computed_tokens + n - req.num_tokens
        if num_spec > 0:
            out.scheduled_spec_decode_tokens[req.request_id] = req.spec_token_ids[:num_spec]
        req.spec_token_ids = []

    def _count_tokens(self, req: Request, n: int) -> None:
        prefill = max(0, min(n, req.num_prompt_tokens - req.num_computed_tokens))
        self.events.num_prefill_tokens += prefill
        self.events.num_decode_tokens += n - prefill
        self.waiting.on_scheduled(req, prefill, n - prefill)

    def _check_invariants(self, out: SchedulerOutput) -> None:
        assert out.total_num_scheduled_tokens <= self.config.max_num_batched_tokens
        assert len(self.running) <= self.config.max_num_seqs

    # -- update --------------------------------------------------------------------------------
    def update_from_output(
        self, sched: SchedulerOutput, result: ModelRunnerOutput
    ) -> list[Request]:
        """Append sampled tokens, apply stop checks, free finished requests.

        Returns the requests that received a token this step (finished ones included).
        A request that finished (or was aborted) after the step was scheduled gets nothing.
        """
        now = self.clock()
        updated = []
        self.spec_counts = self.new_spec_counts()
        for rid, req, computed in self.take_step_requests(sched):
            if req.is_finished:
                continue
            tokens = result.sampled_token_ids.get(rid)
            drafts = sched.scheduled_spec_decode_tokens.get(rid)
            if tokens and drafts:
                computed = self._take_back_rejected(req, computed, len(drafts), len(tokens) - 1)
            status = self._append_tokens(req, tokens, result, now) if tokens else None
            if req.status == RequestStatus.RUNNING:  # (not preempted since): share its blocks
                self.kv.cache_computed(req, computed)  # KV written up to `computed` only
            if status is not None:
                self._detach(req)
                self._finish(req, status)
            elif tokens and req.status == RequestStatus.RUNNING:
                req.spec_token_ids = result.spec_token_ids.get(rid, [])
            if tokens:
                updated.append(req)
        return updated

    def _take_back_rejected(self, req: Request, computed: int, num_drafts: int,
                            num_accepted: int) -> int:
        """Count a verification and step the request back over its rejected drafts: their KV
        slots (and any lookahead) are freed. Returns the tokens computed once the step ran,
        the rejected ones no longer counted."""
        ev = self.spec_counts
        ev.num_spec_reqs += 1
        ev.num_draft_tokens += num_drafts
        ev.num_accepted_tokens += num_accepted
        for pos in range(num_accepted):
            ev.accepted_per_position[pos] += 1
        req.num_draft_tokens += num_drafts
        req.num_accepted_tokens += num_accepted
        rejected = num_drafts - num_accepted
        if req.status == RequestStatus.RUNNING:
            req.num_computed_tokens -= rejected
            if self.kv.trim(req, req.num_computed_tokens):
                self._trimmed.add(req.request_id)  # told to the worker when next scheduled
        return computed - rejected

    def _append_tokens(self, req: Request, tokens: list[int], result: ModelRunnerOutput,
                       now: float) -> RequestStatus | None:
        """Append the step's tokens with a stop check after each; a stop ends them there (the
        output's token and logprob lists are cut to what was appended). The stop, if any."""
        self._on_token(req)
        status = None
        for i, token in enumerate(tokens):
            req.append_output_token(token)
            status = self._check_stop(req, token)
            if status is not None:
                if i + 1 < len(tokens):
                    _cut_output(result, req.request_id, i + 1)
                break
        _record_token_time(req, now)
        return status

    def step_requests(self, sched: SchedulerOutput) -> dict[str, Request]:
        """The Request objects a step scheduled (finished ones included), by id."""
        return {rid: req for rid, (req, _) in self._record(sched).items()}

    def take_step_requests(self, sched: SchedulerOutput) -> Iterator[tuple[str, Request, int]]:
        """(id, request, tokens computed once the step ran) of each request the step scheduled,
        and forget the step."""
        record = self._record(sched)
        self._steps.pop(sched.step_id, None)
        for rid, (req, computed) in record.items():
            yield rid, req, computed

    def _record(self, sched: SchedulerOutput) -> dict[str, tuple[Request, int]]:
        """What schedule() recorded of the step; for a step it did not record (built by hand),
        its ids' requests as they are now."""
        record = self._steps.get(sched.step_id)
        if record is None:
            record = {rid: (req, req.num_computed_tokens) for rid in sched.num_scheduled_tokens
                      if (req := self.requests.get(rid)) is not None}
        return record

    def _on_token(self, req: Request) -> None:
        """A token of `req` arrives from its step, before it is appended."""

    def _check_stop(self, req: Request, token: int) -> RequestStatus | None:
        params = req.sampling_params
        if req.num_tokens >= self.config.max_model_len or (
                params.max_tokens is not None and req.num_output_tokens >= params.max_tokens):
            return RequestStatus.FINISHED_LENGTH_CAPPED
        if req.num_output_tokens < params.min_tokens:
            return None
        if not params.ignore_eos and token == req.eos_token_id:
            return RequestStatus.FINISHED_STOPPED
        if token in params.stop_token_ids:
            req.stop_reason = token
            return RequestStatus.FINISHED_STOPPED
        return None

    def _finish(self, req: Request, status: RequestStatus) -> None:
        req.status = status
        req.times.finished = self.clock()
        self.kv.release(req)
        self._trimmed.discard(req.request_id)
        self.finished_req_ids.add(req.request_id)
        del self.requests[req.request_id]


def _resume_times(req: Request, now: float) -> None:
    """Add the time since preemption (and since swap-out) to the request's totals."""
    t = req.times
    if t.preempted_at is not None:
        t.time_preempted += now - t.preempted_at
        t.preempted_at = None
    if t.swapped_at is not None:
        t.time_swapped += now - t.swapped_at
        t.swapped_at = None


def _cut_output(result: ModelRunnerOutput, rid: str, n: int) -> None:
    """Keep the first n of a request's emitted tokens (and their logprobs) in the output."""
    result.sampled_token_ids[rid] = result.sampled_token_ids[rid][:n]
    lp = result.logprobs.get(rid)
    if lp is not None:
        result.logprobs[rid] = type(lp)(lp.token_ids[:n], lp.logprobs[:n], lp.ranks[:n])


def _record_token_time(req: Request, now: float) -> None:
    if req.times.first_token is None:
        req.times.first_token = now
    req.times.last_token = now
    req.times.token_times.append(now)
