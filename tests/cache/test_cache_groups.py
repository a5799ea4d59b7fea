"""KV cache groups (lab/cache/groups.py) and the sliding-window manager's frees and hits."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lab.attention.spec import AttentionSpec
from lab.cache import BlockPool, make_block_hasher
from lab.cache.groups import (
    FULL,
    SLIDING_WINDOW,
    KVCacheGroup,
    KVCacheGroupSpec,
    group_layers,
    layer_group_index,
    layer_tensor_index,
    max_blocks_per_request,
    num_tensors,
    request_capacity,
)
from lab.cache.single_type import SlidingWindowManager
from lab.core.request import Request
from lab.core.sampling_params import SamplingParams

BASE = AttentionSpec(4, 2, 8)


def layers(pattern: str, window: int = 16) -> list[AttentionSpec]:
    """'SF' -> a sliding layer, a full layer."""
    return [AttentionSpec(4, 2, 8, sliding_window=window if c == "S" else None) for c in pattern]


def test_one_kind_is_one_group():
    (group,) = group_layers(layers("FFFF"))
    assert group.spec == FULL and group.layers == (0, 1, 2, 3)
    (group,) = group_layers(layers("SSS"))
    assert group.spec == KVCacheGroupSpec(SLIDING_WINDOW, 16) and group.layers == (0, 1, 2)


def test_alternating_layers_make_two_groups_sharing_tensors():
    groups = group_layers(layers("SFSF"))  # gpt-oss: full group first
    assert [(g.spec.sliding_window, g.layers) for g in groups] == [(None, (1, 3)), (16, (0, 2))]
    assert num_tensors(groups) == 2
    assert layer_tensor_index(groups) == [0, 0, 1, 1]  # layer j of each group: tensor j
    assert layer_group_index(groups) == (1, 0, 1, 0)


def test_five_to_one_makes_groups_of_one_layer():
    groups = group_layers(layers("SSSSSF"))  # Gemma-3's pattern: 5 sliding, 1 full
    assert len(groups) == 6 and num_tensors(groups) == 1
    assert [g.layers for g in groups[:2]] == [(5,), (0,)]  # full groups first
    groups = group_layers(layers("SSSSSF" * 2))  # 10 sliding, 2 full: groups of 2
    assert [g.layers for g in groups] == [(5, 11), (0, 1), (2, 3), (4, 6), (7, 8), (9, 10)]
    assert num_tensors(groups) == 2


def test_counts_within_a_quarter_use_the_larger_group():
    groups = group_layers(layers("S" * 9 + "F" * 8))  # 9 vs 8: groups of 9, the full one short
    assert [len(g.layers) for g in groups] == [8, 9] and num_tensors(groups) == 9
    groups = group_layers(layers("S" * 5 + "F" * 4))  # 5 vs 4 (a quarter more): groups of 4
    assert [len(g.layers) for g in groups] == [4, 4, 1]


def test_hybrid_off_is_one_full_group():
    (group,) = group_layers(layers("SFSF"), hybrid=False)
    assert group.spec == FULL and group.layers == (0, 1, 2, 3)


def test_spec_checks():
    with pytest.raises(ValueError, match="kind"):
        KVCacheGroupSpec("chunked")
    with pytest.raises(ValueError, match="window"):
        KVCacheGroupSpec(SLIDING_WINDOW)
    with pytest.raises(ValueError, match="sliding_window=0"):
        AttentionSpec(4, 2, 8, sliding_window=0)


def test_window_bounds_a_requests_blocks():
    sw = KVCacheGroupSpec(SLIDING_WINDOW, 16)
    assert FULL.max_blocks(1000, 4, 8) == 250
    assert sw.max_blocks(1000, 4, 8) == -(-(15 + 8) // 4) + 1  # window + one step + misalignment
    assert sw.max_blocks(10, 4, 8) == 3  # never more than its tokens
    groups = (KVCacheGroup(FULL, (1,)), KVCacheGroup(sw, (0,)))
    assert max_blocks_per_request(groups, 1000, 4, 8) == 250 + 7


def test_request_capacity():
    groups = (KVCacheGroup(FULL, (1,)), KVCacheGroup(KVCacheGroupSpec(SLIDING_WINDOW, 16), (0,)))
    assert request_capacity((), 10, 4, 8, 2048) == 40  # one full group: every block
    cap = request_capacity(groups, 30, 4, 8, 2048)  # 30 = cdiv(n, 4) + 7
    assert cap == 23 * 4
    assert max_blocks_per_request(groups, cap, 4, 8) <= 30 < max_blocks_per_request(
        groups, cap + 4, 4, 8)
    assert request_capacity(groups, 10_000, 4, 8, 2048) == 2048  # the model's limit


def _request(tokens: list[int], bs: int) -> Request:
    return Request("r", tokens, SamplingParams(), None, 0.0, block_hasher=make_block_hasher(bs))


def test_sliding_window_frees_blocks_that_left_the_window():
    bs, window = 4, 6
    pool = BlockPool(32, enable_caching=True)
    m = SlidingWindowManager(KVCacheGroupSpec(SLIDING_WINDOW, window), pool, bs, 0)
    m.allocate_new("r", 20)  # positions 0..19: 5 blocks
    assert m.remove_skipped_blocks("r", 20) == 3  # next query at 20 reads 15..20: block 3 on
    assert [b.is_null for b in m.req_to_blocks["r"]] == [True, True, True, False, False]
    assert pool.num_free_blocks == 31 - 2 and m.num_window_freed == 3
    assert m.remove_skipped_blocks("r", 20) == 0  # nothing more left the window
    assert m.remove_skipped_blocks("r", 21) == 1  # the query at 21 reads 16..21: block 3 goes
    m.free("r")
    assert pool.num_free_blocks == 31 and pool.group_used == {0: 0} and m.num_window_freed == 4


def _brute_force_hit(cached: list[bool], max_blocks: int, needed: int) -> int:
    """The longest h <= max_blocks whose window blocks (the `needed` before h, or all of
    0..h-1 when fewer) are all cached."""
    for h in range(max_blocks, 0, -1):
        if all(cached[max(0, h - needed):h]):
            return h
    return 0


@given(cached=st.lists(st.booleans(), min_size=1, max_size=12), window=st.integers(1, 13),
       data=st.data())
def test_sliding_window_hit_is_the_longest_valid_one(cached, window, data):
    """Against a brute force over every possible end: the hit is the longest h whose window
    blocks are cached, null blocks before them."""
    bs = 2
    max_blocks = data.draw(st.integers(0, len(cached)))
    pool = BlockPool(40, enable_caching=True)
    req = _request(list(range(bs * len(cached))), bs)
    blocks = pool.get_new_blocks(len(cached))
    pool.cache_full_blocks(req, blocks, 0, len(cached))
    for block, keep in zip(blocks, cached):  # uncache the misses
        if not keep:
            pool.uncache_block(block)
    m = SlidingWindowManager(KVCacheGroupSpec(SLIDING_WINDOW, window), pool, bs, 0)
    hit = m.find_longest_cache_hit(req.block_hashes, max_blocks)
    needed = -(-(window - 1) // bs)
    assert len(hit) == (_brute_force_hit(cached, max_blocks, needed) if needed else max_blocks)
    for i, block in enumerate(hit):
        if i < len(hit) - needed:
            assert block.is_null
        else:
            assert block is blocks[i]


def test_hits_are_per_group():
    """The same tokens cached in group 0 are no hit in group 1."""
    bs = 2
    pool = BlockPool(16, enable_caching=True)
    req = _request([1, 2, 3, 4, 5], bs)
    blocks = pool.get_new_blocks(2, group=0)
    pool.cache_full_blocks(req, blocks, 0, 2, group=0)
    assert pool.get_cached_block(req.block_hashes[0], 0) is blocks[0]
    assert pool.get_cached_block(req.block_hashes[0], 1) is None
    assert list(itertools.islice(pool.group_used.items(), 1)) == [(0, 2)]
