"""quant=int8: W8A8 (SmoothQuant-style without smoothing), computed by `LayerOps.int8_gemm`.

    weight  int8 [N, K], symmetric per output channel: w_scale[n] = amax_k |W[n, k]| / 127
    act     int8 [M, K], symmetric per token, quantized on the fly: a_scale[m] = amax_k |x[m, k]| / 127
    y       = (a_q @ w_q^T) * a_scale[m] * w_scale[n] + bias   (int32 accumulation on the GPU)

Online only: a dense (fp32/fp16/bf16) checkpoint is quantized at load. Fused layers (qkv,
gate_up) are exact to quantize per channel: each output row keeps its own scale.
"""

from __future__ import annotations

import torch

from lab.layers.linear import Linear
from lab.quant.base import (
    OnlineQuantMethod,
    QuantConfig,
    QuantMethod,
    activation_amax,
    weight_amax,
)


def quantize_int8_per_channel(
    weight: torch.Tensor, amax: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """W [N, K] -> (int8 [N, K], fp32 scale [N]) with W ~= q * scale[:, None]; `amax` [N, 1]
    replaces the rows' own maxima (a shard of rows that span ranks)."""
    from lab.kernels.quantize import quantize_int8_per_token_ref

    q, scale = quantize_int8_per_token_ref(weight, amax=amax)  # per row of W = per output channel
    return q.contiguous(), scale.reshape(-1).contiguous()


class Int8LinearMethod(OnlineQuantMethod):
    """Per-channel int8 weights, per-token int8 activations."""

    def quantize(self, weight: torch.Tensor, layer) -> dict[str, torch.Tensor]:
        q, scale = quantize_int8_per_channel(weight, weight_amax(layer, weight, per_channel=True))
        return {"weight": q, "weight_scale": scale}

    def matmul(self, layer, x: torch.Tensor) -> torch.Tensor:
        amax = activation_amax(layer, x, per_token=True)
        if amax is None:
            a_q, a_scale = self.ops.quantize_int8_per_token(x)
        else:  # a row-parallel shard: the whole row's scale (see activation_amax)
            from lab.kernels.quantize import quantize_int8_per_token_ref

            a_q, a_scale = quantize_int8_per_token_ref(x, amax=amax)
        return self.ops.int8_gemm(a_q, a_scale, layer.weight, layer.weight_scale, layer.bias, x.dtype)


class Int8Config(QuantConfig):
    """Every linear (fused ones included) becomes W8A8."""

    name = "int8"

    def __init__(self, experts: str = "quantize") -> None:
        super().__init__(experts)

    def method_for(self, prefix: str, layer: Linear) -> QuantMethod | None:
        return Int8LinearMethod(self.ops)

    def expert_quantizer(self, prefix: str):
        return quantize_int8_per_channel
