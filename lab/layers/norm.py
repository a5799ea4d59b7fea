"""RMSNorm, computed in float32 like Hugging Face and cast back, with an optional fused residual add.

The math of `RMSNorm` lives in the model's `LayerOps` (lab/layers/ops.py: PyTorch or Triton);
this layer holds the weight, eps and a reference to the ops. `GemmaRMSNorm` (Gemma's stored
weight w scales by 1 + w, in float32 before the cast back) is plain PyTorch, as transformers
computes it.
"""

from __future__ import annotations

import torch
from torch import nn

from lab.layers.ops import LayerOps, TorchOps


class RMSNorm(nn.Module):
    """y = weight * (x / sqrt(mean(x^2) + eps)); with `residual`, normalises x + residual.

    `forward(x)` returns y; `forward(x, residual)` returns (y, x + residual) so a decoder layer can
    carry the residual stream without a separate add (vLLM's fused_add_rms_norm contract).
    """

    def __init__(
        self, hidden_size: int, eps: float = 1e-6, params_dtype: torch.dtype | None = None,
        ops: LayerOps | None = None,
    ):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=params_dtype), requires_grad=False)
        self.ops = ops or TorchOps()

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        return self.ops.rms_norm(x, self.weight, self.eps, residual)

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)}, eps={self.eps}, ops={self.ops.name}"


class GemmaRMSNorm(nn.Module):
    """Gemma's RMSNorm: y = (x / sqrt(mean(x^2) + eps)) * (1 + weight), all in float32, then cast
    to x's dtype (transformers' Gemma2RMSNorm / Gemma3RMSNorm; the stored weight is the offset
    from 1). The same fused residual add as RMSNorm: `forward(x, residual)` returns
    (y of x + residual, x + residual)."""

    def __init__(self, hidden_size: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(hidden_size), requires_grad=False)

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        if residual is not None:
            x = x + residual
            return self(x), x
        xf = x.float()
        normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (normed * (1.0 + self.weight.float())).to(x.dtype)

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)}, eps={self.eps}, weight offset 1"
