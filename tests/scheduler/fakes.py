"""A scheduler with a fake model: tokens are a pure function of the request's tokens so far."""

from __future__ import annotations

import itertools

from lab.cache.hashing import make_block_hasher
from lab.cache.manager import KVCacheManager
from lab.cache.swap import SwapSpace
from lab.core.request import Request
from lab.core.sampling_params import SamplingParams
from lab.core.step import SchedulerOutput
from lab.executor.base import Executor
from lab.scheduler import FCFSQueue, ModelRunnerOutput, RecomputePreemption, Scheduler
from lab.scheduler.scheduler import SchedulerConfig

VOCAB = 50
EOS = 0


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        self.t += 0.001
        return self.t


def make_scheduler(num_blocks=32, block_size=4, max_num_seqs=8, budget=32, max_model_len=64,
                   caching=True, threshold=0, queue=None, preemption=None,
                   swap_blocks=0) -> Scheduler:
    kv = KVCacheManager(num_blocks, block_size, max_model_len, enable_caching=caching)
    kv.swap_space = SwapSpace(swap_blocks)
    cfg = SchedulerConfig(max_num_seqs, budget, max_model_len, threshold)
    sched = Scheduler(cfg, kv, queue if queue is not None else FCFSQueue(),
                      preemption if preemption is not None else RecomputePreemption(),
                      clock=FakeClock())
    sched.fake_kv = FakeKVContents(block_size)
    return sched


class FakeKVContents:
    """What a real worker's KV cache would hold: the token id at every slot of every device and
    CPU block. Each step applies the swaps, writes the scheduled tokens through the block table,
    then checks every scheduled request reads back exactly its own tokens — so a wrong swap pair,
    a reused block or a bad prefix hit shows up as a wrong token."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.device: dict[int, list[int | None]] = {}
        self.cpu: dict[int, list[int | None]] = {}

    def _block(self, store: dict, block_id: int) -> list[int | None]:
        return store.setdefault(block_id, [None] * self.block_size)

    def apply_swaps(self, out: SchedulerOutput) -> None:
        """Every swap-out of the step, then every swap-in (the worker's order)."""
        for dev, cpu in out.swap_out:
            self.cpu[cpu] = list(self._block(self.device, dev))
        for cpu, dev in out.swap_in:
            self.device[dev] = list(self._block(self.cpu, cpu))

    def step(self, sched: Scheduler, out: SchedulerOutput) -> None:
        self.apply_swaps(out)
        bs = self.block_size
        for rid, n in out.num_scheduled_tokens.items():
            req = sched.requests[rid]
            start = req.num_computed_tokens - n  # the scheduler already advanced it
            for blocks in sched.kv.get_block_ids(rid):  # every KV cache group
                for pos in range(start, start + n):
                    assert blocks[pos // bs] != 0, f"{rid} writes the null block"
                    self._block(self.device, blocks[pos // bs])[pos % bs] = req.all_token_ids[pos]
        for rid, n in out.num_scheduled_tokens.items():
            req = sched.requests[rid]
            for group, blocks in zip(sched.kv.groups, sched.kv.get_block_ids(rid)):
                window = group.spec.sliding_window  # the step's first query reads from here
                first = 0 if window is None else max(0, req.num_computed_tokens - n - window + 1)
                seen = [self._block(self.device, blocks[p // bs])[p % bs]
                        for p in range(first, req.num_computed_tokens)]
                assert seen == req.all_token_ids[first: req.num_computed_tokens], \
                    f"{rid} reads wrong KV"


_ids = itertools.count()


def make_request(sched: Scheduler, prompt, max_tokens=8, **params) -> Request:
    params.setdefault("ignore_eos", True)
    sp = SamplingParams(temperature=0, max_tokens=max_tokens, **params)
    req = Request(f"r{next(_ids)}", list(prompt), sp, EOS, arrival_time=sched.clock(),
                  block_hasher=make_block_hasher(sched.kv.block_size))
    sched.add_request(req)
    return req


def fake_token(tokens: list[int]) -> int:
    return (sum(tokens) * 31 + len(tokens)) % VOCAB


def fake_execute(sched: Scheduler, out: SchedulerOutput) -> ModelRunnerOutput:
    """Sample for every request whose computed tokens now reach all of its tokens."""
    fake_kv = getattr(sched, "fake_kv", None)
    if fake_kv is not None:
        fake_kv.step(sched, out)
    sampled = {}
    for rid in out.num_scheduled_tokens:
        req = sched.requests[rid]
        if req.num_computed_tokens >= req.num_tokens:
            sampled[rid] = [fake_token(req.all_token_ids)]
    return ModelRunnerOutput(sampled)


def run_to_completion(sched: Scheduler, max_steps=10_000, on_step=None) -> int:
    steps = 0
    while sched.has_unfinished_requests():
        out = sched.schedule()
        if on_step is not None:
            on_step(out)
        sched.update_from_output(out, fake_execute(sched, out))
        steps += 1
        assert steps < max_steps, "scheduler made no progress"
    return steps


def expected_output(prompt: list[int], max_tokens: int) -> list[int]:
    tokens = list(prompt)
    for _ in range(max_tokens):
        tokens.append(fake_token(tokens))
    return tokens[len(prompt):]


def check_all_finished(sched: Scheduler, reqs, aborted: set[str], max_model_len: int) -> None:
    """Run to completion, then check_outcomes with the aborted requests ABORTED."""
    from lab.core.request import RequestStatus

    run_to_completion(sched)
    check_outcomes(sched, reqs, dict.fromkeys(aborted, RequestStatus.FINISHED_ABORTED),
                   max_model_len)


def check_outcomes(sched: Scheduler, reqs, ended: dict, max_model_len: int) -> None:
    """Every request finished: those in `ended` (id -> status) with that status, every other one
    with the fake model's exact tokens (cut only by max_model_len); every block is free."""
    for req in reqs:
        assert req.is_finished
        if req.request_id in ended:
            assert req.status == ended[req.request_id]
            continue
        want = expected_output(req.prompt_token_ids, req.sampling_params.max_tokens)
        assert req.output_token_ids == want[: req.num_output_tokens]
        assert req.num_output_tokens == len(want) or req.num_tokens == max_model_len
    assert sched.kv.num_free_blocks == sched.kv.num_blocks - 1
    swap = sched.kv.swap_space
    assert swap.num_free_blocks == swap.num_blocks and not swap.req_to_blocks


class ModelFreeExecutor(Executor):
    """Base of the fake executors: an engine core built around one never sizes a cache or asks
    for the model's shape, so those raise."""

    def model_info(self):  # pragma: no cover - not used here
        raise NotImplementedError

    def determine_num_blocks(self, sizing):  # pragma: no cover - not used here
        raise NotImplementedError

    def initialize_cache(self, num_blocks, max_model_len, num_swap_blocks=0):  # pragma: no cover
        raise NotImplementedError
