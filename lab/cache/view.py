"""KVCacheView: what a policy may read of the KV cache, and nothing it could change.

The scheduler hands one to the queue policy's victim choice (`RequestQueue.victim`,
`RequestQueue.preempt_for`), so a policy can weigh what preempting a request would give back:

    view.blocks_of(request)   -> RequestBlocks(num_blocks, num_cached_blocks, num_shared_blocks,
                                               num_computed_tokens), num_freed_blocks
    view.num_free_blocks, view.num_blocks, view.block_size, view.usage

Counting a request's blocks is O(blocks it holds); policies that never ask pay nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lab.cache.manager import KVCacheManager
    from lab.core.request import Request


@dataclass(frozen=True)
class RequestBlocks:
    """What one request holds in the device KV cache now.

    num_blocks: device blocks it holds, over every KV cache group (0 when it holds none:
        waiting, preempted, swapped out; a sliding window's null blocks are not counted).
    num_cached_blocks: of them, committed to the prefix cache (full of computed tokens, hashed):
        a recompute preemption leaves them cached, so a re-admission (or another request with
        the same prefix) can hit them until they are evicted.
    num_shared_blocks: of them, also held by another request (reference count > 1): preempting
        this request frees none of them.
    num_computed_tokens: tokens of the request whose KV is written or scheduled to be.
    """

    num_blocks: int
    num_cached_blocks: int
    num_shared_blocks: int
    num_computed_tokens: int

    @property
    def num_freed_blocks(self) -> int:
        """Blocks that preempting the request would put back in the free queue."""
        return self.num_blocks - self.num_shared_blocks


class KVCacheView:
    """Read-only access to a KVCacheManager's state, for policies."""

    def __init__(self, kv: KVCacheManager) -> None:
        self._kv = kv

    @property
    def block_size(self) -> int:
        """Tokens per block."""
        return self._kv.block_size

    @property
    def num_blocks(self) -> int:
        """Usable device blocks (the null block excluded)."""
        return self._kv.num_blocks - 1

    @property
    def num_free_blocks(self) -> int:
        """Blocks no request holds (evictable cached blocks included)."""
        return self._kv.num_free_blocks

    @property
    def usage(self) -> float:
        """Fraction of the usable blocks held by requests, in [0, 1]."""
        return self._kv.usage

    def blocks_of(self, request: Request) -> RequestBlocks:
        """The blocks `request` holds now and how many of them are cached or shared."""
        blocks = self._kv.held_blocks(request.request_id)
        return RequestBlocks(
            num_blocks=len(blocks),
            num_cached_blocks=sum(1 for b in blocks if b.block_hash is not None),
            num_shared_blocks=sum(1 for b in blocks if b.ref_cnt > 1),
            num_computed_tokens=request.num_computed_tokens,
        )
