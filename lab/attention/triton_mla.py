"""`attention=triton_mla`: multi-head latent attention (DeepSeek-V2/V3) in Triton.

Per step and layer (see lab/attention/mla.py for the math and the latent cache layout):
  1. `write_latent_cache` (Triton) writes the step's | kv_c | k_pe | rows through the slot mapping;
  2. decode rows (requests with one new token) run in latent space with the weights absorbed:
         q_lat = q_nope · W_UK            [Bd, H, L]    (per-head GEMM)
         o_lat = mla_decode(q_lat, q_pe)  [Bd, H, L]    (split-KV Triton kernel, LSE merge)
         out   = o_lat · W_UV             [Bd, H, V]
     so the cache is read once per request as latents (L + R values per token), never expanded;
  3. prefill / extend rows (chunked prefill, prefix hits) expand their requests' cached latents
     with kv_b_proj into per-head K = | k_nope | k_pe | and V, zero-padded to one power-of-two
     width, and run the Triton varlen flash kernel over them (`paged_attention`, with a block
     table over the expanded copy). Expanding is O(context) per step — the price of exact MHA
     numerics for prompts; decode, where time goes, never expands.
A step with both kinds splits its requests into the two paths (token order is kept). A path
that holds every request of the step uses the step's own tensors (views), which is what makes
decode batches CUDA-graph safe (UNIFORM_DECODE, base.py): the split count depends on the batch
size and max_model_len only.

Softmax scale: the model passes (qk_nope + qk_rope)^-0.5 · mscale² (yarn), never the latent
width. On a machine without CUDA the kernels run in Triton's interpreter (fp32/fp16 only).

fp8 cache (`cache.dtype=fp8`, scheme in lab/kernels/fp8_kv.py: scales s_c for kv_c and s_pe for
k_pe per layer): the write kernel quantizes, the decode kernel dequantizes in its tiles, and the
expanded prefill dequantizes the gathered rows (to the model dtype) before kv_b_proj.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton

from lab.attention.base import (
    AttentionBackend,
    AttentionInputs,
    AttentionSpec,
    CudaGraphSupport,
    KVCacheSpec,
    layer_kv_scales,
)
from lab.attention.mla import MLAAttentionMixin, MLAWeights
from lab.attention.split_kv import SplitKVDecode
from lab.attention.torch_backend import dequantize_latent_rows
from lab.kernels.mla_cache_write import write_latent_cache
from lab.kernels.mla_decode import mla_decode_attention, mla_head_blocks
from lab.kernels.paged_prefill import paged_attention


@dataclass
class _Part:
    """The requests of one path: their token rows in the step and their own attention inputs."""

    token_idx: torch.Tensor  # long [n]: rows of the step's flat batch
    seq_lens: torch.Tensor  # int32 [b]
    block_table: torch.Tensor  # int32 [b, max_blocks]
    query_start_loc: torch.Tensor  # int32 [b + 1] (prefill path)
    max_query_len: int


@dataclass
class TritonMLAMetadata:
    inputs: AttentionInputs
    decode: _Part | None
    prefill: _Part | None
    num_splits: int


class TritonMLABackend(SplitKVDecode, MLAAttentionMixin, AttentionBackend):
    """MLA in Triton: absorbed split-KV latent decode + expanded flash prefill."""

    name = "triton_mla"
    uses_triton = True
    supported_kinds = ("mla",)
    cudagraph = CudaGraphSupport.UNIFORM_DECODE

    def __init__(self, max_splits: int = 16, min_keys_per_split: int = 256,
                 num_sms: int | None = None) -> None:
        super().__init__(max_splits, min_keys_per_split, num_sms)
        self._num_heads = 1

    def kv_cache_spec(self, spec: AttentionSpec, block_size: int, dtype: torch.dtype) -> KVCacheSpec:
        self.refuse_interpreter_bf16(dtype)
        self._num_heads = spec.num_heads
        return super().kv_cache_spec(spec, block_size, dtype)

    def forward(self, layer_idx, q, k, v, kv_cache, metadata, scale):
        raise ValueError("attention=triton_mla runs MLA models only (forward_mla); use "
                         "attention=triton_flash or attention=torch for this model")

    # -- metadata ----------------------------------------------------------------------------
    def build_metadata(self, inputs: AttentionInputs) -> TritonMLAMetadata:
        qlens = inputs.query_lens_cpu
        decode = [i for i, q in enumerate(qlens) if q == 1]
        prefill = [i for i, q in enumerate(qlens) if q > 1]
        splits = 1
        if decode:
            splits = self.decode_splits(len(decode), inputs.max_model_len or inputs.max_seq_len,
                                        mla_head_blocks(self._num_heads), inputs.seq_lens.device)
        return TritonMLAMetadata(inputs, _part(inputs, decode), _part(inputs, prefill), splits)

    # -- attention ---------------------------------------------------------------------------
    def forward_mla(self, layer_idx, q_nope, q_pe, kv_c, k_pe, kv_cache, metadata,
                    mla: MLAWeights, scale):
        md: TritonMLAMetadata = metadata
        n = md.inputs.num_actual_tokens
        scales = layer_kv_scales(md.inputs, layer_idx, kv_cache, kv_c[:n], k_pe[:n])
        write_latent_cache(kv_c[:n], k_pe[:n], kv_cache, md.inputs.slot_mapping[:n], *scales)
        out = q_nope.new_zeros(q_nope.shape[0], mla.num_heads, mla.v_head_dim)
        for part, run in ((md.decode, self._decode), (md.prefill, self._prefill)):
            if part is not None:
                rows = run(part, q_nope.index_select(0, part.token_idx),
                           q_pe.index_select(0, part.token_idx), kv_cache, md, mla, scale,
                           scales)
                out.index_copy_(0, part.token_idx, rows)
        return out

    def _decode(self, part: _Part, q_nope, q_pe, kv_cache, md, mla: MLAWeights, scale, scales):
        """Absorbed latent decode: [b, H, N] queries -> [b, H, V]."""
        q_lat = torch.bmm(q_nope.transpose(0, 1), mla.w_uk).transpose(0, 1)  # [b, H, L]
        o_lat = torch.empty_like(q_lat)
        mla_decode_attention(q_lat.contiguous(), q_pe.contiguous(), kv_cache, o_lat,
                             part.seq_lens, part.block_table, scale, md.num_splits,
                             self.workspace, *scales)
        return torch.bmm(o_lat.transpose(0, 1), mla.w_uv).transpose(0, 1)  # [b, H, V]

    def _prefill(self, part: _Part, q_nope, q_pe, kv_cache, md, mla: MLAWeights, scale, scales):
        """Expanded prefill/extend: per-head K/V from the requests' latents, varlen flash."""
        b, nblk = part.block_table.shape
        bs, lora = kv_cache.shape[1], mla.kv_lora_rank
        rows = kv_cache.index_select(0, part.block_table.flatten().long()).flatten(0, 1)
        rows = dequantize_latent_rows(rows, lora, *scales, q_nope.dtype)  # fp8: to model dtype
        k_nope, v = mla.expand(rows[:, :lora])  # [S, H, N], [S, H, V]
        nope, h = mla.qk_nope_head_dim, mla.num_heads
        width = triton.next_power_of_2(max(nope + mla.qk_rope_head_dim, mla.v_head_dim))
        key = rows.new_zeros(rows.shape[0], h, width)
        key[..., :nope] = k_nope
        key[..., nope:nope + mla.qk_rope_head_dim] = rows[:, None, lora:]
        val = rows.new_zeros(rows.shape[0], h, width)
        val[..., :mla.v_head_dim] = v
        q = q_nope.new_zeros(q_nope.shape[0], h, width)
        q[..., :nope] = q_nope
        q[..., nope:nope + mla.qk_rope_head_dim] = q_pe
        out = torch.empty_like(q)
        table = torch.arange(b * nblk, dtype=torch.int32, device=q.device).view(b, nblk)
        paged_attention(q, key.view(b * nblk, bs, h, width), val.view(b * nblk, bs, h, width),
                        out, part.query_start_loc, part.seq_lens, table, part.max_query_len,
                        scale)
        return out[..., :mla.v_head_dim]


def _part(inputs: AttentionInputs, reqs: list[int]) -> _Part | None:
    """The inputs restricted to requests `reqs` (None when empty); every request: the inputs'
    own tensors (views: graph-safe, and no copy)."""
    if not reqs:
        return None
    device = inputs.seq_lens.device
    if len(reqs) == inputs.num_reqs:
        return _Part(
            token_idx=torch.arange(inputs.num_actual_tokens, device=device),
            seq_lens=inputs.seq_lens, block_table=inputs.block_table,
            query_start_loc=inputs.query_start_loc, max_query_len=inputs.max_query_len)
    qlens = [inputs.query_lens_cpu[i] for i in reqs]
    starts = [0]
    for q in inputs.query_lens_cpu:
        starts.append(starts[-1] + q)
    token_idx = [t for i in reqs for t in range(starts[i], starts[i + 1])]
    loc = [0]
    for q in qlens:
        loc.append(loc[-1] + q)
    idx = torch.tensor(reqs, dtype=torch.long, device=device)
    return _Part(
        token_idx=torch.tensor(token_idx, dtype=torch.long, device=device),
        seq_lens=inputs.seq_lens.index_select(0, idx),
        block_table=inputs.block_table.index_select(0, idx),
        query_start_loc=torch.tensor(loc, dtype=torch.int32, device=device),
        max_query_len=max(qlens),
    )
