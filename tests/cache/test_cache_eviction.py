"""Eviction policies (the cache/eviction group): LRU is the free queue's order, LFU keeps the
prefixes that are hit; the block pool's stateful property test holds under LFU too."""

from __future__ import annotations

import pytest
from hypothesis import settings

from lab.cache import BlockPool, KVCacheManager, make_block_hasher
from lab.cache.eviction import EvictionPolicy, LFUEviction, LRUEviction
from lab.core.request import Request
from lab.core.sampling_params import SamplingParams
from tests.cache.test_cache_stateful import KVCacheMachine, Model

BS = 4


def _req(rid: str, tokens: list[int], bs: int = BS) -> Request:
    return Request(rid, tokens, SamplingParams(), None, 0.0, block_hasher=make_block_hasher(bs))


def _run(kv: KVCacheManager, rid: str, tokens: list[int]) -> Request:
    """Admit a request (with its prefix hits), compute all its tokens, commit and free it."""
    req = _req(rid, tokens)
    hits, num_hit = kv.get_computed_blocks(req)
    assert kv.allocate_slots(req, len(tokens) - num_hit, num_hit, hits) is not None
    req.num_computed_tokens = len(tokens)
    kv.cache_computed(req)
    kv.free(req)
    return req


HOT = list(range(1, 9))  # a 2-block prefix every request shares


def _hot_then_cold(eviction: EvictionPolicy) -> int:
    """The hot prefix is computed once and hit twice, then one-off prompts fill the cache after
    it; returns the hot prefix's hit tokens for the next request that shares it."""
    kv = KVCacheManager(num_blocks=9, block_size=BS, max_model_len=64, eviction=eviction)
    for i in range(3):
        _run(kv, f"hot{i}", HOT + [100 + i])  # 3 blocks each: 2 shared, 1 own
    _run(kv, "cold0", list(range(200, 212)))  # 3 blocks
    _run(kv, "cold1", list(range(300, 320)))  # 5 blocks: more than the uncached + cold ones
    _, num_hit = kv.get_computed_blocks(_req("again", HOT + [999]))
    return num_hit


def test_lfu_keeps_a_hot_prefix_that_lru_evicts():
    assert _hot_then_cold(LRUEviction()) == 0  # freed before the cold prompts: evicted first
    assert _hot_then_cold(LFUEviction()) == 8  # hit twice: outlives the prompts hit never


def _pool(eviction: EvictionPolicy, n: int = 6) -> BlockPool:
    return BlockPool(n, enable_caching=True, eviction=eviction)


def _cache(pool: BlockPool, tokens: list[int]) -> list:
    """Blocks holding `tokens` (BS each), committed to the prefix cache, still held."""
    req = _req("r" + "-".join(map(str, tokens)), tokens)
    blocks = pool.get_new_blocks(len(tokens) // BS)
    pool.cache_full_blocks(req, blocks, 0, len(blocks))
    return blocks


def test_lfu_order_uncached_first_then_fewest_hits_then_least_recently_freed():
    pool = _pool(LFUEviction())
    a, b, c = (_cache(pool, [t] * BS)[0] for t in (1, 2, 3))
    pool.touch([c, c, a])  # hits: c 2, a 1, b 0
    pool.free_blocks([c, c, c, a, a, b])
    # free: 4, 5 uncached; then b (0 hits), a (1), c (2)
    got = pool.get_new_blocks(5)
    assert [x.block_id for x in got] == [4, 5, b.block_id, a.block_id, c.block_id]
    assert pool.take_num_evicted() == 3


def test_lfu_ties_go_in_free_order_and_a_reset_reranks_free_blocks():
    eviction = LFUEviction()
    pool = _pool(eviction, n=4)
    blocks = _cache(pool, [1] * BS + [2] * BS + [3] * BS)  # every block, cached
    pool.free_blocks([blocks[2], blocks[0], blocks[1]])
    assert pool.reset_prefix_cache()
    assert eviction.hits == {}
    assert [b.block_id for b in pool.get_new_blocks(3)] == [3, 1, 2]  # uncached: free order


def test_lfu_counts_hits_from_when_a_block_was_cached():
    eviction = LFUEviction()
    pool = _pool(eviction, n=3)
    a, b = _cache(pool, [1] * BS + [2] * BS)
    pool.touch([a])
    pool.free_blocks([a, a, b])
    assert eviction.hits == {a.block_id: 1}
    assert [x.block_id for x in pool.get_new_blocks(2)] == [b.block_id, a.block_id]
    assert eviction.hits == {}  # evicted: its count went with its hash


def test_lfu_heap_stays_bounded():
    eviction = LFUEviction()
    pool = _pool(eviction, n=4)
    blocks = _cache(pool, [1] * BS + [2] * BS + [3] * BS)
    pool.free_blocks(blocks)
    for _ in range(500):  # hit and free again: each round leaves a stale entry
        pool.touch(blocks)
        pool.free_blocks(blocks)
    assert len(eviction._heap) <= 2 * 3 + 64 + 3


def test_lru_is_the_free_queue_order():
    pool = _pool(LRUEviction())
    a, b = _cache(pool, [1] * BS + [2] * BS)
    pool.touch([b, b])
    pool.free_blocks([b, b, b, a])
    assert [x.block_id for x in pool.get_new_blocks(4)] == [3, 4, 5, b.block_id]


def test_a_policy_serves_one_pool():
    eviction = LRUEviction()
    _pool(eviction)
    with pytest.raises(ValueError, match="already serves a BlockPool"):
        _pool(eviction)


class LFUModel(Model):
    """The expected state under LFU: prefix hits per block (reset when it is evicted); a pop
    takes an uncached block, else the fewest-hit one, in free order among equals."""

    def __init__(self) -> None:
        super().__init__()
        self.hits = [0] * len(self.ref)

    def allocate(self, req, n_new, n_hit, hits):
        new = super().allocate(req, n_new, n_hit, hits)
        if new is not None:
            for b in hits:
                self.hits[b] += 1
        return new

    def _pop(self) -> int:
        rank = lambda b: 0 if self.hash[b] is None else 1 + self.hits[b]  # noqa: E731
        best = min(range(len(self.free)), key=lambda i: (rank(self.free[i]), i))
        self.free.insert(0, self.free.pop(best))
        self.hits[self.free[0]] = 0
        return super()._pop()

    def reset(self) -> bool:
        done = super().reset()
        if done:
            self.hits = [0] * len(self.ref)
        return done


class LFUKVCacheMachine(KVCacheMachine):
    """The KV-cache state machine of test_cache_stateful.py with an LFU pool and model."""

    def __init__(self) -> None:
        super().__init__()
        self.m = KVCacheManager(self.m.num_blocks, self.m.block_size, self.m.max_model_len,
                                enable_caching=True, eviction=LFUEviction())
        self.model = LFUModel()


LFUKVCacheMachine.TestCase.settings = settings(stateful_step_count=40)
TestLFUKVCacheMachine = LFUKVCacheMachine.TestCase
