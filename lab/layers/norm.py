"""RMSNorm, computed in float32 like Hugging Face and cast back, with an optional fused residual add.

The math lives in the model's `LayerOps` (lab/layers/ops.py: PyTorch or Triton); this layer holds
the weight, eps and a reference to the ops.
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
