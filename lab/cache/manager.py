"""KVCacheManager: the scheduler's view of the KV cache, over every KV cache group.

Plain Python, no tensors. A model's layers fall into KV cache groups (lab/cache/groups.py: one
for a model whose layers all attend alike; full-attention and sliding-window groups for a
hybrid one); a coordinator (lab/cache/coordinator.py) drives one manager per group
(lab/cache/single_type.py) over the one BlockPool. Block lists and new blocks are therefore
per group: a tuple with one list per group (`GroupBlocks`; block ids alike). In each group a
request's blocks cover its tokens in this layout (a sliding-window group holds the null block
where a block left the window):

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

in each group; a sliding-window group swaps out only the blocks it still holds (its window) and
resumes with the null block before them.

Which free block an allocation reuses (evicting what it cached) is the eviction policy's choice
(`eviction`, the cache/eviction group at cache.eviction; lab/cache/eviction.py).

`dtype` (cache.dtype: auto | fp8) is only validated and recorded here; the worker allocates the
tensors in that dtype (lab/attention/base.py), and bytes_per_block already reflects it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from lab.cache.block import KVCacheBlock
from lab.cache.block_pool import BlockPool
from lab.cache.coordinator import GroupBlocks, make_coordinator
from lab.cache.dtypes import KV_CACHE_DTYPES
from lab.cache.eviction import EvictionPolicy
from lab.cache.groups import ONE_FULL_GROUP, KVCacheGroup
from lab.cache.single_type import cdiv
from lab.cache.swap import NOT_NEEDED, SwapSpace, SwapStep

if TYPE_CHECKING:
    from lab.core.request import Request

__all__ = ["KVCacheManager", "KVCacheStats", "PrefixCacheStats", "cdiv"]


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
    group_used_blocks: tuple[int, ...] = ()  # blocks in use per KV cache group
    num_window_freed_blocks: int = 0  # since the previous call: blocks that left a window


class KVCacheManager:
    """Allocates and frees a request's blocks over a BlockPool, with prefix caching, in every
    KV cache group at once."""

    def __init__(
        self, num_blocks: int, block_size: int, max_model_len: int, enable_caching: bool = True,
        swap_space_gb: float = 0.0, bytes_per_block: int = 0, dtype: str = "auto",
        eviction: EvictionPolicy | None = None, groups: Sequence[KVCacheGroup] | None = None,
        hybrid: bool = True, num_lookahead_tokens: int = 0,
    ) -> None:
        """`groups`: the model's KV cache groups (lab/cache/groups.py; the engine passes the
        worker's); None: one full-attention group. `hybrid` (cache.hybrid) is recorded only:
        the worker groups the layers with it. `num_lookahead_tokens`: slots reserved beyond
        every allocation's tokens, for a speculative proposer that writes its own KV there
        within the step (a draft model; lab/speculative); `trim` gives them back after it."""
        if dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"cache.dtype={dtype!r} is invalid: use one of "
                             f"{', '.join(KV_CACHE_DTYPES)} (auto = the model dtype, fp8 = "
                             "float8 e4m3 with per-layer scales)")
        self.dtype = dtype
        if not isinstance(hybrid, bool):
            raise ValueError(f"cache.hybrid={hybrid!r} is invalid: use true (sliding-window "
                             "layers free the blocks that leave their window) or false (every "
                             "layer keeps its whole context)")
        self.hybrid = hybrid
        if block_size <= 0 or max_model_len <= 0:
            raise ValueError(f"block_size={block_size}, max_model_len={max_model_len} must be > 0")
        if not isinstance(swap_space_gb, int | float) or swap_space_gb < 0:
            raise ValueError(f"cache.swap_space_gb={swap_space_gb!r} is invalid: must be a number "
                             ">= 0 (GiB of CPU memory for swapped-out KV blocks; 0 = no swap)")
        self.block_size = block_size
        self.max_model_len = max_model_len
        if not isinstance(num_lookahead_tokens, int) or num_lookahead_tokens < 0:
            raise ValueError(f"num_lookahead_tokens={num_lookahead_tokens!r} must be an "
                             "integer >= 0")
        self.num_lookahead_tokens = num_lookahead_tokens
        self.enable_caching = enable_caching
        self.bytes_per_block = bytes_per_block  # KV bytes of one block over all its pages
        num_swap = int(swap_space_gb * 2**30) // bytes_per_block if bytes_per_block > 0 else 0
        self.swap_space = SwapSpace(num_swap)
        # per swapped request: (first block, count) of each group's swapped blocks
        self._swap_layout: dict[str, tuple[tuple[int, int], ...]] = {}
        self.block_pool = BlockPool(num_blocks, enable_caching, eviction)  # None: LRU
        self.groups = tuple(groups) if groups else ONE_FULL_GROUP
        self.coordinator = make_coordinator(self.groups, self.block_pool, block_size,
                                            enable_caching)
        self.prefix_cache_stats = PrefixCacheStats()  # since the last take
        self.prefix_cache_totals = PrefixCacheStats()  # cumulative

    # -- sizes -----------------------------------------------------------------------------
    @property
    def num_groups(self) -> int:
        return len(self.groups)

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

    @property
    def group_used_blocks(self) -> tuple[int, ...]:
        """Blocks in use per KV cache group."""
        used = self.block_pool.group_used
        return tuple(used.get(g, 0) for g in range(self.num_groups))

    def stats(self) -> KVCacheStats:
        """A snapshot for the step that just ran; resets the since-the-last-call counters."""
        return KVCacheStats(self.usage, self.num_used_blocks, self.num_blocks - 1,
                            self.bytes_per_block, self.take_prefix_cache_stats(),
                            self.take_num_evicted(), self.num_swapped_reqs,
                            self.group_used_blocks, self.coordinator.take_num_window_freed())

    # -- prefix cache ----------------------------------------------------------------------
    def get_computed_blocks(self, request: Request) -> tuple[GroupBlocks, int]:
        """The longest prefix of the request cached in every group (each group's blocks; a
        sliding window's are null before its window), and its length in tokens.

        The last token is never covered (its logits must be computed), so at most
        (num_tokens - 1) // block_size blocks can hit. Empty when caching is off, and for a
        request that asks for prompt logprobs (every prompt position must be computed; vLLM's
        skip_reading_prefix_cache).
        """
        if not self.enable_caching or request.sampling_params.prompt_logprobs is not None:
            return self.coordinator.empty(), 0
        max_blocks = (request.num_tokens - 1) // self.block_size
        hits, num_hit_blocks = self.coordinator.find_longest_cache_hit(request.block_hashes,
                                                                       max_blocks)
        num_hit_tokens = num_hit_blocks * self.block_size
        self._count_lookup(request.num_tokens, num_hit_tokens)
        return hits, num_hit_tokens

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
        """Zero the lookup, eviction and window counters, per step and cumulative (an engine
        that starts its run afresh after a warm-up: lab/engine/warmup.py)."""
        self.prefix_cache_stats = PrefixCacheStats()
        self.prefix_cache_totals = PrefixCacheStats()
        self.block_pool.reset_counters()
        self.coordinator.take_num_window_freed()

    # -- allocation ------------------------------------------------------------------------
    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_blocks: GroupBlocks | None = None,
    ) -> GroupBlocks | None:
        """Reserve slots for `num_new_tokens` more tokens (after any prefix hits) in every group.

        Blocks that left a sliding window are freed first. Returns each group's newly
        allocated blocks (possibly empty lists), or None -- with nothing but those frees
        changed -- when the free queue cannot supply them all. See the module docstring for the
        layout. Nothing is committed to the prefix cache here (see `cache_computed`).
        """
        if num_new_tokens <= 0:
            raise ValueError(f"num_new_tokens must be > 0, got {num_new_tokens}")
        coord = self.coordinator
        hits = new_computed_blocks or coord.empty()
        rid = request.request_id
        holds = coord.holds(rid)
        if num_new_computed_tokens and holds:
            raise ValueError(f"request {rid} already has blocks; prefix hits are for requests "
                             "that hold none (new, preempted or swapped out)")
        num_computed = request.num_computed_tokens + num_new_computed_tokens
        num_needed = min(num_computed + num_new_tokens + self.num_lookahead_tokens,
                         self.max_model_len)
        if holds:
            coord.remove_skipped_blocks(rid, request.num_computed_tokens)
            if coord.num_positions(rid) * self.block_size >= num_needed:
                return coord.empty()  # the common decode step: its blocks hold the new tokens
        self._check_hashes(request, min(num_needed, request.num_tokens))
        if coord.num_blocks_to_allocate(rid, num_needed, hits) > self.num_free_blocks:
            return None
        if num_new_computed_tokens:
            coord.save_hits(rid, hits)
        return coord.allocate_new(rid, num_needed)

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
        if self.enable_caching:
            self.coordinator.cache_blocks(request, min(num_computed, request.num_tokens))

    def trim(self, request: Request, num_tokens: int) -> int:
        """Free the request's trailing blocks that hold no position below `num_tokens`, in every
        group: the slots of rejected drafts and of lookahead (speculative decoding) once the
        step that used them is over. They were never committed to the prefix cache (only
        computed tokens are, `cache_computed`). Returns how many blocks were freed."""
        return self.coordinator.trim(request.request_id, num_tokens)

    def free(self, request: Request) -> None:
        """Release the request's blocks in every group, tail first (so its tail is evicted
        before its head). Hashes stay on the blocks: a later request (or this one,
        re-admitted) can hit them."""
        self.coordinator.free(request.request_id)

    def release(self, request: Request) -> None:
        """Forget a finished request: free its device blocks and its swap blocks."""
        self.free(request)
        self.discard_swapped(request.request_id)

    def free_all(self) -> None:
        """Release every request's blocks and swap blocks (recovery after a scheduler failure)."""
        for request_id in self.coordinator.request_ids():
            self.coordinator.free(request_id)
        for request_id in list(self.swap_space.req_to_blocks):
            self.discard_swapped(request_id)
        self._swap_layout.clear()

    # -- swap ------------------------------------------------------------------------------
    def swap_out(self, request: Request) -> bool:
        """Park the request's computed blocks (in each group those it holds) in the swap space
        and free its device blocks. False (nothing changed) when it has nothing computed or
        the swap space is too small."""
        num = cdiv(request.num_computed_tokens, self.block_size)
        layout, device = [], []
        for manager in self.coordinator.managers:
            blocks = manager.req_to_blocks.get(request.request_id, [])[:num]
            if num == 0 or len(blocks) < num:
                return False
            first = next((i for i, b in enumerate(blocks) if not b.is_null), len(blocks))
            layout.append((first, num - first))
            device.extend(b.block_id for b in blocks[first:])
        if not self.swap_space.swap_out(request.request_id, device):
            return False
        self._swap_layout[request.request_id] = tuple(layout)
        self.free(request)
        return True

    def resume_swapped(self, request: Request, num_new_tokens: int) -> GroupBlocks | None:
        """Give a swapped-out request device blocks again for its computed tokens plus
        `num_new_tokens`, in every group: blocks still cached on the device under its hashes
        (a run from the first block the group needs) are taken back (counted as prefix-cache
        hits), the others are copied from the swap space; a sliding window's blocks that left
        it are not brought back. None (nothing changed) when the blocks do not fit. See the
        module docstring for the layout."""
        rid, bs = request.request_id, self.block_size
        num_hashed = min(request.num_computed_tokens // bs, len(request.block_hashes))
        plans = []  # per group: (the first block it needs, the run reclaimed from there)
        for manager, (first, count) in zip(self.coordinator.managers, self._swap_layout[rid]):
            start = max(first, manager.num_skipped_blocks(request.num_computed_tokens))
            run = []
            while (self.enable_caching and start + len(run) < min(num_hashed, first + count)
                   and (b := manager.pool.get_cached_block(
                       request.block_hashes[start + len(run)], manager.group)) is not None):
                run.append(b)
            plans.append((start, run))
        # a lookup of the computed tokens, hit as far as the first group's run reaches
        self._count_lookup(request.num_computed_tokens, len(plans[0][1]) * bs)
        hits = tuple([self.block_pool.null_block] * start + run for start, run in plans)
        total = request.num_computed_tokens + num_new_tokens + self.num_lookahead_tokens
        num_needed = min(total, self.max_model_len)
        if self.coordinator.num_blocks_to_allocate(rid, num_needed, hits) > self.num_free_blocks:
            return None
        self.coordinator.save_hits(rid, hits)
        new = self.coordinator.allocate_new(rid, num_needed)
        targets: list[int | None] = []  # per swapped block: the device block it is copied to
        for manager, (first, count), (start, run) in zip(
                self.coordinator.managers, self._swap_layout[rid], plans):
            blocks = manager.req_to_blocks[rid]
            targets += [NOT_NEEDED] * (start - first)  # left the window: not brought back
            targets += [None] * len(run)  # reclaimed on the device
            targets += [b.block_id for b in blocks[start + len(run):first + count]]
        self.swap_space.swap_in(rid, targets)
        return new

    def undo_resume(self, request: Request) -> None:
        """Take back this step's `resume_swapped`: the request is swapped out again."""
        self.swap_space.undo_swap_in(request.request_id)
        self.free(request)

    def discard_swapped(self, request_id: str) -> None:
        """Drop a request's swapped blocks (it will be recomputed instead)."""
        self.swap_space.discard(request_id)
        self._swap_layout.pop(request_id, None)

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

    # -- reading ---------------------------------------------------------------------------
    def get_block_ids(self, request_id: str) -> tuple[list[int], ...]:
        """The request's block ids in token order, one list per group (empty lists if it holds
        none; a sliding window's null blocks are id 0)."""
        return self.coordinator.block_ids(request_id)

    def held_blocks(self, request_id: str) -> list[KVCacheBlock]:
        """Every block the request holds, over all groups (null blocks excluded)."""
        return self.coordinator.held_blocks(request_id)

    def num_block_positions(self, request_id: str) -> int:
        """Blocks the request's lists cover in each group (null blocks included)."""
        return self.coordinator.num_positions(request_id)
