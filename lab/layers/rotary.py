"""Rotary position embedding (neox layout, HF `rotate_half`) with HF's rope scalings.

The inverse frequencies and the attention scaling come from transformers' own
`ROPE_INIT_FUNCTIONS` (linear, dynamic, llama3, yarn, ...), so they match HF bit for bit.
Like HF, the attention scaling (yarn's attention_factor / mscale) multiplies cos and sin, i.e. it
scales q and k each, and the softmax scale stays head_dim**-0.5.

Dynamic NTK: HF recomputes the base only once a sequence grows past max_position_embeddings; within
it the frequencies are the unscaled ones, which is what the init function returns and what we cache.

Layout of one head vector (rotary_dim <= head_dim; the tail is passed through unrotated):

    | x1 (rotary_dim/2) | x2 (rotary_dim/2) | pass-through |
    out = | x1*cos - x2*sin | x2*cos + x1*sin | pass-through |
"""

from __future__ import annotations

import torch
from torch import nn


def default_inv_freq(base: float, dim: int) -> torch.Tensor:
    """Unscaled RoPE inverse frequencies 1 / base^(2i/dim), i < dim/2, in float32."""
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))


def rope_parameters(hf_config, head_dim: int) -> tuple[torch.Tensor, float]:
    """(inv_freq [rotary_dim/2], attention_scaling) for an HF config, computed as HF does."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    params = dict(getattr(hf_config, "rope_parameters", None) or {})
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type == "default":
        theta = params.get("rope_theta", getattr(hf_config, "rope_theta", 10000.0))
        return default_inv_freq(theta, head_dim), 1.0
    if rope_type not in ROPE_INIT_FUNCTIONS:
        raise ValueError(
            f"rope_type {rope_type!r} is not supported "
            f"(supported: default, {', '.join(sorted(ROPE_INIT_FUNCTIONS))})"
        )
    inv_freq, scaling = ROPE_INIT_FUNCTIONS[rope_type](hf_config, torch.device("cpu"))
    return inv_freq.float(), float(scaling)


def rotate_neox(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, heads, D]; cos/sin [T, rotary_dim] (already duplicated halves). Returns rotated x."""
    rot = cos.shape[-1]
    x_rot, x_pass = x[..., :rot], x[..., rot:]
    x1, x2 = x_rot.chunk(2, dim=-1)
    rotated = torch.cat((-x2, x1), dim=-1)
    out = x_rot * cos[:, None, :] + rotated * sin[:, None, :]
    return torch.cat((out, x_pass), dim=-1) if x_pass.numel() else out


class RotaryEmbedding(nn.Module):
    """Applies RoPE to q and k at the given positions, from a cos/sin cache of max_position rows."""

    def __init__(self, inv_freq: torch.Tensor, max_position: int, attention_scaling: float = 1.0):
        super().__init__()
        self.rotary_dim = 2 * inv_freq.numel()
        self.max_position = max_position
        self.attention_scaling = attention_scaling
        positions = torch.arange(max_position, dtype=torch.float32)
        freqs = positions[:, None] * inv_freq.to(positions.device, torch.float32)[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)  # [max_position, rotary_dim]
        self.register_buffer("cos_cache", emb.cos() * attention_scaling, persistent=False)
        self.register_buffer("sin_cache", emb.sin() * attention_scaling, persistent=False)

    @classmethod
    def from_hf_config(cls, hf_config, head_dim: int) -> RotaryEmbedding:
        """Build from an HF config (rope_parameters / rope_scaling, max_position_embeddings)."""
        inv_freq, scaling = rope_parameters(hf_config, head_dim)
        return cls(inv_freq, hf_config.max_position_embeddings, scaling)

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [T, rotary_dim] for positions [T], cast to `dtype` as HF does."""
        return self.cos_cache[positions].to(dtype), self.sin_cache[positions].to(dtype)

    def forward(
        self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """q [T, H, D], k [T, Hkv, D] -> rotated (q, k), same shapes and dtype."""
        cos, sin = self.cos_sin(positions, q.dtype)
        return rotate_neox(q, cos, sin), rotate_neox(k, cos, sin)

    def extra_repr(self) -> str:
        return f"rotary_dim={self.rotary_dim}, max_position={self.max_position}, scaling={self.attention_scaling}"
