"""`attention=torch`: the paged reference backend in plain PyTorch (CPU and CUDA).

Cache layout per layer: (num_blocks, 2, block_size, num_kv_heads, head_dim); [:, 0] holds K and
[:, 1] holds V. Token t of the step is written at block slot_mapping[t] // block_size, offset
slot_mapping[t] % block_size; slot -1 (padding) is skipped.

Attention runs over a padded [B, max_query_len] view of the ragged batch. For request b with
c = num_computed[b] cached tokens and q = query_len[b] new ones, query row i sits at position c + i
and may attend to key j iff j <= c + i (causal; keys 0..c-1 come from the cache through the block
table):

    keys:    | 0 ........ c-1 | c ........ c+q-1 |   (j >= seq_len[b] is padding, masked)
    query i:                  ^ position c+i sees keys [0, c+i]
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from lab.attention.base import AttentionBackend, AttentionInputs, AttentionSpec, KVCacheSpec


@dataclass
class TorchAttentionMetadata:
    """Index tensors shared by every layer of one step."""

    inputs: AttentionInputs
    token_req: torch.Tensor  # [T] request index of each token
    token_row: torch.Tensor  # [T] index of each token within its request's new tokens
    key_blocks: torch.Tensor  # [B, L] physical block of key position j
    key_offsets: torch.Tensor  # [L] offset of key position j within its block
    mask: torch.Tensor  # [B, 1, Q, L] True where query row i may attend key j


class TorchAttentionBackend(AttentionBackend):
    """Paged attention in plain PyTorch: the reference every other backend is checked against."""

    name = "torch"

    def kv_cache_spec(self, spec: AttentionSpec, block_size: int, dtype: torch.dtype) -> KVCacheSpec:
        elem = torch.empty((), dtype=dtype).element_size()
        return KVCacheSpec(
            block_shape=(2, block_size, spec.num_kv_heads, spec.head_dim),
            dtype=dtype,
            bytes_per_token=2 * spec.num_kv_heads * spec.head_dim * elem,
            block_size=block_size,
        )

    def build_metadata(self, inputs: AttentionInputs) -> TorchAttentionMetadata:
        device = inputs.query_start_loc.device
        qlens = torch.tensor(inputs.query_lens_cpu, device=device)
        b = inputs.num_reqs
        token_req = torch.repeat_interleave(torch.arange(b, device=device), qlens)
        starts = inputs.query_start_loc[:-1].long()
        token_row = torch.arange(token_req.numel(), device=device) - starts[token_req]
        block_size = inputs.block_size
        keys = torch.arange(inputs.max_seq_len, device=device)
        key_blocks = inputs.block_table[:, keys // block_size].long()
        query_pos = inputs.num_computed_tokens[:, None].long() + torch.arange(
            inputs.max_query_len, device=device
        )
        mask = (keys[None, None, :] <= query_pos[:, :, None]) & (
            keys[None, None, :] < inputs.seq_lens[:, None, None]
        )
        return TorchAttentionMetadata(
            inputs, token_req, token_row, key_blocks, keys % block_size, mask[:, None]
        )

    def forward(self, layer_idx, q, k, v, kv_cache, metadata, scale):
        md: TorchAttentionMetadata = metadata
        n = md.inputs.num_actual_tokens
        write_kv_cache(kv_cache, k[:n], v[:n], md.inputs.slot_mapping[:n])
        b, qmax = md.inputs.num_reqs, md.inputs.max_query_len
        q_pad = q.new_zeros(b, qmax, q.shape[1], q.shape[2])
        q_pad[md.token_req, md.token_row] = q[:n]
        key = kv_cache[md.key_blocks, 0, md.key_offsets]  # [B, L, Hkv, D]
        val = kv_cache[md.key_blocks, 1, md.key_offsets]
        out = F.scaled_dot_product_attention(
            q_pad.transpose(1, 2),
            key.transpose(1, 2),
            val.transpose(1, 2),
            attn_mask=md.mask,
            scale=scale,
            enable_gqa=q.shape[1] != k.shape[1],
        )
        result = torch.empty_like(q)
        result[:n] = out.transpose(1, 2)[md.token_req, md.token_row]
        if n < q.shape[0]:
            result[n:] = 0
        return result


def write_kv_cache(
    kv_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """Reference KV write: token t goes to slot_mapping[t]; slots < 0 are skipped."""
    block_size = kv_cache.shape[2]
    valid = slot_mapping >= 0
    slots = slot_mapping[valid]
    blocks, offsets = slots // block_size, slots % block_size
    kv_cache[blocks, 0, offsets] = k[valid].to(kv_cache.dtype)
    kv_cache[blocks, 1, offsets] = v[valid].to(kv_cache.dtype)

