"""A prefix-cache eviction policy (the `cache/eviction` group; base class
lab.cache.eviction.EvictionPolicy).

`cache/eviction=mru`: reuse the most recently freed block first. A request's blocks are freed
when it finishes, so MRU evicts the newest prefixes and keeps the old ones: scan-resistant where
many one-off prompts stream past a few long-lived shared prefixes (LRU would flush those).
"""

from __future__ import annotations

from collections.abc import Sequence

from lab.cache.block import FreeKVCacheBlockQueue, KVCacheBlock
from lab.cache.eviction import EvictionPolicy


class MostRecentlyFreedFirst(EvictionPolicy):
    """A stack of freed blocks; entries of blocks that left the free queue are skipped."""

    name = "mru"

    def __init__(self) -> None:
        super().__init__()
        self._stack: list[KVCacheBlock] = []

    def bind(self, free_queue: FreeKVCacheBlockQueue) -> None:
        super().bind(free_queue)
        self._stack = list(reversed(free_queue.get_all_free_blocks()))  # block 1 on top

    def on_freed(self, blocks: Sequence[KVCacheBlock]) -> None:
        self._stack.extend(blocks)
        if len(self._stack) > 2 * len(self.free_queue) + 64:  # drop stale entries
            self._stack = [b for b in self._stack if b in self.free_queue]

    def pop_free(self, n: int) -> list[KVCacheBlock]:
        out: list[KVCacheBlock] = []
        while len(out) < n:
            block = self._stack.pop()
            if block in self.free_queue:  # else stale: a hit took it, or it is listed again above
                self.free_queue.remove(block)
                out.append(block)
        return out
