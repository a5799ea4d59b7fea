"""Prefix-cache eviction (the `cache/eviction` config group, composed at `cache.eviction`): which
free block the BlockPool reuses when an allocation needs one.

Every block no request holds (ref_cnt 0) sits in the pool's free queue, in the order it was
freed (lab/cache/block.py). One that still carries a hash is an *evictable cached* block: a
prefix hit can take it back, and reusing it evicts its prefix-cache entry. When an allocation
needs n blocks the pool asks its policy which free blocks to take (`pop_free`); a policy that
keeps its own index follows the pool through the `on_*` notifications. Eviction changes which
prefixes hit, never a request's tokens.

    lru (default): the least recently freed block first, cached or not: the free queue's head
        (vLLM's order; a request's blocks are freed tail first, so its tail goes before its
        head, which other requests are likelier to share).
    lfu: first a free block that caches nothing (reusing it loses nothing), then cached blocks
        by their prefix hits since they were cached, fewest first; among equals the least
        recently freed. A prefix many requests hit outlives one-off prompts freed after it; as
        in any LFU without aging, a prefix that was hot long ago stays until blocks run short
        among equally-hit ones.

A policy of your own: subclass EvictionPolicy (torch-free, like the rest of lab/cache) and add
one YAML, `_target_: my_pkg.MyEviction`, to a config directory on Hydra's search path (or pass
`cache.eviction={_target_: ...}`); `cache/eviction=mine` selects it.
"""

from __future__ import annotations

import heapq
import itertools
from abc import ABC, abstractmethod
from collections.abc import Sequence

from lab.cache.block import FreeKVCacheBlockQueue, KVCacheBlock


class EvictionPolicy(ABC):
    """Base class of the `cache/eviction` group: the order in which free blocks are reused."""

    name = "base"

    def __init__(self) -> None:
        self.free_queue: FreeKVCacheBlockQueue | None = None

    def bind(self, free_queue: FreeKVCacheBlockQueue) -> None:
        """Called once by the BlockPool this policy serves, with its free queue (every block
        but the null block free and uncached, in block-id order). One policy serves one pool;
        a subclass that extends this calls super().bind(free_queue) first."""
        if self.free_queue is not None:
            raise ValueError(f"this {type(self).__name__} already serves a BlockPool: build one "
                             "eviction policy per pool")
        self.free_queue = free_queue

    @abstractmethod
    def pop_free(self, n: int) -> list[KVCacheBlock]:
        """Remove `n` blocks from the free queue (1 <= n <= its length) and return them in the
        order they are reused. The pool then evicts the cached ones (`on_uncached` follows for
        each) and hands them out; nothing else may change here."""

    def on_freed(self, blocks: Sequence[KVCacheBlock]) -> None:
        """`blocks` just joined the tail of the free queue, in this order: their last reference
        was dropped (cached ones keep their hash). (Default: nothing.)"""
        return None

    def on_hit(self, blocks: Sequence[KVCacheBlock]) -> None:
        """A prefix-cache hit took a reference on each of these cached blocks (those that were
        free have left the free queue). (Default: nothing.)"""
        return None

    def on_uncached(self, block: KVCacheBlock) -> None:
        """`block` has lost its hash: evicted for reuse, or the prefix cache was reset (then the
        block is free). (Default: nothing.)"""
        return None


class LRUEviction(EvictionPolicy):
    """The least recently freed block first: the free queue's head (vLLM's order)."""

    name = "lru"

    def pop_free(self, n: int) -> list[KVCacheBlock]:
        return self.free_queue.popleft_n(n)


class LFUEviction(EvictionPolicy):
    """Uncached free blocks first, then cached ones by prefix hits (fewest first), the least
    recently freed first among equals (see the module docstring).

    A heap of (rank, freed-at, block id) with lazy deletion: a block that left the free queue
    (a prefix hit took it back) leaves a stale entry, skipped when it surfaces or compacted away
    once stale entries outnumber live ones; rank 0 is uncached, 1 + hits cached. O(log n) per
    block freed or reused."""

    name = "lfu"

    def __init__(self) -> None:
        super().__init__()
        self.hits: dict[int, int] = {}  # block id -> prefix hits since it was cached
        self._heap: list[tuple[int, int, int]] = []
        self._freed_at: dict[int, int] = {}  # block id -> when it last joined the free queue
        self._blocks: dict[int, KVCacheBlock] = {}
        self._clock = itertools.count()

    def bind(self, free_queue: FreeKVCacheBlockQueue) -> None:
        super().bind(free_queue)
        self.on_freed(free_queue.get_all_free_blocks())

    def rank(self, block: KVCacheBlock) -> int:
        """0 for a block that caches nothing, else 1 + its prefix hits (lower goes first)."""
        return 0 if block.block_hash is None else 1 + self.hits.get(block.block_id, 0)

    def on_freed(self, blocks: Sequence[KVCacheBlock]) -> None:
        for block in blocks:
            self._freed_at[block.block_id] = now = next(self._clock)
            self._blocks[block.block_id] = block
            heapq.heappush(self._heap, (self.rank(block), now, block.block_id))
        if len(self._heap) > 2 * len(self.free_queue) + 64:
            self._compact()

    def on_hit(self, blocks: Sequence[KVCacheBlock]) -> None:
        for block in blocks:
            self.hits[block.block_id] = self.hits.get(block.block_id, 0) + 1

    def on_uncached(self, block: KVCacheBlock) -> None:
        self.hits.pop(block.block_id, None)
        if block in self.free_queue:  # the prefix cache was reset: it now ranks as uncached
            heapq.heappush(self._heap, (0, self._freed_at[block.block_id], block.block_id))

    def pop_free(self, n: int) -> list[KVCacheBlock]:
        out: list[KVCacheBlock] = []
        while len(out) < n:
            rank, freed_at, block_id = heapq.heappop(self._heap)
            block = self._blocks[block_id]
            if block not in self.free_queue or self._freed_at[block_id] != freed_at:
                continue  # stale: taken back by a hit since (or freed again later)
            if rank != self.rank(block):  # ranked before its hash changed
                heapq.heappush(self._heap, (self.rank(block), freed_at, block_id))
                continue
            self.free_queue.remove(block)
            out.append(block)
        return out

    def _compact(self) -> None:
        """Rebuild the heap from the free queue: one live entry per free block."""
        self._heap = [(self.rank(b), self._freed_at[b.block_id], b.block_id)
                      for b in self.free_queue.get_all_free_blocks()]
        heapq.heapify(self._heap)
