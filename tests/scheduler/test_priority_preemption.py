"""Priority preempts for admission (when max_num_seqs or blocks are the limit); reserve never
preempts; a request admitted and preempted in the same step is simply put back."""

from lab.core.request import RequestStatus
from lab.scheduler.preemption import ReservePreemption
from lab.scheduler.queues import PriorityQueue
from tests.scheduler.fakes import (
    check_all_finished,
    expected_output,
    fake_execute,
    make_request,
    make_scheduler,
    run_to_completion,
)


def _step(s):
    out = s.schedule()
    s.update_from_output(out, fake_execute(s, out))
    return out


def test_higher_priority_preempts_when_max_num_seqs_is_full():
    s = make_scheduler(max_num_seqs=2, num_blocks=64, queue=PriorityQueue())
    low = []
    for _ in range(2):
        req = make_request(s, [1, 2, 3], max_tokens=20)
        req.priority = 5
        low.append(req)
    _step(s)
    high = make_request(s, [4, 5], max_tokens=3)
    high.priority = 0
    s.waiting.remove(high)
    s.waiting.add(high)  # re-key with its priority
    out = _step(s)
    assert high.request_id in out.num_scheduled_tokens
    assert low[1].status == RequestStatus.PREEMPTED and low[1].request_id in out.preempted_req_ids
    assert len(s.running) <= 2
    run_to_completion(s)
    for r in [*low, high]:
        assert r.output_token_ids == expected_output(r.prompt_token_ids, r.sampling_params.max_tokens)


def test_higher_priority_preempts_when_blocks_are_short():
    s = make_scheduler(num_blocks=6, block_size=4, max_model_len=40, queue=PriorityQueue())
    low = make_request(s, range(1, 17), max_tokens=4)  # 4 of the 5 usable blocks
    low.priority = 9
    s.waiting.remove(low)
    s.waiting.add(low)
    _step(s)
    high = make_request(s, range(20, 29), max_tokens=2)  # needs 3 blocks
    out = _step(s)
    assert low.request_id in out.preempted_req_ids and high.request_id in out.num_scheduled_tokens
    run_to_completion(s)
    assert s.kv.num_free_blocks == s.kv.num_blocks - 1


def test_reserve_never_preempts():
    s = make_scheduler(num_blocks=12, block_size=4, max_model_len=40,
                       preemption=ReservePreemption())
    reqs = [make_request(s, range(1, 1 + n), max_tokens=10) for n in (5, 9, 13, 3, 7)]
    seen = []
    run_to_completion(s, on_step=lambda out: seen.append(out.preempted_req_ids))
    assert not any(seen)
    for r in reqs:
        assert r.output_token_ids == expected_output(r.prompt_token_ids, 10)


def _arrive(s, prompt, priority, max_tokens=1):
    req = make_request(s, prompt, max_tokens=max_tokens)
    s.waiting.remove(req)
    req.priority = priority
    s.waiting.add(req)  # re-key with its priority
    return req


def test_victim_scheduled_this_step_leaves_no_uncomputed_block_in_the_prefix_cache():
    """A block that became full only through this step's tokens is committed to the prefix cache
    at allocation; when its request is then preempted in the same step, those tokens are never
    computed, so the block must leave the cache (found by the fake KV contents of the policy state
    machine: the re-admitted victim hit its own unwritten block)."""
    s = make_scheduler(num_blocks=12, block_size=4, max_num_seqs=3, budget=12, max_model_len=32,
                       queue=PriorityQueue())
    first = [_arrive(s, [1], 0), _arrive(s, [1] * 13, 1)]
    _step(s)  # the long one computes 11 of 13 tokens: blocks 0, 1 full, block 2 holds 3 tokens
    late = [_arrive(s, [1], 0) for _ in range(3)]
    out = _step(s)  # it is scheduled for tokens 11, 12 (block 2 full), then preempted
    victim = first[1]
    assert victim.request_id in out.preempted_req_ids
    assert len([b for b in s.kv.block_pool.blocks if b.block_hash is not None]) == 2
    out = _step(s)
    resumed = {c.req_id: c for c in out.scheduled_cached_reqs}[victim.request_id]
    assert resumed.num_computed_tokens == 8  # hits only the two computed blocks
    check_all_finished(s, first + late, set(), 32)  # every read checked by the fake KV contents


def test_request_hitting_a_stale_block_this_step_is_unadmitted_with_the_victim():
    """B (priority 0) is admitted in the step that fills A's second block and hits it; C
    (priority 1) then needs A's seat, so A (priority 2, scheduled earlier in the step) is
    preempted: its block will not be written, so B's admission is taken back too and B is
    admitted again on the computed prefix only."""
    s = make_scheduler(num_blocks=32, block_size=4, max_num_seqs=2, budget=32, max_model_len=32,
                       queue=PriorityQueue())
    a = _arrive(s, [7] * 6, 2, max_tokens=5)
    _step(s)  # prompt: block 0 full, block 1 holds 2 tokens; samples token 6
    _step(s)  # computes token 6, samples token 7
    b = _arrive(s, a.all_token_ids[:8] + [5], 0)  # its first two blocks equal a's
    c = _arrive(s, [9, 9], 1)
    out = _step(s)  # a's token 7 fills block 1 (committed), b hits it, c preempts a
    assert a.request_id in out.preempted_req_ids
    new = {n.req_id: n for n in out.scheduled_new_reqs}
    assert new[b.request_id].num_computed_tokens == 4  # block 0 only: block 1 was never written
    assert c.request_id in new
    check_all_finished(s, [a, b, c], set(), 32)
