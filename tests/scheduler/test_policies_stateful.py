"""Hypothesis state machine over every queue policy and every preemption strategy: random
arrivals with priorities and clients, lengths, aborts, a tiny cache and a tiny swap space.

After every step: budgets and max_num_seqs hold; under `priority` no request admitted in the
step is less important than one left waiting (the head of the queue is the most important, and
admission stops at the head); under `sjf` no request that has waited past the aging bound is
passed over by one that has not; under `reserve` nothing is preempted; swap accounting is exact
(the swap space's used blocks are exactly those of the SWAPPED requests, each holding one CPU block
per computed block, and every request reads back its own tokens through the fake KV contents,
which follow each step's swap copies). At the end every request has finished with the fake
model's exact tokens (unless aborted), every device block is free and the swap space is empty."""

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule

from lab.core.request import RequestStatus
from tests.options import build, options
from tests.scheduler.fakes import (
    check_all_finished,
    fake_execute,
    make_request,
    make_scheduler,
)

QUEUES, STRATEGIES = options("scheduler"), options("preemption")  # every option of each group
KNOBS = {"sjf": {"aging_bound_s": 0.01}}  # ages within a run: both of sjf's orders are used
BUDGET, MAX_SEQS, MAX_LEN = 12, 3, 32


class PolicyMachine(RuleBasedStateMachine):
    @initialize(queue=st.sampled_from(QUEUES), strategy=st.sampled_from(STRATEGIES),
                swap_blocks=st.integers(0, 10))
    def setup(self, queue, strategy, swap_blocks):
        self.policy, self.strategy = queue, strategy
        self.s = make_scheduler(num_blocks=12, block_size=4, max_num_seqs=MAX_SEQS, budget=BUDGET,
                                max_model_len=MAX_LEN, queue=build("scheduler", queue, **KNOBS.get(queue, {})),
                                preemption=build("preemption", strategy), swap_blocks=swap_blocks)
        self.reqs, self.aborted = [], set()

    @rule(prompt=st.lists(st.integers(1, 6), min_size=1, max_size=18),
          max_tokens=st.integers(1, 8), priority=st.integers(0, 3), client=st.sampled_from("abc"))
    def arrive(self, prompt, max_tokens, priority, client):
        req = make_request(self.s, prompt, max_tokens=max_tokens)
        self.s.waiting.remove(req)
        req.priority, req.client_id = priority, client
        self.s.waiting.add(req)
        self.reqs.append(req)

    @rule()
    def step(self):
        out = self.s.schedule()
        assert out.total_num_scheduled_tokens <= BUDGET
        assert len(self.s.running) <= MAX_SEQS
        if self.strategy == "reserve":
            assert not out.preempted_req_ids
        admitted = [self.s.requests[r.req_id] for r in out.scheduled_new_reqs]
        admitted += [self.s.requests[c.req_id] for c in out.scheduled_cached_reqs
                     if c.resumed_from_preemption]
        if self.policy == "priority":
            for req in admitted:
                assert all(w.priority >= req.priority for w in self.s.waiting)
        if self.policy == "sjf" and any(not self.s.waiting.is_aged(r) for r in admitted):
            assert not any(self.s.waiting.is_aged(w) for w in self.s.waiting)
        if self.strategy != "swap":
            assert not out.swap_out and not out.swap_in
        self.check_swap_accounting(out)
        self.s.update_from_output(out, fake_execute(self.s, out))

    def check_swap_accounting(self, out):
        swap, bs = self.s.kv.swap_space, self.s.kv.block_size
        swapped = {r.request_id: r for r in self.s.waiting if r.status == RequestStatus.SWAPPED}
        assert set(swap.req_to_blocks) == set(swapped)
        for rid, blocks in swap.req_to_blocks.items():
            assert len(blocks) == -(-swapped[rid].num_computed_tokens // bs)
        held = [b for blocks in swap.req_to_blocks.values() for b in blocks]
        assert len(held) == len(set(held)) == swap.num_used_blocks
        assert all(0 <= b < swap.num_blocks for b in held)
        assert len({c for _, c in out.swap_out}) == len(out.swap_out)

    @precondition(lambda self: self.reqs)
    @rule(data=st.data())
    def abort(self, data):
        req = data.draw(st.sampled_from(self.reqs))
        if not req.is_finished:
            self.aborted.add(req.request_id)
        self.s.abort_requests([req.request_id])

    def teardown(self):
        if not hasattr(self, "s"):
            return
        check_all_finished(self.s, self.reqs, self.aborted, MAX_LEN)


TestPolicies = PolicyMachine.TestCase
