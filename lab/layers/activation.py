"""Gated activations (the math lives in the model's `LayerOps`, lab/layers/ops.py)."""

from __future__ import annotations

import torch
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
