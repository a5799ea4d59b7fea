"""One KV cache group's blocks per request (vLLM's SingleTypeKVCacheManager): full attention or
a sliding window, over the shared BlockPool.

A request's list in a group covers its tokens block by block from position 0; a sliding window
group puts the null block where a block left the window:

    full attention:   | b1 | b2 | b3 | b4 | b5 |
    sliding window:   | null | null | b3 | b4 | b5 |     (window W, the next query at position p
                        ^ blocks wholly before p - W + 1: freed, `remove_skipped_blocks`)

The coordinator (lab/cache/coordinator.py) drives one manager per group; the managers know
nothing of each other. Plain Python, no tensors.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lab.cache.block import KVCacheBlock
from lab.cache.block_pool import BlockPool
from lab.cache.groups import KVCacheGroupSpec

if TYPE_CHECKING:
    from lab.core.request import Request


def cdiv(a: int, b: int) -> int:
    """Ceiling division of non-negative integers."""
    return -(-a // b)


class SingleTypeManager:
    """A KV cache group's blocks per request under full attention (the base behaviour)."""

    def __init__(self, spec: KVCacheGroupSpec, pool: BlockPool, block_size: int,
                 group: int) -> None:
        self.spec = spec
        self.pool = pool
        self.block_size = block_size
        self.group = group
        self.req_to_blocks: dict[str, list[KVCacheBlock]] = {}
        self.num_cached_block: dict[str, int] = {}  # leading blocks committed to the cache
        self.num_window_freed = 0  # blocks freed because they left the window (a counter)

    # -- prefix cache --------------------------------------------------------------------------
    def find_longest_cache_hit(self, block_hashes: list[bytes], max_blocks: int
                               ) -> list[KVCacheBlock]:
        """The hit this group can use for a request whose first `max_blocks` block hashes are
        given: full attention needs every block, so the run of cached blocks up to the first
        miss."""
        hits: list[KVCacheBlock] = []
        for block_hash in block_hashes[:max_blocks]:
            block = self.pool.get_cached_block(block_hash, self.group)
            if block is None:
                break
            hits.append(block)
        return hits

    # -- allocation ----------------------------------------------------------------------------
    def num_skipped_blocks(self, num_computed: int) -> int:
        """Leading blocks the request no longer needs once `num_computed` tokens are computed
        (none under full attention)."""
        return 0

    def remove_skipped_blocks(self, request_id: str, num_computed: int) -> int:
        """Free the request's blocks that left the window (the null block takes their place);
        how many were freed."""
        blocks = self.req_to_blocks.get(request_id)
        skip = min(self.num_skipped_blocks(num_computed), len(blocks or ()))
        freed = []
        for i in range(skip - 1, -1, -1):  # tail first, as free() does; stop at the nulls
            if blocks[i].is_null:
                break
            freed.append(blocks[i])
            blocks[i] = self.pool.null_block
        if freed:
            self.pool.free_blocks(freed, self.group)
            self.num_window_freed += len(freed)
        return len(freed)

    def num_blocks_to_allocate(self, request_id: str, num_tokens: int,
                               hits: list[KVCacheBlock]) -> int:
        """Blocks that must leave the free queue to hold `num_tokens` tokens after `hits`: new
        ones plus evictable prefix hits."""
        held = len(self.req_to_blocks.get(request_id, ()))
        num_new = cdiv(num_tokens, self.block_size) - held - len(hits)
        return max(num_new, 0) + sum(1 for b in hits if b.ref_cnt == 0 and not b.is_null)

    def save_hits(self, request_id: str, hits: list[KVCacheBlock]) -> None:
        """Take the prefix hits of a request that holds no blocks yet (they lead its list)."""
        self.pool.touch(hits, self.group)
        self.req_to_blocks.setdefault(request_id, []).extend(hits)
        self.num_cached_block[request_id] = len(hits)

    def allocate_new(self, request_id: str, num_tokens: int) -> list[KVCacheBlock]:
        """New blocks so the request's list covers `num_tokens` tokens; the new ones."""
        blocks = self.req_to_blocks.setdefault(request_id, [])
        n = cdiv(num_tokens, self.block_size) - len(blocks)
        new = self.pool.get_new_blocks(n, self.group) if n > 0 else []
        blocks.extend(new)
        return new

    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        """Commit the request's blocks that are full within its first `num_tokens` tokens."""
        rid = request.request_id
        blocks = self.req_to_blocks.get(rid)
        if blocks is None:
            return
        num_cached = self.num_cached_block.get(rid, 0)
        num_full = min(num_tokens // self.block_size, len(blocks))
        if num_full <= num_cached:
            return
        self.pool.cache_full_blocks(request, blocks, num_cached, num_full, self.group)
        self.num_cached_block[rid] = num_full

    def trim(self, request_id: str, num_tokens: int) -> int:
        """Free the blocks past the first cdiv(num_tokens, block_size), tail first (they were
        never cached: see KVCacheManager.trim); how many."""
        blocks = self.req_to_blocks.get(request_id)
        keep = cdiv(num_tokens, self.block_size)
        if blocks is None or len(blocks) <= keep:
            return 0
        tail = blocks[keep:]
        del blocks[keep:]
        assert all(b.block_hash is None for b in tail if not b.is_null), "trimmed a cached block"
        self.pool.free_blocks(reversed(tail), self.group)
        return len(tail)

    def free(self, request_id: str) -> None:
        """Release the request's blocks, tail first (its tail is evicted before its head)."""
        blocks = self.req_to_blocks.pop(request_id, [])
        self.num_cached_block.pop(request_id, None)
        self.pool.free_blocks(reversed(blocks), self.group)

    # -- reading -------------------------------------------------------------------------------
    def block_ids(self, request_id: str) -> list[int]:
        return [b.block_id for b in self.req_to_blocks.get(request_id, ())]

    def held_blocks(self, request_id: str) -> list[KVCacheBlock]:
        """The request's blocks that are not the null block."""
        return [b for b in self.req_to_blocks.get(request_id, ()) if not b.is_null]


class FullAttentionManager(SingleTypeManager):
    """Full attention: every block a request computed stays needed until it ends."""


class SlidingWindowManager(SingleTypeManager):
    """A sliding window of W tokens: the query at position p reads keys p-W+1 .. p only.

    Blocks wholly before the next query's window are freed as the request advances. A prefix
    hit needs the W-1 keys before the first new token cached, i.e. cdiv(W-1, block_size)
    consecutive cached blocks ending where the hit ends; blocks before that run are the null
    block (vLLM's sliding-window hit search)."""

    def num_skipped_blocks(self, num_computed: int) -> int:
        """The next query is at position num_computed and reads keys from
        num_computed - W + 1: every block before that token's block is skipped."""
        return max(0, num_computed - self.spec.sliding_window + 1) // self.block_size

    def find_longest_cache_hit(self, block_hashes: list[bytes], max_blocks: int
                               ) -> list[KVCacheBlock]:
        """The longest hit of h <= max_blocks blocks such that the blocks a query at position
        h * block_size reads are all cached: the cdiv(W-1, block_size) blocks before it (or
        every block from 0, when fewer), after null blocks for the ones skipped. Scanning down
        from max_blocks, the first run of that many cached blocks ends the longest hit."""
        needed = cdiv(self.spec.sliding_window - 1, self.block_size)
        hit = [self.pool.null_block] * max_blocks
        if needed == 0:  # a window of one token reads only the query's own key
            return hit
        run = 0
        for i in range(max_blocks - 1, -1, -1):
            block = self.pool.get_cached_block(block_hashes[i], self.group)
            if block is None:
                run = 0
                continue
            hit[i] = block
            run += 1
            if run == needed:
                return hit[:i + run]
        return hit[:run]  # a run from block 0, shorter than the window: every key is there


def make_manager(spec: KVCacheGroupSpec, pool: BlockPool, block_size: int, group: int
                 ) -> SingleTypeManager:
    """The manager of a group of this spec."""
    cls = SlidingWindowManager if spec.sliding_window is not None else FullAttentionManager
    return cls(spec, pool, block_size, group)
