"""The scheduler's side of speculative decoding, with a fake model (tests/scheduler/fakes.py):
drafts are owed and budgeted, rejected drafts are taken back (num_computed_tokens steps back,
their blocks are freed), only accepted tokens reach the prefix cache, and the outputs are the
fake model's exact tokens whatever was accepted — under chunked prefill, prefix hits and both
preemption strategies, checked after every step."""

from __future__ import annotations

import random

from hypothesis import given
from hypothesis import strategies as st

from lab.cache.single_type import cdiv
from lab.core.request import RequestStatus
from lab.core.step import ModelRunnerOutput, SchedulerOutput
from lab.scheduler.preemption import SwapPreemption
from lab.scheduler.scheduler import Scheduler
from tests.scheduler.fakes import (
    FakeKVContents,
    check_outcomes,
    fake_token,
    make_request,
    make_scheduler,
)


class SpecFakeKV(FakeKVContents):
    """FakeKVContents whose steps write drafts after a request's tokens, and whose read-back
    covers the tokens computed before the step: a rejected draft counted as computed, or a
    prefix hit on a block holding one, reads back a wrong token."""

    def step(self, sched: Scheduler, out: SchedulerOutput) -> None:
        self.apply_swaps(out)
        bs = self.block_size
        for rid, n in out.num_scheduled_tokens.items():
            req = sched.requests[rid]
            tokens = req.all_token_ids + out.scheduled_spec_decode_tokens.get(rid, [])
            start = req.num_computed_tokens - n
            (blocks,) = sched.kv.get_block_ids(rid)
            seen = [self._block(self.device, blocks[p // bs])[p % bs] for p in range(start)]
            assert seen == req.all_token_ids[:start], f"{rid} reads wrong KV"
            for pos in range(start, start + n):
                assert blocks[pos // bs] != 0, f"{rid} writes the null block"
                self._block(self.device, blocks[pos // bs])[pos % bs] = tokens[pos]


def verify(tokens: list[int], drafts: list[int]) -> list[int]:
    """What a greedy target emits after `tokens` given `drafts`: the accepted run, then its own
    token."""
    tokens, emitted = list(tokens), []
    for d in drafts:
        t = fake_token(tokens)
        emitted.append(t)
        tokens.append(t)
        if d != t:
            return emitted
    return emitted + [fake_token(tokens)]


def propose(tokens: list[int], count: int, rng: random.Random) -> list[int]:
    """`count` drafts: the fake model's next tokens, each wrong with probability 1/3."""
    tokens, drafts = list(tokens), []
    for _ in range(count):
        t = fake_token(tokens)
        drafts.append(t if rng.random() < 2 / 3 else (t + 1) % 50)
        tokens.append(t)
    return drafts


def spec_execute(sched: Scheduler, out: SchedulerOutput, k: int,
                 rng: random.Random) -> ModelRunnerOutput:
    sched.fake_kv.step(sched, out)
    result = ModelRunnerOutput()
    for rid in out.num_scheduled_tokens:
        req = sched.requests[rid]
        drafts = out.scheduled_spec_decode_tokens.get(rid, [])
        if req.num_computed_tokens < req.num_tokens + len(drafts):
            continue  # a prompt chunk: nothing sampled
        emitted = verify(req.all_token_ids, drafts)
        result.sampled_token_ids[rid] = emitted
        after = req.all_token_ids + emitted
        room = min(k, sched.config.max_model_len - len(after),
                   req.sampling_params.max_tokens - req.num_output_tokens - len(emitted) - 1)
        if room > 0:
            result.spec_token_ids[rid] = propose(after, rng.randint(0, room), rng)
    return result


def check_blocks(sched: Scheduler) -> None:
    """A running request holds exactly the blocks of its computed tokens (rejected drafts' were
    freed), and the prefix cache holds none of its blocks past them."""
    manager = sched.kv.coordinator.managers[0]
    for req in sched.running:
        rid, bs = req.request_id, sched.kv.block_size
        assert len(manager.req_to_blocks[rid]) == cdiv(req.num_computed_tokens, bs), rid
        assert manager.num_cached_block.get(rid, 0) * bs <= req.num_computed_tokens, rid


@given(
    prompts=st.lists(st.lists(st.integers(1, 49), min_size=1, max_size=14), min_size=1,
                     max_size=5),
    shared=st.lists(st.integers(1, 49), max_size=8),
    max_tokens=st.integers(1, 12),
    k=st.integers(1, 4),
    num_blocks=st.integers(10, 40),
    budget=st.integers(6, 32),
    swap=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_drafts_rollbacks_and_block_accounting(prompts, shared, max_tokens, k, num_blocks,
                                               budget, swap, seed):
    sched = make_scheduler(num_blocks=num_blocks, block_size=4, budget=budget,
                           max_model_len=40, preemption=SwapPreemption() if swap else None,
                           swap_blocks=16 if swap else 0)
    sched.config.num_speculative_tokens = k
    sched.fake_kv = SpecFakeKV(4)
    rng = random.Random(seed)
    reqs = [make_request(sched, shared + p, max_tokens=max_tokens) for p in prompts]
    drafted = accepted = steps = 0
    while sched.has_unfinished_requests():
        out = sched.schedule()
        result = spec_execute(sched, out, k, rng)
        verified = {rid: (len(out.scheduled_spec_decode_tokens[rid]), len(tokens) - 1)
                    for rid, tokens in result.sampled_token_ids.items()
                    if rid in out.scheduled_spec_decode_tokens}
        sched.update_from_output(out, result)
        check_blocks(sched)
        ev = sched.spec_counts
        assert ev.num_draft_tokens == sum(d for d, _ in verified.values())
        assert ev.num_accepted_tokens == sum(a for _, a in verified.values())
        assert sum(ev.accepted_per_position) == ev.num_accepted_tokens
        drafted += ev.num_draft_tokens
        accepted += ev.num_accepted_tokens
        steps += 1
        assert steps < 2000, "no progress"
    check_outcomes(sched, reqs, {}, 40)
    assert sum(r.num_draft_tokens for r in reqs) == drafted
    assert sum(r.num_accepted_tokens for r in reqs) == accepted


def test_budget_cut_schedules_a_prefix_of_the_drafts():
    sched = make_scheduler(budget=3, block_size=4)
    sched.config.num_speculative_tokens = 4
    req = make_request(sched, [1, 2, 3], max_tokens=8)
    out = sched.schedule()
    sched.update_from_output(out, ModelRunnerOutput({req.request_id: [fake_token([1, 2, 3])]},
                                                    spec_token_ids={req.request_id: [7, 8, 9, 10]}))
    assert req.spec_token_ids == [7, 8, 9, 10]
    out = sched.schedule()
    assert out.num_scheduled_tokens[req.request_id] == 3
    assert out.scheduled_spec_decode_tokens[req.request_id] == [7, 8]
    assert req.spec_token_ids == []  # the rest is dropped, as in vLLM


def test_preemption_drops_the_drafts():
    sched = make_scheduler(num_blocks=3, block_size=4, budget=32)
    sched.config.num_speculative_tokens = 2
    a = make_request(sched, [1, 2, 3, 4], max_tokens=8)
    out = sched.schedule()
    sched.update_from_output(out, ModelRunnerOutput({a.request_id: [5]},
                                                    spec_token_ids={a.request_id: [6, 7]}))
    sched._preempt(a, type("Plan", (), {"admitted": {}, "num_tokens": {}, "budget": 0,
                                        "new_blocks": {}, "preempted": []})())
    assert a.status == RequestStatus.PREEMPTED and a.spec_token_ids == []
