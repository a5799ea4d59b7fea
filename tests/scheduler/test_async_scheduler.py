"""Async scheduling (AsyncScheduler + EngineCore's async loop) against the synchronous loop, on a
fake worker that behaves as the model runner does: it learns each request's tokens only from the
SchedulerOutputs it runs and appends its own sampled tokens, so a placeholder that is not yet
resolved when its step runs is caught (it would read a token it does not hold). It also keeps
the KV cache's contents -- the token id at every slot of every device and swap block -- and
checks that every scheduled request reads back exactly its own tokens: a block reused while a
step in flight still needed it, a prefix hit on KV not yet written, or a wrong swap shows up as
a wrong token.

Hypothesis draws workloads (prompt lengths, max_tokens, EOS and stop ids, chunking budgets, KV
caches small enough to preempt, recompute or swap, FCFS or priority, aborts at any step, steps
that raise) and runs each through both loops; every request that was neither aborted nor
failed must give the fake model's exact tokens and finish reason in both, and both must end
with every block free.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lab.cache.hashing import make_block_hasher
from lab.cache.manager import KVCacheManager
from lab.cache.swap import SwapSpace
from lab.core.protocol import EngineCoreRequest
from lab.core.sampling_params import SamplingParams
from lab.core.step import ModelRunnerOutput, SchedulerOutput
from lab.engine.core import EngineCore, EngineStuckError
from lab.executor.pipeline import StepSkipped, ThreadedSteps
from lab.scheduler import FCFSQueue, PriorityQueue, RecomputePreemption
from lab.scheduler.async_scheduler import AsyncScheduler
from lab.scheduler.preemption import SwapPreemption
from lab.scheduler.scheduler import Scheduler, SchedulerConfig
from tests.scheduler.fakes import ModelFreeExecutor

VOCAB, EOS = 16, 0


class Fault(Exception):
    pass


def fake_token(tokens: list[int]) -> int:
    return (sum(tokens) * 31 + len(tokens) * 7) % VOCAB


def expected(prompt: list[int], params: SamplingParams, max_model_len: int) -> tuple[list[int], str]:
    """The fake model's outputs and finish reason, by the scheduler's stop rules."""
    tokens, out = list(prompt), []
    while True:
        tok = fake_token(tokens)
        tokens.append(tok)
        out.append(tok)
        if len(tokens) >= max_model_len or len(out) >= params.max_tokens:
            return out, "length"
        if len(out) < params.min_tokens:
            continue
        if (not params.ignore_eos and tok == EOS) or tok in params.stop_token_ids:
            return out, "stop"


@dataclass
class _State:
    tokens: list[int]
    blocks: list[int]
    computed: int


class FakeWorker:
    """The model runner's bookkeeping without a model (see the module docstring)."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.states: dict[str, _State] = {}
        self.sampled = 0  # tokens sampled over all steps
        self.device: dict[int, list[int | None]] = {}
        self.cpu: dict[int, list[int | None]] = {}

    def _block(self, store: dict, block_id: int) -> list[int | None]:
        return store.setdefault(block_id, [None] * self.block_size)

    def execute(self, sched: SchedulerOutput) -> ModelRunnerOutput:
        for dev, cpu in sched.swap_out:
            self.cpu[cpu] = list(self._block(self.device, dev))
        for cpu, dev in sched.swap_in:
            self.device[dev] = list(self._block(self.cpu, cpu))
        for rid in sched.finished_req_ids:
            self.states.pop(rid, None)
        for new in sched.scheduled_new_reqs:
            (blocks,) = new.block_ids  # one KV cache group
            self.states[new.req_id] = _State(list(new.prompt_token_ids), list(blocks),
                                             new.num_computed_tokens)
        for cached in sched.scheduled_cached_reqs:
            state = self.states[cached.req_id]
            state.computed = cached.num_computed_tokens
            (new_blocks,) = cached.new_block_ids
            state.blocks = (list(new_blocks) if cached.resumed_from_preemption
                            else state.blocks + list(new_blocks))
        return ModelRunnerOutput({rid: [tok] for rid, n in sched.num_scheduled_tokens.items()
                                  if (tok := self._run(rid, n)) is not None})

    def _run(self, rid: str, n: int) -> int | None:
        state, bs = self.states[rid], self.block_size
        c = state.computed
        assert c + n <= len(state.tokens), f"{rid}: step reads a token the worker lacks"
        for pos in range(c, c + n):
            self._block(self.device, state.blocks[pos // bs])[pos % bs] = state.tokens[pos]
        seen = [self._block(self.device, state.blocks[p // bs])[p % bs] for p in range(c + n)]
        assert seen == state.tokens[: c + n], f"{rid} reads wrong KV"
        state.computed = c + n
        if state.computed < len(state.tokens):
            return None  # a partial prefill
        token = fake_token(state.tokens)
        state.tokens.append(token)
        self.sampled += 1
        return token


class FakeExecutor(ModelFreeExecutor):
    """A FakeWorker behind the Executor interface; execute_model call numbers in `faults`
    raise Fault before the worker sees the step (steps skipped by the chain are no call)."""

    runs_kernels = False

    def __init__(self, block_size: int, faults: frozenset[int] = frozenset()) -> None:
        self.worker = FakeWorker(block_size)
        self.faults = faults
        self.calls = 0
        self.failed_steps: list[set[str]] = []  # the requests of each step that raised

    def execute_model(self, sched: SchedulerOutput) -> ModelRunnerOutput:
        self.calls += 1
        if self.calls - 1 in self.faults:
            self.failed_steps.append(set(sched.num_scheduled_tokens))
            raise Fault(f"step {self.calls - 1}")
        return self.worker.execute(sched)


class ThreadedFakeExecutor(FakeExecutor):
    """Async steps on a worker thread, as executor=uniproc runs them."""

    def __init__(self, block_size: int, faults: frozenset[int] = frozenset()) -> None:
        super().__init__(block_size, faults)
        self.steps = ThreadedSteps(self.execute_model)

    def execute_model_async(self, sched, chained=False):
        return self.steps.submit(sched, chained)

    def shutdown(self) -> None:
        self.steps.shutdown()


@dataclass
class Workload:
    prompts: list[list[int]]
    params: list[SamplingParams]
    priorities: list[int]
    block_size: int = 4
    num_blocks: int = 64
    budget: int = 32
    max_num_seqs: int = 8
    max_model_len: int = 48
    threshold: int = 0
    caching: bool = True
    swap_blocks: int = 0  # > 0: preemption=swap
    priority: bool = False
    aborts: dict[int, list[int]] = field(default_factory=dict)  # step() call -> request indices
    faults: frozenset[int] = frozenset()


def build_core(w: Workload, async_scheduling: bool,
               executor: Callable[..., FakeExecutor] = FakeExecutor) -> EngineCore:
    kv = KVCacheManager(w.num_blocks, w.block_size, w.max_model_len, enable_caching=w.caching)
    kv.swap_space = SwapSpace(w.swap_blocks)
    config = SchedulerConfig(w.max_num_seqs, w.budget, w.max_model_len, w.threshold)
    cls = AsyncScheduler if async_scheduling else Scheduler
    scheduler = cls(config, kv, PriorityQueue() if w.priority else FCFSQueue(),
                    SwapPreemption() if w.swap_blocks else RecomputePreemption())
    return EngineCore(scheduler, executor(w.block_size, w.faults),
                      block_hasher=make_block_hasher(w.block_size),
                      async_scheduling=async_scheduling)


@dataclass
class Outcome:
    tokens: dict[str, list[int]]
    reasons: dict[str, str]
    steps: int  # executed steps (StepStats)
    sampled: int  # tokens the worker sampled (dropped ones included)


def run(core: EngineCore, w: Workload, max_calls: int = 2000) -> Outcome:
    """Every request through the core; aborts and faults as the workload says. Checks that no
    output follows a request's final one and that the core ends with nothing held."""
    for i, (p, sp, pr) in enumerate(zip(w.prompts, w.params, w.priorities)):
        core.add_request(EngineCoreRequest(f"r{i}", p, sp, EOS, 0.0, priority=pr))
    tokens = {f"r{i}": [] for i in range(len(w.prompts))}
    reasons: dict[str, str] = {}
    steps = calls = 0

    def take(outs) -> None:
        for o in outs:
            assert o.request_id not in reasons, f"output after the end of {o.request_id}"
            tokens[o.request_id] += o.new_token_ids
            if o.finish_reason is not None:
                reasons[o.request_id] = o.finish_reason

    while core.has_unfinished_requests():
        take(core.abort_requests([f"r{i}" for i in w.aborts.get(calls, [])]))
        calls += 1
        assert calls < max_calls, "the engine spins"
        try:
            result = core.step()
        except Fault:
            take(core.take_failed())
            continue
        take(result.outputs)
        if result.step_stats is not None:
            steps += 1
    take(core.take_failed())
    assert_clean(core)
    return Outcome(tokens, reasons, steps, core.executor.worker.sampled)


def assert_clean(core: EngineCore) -> None:
    s = core.scheduler
    assert not s.requests and not s.running and not s.waiting
    assert s.kv.num_used_blocks == 0 and s.kv.num_swapped_reqs == 0
    assert not s._steps and not core._in_flight
    assert not getattr(s, "placeholders", {})


def check(w: Workload, out: Outcome) -> None:
    """Requests neither aborted nor failed: the fake model's exact tokens and reason; aborted
    and failed ones: a prefix of them."""
    for i, (p, sp) in enumerate(zip(w.prompts, w.params)):
        rid = f"r{i}"
        want, reason = expected(p, sp, w.max_model_len)
        if out.reasons[rid] in ("abort", "error"):
            assert out.tokens[rid] == want[: len(out.tokens[rid])], rid
        else:
            assert (out.tokens[rid], out.reasons[rid]) == (want, reason), rid


# -- hypothesis workloads ------------------------------------------------------------------------
@st.composite
def workloads(draw, aborts: bool = False, faults: bool = False) -> Workload:
    """Half the draws put the KV cache under pressure (several long requests running in a
    cache that holds one of max_model_len): preemption."""
    pressure = draw(st.booleans())
    n = draw(st.integers(4 if pressure else 1, 8))
    block_size = draw(st.sampled_from([2, 4]))
    max_model_len = 40
    prompts = [draw(st.lists(st.integers(1, VOCAB - 1), min_size=10 if pressure else 1,
                             max_size=20)) for _ in range(n)]
    if draw(st.booleans()):  # a shared prefix: prefix-cache hits
        prompts = [prompts[0][:8] + p for p in prompts]
    params = []
    for _ in range(n):
        max_tokens = draw(st.integers(8 if pressure else 1, 16))
        params.append(SamplingParams(
            temperature=0, max_tokens=max_tokens, ignore_eos=draw(st.booleans()),
            min_tokens=draw(st.integers(0, min(2, max_tokens))),
            stop_token_ids=draw(st.lists(st.integers(1, VOCAB - 1), max_size=3))))
    need = -(-max_model_len // block_size) + 1  # one request of max_model_len fits
    swap = draw(st.booleans())
    return Workload(
        prompts, params, [draw(st.integers(0, 2)) for _ in range(n)], block_size=block_size,
        num_blocks=need + (draw(st.integers(0, 2)) if pressure else draw(st.integers(0, 30))),
        budget=draw(st.integers(4, 40)),
        max_num_seqs=draw(st.integers(4 if pressure else 1, 8)), max_model_len=max_model_len,
        threshold=draw(st.sampled_from([0, 0, 3])), caching=draw(st.booleans()),
        swap_blocks=draw(st.integers(8, 40)) if swap else 0, priority=draw(st.booleans()),
        aborts=draw(st.dictionaries(st.integers(0, 12), st.lists(st.integers(0, n - 1),
                                                                  max_size=2), max_size=3))
        if aborts else {},
        faults=frozenset(draw(st.sets(st.integers(0, 12), max_size=2))) if faults
        else frozenset())


@given(workloads())
def test_async_gives_the_synchronous_tokens(w):
    sync, async_ = run(build_core(w, False), w), run(build_core(w, True), w)
    check(w, sync)
    check(w, async_)
    assert (sync.tokens, sync.reasons) == (async_.tokens, async_.reasons)
    # an EOS / stop-id finish costs at most one wasted token per request in async mode; a
    # length finish costs none (the request is not scheduled past its last token)
    stopped = sum(r == "stop" for r in async_.reasons.values())
    assert sync.sampled <= async_.sampled <= sync.sampled + stopped


@given(workloads(aborts=True))
def test_aborts_at_any_step(w):
    out = run(build_core(w, True), w)
    check(w, out)


@given(workloads(faults=True))
def test_a_step_that_raises_fails_only_its_requests(w):
    for async_scheduling in (False, True):
        core = build_core(w, async_scheduling)
        out = run(core, w)
        check(w, out)
        failed = {rid for rid, r in out.reasons.items() if r == "error"}
        assert failed <= set().union(*core.executor.failed_steps)


@pytest.mark.parametrize("faults", [frozenset(), frozenset({2, 5})])
def test_steps_on_a_worker_thread(faults):
    """The uniproc shape: steps on a thread of their own; a fault skips the step behind it."""
    w = Workload([[5, 6, 7, 8, 9], [1, 2, 3], [4] * 11, [9, 8]],
                 [SamplingParams(temperature=0, max_tokens=m, ignore_eos=True)
                  for m in (9, 4, 6, 12)], [0] * 4, num_blocks=10, budget=6, faults=faults)
    core = build_core(w, True, ThreadedFakeExecutor)
    try:
        out = run(core, w)
    finally:
        core.shutdown()
    check(w, out)
    assert not core.executor.steps._pool._threads or all(
        not t.is_alive() for t in core.executor.steps._pool._threads)
    assert (set(out.reasons.values()) == {"length"}) == (not faults)


def test_eos_in_flight_wastes_one_token_and_frees_blocks_at_once():
    """A request stopped by a token: the step scheduled behind it computes one more token,
    dropped; its blocks are free as soon as the stop is known."""
    prompt = [5, 6, 7]
    first = fake_token(prompt)
    sp = SamplingParams(temperature=0, max_tokens=10, stop_token_ids=[first])
    w = Workload([prompt], [sp], [0])
    core = build_core(w, True)
    core.add_request(EngineCoreRequest("r0", prompt, sp, EOS, 0.0))
    assert core.step().outputs == []  # step 0 in flight, nothing back yet
    result = core.step()  # step 1 scheduled on step 0's placeholder, then step 0 taken in
    [out] = result.outputs
    assert (out.new_token_ids, out.finish_reason, out.stop_reason) == ([first], "stop", first)
    assert core.scheduler.kv.num_used_blocks == 0  # freed while step 1 still runs
    assert core.has_unfinished_requests()  # step 1 is in flight
    last = core.step()
    assert last.outputs == [] and last.step_stats.num_generated_tokens == 0
    assert_clean(core)


def test_max_tokens_is_not_overrun():
    """A request whose tokens in flight reach max_tokens is not scheduled again."""
    sp = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    w = Workload([[3, 4]], [sp], [0])
    core = build_core(w, True)
    out = run(core, w)
    assert out.steps == 1 and out.tokens["r0"] == expected([3, 4], sp, 48)[0]


def test_preempted_request_waits_for_its_token_in_flight():
    """A request preempted while its step runs is not admitted again before that step's token
    has arrived (it would compute a position whose token the worker lacks)."""
    sp = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    w = Workload([[1] * 7, [2] * 7], [sp, sp], [0, 0], block_size=4, num_blocks=5, budget=16)
    out = run(build_core(w, True), w)
    check(w, out)


class _InterruptFirstWait:
    """A future whose first wait is interrupted (KeyboardInterrupt) before the step is done."""

    def __init__(self, future) -> None:
        self.future, self.interrupted = future, False

    def done(self) -> bool:
        return self.interrupted and self.future.done()

    def result(self):
        if not self.interrupted:
            self.interrupted = True
            raise KeyboardInterrupt
        return self.future.result()


def test_an_interrupted_wait_leaves_the_step_in_flight():
    class Interrupting(FakeExecutor):
        def execute_model_async(self, sched, chained=False):
            future = super().execute_model_async(sched, chained)
            if self.calls or getattr(self, "wrapped", False):
                return future
            self.wrapped = True  # the first step's first wait only
            return _InterruptFirstWait(future)

    sp = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
    w = Workload([[3, 4, 5]], [sp], [0])
    core = build_core(w, True, Interrupting)
    core.add_request(EngineCoreRequest("r0", [3, 4, 5], sp, EOS, 0.0))
    core.step()
    with pytest.raises(KeyboardInterrupt):
        core.step()
    assert len(core._in_flight) == 2 and not core.take_failed()
    tokens = []
    while core.has_unfinished_requests():
        tokens += [t for o in core.step().outputs for t in o.new_token_ids]
    assert tokens == expected([3, 4, 5], sp, 48)[0]
    assert_clean(core)


def test_skipped_step_is_requeued_not_failed():
    """Step 1 fails; step 2 (scheduled behind it) is skipped: only step 1's requests fail, a
    request admitted by step 2 alone finishes normally."""
    sp = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    w = Workload([[3, 4, 5], [6, 7, 8]], [sp, sp], [0, 0], max_num_seqs=1, faults=frozenset({1}))
    core = build_core(w, True)
    out = run(core, w)
    assert out.reasons == {"r0": "error", "r1": "length"}
    check(w, out)


def test_stuck_detection_still_fires():
    """No spin: a request that can never be scheduled (the queue blocks it) raises at once."""
    sp = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    w = Workload([[3, 4, 5]], [sp], [0])
    core = build_core(w, True)
    core.scheduler._may_admit = lambda req: False  # a scheduler bug: nothing is ever admitted
    core.add_request(EngineCoreRequest("r0", [3, 4, 5], sp, EOS, 0.0))
    with pytest.raises(EngineStuckError):
        core.step()
    assert [o.finish_reason for o in core.take_failed()] == ["error"]


def test_chain_skips_only_chained_steps():
    from lab.executor.pipeline import InOrderSteps

    steps = InOrderSteps()

    def boom():
        raise Fault

    a = steps.submit(boom)
    b = steps.submit(lambda: ModelRunnerOutput(), chained=True)
    with pytest.raises(Fault):
        a.result()
    with pytest.raises(StepSkipped):
        b.result()
    c = steps.submit(lambda: ModelRunnerOutput({"x": [1]}))  # after the failure was taken in
    assert c.result().sampled_token_ids == {"x": [1]}


def test_a_failed_step_leaves_no_prefix_cache_entry():
    """The prefix cache takes a step's blocks only once that step ran: r0's second chunk is in
    flight when its first chunk's result is taken in, and then fails; r1 (same prompt) must
    not hit the block that chunk never wrote."""
    sp = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    prompt = list(range(1, 11))
    w = Workload([prompt, prompt], [sp, sp], [0, 0], budget=4, max_num_seqs=1,
                 faults=frozenset({1}))
    out = run(build_core(w, True), w)
    assert out.reasons == {"r0": "error", "r1": "length"}
    check(w, out)


def test_a_swapped_request_waits_for_its_token_in_flight():
    """scheduler=priority, preemption=swap: a running request swapped out for a more important
    one while its token is in flight is not resumed in the same step (it owes nothing until the
    token arrives)."""
    sp = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    w = Workload([[1] * 13, [2] * 13], [sp, sp], [1, 0], num_blocks=8, budget=32,
                 max_num_seqs=2, swap_blocks=16, priority=True)
    core = build_core(w, True)
    core.add_request(EngineCoreRequest("r0", w.prompts[0], sp, EOS, 0.0, priority=1))
    tokens = {"r0": [], "r1": []}
    for _ in range(3):  # r0 prefilled and decoding, a step in flight
        for o in core.step().outputs:
            tokens[o.request_id] += o.new_token_ids
    core.add_request(EngineCoreRequest("r1", w.prompts[1], sp, EOS, 0.0, priority=0))
    swapped = 0
    while core.has_unfinished_requests():
        result = core.step()
        for o in result.outputs:
            tokens[o.request_id] += o.new_token_ids
        if result.step_stats is not None:
            swapped += result.step_stats.swap_out_blocks
    assert swapped > 0
    assert tokens == {f"r{i}": expected(p, sp, 48)[0] for i, p in enumerate(w.prompts)}
    assert_clean(core)
