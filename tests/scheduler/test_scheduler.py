"""Scheduler scenarios against a fake model (vLLM's scheduler test list, §9 of the notes)."""

import pytest

from lab.core.request import RequestStatus
from tests.scheduler.fakes import (
    expected_output,
    fake_execute,
    make_request,
    make_scheduler,
    run_to_completion,
)


def test_budget_and_chunked_prefill_sample_only_on_last_chunk():
    s = make_scheduler(budget=8, num_blocks=64, max_model_len=128)
    req = make_request(s, range(1, 21), max_tokens=2)
    chunks = []
    for _ in range(3):
        out = s.schedule()
        assert out.total_num_scheduled_tokens <= 8
        chunks.append(out.num_scheduled_tokens[req.request_id])
        s.update_from_output(out, fake_execute(s, out))
        if len(chunks) < 3:
            assert req.num_output_tokens == 0
    assert chunks == [8, 8, 4]
    assert req.num_output_tokens == 1


def test_fcfs_order_and_max_num_seqs():
    s = make_scheduler(max_num_seqs=2, budget=100, num_blocks=64)
    reqs = [make_request(s, [1, 2, 3]) for _ in range(3)]
    out = s.schedule()
    assert list(out.num_scheduled_tokens) == [reqs[0].request_id, reqs[1].request_id]
    assert reqs[2].status == RequestStatus.WAITING


def test_preemption_recompute_requeues_at_head_and_admits_nothing():
    s = make_scheduler(num_blocks=5, block_size=4, budget=64, max_model_len=16)
    a = make_request(s, range(1, 7), max_tokens=10)  # 2 blocks now, 4 at the end
    b = make_request(s, range(7, 13), max_tokens=10)
    c = make_request(s, range(13, 17), max_tokens=2)
    preempted_steps = []

    def check(out):
        if out.preempted_req_ids:
            preempted_steps.append(out)
            assert not out.scheduled_new_reqs  # nothing admitted in a step that preempted
            victim = s.waiting.peek()
            assert victim.request_id in out.preempted_req_ids
            assert victim.num_computed_tokens == 0

    run_to_completion(s, on_step=check)
    assert preempted_steps
    for r in (a, b, c):
        assert r.output_token_ids == expected_output(r.prompt_token_ids, r.sampling_params.max_tokens)
    assert s.kv.num_free_blocks == s.kv.num_blocks - 1


def test_full_prefix_hit_still_schedules_a_token():
    s = make_scheduler(block_size=4, num_blocks=64)
    first = make_request(s, range(1, 9), max_tokens=1)
    run_to_completion(s)
    second = make_request(s, range(1, 9), max_tokens=1)
    out = s.schedule()
    assert second.num_cached_tokens == 4  # the last block holds the last prompt token: recomputed
    assert out.num_scheduled_tokens[second.request_id] == 4
    s.update_from_output(out, fake_execute(s, out))
    assert second.output_token_ids == first.output_token_ids


def test_stops():
    s = make_scheduler(max_model_len=12, num_blocks=64)
    capped = make_request(s, range(1, 9), max_tokens=50)
    tokens = make_request(s, [5], max_tokens=3)
    run_to_completion(s)
    assert capped.num_tokens == 12 and capped.finish_reason == "length"
    assert tokens.num_output_tokens == 3 and tokens.finish_reason == "length"


# The fake model's greedy stream after the prompt [3, 4] repeats with period 4 (hand-checked
# from fake_token); each case is (eos, stop_token_ids, min_tokens, ignore_eos) -> the outputs.
STREAM = [19, 9, 39, 49, 19, 9, 39, 49, 19, 9]
STOP_CASES = {
    "eos": (19, [], 0, False, 1),  # the first token is EOS
    "stop_token": (0, [9], 0, False, 2),
    "eos_held_by_min_tokens": (19, [], 3, False, 5),  # EOS at output 1 ignored; next at 5
    "eos_at_min_tokens": (19, [], 5, False, 5),  # the min_tokens-th output may stop
    "stop_held_by_min_tokens": (0, [9], 3, False, 6),
    "stop_at_min_tokens": (0, [9], 2, False, 2),
    "stop_before_eos_after_min": (19, [39], 2, False, 3),
    "ignore_eos_with_min_tokens": (19, [], 3, True, 10),  # runs to max_tokens
    "no_stop_in_stream": (0, [7], 4, False, 10),
}


@pytest.mark.parametrize("case", list(STOP_CASES))
def test_eos_min_tokens_and_stop_token_ids(case):
    """No stop before min_tokens outputs; then a stop exactly at the first EOS (unless
    ignore_eos) or stop token; else max_tokens. Expected counts are read off STREAM by hand."""
    eos, stops, min_tokens, ignore_eos, want = STOP_CASES[case]
    assert expected_output([3, 4], 10) == STREAM
    s = make_scheduler(num_blocks=64)
    req = make_request(s, [3, 4], max_tokens=10, ignore_eos=ignore_eos, min_tokens=min_tokens,
                       stop_token_ids=stops)
    req.eos_token_id = eos
    others = [make_request(s, [3, 4], max_tokens=10)]  # a batch neighbour without stops
    run_to_completion(s)
    assert req.output_token_ids == STREAM[:want]
    assert req.finish_reason == ("length" if want == 10 else "stop")
    assert req.stop_reason == (STREAM[want - 1] if want < 10 and STREAM[want - 1] in stops
                               else None)
    assert others[0].output_token_ids == STREAM


@pytest.mark.parametrize("where", ["waiting", "running"])
def test_abort_frees_blocks(where):
    s = make_scheduler(num_blocks=64)
    req = make_request(s, range(1, 10), max_tokens=20)
    if where == "running":
        out = s.schedule()
        s.update_from_output(out, fake_execute(s, out))
        assert s.kv.num_used_blocks > 0
    s.abort_requests([req.request_id])
    assert req.status == RequestStatus.FINISHED_ABORTED
    assert s.kv.num_free_blocks == s.kv.num_blocks - 1
    assert not s.has_unfinished_requests()
    assert req.request_id in s.schedule().finished_req_ids


def test_long_prefill_threshold_caps_chunks():
    s = make_scheduler(budget=64, threshold=5, num_blocks=64)
    req = make_request(s, range(1, 13), max_tokens=1)
    out = s.schedule()
    assert out.num_scheduled_tokens[req.request_id] == 5
