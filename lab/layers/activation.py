"""Gated activations: x [..., 2d] laid out | gate | up | -> act(gate) * up [..., d]. SiLU's math
lives in the model's `LayerOps` (lab/layers/ops.py); GELU (tanh approximation, Gemma's
`gelu_pytorch_tanh`) is plain PyTorch, as transformers computes it."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from lab.layers.ops import LayerOps, TorchOps


class SiluAndMul(nn.Module):
    """Input [..., 2*d] laid out | gate | up |; returns silu(gate) * up, shape [..., d]."""

    def __init__(self, ops: LayerOps | None = None):
        super().__init__()
        self.ops = ops or TorchOps()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ops.silu_and_mul(x)

    def extra_repr(self) -> str:
        return f"ops={self.ops.name}"


class GeluTanhAndMul(nn.Module):
    """Input [..., 2*d] laid out | gate | up |; returns gelu_tanh(gate) * up, shape [..., d]
    (transformers' `gelu_pytorch_tanh`: F.gelu with approximate="tanh")."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = x.chunk(2, dim=-1)
        return F.gelu(gate, approximate="tanh") * up


#: the HF activation names (`hidden_act`, Gemma's `hidden_activation`) a gated MLP implements
GATED_ACTS = ("silu", "gelu_pytorch_tanh")


def gated_activation(act: str, ops: LayerOps | None = None) -> nn.Module:
    """The gated activation module of an HF activation name: "silu" or "gelu_pytorch_tanh";
    ValueError naming the supported ones for any other."""
    if act == "silu":
        return SiluAndMul(ops)
    if act == "gelu_pytorch_tanh":
        return GeluTanhAndMul()
    raise ValueError(f"activation {act!r} is not supported (supported: {', '.join(GATED_ACTS)})")
