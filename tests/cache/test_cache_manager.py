"""KVCacheManager: prefix hits, the last-token rule, atomic failure, sharing, eviction order."""

import pytest

from lab.cache import KVCacheManager, make_block_hasher
from lab.core.request import Request
from lab.core.sampling_params import SamplingParams
from tests.cache.snapshots import snapshot

BS = 4


def _req(rid: str, tokens: list[int]) -> Request:
    return Request(rid, tokens, SamplingParams(), None, 0.0, block_hasher=make_block_hasher(BS))


def _admit(m: KVCacheManager, req: Request) -> list[int] | None:
    """Prefix lookup + allocation of the whole prompt, as the scheduler does for a new request,
    then the step: its tokens are computed and their full blocks committed."""
    hits, n_hit = m.get_computed_blocks(req)
    new = m.allocate_slots(req, req.num_tokens - n_hit, n_hit, hits)
    if new is None:
        return None
    req.num_computed_tokens = req.num_tokens
    m.cache_computed(req)
    return m.get_block_ids(req.request_id)[0]  # one KV cache group


def test_hits_never_cover_last_token() -> None:
    m = KVCacheManager(num_blocks=16, block_size=BS, max_model_len=64)
    prompt = list(range(12))  # exactly 3 full blocks
    assert _admit(m, _req("a", prompt)) == [1, 2, 3]
    hits, n_hit = m.get_computed_blocks(_req("b", prompt))
    assert [b.block_id for b in hits[0]] == [1, 2] and n_hit == 8
    hits, n_hit = m.get_computed_blocks(_req("c", prompt + [99]))
    assert [b.block_id for b in hits[0]] == [1, 2, 3] and n_hit == 12
    hits, n_hit = m.get_computed_blocks(_req("d", prompt[:1]))
    assert hits == ([],) and n_hit == 0


def test_prefix_stats_and_take_resets() -> None:
    m = KVCacheManager(num_blocks=16, block_size=BS, max_model_len=64)
    _admit(m, _req("a", list(range(10))))
    _admit(m, _req("b", list(range(9))))
    stats = m.take_prefix_cache_stats()
    assert (stats.requests, stats.queries, stats.hits) == (2, 19, 8)
    assert m.take_prefix_cache_stats().requests == 0
    assert m.prefix_cache_totals.queries == 19


def test_shared_prefix_free_only_decrements() -> None:
    m = KVCacheManager(num_blocks=16, block_size=BS, max_model_len=64)
    a, b = _req("a", list(range(10))), _req("b", list(range(8)) + [50, 51, 52])
    ids_a, ids_b = _admit(m, a), _admit(m, b)
    assert ids_a[:2] == ids_b[:2] and ids_a[2] != ids_b[2]
    shared = [m.block_pool.blocks[i] for i in ids_a[:2]]
    assert all(blk.ref_cnt == 2 for blk in shared)
    m.free(a)
    assert all(blk.ref_cnt == 1 for blk in shared)
    assert m.num_used_blocks == 3 and m.get_block_ids("a") == ([],)


def test_free_is_tail_first_and_lru_across_requests() -> None:
    m = KVCacheManager(num_blocks=8, block_size=BS, max_model_len=64)
    a, b = _req("a", list(range(12))), _req("b", list(range(100, 108)))
    ids_a, ids_b = _admit(m, a), _admit(m, b)
    m.free(a)
    m.free(b)
    free = [blk.block_id for blk in m.block_pool.free_block_queue.get_all_free_blocks()]
    assert free == [6, 7] + ids_a[::-1] + ids_b[::-1]
    # Pressure: needing 4 blocks takes 6, 7 then evicts a's tail blocks first.
    _admit(m, _req("c", list(range(200, 216))))
    hits, _ = m.get_computed_blocks(_req("a2", list(range(13))))
    assert [blk.block_id for blk in hits[0]] == [ids_a[0]]
    assert m.take_num_evicted() == 2


def test_failed_allocation_changes_nothing() -> None:
    m = KVCacheManager(num_blocks=6, block_size=BS, max_model_len=64)
    a = _req("a", list(range(12)))
    _admit(m, a)
    m.free(a)  # a's 3 blocks are evictable cached
    _admit(m, _req("x", list(range(300, 304))))
    b = _req("b", list(range(12)) + list(range(40, 52)))  # hits 3, needs 3 new: 6 > 5 free
    hits, n_hit = m.get_computed_blocks(b)
    assert len(hits[0]) == 3
    before = snapshot(m)
    assert m.allocate_slots(b, b.num_tokens - n_hit, n_hit, hits) is None
    assert snapshot(m) == before
    assert m.allocate_slots(b, 4, n_hit, hits) is not None  # a smaller chunk fits


def test_revives_evictable_hits_and_returns_only_new_blocks() -> None:
    m = KVCacheManager(num_blocks=8, block_size=BS, max_model_len=64)
    a = _req("a", list(range(10)))
    ids_a = _admit(m, a)
    m.free(a)
    b = _req("b", list(range(10)))
    hits, n_hit = m.get_computed_blocks(b)
    new = m.allocate_slots(b, b.num_tokens - n_hit, n_hit, hits)
    assert n_hit == 8 and len(new[0]) == 1 and new[0][0].block_id not in ids_a
    assert m.get_block_ids("b")[0][:2] == ids_a[:2]
    assert all(m.block_pool.blocks[i].ref_cnt == 1 for i in m.get_block_ids("b")[0])


def test_decode_grows_blocks_and_caches_full_ones_once_computed() -> None:
    m = KVCacheManager(num_blocks=8, block_size=BS, max_model_len=64)
    r = _req("r", [1, 2, 3])
    assert len(m.allocate_slots(r, 3)[0]) == 1
    r.num_computed_tokens = 3
    r.append_output_token(4)
    assert m.allocate_slots(r, 1) == ([],)
    m.cache_computed(r)  # the 4th token is scheduled, not computed: the block is not shared yet
    assert m.block_pool.blocks[1].block_hash is None
    r.num_computed_tokens = 4
    m.cache_computed(r)
    assert m.block_pool.blocks[1].block_hash == r.block_hashes[0]
    r.append_output_token(5)
    assert [blk.block_id for blk in m.allocate_slots(r, 1)[0]] == [2]


def test_max_model_len_caps_allocation() -> None:
    m = KVCacheManager(num_blocks=16, block_size=BS, max_model_len=8)
    r = _req("r", list(range(12)))
    assert len(m.allocate_slots(r, 12)[0]) == 2


def test_caching_off() -> None:
    m = KVCacheManager(num_blocks=8, block_size=BS, max_model_len=64, enable_caching=False)
    a = _req("a", list(range(10)))
    _admit(m, a)
    assert m.get_computed_blocks(_req("b", list(range(10)))) == (([],), 0)
    assert all(b.block_hash is None for b in m.block_pool.blocks)
    assert m.take_prefix_cache_stats().requests == 0


def test_errors_and_reset() -> None:
    m = KVCacheManager(num_blocks=8, block_size=BS, max_model_len=64)
    a = _req("a", list(range(10)))
    with pytest.raises(ValueError):
        m.allocate_slots(a, 0)
    no_hasher = Request("n", list(range(10)), SamplingParams(), None, 0.0)
    with pytest.raises(ValueError):
        m.allocate_slots(no_hasher, 10)
    assert m.num_free_blocks == 7
    _admit(m, a)
    assert not m.reset_prefix_cache()
    m.free(a)
    assert m.reset_prefix_cache()
    assert m.get_computed_blocks(_req("b", list(range(10))))[1] == 0
    assert 0.0 == m.usage and m.num_blocks == 8 and m.block_size == BS
