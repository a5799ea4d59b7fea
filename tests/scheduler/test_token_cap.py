"""RequestQueue.token_cap: a policy caps the tokens one request gets in a step, alongside
long_prefill_token_threshold; budgets hold and outputs stay exact."""

from __future__ import annotations

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from lab.scheduler import FCFSQueue
from tests.scheduler.fakes import (
    check_all_finished,
    check_outcomes,
    fake_execute,
    make_request,
    make_scheduler,
    run_to_completion,
)


class CapQueue(FCFSQueue):
    """FCFS with a cap per request id (absent: no cap)."""

    name = "capped"

    def __init__(self) -> None:
        super().__init__()
        self.caps: dict[str, object] = {}

    def token_cap(self, request):
        return self.caps.get(request.request_id)


def _chunks(s, req, steps):
    got = []
    for _ in range(steps):
        out = s.schedule()
        got.append(out.num_scheduled_tokens.get(req.request_id, 0))
        s.update_from_output(out, fake_execute(s, out))
    return got


def test_the_policy_caps_one_request_and_not_the_other():
    queue = CapQueue()
    s = make_scheduler(budget=32, num_blocks=64, max_model_len=128, queue=queue)
    capped = make_request(s, range(1, 21), max_tokens=3)
    free = make_request(s, range(21, 41), max_tokens=3)
    queue.caps[capped.request_id] = 6
    out = s.schedule()
    assert out.num_scheduled_tokens == {capped.request_id: 6, free.request_id: 20}
    s.update_from_output(out, fake_execute(s, out))
    assert _chunks(s, capped, 3) == [6, 6, 2]  # the rest of the prompt, then a decode
    run_to_completion(s)
    check_outcomes(s, [capped, free], {}, 128)


@pytest.mark.parametrize(("threshold", "cap", "chunk"),
                         [(0, 5, 5), (3, 5, 3), (8, 5, 5), (4, None, 4)])
def test_the_smaller_of_threshold_and_cap_wins(threshold, cap, chunk):
    queue = CapQueue()
    s = make_scheduler(budget=32, num_blocks=64, max_model_len=128, threshold=threshold,
                       queue=queue)
    req = make_request(s, range(1, 13), max_tokens=2)
    queue.caps[req.request_id] = cap
    assert _chunks(s, req, 2) == [chunk, chunk]


def test_a_cap_counts_from_a_new_requests_prefix_hits():
    """A waiting request's first chunk starts after its prefix hits; the cap bounds it."""
    queue = CapQueue()
    s = make_scheduler(budget=32, block_size=4, num_blocks=64, max_model_len=128, queue=queue)
    make_request(s, range(1, 13), max_tokens=1)
    run_to_completion(s)
    again = make_request(s, range(1, 17), max_tokens=1)
    queue.caps[again.request_id] = 3
    out = s.schedule()
    assert again.num_cached_tokens == 12 and out.num_scheduled_tokens[again.request_id] == 3


@pytest.mark.parametrize("bad", [0, -1, 2.5, True, "4"])
def test_a_bad_cap_is_refused_naming_the_policy(bad):
    queue = CapQueue()
    s = make_scheduler(queue=queue)
    req = make_request(s, [1, 2, 3])
    queue.caps[req.request_id] = bad
    with pytest.raises(ValueError, match=r"CapQueue.token_cap returned .* None \(no cap\) or an "
                                         r"integer >= 1"):
        s.schedule()


BUDGET, MAX_SEQS, BLOCK, NUM_BLOCKS, MAX_LEN = 12, 3, 4, 10, 32


class CappedSchedulerMachine(RuleBasedStateMachine):
    """Random arrivals with random caps (or none), aborts and a tiny KV cache: every step
    keeps the budget, max_num_seqs and each request's cap; at the end outputs are exact."""

    def __init__(self) -> None:
        super().__init__()
        self.queue = CapQueue()
        self.s = make_scheduler(num_blocks=NUM_BLOCKS, block_size=BLOCK, max_num_seqs=MAX_SEQS,
                                budget=BUDGET, max_model_len=MAX_LEN, queue=self.queue)
        self.reqs = []
        self.aborted = set()

    @rule(prompt=st.lists(st.integers(1, 6), min_size=1, max_size=20),
          max_tokens=st.integers(1, 10), cap=st.none() | st.integers(1, 7))
    def arrive(self, prompt, max_tokens, cap):
        req = make_request(self.s, prompt, max_tokens=max_tokens)
        self.queue.caps[req.request_id] = cap
        self.reqs.append(req)

    @rule()
    def step(self):
        out = self.s.schedule()
        assert out.total_num_scheduled_tokens <= BUDGET
        assert len(self.s.running) <= MAX_SEQS
        for rid, n in out.num_scheduled_tokens.items():
            cap = self.queue.caps[rid]
            assert 0 < n <= (cap if cap is not None else BUDGET)
        self.s.update_from_output(out, fake_execute(self.s, out))

    @precondition(lambda self: self.reqs)
    @rule(data=st.data())
    def abort(self, data):
        req = data.draw(st.sampled_from(self.reqs))
        if not req.is_finished:
            self.aborted.add(req.request_id)
        self.s.abort_requests([req.request_id])

    @invariant()
    def blocks_cover_running(self):
        for req in self.s.running:
            assert len(self.s.kv.get_block_ids(req.request_id)[0]) * BLOCK >= req.num_computed_tokens

    def teardown(self):
        check_all_finished(self.s, self.reqs, self.aborted, MAX_LEN)


TestCappedScheduler = CappedSchedulerMachine.TestCase
