"""preemption=swap in the scheduler: victims park their computed blocks in the swap space, resume
before new admissions by copying them back, fall back to recompute when the space is full, and
an abort of a swapped request frees its CPU blocks."""

import pytest

from lab.cache.hashing import make_block_hasher
from lab.cache.manager import KVCacheManager
from lab.cache.swap import SwapSpace
from lab.core.request import Request, RequestStatus
from lab.core.sampling_params import SamplingParams
from lab.scheduler.preemption import SwapPreemption
from tests.scheduler.fakes import (
    EOS,
    check_all_finished,
    fake_execute,
    make_request,
    make_scheduler,
)


def _step(s):
    out = s.schedule()
    s.update_from_output(out, fake_execute(s, out))
    return out


def _contended(swap_blocks):
    """Two requests that fit at first (2 blocks each of 4 usable) and outgrow the cache."""
    s = make_scheduler(num_blocks=5, block_size=4, budget=32, preemption=SwapPreemption(),
                       swap_blocks=swap_blocks)
    a = make_request(s, [1, 2, 3, 4, 5, 6], max_tokens=8)
    b = make_request(s, [2, 3, 4, 5, 6, 7], max_tokens=8)
    return s, a, b


def _until_preempted(s):
    for _ in range(50):
        out = _step(s)
        if out.preempted_req_ids:
            return out
    raise AssertionError("no preemption happened")


def test_victim_is_swapped_out_and_resumes_with_its_computed_tokens():
    s, a, b = _contended(swap_blocks=8)
    out = _until_preempted(s)
    assert out.preempted_req_ids == {b.request_id}
    assert b.status == RequestStatus.SWAPPED and b.num_preemptions == 1
    computed = b.num_computed_tokens
    assert computed > 0 and len(out.swap_out) == -(-computed // 4)
    assert s.kv.get_block_ids(b.request_id) == ([],)  # device blocks given back at once
    assert s.events.preempted_by_strategy == {"swap": 1} and s.num_swapped == 1
    assert s.has_unfinished_requests()
    late = make_request(s, [9, 9, 9], max_tokens=1)  # arrives after the swap-out
    for _ in range(50):
        out = _step(s)
        if out.swap_in:
            break
    resumed = {c.req_id: c for c in out.scheduled_cached_reqs}[b.request_id]
    assert resumed.resumed_from_preemption and resumed.num_computed_tokens == computed
    assert [d for _, d in out.swap_in] == s.kv.get_block_ids(b.request_id)[0][: len(out.swap_in)]
    check_all_finished(s, [a, b, late], set(), 64)  # exact tokens through the fake KV contents
    assert b.times.time_swapped > 0 and b.times.time_preempted >= b.times.time_swapped


def test_swapped_request_is_admitted_before_a_newer_one():
    s, a, b = _contended(swap_blocks=8)
    _until_preempted(s)
    late = make_request(s, [9, 9, 9], max_tokens=1)
    assert s.waiting.peek() is b  # requeued at the front
    while b.status == RequestStatus.SWAPPED:
        out = _step(s)
        order = list(out.num_scheduled_tokens)  # admission order within the step
        if late.request_id in order:  # only together with b, and after it
            assert order.index(b.request_id) < order.index(late.request_id)
    check_all_finished(s, [a, b, late], set(), 64)


def test_full_swap_space_falls_back_to_recompute_and_counts_it():
    s, a, b = _contended(swap_blocks=1)  # too small for b's blocks
    out = _until_preempted(s)
    assert b.status == RequestStatus.PREEMPTED and b.num_computed_tokens == 0
    assert not out.swap_out and s.events.num_swap_fallbacks == 1
    assert s.events.preempted_by_strategy == {"recompute": 1}
    check_all_finished(s, [a, b], set(), 64)


def test_abort_of_a_swapped_request_frees_its_cpu_blocks():
    s, a, b = _contended(swap_blocks=8)
    _until_preempted(s)
    assert s.kv.swap_space.num_used_blocks > 0
    s.abort_requests([b.request_id])
    assert b.status == RequestStatus.FINISHED_ABORTED
    assert s.kv.swap_space.num_used_blocks == 0 and s.num_swapped == 0
    check_all_finished(s, [a, b], {b.request_id}, 64)


def test_swap_space_hands_out_ids_lazily_and_releases_swap_ins_at_the_step_end():
    space = SwapSpace(1_000_000)  # costs nothing until used
    assert space.num_free_blocks == 1_000_000
    assert space.swap_out("r", [7, 3])
    assert space.take_step().swap_out == [(7, 0), (3, 1)]
    space.swap_in("r", [4, 5])
    assert space.swap_out("q", [9])  # may not reuse r's CPU blocks within this step
    step = space.take_step()
    assert step.swap_in == [(0, 4), (1, 5)] and step.swap_out == [(9, 2)]
    assert space.num_used_blocks == 1  # r's blocks are free after the step
    assert not space.swap_out("big", list(range(10**6)))
    assert space.take_step().num_refused == 1


def test_undo_swap_in_keeps_the_request_swapped():
    space = SwapSpace(4)
    space.swap_out("r", [1, 2])
    space.take_step()
    space.swap_in("r", [5, 6])
    space.undo_swap_in("r")
    step = space.take_step()
    assert step.swap_in == [] and space.req_to_blocks["r"] == [0, 1]
    assert space.num_used_blocks == 2


def test_swap_space_size_and_bad_values():
    kv = KVCacheManager(8, 4, 64, swap_space_gb=1, bytes_per_block=2**20)
    assert kv.swap_space.num_blocks == 1024
    for bad in (-1, -0.5, "4"):
        with pytest.raises(ValueError, match="cache.swap_space_gb"):
            KVCacheManager(8, 4, 64, swap_space_gb=bad, bytes_per_block=2**20)
    with pytest.raises(ValueError, match="num_blocks"):
        SwapSpace(-1)


def _swapped_out(kv: KVCacheManager, tokens: list[int]):
    """A request whose 10 tokens were computed (2 full blocks cached), then swapped out."""
    req = Request("r", tokens, SamplingParams(max_tokens=4), EOS, 0.0,
                  block_hasher=make_block_hasher(kv.block_size))
    assert kv.allocate_slots(req, len(tokens)) is not None
    req.num_computed_tokens = len(tokens)
    kv.cache_computed(req)
    assert kv.swap_out(req)
    return req, kv.take_swap_step()


def test_resume_takes_back_the_blocks_still_cached_on_the_device_and_copies_the_rest():
    """The soak issue: swap got ~10x fewer prefix-cache hits than recompute because a resumed
    request copied every block in from the CPU although its freed device blocks, known by their
    hashes, were mostly still cached. Now only the missing ones are copied."""
    kv = KVCacheManager(16, 4, 64)
    kv.swap_space = SwapSpace(8)
    req, out = _swapped_out(kv, list(range(10)))
    old = [d for d, _ in out.swap_out]  # 3 device blocks, the first 2 full and cached
    kv.take_prefix_cache_stats()
    assert kv.resume_swapped(req, 1) is not None
    now = kv.get_block_ids(req.request_id)[0]
    assert now[:2] == old[:2]  # taken back from the prefix cache: no copy
    step = kv.take_swap_step()
    assert [d for _, d in step.swap_in] == [now[2]] and step.num_reclaimed == 2
    stats = kv.take_prefix_cache_stats()
    assert (stats.queries, stats.hits) == (10, 8)
    assert kv.swap_space.num_used_blocks == 0  # every CPU block released at the step's end


def test_resume_copies_what_was_evicted_and_undo_restores_the_swap():
    kv = KVCacheManager(5, 4, 64)  # 4 usable blocks
    kv.swap_space = SwapSpace(8)
    req, _ = _swapped_out(kv, list(range(10)))
    hog = Request("hog", [7] * 16, SamplingParams(), EOS, 0.0, block_hasher=make_block_hasher(4))
    assert kv.allocate_slots(hog, 16) is not None  # takes all 4 blocks: the cached ones evicted
    kv.free(hog)
    assert kv.resume_swapped(req, 1) is not None
    kv.undo_resume(req)  # un-admitted within the step: swapped out again, nothing copied
    assert kv.swap_space.holds(req.request_id) and kv.get_block_ids(req.request_id) == ([],)
    step = kv.take_swap_step()
    assert step.swap_in == [] and step.num_reclaimed == 0
    assert kv.resume_swapped(req, 1) is not None
    assert len(kv.take_swap_step().swap_in) == 3
