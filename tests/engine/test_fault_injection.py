"""Fault injection through EngineCore: an executor that raises on hypothesis-chosen steps, under
every scheduler x preemption pair (read from conf/), on a tiny cache and swap space.

A fault comes in three kinds: `before` (nothing of the step ran), `garbage` (the step wrote
garbage into every KV slot and swap block it would have written, then raised: a crash mid-forward)
and `after` (the forward ran, sampling or the return failed). After each fault the failed requests
are exactly those the failing step scheduled, each finished with `error`; every other request ends
with the fake model's exact tokens, reading back its own tokens through the fake KV contents at
every step (so a lost swap copy shows up as a wrong token), and after every step each block in the
prefix cache holds the tokens its hash stands for; at the end every device block and every swap
block is free.
"""

from __future__ import annotations

from collections import Counter

import pytest
from hydra.utils import instantiate
from hypothesis import given, settings
from hypothesis import strategies as st

from lab.core.request import RequestStatus
from lab.core.step import ModelRunnerOutput, SchedulerOutput
from lab.engine.core import EngineCore
from tests.options import option_yaml, options
from tests.scheduler.fakes import (
    ModelFreeExecutor,
    check_outcomes,
    fake_execute,
    make_request,
    make_scheduler,
)

MAX_LEN, BLOCK = 32, 4
TALLY: Counter[str] = Counter()  # over the module's examples; printed with -s


@pytest.fixture(scope="module", autouse=True)
def _report():
    yield
    print(f"\nfault injection: {dict(TALLY)}")
PAIRS = [(q, p) for q in options("scheduler") for p in options("preemption")]


class InjectedFault(Exception):
    pass


class FaultyExecutor(ModelFreeExecutor):
    """The fake model (tests/scheduler/fakes.py) with faults on chosen execute_model calls."""

    def __init__(self, scheduler, faults: list[tuple[int, str, str]]) -> None:
        self.scheduler = scheduler
        self.faults = sorted(faults)  # (first call, condition, kind): see WHEN
        self.calls = 0
        self.failed_steps: list[SchedulerOutput] = []

    def _fault(self, sched: SchedulerOutput) -> str | None:
        """The kind of the first armed fault whose condition this step meets (it is used up)."""
        for i, (first, when, kind) in enumerate(self.faults):
            if first <= self.calls and WHEN[when](sched):
                del self.faults[i]
                return kind
        return None

    def execute_model(self, sched: SchedulerOutput) -> ModelRunnerOutput:
        kind = self._fault(sched)
        self.calls += 1
        if kind is not None:
            self.failed_steps.append(sched)
        if kind == "before":
            raise InjectedFault(self.calls - 1)
        if kind == "garbage":
            self._scribble(sched)
            raise InjectedFault(self.calls - 1)
        out = fake_execute(self.scheduler, sched)
        if kind == "after":
            raise InjectedFault(self.calls - 1)
        return out

    def _scribble(self, sched: SchedulerOutput) -> None:
        """Garbage in every slot the step writes: its tokens' slots and its swap copies."""
        kv, fake, bs = self.scheduler.kv, self.scheduler.fake_kv, BLOCK
        for _, cpu in sched.swap_out:
            fake.cpu[cpu] = [-1] * bs
        for _, dev in sched.swap_in:
            fake.device[dev] = [-1] * bs
        for rid, n in sched.num_scheduled_tokens.items():
            req = self.scheduler.requests[rid]
            for blocks in kv.get_block_ids(rid):
                for pos in range(req.num_computed_tokens - n, req.num_computed_tokens):
                    fake._block(fake.device, blocks[pos // bs])[pos % bs] = -1


PREFIXES = ([], [1, 2, 3, 4], [1, 2, 3, 4, 5, 6, 1, 2], [6, 6, 6, 6, 6])  # so prefix hits happen
PROMPTS = st.builds(lambda prefix, own: prefix + own, st.sampled_from(PREFIXES),
                    st.lists(st.integers(1, 6), min_size=1, max_size=12))
REQUESTS = st.lists(  # (prompt, max_tokens, arrival step, priority)
    st.tuples(PROMPTS, st.integers(1, 8), st.integers(0, 12), st.integers(0, 2)),
    min_size=1, max_size=10)
# a fault is armed from a step on and fires at the first step that meets its condition, so the
# rare steps (a swap-out, a swap-in, a preemption) fail as often as the common ones
WHEN = {
    "any": lambda sched: True,
    "swap_out": lambda sched: bool(sched.swap_out),
    "swap_in": lambda sched: bool(sched.swap_in),
    "preempted": lambda sched: bool(sched.preempted_req_ids),
    "new": lambda sched: bool(sched.scheduled_new_reqs),
}
FAULTS = st.lists(st.tuples(st.integers(0, 12), st.sampled_from(sorted(WHEN)),
                            st.sampled_from(["before", "garbage", "after"])), max_size=5)


@pytest.mark.parametrize(("queue", "preemption"), PAIRS)
@settings(max_examples=40)
@given(requests=REQUESTS, faults=FAULTS, swap_blocks=st.integers(4, 16))
def test_faults_fail_exactly_their_step(queue, preemption, requests, faults, swap_blocks):
    s = make_scheduler(num_blocks=10, block_size=BLOCK, max_num_seqs=3, budget=12,
                       max_model_len=MAX_LEN, queue=_build("scheduler", queue),
                       preemption=_build("preemption", preemption), swap_blocks=swap_blocks)
    executor = FaultyExecutor(s, faults)
    core = EngineCore(s, executor, clock=s.clock)
    reqs, failed = _run(core, s, executor, requests)
    assert len(executor.failed_steps) == len(failed)
    for sched, ids in zip(executor.failed_steps, failed):
        assert ids == set(sched.num_scheduled_tokens)  # exactly the requests of that step
    lost = set().union(*failed)  # only the requests of failing steps
    check_outcomes(s, reqs, dict.fromkeys(lost, RequestStatus.FINISHED_ERROR), MAX_LEN)
    assert not s.requests
    TALLY.update(examples=1, faults=len(failed), failed_requests=len(lost),
                 exact_requests=len(reqs) - len(lost), leaked_blocks=s.kv.num_used_blocks)


def _check_prefix_cache(s, reqs) -> None:
    """Every block in the prefix cache holds the tokens its hash stands for (a failed step must
    leave no entry for KV it did not compute or copy, whether or not anyone hits it later)."""
    tokens_of = {h: r.all_token_ids[i * BLOCK:(i + 1) * BLOCK]
                 for r in reqs for i, h in enumerate(r.block_hashes)}
    for block_hash, block in s.kv.block_pool.cached_block_hash_to_block.items():
        held = s.fake_kv._block(s.fake_kv.device, block.block_id)
        assert held == tokens_of[block_hash], f"block {block.block_id} is cached but holds {held}"


def _build(group: str, option: str):
    """The plug-in of lab/conf/<group>/<option>.yaml (these options need no runtime arguments)."""
    return instantiate(option_yaml(group, option))


def _run(core, s, executor, requests):
    """Arrive at their steps, step to the end; returns (requests, failed id sets per fault)."""
    reqs, failed = [], []
    step = 0
    while step <= 12 or core.has_unfinished_requests():
        for prompt, max_tokens, arrival, prio in requests:
            if arrival == step:
                req = make_request(s, prompt, max_tokens=max_tokens)
                s.waiting.remove(req)
                req.priority = prio
                s.waiting.add(req)
                reqs.append(req)
        if core.has_unfinished_requests():
            try:
                core.step()
            except InjectedFault:
                failed.append({r.request_id for r in core.take_failed()})
            _check_prefix_cache(s, reqs)
        step += 1
        assert step < 2000, "no progress"
    return reqs, failed
