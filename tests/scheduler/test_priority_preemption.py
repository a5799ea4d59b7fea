"""Priority preempts for admission (when max_num_seqs or blocks are the limit); reserve never
preempts; a request admitted and preempted in the same step is simply put back."""

from lab.engine.request import RequestStatus
from lab.scheduler.preemption import ReservePreemption
from lab.scheduler.queues import PriorityQueue
from tests.scheduler.fakes import (
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
