"""The KV cache coordinator: one SingleTypeManager per KV cache group over one BlockPool, driven
together (vLLM's KVCacheCoordinator).

Allocation is all or nothing: the blocks every group needs are counted first and taken only
if the pool has them all. The prefix-cache hit must be valid for every group at once:

    UnitaryCoordinator   one group: its manager's longest hit.
    HybridCoordinator    several: each kind searches up to the length the previous ones
                         reached (full attention first, whose hit is the longest prefix run;
                         a sliding window then needs its window's blocks cached before that
                         length, which may shorten it), repeated until no kind shortens it;
                         every group's hit is then cut to that common length.
    NoPrefixCacheCoordinator   caching off: no hit, nothing committed.

Plain Python, no tensors.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from lab.cache.block import KVCacheBlock
from lab.cache.block_pool import BlockPool
from lab.cache.groups import KVCacheGroup
from lab.cache.single_type import SingleTypeManager, make_manager

if TYPE_CHECKING:
    from lab.core.request import Request

#: one list of blocks per KV cache group
GroupBlocks = tuple[list[KVCacheBlock], ...]


class KVCacheCoordinator:
    """Every group's manager, allocated and freed together."""

    def __init__(self, groups: Sequence[KVCacheGroup], pool: BlockPool, block_size: int) -> None:
        self.groups = tuple(groups)
        self.pool = pool
        self.block_size = block_size
        self.managers: list[SingleTypeManager] = [
            make_manager(g.spec, pool, block_size, i) for i, g in enumerate(self.groups)]

    @property
    def num_groups(self) -> int:
        return len(self.managers)

    def empty(self) -> GroupBlocks:
        return tuple([] for _ in self.managers)

    # -- prefix cache --------------------------------------------------------------------------
    def find_longest_cache_hit(self, block_hashes: list[bytes], max_blocks: int
                               ) -> tuple[GroupBlocks, int]:
        """(each group's hit blocks, the hit's length in blocks) for a request whose first
        `max_blocks` blocks may hit."""
        raise NotImplementedError

    # -- allocation ----------------------------------------------------------------------------
    def remove_skipped_blocks(self, request_id: str, num_computed: int) -> int:
        """Free every group's blocks that left its window; how many."""
        return sum(m.remove_skipped_blocks(request_id, num_computed) for m in self.managers)

    def num_blocks_to_allocate(self, request_id: str, num_tokens: int, hits: GroupBlocks) -> int:
        return sum(m.num_blocks_to_allocate(request_id, num_tokens, h)
                   for m, h in zip(self.managers, hits))

    def save_hits(self, request_id: str, hits: GroupBlocks) -> None:
        for manager, group_hits in zip(self.managers, hits):
            manager.save_hits(request_id, group_hits)

    def allocate_new(self, request_id: str, num_tokens: int) -> GroupBlocks:
        return tuple(m.allocate_new(request_id, num_tokens) for m in self.managers)

    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        for manager in self.managers:
            manager.cache_blocks(request, num_tokens)

    def trim(self, request_id: str, num_tokens: int) -> int:
        return sum(m.trim(request_id, num_tokens) for m in self.managers)

    def free(self, request_id: str) -> None:
        for manager in self.managers:
            manager.free(request_id)

    # -- reading -------------------------------------------------------------------------------
    def holds(self, request_id: str) -> bool:
        return request_id in self.managers[0].req_to_blocks

    def num_positions(self, request_id: str) -> int:
        """Blocks the request's lists cover (null blocks included; the same in every group)."""
        return len(self.managers[0].req_to_blocks.get(request_id, ()))

    def block_ids(self, request_id: str) -> tuple[list[int], ...]:
        return tuple(m.block_ids(request_id) for m in self.managers)

    def held_blocks(self, request_id: str) -> list[KVCacheBlock]:
        """Every block the request holds, over all groups (null blocks excluded)."""
        return [b for m in self.managers for b in m.held_blocks(request_id)]

    def request_ids(self) -> list[str]:
        return list(self.managers[0].req_to_blocks)

    def take_num_window_freed(self) -> int:
        """Blocks freed because they left a window, since the last call."""
        n = sum(m.num_window_freed for m in self.managers)
        for m in self.managers:
            m.num_window_freed = 0
        return n


class NoPrefixCacheCoordinator(KVCacheCoordinator):
    """Prefix caching off: no hit is ever found."""

    def find_longest_cache_hit(self, block_hashes, max_blocks):
        return self.empty(), 0

    def cache_blocks(self, request, num_tokens):
        return None


class UnitaryCoordinator(KVCacheCoordinator):
    """One group (every layer of one kind): its manager's hit."""

    def find_longest_cache_hit(self, block_hashes, max_blocks):
        hits = self.managers[0].find_longest_cache_hit(block_hashes, max_blocks)
        return (hits,), len(hits)


class HybridCoordinator(KVCacheCoordinator):
    """Several groups: the longest hit valid for every group (module docstring). Every group
    searches, not one per kind: each caches its own blocks, and evicts them on its own."""

    def find_longest_cache_hit(self, block_hashes, max_blocks):
        order = sorted(range(self.num_groups),
                       key=lambda g: self.groups[g].spec.sliding_window is not None)
        length = max_blocks
        while True:
            hits: list[list[KVCacheBlock]] = [[] for _ in self.managers]
            found = length
            for g in order:
                hits[g] = self.managers[g].find_longest_cache_hit(block_hashes, found)
                found = len(hits[g])
            if found == length:  # no group shortened it: every group's hit has this length
                return tuple(hits), length
            length = found


def make_coordinator(groups: Sequence[KVCacheGroup], pool: BlockPool, block_size: int,
                     enable_caching: bool) -> KVCacheCoordinator:
    """The coordinator for these groups (module docstring)."""
    if not enable_caching:
        return NoPrefixCacheCoordinator(groups, pool, block_size)
    if len(groups) == 1:
        return UnitaryCoordinator(groups, pool, block_size)
    return HybridCoordinator(groups, pool, block_size)
