"""A scheduler with a fake model: tokens are a pure function of the request's tokens so far."""

from __future__ import annotations

import itertools

from lab.cache.hashing import make_block_hasher
from lab.cache.manager import KVCacheManager
from lab.engine.request import Request
from lab.sampling.params import SamplingParams
from lab.scheduler import FCFSQueue, ModelRunnerOutput, RecomputePreemption, Scheduler
from lab.scheduler.output import SchedulerOutput
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
                   caching=True, threshold=0, queue=None, preemption=None) -> Scheduler:
    kv = KVCacheManager(num_blocks, block_size, max_model_len, enable_caching=caching)
    cfg = SchedulerConfig(max_num_seqs, budget, max_model_len, threshold)
    return Scheduler(cfg, kv, queue if queue is not None else FCFSQueue(),
                     preemption if preemption is not None else RecomputePreemption(),
                     clock=FakeClock())


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
    sampled = {}
    for rid in out.num_scheduled_tokens:
        req = sched.requests[rid]
        if req.num_computed_tokens >= req.num_tokens:
            sampled[rid] = fake_token(req.all_token_ids)
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
    """Run to completion, then: aborted requests are ABORTED, every other one has the fake
    model's exact tokens (cut only by max_model_len), and every block is free."""
    from lab.engine.request import RequestStatus

    run_to_completion(sched)
    for req in reqs:
        assert req.is_finished
        if req.request_id in aborted:
            assert req.status == RequestStatus.FINISHED_ABORTED
            continue
        want = expected_output(req.prompt_token_ids, req.sampling_params.max_tokens)
        assert req.output_token_ids == want[: req.num_output_tokens]
        assert req.num_output_tokens == len(want) or req.num_tokens == max_model_len
    assert sched.kv.num_free_blocks == sched.kv.num_blocks - 1
