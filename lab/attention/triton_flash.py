"""`attention=triton_flash`: paged attention in Triton (FlashAttention-style, split-KV decode).

Per step and layer:
  1. `write_kv_cache` writes the step's K/V through the slot mapping (slot -1 skipped);
  2. a pure-decode batch (every request has one new token) runs the split-KV decode kernel:
     stage 1 over (request, KV head, split), stage 2 `merge_attn_states` weighted by the splits'
     LSEs, or a single launch that writes the output directly when one split suffices;
  3. any other batch (prefill, chunked prefill, prefix hits, mixed with decodes) runs the varlen
     paged kernel, which reads every key (cached prefix and new tokens alike) through the block
     table with GQA query heads packed so each K/V tile is loaded once per KV head.

The number of splits is chosen from the batch size and `max_model_len`, not from this step's
lengths, so the launch grid depends only on the batch size: decode batches are CUDA-graph safe
(UNIFORM_DECODE, base.py): the metadata holds the inputs (views of the runner's static buffers)
and the split count, and the decode kernel reads lengths and block tables from them. On a machine
without CUDA the kernels run in Triton's interpreter (see lab/kernels/__init__.py), which has no
bf16 arithmetic: a bf16 KV cache is refused there. An fp8 KV cache (`cache.dtype=fp8`, scheme in
lab/kernels/fp8_kv.py) is quantized by the write kernel and dequantized inside both attention
kernels with the layer's scales; it runs in the interpreter too.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lab.attention.base import (
    AttentionInputs,
    AttentionSpec,
    CudaGraphSupport,
    KVCacheSpec,
    PagedKVBackend,
    layer_kv_scales,
)
from lab.attention.split_kv import SplitKVDecode
from lab.kernels.kv_cache_write import write_kv_cache
from lab.kernels.paged_decode import paged_decode_attention
from lab.kernels.paged_prefill import paged_attention


@dataclass
class TritonFlashMetadata:
    inputs: AttentionInputs
    decode: bool  # every request has exactly one new token
    num_splits: int


class TritonFlashBackend(SplitKVDecode, PagedKVBackend):
    """Paged FlashAttention in Triton over the split K/V paged layout."""

    name = "triton_flash"
    uses_triton = True
    cudagraph = CudaGraphSupport.UNIFORM_DECODE

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
            splits = self.decode_splits(inputs.num_reqs, inputs.max_model_len or inputs.max_seq_len,
                                        self._num_kv_heads, inputs.seq_lens.device)
        return TritonFlashMetadata(inputs, decode, splits)

    def forward(self, layer_idx, q, k, v, kv_cache, metadata, scale):
        md: TritonFlashMetadata = metadata
        a = md.inputs
        n = a.num_actual_tokens
        k_scale, v_scale = layer_kv_scales(a, layer_idx, kv_cache, k[:n], v[:n])
        write_kv_cache(k[:n], v[:n], kv_cache[0], kv_cache[1], a.slot_mapping[:n],
                       k_scale, v_scale)
        out = torch.zeros_like(q)
        if md.decode:
            paged_decode_attention(q[:n], kv_cache[0], kv_cache[1], out[:n], a.seq_lens,
                                   a.block_table, scale, md.num_splits, self.workspace,
                                   k_scale=k_scale, v_scale=v_scale)
        else:
            paged_attention(q[:n], kv_cache[0], kv_cache[1], out[:n], a.query_start_loc,
                            a.seq_lens, a.block_table, a.max_query_len, scale,
                            k_scale=k_scale, v_scale=v_scale)
        return out
