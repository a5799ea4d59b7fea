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

(`is_neox=False`: interleaved pairs (x[2i], x[2i+1]) instead.) The cached tables hold one angle
per pair, cos/sin [max_position, rotary_dim/2] in fp32, scaling folded in; the rotation itself is
the model's `LayerOps.rotary` (lab/layers/ops.py: PyTorch or Triton).
"""

from __future__ import annotations

import torch
from torch import nn

from lab.layers.ops import LayerOps, TorchOps


def default_inv_freq(base: float, dim: int) -> torch.Tensor:
    """Unscaled RoPE inverse frequencies 1 / base^(2i/dim), i < dim/2, in float32."""
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))


def rope_parameters(hf_config, head_dim: int,
                    layer_type: str | None = None) -> tuple[torch.Tensor, float]:
    """(inv_freq [rotary_dim/2], attention_scaling) for an HF config, computed as HF does.
    `layer_type`: the entry of a config whose rope_parameters are per layer type (Gemma-3:
    "sliding_attention" with its local base, "full_attention" with its scaling)."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    params = dict(getattr(hf_config, "rope_parameters", None) or {})
    if layer_type is not None:
        params = dict(params[layer_type])
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type == "default":
        theta = params.get("rope_theta", getattr(hf_config, "rope_theta", 10000.0))
        return default_inv_freq(theta, head_dim), 1.0
    if rope_type not in ROPE_INIT_FUNCTIONS:
        raise ValueError(
            f"rope_type {rope_type!r} is not supported "
            f"(supported: default, {', '.join(sorted(ROPE_INIT_FUNCTIONS))})"
        )
    kwargs = {} if layer_type is None else {"layer_type": layer_type}
    inv_freq, scaling = ROPE_INIT_FUNCTIONS[rope_type](hf_config, torch.device("cpu"), **kwargs)
    return inv_freq.float(), float(scaling)


class RotaryEmbedding(nn.Module):
    """Applies RoPE to q and k at the given positions, from a cos/sin cache of max_position rows."""

    def __init__(
        self, inv_freq: torch.Tensor, max_position: int, attention_scaling: float = 1.0,
        is_neox: bool = True, ops: LayerOps | None = None,
    ):
        super().__init__()
        self.rotary_dim = 2 * inv_freq.numel()
        self.max_position = max_position
        self.attention_scaling = attention_scaling
        self.is_neox = is_neox
        self.ops = ops or TorchOps()
        positions = torch.arange(max_position, dtype=torch.float32)
        freqs = positions[:, None] * inv_freq.to(positions.device, torch.float32)[None, :]
        # [max_position, rotary_dim/2]: one angle per rotated pair
        self.register_buffer("cos_cache", freqs.cos() * attention_scaling, persistent=False)
        self.register_buffer("sin_cache", freqs.sin() * attention_scaling, persistent=False)

    @classmethod
    def from_hf_config(cls, hf_config, head_dim: int, ops: LayerOps | None = None,
                       layer_type: str | None = None) -> RotaryEmbedding:
        """Build from an HF config (rope_parameters / rope_scaling, max_position_embeddings;
        `layer_type`: see rope_parameters)."""
        inv_freq, scaling = rope_parameters(hf_config, head_dim, layer_type)
        return cls(inv_freq, hf_config.max_position_embeddings, scaling, ops=ops)

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [T, rotary_dim] for positions [T] (halves duplicated), cast to `dtype` as HF does."""
        cos, sin = self.cos_cache[positions].to(dtype), self.sin_cache[positions].to(dtype)
        return torch.cat((cos, cos), dim=-1), torch.cat((sin, sin), dim=-1)

    def forward(
        self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """q [T, H, D], k [T, Hkv, D] -> rotated (q, k), same shapes and dtype (new tensors)."""
        return self.ops.rotary(positions, q, k, self.cos_cache, self.sin_cache, self.is_neox)

    def extra_repr(self) -> str:
        return (f"rotary_dim={self.rotary_dim}, max_position={self.max_position}, "
                f"scaling={self.attention_scaling}, neox={self.is_neox}, ops={self.ops.name}")
