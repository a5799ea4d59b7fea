"""`attention=triton_flash`: paged attention in Triton (FlashAttention-style, split-KV decode).

Per step and layer:
  1. `write_kv_cache` writes the step's K/V through the slot mapping (slot -1 skipped);
  2. a pure-decode batch (every request has one new token) runs the split-KV decode kernel:
     stage 1 over (request, KV head, split), stage 2 `merge_attn_states` weighted by the splits'
     LSEs, or a single launch that writes the output directly when one split suffices;
  3. any other batch (prefill, chunked prefill, prefix hits, mixed with decodes) runs the varlen
     paged kernel, which reads every key (cached prefix and new tokens alike) through the block
     table with GQA query heads packed so each K/V tile is loaded once per KV head.

The number of splits is chosen from the batch size and `max_model_len` (a sliding-window layer's:
the window, where it is shorter), not from this step's lengths, so the launch grid depends only
on the batch size: decode batches are CUDA-graph safe (UNIFORM_DECODE, base.py): the metadata
holds the inputs (views of the runner's static buffers) and the split counts, and the decode
kernel reads lengths and block tables from them.

Per-layer features (`supported_features`: all of ATTENTION_FEATURES), passed by the layers that
use them and handed to both kernels: a sliding window (constant per layer; the kernels skip the
key tiles below it, lab/kernels/paged_prefill.py and paged_decode.py), sinks (the layer's
parameter tensor, read on the GPU) and a soft cap (constant per layer). On a machine
without CUDA the kernels run in Triton's interpreter (see lab/kernels/__init__.py), which has no
bf16 arithmetic: a bf16 KV cache is refused there. An fp8 KV cache (`cache.dtype=fp8`, scheme in
lab/kernels/fp8_kv.py) is quantized by the write kernel and dequantized inside both attention
kernels with the layer's scales; it runs in the interpreter too.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from lab.attention.base import (
    AttentionInputs,
    AttentionSpec,
    CudaGraphSupport,
    KVCacheSpec,
    PagedKVBackend,
    layer_kv_scales,
)
from lab.attention.spec import ATTENTION_FEATURES
from lab.attention.split_kv import SplitKVDecode
from lab.kernels.kv_cache_write import write_kv_cache
from lab.kernels.paged_decode import paged_decode_attention
from lab.kernels.paged_prefill import paged_attention


@dataclass
class TritonFlashMetadata:
    inputs: AttentionInputs
    decode: bool  # every request has exactly one new token
    num_splits: int
    # a decode step's split count per sliding window (layers with one; filled on first use
    # from the batch size and the window: host constants, the same at every replay)
    window_splits: dict[int, int] = field(default_factory=dict)


class TritonFlashBackend(SplitKVDecode, PagedKVBackend):
    """Paged FlashAttention in Triton over the split K/V paged layout."""

    name = "triton_flash"
    uses_triton = True
    cudagraph = CudaGraphSupport.UNIFORM_DECODE
    supported_features = frozenset(ATTENTION_FEATURES)

    def __init__(self, max_splits: int = 16, min_keys_per_split: int = 256,
                 num_sms: int | None = None) -> None:
        super().__init__(max_splits, min_keys_per_split, num_sms)
        self._num_kv_heads = 1

    def kv_cache_spec(self, spec: AttentionSpec, block_size: int, dtype: torch.dtype) -> KVCacheSpec:
        self.refuse_interpreter_bf16(dtype)
        if spec.head_dim & (spec.head_dim - 1):
            raise ValueError(f"attention=triton_flash needs a power-of-two head_dim, got "
                             f"{spec.head_dim}; use attention=torch")
        self._num_kv_heads = spec.num_kv_heads
        return super().kv_cache_spec(spec, block_size, dtype)

    def build_metadata(self, inputs: AttentionInputs) -> TritonFlashMetadata:
        decode = inputs.max_query_len == 1
        splits = 1
        if decode:
            splits = self.decode_splits(inputs.num_reqs, self._max_len(inputs),
                                        self._num_kv_heads, inputs.seq_lens.device)
        return TritonFlashMetadata(inputs, decode, splits)

    @staticmethod
    def _max_len(inputs: AttentionInputs) -> int:
        return inputs.max_model_len or inputs.max_seq_len

    def _splits(self, md: TritonFlashMetadata, window: int | None) -> int:
        """The decode split count of a layer: the step's, or for a window shorter than the
        longest sequence the count for that many keys (the splits cover the window only)."""
        a = md.inputs
        if window is None or window >= self._max_len(a):
            return md.num_splits
        if window not in md.window_splits:
            md.window_splits[window] = self.decode_splits(a.num_reqs, window, self._num_kv_heads,
                                                          a.seq_lens.device)
        return md.window_splits[window]

    def forward(self, layer_idx, q, k, v, kv_cache, metadata, scale, *, sliding_window=None,
                sinks=None, softcap=None):
        md: TritonFlashMetadata = metadata
        a = md.inputs
        n = a.num_actual_tokens
        k_scale, v_scale = layer_kv_scales(a, layer_idx, kv_cache, k[:n], v[:n])
        write_kv_cache(k[:n], v[:n], kv_cache[0], kv_cache[1], a.slot_mapping[:n],
                       k_scale, v_scale)
        out = torch.zeros_like(q)
        features = dict(sliding_window=sliding_window, sinks=sinks, softcap=softcap)
        if md.decode:
            paged_decode_attention(q[:n], kv_cache[0], kv_cache[1], out[:n], a.seq_lens,
                                   a.block_table, scale, self._splits(md, sliding_window),
                                   self.workspace, k_scale=k_scale, v_scale=v_scale, **features)
        else:
            paged_attention(q[:n], kv_cache[0], kv_cache[1], out[:n], a.query_start_loc,
                            a.seq_lens, a.block_table, a.max_query_len, scale,
                            k_scale=k_scale, v_scale=v_scale, **features)
        return out
