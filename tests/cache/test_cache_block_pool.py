"""BlockPool: null block, allocation, LRU eviction, touch, duplicates, reset."""

import pytest

from lab.cache import BlockPool, make_block_hasher
from lab.core.request import Request
from lab.core.sampling_params import SamplingParams

BS = 2


def _req(tokens: list[int], rid: str = "r") -> Request:
    return Request(rid, tokens, SamplingParams(), None, 0.0, block_hasher=make_block_hasher(BS))


def _free_ids(pool: BlockPool) -> list[int]:
    return [b.block_id for b in pool.free_block_queue.get_all_free_blocks()]


def test_null_block_popped_at_init() -> None:
    pool = BlockPool(5, enable_caching=True)
    assert pool.null_block.block_id == 0 and pool.null_block.is_null
    assert pool.num_free_blocks == 4 and _free_ids(pool) == [1, 2, 3, 4]
    assert pool.get_usage() == 0.0
    pool.free_blocks([pool.null_block])  # ignored
    assert pool.num_free_blocks == 4


def test_get_new_blocks_and_usage() -> None:
    pool = BlockPool(5, enable_caching=True)
    got = pool.get_new_blocks(3)
    assert [b.block_id for b in got] == [1, 2, 3] and all(b.ref_cnt == 1 for b in got)
    assert pool.get_usage() == pytest.approx(0.75)
    with pytest.raises(ValueError):
        pool.get_new_blocks(2)
    pool.free_blocks(got)
    assert _free_ids(pool) == [4, 1, 2, 3]
    with pytest.raises(ValueError):
        pool.free_blocks([got[0]])  # double free


def test_cache_then_lru_eviction_counts() -> None:
    pool = BlockPool(4, enable_caching=True)
    req = _req([1, 2, 3, 4, 5, 6])
    blocks = pool.get_new_blocks(3)
    pool.cache_full_blocks(req, blocks, 0, 3)
    assert [b.block_hash for b in blocks] == req.block_hashes
    assert pool.get_cached_block(req.block_hashes[1]) is blocks[1]
    pool.free_blocks(blocks)  # LRU order: 1, 2, 3
    assert pool.num_free_blocks == 3 and pool.get_usage() == 0.0
    evicted = pool.get_new_blocks(2)
    assert [b.block_id for b in evicted] == [1, 2]
    assert all(b.block_hash is None for b in evicted)
    assert pool.get_cached_block(req.block_hashes[0]) is None
    assert pool.get_cached_block(req.block_hashes[2]) is blocks[2]
    assert pool.take_num_evicted() == 2 and pool.take_num_evicted() == 0
    assert pool.total_evicted == 2


def test_touch_revives_evictable_block() -> None:
    pool = BlockPool(4, enable_caching=True)
    req = _req([1, 2])
    [blk] = pool.get_new_blocks(1)
    pool.cache_full_blocks(req, [blk], 0, 1)
    pool.free_blocks([blk])
    assert blk.block_id in _free_ids(pool)
    pool.touch([blk])
    assert blk.ref_cnt == 1 and blk.block_id not in _free_ids(pool)
    pool.touch([blk])
    assert blk.ref_cnt == 2
    assert [b.block_id for b in pool.get_new_blocks(2)] == [2, 3]


def test_duplicate_hashes_allowed() -> None:
    pool = BlockPool(4, enable_caching=True)
    a, b = _req([1, 2], "a"), _req([1, 2], "b")
    ba, bb = pool.get_new_blocks(2)
    pool.cache_full_blocks(a, [ba], 0, 1)
    pool.cache_full_blocks(b, [bb], 0, 1)
    assert len(pool.cached_block_hash_to_block) == 2
    pool.free_blocks([ba, bb])
    pool.get_new_blocks(2)  # takes free block 3, then evicts ba; bb still cached
    assert pool.get_cached_block(a.block_hashes[0]) is bb


def test_reset_prefix_cache_only_when_all_free() -> None:
    pool = BlockPool(4, enable_caching=True)
    req = _req([1, 2, 3, 4])
    blocks = pool.get_new_blocks(2)
    pool.cache_full_blocks(req, blocks, 0, 2)
    assert not pool.reset_prefix_cache()
    assert pool.get_cached_block(req.block_hashes[0]) is blocks[0]
    pool.free_blocks(blocks)
    assert pool.reset_prefix_cache()
    assert len(pool.cached_block_hash_to_block) == 0
    assert all(b.block_hash is None for b in pool.blocks)


def test_cache_full_blocks_needs_hashes() -> None:
    pool = BlockPool(4, enable_caching=True)
    req = _req([1, 2, 3])  # one full block
    blocks = pool.get_new_blocks(2)
    with pytest.raises(ValueError):
        pool.cache_full_blocks(req, blocks, 0, 2)
