"""KV cache groups: which layers share block tables, and how each group's blocks are managed.

Plain data, no torch (the worker, the scheduler and the simulator all group a model's layers
with these functions, from its per-layer AttentionSpecs: `ArchSpec.layer_attention_specs`).

Each layer's KV cache has a `KVCacheGroupSpec`: full attention (every block a request computed
stays needed) or a sliding window of W tokens (a query at position i reads keys i-W+1 .. i, so
blocks wholly before the window of the next query can go back to the pool). Layers of one spec
are split into groups of equal size (vLLM's layout for uniform page sizes):

    gpt-oss, 4 layers  S F S F  ->  group 0 = full (1, 3), group 1 = sliding (0, 2)
    Gemma-3, 6 layers  S S S S S F  ->  6 groups of one layer: 1 full, 5 sliding

Every group has its own block table per request, its own block ids from the one BlockPool,
and its own prefix-cache entries (a block hash is cached per group: lab/cache/hashing.py). The
worker allocates `num_tensors` = the group size KV tensors, each holding `num_blocks` blocks,
and layer j of every group uses tensor j: a block id is one page in each tensor, owned by
exactly one group at a time. So one block costs group_size pages (`bytes_per_block`), and a
request needs blocks in every group: a sliding-window group holds only the blocks of its
window once the request is past it (lab/cache/single_type.py), which is where a hybrid model
gains capacity over one that keeps every layer's whole context.

`hybrid=False` (cache.hybrid) puts every layer in one full-attention group, as vLLM's
--disable-hybrid-kv-cache-manager: sliding layers still attend within their window, but no
block is ever freed before its request ends (the baseline of experiments/hybrid_kv).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lab.attention.spec import AttentionSpec

FULL_ATTENTION = "full_attention"
SLIDING_WINDOW = "sliding_window"


@dataclass(frozen=True)
class KVCacheGroupSpec:
    """How a group's blocks are kept: full attention, or a sliding window of `sliding_window`
    tokens (a query at position i reads keys j with i - j < sliding_window)."""

    kind: str = FULL_ATTENTION
    sliding_window: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in (FULL_ATTENTION, SLIDING_WINDOW):
            raise ValueError(f"KV cache group kind {self.kind!r} is invalid: use "
                             f"{FULL_ATTENTION} or {SLIDING_WINDOW}")
        if (self.kind == SLIDING_WINDOW) != (self.sliding_window is not None):
            raise ValueError(f"a {SLIDING_WINDOW} group has a window and no other kind does "
                             f"(kind={self.kind}, sliding_window={self.sliding_window})")

    def max_blocks(self, num_tokens: int, block_size: int, max_step_tokens: int) -> int:
        """The most blocks a request of `num_tokens` tokens holds in this group at once, its
        steps computing at most `max_step_tokens` tokens: all of them under full attention; a
        window's blocks plus one step's (and a block of misalignment) under a sliding window."""
        blocks = -(-num_tokens // block_size)
        if self.sliding_window is None:
            return blocks
        return min(blocks, -(-(self.sliding_window - 1 + max_step_tokens) // block_size) + 1)

    def describe(self) -> str:
        return (FULL_ATTENTION if self.sliding_window is None
                else f"{SLIDING_WINDOW}({self.sliding_window})")


FULL = KVCacheGroupSpec()


@dataclass(frozen=True)
class KVCacheGroup:
    """The layers (decoder layer indices) that share one block table per request."""

    spec: KVCacheGroupSpec
    layers: tuple[int, ...]


#: the groups of a model whose layers all attend alike: one full-attention group (what an empty
#: `groups` stands for, e.g. ModelInfo.kv_groups=() or a KVCacheManager built without groups)
ONE_FULL_GROUP = (KVCacheGroup(FULL, (0,)),)


def cache_spec_of(layer: AttentionSpec, hybrid: bool = True) -> KVCacheGroupSpec:
    """A layer's group spec: a sliding window when the layer has one and `hybrid`, else full."""
    if hybrid and layer.sliding_window is not None:
        return KVCacheGroupSpec(SLIDING_WINDOW, layer.sliding_window)
    return FULL


def group_layers(layer_specs: Sequence[AttentionSpec], hybrid: bool = True
                 ) -> tuple[KVCacheGroup, ...]:
    """The model's KV cache groups (module docstring): the layers of each spec in groups of the
    fewest layers any spec has (or of the most, when the counts differ by under 25%, to avoid
    many small groups; the last group of a spec may be short), full-attention groups first."""
    if not layer_specs:
        raise ValueError("a model needs at least one attention layer")
    by_spec: dict[KVCacheGroupSpec, list[int]] = {}
    for i, layer in enumerate(layer_specs):
        by_spec.setdefault(cache_spec_of(layer, hybrid), []).append(i)
    counts = [len(layers) for layers in by_spec.values()]
    size = max(counts) if max(counts) < min(counts) * 1.25 else min(counts)
    ordered = sorted(by_spec.items(), key=lambda kv: (kv[0].sliding_window is not None, kv[1][0]))
    return tuple(KVCacheGroup(spec, tuple(layers[i:i + size]))
                 for spec, layers in ordered for i in range(0, len(layers), size))


def num_tensors(groups: Sequence[KVCacheGroup]) -> int:
    """KV tensors the worker allocates: the largest group's layer count (module docstring)."""
    return max(len(g.layers) for g in groups)


def layer_tensor_index(groups: Sequence[KVCacheGroup]) -> list[int]:
    """Which shared KV tensor each layer uses: its position within its group."""
    index: dict[int, int] = {}
    for group in groups:
        for j, layer in enumerate(group.layers):
            index[layer] = j
    return [index[i] for i in range(len(index))]


def layer_group_index(groups: Sequence[KVCacheGroup]) -> tuple[int, ...]:
    """Each layer's group."""
    owner: dict[int, int] = {}
    for g, group in enumerate(groups):
        for layer in group.layers:
            owner[layer] = g
    return tuple(owner[i] for i in range(len(owner)))


def max_blocks_per_request(groups: Sequence[KVCacheGroup], num_tokens: int, block_size: int,
                           max_step_tokens: int) -> int:
    """The most blocks one request of `num_tokens` tokens holds over every group at once."""
    return sum(g.spec.max_blocks(num_tokens, block_size, max_step_tokens) for g in groups)


def request_capacity(groups: Sequence[KVCacheGroup], num_blocks: int, block_size: int,
                     max_step_tokens: int, limit: int) -> int:
    """The longest request (in tokens, at most `limit`; a multiple of block_size below it)
    whose blocks fit in `num_blocks` usable blocks: max_blocks_per_request <= num_blocks (one
    full-attention group when `groups` is empty)."""
    groups = groups or ONE_FULL_GROUP

    def fits(n: int) -> bool:
        return max_blocks_per_request(groups, n, block_size, max_step_tokens) <= num_blocks

    if fits(limit):
        return limit
    lo, hi = 0, -(-limit // block_size)  # in blocks: lo fits, hi does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid * block_size) else (lo, mid)
    return lo * block_size


def describe_groups(groups: Sequence[KVCacheGroup]) -> str:
    """'2 groups: full_attention (layers 1, 3), sliding_window(16) (layers 0, 2)'."""
    parts = [f"{g.spec.describe()} (layers {', '.join(map(str, g.layers))})" for g in groups]
    return f"{len(groups)} group{'s' * (len(groups) > 1)}: " + "; ".join(parts)
