"""Hypothesis state machine: random arrivals, lengths, aborts and a tiny KV cache.

After every step: the token budget and max_num_seqs hold, running requests own blocks that cover
their computed tokens, and no block is owned by a finished request. At the end every request has
finished (with the fake model's exact output unless aborted) and every block is free.
"""

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from tests.scheduler.fakes import (
    check_all_finished,
    fake_execute,
    make_request,
    make_scheduler,
)

BUDGET, MAX_SEQS, BLOCK, NUM_BLOCKS, MAX_LEN = 12, 3, 4, 10, 32


class SchedulerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.s = make_scheduler(num_blocks=NUM_BLOCKS, block_size=BLOCK, max_num_seqs=MAX_SEQS,
                                budget=BUDGET, max_model_len=MAX_LEN)
        self.reqs = []
        self.aborted = set()

    @rule(prompt=st.lists(st.integers(1, 6), min_size=1, max_size=20),
          max_tokens=st.integers(1, 10))
    def arrive(self, prompt, max_tokens):
        self.reqs.append(make_request(self.s, prompt, max_tokens=max_tokens))

    @rule()
    def step(self):
        out = self.s.schedule()
        assert out.total_num_scheduled_tokens <= BUDGET
        assert len(self.s.running) <= MAX_SEQS
        assert all(n > 0 for n in out.num_scheduled_tokens.values())
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
        kv = self.s.kv
        for req in self.s.running:
            assert len(kv.get_block_ids(req.request_id)[0]) * BLOCK >= req.num_computed_tokens
        for req in self.reqs:
            if req.is_finished:
                assert kv.get_block_ids(req.request_id) == ([],)

    def teardown(self):
        check_all_finished(self.s, self.reqs, self.aborted, MAX_LEN)


TestScheduler = SchedulerMachine.TestCase
