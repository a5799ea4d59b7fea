"""quant=w4a16: group-wise int4 weights, activations in the model dtype (`LayerOps.w4a16_gemm`).

    weight  int4 in groups of G input columns, round to nearest at load (no GPTQ/AWQ search):
              symmetric   q in [-8, 7], w ~= q * scale[n, g]
              asymmetric  q in [0, 15], w ~= (q - zero[n, g]) * scale[n, g]
            stored packed two per byte: uint8 [N, K/2]; scales (and zeros) [N, K/G]
    y       = x @ dequant(W)^T + bias

Online only: a dense checkpoint is quantized at load. GPTQ / AWQ packed checkpoints are NOT
loaded (their int32 packing, act-order permutations and transposed layouts differ from this
one): such a checkpoint is refused by its quantization_config. Every linear's input size must be
a multiple of G (a layer that is not is refused by name; on the tiny models, hidden 64, use
quant.group_size=32 or 64); under tensor parallelism that is each rank's input columns (a
row-parallel layer splits K), so groups never span ranks and the scales equal TP=1's.
"""

from __future__ import annotations

import torch

from lab.layers.linear import Linear
from lab.quant.base import OnlineQuantMethod, QuantConfig, QuantMethod, check_group_size


class W4A16LinearMethod(OnlineQuantMethod):
    """Group-wise int4 weight-only quantization."""

    def __init__(self, ops, group_size: int, symmetric: bool) -> None:
        super().__init__(ops)
        self.group_size, self.symmetric = group_size, symmetric

    def quantize(self, weight: torch.Tensor, layer) -> dict[str, torch.Tensor]:
        """Groups lie within one rank's columns (method_for checks it): no reduction needed."""
        from lab.kernels.w4a16_gemm import quantize_w4

        packed, scales, zeros = quantize_w4(weight, self.group_size, self.symmetric)
        out = {"weight": packed, "weight_scale": scales}
        if zeros is not None:
            out["weight_zero"] = zeros
        return out

    def matmul(self, layer, x: torch.Tensor) -> torch.Tensor:
        return self.ops.w4a16_gemm(x, layer.weight, layer.weight_scale,
                                   getattr(layer, "weight_zero", None), self.group_size, layer.bias)


class W4A16Config(QuantConfig):
    """Every linear becomes int4 weight-only with `group_size` input columns per scale."""

    name = "w4a16"

    def __init__(self, group_size: int = 128, symmetric: bool = True, experts: str = "refuse"):
        super().__init__(experts)
        if group_size <= 0 or group_size % 2:
            raise ValueError(f"quant.group_size={group_size} must be a positive even number")
        self.group_size, self.symmetric = int(group_size), bool(symmetric)

    def method_for(self, prefix: str, layer: Linear) -> QuantMethod | None:
        check_group_size(prefix, layer.input_size_per_partition, self.group_size, layer.tp_size)
        return W4A16LinearMethod(self.ops, self.group_size, self.symmetric)

    def __repr__(self) -> str:
        return (f"W4A16Config(group_size={self.group_size}, symmetric={self.symmetric}, "
                f"experts={self.experts})")
