"""A comparable snapshot of every piece of KV-cache state allocate_slots may change."""

from lab.cache import KVCacheManager


def snapshot(m: KVCacheManager) -> tuple:
    """Everything allocate_slots may change (in every KV cache group)."""
    pool = m.block_pool
    return (
        [b.block_id for b in pool.free_block_queue.get_all_free_blocks()],
        [(b.ref_cnt, b.block_hash) for b in pool.blocks],
        sorted((k, b.block_id) for k, b in pool.cached_block_hash_to_block.items()),
        [{r: [b.block_id for b in bl] for r, bl in manager.req_to_blocks.items()}
         for manager in m.coordinator.managers],
        [dict(manager.num_cached_block) for manager in m.coordinator.managers],
        pool.total_evicted,
    )
