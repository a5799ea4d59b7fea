"""BlockPool: every KV-cache block, the free queue, and the prefix-cache map hash -> blocks.

A block is in exactly one of three states:
  - in use:             ref_cnt > 0, not in the free queue (hash set iff it holds a full block);
  - evictable cached:   ref_cnt == 0, in the free queue, hash set and present in the map;
  - free:               ref_cnt == 0, in the free queue, no hash.
Block 0 is the null block: popped at start, never freed, cached or reference-counted.
Which free block an allocation reuses is the eviction policy's choice (lab/cache/eviction.py;
LRU, the free queue's head, by default).

With several KV cache groups (lab/cache/groups.py) every block in use belongs to one group: the
pool counts each group's blocks in use (`group_used`), and a cached block is keyed by its hash
in its group (`group_key`), so a prefix hit is always a block of the group that looks it up.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from lab.cache.block import FreeKVCacheBlockQueue, KVCacheBlock
from lab.cache.eviction import EvictionPolicy, LRUEviction
from lab.cache.hashing import group_key

if TYPE_CHECKING:
    from lab.core.request import Request


class BlockHashToBlockMap:
    """hash -> {block_id: block}. Duplicates (same hash, different blocks) are allowed."""

    def __init__(self) -> None:
        self._map: dict[bytes, dict[int, KVCacheBlock]] = {}

    def get_one_block(self, key: bytes) -> KVCacheBlock | None:
        """Any block cached under `key`, or None."""
        blocks = self._map.get(key)
        return next(iter(blocks.values())) if blocks else None

    def insert(self, key: bytes, block: KVCacheBlock) -> None:
        """Cache `block` under `key`."""
        self._map.setdefault(key, {})[block.block_id] = block

    def pop(self, key: bytes, block_id: int) -> KVCacheBlock | None:
        """Remove the entry (key, block_id) if present and return its block."""
        blocks = self._map.get(key)
        if blocks is None:
            return None
        block = blocks.pop(block_id, None)
        if not blocks:
            del self._map[key]
        return block

    def items(self) -> list[tuple[bytes, KVCacheBlock]]:
        """Every (hash, block) entry (for tests and debugging)."""
        return [(k, b) for k, blocks in self._map.items() for b in blocks.values()]

    def clear(self) -> None:
        self._map.clear()

    def __len__(self) -> int:
        return sum(len(blocks) for blocks in self._map.values())


class BlockPool:
    """Owns `num_blocks` blocks; hands them out, takes them back, and keeps the prefix cache."""

    def __init__(self, num_blocks: int, enable_caching: bool,
                 eviction: EvictionPolicy | None = None) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1 (block 0 is null), got {num_blocks}")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.blocks = [KVCacheBlock(i) for i in range(num_blocks)]
        self.free_block_queue = FreeKVCacheBlockQueue(self.blocks)
        self.cached_block_hash_to_block = BlockHashToBlockMap()
        self.null_block = self.free_block_queue.popleft()
        self.null_block.is_null = True
        self.eviction = eviction if eviction is not None else LRUEviction()
        self.eviction.bind(self.free_block_queue)
        self.total_evicted = 0  # cumulative number of cached blocks evicted
        self._evicted_since_take = 0
        self.group_used: dict[int, int] = {}  # KV cache group -> its blocks with ref_cnt > 0

    @property
    def num_free_blocks(self) -> int:
        """Blocks with ref_cnt == 0 (evictable cached blocks included)."""
        return self.free_block_queue.num_free_blocks

    def get_usage(self) -> float:
        """Fraction of the non-null blocks in use, in [0, 1]."""
        total = self.num_blocks - 1
        return 1.0 - self.num_free_blocks / total if total > 0 else 0.0

    def get_cached_block(self, block_hash: bytes, group: int = 0) -> KVCacheBlock | None:
        """A block of KV cache group `group` cached under `block_hash` (in use or evictable),
        or None."""
        return self.cached_block_hash_to_block.get_one_block(group_key(block_hash, group))

    def _count_used(self, group: int, delta: int) -> None:
        if delta:
            self.group_used[group] = self.group_used.get(group, 0) + delta

    def get_new_blocks(self, num_blocks: int, group: int = 0) -> list[KVCacheBlock]:
        """Take `num_blocks` free blocks for KV cache group `group`, the eviction policy's
        choice, evicting cached ones.

        Each returned block has ref_cnt 1 and no hash. Raises ValueError if too few are free.
        """
        if num_blocks > self.num_free_blocks:
            raise ValueError(f"cannot get {num_blocks} blocks; only {self.num_free_blocks} free")
        if num_blocks <= 0:
            return []
        blocks = self.eviction.pop_free(num_blocks)
        if len(blocks) != num_blocks:
            raise RuntimeError(f"{type(self.eviction).__name__}.pop_free({num_blocks}) returned "
                               f"{len(blocks)} blocks")
        for block in blocks:
            self._maybe_evict_cached_block(block)
            assert block.ref_cnt == 0, block
            block.ref_cnt = 1
        self._count_used(group, num_blocks)
        return blocks

    def _maybe_evict_cached_block(self, block: KVCacheBlock) -> bool:
        block_hash = block.block_hash
        if block_hash is None:
            return False
        self.cached_block_hash_to_block.pop(block_hash, block.block_id)
        block.reset_hash()
        self.eviction.on_uncached(block)
        self.total_evicted += 1
        self._evicted_since_take += 1
        return True

    def touch(self, blocks: Sequence[KVCacheBlock], group: int = 0) -> None:
        """Take a reference on each block (prefix hits of KV cache group `group`); an
        evictable hit leaves the free queue."""
        revived = 0
        for block in blocks:
            if block.is_null:
                continue
            if block.ref_cnt == 0:
                self.free_block_queue.remove(block)
                revived += 1
            block.ref_cnt += 1
        self._count_used(group, revived)
        self.eviction.on_hit([b for b in blocks if not b.is_null])

    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock], group: int = 0) -> None:
        """Drop one reference on each block (of KV cache group `group`); those reaching 0 join
        the queue tail in order."""
        released: list[KVCacheBlock] = []
        for block in ordered_blocks:
            if block.is_null:
                continue
            if block.ref_cnt <= 0:
                raise ValueError(f"double free of block {block.block_id}")
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                released.append(block)
        self.free_block_queue.append_n(released)
        self._count_used(group, -len(released))
        if released:
            self.eviction.on_freed(released)

    def cache_full_blocks(
        self,
        request: Request,
        blocks: list[KVCacheBlock],
        num_cached_blocks: int,
        num_full_blocks: int,
        group: int = 0,
    ) -> None:
        """Hash blocks[num_cached_blocks:num_full_blocks] from request.block_hashes; map them
        (under their KV cache group's keys; null blocks, a sliding window's, are skipped).

            | already cached | newly full: hash + insert | partial / not yet computed |
            0        num_cached_blocks          num_full_blocks                  len(blocks)
        """
        if num_cached_blocks >= num_full_blocks:
            return
        if num_full_blocks > len(request.block_hashes):
            raise ValueError(
                f"request {request.request_id} has {len(request.block_hashes)} block hashes, "
                f"cannot cache {num_full_blocks} blocks"
            )
        for i in range(num_cached_blocks, num_full_blocks):
            block = blocks[i]
            if block.is_null:
                continue
            key = group_key(request.block_hashes[i], group)
            block.block_hash = key
            self.cached_block_hash_to_block.insert(key, block)

    def uncache_block(self, block: KVCacheBlock) -> None:
        """Take a block's hash out of the prefix cache (its contents will not be computed)."""
        if block.block_hash is not None:
            self.cached_block_hash_to_block.pop(block.block_hash, block.block_id)
            block.reset_hash()
            self.eviction.on_uncached(block)

    def take_num_evicted(self) -> int:
        """Evictions since the last call (and reset that counter)."""
        n, self._evicted_since_take = self._evicted_since_take, 0
        return n

    def reset_counters(self) -> None:
        """Zero the eviction counters (since the last take and cumulative)."""
        self.total_evicted = self._evicted_since_take = 0

    def reset_prefix_cache(self) -> bool:
        """Forget every cached hash; only possible when all non-null blocks are free."""
        if self.num_free_blocks != self.num_blocks - 1:
            return False
        self.cached_block_hash_to_block.clear()
        for block in self.blocks:
            if block.block_hash is not None:
                block.reset_hash()
                self.eviction.on_uncached(block)
        return True
