"""Multi-head latent attention (MLA, DeepSeek-V2/V3): its latent KV cache and its seam (its spec,
`mla_attention_spec`, is plain data: lab/attention/spec.py).

Per token the model computes (H heads, L = kv_lora_rank, R = qk_rope_head_dim, N = qk_nope_head_dim,
V = v_head_dim):

    q_nope [H, N], q_pe [H, R] (rotated)      q_proj(h), or q_b_proj(q_a_layernorm(q_a_proj(h)))
    kv_c [L] (normalised), k_pe [R] (rotated) kv_a_proj_with_mqa(h) = | c_kv (L) | k_pe (R) |
    kv_b_proj(kv_c) [H, N + V]                per head | k_nope (N) | v (V) |

    score[h, j] = scale · (q_nope[h] · k_nope[j, h] + q_pe[h] · k_pe[j])
    out[h]      = Σ_j softmax_j(score[h]) · v[j, h]                        -> [H, V]

Only the latent row of each token is cached, one "KV head" shared by all query heads:

    kv_cache per layer: (num_blocks, block_size, L + R)
    token row:          | kv_c (normalised, L) | k_pe (rotated, R) |

Weight absorption (what a latent-space decode kernel does, lab/kernels/mla_decode.py): with
w_uk[h] = W_UK [N, L] and w_uv[h] = W_UV [L, V] (both views of kv_b_proj.weight),
q_nope[h] · k_nope[j, h] = (q_nope[h] w_uk[h]) · kv_c[j] and out[h] = (Σ_j p_j kv_c[j]) w_uv[h].

fp8 cache (`cache.dtype=fp8`, scheme in lab/kernels/fp8_kv.py): the latent row is stored in
float8 e4m3fn with two per-layer scales, one for the kv_c part and one for the k_pe part (their
magnitudes differ: kv_c is normalised, k_pe is not); row = | fp8(kv_c / s_c) | fp8(k_pe / s_pe) |.

A backend implements MLA by mixing in `MLAAttentionMixin` (before its base class) and listing
"mla" in `supported_kinds`; the model calls `forward_mla` instead of `forward`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from lab.attention.base import KVCacheSpec
from lab.attention.spec import AttentionSpec


def mla_kv_cache_spec(spec: AttentionSpec, block_size: int, dtype: torch.dtype) -> KVCacheSpec:
    """Per layer (num_blocks, block_size, L + R): one latent row per token, no K/V split."""
    width = spec.kv_elems_per_token  # L + R
    elem = torch.empty((), dtype=dtype).element_size()
    return KVCacheSpec(
        block_shape=(block_size, width), dtype=dtype, bytes_per_token=width * elem,
        block_size=block_size, leading=(),
    )


@dataclass
class MLAWeights:
    """What an MLA backend needs of a layer's weights, built by the layer after loading.

    `kv_b_proj` is the layer's Linear (kv_c [S, L] -> [S, H·(N + V)], per head | k_nope | v |),
    so quantized weights keep working through its quant_method. `w_uk` [H, N, L] and `w_uv`
    [H, L, V] are dense views of kv_b_proj.weight (not contiguous; no copy) for absorption.
    """

    kv_b_proj: nn.Module
    w_uk: torch.Tensor
    w_uv: torch.Tensor
    num_heads: int
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int

    @classmethod
    def from_kv_b_proj(cls, kv_b_proj: nn.Module, spec: AttentionSpec) -> MLAWeights:
        """Views of kv_b_proj.weight [H·(N + V), L] split per head into W_UK and W_UV."""
        h, n, v, lat = spec.num_heads, spec.qk_nope_head_dim, spec.v_head_dim, spec.kv_lora_rank
        w = kv_b_proj.weight.view(h, n + v, lat)
        return cls(kv_b_proj, w[:, :n, :], w[:, n:, :].transpose(1, 2), h, lat, n,
                   spec.qk_rope_head_dim, v)

    def expand(self, kv_c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Latents kv_c [S, L] -> k_nope [S, H, N], v [S, H, V] through kv_b_proj."""
        kv = self.kv_b_proj(kv_c).view(kv_c.shape[0], self.num_heads, -1)
        return kv.split((self.qk_nope_head_dim, self.v_head_dim), dim=-1)


class MLAAttentionMixin:
    """Mixed into an AttentionBackend (listed before it) that implements kind "mla".

    It serves the latent cache spec for MLA models (other kinds go to the backend's base) and
    declares `forward_mla`, which such a backend overrides.
    """

    def kv_cache_spec(self, spec: AttentionSpec, block_size: int, dtype: torch.dtype) -> KVCacheSpec:
        if spec.kind == "mla":
            return mla_kv_cache_spec(spec, block_size, dtype)
        return super().kv_cache_spec(spec, block_size, dtype)

    def forward_mla(
        self,
        layer_idx: int,
        q_nope: torch.Tensor,  # [T, H, N]
        q_pe: torch.Tensor,  # [T, H, R], rotated
        kv_c: torch.Tensor,  # [T, L], normalised
        k_pe: torch.Tensor,  # [T, R], rotated
        kv_cache: torch.Tensor,  # [num_blocks, block_size, L + R]
        metadata: object,
        mla: MLAWeights,
        scale: float,
    ) -> torch.Tensor:
        """Write the step's latent rows through the slot mapping (slot -1 skipped), then attend
        causally over each request's cached + new tokens; returns [T, H, V] (zero padding rows)."""
        raise NotImplementedError(f"{type(self).__name__} does not implement forward_mla")
