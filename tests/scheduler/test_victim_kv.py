"""The queue policy chooses the victim with a read-only view of the KV cache (KVCacheView)."""

from __future__ import annotations

import pytest

from lab.cache import KVCacheManager, KVCacheView, RequestBlocks, make_block_hasher
from lab.core.request import Request
from lab.core.sampling_params import SamplingParams
from lab.scheduler import FCFSQueue, PriorityQueue
from tests.scheduler.fakes import (
    check_outcomes,
    fake_execute,
    make_request,
    make_scheduler,
    run_to_completion,
)


class MostBlocksVictim(FCFSQueue):
    """FCFS order; the victim is the running request holding the most KV blocks (then the
    latest arrival). Records what it saw of each candidate."""

    name = "most_blocks"

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[dict[str, RequestBlocks]] = []

    def victim(self, running, kv=None):
        self.seen.append({r.request_id: kv.blocks_of(r) for r in running})
        return max(running, key=lambda r: (kv.blocks_of(r).num_blocks, r.sort_key()))


def _three_requests(queue):
    """7 usable blocks of 4 tokens, filled by prompts of 3, 14 and 6 tokens; at the third step
    the first request needs a second block and none is free."""
    s = make_scheduler(num_blocks=8, block_size=4, budget=64, max_model_len=64, queue=queue)
    reqs = [make_request(s, range(1, 1 + n), max_tokens=6) for n in (3, 14, 6)]
    return s, reqs


def _first_preemption(s):
    for _ in range(10):
        out = s.schedule()
        s.update_from_output(out, fake_execute(s, out))
        if out.preempted_req_ids:
            return out.preempted_req_ids
    raise AssertionError("no preemption")


def test_the_scheduler_preempts_the_request_the_policy_names_from_kv_information():
    queue = MostBlocksVictim()
    s, (a, b, c) = _three_requests(queue)
    assert _first_preemption(s) == {b.request_id}  # 4 blocks: the most
    (seen,) = queue.seen
    # b: 15 tokens computed in 4 blocks, 3 of them full and committed to the prefix cache
    assert seen[b.request_id] == RequestBlocks(4, 3, 0, 15)
    assert seen[a.request_id].num_blocks == 1 and seen[c.request_id].num_blocks == 2
    assert seen[b.request_id].num_freed_blocks == 4


def test_fcfs_still_preempts_the_newest():
    s, (_, _, c) = _three_requests(FCFSQueue())
    assert _first_preemption(s) == {c.request_id}


def test_a_kv_aware_policy_runs_every_request_to_its_exact_output():
    queue = MostBlocksVictim()
    s, reqs = _three_requests(queue)
    run_to_completion(s)
    check_outcomes(s, reqs, {}, 64)
    assert queue.seen


def _req(rid: str, tokens: list[int]) -> Request:
    return Request(rid, tokens, SamplingParams(), None, 0.0, block_hasher=make_block_hasher(4))


def test_view_counts_cached_and_shared_blocks():
    kv = KVCacheManager(num_blocks=8, block_size=4, max_model_len=64)
    view = KVCacheView(kv)
    first = _req("first", list(range(1, 9)))
    kv.allocate_slots(first, 8)
    first.num_computed_tokens = 8
    kv.cache_computed(first)
    second = _req("second", list(range(1, 9)))
    hits, num_hit = kv.get_computed_blocks(second)  # the last token is never a hit: 1 block
    kv.allocate_slots(second, 8 - num_hit, num_hit, hits)
    second.num_computed_tokens = num_hit
    assert view.blocks_of(first) == RequestBlocks(2, 2, 1, 8)
    assert view.blocks_of(second) == RequestBlocks(2, 1, 1, 4)
    assert view.blocks_of(first).num_freed_blocks == 1
    assert view.blocks_of(_req("none", [1])) == RequestBlocks(0, 0, 0, 0)
    assert (view.num_blocks, view.num_free_blocks, view.block_size) == (7, 4, 4)
    assert view.usage == kv.usage


class PreemptsOnlyBigHolders(PriorityQueue):
    """Priority order; a more important arrival preempts only a victim that would free at
    least `min_freed` blocks."""

    def __init__(self, min_freed: int) -> None:
        super().__init__()
        self.min_freed = min_freed

    def preempt_for(self, request, running, kv=None):
        victim = super().preempt_for(request, running, kv)
        if victim is None or kv.blocks_of(victim).num_freed_blocks < self.min_freed:
            return None
        return victim


@pytest.mark.parametrize(("min_freed", "preempted"), [(2, True), (3, False)])
def test_preempt_for_decides_with_the_view_too(min_freed, preempted):
    s = make_scheduler(num_blocks=16, block_size=4, budget=64, max_num_seqs=1,
                       queue=PreemptsOnlyBigHolders(min_freed))
    low = make_request(s, range(1, 7), max_tokens=4)  # 6 tokens: 2 blocks
    low.priority = 5
    s.update_from_output(out := s.schedule(), fake_execute(s, out))
    urgent = make_request(s, range(7, 11), max_tokens=2)
    s.waiting.remove(urgent)
    urgent.priority = 0
    s.waiting.add(urgent)  # re-key with its priority
    out = s.schedule()
    assert (out.preempted_req_ids == {low.request_id}) is preempted
    assert (urgent.request_id in out.num_scheduled_tokens) is preempted
