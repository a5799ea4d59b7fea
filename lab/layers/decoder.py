"""The pre-norm decoder skeleton every supported family shares (Llama, Qwen, DeepSeek).

Residual stream through a decoder layer (RMSNorm fuses the residual add):

    h, r = input_layernorm(h, r)          # r <- h + r;  h <- norm(r)
    h = self_attn(h)
    h, r = post_attention_layernorm(h, r)
    h = mlp(h)                            # the next layer (or the final norm) adds r back

A family builds its own attention and MLP (`self_attn`, `mlp`) and norms; the forward passes
below are the same for all of them (Gemma's layer adds two norms around its sublayers:
lab/models/gemma.py). The FFN is `GatedMLP` (SwiGLU, or GELU-gated for Gemma), dense or as the
shared experts of a MoE layer.
"""

from __future__ import annotations

import torch
from torch import nn

from lab.attention.base import layer_metadata
from lab.distributed.parallel_state import GroupCoordinator
from lab.layers.activation import gated_activation
from lab.layers.linear import MergedColumnParallelLinear, RowParallelLinear
from lab.layers.ops import LayerOps


def check_silu(cfg) -> None:
    """The gated FFN implements SiLU only: refuse a config with another `hidden_act`."""
    act = getattr(cfg, "hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"hidden_act={act!r} is not supported (only silu)")


class GatedMLP(nn.Module):
    """down_proj(act(gate) * up) with gate and up fused (| gate | up |): a dense FFN or the
    shared experts of a MoE layer. `act`: "silu" (default) or "gelu_pytorch_tanh" (Gemma).

    Tensor-parallel over `tp`: gate_up column-parallel (each rank a slice of the intermediate
    dim), down row-parallel, all-reduced unless `reduce_results=False` (the MoE layer reduces
    its routed and shared experts' sums at once)."""

    def __init__(self, hidden_size: int, intermediate_size: int, ops: LayerOps | None = None,
                 bias: bool = False, tp: GroupCoordinator | None = None,
                 reduce_results: bool = True, act: str = "silu"):
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(
            hidden_size, [intermediate_size] * 2, bias, tp=tp)
        self.act = gated_activation(act, ops)
        self.down_proj = RowParallelLinear(intermediate_size, hidden_size, bias, tp=tp,
                                           reduce_results=reduce_results)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_up_proj(x)))


class PreNormDecoderLayer(nn.Module):
    """Base of a family's decoder layer: subclasses set self_attn, mlp and the two norms."""

    self_attn: nn.Module
    mlp: nn.Module
    input_layernorm: nn.Module
    post_attention_layernorm: nn.Module

    def forward(self, h, residual, positions, kv_cache, metadata):
        if residual is None:
            h, residual = self.input_layernorm(h), h
        else:
            h, residual = self.input_layernorm(h, residual)
        h = self.self_attn(h, positions, kv_cache, metadata)
        h, residual = self.post_attention_layernorm(h, residual)
        return self.mlp(h), residual


class DecoderStack(nn.Module):
    """Base of a family's `model.` module: subclasses set embed_tokens, layers and norm."""

    embed_tokens: nn.Module
    layers: nn.ModuleList
    norm: nn.Module

    def forward(self, input_ids, positions, kv_caches, attn_metadata) -> torch.Tensor:
        h, residual = self.embed_tokens(input_ids), None
        for i, layer in enumerate(self.layers):
            h, residual = layer(h, residual, positions, kv_caches[i],
                                layer_metadata(attn_metadata, i))
        h, _ = self.norm(h, residual)
        return h
