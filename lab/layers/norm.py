"""RMSNorm, computed in float32 like Hugging Face and cast back, with an optional fused residual add."""

from __future__ import annotations

import torch
from torch import nn


class RMSNorm(nn.Module):
    """y = weight * (x / sqrt(mean(x^2) + eps)); with `residual`, normalises x + residual.

    `forward(x)` returns y; `forward(x, residual)` returns (y, x + residual) so a decoder layer can
    carry the residual stream without a separate add (vLLM's fused_add_rms_norm contract).
    """

    def __init__(self, hidden_size: int, eps: float = 1e-6, params_dtype: torch.dtype | None = None):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=params_dtype), requires_grad=False)

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(dtype)  # HF order: cast back first, then scale

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            return self._norm(x)
        x = x + residual
        return self._norm(x), x

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)}, eps={self.eps}"
