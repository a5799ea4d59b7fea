"""The AttentionBackend seam: how a backend declares its KV cache and runs paged attention.

A backend is built once by the engine (Hydra `_target_` under `lab/conf/attention/`). Per step the
ModelRunner hands it the step's `AttentionInputs` (plain tensors, no policy) and the backend turns
them into its own metadata once (`build_metadata`); every attention layer then calls
`forward(layer_idx, q, k, v, kv_cache, metadata, scale)`.

Layout of the flattened token batch of one step (requests back to back, in scheduler order):

    query_start_loc:  0        q0          q0+q1      ...        T
                      | req 0 new tokens | req 1 new tokens | ... |
    for request i:    positions num_computed[i] .. seq_lens[i]-1 are computed this step;
                      positions 0 .. num_computed[i]-1 are read from the paged cache.

fp8 KV cache (`cache.dtype=fp8`): float8 e4m3fn tensors with two fp32 scales per layer; the
scheme (calibration, quantize / dequantize references) is lab/kernels/fp8_kv.py. The scales
belong to the cache (`allocate_kv_cache` returns a `KVCache`: `.layers` and `.scales`); the
ModelRunner holds them and hands them to the backend in each step's `AttentionInputs.kv_scales`,
so a backend keeps no state about any cache.

CUDA graphs (vLLM's AttentionCGSupport): a backend declares with `cudagraph_support(device)`
which batches the ModelRunner may run from its static buffers (lab/worker/cudagraph.py):
NEVER (always eager) or UNIFORM_DECODE (batches where every request has one new token, padded to
a capture size). The runner builds a decode metadata once per padded size, over AttentionInputs
whose tensors are views of its static buffers, and reuses it for every step of that size — a
captured graph replays it. So a backend declaring UNIFORM_DECODE must build decode metadata that
reads every per-step value through those input tensors (a view, or work done in `forward`),
never a copy or host value taken at build time other than the batch size and max_model_len.
Padding requests have one token at position 0, written to slot 0 of the null block 0, seq_len 1
and a block-table row of zeros; their outputs are dropped.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from dataclasses import dataclass, replace

import torch

from lab.attention.spec import AttentionSpec
from lab.cache.dtypes import KV_CACHE_DTYPES
from lab.kernels.fp8_kv import FP8_KV_DTYPE, calibrate_kv_scale


def kv_cache_torch_dtype(cache_dtype: str, model_dtype: torch.dtype) -> torch.dtype:
    """`cache.dtype` -> the KV cache's torch dtype (auto: the model's)."""
    if cache_dtype not in KV_CACHE_DTYPES:
        raise ValueError(f"cache.dtype={cache_dtype!r} is invalid: use one of "
                         f"{', '.join(KV_CACHE_DTYPES)} (auto = the model dtype, fp8 = float8 "
                         "e4m3 with per-layer scales)")
    return FP8_KV_DTYPE if cache_dtype == "fp8" else model_dtype


@dataclass(frozen=True)
class KVCacheSpec:
    """The per-layer KV cache a backend needs: its shape per block and its bytes per token."""

    block_shape: tuple[int, ...]  # shape of one block of one layer
    dtype: torch.dtype
    bytes_per_token: int  # per layer
    block_size: int
    leading: tuple[int, ...] = ()  # dims before the block dim, e.g. (2,) for split K/V

    @property
    def block_dim(self) -> int:
        """The dimension of a layer's cache tensor that indexes blocks."""
        return len(self.leading)

    def layer_shape(self, num_blocks: int) -> tuple[int, ...]:
        """One layer's cache: (*leading, num_blocks, *block_shape)."""
        return (*self.leading, num_blocks, *self.block_shape)

    @property
    def page_bytes(self) -> int:
        """Bytes of one block of one layer."""
        return self.bytes_per_token * self.block_size


class KVScales:
    """An fp8 cache's per-layer scales: fp32 `scales` [num_layers, 2] (K and V, or kv_c and k_pe
    for MLA's latent row) and which layers are calibrated. Made with the cache (`KVCache`), so a
    fresh cache starts uncalibrated; each layer is calibrated on its first write (scheme:
    lab/kernels/fp8_kv.py) and fixed afterwards."""

    def __init__(self, num_layers: int, device: torch.device | str) -> None:
        self.scales = torch.ones(num_layers, 2, dtype=torch.float32, device=device)
        self.calibrated = [False] * num_layers

    def for_layer(
        self, layer_idx: int, first: torch.Tensor, second: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The layer's two scales (fp32 [1] views), calibrated from `first` / `second` (the
        step's rows) if this is the layer's first write."""
        if layer_idx >= len(self.calibrated):  # grow, keeping the calibrated layers
            extra = layer_idx + 1 - len(self.calibrated)
            self.scales = torch.cat((self.scales, self.scales.new_ones(extra, 2)))
            self.calibrated += [False] * extra
        if not self.calibrated[layer_idx]:
            self.scales[layer_idx, 0:1] = calibrate_kv_scale(first)
            self.scales[layer_idx, 1:2] = calibrate_kv_scale(second)
            self.calibrated[layer_idx] = True
        return self.scales[layer_idx, 0:1], self.scales[layer_idx, 1:2]


@dataclass
class KVCache:
    """The KV cache a backend allocates: one tensor per layer, and an fp8 cache's scales."""

    layers: list[torch.Tensor]
    scales: KVScales | None = None


def layer_kv_scales(
    inputs: AttentionInputs, layer_idx: int, kv_cache: torch.Tensor, first: torch.Tensor,
    second: torch.Tensor,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The layer's two fp8 scales from the step's `inputs.kv_scales` (see KVScales.for_layer);
    (None, None) for a cache that is not fp8."""
    if kv_cache.dtype != FP8_KV_DTYPE:
        return None, None
    if inputs.kv_scales is None:
        raise ValueError("an fp8 KV cache needs its scales: pass the KVScales of the KVCache "
                         "that allocate_kv_cache made as AttentionInputs.kv_scales")
    return inputs.kv_scales.for_layer(layer_idx, first, second)


@dataclass
class AttentionInputs:
    """The step's attention inputs, common to every backend (device tensors + host copies).

    seq_lens[i] = num_computed[i] + query_len[i]; slot_mapping[t] = -1 marks a padding token.
    """

    query_start_loc: torch.Tensor  # int32 [B+1]
    seq_lens: torch.Tensor  # int32 [B]
    num_computed_tokens: torch.Tensor  # int32 [B]
    block_table: torch.Tensor  # int32 [B, max_blocks]
    slot_mapping: torch.Tensor  # int64 [T]
    num_reqs: int
    num_actual_tokens: int
    max_query_len: int
    max_seq_len: int
    block_size: int
    query_lens_cpu: list[int]
    seq_lens_cpu: list[int]
    max_model_len: int = 0  # the engine's limit: lets backends size launches without host lengths
    kv_scales: KVScales | None = None  # an fp8 cache's KVCache.scales, handed in per step
    # a hybrid KV cache (lab/cache/groups.py): every group's (block_table, slot_mapping), group
    # 0's being the two above, and each layer's group; () for a cache of one group
    group_tables: tuple[tuple[torch.Tensor, torch.Tensor], ...] = ()
    layer_groups: tuple[int, ...] = ()

    @property
    def is_pure_decode(self) -> bool:
        return self.max_query_len == 1

    def per_group(self) -> list[AttentionInputs]:
        """These inputs once per KV cache group (its block table and slot mapping), each of a
        single group; [self] when there is one group."""
        if not self.group_tables:
            return [self]
        return [replace(self, block_table=table, slot_mapping=slots, group_tables=(),
                        layer_groups=()) for table, slots in self.group_tables]


@dataclass
class GroupedMetadata:
    """A step's metadata over a hybrid KV cache (several KV cache groups, lab/cache/groups.py):
    the backend's metadata of each group's AttentionInputs (its block table and slot mapping),
    and each layer's group. `layer_metadata` picks a layer's."""

    groups: list[object]
    layer_groups: tuple[int, ...]


def layer_metadata(metadata: object, layer_idx: int) -> object:
    """The metadata layer `layer_idx` attends with: its group's of a GroupedMetadata, else the
    step's one metadata (a model whose layers share one KV cache group)."""
    if isinstance(metadata, GroupedMetadata):
        return metadata.groups[metadata.layer_groups[layer_idx]]
    return metadata


def build_step_metadata(backend: AttentionBackend, inputs: AttentionInputs) -> object:
    """The step's metadata: `backend.build_metadata(inputs)`, or over a hybrid KV cache
    (inputs.group_tables) a GroupedMetadata of one metadata per group."""
    if not inputs.group_tables:
        return backend.build_metadata(inputs)
    return GroupedMetadata([backend.build_metadata(g) for g in inputs.per_group()],
                           inputs.layer_groups)


class CudaGraphSupport(enum.Enum):
    """Which batches a backend's metadata can serve from the runner's static buffers (vLLM's
    AttentionCGSupport, of which lab's runner uses these two: it captures decode batches only)."""

    NEVER = "never"  # every batch runs eagerly
    UNIFORM_DECODE = "uniform_decode"  # one new token per request (padded); others run eagerly


ALIGNMENT = 64  # bytes: what torch's CPU allocator gives, a cache line (vector loads)


def zeroed_cpu_tensor(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A zero-filled CPU tensor whose pages the OS zeroes on first touch: numpy's zeros (calloc,
    anonymous pages for a large array) instead of torch.zeros, which writes every byte at
    once. 64-byte aligned, as torch's allocator aligns; the storage is owned by the numpy
    array the tensor views."""
    import numpy as np

    itemsize = torch.empty((), dtype=dtype).element_size()
    count = int(np.prod(shape, dtype=np.int64))
    raw = np.zeros(count * itemsize + ALIGNMENT, dtype=np.uint8)
    offset = -raw.ctypes.data % ALIGNMENT
    flat = torch.from_numpy(raw[offset : offset + count * itemsize])
    return flat.view(dtype).view(shape)


#: the KV bytes (every layer together) a CPU cache touches at allocation: a first touch costs a
#: page fault, ~2-11 us per 4 KiB page on the 2-core VM of the measurements (a fresh 16 x 256
#: token batch of bench_qwen3_06b bf16 writes ~200 MB: 431 tok/s untouched vs 472 pre-touched);
#: the rest pages in as the block pool reaches it (vLLM-CPU zeroes its whole cache at start)
PREFAULT_BYTES = 1 << 30


def prefault(layers: list[torch.Tensor], kv_spec: KVCacheSpec, budget: int) -> None:
    """Touch (write zeros to) the lowest-numbered blocks of every layer's cache, `budget`
    bytes in all: the blocks a fresh block pool hands out first."""
    if not layers:
        return
    num_blocks = layers[0].shape[kv_spec.block_dim]
    blocks = min(num_blocks, budget // max(1, kv_spec.page_bytes * len(layers)))
    for layer in layers:
        layer.narrow(kv_spec.block_dim, 0, blocks).zero_()


class AttentionBackend(ABC):
    """Base class of the `attention` config group. Subclasses implement one attention algorithm."""

    #: the attention kinds this backend supports (see AttentionSpec.kind)
    supported_kinds: tuple[str, ...] = ("mha", "gqa")
    #: whether its attention launches Triton kernels (Triton's interpreter without CUDA)
    uses_triton: bool = False
    #: the KV block sizes (tokens per block) this backend supports; `block_size` must be one.
    #: Every backend in lab takes the powers of two 1..128: the torch reference gathers whole
    #: blocks, and the Triton kernels index pages with `pos // BLOCK_SIZE`, `pos % BLOCK_SIZE` on
    #: a constexpr block size (a shift and a mask for a power of two, one compiled kernel per
    #: size; the kernel tests cover 1..128). A backend with a narrower kernel overrides this.
    block_sizes: tuple[int, ...] = tuple(2**i for i in range(8))
    #: whether a step that is not pure decode attends over one padded [requests,
    #: max_query_len, max_context_len] view of the batch (its cost follows that geometry) rather
    #: than request by request; the simulator's profiled step-time model reads it
    padded_batches: bool = False
    name: str = "base"

    @classmethod
    def check_block_size(cls, block_size: int) -> None:
        """Refuse a `block_size` this backend has no kernel for, naming the sizes it has."""
        if block_size not in cls.block_sizes:
            raise ValueError(
                f"block_size={block_size} is invalid for attention={cls.name}: it supports "
                f"block sizes {', '.join(map(str, cls.block_sizes))}"
            )

    #: what `cudagraph_support` answers unless a backend overrides it
    cudagraph: CudaGraphSupport = CudaGraphSupport.NEVER

    def cudagraph_support(self, device: torch.device) -> CudaGraphSupport:
        """Which batches may run padded from static buffers on `device` (captured as CUDA graphs
        there; run eagerly on a CPU). See the module docstring for the metadata contract."""
        return self.cudagraph

    def setup(self, device: torch.device) -> None:  # noqa: B027 - an optional hook
        """Build or load what this backend needs on `device` (e.g. a C++ kernel) before the
        model loads, so before the engine reports ready; the Worker calls it (nothing here)."""

    #: the per-layer ATTENTION_FEATURES (lab/attention/spec.py) its `forward` implements: a
    #: layer that uses one passes it as a keyword (sliding_window=, sinks=, softcap=)
    supported_features: frozenset[str] = frozenset()

    def check_supported(self, spec: AttentionSpec) -> None:
        """Refuse a model whose attention kind, or a feature one of its layers uses, this
        backend does not implement."""
        missing = spec.features - self.supported_features
        if missing:
            raise ValueError(
                f"attention={self.name} does not implement {', '.join(sorted(missing))} "
                f"(the model's layers use it; this backend supports "
                f"{', '.join(sorted(self.supported_features)) or 'none of those'}); "
                "use attention=torch (the reference implements every feature)")
        if spec.kind not in self.supported_kinds:
            other = "triton_mla" if spec.kind == "mla" else "triton_flash"
            hint = f"; use attention={other} or attention=torch"
            raise ValueError(
                f"attention={self.name} does not support {spec.kind!r} attention "
                f"(supported: {', '.join(self.supported_kinds)}){hint}"
            )

    @abstractmethod
    def kv_cache_spec(self, spec: AttentionSpec, block_size: int, dtype: torch.dtype) -> KVCacheSpec:
        """The per-layer cache this backend needs for a model with this attention spec."""

    def allocate_kv_cache(
        self, kv_spec: KVCacheSpec, num_blocks: int, num_layers: int, device: torch.device
    ) -> KVCache:
        """One zeroed cache tensor per layer, shaped kv_spec.layer_shape(num_blocks); an fp8
        cache also gets fresh (uncalibrated) per-layer scales. On a CPU the zeros are the
        operating system's (zeroed_cpu_tensor): a cache sized from memory costs the memory its
        requests write, not its size, until they fill it; its first blocks (PREFAULT_BYTES in
        all, the blocks the block pool hands out first) are touched now (`prefault`), so the
        engine's first requests do not pay the page faults inside their steps."""
        shape = kv_spec.layer_shape(num_blocks)
        if torch.device(device).type == "cpu":
            layers = [zeroed_cpu_tensor(shape, kv_spec.dtype) for _ in range(num_layers)]
            prefault(layers, kv_spec, PREFAULT_BYTES)
        else:
            layers = [torch.zeros(shape, dtype=kv_spec.dtype, device=device)
                      for _ in range(num_layers)]
        scales = KVScales(num_layers, device) if kv_spec.dtype == FP8_KV_DTYPE else None
        return KVCache(layers, scales)

    def build_metadata(self, inputs: AttentionInputs) -> object:
        """Backend-specific metadata, built once per step. The default passes the inputs through."""
        return inputs

    @abstractmethod
    def forward(
        self,
        layer_idx: int,
        q: torch.Tensor,  # [T, num_heads, head_dim]
        k: torch.Tensor,  # [T, num_kv_heads, head_dim]
        v: torch.Tensor,  # [T, num_kv_heads, head_dim]
        kv_cache: torch.Tensor,
        metadata: object,
        scale: float,
        *,
        sliding_window: int | None = None,
        sinks: torch.Tensor | None = None,
        softcap: float | None = None,
    ) -> torch.Tensor:
        """Write k/v of the step's tokens into the cache, attend, return [T, num_heads, head_dim].

        The keywords are the layer's ATTENTION_FEATURES (AttentionSpec): a query at position i
        sees keys j with i - j < sliding_window; `sinks` (fp32 [num_heads]) is one more logit per
        head in every softmax's denominator, with no value; `softcap` maps each scaled score s to
        softcap * tanh(s / softcap) before the mask. A layer passes only those it uses, and only
        to a backend listing them in `supported_features` (check_supported)."""


class PagedKVBackend(AttentionBackend):
    """A backend over the split K/V paged layout shared by `torch` and `triton_flash`.

    Per layer: (2, num_blocks, block_size, num_kv_heads, head_dim); [0] holds K, [1] holds V, so
    a request's blocks of either are gathered with one contiguous copy per block.
    """

    def kv_cache_spec(self, spec: AttentionSpec, block_size: int, dtype: torch.dtype) -> KVCacheSpec:
        elem = torch.empty((), dtype=dtype).element_size()
        return KVCacheSpec(
            block_shape=(block_size, spec.num_kv_heads, spec.head_dim),
            dtype=dtype,
            bytes_per_token=spec.kv_elems_per_token * elem,
            block_size=block_size,
            leading=(2,),
        )
