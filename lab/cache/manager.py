"""KVCacheManager: the scheduler's view of the KV cache (full attention, one KV group).

Plain Python, no tensors. A request's blocks cover its tokens in this layout:

    | computed            | new computed (prefix hits) | new (this step)         |
    0       num_computed_tokens        computed + hit tokens       computed + hits + new
    blocks: req_blocks[:k]  | new_computed_blocks       | blocks allocated here |

Full blocks are committed to the prefix cache only once their tokens are computed: after the
step, by `cache_computed` (the scheduler calls it from update_from_output), up to
min(num_computed_tokens, num_tokens) // block_size blocks. A step that is taken back (a request
un-admitted or preempted within its step, a step that failed) therefore leaves nothing in the
cache to undo; the price is that two requests admitted in the same step do not share the blocks
one of them is computing (the second hits them from the next step on).

With a swap space (`swap_space_gb` > 0, used by preemption=swap) a preempted request's computed
blocks can be parked in CPU memory (see lab/cache/swap.py) instead of being recomputed. Its device
blocks are freed with their hashes, as recompute's are, so `resume_swapped` first takes back
those still cached on the device (a block's content is known by its hash) and copies only the
others from the swap space:

    | still cached on device: touched | copied from the swap space | new for this step |

Which free block an allocation reuses (evicting what it cached) is the eviction policy's choice
(`eviction`, the cache/eviction group at cache.eviction; lab/cache/eviction.py).

`dtype` (cache.dtype: auto | fp8) is only validated and recorded here; the worker allocates the
tensors in that dtype (lab/attention/base.py), and bytes_per_block already reflects it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from lab.cache.block import KVCacheBlock
from lab.cache.block_pool import BlockPool
from lab.cache.dtypes import KV_CACHE_DTYPES
from lab.cache.eviction import EvictionPolicy
from lab.cache.swap import SwapSpace, SwapStep

if TYPE_CHECKING:
    from lab.core.request import Request


def cdiv(a: int, b: int) -> int:
    """Ceiling division of non-negative integers."""
    return -(-a // b)


@dataclass
class PrefixCacheStats:
    """Prefix-cache lookups: requests looked up, tokens queried, tokens hit."""

    requests: int = 0
    queries: int = 0
    hits: int = 0

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries if self.queries else 0.0


@dataclass(frozen=True)
class KVCacheStats:
    """The cache as a step leaves it, and its events since the previous `stats()` call."""

    usage: float  # 0..1, evictable cached blocks counted as free
    num_used_blocks: int
    num_blocks: int  # usable blocks (the null block excluded)
    bytes_per_block: int
    prefix: PrefixCacheStats  # lookups since the previous call
    num_evicted_blocks: int  # since the previous call
    num_swapped_reqs: int


class KVCacheManager:
    """Allocates and frees a request's blocks over a BlockPool, with prefix caching."""

    def __init__(
        self, num_blocks: int, block_size: int, max_model_len: int, enable_caching: bool = True,
        swap_space_gb: float = 0.0, bytes_per_block: int = 0, dtype: str = "auto",
        eviction: EvictionPolicy | None = None,
    ) -> None:
        if dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"cache.dtype={dtype!r} is invalid: use one of "
                             f"{', '.join(KV_CACHE_DTYPES)} (auto = the model dtype, fp8 = "
                             "float8 e4m3 with per-layer scales)")
        self.dtype = dtype
        if block_size <= 0 or max_model_len <= 0:
            raise ValueError(f"block_size={block_size}, max_model_len={max_model_len} must be > 0")
        if not isinstance(swap_space_gb, int | float) or swap_space_gb < 0:
            raise ValueError(f"cache.swap_space_gb={swap_space_gb!r} is invalid: must be a number "
                             ">= 0 (GiB of CPU memory for swapped-out KV blocks; 0 = no swap)")
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.enable_caching = enable_caching
        self.bytes_per_block = bytes_per_block  # KV bytes of one block over all layers
        num_swap = int(swap_space_gb * 2**30) // bytes_per_block if bytes_per_block > 0 else 0
        self.swap_space = SwapSpace(num_swap)
        self.block_pool = BlockPool(num_blocks, enable_caching, eviction)  # None: LRU
        self.req_to_blocks: dict[str, list[KVCacheBlock]] = {}
        self.num_cached_block: dict[str, int] = {}
        self.prefix_cache_stats = PrefixCacheStats()  # since the last take
        self.prefix_cache_totals = PrefixCacheStats()  # cumulative

    # -- sizes -----------------------------------------------------------------------------
    @property
    def num_blocks(self) -> int:
        return self.block_pool.num_blocks

    @property
    def num_free_blocks(self) -> int:
        return self.block_pool.num_free_blocks

    @property
    def num_used_blocks(self) -> int:
        """Non-null blocks with ref_cnt > 0."""
        return self.num_blocks - 1 - self.num_free_blocks

    @property
    def usage(self) -> float:
        """KV-cache usage in [0, 1]; evictable cached blocks count as free."""
        return self.block_pool.get_usage()

    def stats(self) -> KVCacheStats:
        """A snapshot for the step that just ran; resets the since-the-last-call counters."""
        return KVCacheStats(self.usage, self.num_used_blocks, self.num_blocks - 1,
                            self.bytes_per_block, self.take_prefix_cache_stats(),
                            self.take_num_evicted(), self.num_swapped_reqs)

    # -- prefix cache ----------------------------------------------------------------------
    def get_computed_blocks(self, request: Request) -> tuple[list[KVCacheBlock], int]:
        """The longest run of cached blocks prefixing the request, and its length in tokens.

        The last token is never covered (its logits must be computed), so at most
        (num_tokens - 1) // block_size blocks can hit. Empty when caching is off, and for a
        request that asks for prompt logprobs (every prompt position must be computed; vLLM's
        skip_reading_prefix_cache).
        """
        if not self.enable_caching or request.sampling_params.prompt_logprobs is not None:
            return [], 0
        hits = self._cached_run(request, (request.num_tokens - 1) // self.block_size)
        num_hit_tokens = len(hits) * self.block_size
        self._count_lookup(request.num_tokens, num_hit_tokens)
        return hits, num_hit_tokens

    def _cached_run(self, request: Request, max_blocks: int) -> list[KVCacheBlock]:
        """The cached blocks of the request's first block hashes, up to the first miss."""
        hits: list[KVCacheBlock] = []
        if not self.enable_caching:
            return hits
        for block_hash in request.block_hashes[:max_blocks]:
            block = self.block_pool.get_cached_block(block_hash)
            if block is None:
                break
            hits.append(block)
        return hits

    def _count_lookup(self, num_queried: int, num_hit: int) -> None:
        for stats in (self.prefix_cache_stats, self.prefix_cache_totals):
            stats.requests += 1
            stats.queries += num_queried
            stats.hits += num_hit

    def take_prefix_cache_stats(self) -> PrefixCacheStats:
        """Lookups since the last call; resets the per-step counters."""
        stats, self.prefix_cache_stats = self.prefix_cache_stats, PrefixCacheStats()
        return stats

    def take_num_evicted(self) -> int:
        """Cached blocks evicted since the last call."""
        return self.block_pool.take_num_evicted()

    @property
    def total_num_evicted(self) -> int:
        return self.block_pool.total_evicted

    def reset_prefix_cache(self) -> bool:
        """Drop every cached hash; False (and nothing done) while any block is in use."""
        return self.block_pool.reset_prefix_cache()

    def reset_counters(self) -> None:
        """Zero the lookup and eviction counters, per step and cumulative (an engine that starts
        its run afresh after a warm-up: lab/engine/warmup.py)."""
        self.prefix_cache_stats = PrefixCacheStats()
        self.prefix_cache_totals = PrefixCacheStats()
        self.block_pool.reset_counters()

    # -- allocation ------------------------------------------------------------------------
    def _num_blocks_to_allocate(
        self, request_id: str, num_tokens: int, new_computed_blocks: list[KVCacheBlock]
    ) -> int:
        """Blocks that must leave the free queue: new ones plus evictable prefix hits."""
        existing = len(self.req_to_blocks.get(request_id, ()))
        num_new = cdiv(num_tokens, self.block_size) - existing - len(new_computed_blocks)
        num_evictable_hits = sum(1 for b in new_computed_blocks if b.ref_cnt == 0)
        return max(num_new, 0) + num_evictable_hits

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_blocks: list[KVCacheBlock] | None = None,
    ) -> list[KVCacheBlock] | None:
        """Reserve slots for `num_new_tokens` more tokens (after any prefix hits).

        Returns the newly allocated blocks (possibly empty), or None -- with no state changed --
        when the free queue cannot supply them. See the module docstring for the layout. Nothing
        is committed to the prefix cache here (see `cache_computed`).
        """
        if num_new_tokens <= 0:
            raise ValueError(f"num_new_tokens must be > 0, got {num_new_tokens}")
        hits = list(new_computed_blocks or [])
        rid = request.request_id
        if hits and self.req_to_blocks.get(rid):
            raise ValueError(f"request {rid} already has blocks; prefix hits are for requests "
                             "that hold none (new, preempted or swapped out)")
        num_computed = request.num_computed_tokens + num_new_computed_tokens
        num_needed = min(num_computed + num_new_tokens, self.max_model_len)
        held = self.req_to_blocks.get(rid)
        if not hits and held is not None and len(held) * self.block_size >= num_needed:
            return []  # the common decode step: its blocks already hold the new tokens
        self._check_hashes(request, min(num_needed, request.num_tokens))
        if self._num_blocks_to_allocate(rid, num_needed, hits) > self.num_free_blocks:
            return None
        req_blocks = self.req_to_blocks.setdefault(rid, [])
        if hits:
            self.block_pool.touch(hits)
            req_blocks.extend(hits)
            self.num_cached_block[rid] = len(hits)
        num_new_blocks = cdiv(num_needed, self.block_size) - len(req_blocks)
        new_blocks = self.block_pool.get_new_blocks(num_new_blocks) if num_new_blocks > 0 else []
        req_blocks.extend(new_blocks)
        return new_blocks

    def _check_hashes(self, request: Request, num_tokens: int) -> None:
        """Fail before any change if the request lacks the hashes its full blocks need."""
        if self.enable_caching and len(request.block_hashes) < num_tokens // self.block_size:
            raise ValueError(
                f"request {request.request_id} has {len(request.block_hashes)} block hashes for "
                f"{num_tokens} tokens; build it with make_block_hasher({self.block_size})"
            )

    def cache_computed(self, request: Request, num_computed: int | None = None) -> None:
        """Commit the request's blocks that are full of computed tokens to the prefix cache
        (after a step: its tokens up to `num_computed`, by default num_computed_tokens, have
        their KV written; with async scheduling num_computed_tokens already counts the next
        step's tokens, still in flight)."""
        if num_computed is None:
            num_computed = request.num_computed_tokens
        if self.enable_caching and request.request_id in self.req_to_blocks:
            self._cache_blocks(request, min(num_computed, request.num_tokens))

    def _cache_blocks(self, request: Request, num_tokens: int) -> None:
        """Commit the request's blocks that are full within its first `num_tokens` tokens."""
        rid = request.request_id
        num_cached = self.num_cached_block.get(rid, 0)
        num_full = min(num_tokens // self.block_size, len(self.req_to_blocks[rid]))
        if num_full <= num_cached:
            return
        self.block_pool.cache_full_blocks(request, self.req_to_blocks[rid], num_cached, num_full)
        self.num_cached_block[rid] = num_full

    def free(self, request: Request) -> None:
        """Release the request's blocks, tail first (so its tail is evicted before its head).

        Hashes stay on the blocks: a later request (or this one, re-admitted) can hit them.
        """
        blocks = self.req_to_blocks.pop(request.request_id, [])
        self.num_cached_block.pop(request.request_id, None)
        self.block_pool.free_blocks(reversed(blocks))

    def release(self, request: Request) -> None:
        """Forget a finished request: free its device blocks and its swap blocks."""
        self.free(request)
        self.swap_space.discard(request.request_id)

    def free_all(self) -> None:
        """Release every request's blocks and swap blocks (recovery after a scheduler failure)."""
        for blocks in self.req_to_blocks.values():
            self.block_pool.free_blocks(reversed(blocks))
        self.req_to_blocks.clear()
        self.num_cached_block.clear()
        for request_id in list(self.swap_space.req_to_blocks):
            self.swap_space.discard(request_id)

    # -- swap ------------------------------------------------------------------------------
    def swap_out(self, request: Request) -> bool:
        """Park the request's computed blocks in the swap space and free its device blocks.
        False (nothing changed) when it has nothing computed or the swap space is too small."""
        num = cdiv(request.num_computed_tokens, self.block_size)
        blocks = self.get_block_ids(request.request_id)[:num]
        if num == 0 or len(blocks) < num:
            return False
        if not self.swap_space.swap_out(request.request_id, blocks):
            return False
        self.free(request)
        return True

    def resume_swapped(self, request: Request, num_new_tokens: int) -> list[KVCacheBlock] | None:
        """Give a swapped-out request device blocks again for its computed tokens plus
        `num_new_tokens`: blocks still cached on the device under its hashes are taken back
        (counted as prefix-cache hits), the others are copied from the swap space. None (nothing
        changed) when the blocks do not fit. See the module docstring for the layout."""
        cpu = self.swap_space.req_to_blocks[request.request_id]
        hits = self._cached_run(request, min(len(cpu), request.num_computed_tokens // self.block_size))
        self._count_lookup(request.num_computed_tokens, len(hits) * self.block_size)
        new = self.allocate_slots(request, num_new_tokens, 0, hits)
        if new is None:
            return None
        device = self.get_block_ids(request.request_id)
        self.swap_space.swap_in(request.request_id, device[len(hits):len(cpu)], skip=len(hits))
        return new

    def undo_resume(self, request: Request) -> None:
        """Take back this step's `resume_swapped`: the request is swapped out again."""
        self.swap_space.undo_swap_in(request.request_id)
        self.free(request)

    def discard_swapped(self, request_id: str) -> None:
        """Drop a request's swapped blocks (it will be recomputed instead)."""
        self.swap_space.discard(request_id)

    @property
    def num_swapped_reqs(self) -> int:
        return self.swap_space.num_swapped_reqs

    @property
    def num_swap_blocks(self) -> int:
        """The swap space's capacity in blocks (the worker allocates that many CPU blocks)."""
        return self.swap_space.num_blocks

    def take_swap_step(self) -> SwapStep:
        """This step's swap copies (for the worker) and refusals; see SwapSpace.take_step."""
        return self.swap_space.take_step()

    def get_block_ids(self, request_id: str) -> list[int]:
        """The request's block ids in token order (empty if it holds none)."""
        return [b.block_id for b in self.req_to_blocks.get(request_id, ())]
